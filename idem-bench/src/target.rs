//! What a workload drives: `execute` on a key, through idem or through the raw native
//! operations with the same client.

use async_trait::async_trait;
use idem_core::Outcome;
use idem_core::{Fingerprint, Idempotency, Key, Store, WorkError};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response every execution stores: small, like a payment receipt id.
pub(crate) const RESPONSE: &[u8] = br#"{"charge":"ch_3PqX9","status":"ok"}"#;

/// The request every execution is for, fingerprinted once per target: the raw baselines
/// fingerprint nothing, so a fingerprint in the timed loop would charge idem for work
/// the comparison leaves out (its cost is measured on its own, `floor::fingerprint_ns`).
pub(crate) const REQUEST: &[u8] =
    br#"{"amount":4200,"currency":"EUR","customer":"cus_9s6XKzkNRiz8i3"}"#;

/// How one execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Done {
    Executed,
    Replayed,
    /// Another client held the key (contended workload).
    Busy,
}

#[async_trait]
pub(crate) trait Target: Send + Sync {
    /// Runs trivial work once for `key`, or returns its stored result.
    async fn execute(&self, key: &str) -> Result<Done, BoxError>;
}

/// Through idem's driver.
pub(crate) struct IdemTarget<S> {
    idem: Idempotency<S>,
    /// Every key's request fingerprint, computed once (see [`REQUEST`]).
    fingerprint: Fingerprint,
}

impl<S: Store + 'static> IdemTarget<S> {
    pub(crate) fn new(store: S) -> Self {
        Self::with_fingerprint(store, Fingerprint::of_bytes(REQUEST))
    }

    /// Every key with this request fingerprint (the scaling run's seeded records share one).
    pub(crate) fn with_fingerprint(store: S, fingerprint: Fingerprint) -> Self {
        Self {
            idem: Idempotency::new(store),
            fingerprint,
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    charge: String,
    status: String,
}

#[async_trait]
impl<S: Store + 'static> Target for IdemTarget<S> {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        let key = Key::new("bench/checkout", key)?;
        let result = self
            .idem
            .execute(&key, self.fingerprint, |_ctx| async {
                Ok::<_, WorkError<()>>(Receipt {
                    charge: "ch_3PqX9".into(),
                    status: "ok".into(),
                })
            })
            .await;
        match result {
            Ok(Outcome::Completed { replayed: true, .. }) => Ok(Done::Replayed),
            Ok(Outcome::Completed { .. }) => Ok(Done::Executed),
            Ok(_) => Err("the work failed".into()),
            Err(idem_core::Error::InFlight { .. }) => Ok(Done::Busy),
            Err(err) => Err(format!("{err}: {:?}", std::error::Error::source(&err)).into()),
        }
    }
}
