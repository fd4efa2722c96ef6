//! `DynamoDbStoreBuilder`: the table, the key prefix, the skew margin and the clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Clock, raw::storage_name};

use crate::DynamoDbStore;

/// Settings for a [`DynamoDbStore`]; see [`DynamoDbStore::builder`].
#[must_use = "call build() to get the store"]
pub struct DynamoDbStoreBuilder {
    pub(crate) store: DynamoDbStore,
}

/// Why a key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrefixError {
    /// The prefix was longer than 512 bytes (partition keys hold at most 2048).
    #[error("the key prefix is {len} bytes long, over the limit of 512")]
    TooLong {
        /// Its length.
        len: usize,
    },
}

/// The builder's check of a prefix, also run when a URL is read, before a client exists.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.len() > 512 {
        return Err(PrefixError::TooLong { len: prefix.len() });
    }
    Ok(())
}

impl DynamoDbStoreBuilder {
    /// Puts every record of this store under `prefix`, so several applications (or
    /// tests) can share one table; `purge_expired` only touches its own prefix. Any bytes
    /// will do: prefixes never meet, even when one is a prefix of another.
    ///
    /// # Errors
    /// [`PrefixError`] when the prefix is over 512 bytes.
    pub fn prefix(mut self, prefix: &str) -> Result<Self, PrefixError> {
        check_prefix(prefix)?;
        self.store.prefix = prefix.into();
        self.store.namespace = storage_name::namespace_prefix(prefix).into();
        Ok(self)
    }

    /// How long past a lease's end a takeover waits (default 2 s); see the type's docs.
    pub fn skew_margin(mut self, margin: Duration) -> Self {
        self.store.skew_margin = margin;
        self
    }

    /// Whether a claim first reads the item (strongly consistent) and answers a finished
    /// record's replay or mismatch from the read (default: `false`, the conditional
    /// write alone).
    ///
    /// - Off, every claim is one conditional `UpdateItem`. A replay, an in-flight answer
    ///   and a mismatch are failed conditions, which DynamoDB bills as writes sized by the
    ///   stored item: one write unit per started KB, up to 400 for a 400 KB record; one
    ///   hot key takes at most 1 000 write units a second, so about ten replays a second
    ///   of a 100 KB result.
    /// - On, a replay or a mismatch of a finished record is one `GetItem`: one read unit
    ///   per started 4 KB (a write unit costs five read units on demand), and a hot key
    ///   takes 3 000 read units a second. Every other claim, a fresh key above all, pays
    ///   the read (one read unit, and a round trip) before its write.
    /// - Turn it on when stored results are large (several KB and more) or retries come in
    ///   storms; keep it off when most keys are fresh and results small, which is most
    ///   traffic. BENCHMARKS.md has the units and latencies measured for each.
    ///
    /// ```
    /// # async fn run(client: aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let store = idem_dynamodb::DynamoDbStore::builder(client, "idem")?
    ///     .claim_reads_first(true)
    ///     .build();
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn claim_reads_first(mut self, read_first: bool) -> Self {
        self.store.claim_reads_first = read_first;
        self
    }

    /// The clock the store reads (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.store.clock = Arc::new(clock);
        self
    }

    /// Builds the store.
    pub fn build(self) -> DynamoDbStore {
        self.store
    }
}

impl fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynamoDbStoreBuilder")
            .field(&self.store)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_of_512_bytes_is_the_longest() {
        assert_eq!(check_prefix(""), Ok(()));
        assert_eq!(check_prefix(&"p".repeat(512)), Ok(()));
        assert_eq!(
            check_prefix(&"p".repeat(513)),
            Err(PrefixError::TooLong { len: 513 })
        );
    }
}
