//! tollgate-policy's integration tests: one binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
mod compose;
mod differential;
mod docs;
mod load;
mod outcomes;
mod properties;
mod shadow;
