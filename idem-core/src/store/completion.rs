//! A result the driver prepared for a store to write inside the caller's own transaction.

use std::fmt;
use std::sync::Arc;

use crate::record::Lease;

/// What tells the driver the bytes were written.
type Written = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// A result prepared by `Context::prepare_completion` (driver feature) for a store to
/// write inside the caller's own transaction, beside the work's own writes.
///
/// - A store's `complete_in` writes [`Completion::bytes`] fenced by
///   [`Completion::lease`], exactly as [`Store::complete`](crate::Store::complete) would,
///   and calls [`Completion::written`] once its write applied.
/// - Nothing else about the driver is needed: a backend that offers `complete_in`
///   depends on the contract alone.
#[derive(Clone)]
pub struct Completion {
    lease: Lease,
    bytes: Vec<u8>,
    written: Written,
}

impl Completion {
    /// A completion of `bytes` under `lease`; `written` runs when a store says it wrote
    /// them.
    #[cfg_attr(not(feature = "driver"), allow(dead_code))]
    pub(crate) fn new(
        lease: Lease,
        bytes: Vec<u8>,
        written: impl Fn(&[u8]) + Send + Sync + 'static,
    ) -> Self {
        Self {
            lease,
            bytes,
            written: Arc::new(written),
        }
    }

    /// The lease the write is fenced by.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The bytes to store.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Tells the driver these bytes were written in the caller's transaction: when the
    /// work returns, it answers with exactly them.
    pub fn written(&self) {
        (self.written)(&self.bytes);
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("lease", &self.lease)
            .field("bytes_len", &self.bytes.len())
            .finish()
    }
}
