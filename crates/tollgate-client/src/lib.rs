//! # tollgate-client: the agent's side
//!
//! Two ways to guard an agent's tool calls:
//! - [`DaemonClient`]: talk to `tollgate serve` over its Unix socket, or over gRPC with
//!   mutual TLS ([`GrpcConfig`]) (the daemon decides, keeps state and audits). Fails
//!   closed: an unreachable daemon, a timeout, a bad MAC, a TLS failure or a malformed
//!   reply is a DENY whose reason starts with `fail_closed:`.
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

pub mod candidate;
pub mod daemon;
pub mod grpc;
pub mod guard;
pub mod hitl;
mod util;

pub use daemon::{ClientConfig, ClientError, ClientVerdict, DaemonClient};
pub use grpc::GrpcConfig;
pub use guard::{AuditIdentity, Checked, Guard, GuardPolicyError, Settlement};
pub use hitl::{HumanWait, Released, ShareParams};
