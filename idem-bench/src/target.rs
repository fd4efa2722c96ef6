//! What a workload drives: `execute` on a key, through idem or through the raw native
//! operations with the same client.

use async_trait::async_trait;
use idem_core::Outcome;
use idem_core::{Fingerprint, Idempotency, Key, Store, WorkError};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response every execution stores: small, like a payment receipt id.
pub(crate) const RESPONSE: &[u8] = br#"{"charge":"ch_3PqX9","status":"ok"}"#;

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
    /// One fingerprint for every key (the scaling run's seeded records share one); by
    /// default each key's request is its own bytes.
    fingerprint: Option<Fingerprint>,
}

impl<S: Store + 'static> IdemTarget<S> {
    pub(crate) fn new(store: S) -> Self {
        Self {
            idem: Idempotency::new(store),
            fingerprint: None,
        }
    }

    /// Every key with the same request fingerprint.
    pub(crate) fn with_fingerprint(store: S, fingerprint: Fingerprint) -> Self {
        Self {
            idem: Idempotency::new(store),
            fingerprint: Some(fingerprint),
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
            .execute(
                &key,
                self.fingerprint
                    .unwrap_or_else(|| Fingerprint::of_bytes(key.key())),
                |_ctx| async {
                    Ok::<_, WorkError<()>>(Receipt {
                        charge: "ch_3PqX9".into(),
                        status: "ok".into(),
                    })
                },
            )
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
