//! Raw baseline for memory: a mutex-protected map per shard, like the memory store's.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::target::{BoxError, Done, RESPONSE, Target};

pub(crate) struct RawMemory {
    shards: Vec<Mutex<HashMap<String, Option<Vec<u8>>>>>,
    hasher: RandomState,
    /// Lock sections taken: the in-memory counterpart of a round trip.
    pub(crate) calls: Arc<AtomicU64>,
}

impl RawMemory {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..64).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            calls: Arc::default(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Option<Vec<u8>>>> {
        &self.shards[(self.hasher.hash_one(key) as usize) % self.shards.len()]
    }
}

#[async_trait]
impl Target for RawMemory {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut map = self.shard(key).lock().map_err(|_| "poisoned")?;
            match map.get(key) {
                Some(Some(_)) => return Ok(Done::Replayed),
                Some(None) => return Ok(Done::Busy),
                None => {
                    map.insert(key.to_owned(), None);
                }
            }
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut map = self.shard(key).lock().map_err(|_| "poisoned")?;
        map.insert(key.to_owned(), Some(RESPONSE.to_vec()));
        Ok(Done::Executed)
    }
}
