//! The shared setting of every fuzz target in the workspace's crates.

/// A proptest configuration whose case count comes from `IDEM_FUZZ_CASES` (default
/// 2 000, what every test run does; RELIABILITY.md's dedicated run sets 1 000 000), with
/// shrinking bounded so a failure in a long run reports in reasonable time.
///
/// Use it as `#![proptest_config(idem_testkit::fuzz_config())]` inside `proptest!`, or
/// with a runner:
///
/// ```
/// use proptest::prelude::*;
/// use proptest::test_runner::TestRunner;
///
/// let mut runner = TestRunner::new(idem_testkit::fuzz_config());
/// runner
///     .run(&any::<Vec<u8>>(), |bytes| {
///         let _ = std::str::from_utf8(&bytes);
///         Ok(())
///     })
///     .unwrap();
/// ```
pub fn fuzz_config() -> proptest::test_runner::Config {
    let cases = std::env::var("IDEM_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    proptest::test_runner::Config {
        cases,
        max_shrink_iters: 1_000,
        ..proptest::test_runner::Config::default()
    }
}
