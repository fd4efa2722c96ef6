//! # idem-chaos
//!
//! Runs idem's driver against real servers while the network and the servers misbehave,
//! and checks the promise: every key ends with exactly one stored result, no result a
//! client saw ever changes, and any key whose work ran twice did so only because a lease
//! was really lost. See RELIABILITY.md for the figures and the commands.
//!
//! - [`proxy`]: a TCP proxy on 127.0.0.1 that delays, refuses, blackholes and cuts.
//! - [`ledger`]: what each execution did, kept outside the store under test.
//! - [`run`]: the workers, the faults, the server crashes, and the checks.
//! - [`linearizable`]: `idem-chaos linearizable`, idem-testkit's linearizability checker
//!   through the proxy while the server crashes.
//! - [`explore`]: `idem-chaos explore`, idem-testkit's systematic fault explorer on every
//!   backend.
//! - [`backends`]: the durable servers a run targets, stores over them, and their crashes.

pub mod backends;
pub mod explore;
pub mod ledger;
pub mod linearizable;
pub mod proxy;
pub mod run;
