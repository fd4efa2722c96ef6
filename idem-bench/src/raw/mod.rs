//! The raw baselines: per backend, the least a hand-written "insert if absent, then store
//! the result" costs with the same client. A fresh key takes two round trips (claim, then
//! complete); a key already completed takes one (the claim attempt returns the stored row).

pub(crate) mod dynamodb;
pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sqlite;
