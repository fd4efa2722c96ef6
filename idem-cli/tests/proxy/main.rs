//! `idem proxy` for real, on 127.0.0.1: a Python (Flask) payments service that counts its
//! executions in a database, two proxy replicas sharing one PostgreSQL table, and clients
//! that retry through a fault proxy dropping answers, with concurrent duplicates on both
//! replicas. Each logical payment runs once upstream, and every client gets the first
//! response.
//!
//! - `support.rs`: child processes, free ports, waiting for an answer, one replica.
//! - `faults.rs`: TCP proxies that drop answers or cut connections.
//! - `replicas.rs`: two replicas on PostgreSQL, each payment run once.
//! - `lifecycle.rs`: signals, a configuration mistake, `--check`.
//! - `reload.rs`: SIGHUP reloads the routes while serving.

mod faults;
mod lifecycle;
mod reload;
mod replicas;
mod support;
