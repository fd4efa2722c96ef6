//! Addresses of test services, read from the environment at run time.

/// The value of `variable` (such as `IDEM_TEST_POSTGRES_URL`), or `None` to skip.
///
/// - Set: returns it.
/// - Unset, and `IDEM_REQUIRE_SERVICES=1`: panics, so CI never skips a backend silently.
/// - Unset otherwise: prints a loud notice to stderr and returns `None`; the caller returns
///   early.
///
/// ```no_run
/// // In a test:
/// let Some(url) = idem_testkit::service_url("IDEM_TEST_EXAMPLE_URL") else { return };
/// # let _ = url;
/// ```
pub fn service_url(variable: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ if std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1") => panic!(
            "{variable} is not set and IDEM_REQUIRE_SERVICES=1: start the services with \
             `scripts/services.sh start` and export the variables it prints"
        ),
        _ => {
            eprintln!(
                "\n!!! SKIPPED: {variable} is not set, so this server-backed test did not run.\n\
                 !!! Start the services with `scripts/services.sh start` and export what it prints.\n"
            );
            None
        }
    }
}
