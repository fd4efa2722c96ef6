//! Payment providers' own idempotency identifiers, derived so a takeover sends the same one.

use std::fmt;
use std::time::Duration;

use super::Context;

const HOUR: Duration = Duration::from_secs(3600);

/// A payment provider's deduplication: how its identifier looks and how long it
/// remembers one.
///
/// [`Context::provider_key`] derives the identifier from the record's key, request and
/// lifetime and a step name ([`Context::derive`]), so every retry and every takeover of
/// one execution sends the provider the same identifier, and the provider deduplicates
/// what idem cannot see (a call whose answer was lost).
///
/// | provider | identifier | format | remembered |
/// |---|---|---|---|
/// | [`Provider::STRIPE`] | `Idempotency-Key` header | `idem-` + 32 hex (at most 255 allowed) | 24 hours |
/// | [`Provider::ADYEN`] | `reference` field | `idem-` + 32 hex (at most 80 allowed) | about 30 days |
/// | [`Provider::PAYPAL`] | `PayPal-Request-Id` header | UUID (name-based, v5) | per API: 6 hours assumed |
///
/// Retention: give idem at least the provider's (the builder warns otherwise, see
/// [`IdempotencyBuilder::provider`](crate::IdempotencyBuilder::provider)). Once idem
/// forgets a record, a client retry starts a new lifetime whose identifiers differ, and
/// the provider charges again. The other way round, a takeover later than the provider's
/// window sends an identifier it has forgotten: keep a step that checks the provider's
/// state before charging again when leases may end that late. PayPal's window depends on
/// the API; set what its reference states with [`Provider::with_retention`].
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, done, driver::Provider};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::builder(MemoryStore::new()).provider(Provider::STRIPE).build()?;
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// let sent = idem
///     .execute(&key, Fingerprint::of_bytes("500 EUR"), |ctx| async move {
///         let stripe = ctx.provider_key(Provider::STRIPE, "charge");
///         let paypal = ctx.provider_key(Provider::PAYPAL, "charge");
///         // POST /v1/payment_intents with `Idempotency-Key: {stripe}` ...
///         done((stripe, paypal))
///     })
///     .await?
///     .value()
///     .unwrap();
/// assert!(sent.0.starts_with("idem-") && sent.0.len() <= 255);
/// assert_eq!(sent.1.len(), 36);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    name: &'static str,
    format: Format,
    retention: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    /// `idem-` and 32 hex digits, within the provider's length limit.
    Derived,
    /// A name-based UUID (version 5).
    Uuid,
}

/// The namespace of PayPal request ids: a fixed UUID, so ids are stable across releases.
const PAYPAL_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6b1f_5a3e_2c4d_4e8f_9a07_d1c2_b3e4_f5a6);

impl Provider {
    /// Stripe's `Idempotency-Key` header: at most 255 characters, remembered at least 24
    /// hours.
    pub const STRIPE: Provider = Provider {
        name: "stripe",
        format: Format::Derived,
        retention: Duration::from_secs(24 * 3600),
    };

    /// Adyen's `reference`: at most 80 characters, unique per merchant account, checked
    /// for about 30 days.
    pub const ADYEN: Provider = Provider {
        name: "adyen",
        format: Format::Derived,
        retention: Duration::from_secs(30 * 24 * 3600),
    };

    /// PayPal's `PayPal-Request-Id` header: a UUID, remembered for a period each API's
    /// reference states; 6 hours is assumed here (set yours with
    /// [`Provider::with_retention`]).
    pub const PAYPAL: Provider = Provider {
        name: "paypal",
        format: Format::Uuid,
        retention: Duration::from_secs(6 * 3600),
    };

    /// The same provider, remembering identifiers for `retention` (what your contract or
    /// the API's reference states).
    #[must_use]
    pub const fn with_retention(self, retention: Duration) -> Self {
        Self { retention, ..self }
    }

    /// The provider's name, as in labels of [`Context::derive`] (`stripe:charge`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How long the provider remembers an identifier.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The label handed to [`Context::derive`] for `step`: `idem inspect --derive` with it
    /// shows the identifier an execution sent (its `idem-` form for PayPal, whose UUID is
    /// made from that).
    pub fn label(&self, step: &str) -> String {
        format!("{}:{step}", self.name)
    }

    /// The identifier for a derived key ([`crate::key::derive_key`]) in this provider's
    /// format.
    pub fn format(&self, derived: &str) -> String {
        match self.format {
            Format::Derived => derived.to_owned(),
            Format::Uuid => uuid::Uuid::new_v5(&PAYPAL_NAMESPACE, derived.as_bytes())
                .hyphenated()
                .to_string(),
        }
    }
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .finish()
    }
}

impl Context {
    /// The identifier to send `provider` for the call made in `step`: the same for every
    /// retry and takeover of this execution, different per step, request and lifetime,
    /// and revealing neither key nor request. See [`Provider`].
    pub fn provider_key(&self, provider: Provider, step: &str) -> String {
        provider.format(&self.derive(&provider.label(step)))
    }
}

/// A driver setting that works but deserves a look; logged when the driver is built and
/// kept on it ([`Idempotency::warnings`](crate::Idempotency::warnings)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettingsWarning {
    /// idem forgets results before the provider forgets identifiers: a client retrying
    /// after idem's retention starts a new lifetime, sends the provider a new identifier,
    /// and is charged again.
    RetentionShorterThanProvider {
        /// The provider.
        provider: &'static str,
        /// idem's retention.
        retention: Duration,
        /// The provider's.
        provider_retention: Duration,
    },
}

impl fmt::Display for SettingsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsWarning::RetentionShorterThanProvider {
                provider,
                retention,
                provider_retention,
            } => write!(
                f,
                "the retention ({:.1} h) is shorter than {provider}'s ({:.1} h): a retry after idem forgets a result sends {provider} a new identifier; raise the retention to at least {provider}'s",
                retention.as_secs_f64() / HOUR.as_secs_f64(),
                provider_retention.as_secs_f64() / HOUR.as_secs_f64(),
            ),
        }
    }
}

pub(crate) fn warnings(retention: Duration, providers: &[Provider]) -> Vec<SettingsWarning> {
    providers
        .iter()
        .filter(|provider| retention < provider.retention)
        .map(|provider| SettingsWarning::RetentionShorterThanProvider {
            provider: provider.name,
            retention,
            provider_retention: provider.retention,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_fit_each_provider() {
        let derived = "idem-00112233445566778899aabbccddeeff";
        assert_eq!(Provider::STRIPE.format(derived), derived);
        assert!(Provider::ADYEN.format(derived).len() <= 80);
        let paypal = Provider::PAYPAL.format(derived);
        let parsed = uuid::Uuid::parse_str(&paypal).unwrap();
        assert_eq!(parsed.get_version_num(), 5);
        assert_eq!(paypal, Provider::PAYPAL.format(derived), "deterministic");
        assert_ne!(
            paypal,
            Provider::PAYPAL.format("idem-00112233445566778899aabbccddeef0")
        );
        assert_eq!(Provider::STRIPE.label("charge"), "stripe:charge");
    }

    #[test]
    fn warns_only_when_idem_forgets_first() {
        let day = Duration::from_secs(24 * 3600);
        assert!(warnings(day, &[Provider::STRIPE, Provider::PAYPAL]).is_empty());
        // Stripe remembers a key 24 hours: a second less here, and a retry may run again.
        let short = warnings(day - Duration::from_secs(1), &[Provider::STRIPE]);
        assert_eq!(short.len(), 1, "{short:?}");
        // Adyen checks for 30 days, PayPal (as assumed) for 6 hours.
        assert_eq!(warnings(29 * day, &[Provider::ADYEN]).len(), 1);
        assert!(warnings(30 * day, &[Provider::ADYEN]).is_empty());
        let hours = |n: u64| Duration::from_secs(n * 3600);
        assert_eq!(
            warnings(hours(6) - Duration::from_secs(1), &[Provider::PAYPAL]).len(),
            1
        );
        assert!(warnings(hours(6), &[Provider::PAYPAL]).is_empty());
        let found = warnings(day, &[Provider::STRIPE, Provider::ADYEN]);
        assert_eq!(found.len(), 1);
        assert!(found[0].to_string().contains("adyen"), "{}", found[0]);
        let long_paypal = Provider::PAYPAL.with_retention(3 * day);
        assert_eq!(warnings(day, &[long_paypal]).len(), 1);
    }

    #[test]
    fn getters_and_debug_show_the_name_and_retention() {
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(Provider::STRIPE.name(), "stripe");
        assert_eq!(Provider::ADYEN.name(), "adyen");
        assert_eq!(Provider::PAYPAL.name(), "paypal");
        assert_eq!(Provider::STRIPE.retention(), day);
        assert_eq!(
            Provider::PAYPAL.with_retention(3 * day).retention(),
            3 * day
        );
        assert_eq!(
            format!("{:?}", Provider::PAYPAL),
            "Provider { name: \"paypal\", retention: 21600s }"
        );
    }
}
