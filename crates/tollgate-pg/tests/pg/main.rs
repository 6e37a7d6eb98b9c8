//! Tests against a real PostgreSQL (127.0.0.1:5432, database `test`, trust auth; or
//! `TOLLGATE_TEST_PG_URL`). Each test works in a schema of its own and drops it after.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
mod journal;
mod schema;
mod settle;
mod tls;
mod verify;
