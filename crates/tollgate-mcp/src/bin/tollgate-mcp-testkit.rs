//! The test fixture of tollgate-mcp (its tests and its latency bench run it; nothing else
//! should). Its modes:
//!
//! - `tollgate-mcp-testkit upstream`: a real MCP server (rmcp's server side) on stdio,
//!   whose tools misbehave on request (`crash`, `hang`, `garbage`, `big`, `fail`). Each
//!   invocation appends the tool's name to the file `$TESTKIT_LOG`, if set, so a test can
//!   count what actually ran; `$TESTKIT_PIDFILE`, if set, gets its process id when it
//!   starts. `$TESTKIT_EXTRA_TOOLS` (names separated by `|`) adds tools
//!   that answer like `echo`, for names hosts would refuse.
//! - `tollgate-mcp-testkit upstream-http`: the same server over Streamable HTTP on
//!   127.0.0.1 (a free port); prints `http://ADDR/mcp` on its first line.
//! - `tollgate-mcp-testkit gateway CONFIG [--check]`: exactly what `tollgate mcp --config
//!   CONFIG [--check]` runs ([`tollgate_mcp::main_entry`]).
//! - `tollgate-mcp-testkit policy-check CONFIG [FILE.cedar...]`: exactly what `tollgate
//!   policy check --mcp CONFIG [FILE.cedar...]` runs ([`tollgate_mcp::policy_check::run`]).
//! - `tollgate-mcp-testkit replay CONFIG PUB LOG [FILE.cedar...]`: what `tollgate policy
//!   replay --mcp CONFIG --key PUB --format json LOG [--policy FILE.cedar]...` runs
//!   ([`tollgate_mcp::replay::run`]), with its exit code.

use std::io::Write;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    GetPromptRequestParams, GetPromptResponse, JsonObject, ListPromptsResult, ListResourcesResult,
    ListToolsResult, MetaObject, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};

#[derive(Debug, Clone, Default)]
struct Upstream;

fn schema(props: serde_json::Value) -> Arc<JsonObject> {
    let v = serde_json::json!({"type": "object", "properties": props});
    Arc::new(match v {
        serde_json::Value::Object(m) => m,
        _ => JsonObject::new(),
    })
}

fn log_invocation(tool: &str) {
    if let Ok(path) = std::env::var("TESTKIT_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write per line: `writeln!` on a file writes the name and the newline
            // separately, and calls running at once interleaved them ("addadd", "").
            let _ = f.write_all(format!("{tool}\n").as_bytes());
        }
    }
}

fn extra_tools() -> Vec<String> {
    std::env::var("TESTKIT_EXTRA_TOOLS")
        .map(|v| {
            v.split('|')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn text(t: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(t)])
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        let caps = serde_json::from_value(serde_json::json!({
            "tools": {}, "resources": {}, "prompts": {}
        }))
        .unwrap_or_default();
        ServerConfig::new(caps).with_server_info(rmcp::model::Implementation::new(
            "tollgate-mcp-testkit",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let s = serde_json::json!({});
        let extra = extra_tools().into_iter().map(|n| {
            Tool::new(
                n,
                "Returns its arguments as JSON text",
                schema(serde_json::json!({})),
            )
        });
        Ok(ListToolsResult::with_all_items(
            extra
                .chain([
                    Tool::new(
                        "echo",
                        "Returns its arguments as JSON text",
                        schema(serde_json::json!({"text": {"type": "string"}})),
                    ),
                    Tool::new(
                        "add",
                        "Adds a and b",
                        schema(
                            serde_json::json!({"a": {"type": "number"}, "b": {"type": "number"}}),
                        ),
                    ),
                    Tool::new(
                        "costly",
                        "Reports its actual cost in _meta (arguments: cost)",
                        schema(serde_json::json!({"cost": {}})),
                    ),
                    Tool::new("fail", "Always fails (isError)", schema(s.clone())),
                    Tool::new(
                        "crash",
                        "Exits the server process mid-call",
                        schema(s.clone()),
                    ),
                    Tool::new("hang", "Never answers", schema(s.clone())),
                    Tool::new(
                        "garbage",
                        "Writes a line that is not JSON to stdout",
                        schema(s.clone()),
                    ),
                    Tool::new(
                        "big",
                        "Returns a text of `bytes` bytes",
                        schema(serde_json::json!({"bytes": {"type": "integer"}})),
                    ),
                    Tool::new(
                        "delete_everything",
                        "A tool the gateway's config hides",
                        schema(s),
                    ),
                ])
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        log_invocation(&request.name);
        let args = request.arguments.clone().unwrap_or_default();
        let result = match &*request.name {
            "echo" => text(serde_json::Value::Object(args).to_string()),
            extra if extra_tools().iter().any(|n| n == extra) => {
                text(serde_json::Value::Object(args).to_string())
            }
            "add" => {
                let n = |k: &str| {
                    args.get(k)
                        .and_then(serde_json::Value::as_f64)
                        .unwrap_or(0.0)
                };
                text(format!("{}", n("a") + n("b")))
            }
            "costly" => {
                let mut meta = MetaObject::default();
                meta.0.insert(
                    "tollgate/actual_cost_usd".into(),
                    args.get("cost").cloned().unwrap_or(serde_json::Value::Null),
                );
                text("charged").with_meta(Some(meta))
            }
            "fail" => CallToolResult::error(vec![ContentBlock::text("HTTP 401 unauthorized")]),
            "crash" => std::process::exit(3),
            "hang" => {
                // Never answers; a client's cancellation is logged as `hang:cancelled`.
                context.ct.cancelled().await;
                log_invocation("hang:cancelled");
                text("cancelled")
            }
            "garbage" => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(b"this is not JSON-RPC\n");
                let _ = out.flush();
                text("wrote garbage")
            }
            "big" => {
                let n = args
                    .get("bytes")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                text("x".repeat(usize::try_from(n).unwrap_or(0)))
            }
            "delete_everything" => text("deleted everything"),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool `{other}`"),
                    None,
                ))
            }
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        serde_json::from_value(serde_json::json!({
            "resources": [{"uri": "testkit://readme", "name": "readme", "mimeType": "text/plain"}]
        }))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if request.uri != "testkit://readme" {
            return Err(ErrorData::resource_not_found("no such resource", None));
        }
        serde_json::from_value(serde_json::json!({
            "contents": [{"uri": "testkit://readme", "mimeType": "text/plain", "text": "read me"}]
        }))
        .map(ReadResourceResponse::Complete)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        serde_json::from_value(serde_json::json!({
            "prompts": [{"name": "greet", "description": "Say hello"}]
        }))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != "greet" {
            return Err(ErrorData::invalid_params("no such prompt", None));
        }
        serde_json::from_value(serde_json::json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}]
        }))
        .map(GetPromptResponse::Complete)
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }
}

async fn upstream_stdio() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(path) = std::env::var("TESTKIT_PIDFILE") {
        std::fs::write(path, std::process::id().to_string())?;
    }
    let running = Upstream
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    running.waiting().await?;
    Ok(())
}

async fn upstream_http() -> Result<(), Box<dyn std::error::Error>> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let service = StreamableHttpService::new(
        || Ok(Upstream),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("http://{}/mcp", listener.local_addr()?);
    std::io::stdout().flush()?;
    axum::serve(listener, router).await?;
    Ok(())
}

/// What `tollgate policy replay --mcp CONFIG --key PUB --format json --examples 1000 LOG
/// [--policy FILE.cedar]...` runs ([`tollgate_mcp::replay::run`]): the report as JSON on
/// stdout and its exit code; a log that does not verify or fold, or bad input, exit 2.
fn replay(
    config: &str,
    key: &str,
    log: &str,
    policies: &[String],
) -> Result<u8, Box<dyn std::error::Error>> {
    let key = tollgate_audit::keys::parse_public_key(&std::fs::read_to_string(key)?)?;
    let replace: Vec<std::path::PathBuf> = policies.iter().map(Into::into).collect();
    match tollgate_mcp::replay::run(
        std::path::Path::new(config),
        &replace,
        Some(key),
        1000,
        &[log.into()],
    ) {
        Ok(report) => {
            println!("{}", report.to_json());
            Ok(report.exit_code())
        }
        Err(Ok(refused)) => {
            eprintln!("{refused}");
            Ok(2)
        }
        Err(Err(message)) => Err(message.into()),
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str);
    let result: Result<u8, Box<dyn std::error::Error>> = match mode {
        Some("upstream") | Some("upstream-http") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(Into::into)
            .and_then(|rt| {
                rt.block_on(async {
                    if mode == Some("upstream") {
                        upstream_stdio().await
                    } else {
                        upstream_http().await
                    }
                })
                .map(|()| 0)
            }),
        Some("gateway") => match args.get(1) {
            Some(path) => tollgate_mcp::main_entry(
                std::path::Path::new(path),
                args.get(2).is_some_and(|a| a == "--check"),
            )
            .map_err(Into::into),
            None => Err("usage: tollgate-mcp-testkit gateway CONFIG [--check]".into()),
        },
        Some("policy-check") => match args.get(1) {
            Some(path) => {
                let outcome = tollgate_mcp::policy_check::run(&tollgate_mcp::policy_check::Request {
                    config: path.into(),
                    files: args.iter().skip(2).map(Into::into).collect(),
                    ..Default::default()
                });
                print!("{}", outcome.stdout);
                eprint!("{}", outcome.stderr);
                Ok(outcome.code)
            }
            None => Err("usage: tollgate-mcp-testkit policy-check CONFIG [FILE.cedar...]".into()),
        },
        Some("replay") => match (args.get(1), args.get(2), args.get(3)) {
            (Some(config), Some(key), Some(log)) => {
                replay(config, key, log, args.get(4..).unwrap_or_default())
            }
            _ => Err("usage: tollgate-mcp-testkit replay CONFIG PUB LOG [FILE.cedar...]".into()),
        },
        _ => Err(
            "usage: tollgate-mcp-testkit upstream | upstream-http | gateway CONFIG | policy-check CONFIG | replay CONFIG PUB LOG"
                .into(),
        ),
    };
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("tollgate-mcp-testkit: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
