//! Stores broken on purpose: the state machine over a shared backend with one flaw, for
//! the tests that prove the suite, the explorer and the linearizability checker catch
//! each flaw.
//!
//! `flaw` names the flaws, `flawed_store` holds the store and its rules, `store` and
//! `admin` its calls, and `factory` how a suite makes them.

#![allow(dead_code)] // each test binary uses the flaws it needs

mod admin;
mod factory;
mod flaw;
mod flawed_store;
mod store;

#[allow(unused_imports)] // each test binary uses the helpers it needs
pub(crate) use factory::{LIMIT, Setup, factory};
pub(crate) use flaw::Flaw;
