//! The layer under real traffic, on a real server on 127.0.0.1: a store that holds less
//! than the layer's default, the 409's hint, headers replayed, axum's fallbacks, the
//! inner service's backpressure, handlers whose client went away, panics, and the
//! settings that adjust answers.

// The shared helpers of every test binary, one directory up.
#[path = "../common/mod.rs"]
mod common;

mod answers;
mod inner_service;
mod records;
mod streams;
mod support;
