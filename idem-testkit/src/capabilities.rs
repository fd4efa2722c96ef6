//! What genuinely differs between stores. Everything else in the contract is mandatory,
//! and what a store declares about itself (`Store::expiry`, `Store::max_record_bytes`) the
//! suite reads from the store.

use idem_core::{ManualClock, driver::DEFAULT_MAX_RESPONSE_BYTES};

/// What the suite should know about a store that the store cannot say itself.
///
/// ```
/// use idem_testkit::Capabilities;
///
/// // Try responses of up to 4 MiB on a store without a record limit of its own.
/// let caps = Capabilities::default().with_max_response_bytes(4 * 1024 * 1024);
/// assert_eq!(caps.max_response_bytes, 4 * 1024 * 1024);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Capabilities {
    /// The largest response the suite stores and replays when the store declares no
    /// [`max_record_bytes`](idem_core::Store::max_record_bytes) (default 1 MiB, the
    /// driver's cap). A store that declares one is tested at exactly its limit, and one
    /// byte over it.
    pub max_response_bytes: usize,
    /// The clock the store reads, set by [`Suite::with_manual_clock`](crate::Suite::with_manual_clock).
    pub(crate) manual_clock: Option<ManualClock>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            manual_clock: None,
        }
    }
}

impl Capabilities {
    /// The largest response to try on a store without a record limit of its own.
    #[must_use]
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }
}
