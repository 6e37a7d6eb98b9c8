//! The daemon's bindings. Each authenticates its peers in its own way, names them as a
//! [`crate::service::Caller`], and calls the one handler per request in
//! [`crate::service`]; none decides, stores or audits anything itself.
//!
//! - [`socket`]: the Unix socket (SP/1.0 §6.1): length-prefixed protobuf envelopes, each
//!   sealed with HMAC-SHA256 under an organization's agents' or operators' key.
//! - [`grpc`]: gRPC (SP/1.0 §6.2): the `ShackleDaemon` service over HTTP/2 with mutual
//!   TLS; the client certificate names the organization (no HMAC).
//! - [`control`]: the control plane (SP/1.0 §6.3): HTTP with the operators' console, the
//!   WebSocket `/v1/control` (operators' bearer tokens, JSON-encoded protobuf), `/metrics`.

pub mod control;
pub mod grpc;
pub mod pending;
pub mod socket;
