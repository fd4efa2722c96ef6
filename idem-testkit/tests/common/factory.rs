//! How a suite makes flawed stores: the record limit they may declare, whether they read
//! the suite's manual clock, and one shared backend per factory.

use std::sync::Arc;

use idem_core::Clock;
use idem_testkit::Namespace;

use super::flaw::Flaw;
use super::flawed_store::{Backend, FlawedStore};

/// The record limit of the stores that declare one here: small, so the cases stay quick.
pub(crate) const LIMIT: usize = 64 * 1024;

/// How a suite's stores are made, besides their flaw.
#[derive(Clone, Copy, Default)]
pub(crate) struct Setup {
    /// The record limit the stores declare.
    pub(crate) limit: Option<usize>,
    /// Whether they read the suite's manual clock rather than the system's.
    pub(crate) manual_clock: bool,
}

/// A factory of stores with `flaw` on one shared backend, reading the clock they are given.
pub(crate) fn factory(
    flaw: Option<Flaw>,
    setup: Setup,
) -> impl Fn(Arc<dyn Clock>, Namespace) -> std::future::Ready<FlawedStore> + Send + Sync + 'static {
    let backend = Backend::default();
    move |clock, namespace| {
        std::future::ready(FlawedStore {
            backend: Arc::clone(&backend),
            namespace: namespace.into(),
            flaw,
            limit: setup.limit,
            clock,
        })
    }
}
