//! # tollgate-redis: session state in Redis, shared by a fleet of daemons
//!
//! [`RedisStore`] implements [`tollgate_store::SessionStore`] over Redis so that several
//! daemons serve the same sessions and spend the same shared budgets (per agent, per
//! organization) as one authority. The design is in `docs/redis.md`; in short:
//!
//! - **One decision, one compare-and-set.** Each daemon caches the sessions it serves
//!   (record, hash version, shared budget and its version). `apply` runs the caller's
//!   closure (the decision, in Rust) on a copy of the cached session, then sends **one**
//!   Lua script call ([`script::CAS_LUA`], by `EVALSHA`, pipelined with an index write:
//!   one round trip) that writes the new session record and the new shared budget only
//!   if both versions are still those the decision read, and pushes an *unconfirmed
//!   marker* (the record before, the budget delta). On a conflict the script writes
//!   nothing and returns the current hashes; the closure runs again on them (bounded
//!   retries, then [`tollgate_store::StoreError::Backend`] "contention").
//! - **The state change and its audit entry are one fact.** After the write, the change's
//!   entry goes to the [`tollgate_store::Journal`]; once it is durable the marker is
//!   dropped (by a background confirmer, or by the next write). A marker left by a
//!   daemon that died before its entry committed is settled, after `grace`, through the
//!   [`tollgate_store::Arbiter`]: its own entry holds the place (drop the marker) or a
//!   void does (restore the record before it, take the budget delta back). A sweeper
//!   settles markers of sessions nobody touches.
//! - **Fail closed.** Every Redis error, a command past `command_timeout`, or a reply
//!   or record that does not decode within bounds is a [`tollgate_store::StoreError`];
//!   the connection manager reconnects, so service resumes when Redis does.
//!
//! The decision logic of the protocol ([`cas`]) is pure and runs unchanged against an
//! in-memory fake of the script ([`script::Fake`]) in the model tests.
//!
//! What this crate does **not** do: no decisions of its own (the closure brings them),
//! no audit writing (the journal does), no settling policy (the arbiter decides entry
//! or void), no Redis Cluster routing (keys are Cluster-ready, with hash tags, but the
//! connection is to one server), no session cap (`StoreError::SessionCap` is never
//! returned), no daemon wiring.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod cas;
pub mod keys;
pub mod script;
mod store;

pub use store::{random_daemon_id, RedisOptions, RedisStats, RedisStore, ServerDurability};
