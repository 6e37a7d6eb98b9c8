//! The gateway: an MCP server to the host whose every `tools/call` is decided by Tollgate
//! before it is forwarded to the upstream that offers the tool. Lists, resources and
//! prompts pass through; nothing but `tools/call` is decided (nothing else runs a tool).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, ErrorCode, ErrorData, GetPromptRequestParams,
    GetPromptResponse, InitializeRequestParams, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, MetaObject,
    PaginatedRequestParams, ProgressNotificationParam, Prompt, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{ElicitationMode, RequestContext, ServiceError};
use rmcp::{RoleServer, ServerHandler};
use tollgate_core::json::Value;
use tollgate_core::Money;

use crate::config::{Config, Mode, OnDeny, ToolSettings};
use crate::decider::{Checked, Daemon, Decider, DeciderError, Library, Target, Ticket};
use crate::names::{self, Names};
use crate::texts::{self, Denial};
use crate::upstream::{Hosts, Upstream};
use crate::values::{self, Reported};

/// The JSON-RPC error code of a denied call when `gateway.on_deny = "error"`.
pub const DENIED_ERROR_CODE: i32 = -32050;
/// The protocol revision the gateway speaks; it negotiates down to 2024-11-05.
pub const PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_11_25;
/// The reason of a call the host cancelled before it was decided or while it was held.
pub const CANCELLED: &str = "cancelled_by_host";
/// The `_meta` keys of a denied call's result.
pub const META_VERDICT: &str = "tollgate/verdict";
/// See [`META_VERDICT`].
pub const META_REASON: &str = "tollgate/reason";

/// The gateway's state, shared by every host connection.
pub struct Core {
    config: Config,
    decider: Decider,
    upstreams: Vec<Upstream>,
    hosts: Arc<Hosts>,
    /// Each upstream's tools as last listed (`None`: list again).
    tools: tokio::sync::Mutex<Vec<Option<Vec<Tool>>>>,
    /// The tools and the names the host sees, while no upstream's list changed.
    catalog: tokio::sync::Mutex<Option<Arc<Catalog>>>,
    /// Which upstream listed a resource URI last.
    resources: std::sync::Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("upstreams", &self.upstreams)
            .finish_non_exhaustive()
    }
}

/// Every upstream's tools as last listed (an error for one that could not be) and the
/// names the host sees for them.
#[derive(Debug)]
pub struct Catalog {
    /// Per upstream, in configuration order: its tools (hidden ones removed), or why they
    /// could not be listed.
    pub lists: Vec<Result<Vec<Tool>, String>>,
    /// The names the host sees.
    pub names: Names,
}

/// The MCP server the host talks to (cheap to clone: one per host connection).
#[derive(Debug, Clone)]
pub struct Gateway(pub Arc<Core>);

fn error_result(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn first_text(result: &CallToolResult) -> String {
    let mut t = result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_else(|| "the tool reported an error".into());
    if t.len() > 1024 {
        let mut cut = 1024;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
    }
    t
}

fn money(usd: f64) -> Money {
    Money::from_usd(usd).unwrap_or(Money::ZERO)
}

impl Core {
    /// Set up the decider and the upstreams (not started until first used).
    pub fn new(config: Config) -> Result<Core, DeciderError> {
        let decider = match &config.mode {
            Mode::Library(l) => Decider::Library(Library::open(l)?),
            Mode::Daemon(d) => Decider::Daemon(Box::new(Daemon::new(d, config.hitl_timeout)?)),
        };
        let hosts = Arc::new(Hosts::default());
        let upstreams: Vec<Upstream> = config
            .upstreams
            .iter()
            .map(|u| {
                Upstream::new(
                    u.clone(),
                    config.max_message_bytes,
                    config.connect_timeout,
                    hosts.clone(),
                )
            })
            .collect();
        let tools = tokio::sync::Mutex::new(vec![None; upstreams.len()]);
        Ok(Core {
            config,
            decider,
            upstreams,
            hosts,
            tools,
            catalog: tokio::sync::Mutex::new(None),
            resources: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The decider.
    pub fn decider(&self) -> &Decider {
        &self.decider
    }

    /// The upstreams, in configuration order.
    pub fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }

    fn namespaced(&self) -> bool {
        self.upstreams.len() > 1
    }

    /// The names the host sees for each upstream's own `names` (tools or prompts), in
    /// configuration order ([`crate::names`]).
    pub fn assign_names(&self, names: &[Vec<String>]) -> Names {
        let input: Vec<(&str, Vec<String>)> = self
            .upstreams
            .iter()
            .zip(names)
            .map(|(u, n)| (u.config.name.as_str(), n.clone()))
            .collect();
        names::assign(&input, self.namespaced(), &self.config.tool_separator)
    }

    /// Every upstream's tools and the names the host sees for them, listed anew after an
    /// upstream said its tools changed or when one could not be listed last time.
    pub async fn catalog(&self) -> Arc<Catalog> {
        let changed = self.hosts.take_tools_changed();
        let mut cached = self.catalog.lock().await;
        if changed {
            self.tools.lock().await.iter_mut().for_each(|t| *t = None);
        } else if let Some(c) = cached.as_ref() {
            if c.lists.iter().all(Result::is_ok) {
                return c.clone();
            }
        }
        let mut lists = Vec::with_capacity(self.upstreams.len());
        for i in 0..self.upstreams.len() {
            lists.push(self.upstream_tools(i).await);
        }
        let own: Vec<Vec<String>> = lists
            .iter()
            .map(|l| match l {
                Ok(tools) => tools.iter().map(|t| t.name.to_string()).collect(),
                Err(_) => Vec::new(),
            })
            .collect();
        let names = self.assign_names(&own);
        let c = Arc::new(Catalog { lists, names });
        *cached = Some(c.clone());
        c
    }

    /// Upstream `i`'s tools (hidden ones removed), listed anew when not cached.
    pub async fn upstream_tools(&self, i: usize) -> Result<Vec<Tool>, String> {
        if let Some(Some(t)) = self.tools.lock().await.get(i) {
            return Ok(t.clone());
        }
        let u = self.upstreams.get(i).ok_or("no such upstream")?;
        let peer = u.peer().await.map_err(|e| e.to_string())?;
        let listed = tokio::time::timeout(u.config.timeout, peer.list_all_tools())
            .await
            .map_err(|_| format!("did not list its tools within {:?}", u.config.timeout))?
            .map_err(|e| e.to_string())?;
        let shown: Vec<Tool> = listed
            .into_iter()
            .filter(|t| !u.config.hide.iter().any(|h| *h == t.name))
            .collect();
        if let Some(slot) = self.tools.lock().await.get_mut(i) {
            *slot = Some(shown.clone());
        }
        Ok(shown)
    }

    /// Which of upstream `i`'s `tools` the library guard's policy set refuses
    /// unconditionally (none in daemon mode: the daemon holds the set).
    pub fn denied_by_policy(&self, i: usize, tools: &[Tool]) -> Vec<bool> {
        match (&self.decider, self.upstreams.get(i)) {
            (Decider::Library(lib), Some(u)) => {
                let own: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
                lib.denied_unconditionally(&u.config.name, &own)
            }
            _ => vec![false; tools.len()],
        }
    }

    /// Every upstream's tools, as the host sees them: without those the policy set
    /// refuses whatever the arguments (library mode; calling one anyway is refused by the
    /// policy, as any call). An upstream that cannot be reached is left out (and logged);
    /// the others are listed.
    pub async fn list_tools(&self) -> Vec<Tool> {
        let catalog = self.catalog().await;
        let mut out = Vec::new();
        for (i, list) in catalog.lists.iter().enumerate() {
            match list {
                Ok(tools) => out.extend(
                    tools
                        .iter()
                        .zip(self.denied_by_policy(i, tools))
                        .filter(|(_, denied)| !denied)
                        .filter_map(|(t, _)| {
                            let mut t = t.clone();
                            t.name = catalog.names.public(i, &t.name)?.to_owned().into();
                            Some(t)
                        }),
                ),
                Err(e) => tracing::warn!(
                    "upstream `{}`: cannot list tools: {e}",
                    self.upstreams.get(i).map_or("", |u| u.config.name.as_str())
                ),
            }
        }
        out
    }

    /// Wait for `fut` on behalf of the host's request: while it runs, send the host a
    /// progress notification every `gateway.progress_interval_secs` (when the request
    /// carried a progress token, so the host does not give up on a call a human is still
    /// looking at); give up at once when the host cancels the request (`None`: `fut` is
    /// dropped, which for an upstream call sends the upstream `notifications/cancelled`).
    async fn waiting<F: std::future::Future>(
        &self,
        fut: F,
        context: &RequestContext<RoleServer>,
        what: &str,
    ) -> Option<F::Output> {
        let token = context.meta.get_progress_token();
        let every = self.config.progress_interval;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut fut = std::pin::pin!(fut);
        let mut sent = 0u32;
        loop {
            tokio::select! {
                biased;
                () = context.ct.cancelled() => return None,
                out = &mut fut => return Some(out),
                _ = tick.tick(), if token.is_some() => {
                    sent = sent.saturating_add(1);
                    if let Some(t) = &token {
                        let p = ProgressNotificationParam::new(t.clone(), f64::from(sent))
                            .with_message(what);
                        let _ = context.peer.notify_progress(p).await;
                    }
                }
            }
        }
    }

    fn denied(&self, tool: &str, d: &Denial) -> Result<CallToolResult, ErrorData> {
        let text = texts::denied(tool, d);
        match self.config.on_deny {
            OnDeny::Result => {
                let mut meta = MetaObject::default();
                meta.0
                    .insert(META_VERDICT.into(), serde_json::Value::from("DENY"));
                meta.0.insert(
                    META_REASON.into(),
                    serde_json::Value::from(d.reason.clone()),
                );
                Ok(error_result(text).with_meta(Some(meta)))
            }
            OnDeny::Error => Err(ErrorData::new(
                ErrorCode(DENIED_ERROR_CODE),
                text,
                Some(serde_json::json!({"tool": tool, "reason": d.reason})),
            )),
        }
    }

    /// One `tools/call`, start to end.
    pub async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let name = request.name.to_string();
        let catalog = self.catalog().await;
        let Some((i, own_name)) = catalog.names.route(&name) else {
            // Perhaps a tool of an upstream that cannot be listed now.
            let down: Vec<String> = catalog
                .lists
                .iter()
                .zip(&self.upstreams)
                .filter_map(|(l, u)| {
                    l.as_ref()
                        .err()
                        .map(|e| format!("upstream `{}` is unavailable ({e})", u.config.name))
                })
                .collect();
            if down.is_empty() {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool `{name}`"),
                    None,
                ));
            }
            return Ok(error_result(format!(
                "no server that is up offers `{name}`, and {}; the tool was not run",
                down.join("; ")
            )));
        };
        let own_name = own_name.to_owned();
        let upstream_name = self.upstreams.get(i).map_or("", |u| u.config.name.as_str());
        let settings = self.config.tool(upstream_name, &own_name);
        let params = values::params(request.arguments.as_ref(), self.config.max_message_bytes);
        let target = Target {
            public: &name,
            upstream: upstream_name,
            own: &own_name,
        };
        match self
            .decide(target, params, settings.cost_usd, &context)
            .await
        {
            Checked::Allow { params, ticket } => {
                self.forward(i, own_name, &name, params, ticket, settings, &context)
                    .await
            }
            Checked::Deny(d) => self.denied(&name, &d),
            Checked::Held {
                reason,
                explanation,
                ..
            } => self.denied(
                &name,
                &Denial {
                    explanation,
                    reason,
                    repeat_count: None,
                    budget_remaining: None,
                    estimate: money(settings.cost_usd),
                    note: String::new(),
                    refused_earlier: false,
                },
            ),
        }
    }

    /// Ask Tollgate; when a human must decide (library mode), ask the host's user.
    async fn decide(
        &self,
        target: Target<'_>,
        params: Value,
        cost_usd: f64,
        context: &RequestContext<RoleServer>,
    ) -> Checked {
        let tool = target.public;
        let Decider::Library(lib) = &self.decider else {
            // Daemon mode: a held call waits inside for the daemon's operators.
            let waiting = format!("`{tool}` is waiting for a human's decision");
            return match self
                .waiting(
                    self.decider.check(target, params, cost_usd),
                    context,
                    &waiting,
                )
                .await
            {
                Some(checked) => checked,
                // The host gave up: the wait is dropped, so whatever an operator decides
                // later, this gateway never dispatches the call again (the daemon expires
                // it at its own hitl_timeout_secs).
                None => Checked::Deny(Denial {
                    reason: CANCELLED.to_owned(),
                    repeat_count: None,
                    budget_remaining: None,
                    estimate: money(cost_usd),
                    note: String::new(),
                    refused_earlier: false,
                    explanation: None,
                }),
            };
        };
        // Several calls may be held at once (the guard's max_held_calls), each asked of
        // the host's user on its own and decided by its own call number, in any order.
        let first = self.decider.check(target, params.clone(), cost_usd).await;
        let Checked::Held {
            nonce,
            call_number,
            reason,
            explanation,
        } = first
        else {
            return first;
        };
        let deny = |reason: &str| {
            Checked::Deny(Denial {
                reason: reason.to_owned(),
                repeat_count: None,
                budget_remaining: None,
                estimate: money(cost_usd),
                note: String::new(),
                refused_earlier: false,
                explanation: None,
            })
        };
        if reason == "hitl_transition:defer_escalate"
            || lib
                .guard()
                .state()
                .transition_of_call(call_number)
                .is_none()
        {
            // Held behind the calls the session already holds (max_held_calls): nothing is
            // recorded for it, so nobody can decide it; it is not asked about.
            return deny("hitl_transition:defer_escalate");
        }
        let can_ask = self.config.elicitation
            && context
                .peer
                .supported_elicitation_modes()
                .contains(&ElicitationMode::Form);
        if !can_ask {
            // Nobody can approve it: the held call expires now, audited.
            lib.expire(call_number).await;
            return deny("hitl:no_approver");
        }
        let ask = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: texts::approval_request(
                tool,
                &params,
                &match &explanation {
                    Some(e) => format!("{reason} ({e})"),
                    None => reason.clone(),
                },
                money(cost_usd),
            ),
            requested_schema: ElicitationSchema::new(BTreeMap::new()),
        };
        let waiting = format!("`{tool}` is waiting for your approval");
        let Some(answer) = self
            .waiting(
                context
                    .peer
                    .create_elicitation_with_timeout(ask, Some(self.config.hitl_timeout)),
                context,
                &waiting,
            )
            .await
        else {
            // The host cancelled the call while its user was asked: the held call is
            // expired (audited) and never runs.
            lib.expire(call_number).await;
            return deny(CANCELLED);
        };
        match answer {
            Ok(r) if r.action == ElicitationAction::Accept => {
                lib.approve(
                    target.upstream,
                    target.own,
                    params,
                    cost_usd,
                    nonce,
                    call_number,
                    &self.config.operator_id,
                )
                .await
            }
            Ok(_) => {
                lib.reject(call_number, &self.config.operator_id).await;
                deny("hitl_transition:reject")
            }
            Err(e) => {
                if !matches!(e, ServiceError::Timeout { .. }) {
                    tracing::warn!("elicitation failed: {e}");
                }
                lib.expire(call_number).await;
                deny("fail_closed:hitl_timeout")
            }
        }
    }

    /// Run an allowed call upstream, settle it, and return its result unchanged.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        i: usize,
        own_name: String,
        name: &str,
        params: Value,
        ticket: Ticket,
        settings: ToolSettings,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let Some(u) = self.upstreams.get(i) else {
            return Err(ErrorData::internal_error("no such upstream", None));
        };
        let estimate = settings.cost_usd;
        let timeout = settings.timeout.unwrap_or(u.config.timeout);
        let failed = |text: String, ticket: Ticket| async move {
            self.decider
                .settle(ticket, estimate, Some(text.clone()))
                .await;
            Ok(error_result(format!(
                "{text}. Tollgate allowed `{name}`, but it may not have run."
            )))
        };
        let peer = match u.peer().await {
            Ok(p) => p,
            Err(e) => {
                return failed(
                    format!("upstream `{}` is unavailable: {e}", u.config.name),
                    ticket,
                )
                .await
            }
        };
        let mut request = CallToolRequestParams::new(own_name);
        request.arguments = values::arguments(&params);
        let running = format!("`{name}` is running");
        let Some(outcome) = self
            .waiting(
                tokio::time::timeout(timeout, peer.call_tool_once(request)),
                context,
                &running,
            )
            .await
        else {
            // The host cancelled the call: the upstream request was dropped, which sends
            // the upstream `notifications/cancelled` now; settled as failed, at its
            // estimate (it may have run in part).
            self.decider
                .settle(ticket, estimate, Some("cancelled by the host".into()))
                .await;
            return Ok(error_result(format!(
                "the host cancelled `{name}`; the upstream was told to stop"
            )));
        };
        match outcome {
            Err(_) => {
                failed(
                    format!(
                        "upstream `{}` did not answer within {} s",
                        u.config.name,
                        timeout.as_secs()
                    ),
                    ticket,
                )
                .await
            }
            Ok(Err(ServiceError::McpError(e))) => {
                self.decider
                    .settle(ticket, estimate, Some(e.message.to_string()))
                    .await;
                Err(e)
            }
            Ok(Err(e)) => failed(format!("upstream `{}` failed: {e}", u.config.name), ticket).await,
            Ok(Ok(CallToolResponse::Complete(result))) => {
                let cost = match values::reported_cost(&result) {
                    Reported::Cost(c) => c,
                    Reported::Unreadable => f64::NAN,
                    Reported::Absent => settings.actual_cost_usd.unwrap_or(estimate),
                };
                let error = (result.is_error == Some(true)).then(|| first_text(&result));
                self.decider.settle(ticket, cost, error).await;
                Ok(result)
            }
            Ok(Ok(_)) => {
                failed(
                    format!(
                        "upstream `{}` answered with a result this gateway does not support",
                        u.config.name
                    ),
                    ticket,
                )
                .await
            }
        }
    }

    async fn all_resources(&self) -> ListResourcesResult {
        let mut out = Vec::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let Ok(peer) = u.peer().await else { continue };
            if let Ok(Ok(list)) =
                tokio::time::timeout(u.config.timeout, peer.list_all_resources()).await
            {
                let mut owners = self
                    .resources
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for r in &list {
                    owners.insert(r.uri.clone(), i);
                }
                out.extend(list);
            }
        }
        ListResourcesResult::with_all_items(out)
    }

    /// Every upstream's prompts, named as tools are ([`crate::names`]), and the table.
    async fn all_prompts(&self) -> (Vec<Prompt>, Names) {
        let mut lists = Vec::new();
        for u in &self.upstreams {
            let list = match u.peer().await {
                Ok(peer) => tokio::time::timeout(u.config.timeout, peer.list_all_prompts())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            lists.push(list);
        }
        let own: Vec<Vec<String>> = lists
            .iter()
            .map(|l| l.iter().map(|p| p.name.clone()).collect())
            .collect();
        let names = self.assign_names(&own);
        let mut out = Vec::new();
        for (i, list) in lists.into_iter().enumerate() {
            out.extend(list.into_iter().filter_map(|mut p| {
                p.name = names.public(i, &p.name)?.to_owned();
                Some(p)
            }));
        }
        (out, names)
    }
}

fn capabilities() -> ServerCapabilities {
    serde_json::from_value(serde_json::json!({
        "tools": {"listChanged": true},
        "resources": {"listChanged": true},
        "prompts": {"listChanged": true},
        "logging": {}
    }))
    .unwrap_or_default()
}

fn unavailable(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(format!("upstream unavailable: {e}"), None)
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(capabilities())
            .with_protocol_version(PROTOCOL)
            .with_server_info(rmcp::model::Implementation::new(
                "tollgate-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Every tool call passes through Tollgate, which may deny it (a result with \
                 isError and a text starting `denied:`) or ask a human first.",
            )
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&PROTOCOL))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        // What this host can do for held calls, in the host's MCP log (docs/mcp.md §11).
        let form = context
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form);
        tracing::info!(
            "host {} {}: elicitation (form) {}",
            request.client_info.name,
            request.client_info.version,
            if form { "yes" } else { "no" }
        );
        self.0.hosts.add(context.peer.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.0.list_tools().await))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.0
            .call(request, context)
            .await
            .map(CallToolResponse::Complete)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(self.0.all_resources().await)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut out = Vec::new();
        for u in &self.0.upstreams {
            let Ok(peer) = u.peer().await else { continue };
            if let Ok(Ok(list)) =
                tokio::time::timeout(u.config.timeout, peer.list_all_resource_templates()).await
            {
                out.extend(list);
            }
        }
        Ok(ListResourceTemplatesResult::with_all_items(out))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let known = self
            .0
            .resources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&request.uri)
            .copied();
        let order: Vec<usize> = match known {
            Some(i) => vec![i],
            None => (0..self.0.upstreams.len()).collect(),
        };
        let mut last =
            ErrorData::resource_not_found(format!("no upstream has `{}`", request.uri), None);
        for i in order {
            let Some(u) = self.0.upstreams.get(i) else {
                continue;
            };
            let peer = u.peer().await.map_err(unavailable)?;
            match tokio::time::timeout(u.config.timeout, peer.read_resource(request.clone())).await
            {
                Ok(Ok(r)) => return Ok(ReadResourceResponse::Complete(r)),
                Ok(Err(ServiceError::McpError(e))) => last = e,
                Ok(Err(e)) => last = unavailable(e),
                Err(_) => last = unavailable("timed out"),
            }
        }
        Err(last)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(
            self.0.all_prompts().await.0,
        ))
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let (_, names) = self.0.all_prompts().await;
        let (i, own) = names.route(&request.name).ok_or_else(|| {
            ErrorData::invalid_params(format!("unknown prompt `{}`", request.name), None)
        })?;
        let own = own.to_owned();
        let u = self
            .0
            .upstreams
            .get(i)
            .ok_or_else(|| ErrorData::invalid_params("unknown prompt", None))?;
        request.name = own;
        let peer = u.peer().await.map_err(unavailable)?;
        match tokio::time::timeout(u.config.timeout, peer.get_prompt(request)).await {
            Ok(Ok(r)) => Ok(GetPromptResponse::Complete(r)),
            Ok(Err(ServiceError::McpError(e))) => Err(e),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(unavailable("timed out")),
        }
    }

    /// A request rmcp could not read as any MCP request: a known method with malformed
    /// params is `-32602`, anything else `-32601`.
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        const KNOWN: &[&str] = &[
            "initialize",
            "ping",
            "tools/list",
            "tools/call",
            "resources/list",
            "resources/read",
            "resources/templates/list",
            "prompts/list",
            "prompts/get",
            "logging/setLevel",
        ];
        if KNOWN.contains(&request.method.as_str()) {
            Err(ErrorData::invalid_params(
                format!("malformed params for `{}`", request.method),
                None,
            ))
        } else {
            Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: `{}`", request.method),
                None,
            ))
        }
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        for u in &self.0.upstreams {
            if let Ok(peer) = u.peer().await {
                let _ =
                    tokio::time::timeout(u.config.timeout, peer.set_level(request.clone())).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/mcp.md §3 and §6 quote these.
    #[test]
    fn advertised_capabilities_and_the_approval_schema() {
        assert_eq!(
            serde_json::to_value(capabilities()).unwrap(),
            serde_json::json!({
                "tools": {"listChanged": true},
                "resources": {"listChanged": true},
                "prompts": {"listChanged": true},
                "logging": {}
            })
        );
        assert_eq!(
            serde_json::to_value(ElicitationSchema::new(BTreeMap::new())).unwrap(),
            serde_json::json!({"type": "object", "properties": {}})
        );
    }
}
