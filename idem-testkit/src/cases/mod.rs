//! The conformance cases, one function per behaviour.

pub(crate) mod admin;
pub(crate) mod claim;
pub(crate) mod concurrency;
pub(crate) mod driver;
pub(crate) mod edges;
pub(crate) mod fencing;
pub(crate) mod long_work;
pub(crate) mod namespaces;
pub(crate) mod payloads;
pub(crate) mod retention;
pub(crate) mod saga;
pub(crate) mod security;
