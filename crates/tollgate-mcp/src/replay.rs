//! `tollgate policy replay --mcp mcp.toml`: the candidate a gateway's own configuration
//! gives, so a library-mode gateway's local audit log replays under exactly the settings
//! that wrote it (issue 19). The guard is `[guard]` over the gateway's defaults (the one
//! every session of the log opened with), the policies `[policy]` (or the files that
//! replace them, `--policy`); every call is then decided for the upstream its entry
//! records (audit format 8), as the gateway decided it.
//!
//! A daemon-mode gateway writes no log of its own (the daemon decides and records every
//! call): its `mcp.toml` is refused, naming the daemon's configuration as what to replay
//! under. [`run`] is what the command runs on a log's files (the testkit runs it too).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tollgate_store::replay::report::Report;
use tollgate_store::replay::{Candidate, Refused};

use crate::config::{Config, Mode};

/// The candidate `config` gives (its files replaced by `replace` when it names any), and
/// the policy loader's warnings. A daemon-mode configuration is refused.
fn candidate(config: &Config, replace: &[PathBuf]) -> Result<(Candidate, Vec<String>), String> {
    match &config.mode {
        Mode::Library(l) => {
            Candidate::load(l.guard.clone(), HashMap::new(), l.policy.as_ref(), replace)
        }
        Mode::Daemon(_) => Err(
            "a daemon-mode gateway's calls are decided and recorded by the daemon: replay the \
             daemon's log with its configuration (--config)"
                .into(),
        ),
    }
}

/// Read `mcp.toml` at `path` and give its candidate (its `[guard]` and `[policy]`).
pub fn load(path: &Path, replace: &[PathBuf]) -> Result<(Candidate, Vec<String>), String> {
    let config = Config::load(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    candidate(&config, replace)
}

/// Replay the log `paths` under `mcp.toml` at `config` as `tollgate policy replay --mcp
/// CONFIG [--key PUB] --examples N PATHS...` does: the report, or why there is none
/// (`Err(Ok(refused))`: the log does not verify or fold; `Err(Err(message))`: bad input).
pub fn run(
    config: &Path,
    replace: &[PathBuf],
    key: Option<tollgate_audit::VerifyingKey>,
    examples: usize,
    paths: &[PathBuf],
) -> Result<Report, Result<Refused, String>> {
    let (candidate, _) = load(config, replace).map_err(Err)?;
    tollgate_store::replay::replay_paths(paths, key, candidate, examples, &mut |_| ())
        .map(|(r, _)| r)
        .map_err(Ok)
}
