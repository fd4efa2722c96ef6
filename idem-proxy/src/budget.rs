//! A route's budget of new keys, per caller: idem-core's token bucket keyed by the caller
//! and the route. The driver asks by scope, and a scope names the concrete path (and,
//! under `preserve_host`, the host): keyed by it, `/orders/1/refund` and
//! `/orders/2/refund` would each have a budget of their own, and a caller would get a
//! fresh one for every id.

use std::time::Duration;

use idem_core::driver::{KeyBudget, TokenBucket};

/// [`TokenBucket`] per caller and route.
#[derive(Debug)]
pub(crate) struct PerCaller {
    route: String,
    bucket: TokenBucket,
}

impl PerCaller {
    pub(crate) fn new(route: &str, keys: u32, per: Duration) -> Self {
        Self {
            route: route.to_owned(),
            bucket: TokenBucket::new(keys, per),
        }
    }

    /// The caller of `scope` (`"{host hash}.{caller hash}/{METHOD} {path}"`, the host
    /// part only under `preserve_host`), with the route.
    fn bucket_key(&self, scope: &str) -> String {
        let principal = scope.split('/').next().unwrap_or(scope);
        let caller = principal.rsplit('.').next().unwrap_or(principal);
        format!("{caller}/{}", self.route)
    }
}

impl KeyBudget for PerCaller {
    fn take(&self, scope: &str) -> Result<(), Duration> {
        self.bucket.take(&self.bucket_key(scope))
    }

    fn give_back(&self, scope: &str) {
        self.bucket.give_back(&self.bucket_key(scope));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_budget_per_caller_and_route_whatever_the_path_or_host() {
        let budget = PerCaller::new("refunds", 2, Duration::from_secs(3600));
        assert!(budget.take("abc/POST /orders/1/refund").is_ok());
        assert!(budget.take("h1.abc/POST /orders/2/refund").is_ok());
        assert!(budget.take("h2.abc/POST /orders/3/refund").is_err());
        assert!(
            budget.take("def/POST /orders/1/refund").is_ok(),
            "another caller"
        );
        budget.give_back("abc/POST /orders/9/refund");
        assert!(budget.take("abc/POST /orders/4/refund").is_ok());
    }
}
