//! Waiting for a human: show operators a held call's params, wait for their decision,
//! and re-dispatch what they released, as one call.

use std::time::{Duration, Instant};

use tollgate_core::json::{self, Value};
use tollgate_core::Verdict;
use tollgate_proto::sp1::{self, envelope::Payload};

use crate::daemon::{ClientError, ClientVerdict, DaemonClient};

/// Whether a held call's params are shown to operators. The daemon checks them against the
/// held call's digest, so what is shown is exactly what would run: a redaction cannot be
/// shown, only withheld. Withhold the params of calls that carry secrets; operators then
/// see the tool and the params hash, and are told the params were not sent.
#[derive(Clone, Copy)]
pub enum ShareParams {
    /// Send every held call's params (the default).
    All,
    /// Send none.
    Never,
    /// Send a held call's params when this returns true for (tool, params).
    When(fn(&str, &Value) -> bool),
}

impl std::fmt::Debug for ShareParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShareParams::All => "All",
            ShareParams::Never => "Never",
            ShareParams::When(_) => "When(..)",
        })
    }
}

/// How [`DaemonClient::pre_exec_or_wait`] waits for a human.
#[derive(Debug, Clone, Copy)]
pub struct HumanWait {
    /// The longest to wait for a decision before giving up (DENY
    /// `fail_closed:hitl_timeout`). The daemon also expires a held call nobody decides
    /// within its `hitl_timeout_secs` (DENY `hitl_transition:reject`, outcome `expire`).
    pub timeout: Duration,
    /// Whether operators are shown the params.
    pub share_params: ShareParams,
}

impl Default for HumanWait {
    fn default() -> Self {
        HumanWait {
            timeout: Duration::from_secs(900),
            share_params: ShareParams::All,
        }
    }
}

/// The answer to "may this run?" once a human has had their say: the verdict, and the
/// params to run the tool with (a human who modified the call changed them).
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    /// The final verdict: ALLOW only if the call (or its successor) was released.
    pub verdict: ClientVerdict,
    /// The params to run the tool with when allowed: the original ones, or the successor's
    /// after a modify. `None` when not allowed.
    pub params: Option<Value>,
    /// The human's decision (`approve`, `modify`, `reject`, `expire`), or empty when no
    /// human was asked.
    pub decision: String,
    /// The deciding human's note (their reasons: give a reject's to the model), or empty.
    pub note: String,
}

impl Released {
    /// Whether the tool may run (with [`Released::params`]).
    pub fn allowed(&self) -> bool {
        self.verdict.allowed()
    }
}

/// The first wait before a held-behind call is dispatched again, and the longest.
const HELD_BEHIND_FIRST_RETRY: Duration = Duration::from_millis(50);
const HELD_BEHIND_MAX_RETRY: Duration = Duration::from_secs(1);

/// A DENY of held call `held` for `reason`, after the human's `decision` (if any).
fn denied(held: u64, reason: &str, decision: &str) -> Released {
    Released {
        verdict: ClientVerdict {
            verdict: Verdict::Deny,
            reason: reason.to_owned(),
            call_number: held,
            response: None,
            error: None,
        },
        params: None,
        decision: decision.to_owned(),
        note: String::new(),
    }
}

/// A DENY of held call `held` because the daemon could not be asked.
fn denied_with(held: u64, e: ClientError) -> Released {
    Released {
        verdict: ClientVerdict {
            verdict: Verdict::Deny,
            reason: e.reason(),
            call_number: held,
            response: None,
            error: Some(e),
        },
        params: None,
        decision: String::new(),
        note: String::new(),
    }
}

impl DaemonClient {
    /// Show operators the params of held call `call_number` (canonical JSON, at most 64
    /// KiB; the daemon accepts them only if they hash to the held call's digest).
    pub async fn send_held_params(
        &self,
        call_number: u64,
        params: &Value,
    ) -> Result<(), ClientError> {
        let text = json::to_canonical_vec(params)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| ClientError::Malformed("params are not canonicalizable".into()))?;
        match self
            .request(Payload::HeldParams(sp1::HeldParams {
                session_id: self.session_id().to_owned(),
                call_number,
                params_json: text,
            }))
            .await?
        {
            Payload::HeldParamsAck(a)
                if a.session_id == self.session_id() && a.call_number == call_number =>
            {
                Ok(())
            }
            _ => Err(ClientError::Malformed(
                "expected this call's held-params ack".into(),
            )),
        }
    }

    /// Wait at most `timeout` for a human's decision on held call `call_number`, asking
    /// the daemon again whenever one long-poll ends without one. Returns the daemon's last
    /// answer: `outcome` is `approve`, `modify`, `reject`, `expire`, `none` (nothing held
    /// for that call), or `pending` when `timeout` passed first.
    pub async fn await_decision(
        &self,
        call_number: u64,
        timeout: Duration,
    ) -> Result<sp1::AwaitDecisionResponse, ClientError> {
        let deadline = Instant::now() + timeout;
        // The long poll goes over a connection of its own, so that it holds up no other
        // call of the threads and tasks sharing this client.
        let side = self.side_connection().await?;
        let link = side.as_ref().unwrap_or(self);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let poll = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            let reply = link
                .request_within(
                    Payload::AwaitDecision(sp1::AwaitDecisionRequest {
                        session_id: self.session_id().to_owned(),
                        call_number,
                        timeout_ms: poll,
                    }),
                    // The daemon answers within its cap (60 s by default); leave room.
                    left.min(Duration::from_secs(60)) + self.timeout(),
                )
                .await?;
            let Payload::AwaitDecisionResponse(r) = reply else {
                return Err(ClientError::Malformed(
                    "expected an await-decision response".into(),
                ));
            };
            if r.session_id != self.session_id() || r.call_number != call_number {
                return Err(ClientError::Malformed(
                    "the decision is for another call".into(),
                ));
            }
            if r.outcome != "pending" || Instant::now() >= deadline {
                return Ok(r);
            }
        }
    }

    /// Decide, and if a human must, wait for them: ask whether `tool` may run with
    /// `params`; on HITL, show operators the params (per `wait.share_params`), wait for
    /// their decision, and re-dispatch what they released: the same call with its nonce
    /// (approve), or the successor with the edited params and the nonce the daemon gave it
    /// (modify). Never errors: anything but a released call is a DENY.
    ///
    /// Safe to call from many tasks at once on one client: each call has its own nonce and
    /// waits for its own held call. A call the daemon answers HITL but holds nothing for
    /// (`await_decision` outcome `none`: held behind other held calls) is dispatched again,
    /// with its nonce, after a short backoff (50 ms, doubling to 1 s), until it is held
    /// with a transition of its own, decided, or `wait.timeout` passes.
    pub async fn pre_exec_or_wait(
        &self,
        tool: &str,
        params: &Value,
        estimated_cost_usd: f64,
        wait: HumanWait,
    ) -> Released {
        let req = self.prepare(tool, params, estimated_cost_usd);
        let deadline = Instant::now() + wait.timeout;
        let share = match wait.share_params {
            ShareParams::All => true,
            ShareParams::Never => false,
            ShareParams::When(f) => f(tool, params),
        };
        // How long to wait before dispatching a held-behind call again.
        let mut backoff = HELD_BEHIND_FIRST_RETRY;
        let mut dispatch = req.clone();
        loop {
            let v = self.pre_exec_request(dispatch).await;
            if v.verdict != Verdict::Hitl {
                let allowed = v.allowed();
                return Released {
                    verdict: v,
                    params: allowed.then(|| params.clone()),
                    decision: String::new(),
                    note: String::new(),
                };
            }
            let held = v.call_number;
            if share {
                // Not fatal: operators then see the digest alone (and a call held behind
                // another is not held yet, so its params are refused until it is).
                let _ = self.send_held_params(held, params).await;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let decided = match self.await_decision(held, left).await {
                Ok(d) => d,
                Err(e) => return denied_with(held, e),
            };
            if decided.outcome == "none" {
                // Nothing is held for this call: it was held behind other held calls
                // (the session holds as many as it may, or one under SP/1.0.1's single
                // transition), so nobody can decide it yet. Dispatch it again, the same
                // call with its nonce, once the others had time to move; the daemon
                // decides it afresh (held with a transition of its own once there is
                // room). Never past the deadline.
                if Instant::now() + backoff >= deadline {
                    return denied(held, "fail_closed:hitl_timeout", "");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(HELD_BEHIND_MAX_RETRY);
                dispatch = sp1::PreExecRequest {
                    call_number: self.next_call_number(),
                    ..req.clone()
                };
                continue;
            }
            return self
                .release(tool, params, &req, estimated_cost_usd, held, decided)
                .await;
        }
    }

    /// Act on a human's decision on held call `held` (dispatched as `req`).
    async fn release(
        &self,
        tool: &str,
        params: &Value,
        req: &sp1::PreExecRequest,
        estimated_cost_usd: f64,
        held: u64,
        decided: sp1::AwaitDecisionResponse,
    ) -> Released {
        match decided.outcome.as_str() {
            "approve" => {
                // The same call, its nonce and params, under a new call number.
                let again = sp1::PreExecRequest {
                    call_number: self.next_call_number(),
                    ..req.clone()
                };
                let v = self.pre_exec_request(again).await;
                let allowed = v.allowed();
                Released {
                    verdict: v,
                    params: allowed.then(|| params.clone()),
                    decision: "approve".into(),
                    note: decided.note,
                }
            }
            "modify" => {
                let Some(t) = decided.transition.as_ref() else {
                    return denied(held, "fail_closed:malformed_reply", "modify");
                };
                let Ok(successor) = json::parse_str(&decided.successor_params_json) else {
                    // Modified by digest only (no params given): nothing this client can run.
                    return denied(held, "fail_closed:successor_params_unknown", "modify");
                };
                if json::canonical_hash(&successor).map(|d| d.0.to_vec()).ok()
                    != Some(t.successor_args_digest.clone())
                {
                    return denied(held, "fail_closed:malformed_reply", "modify");
                }
                let again = self.prepare(tool, &successor, estimated_cost_usd);
                let again = sp1::PreExecRequest {
                    nonce: t.successor_nonce,
                    ..again
                };
                let v = self.pre_exec_request(again).await;
                let allowed = v.allowed();
                Released {
                    verdict: v,
                    params: allowed.then_some(successor),
                    decision: "modify".into(),
                    note: decided.note,
                }
            }
            "reject" => Released {
                note: decided.note,
                ..denied(held, "hitl_transition:reject", "reject")
            },
            "expire" => denied(held, "hitl_transition:reject", "expire"),
            "pending" => denied(held, "fail_closed:hitl_timeout", ""),
            _ => denied(held, "fail_closed:malformed_reply", ""),
        }
    }
}
