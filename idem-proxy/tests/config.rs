//! The configuration file: every mistake is reported with its line and what to write.

use std::sync::Arc;
use std::time::Duration;

use idem_core::MemoryStore;
use idem_proxy::{Config, ConfigError, KeyRule, Proxy, ProxyError, RouteError, ScopeSource};

const GOOD: &str = r#"
upstream = "http://127.0.0.1:8000"

[defaults]
scope = { header = "x-account-id" }

[[routes]]
methods = ["POST"]
path = "/payments"
"#;

/// The line, column and message of a refused file.
fn refused(text: &str) -> (usize, usize, String) {
    match Config::parse("idem.toml", text) {
        Err(ConfigError::Invalid {
            line,
            column,
            message,
            path,
        }) => {
            assert_eq!(path.to_str(), Some("idem.toml"));
            (line, column, message)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_good_file_has_the_documented_defaults() {
    let config = Config::parse("idem.toml", GOOD).unwrap();
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.admin_listen.to_string(), "127.0.0.1:9464");
    assert_eq!(config.upstream_timeout, Duration::from_secs(60));
    assert_eq!(config.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.shutdown_grace, Duration::from_secs(20));
    // Within Kubernetes' default 30 s grace period, with the delay a pod gets.
    assert!(
        config.shutdown_grace + idem_proxy::DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES
            < Duration::from_secs(30)
    );
    assert!(!config.migrate && config.purge_interval.is_none() && config.store.is_none());
    assert_eq!(config.store_connections, 16);
    assert_eq!(config.upstream_idle_timeout, Duration::from_millis(1500));
    assert!(!config.trust_forwarded_headers);
    // Outside a Kubernetes pod (as the tests run), Ctrl-C stops at once.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        assert_eq!(config.shutdown_delay, Duration::ZERO);
    }
    assert_eq!(config.clients, idem_proxy::ClientLimits::default());
    assert_eq!(config.clients.header_timeout, Duration::from_secs(75));
    assert_eq!(config.clients.body_timeout, Duration::from_secs(60));
    assert_eq!(config.clients.max_connections, 4096);
    assert_eq!(config.clients.max_concurrent_requests, 1024);
    assert!(!config.ready_checks_store);
    let route = &config.routes[0];
    assert_eq!(route.upstream_timeout, Duration::from_secs(60));
    assert_eq!(route.name, "POST /payments");
    assert_eq!(route.key, KeyRule::Required);
    assert_eq!(route.header, "idempotency-key");
    assert_eq!(route.lease, Duration::from_secs(60));
    assert_eq!(route.retention, Duration::from_secs(24 * 3600));
    assert_eq!(route.line, 7);
    assert!(matches!(&route.scope, Some(ScopeSource::Header(h)) if h == "x-account-id"));
}

#[test]
fn the_shipped_quick_start_file_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/quickstart.toml");
    let config = Config::load(path).unwrap();
    assert_eq!(config.upstream.to_string(), "http://127.0.0.1:8000/");
    assert!(config.migrate);
}

#[test]
fn mistakes_are_reported_at_their_line_with_what_to_write() {
    // A misspelt setting is refused, not ignored.
    let (line, _, message) = refused(&GOOD.replace("path = ", "pth = "));
    assert_eq!(line, 9, "{message}");
    assert!(message.contains("pth"), "{message}");

    let (line, column, message) = refused(&GOOD.replace(
        "path = \"/payments\"",
        "path = \"/payments\"\nlease = \"soon\"",
    ));
    assert_eq!((line, column), (10, 9), "{message}");
    assert!(message.contains("\"30s\""), "{message}");

    let (line, _, message) = refused(&GOOD.replace("\"POST\"", "\"PO ST\""));
    assert_eq!(line, 8, "{message}");
    assert!(message.contains("not an HTTP method"), "{message}");

    let (line, _, message) = refused(&GOOD.replace("/payments", "payments"));
    assert_eq!(line, 9, "{message}");
    assert!(message.contains("must start with `/`"), "{message}");

    let (_, _, message) = refused(&GOOD.replace("/payments", "/payments/{id"));
    assert!(message.contains("{name}"), "{message}");

    let (line, _, message) = refused(&GOOD.replace(
        "path = \"/payments\"",
        "path = \"/payments\"\nlease = \"2h\"\nretention = \"1h\"",
    ));
    assert_eq!(line, 11, "{message}");
    assert!(message.contains("longer than `lease`"), "{message}");

    let (line, _, message) = refused(&GOOD.replace("http://127.0.0.1:8000", "https://pay.example"));
    assert_eq!(line, 2, "{message}");
    assert!(message.contains("http://host:port"), "{message}");

    let (_, _, message) = refused("listen = \"127.0.0.1:8080\"\n");
    assert!(message.contains("`upstream` is missing"), "{message}");

    let (line, _, message) =
        refused(&GOOD.replace("upstream = ", "listen = \"localhost:80\"\nupstream = "));
    assert_eq!(line, 2, "{message}");
    assert!(message.contains("not an address and port"), "{message}");

    let (_, _, message) = refused(&format!(
        "{GOOD}status = {{ store = [409], release = [409] }}\n"
    ));
    assert!(message.contains("409"), "{message}");

    let (_, _, message) = refused(&format!("{GOOD}status = {{ hold = [700] }}\n"));
    assert!(message.contains("700 is not an HTTP status"), "{message}");

    let (_, _, message) = refused(&format!("{GOOD}max_request_body = 0\n"));
    assert!(message.contains("from 1 to"), "{message}");
    let (_, _, message) = refused(&format!("{GOOD}max_response_body = 2000000000\n"));
    assert!(message.contains("1 GiB"), "{message}");

    let (_, _, message) = refused(
        &GOOD
            .replace("unused", "")
            .replace("[defaults]", "unmatched = \"drop\"\n[defaults]"),
    );
    assert!(message.contains("\"reject\""), "{message}");

    // Not TOML at all: the parser's own message, at its place.
    let (line, _, _) = refused("upstream = \"http://127.0.0.1:8000\"\n[[routes]\n");
    assert_eq!(line, 2);
}

#[test]
fn a_protected_route_must_say_whose_key_it_is() {
    let no_scope = GOOD.replace("[defaults]\nscope = { header = \"x-account-id\" }\n", "");
    let (line, _, message) = refused(&no_scope);
    assert_eq!(line, 5, "the route's own line: {message}");
    assert!(message.contains("has no `scope`"), "{message}");
    // An exempt route needs none.
    let exempt = no_scope.replace(
        "path = \"/payments\"",
        "path = \"/payments\"\nkey = \"exempt\"",
    );
    assert_eq!(
        Config::parse("idem.toml", &exempt).unwrap().routes[0].key,
        KeyRule::Exempt
    );
}

#[test]
fn scopes_refuse_raw_tokens_and_unusable_keys() {
    let with_scope = |scope: &str| {
        GOOD.replace(
            "scope = { header = \"x-account-id\" }",
            &format!("scope = {scope}"),
        )
    };
    let (_, _, message) = refused(&with_scope("{ header = \"Authorization\" }"));
    assert!(message.contains("jwt_claim"), "{message}");

    let (_, _, message) = refused(&with_scope(
        "{ jwt_claim = \"sub\", secret_env = \"IDEM_PROXY_TEST_SECRET_THAT_IS_NOT_SET\" }",
    ));
    assert!(message.contains("not set"), "{message}");

    let (_, _, message) = refused(&with_scope("{ jwt_claim = \"sub\" }"));
    assert!(message.contains("secret_env"), "{message}");

    let (_, _, message) = refused(&with_scope(
        "{ jwt_claim = \"sub\", algorithm = \"RS256\", public_key_pem = \"/nonexistent/jwt.pem\" }",
    ));
    assert!(message.contains("cannot read"), "{message}");

    let (_, _, message) = refused(&with_scope("{ jwt_claim = \"sub\", algorithm = \"none\" }"));
    assert!(message.contains("HS256"), "{message}");

    let (_, _, message) = refused(&with_scope("{ header = \"x-a\", jwt_claim = \"sub\" }"));
    assert!(message.contains("exactly one"), "{message}");
}

#[test]
fn a_missing_file_says_which() {
    let err = Config::load("/nonexistent/idem.toml").unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("/nonexistent/idem.toml"), "{err}");
}

#[tokio::test]
async fn routes_that_cannot_be_told_apart_are_refused_at_their_line() {
    let text = format!("{GOOD}\n[[routes]]\nmethods = [\"POST\", \"PUT\"]\npath = \"/payments\"\n");
    let mut config = Config::parse("idem.toml", &text).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    let err = Proxy::bind(config, "idem.toml", Arc::new(MemoryStore::new()))
        .await
        .unwrap_err();
    let ProxyError::Route(RouteError::Config(ConfigError::Invalid { line, message, .. })) = &err
    else {
        panic!("expected a route conflict, got {err:?}");
    };
    assert_eq!(*line, 11, "{message}");
    assert!(message.contains("cannot be told apart"), "{message}");
}

#[test]
fn settings_that_cannot_work_together_are_refused() {
    let (_, _, message) = refused(&GOOD.replace(
        "upstream = \"http://127.0.0.1:8000\"",
        "upstream = \"http://127.0.0.1:8000\"\nconnect_timeout = \"5s\"\nupstream_timeout = \"5s\"",
    ));
    assert!(
        message.contains("longer than `connect_timeout`"),
        "{message}"
    );

    let (line, _, message) = refused(&format!("{GOOD}lease = \"10s\"\n"));
    assert_eq!(line, 10, "{message}");
    assert!(
        message.contains("shorter than `upstream_timeout`"),
        "{message}"
    );

    let (line, _, message) = refused(&GOOD.replace(
        "upstream = \"http://127.0.0.1:8000\"",
        "upstream = \"http://127.0.0.1:8000\"\nstore_connections = 0",
    ));
    assert_eq!(line, 3, "{message}");
    assert!(message.contains("1 to 1000"), "{message}");

    let (_, _, message) = refused(&format!("{GOOD}header = \"Authorization\"\n"));
    assert!(message.contains("credentials"), "{message}");

    let (_, _, message) = refused(&format!("{GOOD}store_headers = [\"set-cookie\"]\n"));
    assert!(message.contains("never stored"), "{message}");

    let (_, _, message) = refused(&format!("{GOOD}retention = \"200y\"\n"));
    assert!(message.contains("100 years"), "{message}");

    let (_, _, message) =
        refused(&GOOD.replace("http://127.0.0.1:8000", "http://user:pw@127.0.0.1:8000"));
    assert!(message.contains("no user name"), "{message}");

    let (_, _, message) = refused(&GOOD.replace("http://127.0.0.1:8000", "http://127.0.0.1:8080"));
    assert!(message.contains("own `listen`"), "{message}");

    let (_, _, message) = refused(&GOOD.replace(
        "scope = { header = \"x-account-id\" }",
        "scope = { jwt_claim = \"sub\", algorithm = \"ES256\", public_key_pem = \"x\", audience = [] }",
    ));
    // The key file is read first.
    assert!(message.contains("cannot read"), "{message}");
    let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys/es256-public.pem");
    let (_, _, message) = refused(&GOOD.replace(
        "scope = { header = \"x-account-id\" }",
        &format!("scope = {{ jwt_claim = \"sub\", algorithm = \"ES256\", public_key_pem = \"{keys}\", audience = [] }}"),
    ));
    assert!(message.contains("`audience`"), "{message}");
    let (_, _, message) = refused(&GOOD.replace(
        "scope = { header = \"x-account-id\" }",
        &format!(
            "scope = {{ jwt_claim = \"sub\", algorithm = \"RS256\", public_key_pem = \"{keys}\" }}"
        ),
    ));
    assert!(message.contains("not a RS256 public key"), "{message}");
    let (_, _, message) = refused(&GOOD.replace(
        "scope = { header = \"x-account-id\" }",
        "scope = { header = \"x-account-id\", issuer = \"https://id.example\" }",
    ));
    assert!(message.contains("takes no"), "{message}");
}

#[tokio::test]
async fn a_route_may_claim_the_trailing_slash_spelling_for_itself() {
    let text = format!(
        "{GOOD}\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments/\"\nkey = \"exempt\"\n"
    );
    let mut config = Config::parse("idem.toml", &text).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    Proxy::bind(config, "idem.toml", Arc::new(MemoryStore::new()))
        .await
        .expect("`/payments` and `/payments/` are two routes");
}

#[tokio::test]
async fn an_upstream_that_is_the_proxy_itself_is_refused_at_bind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    drop(taken);
    let text = GOOD.replace("http://127.0.0.1:8000", &format!("http://localhost:{port}"));
    let mut config = Config::parse("idem.toml", &text).unwrap();
    config.listen = format!("127.0.0.1:{port}").parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    let err = Proxy::bind(config, "idem.toml", Arc::new(MemoryStore::new()))
        .await
        .unwrap_err();
    assert!(matches!(err, ProxyError::Loop { .. }), "{err}");
}

#[test]
fn client_limits_and_route_timeouts_are_checked() {
    let with = |top: &str, route: &str| {
        format!(
            "upstream = \"http://127.0.0.1:8000\"\n{top}\n[defaults]\nscope = {{ header = \"x-account-id\" }}\n\n[[routes]]\npath = \"/payments\"\n{route}\n"
        )
    };
    let (line, _, message) = refused(&with("max_connections = 0", ""));
    assert_eq!(line, 2);
    assert!(
        message.contains("`max_connections` is a number from 1 to"),
        "{message}"
    );
    let (_, _, message) = refused(&with("max_concurrent_requests = -3", ""));
    assert!(message.contains("`max_concurrent_requests`"), "{message}");
    let (_, _, message) = refused(&with("client_header_timeout = \"10ms\"", ""));
    assert!(message.contains("under the least that works"), "{message}");
    let (_, _, message) = refused(&with("client_body_timeout = \"soon\"", ""));
    assert!(message.contains("`client_body_timeout`"), "{message}");
    // A route's own upstream timeout: after the connection's, and within its lease.
    let (line, _, message) = refused(&with("", "upstream_timeout = \"1s\""));
    assert_eq!(line, 8);
    assert!(message.contains("`upstream_timeout`"), "{message}");
    let (_, _, message) = refused(&with("", "upstream_timeout = \"5m\"\nlease = \"1m\""));
    assert!(
        message.contains("shorter than `upstream_timeout`"),
        "{message}"
    );
    let config = Config::parse("idem.toml", &with("", "upstream_timeout = \"5m\"")).unwrap();
    assert_eq!(config.routes[0].upstream_timeout, Duration::from_secs(300));
    assert_eq!(
        config.routes[0].lease,
        Duration::from_secs(300),
        "the lease follows"
    );
    assert_eq!(
        config.upstream_timeout,
        Duration::from_secs(60),
        "others keep theirs"
    );
    let (line, _, message) = refused(&with("", "key_budget = { keys = 0, per = \"1m\" }"));
    assert_eq!(line, 8);
    assert!(message.contains("`key_budget.keys`"), "{message}");
    let (_, _, message) = refused(&with("", "key_budget = { keys = 5, per = \"10ms\" }"));
    assert!(message.contains("`key_budget.per`"), "{message}");
    let config = Config::parse(
        "idem.toml",
        &with("", "key_budget = { keys = 5, per = \"1m\" }"),
    )
    .unwrap();
    assert_eq!(
        config.routes[0].key_budget.map(|b| (b.keys, b.per)),
        Some((5, Duration::from_secs(60)))
    );
    // An exempt route claims nothing: a long poll's timeout needs no lease.
    let config = Config::parse(
        "idem.toml",
        &with("", "key = \"exempt\"\nupstream_timeout = \"25h\""),
    )
    .unwrap();
    assert_eq!(
        config.routes[0].upstream_timeout,
        Duration::from_secs(25 * 3600)
    );
}

#[test]
fn debug_hides_the_stores_password() {
    let text = format!("store = \"postgres://app:hunter2@127.0.0.1/idem\"\n{GOOD}");
    let config = Config::parse("idem.toml", &text).unwrap();
    let shown = format!("{config:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(
        shown.contains("postgres://app:***@127.0.0.1/idem"),
        "{shown}"
    );
}

#[tokio::test]
async fn limits_set_in_code_are_checked_at_bind() {
    let bind = |change: fn(&mut Config)| async move {
        let mut config = Config::parse("idem.toml", GOOD).unwrap();
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.admin_listen = "127.0.0.1:0".parse().unwrap();
        change(&mut config);
        Proxy::bind(config, "idem.toml", Arc::new(MemoryStore::new())).await
    };
    let err = bind(|c| c.clients.max_connections = 0).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProxyError::Limit {
                setting: "max_connections",
                ..
            }
        ),
        "{err}"
    );
    let err = bind(|c| c.clients.max_concurrent_requests = usize::MAX)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_concurrent_requests"), "{err}");
    let err = bind(|c| c.clients.header_timeout = Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("client_header_timeout"), "{err}");
    let err = bind(|c| c.routes[0].upstream_timeout = Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("upstream_timeout"), "{err}");
    assert!(bind(|_| {}).await.is_ok());
}
