//! # tollgate-client: the agent's side
//!
//! Two ways to guard an agent's tool calls:
//! - [`DaemonClient`]: talk to `tollgate serve` over its Unix socket (the daemon decides,
//!   keeps state and audits). Fails closed: an unreachable daemon, a timeout, a bad MAC or
//!   a malformed reply is a DENY whose reason starts with `fail_closed:`.
//! - [`Guard`]: library mode, the same decision core in process, with an optional local
//!   audit log.
//!
//! What it does **not** do: run tools. It answers whether they may run.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod daemon;
pub mod guard;
pub mod hitl;
mod util;

pub use daemon::{ClientConfig, ClientError, ClientVerdict, DaemonClient};
pub use guard::{AuditIdentity, Checked, Guard, Settlement};
pub use hitl::{HumanWait, Released, ShareParams};
