//! The `tollgate` binary, run as a user runs it: one test binary, one module per command.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod audit;
mod bench;
mod board;
mod certs;
mod conformance;
mod crash;
mod daemon;
mod files;
mod fleet;
mod heal;
mod mcp;
mod operator_token;
mod pg;
mod policy;
mod policy_tools;
mod replay;
mod servers;

pub fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("run tollgate")
}

/// A path in the repository.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Standard output and standard error together.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
