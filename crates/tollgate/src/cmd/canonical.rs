//! `tollgate canonical [--hash] FILE`: the canonical JSON of a document (SP/1.0's params
//! canonicalization), or its SHA-256: what a vector's `canonical_hash` must be.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tollgate_core::json;

/// Arguments of `tollgate canonical`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the lowercase hex SHA-256 of the canonical bytes instead of the bytes.
    #[arg(long)]
    pub hash: bool,
    /// A JSON file (`-` for standard input).
    pub file: PathBuf,
}

/// Print the canonical form or its hash.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let bytes = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut buf)
            .context("reading standard input")?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let value = json::parse(&bytes, json::Limits::default())
        .with_context(|| format!("{} is not accepted JSON", args.file.display()))?;
    let mut out = std::io::stdout().lock();
    if args.hash {
        writeln!(out, "{}", json::canonical_hash(&value)?)?;
    } else {
        out.write_all(&json::to_canonical_vec(&value)?)?;
        writeln!(out)?;
    }
    Ok(ExitCode::SUCCESS)
}
