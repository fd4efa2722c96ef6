//! The in-memory store: the state machine applied to a sharded map.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::machine::{self, Transition};
use crate::{
    Clock, Key, Record, Store, StoreError, SystemClock, Timestamp, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};

/// Enough shards that 16 tasks on different keys rarely meet on one lock.
const SHARDS: usize = 64;

/// Records by key, each holding its own key: one hash per operation picks the shard and
/// finds the slot, and no key is stored twice.
type Shard = Mutex<HashTable<Record>>;

/// A [`Store`] in process memory, built directly on the state machine in [`crate::machine`].
///
/// For unit tests of handlers, single-process services and examples. Records live as long
/// as the store, so a restart forgets them: use a database-backed store where retries can
/// outlive the process. Keys are spread over independent shards, so tasks working on
/// different keys do not wait on one global lock. Cloning is cheap and clones share records.
///
/// ```
/// use idem_core::{store::ClaimOutcome, store::ClaimRequest, Fingerprint, Key, ManualClock, MemoryStore, Store};
/// use std::time::Duration;
///
/// # tokio_test_block_on(async {
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let key = Key::new("tests", "k1")?;
/// let request = ClaimRequest::new(key, Fingerprint::of_bytes("req"), Duration::from_secs(10), Duration::from_secs(60));
/// assert!(matches!(store.claim(&request).await?, ClaimOutcome::Claimed { .. }));
/// clock.advance(Duration::from_secs(61));
/// assert_eq!(store.purge_expired(100).await?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Shard]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store on the given clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            clock: Arc::new(clock),
        }
    }

    /// A handle on the same records that reads `clock`: what another process, whose clock
    /// differs, sees of one shared store whose rules run on the caller's clock (as
    /// SQLite's do across processes). idem-testkit's explorer gives each simulated process
    /// one, its clock skewed; [`MemoryStore::clone`] is a handle on the same clock.
    ///
    /// ```
    /// use idem_core::{ManualClock, MemoryStore};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let ahead = ManualClock::new();
    /// ahead.advance(Duration::from_secs(2));
    /// let other = store.sharing_with_clock(ahead);
    /// assert_eq!(store.len(), other.len());
    /// ```
    pub fn sharing_with_clock(&self, clock: impl Clock + 'static) -> Self {
        Self {
            shards: Arc::clone(&self.shards),
            hasher: self.hasher.clone(),
            clock: Arc::new(clock),
        }
    }

    /// The number of records held, expired ones included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Whether the store holds no record at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key's hash and its shard. The shard comes from the hash's top bits, which the
    /// table does not use to place records (it takes the low bits and the top seven).
    fn locate(&self, key: &Key) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(key);
        let index = ((hash >> 32) as usize) % self.shards.len();
        (hash, &self.shards[index])
    }

    fn find<'t>(&self, table: &'t HashTable<Record>, hash: u64, key: &Key) -> Option<&'t Record> {
        table.find(hash, |record| record.key == *key)
    }

    /// Every record, copied out shard by shard.
    fn snapshot(&self) -> Vec<Record> {
        self.shards
            .iter()
            .flat_map(|shard| lock(shard).iter().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Runs one transition atomically under the key's shard lock.
    fn apply<O>(
        &self,
        key: &Key,
        transition: impl FnOnce(Option<&Record>, Timestamp) -> Transition<O>,
    ) -> O {
        match self.try_apply(key, |record, now| {
            Ok::<_, std::convert::Infallible>(transition(record, now))
        }) {
            Ok(outcome) => outcome,
            Err(never) => match never {},
        }
    }

    /// [`Self::apply`] for a transition the machine may refuse: a refusal writes nothing.
    fn try_apply<O, E>(
        &self,
        key: &Key,
        transition: impl FnOnce(Option<&Record>, Timestamp) -> Result<Transition<O>, E>,
    ) -> Result<O, E> {
        let (hash, shard) = self.locate(key);
        let mut records = lock(shard);
        let now = self.clock.now();
        // One hash and probe per operation: the entry serves the read and the write.
        let rehash = |record: &Record| self.hasher.hash_one(&record.key);
        match records.entry(hash, |record| record.key == *key, rehash) {
            Entry::Occupied(mut entry) => {
                let Transition { outcome, write } = transition(Some(entry.get()), now)?;
                if let Some(record) = write {
                    *entry.get_mut() = record;
                }
                Ok(outcome)
            }
            Entry::Vacant(entry) => {
                let Transition { outcome, write } = transition(None, now)?;
                if let Some(record) = write {
                    entry.insert(record);
                }
                Ok(outcome)
            }
        }
    }
}

// No operation leaves a shard half-written (the new record is computed before it is
// inserted), so a panic elsewhere while holding a lock cannot corrupt it.
fn lock(shard: &Shard) -> MutexGuard<'_, HashTable<Record>> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .field("clock", &self.clock)
            .finish()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.try_apply(&request.key, |record, now| {
            machine::claim(record, request, now)
        })
        .map_err(|refusal| StoreError::from(refusal).for_key(&request.key))
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        Ok(self.apply(&lease.key, |record, now| {
            machine::complete(record, lease, response, now)
        }))
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        Ok(self.apply(&lease.key, |record, now| {
            machine::fail(record, lease, response, now)
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        Ok(self.apply(&lease.key, |record, now| {
            machine::release(record, lease, now)
        }))
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        Ok(self.apply(&lease.key, |record, now| {
            machine::renew(record, lease, extend, now)
        }))
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        Ok(self.apply(&lease.key, |record, now| {
            machine::checkpoint(record, lease, step, value, now)
        }))
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let (hash, shard) = self.locate(key);
        let records = lock(shard);
        Ok(machine::visible(self.find(&records, hash, key), self.clock.now()).cloned())
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut purged = 0;
        for shard in self.shards.iter() {
            if purged == limit {
                break;
            }
            let mut records = lock(shard);
            let now = self.clock.now();
            let mut room = limit - purged;
            records.retain(|record| {
                let doomed = room > 0 && machine::is_purgeable(record, now);
                if doomed {
                    room -= 1;
                }
                !doomed
            });
            purged = limit - room;
        }
        Ok(purged)
    }
}

#[async_trait]
impl crate::Admin for MemoryStore {
    async fn list(
        &self,
        query: &crate::admin::ListQuery,
    ) -> Result<crate::admin::Page, StoreError> {
        let now = self.clock.now();
        crate::raw::select_page(self.snapshot(), query, now)
    }

    async fn stats(&self, top_scopes: usize) -> Result<crate::admin::Stats, StoreError> {
        let now = self.clock.now();
        Ok(crate::admin::Stats::tally(
            &self.snapshot(),
            now,
            top_scopes,
        ))
    }

    async fn release_key(&self, key: &Key) -> Result<crate::admin::ReleaseKeyOutcome, StoreError> {
        let attempt = crate::record::AttemptId::random();
        self.try_apply(key, |record, now| {
            machine::release_key(record, attempt, now)
        })
        .map_err(|refusal| StoreError::from(refusal).for_key(key))
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let (hash, shard) = self.locate(key);
        let mut records = lock(shard);
        match records.find_entry(hash, |record| record.key == *key) {
            Ok(entry) => {
                entry.remove();
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    async fn raw(&self, key: &Key) -> Result<Option<crate::admin::RawRecord>, StoreError> {
        let (hash, shard) = self.locate(key);
        let records = lock(shard);
        Ok(self.find(&records, hash, key).map(crate::raw::raw_of))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Admin, Fingerprint, State, admin::ReleaseKeyOutcome, raw::MAX_TOKEN};

    /// The memory store applies the machine as it is, refusals included: a record planted
    /// at the last token is never taken over or released, and the refusal writes nothing.
    #[tokio::test]
    async fn the_last_token_is_never_passed() {
        let store = MemoryStore::new();
        let request = |fingerprint: &str| {
            ClaimRequest::new(
                Key::new("s", "last-token").unwrap(),
                Fingerprint::of_bytes(fingerprint),
                Duration::from_secs(60),
                Duration::from_secs(3600),
            )
        };
        let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request("a")).await else {
            panic!("a fresh key is claimed");
        };
        let key = lease.key.clone();
        // Planted: the owner's lease over, the token at its limit.
        let now = store.clock.now();
        store.apply(&key, |record, _| {
            let mut record = record.expect("claimed above").clone();
            record.token = MAX_TOKEN;
            record.lease_until = now;
            Transition {
                outcome: (),
                write: Some(record),
            }
        });
        let planted = store.get(&key).await.unwrap();
        for answer in [
            store.claim(&request("a")).await.map(|a| format!("{a:?}")),
            store.release_key(&key).await.map(|a| format!("{a:?}")),
        ] {
            let err = answer.expect_err("refused");
            assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
            assert!(
                err.to_string().contains(&key.short_hash().to_string()),
                "{err}"
            );
        }
        assert_eq!(store.get(&key).await.unwrap(), planted, "nothing written");
        let Some(mut finished) = planted else {
            panic!("still present");
        };
        finished.state = State::Completed;
        store.apply(&key, |_, _| Transition {
            outcome: (),
            write: Some(finished),
        });
        assert_eq!(
            store.release_key(&key).await.unwrap(),
            ReleaseKeyOutcome::Finished(State::Completed)
        );
    }
}
