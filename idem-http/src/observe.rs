//! Metrics, through the `metrics` facade. No label carries a key, a scope or a body.
//!
//! | name | kind | labels | moves when |
//! |---|---|---|---|
//! | `idem_http_requests_total` | counter | `answer`, and `route` with [`route_label`](crate::IdempotencyLayer::route_label) | the layer answered a request: `executed`, `replayed`, `passed_through`, `missing_key`, `malformed_key`, `scope_refused`, `too_large`, `bad_body`, `mismatch`, `in_flight`, `lease_lost`, `unavailable`, `released`, `held`, `error` |
//! | `idem_http_shadow_total` | counter | `would`, and `route` as above | in shadow mode, the layer would have answered other than the handler (`replayed`, `mismatch`, `in_flight`, `missing_key`, ...) |
//!
//! The driver's own metrics (`idem_claims_total` and the rest, see
//! [`idem_core::driver::observe`]) move too.

use crate::layer::Config;

/// `idem_http_requests_total`
pub const REQUESTS: &str = "idem_http_requests_total";
/// `idem_http_shadow_total`
pub const SHADOW: &str = "idem_http_shadow_total";

/// What the layer answered: the `answer` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `executed`: the handler ran and its response is stored.
    Executed,
    /// `replayed`: the stored response was sent again.
    Replayed,
    /// `passed_through`: not protected (method or no optional header) or shadow mode.
    PassedThrough,
    /// `missing_key`: 400.
    MissingKey,
    /// `malformed_key`: 400.
    MalformedKey,
    /// `scope_refused`: the scope function answered.
    ScopeRefused,
    /// `too_large`: 413.
    TooLarge,
    /// `bad_body`: 400, the body could not be read.
    BadBody,
    /// `key_refused`: 400, the driver's key policy refused the key.
    KeyRefused,
    /// `key_budget_exhausted`: 429, the scope created too many new keys.
    KeyBudgetExhausted,
    /// `mismatch`: 422.
    Mismatch,
    /// `in_flight`: 409.
    InFlight,
    /// `lease_lost`: 409, another attempt took over.
    LeaseLost,
    /// `unavailable`: 503.
    Unavailable,
    /// `released`: the handler's response, not stored, the key released.
    Released,
    /// `held`: the handler's response, not stored, the key held until the lease ends.
    Held,
    /// `error`: 500.
    Error,
}

impl Answer {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Answer::Executed => "executed",
            Answer::Replayed => "replayed",
            Answer::PassedThrough => "passed_through",
            Answer::MissingKey => "missing_key",
            Answer::MalformedKey => "malformed_key",
            Answer::ScopeRefused => "scope_refused",
            Answer::TooLarge => "too_large",
            Answer::BadBody => "bad_body",
            Answer::KeyRefused => "key_refused",
            Answer::KeyBudgetExhausted => "key_budget_exhausted",
            Answer::Mismatch => "mismatch",
            Answer::InFlight => "in_flight",
            Answer::LeaseLost => "lease_lost",
            Answer::Unavailable => "unavailable",
            Answer::Released => "released",
            Answer::Held => "held",
            Answer::Error => "error",
        }
    }
}

pub(crate) fn answer(config: &Config, answer: Answer) {
    match &config.route_label {
        Some(route) => {
            metrics::counter!(REQUESTS, "answer" => answer.name(), "route" => route.clone())
                .increment(1);
        }
        None => metrics::counter!(REQUESTS, "answer" => answer.name()).increment(1),
    }
}

pub(crate) fn shadow(config: &Config, would: &'static str) {
    match &config.route_label {
        Some(route) => {
            metrics::counter!(SHADOW, "would" => would, "route" => route.clone()).increment(1);
        }
        None => metrics::counter!(SHADOW, "would" => would).increment(1),
    }
}
