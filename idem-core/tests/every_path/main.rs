//! The guarantee on paths the happy cases never walk: a caller that goes away after the
//! work returned, a takeover whose answer was lost, a release into a hung store, a store
//! that holds less than it said, a compensation taken over, an undo interrupted, a
//! failure that cannot be stored beside its undos, and settings at their extremes.

mod compensation;
mod store_faults;
mod support;
mod unstorable;
