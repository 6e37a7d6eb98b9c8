//! The store's integration tests, one binary: `basics` (the trait contract on both
//! stores), `persist` (restart, close, corrupt files), `shared` (shared budgets and
//! concurrent spending through `decide`), `crash` (a real kill -9 mid-stream).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod basics;
mod crash;
mod persist;
mod shared;
mod support;
