//! # tollgate-core: the SP/1.0 decision core
//!
//! `decide(config, state, call, now, rng)` answers one question: may this agent run this
//! tool with these parameters now? It returns ALLOW, DENY or HITL with a stable reason.
//!
//! What this crate does **not** do: no I/O, no clock, no randomness of its own, no async,
//! no threads. Time arrives as `now`, a random draw as `rng`, and state as an argument;
//! the caller (the daemon, or the in-process guard) owns all three, persists state, and
//! writes the audit log. `decide` has no error path: every input gets a verdict.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod digest;
pub mod json;

pub use digest::Digest;
pub mod types;

pub use types::{Decision, DenyReason, Money, Reason, Verdict};
