//! # tollgate-core: the SP/1.0 decision core
//!
//! `decide(config, state, call, now, rng)` answers one question: may this agent run this
//! tool with these parameters now? It returns ALLOW, DENY or HITL with a stable reason.
//!
//! What this crate does **not** do: no I/O, no clock, no randomness of its own, no async,
//! no threads. Time arrives as `now`, a random draw as `rng`, and state as an argument;
//! the caller (the daemon, or the in-process guard) owns all three, persists state, and
//! writes the audit log. `decide` has no error path: every input gets a verdict.
//!
//! The pieces:
//! - [`json`]: a strict, bounded JSON parser and the canonical writer (Python's
//!   `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`, byte for byte);
//! - [`call`]: a proposed call, with its params classified once ([`Params`]);
//! - [`config`], [`state`]: the policy and the session state `decide` reads;
//! - [`labels`]: flow labels, the bounded set a session's policies attach;
//! - [`decide()`]: the ordered rules;
//! - [`transition`]: the pure state transitions applied after each verdict;
//! - [`vectors`]: the published conformance vector format and its runner.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod call;
pub mod config;
mod decide;
pub mod digest;
pub mod id;
pub mod json;
pub mod labels;
pub mod signals;
pub mod state;
pub mod state_codec;
pub mod transition;
pub mod types;
pub mod vectors;

pub use call::{NonCanonical, Params, ToolCall};
pub use config::{
    BudgetScope, ConfigJsonError, GuardConfig, HitlMode, Ratio, Settlement,
    DEFAULT_MAX_RESERVATIONS, DEFAULT_NONCE_WINDOW,
};
pub use decide::{decide, draw_from_bytes};
pub use digest::Digest;
pub use id::{check_id, is_upstream_name, IdError, MAX_ID_BYTES, MAX_UPSTREAM_BYTES};
pub use state::{
    HumanDecision, NonceWindow, PendingTransition, SessionState, SessionStatus, TransitionStatus,
    UnixNanos,
};
pub use transition::{
    apply_decision, apply_post_exec, expire_pending, record_human_decision, Settled, Successor,
};
pub use types::{Decision, DenyReason, Money, Reason, ReportedCost, Verdict};
