//! The systems compared: idem, the `idempotent` crate, and the raw loop both are held to.
//! Each runs trivial work once per key (a 35-byte JSON receipt) or returns what is stored.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::{Fingerprint, Idempotency, Key, Outcome, WorkError};
use idem_redis::RedisStore;
use idempotent::valkey::ValkeyStore;
use idempotent::{ExecutionOutcome, IdempotencyKey, IdempotencyStore};
use redis::aio::ConnectionManager;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a fresh key's work returns, stored by both systems as JSON.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    charge: String,
    status: String,
}

fn receipt() -> Receipt {
    Receipt {
        charge: "ch_3PqX9".into(),
        status: "ok".into(),
    }
}

/// The request each execution is for; both systems fingerprint it on every call, as a
/// user's handler would.
const REQUEST: &[u8] = br#"{"amount":4200,"currency":"EUR","customer":"cus_9s6XKzkNRiz8i3"}"#;

/// The raw loop's stored value: the receipt, as the systems store it.
const RESPONSE: &[u8] = br#"{"charge":"ch_3PqX9","status":"ok"}"#;

/// How long a record is kept: long enough for every round, short enough that a run's keys
/// leave the server on their own.
pub const RETENTION: Duration = Duration::from_secs(600);
const LEASE: Duration = Duration::from_secs(30);

/// How one execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    Executed,
    Replayed,
}

pub type Execution<'a> = Pin<Box<dyn Future<Output = Result<Done, BoxError>> + Send + 'a>>;

/// One system under test.
pub trait System: Send + Sync {
    /// Its name in the report.
    fn name(&self) -> &'static str;
    /// Runs the work once for `key`, or returns its stored result.
    fn execute<'a>(&'a self, key: &'a str) -> Execution<'a>;
}

/// idem's driver over `idem-redis`, with its defaults but the retention.
pub struct IdemSystem {
    idem: Idempotency<RedisStore>,
}

impl IdemSystem {
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, BoxError> {
        let store = RedisStore::standalone(url).await?.with_prefix(prefix)?;
        Ok(Self {
            idem: Idempotency::builder(store)
                .lease(LEASE)
                .retention(RETENTION)
                .build()?,
        })
    }
}

impl System for IdemSystem {
    fn name(&self) -> &'static str {
        "idem"
    }

    fn execute<'a>(&'a self, key: &'a str) -> Execution<'a> {
        Box::pin(async move {
            let key = Key::new("checkout", key)?;
            let outcome = self
                .idem
                .execute(&key, Fingerprint::of_bytes(REQUEST), |_ctx| async {
                    Ok::<_, WorkError<()>>(receipt())
                })
                .await?;
            match outcome {
                Outcome::Completed { replayed: true, .. } => Ok(Done::Replayed),
                Outcome::Completed { .. } => Ok(Done::Executed),
                _ => Err("idem: the work did not complete".into()),
            }
        })
    }
}

/// `idempotent` 2.0's Valkey store, through its `execute_or_replay` with JSON values.
pub struct PeerSystem {
    store: ValkeyStore,
}

impl PeerSystem {
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, BoxError> {
        let store = ValkeyStore::with_url(url)
            .prefix(prefix)
            .try_build()
            .await?;
        Ok(Self { store })
    }
}

impl System for PeerSystem {
    fn name(&self) -> &'static str {
        "idempotent"
    }

    fn execute<'a>(&'a self, key: &'a str) -> Execution<'a> {
        Box::pin(async move {
            let key = IdempotencyKey::new(key)?;
            let outcome = self
                .store
                .claim(&key, LEASE)
                .fingerprint("POST /checkout", REQUEST)
                .json()
                .execute_or_replay(RETENTION, |_token| async { Ok(receipt()) })
                .await?;
            match outcome {
                ExecutionOutcome::Replayed(_) => Ok(Done::Replayed),
                ExecutionOutcome::Executed(_) => Ok(Done::Executed),
                ExecutionOutcome::InFlight => Err("idempotent: in flight".into()),
                ExecutionOutcome::FingerprintMismatch => Err("idempotent: mismatch".into()),
                ExecutionOutcome::Fenced { .. } => Err("idempotent: fenced".into()),
            }
        })
    }
}

/// The floor both are held to, on the same client (a `ConnectionManager`, as both use): a
/// fresh key is `SET NX GET` (claim if absent) then `SET XX` (the result), a replay the one
/// `SET NX GET` that returns the stored value.
pub struct RawSystem {
    connection: ConnectionManager,
    prefix: String,
}

const PENDING: &[u8] = b"\x00pending";

impl RawSystem {
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, BoxError> {
        let client = redis::Client::open(url)?;
        Ok(Self {
            connection: ConnectionManager::new(client).await?,
            prefix: prefix.to_owned(),
        })
    }
}

impl System for RawSystem {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn execute<'a>(&'a self, key: &'a str) -> Execution<'a> {
        Box::pin(async move {
            let key = format!("{}{key}", self.prefix);
            let mut conn = self.connection.clone();
            let old: Option<Vec<u8>> = redis::cmd("SET")
                .arg(&key)
                .arg(PENDING)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(RETENTION.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            match old {
                Some(value) if value == PENDING => Err("raw: in flight".into()),
                Some(_) => Ok(Done::Replayed),
                None => {
                    let () = redis::cmd("SET")
                        .arg(&key)
                        .arg(RESPONSE)
                        .arg("XX")
                        .arg("KEEPTTL")
                        .query_async(&mut conn)
                        .await?;
                    Ok(Done::Executed)
                }
            }
        })
    }
}
