//! `tollgate policy check --mcp mcp.toml`: the gateway's policies checked against the tools
//! its upstreams really offer ([`tollgate_policy::derive`]).
//!
//! Every upstream is started (or reached) as the gateway starts it, within
//! `gateway.connect_timeout_secs`, asked for its tools (`tools/list`, within its
//! `timeout_secs`), and stopped again (its process killed). Hidden tools are left out, as
//! the gateway leaves them out. The tools are named as the gateway's decider names them:
//! in library mode the action is the upstream's own tool name and the resource
//! `Upstream::"NAME"`; in daemon mode the action is the name the host sees
//! (`UPSTREAM__TOOL` with several upstreams) and the resource `Upstream::"local"`.
//!
//! The policies are the files named on the command line, or else mcp.toml's `[policy]`
//! (library mode; its `default` and `schema` too). Nothing is written and no daemon is
//! asked. An upstream that cannot be listed stops the check (exit 2): without its tools
//! every policy on them would be reported as naming an unknown tool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate_policy::derive::{self, ToolDef};
use tollgate_policy::{DefaultEffect, Options, Source};

use crate::config::{Config, Mode};
use crate::upstream::{Hosts, Upstream};

/// What to check.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// mcp.toml.
    pub config: PathBuf,
    /// Policy files; none: mcp.toml's `[policy]`.
    pub files: Vec<PathBuf>,
    /// The default effect (else `[policy]`'s, else allow).
    pub default: Option<DefaultEffect>,
    /// An author schema (else `[policy]`'s, if any).
    pub schema: Option<PathBuf>,
    /// More tool definitions (`--tools FILE`), checked together with the upstreams'.
    pub extra_tools: Vec<ToolDef>,
}

/// What the check printed and its exit code (0 ok, 1 refused, 2 bad input or an
/// upstream that could not be listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The findings and the summary.
    pub stdout: String,
    /// Why the check could not run.
    pub stderr: String,
    /// The exit code.
    pub code: u8,
}

fn failed(stderr: String) -> Outcome {
    Outcome {
        stdout: String::new(),
        stderr,
        code: 2,
    }
}

/// The tools `config`'s upstreams offer, named as the gateway decides them; each upstream
/// is started, listed and stopped. An error names every upstream that failed.
pub async fn offered_tools(config: &Config) -> Result<Vec<ToolDef>, String> {
    let hosts = Arc::new(Hosts::default());
    let daemon_mode = matches!(config.mode, Mode::Daemon(_));
    let mut lists: Vec<(String, Vec<rmcp::model::Tool>)> = Vec::new();
    let mut errors = Vec::new();
    for u in &config.upstreams {
        let up = Upstream::new(
            u.clone(),
            config.max_message_bytes,
            config.connect_timeout,
            hosts.clone(),
        );
        let listed = async {
            let peer = up.peer().await.map_err(|e| e.to_string())?;
            tokio::time::timeout(u.timeout, peer.list_all_tools())
                .await
                .map_err(|_| format!("did not list its tools within {:?}", u.timeout))?
                .map_err(|e| e.to_string())
        }
        .await;
        up.reset().await;
        match listed {
            Ok(tools) => lists.push((
                u.name.clone(),
                tools
                    .into_iter()
                    .filter(|t| !u.hide.iter().any(|h| *h == t.name))
                    .collect(),
            )),
            Err(e) => errors.push(format!("upstream `{}`: cannot list its tools: {e}", u.name)),
        }
    }
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    let own: Vec<(&str, Vec<String>)> = lists
        .iter()
        .map(|(n, tools)| {
            (
                n.as_str(),
                tools.iter().map(|t| t.name.to_string()).collect(),
            )
        })
        .collect();
    let names = crate::names::assign(&own, lists.len() > 1, &config.tool_separator);
    let mut out = Vec::new();
    for (i, (upstream, tools)) in lists.iter().enumerate() {
        for t in tools {
            let (name, resource) = if daemon_mode {
                let Some(public) = names.public(i, &t.name) else {
                    continue;
                };
                (
                    public.to_owned(),
                    tollgate_policy::LOCAL_UPSTREAM.to_owned(),
                )
            } else {
                (t.name.to_string(), upstream.clone())
            };
            out.push(ToolDef {
                name,
                input_schema: serde_json::Value::Object((*t.input_schema).clone()),
                origin: format!("upstream {upstream}"),
                resource: Some(resource),
            });
        }
    }
    if out.len() > derive::MAX_TOOLS {
        return Err(format!(
            "the upstreams offer {} tools; the check reads at most {}",
            out.len(),
            derive::MAX_TOOLS
        ));
    }
    Ok(out)
}

/// `tollgate policy check --mcp`, start to end.
pub fn run(req: &Request) -> Outcome {
    let config = match Config::load(&req.config) {
        Ok(c) => c,
        Err(e) => return failed(format!("tollgate: {}: {e}\n", req.config.display())),
    };
    let configured = match &config.mode {
        Mode::Library(l) => l.policy.clone(),
        Mode::Daemon(_) => None,
    };
    let (files, default, schema): (Vec<PathBuf>, DefaultEffect, Option<PathBuf>) = if !req
        .files
        .is_empty()
    {
        (
            req.files.clone(),
            req.default.unwrap_or_default(),
            req.schema.clone(),
        )
    } else if let Some(p) = configured {
        (
            p.files,
            req.default.unwrap_or(p.default),
            req.schema.clone().or(p.schema),
        )
    } else {
        return failed(format!(
                "tollgate: `{}` has no [policy] section (in daemon mode the daemon's [policy] decides): name the policy files to check\n",
                req.config.display()
            ));
    };
    let mut stderr = String::new();
    let read = |p: &Path, stderr: &mut String| -> Option<Source> {
        match tollgate_policy::files::read_source(p) {
            Ok(s) => Some(s),
            Err(e) => {
                stderr.push_str(&format!("tollgate: {e}\n"));
                None
            }
        }
    };
    let sources: Vec<Option<Source>> = files.iter().map(|p| read(p, &mut stderr)).collect();
    let schema = schema.as_deref().map(|p| read(p, &mut stderr));
    if !stderr.is_empty() {
        return failed(stderr);
    }
    let sources: Vec<Source> = sources.into_iter().flatten().collect();
    let options = Options {
        default,
        schema: schema.flatten(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return failed(format!("tollgate: cannot start the runtime: {e}\n")),
    };
    let listed = rt.block_on(offered_tools(&config));
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    let mut tools = match listed {
        Ok(t) => t,
        Err(e) => return failed(format!("tollgate: {e}\n")),
    };
    tools.extend(req.extra_tools.iter().cloned());
    let report = derive::check(&sources, &options, &tools);
    let (stdout, code) = derive::render(
        &report,
        &format!(
            "{} upstreams of {}",
            config.upstreams.len(),
            req.config.display()
        ),
    );
    Outcome {
        stdout,
        stderr: String::new(),
        code,
    }
}
