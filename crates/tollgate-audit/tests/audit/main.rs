//! The tollgate-audit integration tests: real files in temporary directories.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod agreement;
mod common;
mod crash;
mod export;
mod heal;
mod known_answer;
mod props;
mod raw;
mod rotation;
mod tail;
mod tamper;
mod tap;
mod writer;
