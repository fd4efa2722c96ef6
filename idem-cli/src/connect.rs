//! Opening and migrating the store a [`Location`] names: the backend does the work, this
//! says it in the command's terms (exit codes, advice).

use std::sync::Arc;

use idem_core::Admin;
use idem_core::connect::{Create, Location};

use crate::failure::Failure;

/// An open store, with the admin side every backend has.
pub(crate) type OpenStore = Arc<dyn Admin>;

/// Opens the store `target` names, creating nothing (a mistyped SQLite path must not
/// become an empty database that reports zero records: `idem migrate` creates).
pub(crate) async fn open(target: &dyn Location) -> Result<OpenStore, Failure> {
    target.open(Create::No).await.map_err(Failure::open(target))
}

/// Creates or upgrades what the store needs, and says what it did.
pub(crate) async fn migrate(target: &dyn Location) -> Result<String, Failure> {
    target.migrate().await.map_err(Failure::open(target))
}
