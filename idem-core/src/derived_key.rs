//! Idempotency keys for downstream calls, derived from a record's lifetime.

use sha2::{Digest, Sha256};

use crate::{Fingerprint, Key, Record, Timestamp};

/// The idempotency key that [`Context::derive`](crate::Context::derive) gives the work for
/// `label`, for the request with `fingerprint` under `key`, in the lifetime of the record
/// created at `created_at`.
///
/// - The same for every retry and takeover of one request within one record's lifetime.
/// - Different for each `label`, fingerprint and lifetime.
/// - `idem-` and 32 hex digits; reveals neither the key nor the request.
///
/// Operators use it to find, at a payment provider or another downstream system, what an
/// execution did there (see [`Record::derive`] and `idem inspect --derive LABEL`).
///
/// ```
/// use idem_core::{key::derive_key, Fingerprint, Key, Timestamp};
///
/// let key = Key::new("acct_42/charge", "order-7781")?;
/// let derived = derive_key(&key, &Fingerprint::of_bytes("req"), Timestamp::from_unix_millis(1), "charge");
/// assert!(derived.starts_with("idem-"));
/// assert_eq!(derived.len(), 37);
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
pub fn derive_key(
    key: &Key,
    fingerprint: &Fingerprint,
    created_at: Timestamp,
    label: &str,
) -> String {
    let (scope, key) = (key.scope(), key.key());
    let digest = Sha256::new()
        .chain_update(b"idem.derive.v2")
        .chain_update((scope.len() as u64).to_be_bytes())
        .chain_update(scope)
        .chain_update((key.len() as u64).to_be_bytes())
        .chain_update(key)
        .chain_update(fingerprint.as_bytes())
        .chain_update(created_at.as_unix_millis().to_be_bytes())
        .chain_update(label)
        .finalize();
    let mut out = String::with_capacity(5 + 32);
    out.push_str("idem-");
    for byte in &digest[..16] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

impl Record {
    /// The key [`Context::derive`](crate::Context::derive) gave this record's executions
    /// for `label`; see [`derive_key`].
    ///
    /// ```
    /// use idem_core::{machine, store::ClaimRequest, Fingerprint, Key, Timestamp};
    /// use std::time::Duration;
    ///
    /// let key = Key::new("acct_42/charge", "order-7781")?;
    /// let request = ClaimRequest::new(key, Fingerprint::of_bytes("req"), Duration::from_secs(30), Duration::from_secs(60));
    /// let record = machine::claim(None, &request, Timestamp::from_unix_millis(5))?.write.unwrap();
    /// assert!(record.derive("charge").starts_with("idem-"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn derive(&self, label: &str) -> String {
        derive_key(&self.key, &self.fingerprint, self.created_at, label)
    }
}

#[cfg(all(test, feature = "memory", feature = "driver"))]
mod tests {
    use crate::{Fingerprint, Idempotency, Key, MemoryStore, Store, done};

    #[tokio::test]
    async fn an_operator_derives_what_the_work_derived() {
        let store = MemoryStore::new();
        let idem = Idempotency::new(store.clone());
        let key = Key::new("acct_42/charge", "order-7781").unwrap();
        let fingerprint = Fingerprint::of_bytes("req");
        let executed = idem
            .execute(&key, fingerprint, |ctx| async move {
                done((ctx.derive("charge"), ctx.derive("refund")))
            })
            .await
            .unwrap();
        let (charge, refund) = executed.value().unwrap().clone();
        let record = store.get(&key).await.unwrap().unwrap();
        assert_eq!(record.derive("charge"), charge);
        assert_eq!(record.derive("refund"), refund);
        assert_ne!(charge, refund);
    }
}
