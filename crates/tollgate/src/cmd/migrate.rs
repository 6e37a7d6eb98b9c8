//! `tollgate migrate`: bring the PostgreSQL audit schema to this build's version.
//!
//! Exit codes: 0 migrated (or already current), 2 error.

use std::path::PathBuf;
use std::process::ExitCode;

use tollgate_pg::RoleOutcome;

/// Arguments of `tollgate migrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The PostgreSQL database (a URL or key=value string). The user must be allowed to
    /// create the schema (and, for the writer role, roles).
    #[arg(long, value_name = "URL")]
    postgres: String,
    /// The schema to create or migrate.
    #[arg(long, default_value = tollgate_pg::DEFAULT_SCHEMA)]
    schema: String,
    /// PEM file of the CA that signed the server's certificate (TLS).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
}

/// Run `tollgate migrate`.
pub fn run(a: &Args) -> anyhow::Result<ExitCode> {
    let settings = super::audit::pg_settings(&a.postgres, &a.schema, a.ca.as_ref());
    let report = super::audit::pg_runtime()?.block_on(async {
        let mut client = tollgate_pg::connect(&settings).await?;
        tollgate_pg::migrate(&mut client, &a.schema).await
    })?;
    if report.applied.is_empty() {
        outln!(
            "schema {}: at version {}, up to date",
            report.schema,
            report.to
        );
    } else {
        let applied: Vec<String> = report.applied.iter().map(ToString::to_string).collect();
        outln!(
            "schema {}: version {} -> {} (applied {})",
            report.schema,
            report.from,
            report.to,
            applied.join(", ")
        );
    }
    match &report.role {
        RoleOutcome::Created => outln!(
            "role {}: created (NOLOGIN), granted INSERT and SELECT",
            tollgate_pg::WRITER_ROLE
        ),
        RoleOutcome::Existed => outln!(
            "role {}: exists, granted INSERT and SELECT",
            tollgate_pg::WRITER_ROLE
        ),
        RoleOutcome::NotPermitted(why) => {
            outln!(
                "role {}: NOT SET UP ({why}); a superuser must create it and grant it INSERT, SELECT (docs/postgres.md)",
                tollgate_pg::WRITER_ROLE
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
