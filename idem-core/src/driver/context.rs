//! What the protected work receives: its lease and the means to act on it.

use std::fmt;
use std::sync::Arc;

use crate::{Key, Lease, Steps};

/// Handed to the work by [`Idempotency::execute`](crate::Idempotency::execute).
///
/// Cheap to clone; clones share the same lease.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    lease: Lease,
    resumed: bool,
    steps: Steps,
}

impl Context {
    pub(crate) fn new(lease: Lease, resumed: bool, steps: Steps) -> Self {
        Self {
            inner: Arc::new(Inner {
                lease,
                resumed,
                steps,
            }),
        }
    }

    /// The key being executed.
    pub fn key(&self) -> &Key {
        &self.inner.lease.key
    }

    /// The fencing token: strictly greater for every later owner of this key. Pass it to
    /// downstream systems that reject writes carrying a lower token than they have seen.
    pub fn token(&self) -> u64 {
        self.inner.lease.token
    }

    /// True when this run took over from an earlier attempt whose lease expired: part of
    /// the work may already have happened (see its checkpointed steps).
    pub fn resumed(&self) -> bool {
        self.inner.resumed
    }

    /// The lease this run holds.
    pub fn lease(&self) -> &Lease {
        &self.inner.lease
    }

    /// Checkpoints left by earlier owners, by step name.
    pub fn checkpoints(&self) -> &Steps {
        &self.inner.steps
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("key", self.key())
            .field("token", &self.token())
            .field("resumed", &self.resumed())
            .finish()
    }
}
