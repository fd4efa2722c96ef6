//! What genuinely differs between stores. Everything else in the contract is mandatory.

use idem_core::{DEFAULT_MAX_RESPONSE_BYTES, ManualClock};

/// What a store can do that others cannot, so the suite tests each store to its limits.
///
/// ```
/// use idem_testkit::Capabilities;
///
/// // A store whose records hold at most 350 000 bytes of response.
/// let caps = Capabilities::default().with_max_response_bytes(350_000);
/// assert_eq!(caps.max_response_bytes, 350_000);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Capabilities {
    /// The largest response the suite stores and replays (default 1 MiB, the driver's cap).
    pub max_response_bytes: usize,
    /// True when the store declared `max_response_bytes` as its own limit: one byte more
    /// must then be refused with `StoreError::ResponseTooLarge`, writing nothing.
    pub max_response_bytes_is_limit: bool,
    /// True when the store deletes a record by itself the moment it becomes purgeable
    /// (expired, and no live lease), as Redis does with `PEXPIREAT`: `purge_expired` then
    /// finds nothing, and a key claimed again after that starts over at token 1.
    pub expired_records_vanish: bool,
    /// The clock the store reads, set by [`Suite::with_manual_clock`](crate::Suite::with_manual_clock).
    pub(crate) manual_clock: Option<ManualClock>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_response_bytes_is_limit: false,
            expired_records_vanish: false,
            manual_clock: None,
        }
    }
}

impl Capabilities {
    /// Declares that the store deletes records itself once they are purgeable.
    #[must_use]
    pub fn with_expired_records_vanishing(mut self) -> Self {
        self.expired_records_vanish = true;
        self
    }

    /// Declares the store's largest response, which it must enforce itself.
    #[must_use]
    pub fn with_max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self.max_response_bytes_is_limit = true;
        self
    }
}
