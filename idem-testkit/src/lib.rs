//! # idem-testkit
//!
//! The conformance suite every [`idem_core::Store`] runs: ours and yours. One line in a test
//! file gives one named test per behaviour of the contract (docs/DESIGN.md §2), so a
//! failure names the broken behaviour. A model-based test then drives random operation
//! sequences and compares every answer with the pure state machine
//! ([`idem_core::machine`]).
//!
//! ```
//! // tests/conformance.rs of a store crate:
//! use idem_core::MemoryStore;
//! use idem_testkit::Namespace;
//!
//! idem_testkit::conformance_tests!(|_namespace: Namespace| async { MemoryStore::new() });
//! # fn main() {}
//! ```
//!
//! The factory is called once per test (and once per generated sequence) with a
//! [`Namespace`] the suite chose, and must return a store that keeps its records under it
//! (a table, a key prefix: use the name verbatim) and sees nothing outside it. One case
//! hands two stores names that are prefixes of each other and checks that nothing
//! crosses between them. Tests build their own multi-threaded Tokio runtime, so the
//! factory may connect to a server.
//!
//! Stores that keep time in the process (memory, SQLite) can take a clock from the suite,
//! which then also checks what happens as time passes (the model-based case moves it by
//! random steps); what a store declares about itself ([`Store::expiry`](idem_core::Store::expiry),
//! [`Store::max_record_bytes`](idem_core::Store::max_record_bytes)) the suite reads from
//! the store, and [`Capabilities`] says the rest:
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_testkit::Capabilities;
//!
//! mod with_clock {
//!     use super::*;
//!     // Each generated test gets a clock of its own, handed to the factory.
//!     idem_testkit::conformance_tests!(
//!         manual_clock: |clock, _namespace| async move { MemoryStore::with_clock(clock) },
//!         Capabilities::default().with_max_response_bytes(2 * 1024 * 1024),
//!     );
//! }
//! # fn main() {}
//! ```
//!
//! For a custom harness, [`Suite::run`] runs one [`Case`] and [`Suite::run_all`] runs every
//! case and reports which failed and why, whole, without panic noise. [`execute_races`] races many `execute` calls per key for
//! a store's own tests, with a side effect the store's database can count.
//!
//! [`linearizability`] checks whole concurrent histories: many clients call one store (or
//! several on one database) at once, and every answer must be explained by the state
//! machine applied one call at a time in an order that respects real time.
//!
//! Server-backed suites read their address from the environment with [`service_url`], which
//! skips loudly when it is unset and fails instead when `IDEM_REQUIRE_SERVICES=1`.
//!
//! ## Where things live
//!
//! - `cases/`: the conformance cases, one function per behaviour, a file per table or
//!   theme (`claim.rs` the claim table, `fencing.rs` the fenced writes, `edges.rs`,
//!   `retention.rs`, `payloads.rs`, `concurrency.rs`, `namespaces.rs`, `admin.rs`, and the
//!   driver-level `driver.rs`, `saga.rs`, `security.rs`).
//! - `suite.rs`: [`Suite`], [`Case`], the macros' engine; `admin_suite.rs` the admin side.
//! - `capabilities.rs`: [`Capabilities`], what differs between stores.
//! - `model.rs`: the model-based run against `idem_core::machine`.
//! - [`explore`]: the fault-point explorer. `faults.rs` names the faults, with
//!   `faults/world.rs` (what one run shares) and `faults/process_store.rs` (the store
//!   handle that injects them); `scenarios.rs` names the scenarios, with
//!   `scenarios/work.rs` (the work each runs) and `scenarios/probe.rs` (what the work
//!   records with); `check.rs` runs the checks after a run, reading the ledger through
//!   `check/lifetimes.rs` and `check/leases.rs`, with a file per kind of check in
//!   `check/` (`grants`, `effects`, `results`, `compensation`).
//! - [`linearizability`]: the workload that records concurrent histories and the checker
//!   that explains them (`workload.rs`, `history.rs`, `checker.rs`: the search, with
//!   `checker/nodes.rs`, `checker/moves.rs` and `checker/answers.rs`).
//! - `races.rs`: [`execute_races`]; `services.rs`: [`service_url`]; `foreign.rs`: records
//!   idem did not write, and records at the last token; `fuzz.rs`, `namespace.rs`, `quiet.rs`, `support.rs`: helpers.

#![warn(missing_docs)]

mod admin_suite;
mod capabilities;
mod cases;
pub mod explore;
mod foreign;
mod fuzz;
pub mod linearizability;
mod model;
mod namespace;
mod quiet;
mod races;
mod services;
mod suite;
mod support;

pub use admin_suite::{AdminCase, AdminSuite};
pub use capabilities::Capabilities;
pub use foreign::{
    LastTokenRecords, assert_foreign_record_is_refused, assert_the_last_token_is_never_passed,
};
pub use fuzz::fuzz_config;
pub use namespace::Namespace;
pub use races::execute_races;
pub use services::service_url;
pub use suite::{Case, CaseName, CaseResult, Report, Suite};

/// Generates one `#[test]` per conformance [`Case`], each on a fresh store from `factory`.
///
/// `factory` is an expression for a closure `|namespace| async { ... }` returning any
/// [`idem_core::Store`] that keeps its records under that [`Namespace`]; an optional
/// second argument gives the store's [`Capabilities`]. With `manual_clock:` before it, the
/// closure takes a [`idem_core::ManualClock`] that the store must read, then the namespace
/// (see [`Suite::with_manual_clock`]). With `service: "VARIABLE",` before it, the closure
/// takes the value of that environment variable (a server's address), then the
/// namespace, and the tests skip loudly when it is unset, or fail when
/// `IDEM_REQUIRE_SERVICES=1` (see [`Suite::for_service`]). Put each suite in its own
/// module when a file holds more than one.
#[macro_export]
macro_rules! conformance_tests {
    (service: $variable:literal, $factory:expr $(,)?) => {
        $crate::conformance_tests!(service: $variable, $factory, $crate::Capabilities::default());
    };
    (service: $variable:literal, $factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_cases!(tests ($crate::Suite::for_service($variable, $factory), $capabilities));
    };
    (manual_clock: $factory:expr $(,)?) => {
        $crate::conformance_tests!(manual_clock: $factory, $crate::Capabilities::default());
    };
    (manual_clock: $factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_cases!(tests (Some($crate::Suite::with_manual_clock($factory)), $capabilities));
    };
    ($factory:expr $(,)?) => {
        $crate::conformance_tests!($factory, $crate::Capabilities::default());
    };
    ($factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_cases!(tests (Some($crate::Suite::new($factory)), $capabilities));
    };
}

/// The single list of cases: the `Case` enum and the generated tests both come from it.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($mode:ident $args:tt) => {
        $crate::__cases! { $mode $args
            absent_key_is_claimed_fresh => AbsentKeyIsClaimedFresh:
                "Claiming a key with no record creates a fresh in-progress record with token 1.";
            absent_record_is_claimed_fresh => AbsentRecordIsClaimedFresh:
                "Claiming an absent record (expired, no live lease) is a fresh claim: token + 1, steps and response cleared, any fingerprint.";
            a_live_lease_is_never_absent => ALiveLeaseIsNeverAbsent:
                "A record whose retention ended but whose lease lives is in flight, not claimed afresh; its owner still writes.";
            a_release_after_the_retention_keeps_its_steps => AReleaseAfterTheRetentionKeepsItsSteps:
                "A release of a record with steps after its retention ended (a live lease held it) keeps the record at least one retention past the lease's end; repeated, it moves nothing; the next claim takes over with the steps.";
            a_release_after_its_lease_ended_keeps_its_end => AReleaseAfterItsLeaseEndedKeepsItsEnd:
                "A release after the lease ran out (nobody took over) keeps the lease's end: lease_until = min(lease_until, now).";
            no_lease_ends_at_the_retention_cliff => NoLeaseEndsAtTheRetentionCliff:
                "Checkpoints, takeovers and renewals keep the record one retention past the lease's end (the lease carries the claim's retention): with lease and retention equal, a retry after the lease ran out takes over with the steps.";
            an_ended_lease_is_not_renewed => AnEndedLeaseIsNotRenewed:
                "A renewal of a lease that was released or ran out is Fenced and changes nothing, even before another attempt took over; the owner's late result still lands.";
            a_late_claim_of_the_same_attempt_takes_nothing_over => ALateClaimOfTheSameAttemptTakesNothingOver:
                "A claim by the attempt whose lease ended (released or run out) answers InFlight with zero and writes nothing; another attempt takes over.";
            late_results_stay_replayable => LateResultsStayReplayable:
                "A result or failure stored after the record's retention ended (a live lease held it) is replayed and shown by get for one whole retention after it is stored.";
            different_fingerprint_is_a_mismatch => DifferentFingerprintIsAMismatch:
                "Any present record answers Mismatch to another fingerprint and stays unchanged.";
            completed_record_replays => CompletedRecordReplays:
                "A completed record replays its response and writes nothing.";
            failed_record_replays_failure => FailedRecordReplaysFailure:
                "A failed record replays its failure and writes nothing.";
            live_lease_is_in_flight => LiveLeaseIsInFlight:
                "A live lease answers InFlight with the time left, and writes nothing.";
            same_attempt_gets_its_lease_back => SameAttemptGetsItsLeaseBack:
                "A claim retried with the same attempt id gets the same lease back.";
            expired_lease_is_taken_over => ExpiredLeaseIsTakenOver:
                "An expired lease is taken over: token + 1, steps kept, resumed.";
            lease_and_expiry_end_exactly => LeaseAndExpiryEndExactly:
                "A lease is over, and a record expired, at the very millisecond they end (to the millisecond on a manual clock; on a server's, short leases, renewals and retentions live at once and over once waited out).";
            tokens_strictly_increase => TokensStrictlyIncrease:
                "Tokens strictly increase across takeovers, releases and re-claims within a record's lifetime.";
            lifetimes_are_told_apart => LifetimesAreToldApart:
                "A key claimed again after its record was deleted starts a new lifetime: a later creation time, and other derived keys.";
            a_checkpoint_keeps_the_record_past_its_own_lease_end => ACheckpointKeepsTheRecordPastItsOwnLeaseEnd:
                "A checkpoint keeps the record one retention past the record's own lease end, also through an older copy of the lease (the same attempt and token, after a purge); the step survives a release.";
            complete_stores_the_response => CompleteStoresTheResponse:
                "complete stores the response, keeps fingerprint, token, steps and creation time, and keeps the expiry or moves it later.";
            fail_stores_the_failure => FailStoresTheFailure:
                "fail stores the failure as a permanent result.";
            release_lets_the_next_claim_take_over => ReleaseLetsTheNextClaimTakeOver:
                "release of a record with steps ends the lease now, keeping token and steps.";
            release_without_steps_forgets_the_key => ReleaseWithoutStepsForgetsTheKey:
                "release of a record with no step ends its lifetime: absent at once, and the next claim is fresh under any fingerprint.";
            renew_extends_the_lease => RenewExtendsTheLease:
                "renew sets the lease end to now + extend.";
            checkpoint_records_steps => CheckpointRecordsSteps:
                "checkpoint sets one named step, replacing its earlier value; empty and binary values and non-ASCII names read back exactly, from get and from a retried claim of the same attempt.";
            stale_owner_is_fenced_after_takeover => StaleOwnerIsFencedAfterTakeover:
                "After a takeover, the stale owner's five writes are all fenced and the new result survives.";
            writes_after_the_end_are_fenced => WritesAfterTheEndAreFenced:
                "Writes to a finished, missing or absent record, or with another attempt id, are fenced.";
            retried_terminal_writes_are_applied => RetriedTerminalWritesAreApplied:
                "complete or fail retried after landing is Applied; switching terminal state is fenced.";
            retried_terminal_writes_keep_the_first_bytes => RetriedTerminalWritesKeepTheFirstBytes:
                "complete or fail retried by the same lease with other bytes is Applied and writes nothing: the first bytes stay and replay.";
            fingerprint_survives_completion => FingerprintSurvivesCompletion:
                "After completion an identical retry replays and a changed one is a mismatch.";
            scopes_are_isolated => ScopesAreIsolated:
                "The same key in two scopes, and scope/key splits of the same text, are separate records.";
            namespaces_are_isolated => NamespacesAreIsolated:
                "Two stores whose namespaces are prefixes of each other never share a record, a replay or a purge.";
            replays_are_byte_exact => ReplaysAreByteExact:
                "Empty, binary (all 256 byte values) and non-UTF-8 responses replay byte for byte.";
            large_responses_replay_or_are_refused => LargeResponsesReplayOrAreRefused:
                "A response of the largest size replays exactly; a result or failure one byte over a store's own limit is refused and writes nothing.";
            steps_count_toward_the_record_limit => StepsCountTowardTheRecordLimit:
                "With a record limit: a checkpoint that does not fit is TooLarge naming the step, a result or failure that fits alone but not beside the steps is TooLarge naming it; nothing is written and a smaller result completes. Without a declared limit, 1 MiB checkpoints and a 1 MiB result beside them all land.";
            keys_at_the_limits => KeysAtTheLimits:
                "Keys of exactly 255 bytes, non-ASCII keys and keys with quotes work.";
            extreme_durations_work => ExtremeDurationsWork:
                "Leases, retentions and renewals of zero, one millisecond, MAX_DURATION and Duration::MAX all work.";
            get_hides_absent_records => GetHidesAbsentRecords:
                "get answers None for missing and absent records, and shows expired ones a live lease holds.";
            purge_removes_only_absent_records => PurgeRemovesOnlyAbsentRecords:
                "purge_expired removes absent records only, within its limit, never one with a live lease.";
            concurrent_claims_have_one_winner => ConcurrentClaimsHaveOneWinner:
                "Concurrent claims of a fresh key: exactly one Claimed, the rest InFlight.";
            concurrent_takeovers_have_one_winner => ConcurrentTakeoversHaveOneWinner:
                "Concurrent takeovers of an expired lease: exactly one wins, with the next token.";
            stale_completes_race_takeovers => StaleCompletesRaceTakeovers:
                "A stale owner's complete racing a takeover and the new owner's complete, 32 keys at a time: Applied only before the takeover (which replays it), else Fenced; one result is stored, the Applied owner's.";
            steps_run_once_across_takeovers => StepsRunOnceAcrossTakeovers:
                "Driver: a two-step payment resumes after a takeover; each step's closure runs once, then every retry replays.";
            a_stale_owner_cannot_store_its_result => AStaleOwnerCannotStoreItsResult:
                "Driver: an owner whose lease was taken over gets LeaseLost and the new owner's result stands.";
            waiting_duplicates_share_one_execution => WaitingDuplicatesShareOneExecution:
                "Driver: 32 concurrent executes with InFlightPolicy::Wait run the work once; 31 get replays.";
            encrypted_values_are_not_plaintext_at_rest => EncryptedValuesAreNotPlaintextAtRest:
                "Driver with AES-256-GCM: results, failures and checkpoints are ciphertext at rest; rotation keeps old records readable; a retired key is a typed error, never a rerun.";
            encrypted_records_refuse_copies_and_tampering => EncryptedRecordsRefuseCopiesAndTampering:
                "Driver with AES-256-GCM: a ciphertext copied from another record, flipped, or moved from failure to result, and a tampered checkpoint, are typed errors; nothing runs again.";
            key_policies_and_budgets_refuse_before_storing => KeyPoliciesAndBudgetsRefuseBeforeStoring:
                "Driver: a key the policy refuses and a new key over the scope's budget store nothing; replays go on once the budget is spent.";
            provider_keys_survive_takeovers => ProviderKeysSurviveTakeovers:
                "Driver: Stripe, Adyen and PayPal identifiers are the same for a takeover and differ per key.";
            a_failed_saga_is_undone_in_reverse_once => AFailedSagaIsUndoneInReverseOnce:
                "Driver: step 3 fails after steps 1 and 2 registered undos: both undone in reverse, once each; retries replay.";
            a_takeover_finishes_a_crashed_compensation => ATakeoverFinishesACrashedCompensation:
                "Driver: a crash mid-compensation; the takeover finishes it without repeating a step or an undo.";
            a_failing_undo_is_stored_for_the_operator => AFailingUndoIsStoredForTheOperator:
                "Driver: an undo that fails permanently stops the compensation, and the stored failure names it.";
            matches_the_state_machine => MatchesTheStateMachine:
                "Random operation sequences, with time passing where the clock allows: every answer equals the pure state machine's.";
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __cases {
    (enum () $($name:ident => $variant:ident : $doc:literal;)*) => {
        /// One behaviour of the store contract; each is a named test.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[non_exhaustive]
        pub enum Case {
            $(#[doc = $doc] $variant,)*
        }

        impl Case {
            /// Every case, in the order the suite runs them.
            pub const ALL: &'static [Case] = &[$(Case::$variant,)*];

            /// The case's name, which is also its generated test's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Case::$variant => stringify!($name),)*
                }
            }

            /// What the case checks.
            pub const fn description(self) -> &'static str {
                match self {
                    $(Case::$variant => $doc,)*
                }
            }
        }
    };
    (tests ($suite:expr, $capabilities:expr) $($name:ident => $variant:ident : $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[test]
            fn $name() {
                let suite: ::core::option::Option<$crate::Suite> = $suite;
                if let ::core::option::Option::Some(suite) = suite {
                    suite
                        .with_capabilities($capabilities)
                        .run_blocking($crate::Case::$variant);
                }
            }
        )*
    };
}

/// Generates one `#[test]` per [`AdminCase`], the operator's side of a store
/// ([`idem_core::Admin`]), each on fresh stores from `factory`. The same forms as
/// [`conformance_tests!`]: a plain factory, `manual_clock:` or `service: "VARIABLE",`.
///
/// ```
/// use idem_core::MemoryStore;
///
/// mod admin {
///     idem_testkit::admin_conformance_tests!(|_namespace| async { idem_core::MemoryStore::new() });
/// }
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! admin_conformance_tests {
    (service: $variable:literal, $factory:expr $(,)?) => {
        $crate::admin_conformance_tests!(service: $variable, $factory, $crate::Capabilities::default());
    };
    (service: $variable:literal, $factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_admin_cases!(tests ($crate::AdminSuite::for_service($variable, $factory), $capabilities));
    };
    (manual_clock: $factory:expr $(,)?) => {
        $crate::admin_conformance_tests!(manual_clock: $factory, $crate::Capabilities::default());
    };
    (manual_clock: $factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_admin_cases!(tests (Some($crate::AdminSuite::with_manual_clock($factory)), $capabilities));
    };
    ($factory:expr $(,)?) => {
        $crate::admin_conformance_tests!($factory, $crate::Capabilities::default());
    };
    ($factory:expr, $capabilities:expr $(,)?) => {
        $crate::__with_admin_cases!(tests (Some($crate::AdminSuite::new($factory)), $capabilities));
    };
}

/// The single list of admin cases: the `AdminCase` enum and the generated tests.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_admin_cases {
    ($mode:ident $args:tt) => {
        $crate::__admin_cases! { $mode $args
            list_filters_and_orders => ListFiltersAndOrders:
                "list filters by state, stuck work and scope prefix, oldest first.";
            list_pages_through_every_record_once => ListPagesThroughEveryRecordOnce:
                "Walking list's cursors visits every record exactly once, in order, with records added meanwhile.";
            list_leaves_responses_out_unless_asked => ListLeavesResponsesOutUnlessAsked:
                "list leaves response bytes out (keeping their length) unless asked for them.";
            stats_count_what_the_store_holds => StatsCountWhatTheStoreHolds:
                "stats counts states, live and ended leases, absent records, the oldest in-progress record and the largest scopes.";
            release_key_fences_the_owner => ReleaseKeyFencesTheOwner:
                "An operator's release takes an in-progress key over: the owner is fenced, the next claim resumes; finished or missing records are refused.";
            release_key_races_the_owners_complete => ReleaseKeyRacesTheOwnersComplete:
                "An operator's release racing the owner's complete: exactly one wins, and exactly one result is ever stored.";
            delete_removes_one_record => DeleteRemovesOneRecord:
                "delete removes one record in any state; its owner is fenced and the key starts a new lifetime.";
            raw_shows_what_is_stored => RawShowsWhatIsStored:
                "raw shows a stored record field by field, the response only as its length, and nothing for a missing key.";
            admin_reaches_only_its_namespace => AdminReachesOnlyItsNamespace:
                "list, stats, release and delete never reach a namespace that is a prefix of the store's, or has it as a prefix.";
            matches_the_state_machine_with_admin => MatchesTheStateMachineWithAdmin:
                "Random sequences with operator releases and deletions interleaved: every answer equals the state machine's.";
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __admin_cases {
    (enum () $($name:ident => $variant:ident : $doc:literal;)*) => {
        /// One behaviour of the admin contract ([`idem_core::Admin`]); each is a named test.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        #[non_exhaustive]
        pub enum AdminCase {
            $(#[doc = $doc] $variant,)*
        }

        impl AdminCase {
            /// Every admin case, in the order the suite runs them.
            pub const ALL: &'static [AdminCase] = &[$(AdminCase::$variant,)*];

            /// The case's name, which is also its generated test's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(AdminCase::$variant => stringify!($name),)*
                }
            }

            /// What the case checks.
            pub const fn description(self) -> &'static str {
                match self {
                    $(AdminCase::$variant => $doc,)*
                }
            }
        }
    };
    (tests ($suite:expr, $capabilities:expr) $($name:ident => $variant:ident : $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[test]
            fn $name() {
                let suite: ::core::option::Option<$crate::AdminSuite> = $suite;
                if let ::core::option::Option::Some(suite) = suite {
                    suite
                        .with_capabilities($capabilities)
                        .run_blocking($crate::AdminCase::$variant);
                }
            }
        )*
    };
}
