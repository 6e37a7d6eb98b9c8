//! The store's integration tests, one binary: `basics` (the trait contract on both
//! stores), `fold` (the live state is the fold of the journal, on random workloads),
//! `persist` (close and reopen, replay after the snapshot, rebuild from the log, refusals
//! when snapshot and log disagree), `quiet` (the index the idle sweep reads names exactly
//! what a scan of every session finds), `shared` (shared budgets under concurrency), `crash`
//! (a real kill -9 under load, at many points: the reopened state is the fold of the log).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod basics;
mod crash;
mod ending;
mod fold;
mod persist;
mod quiet;
mod recover;
mod shared;
mod support;
