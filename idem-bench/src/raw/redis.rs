//! Raw baseline for Redis: `SET NX GET` (claims, or returns what is stored: one round trip
//! for a replay) and, for a fresh key, `SET XX` with the result.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;

use super::{PlainLoop, plain_loops};

use crate::target::{BoxError, Done, RESPONSE, Target};

const PENDING: &[u8] = b"\x00pending";

pub(crate) struct RawRedis {
    connection: ConnectionManager,
    prefix: String,
}

impl RawRedis {
    pub(crate) fn new(connection: ConnectionManager, prefix: String) -> Self {
        Self { connection, prefix }
    }
}

#[async_trait]
impl Target for RawRedis {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        let key = format!("{}{key}", self.prefix);
        let mut conn = self.connection.clone();
        let old: Option<Vec<u8>> = redis::cmd("SET")
            .arg(&key)
            .arg(PENDING)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut conn)
            .await?;
        match old {
            Some(value) if value == PENDING => return Ok(Done::Busy),
            Some(_) => return Ok(Done::Replayed),
            None => {}
        }
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(RESPONSE)
            .arg("XX")
            .arg("KEEPTTL")
            .query_async(&mut conn)
            .await?;
        Ok(Done::Executed)
    }
}

#[async_trait]
impl PlainLoop for RawRedis {
    async fn replays(
        &self,
        clients: usize,
        duration: Duration,
        pool: Arc<Vec<String>>,
    ) -> Result<u64, BoxError> {
        let keys: Arc<Vec<String>> =
            Arc::new(pool.iter().map(|k| format!("{}{k}", self.prefix)).collect());
        let connection = self.connection.clone();
        plain_loops(clients, duration, move |client, op| {
            let (mut conn, keys) = (connection.clone(), Arc::clone(&keys));
            async move {
                let key = &keys[(client * 7919 + op as usize) % keys.len()];
                let old: Option<Vec<u8>> = redis::cmd("SET")
                    .arg(key)
                    .arg(PENDING)
                    .arg("NX")
                    .arg("GET")
                    .query_async(&mut conn)
                    .await?;
                match old {
                    Some(value) if value != PENDING => Ok(()),
                    _ => Err("the plain loop met a key that was not completed".into()),
                }
            }
        })
        .await
    }
}
