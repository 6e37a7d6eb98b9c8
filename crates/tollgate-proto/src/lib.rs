//! # tollgate-proto: SP/1.0 on the wire
//!
//! The SP/1.0 messages as protobuf types (compiled from `proto/sp1.proto` by protox and
//! prost at build time, no `protoc`), the framing codec of the Unix-socket transport
//! (4-byte big-endian length, then the protobuf bytes, at most 1 MiB), and message
//! authentication (HMAC-SHA256 keyed from the organization's secret; docs/protocol.md).
//!
//! What this crate does **not** do: no sockets, no I/O, no clock. Bytes in, messages out.
//! It is the only crate that knows protobuf.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

/// The generated SP/1.0 types.
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
pub mod sp1 {
    include!(concat!(env!("OUT_DIR"), "/tollgate.sp1.rs"));
}

pub mod auth;
pub mod frame;

pub use auth::{MessageKey, Verified};
pub use frame::{FrameDecoder, FrameError, MAX_FRAME_LEN};

/// The protocol versions this implementation speaks, newest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
