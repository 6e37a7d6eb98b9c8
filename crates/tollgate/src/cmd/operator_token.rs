//! `tollgate operator-token`: a fresh random bearer token for an operator of the control
//! plane, and the `[[operator]]` entry that admits it (which holds only its SHA-256).

use std::process::ExitCode;

use tollgate_daemon::operators;

/// Arguments of `tollgate operator-token`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The operator's id (written into the audit entry of each decision).
    #[arg(long, default_value = "operator")]
    pub id: String,
    /// An organization the operator decides for (repeat for more).
    #[arg(long = "org", default_value = "default")]
    pub orgs: Vec<String>,
}

/// Print the token (once: it is not kept anywhere) and the configuration entry.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let token = operators::new_token().map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let hash = operators::hex(&operators::token_sha256(&token));
    let orgs: Vec<String> = args.orgs.iter().map(|o| format!("{o:?}")).collect();
    outln!("token: {token}");
    outln!("  (give it to the operator; it is not stored anywhere, only its hash below)");
    outln!();
    outln!("[[operator]]");
    outln!("id = {:?}", args.id);
    outln!("token_sha256 = \"{hash}\"");
    outln!("organizations = [{}]", orgs.join(", "));
    outln!("# expires_at = \"2027-01-01T00:00:00Z\"");
    Ok(ExitCode::SUCCESS)
}
