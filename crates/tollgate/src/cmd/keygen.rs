//! `tollgate keygen`: write an Ed25519 signing key (mode 0600) and its public key.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use tollgate_audit::keys;

/// Arguments of `tollgate keygen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory to write `<name>.key` and `<name>.pub` into.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Base name of the two files.
    #[arg(long, default_value = "audit")]
    pub name: String,
    /// Replace existing key files.
    #[arg(long)]
    pub force: bool,
}

/// Generate and write the key pair.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let key = keys::generate().map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let secret = args.out.join(format!("{}.key", args.name));
    let public = args.out.join(format!("{}.pub", args.name));
    write_file(&secret, &keys::secret_key_text(&key), 0o600, args.force)?;
    write_file(
        &public,
        &keys::public_key_text(&key.verifying_key()),
        0o644,
        args.force,
    )?;
    outln!(
        "key id {}\nsigning key {} (mode 0600, keep secret)\npublic key  {}",
        keys::key_id(&key.verifying_key()),
        secret.display(),
        public.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Write `path` atomically (whole or absent: never an empty or cut key) with exactly
/// `mode`; with `force` an existing file is replaced in one rename.
fn write_file(path: &Path, text: &str, mode: u32, force: bool) -> anyhow::Result<()> {
    let write = if force {
        tollgate_audit::files::replace_atomically
    } else {
        tollgate_audit::files::create_atomically
    };
    write(path, text.as_bytes(), mode).with_context(|| {
        format!(
            "cannot create `{}` (use --force to replace)",
            path.display()
        )
    })
}
