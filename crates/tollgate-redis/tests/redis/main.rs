//! tollgate-redis against a real Redis at 127.0.0.1:6379 (unique key prefix per test),
//! and the CAS protocol's model against the in-memory fake.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod basics;
mod faults;
mod fleet;
mod model;
mod script;
mod support;
