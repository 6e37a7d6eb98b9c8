//! The core's integration tests: one binary, one module per feature.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_debug_implementations
)]

mod alloc;
mod architecture;
mod conformance;
mod flows;
mod history;
mod opaque;
mod parallel;
mod properties;
mod robustness;
mod support;
