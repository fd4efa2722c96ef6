//! The file as written, before any check, and where in it a mistake is.

use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::ConfigError;

/// Turns byte spans into lines and columns of one file.
pub(super) struct Locator<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Locator<'_> {
    pub(super) fn error(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        let before = self.text.get(..span.start).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line,
            column,
            message: message.into(),
        }
    }

    pub(super) fn line(&self, offset: usize) -> usize {
        self.text
            .get(..offset)
            .unwrap_or(self.text)
            .matches('\n')
            .count()
            + 1
    }
}

// The file as written. Unknown fields are refused: a misspelt setting must not be ignored.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) listen: Option<Spanned<String>>,
    pub(super) admin_listen: Option<Spanned<String>>,
    pub(super) upstream: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) upstream_http2: bool,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) upstream_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) preserve_host: bool,
    pub(super) upstream_idle_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) trust_forwarded_headers: bool,
    pub(super) shutdown_grace: Option<Spanned<String>>,
    pub(super) shutdown_delay: Option<Spanned<String>>,
    pub(super) client_header_timeout: Option<Spanned<String>>,
    pub(super) client_body_timeout: Option<Spanned<String>>,
    pub(super) client_send_timeout: Option<Spanned<String>>,
    pub(super) max_connections: Option<Spanned<i64>>,
    pub(super) max_concurrent_requests: Option<Spanned<i64>>,
    #[serde(default)]
    pub(super) ready_checks_store: bool,
    pub(super) store: Option<String>,
    #[serde(default)]
    pub(super) migrate: bool,
    pub(super) store_connections: Option<Spanned<i64>>,
    pub(super) purge_interval: Option<Spanned<String>>,
    pub(super) unmatched: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) defaults: Defaults,
    #[serde(default)]
    pub(super) routes: Vec<Spanned<RouteFile>>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct Defaults {
    pub(super) key: Option<Spanned<String>>,
    pub(super) header: Option<Spanned<String>>,
    pub(super) scope: Option<Spanned<ScopeFile>>,
    pub(super) ignore_fields: Option<Vec<String>>,
    pub(super) status: Option<StatusFile>,
    pub(super) store_headers: Option<Vec<Spanned<String>>>,
    pub(super) upstream_timeout: Option<Spanned<String>>,
    pub(super) lease: Option<Spanned<String>>,
    pub(super) retention: Option<Spanned<String>>,
    pub(super) max_request_body: Option<Spanned<i64>>,
    pub(super) max_response_body: Option<Spanned<i64>>,
    pub(super) key_budget: Option<Spanned<KeyBudgetFile>>,
}

// The settings of `Defaults` again: serde's `flatten` would lose the spans and cannot
// refuse unknown fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) methods: Vec<Spanned<String>>,
    pub(super) path: Spanned<String>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) header: Option<Spanned<String>>,
    pub(super) scope: Option<Spanned<ScopeFile>>,
    pub(super) ignore_fields: Option<Vec<String>>,
    pub(super) status: Option<StatusFile>,
    pub(super) store_headers: Option<Vec<Spanned<String>>>,
    pub(super) upstream_timeout: Option<Spanned<String>>,
    pub(super) lease: Option<Spanned<String>>,
    pub(super) retention: Option<Spanned<String>>,
    pub(super) max_request_body: Option<Spanned<i64>>,
    pub(super) max_response_body: Option<Spanned<i64>>,
    pub(super) key_budget: Option<Spanned<KeyBudgetFile>>,
}

impl RouteFile {
    pub(super) fn settings(&self) -> Defaults {
        Defaults {
            key: self.key.clone(),
            header: self.header.clone(),
            scope: self.scope.clone(),
            ignore_fields: self.ignore_fields.clone(),
            status: self.status.clone(),
            store_headers: self.store_headers.clone(),
            upstream_timeout: self.upstream_timeout.clone(),
            lease: self.lease.clone(),
            retention: self.retention.clone(),
            max_request_body: self.max_request_body.clone(),
            max_response_body: self.max_response_body.clone(),
            key_budget: self.key_budget.clone(),
        }
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyBudgetFile {
    pub(super) keys: i64,
    pub(super) per: String,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(super) struct ScopeFile {
    pub(super) header: Option<String>,
    pub(super) jwt_claim: Option<String>,
    pub(super) algorithm: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) public_key_pem: Option<String>,
    pub(super) jwks_url: Option<String>,
    pub(super) jwks_refresh: Option<String>,
    pub(super) audience: Option<Vec<String>>,
    pub(super) issuer: Option<String>,
}

#[derive(Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct StatusFile {
    #[serde(default)]
    pub(super) store: Vec<Spanned<u16>>,
    #[serde(default)]
    pub(super) release: Vec<Spanned<u16>>,
    #[serde(default)]
    pub(super) hold: Vec<Spanned<u16>>,
}
