//! Human in the loop, beside the decision core: what operators see of a held call (its
//! params, sent by its agent and checked against the held digest), their decisions
//! (modify with edited arguments), agents waiting for a decision, expiry of calls nobody
//! decides, and the events operators' consoles follow.
//!
//! Every decision and every expiry is a state change made through `tollgate_store::ops`,
//! audited and durable before anyone is told. The params shown to operators are kept in
//! memory and, when the store is shared by several daemons, as the session's note in the
//! store (`SessionStore::set_note`), so every daemon shows them; after a single daemon's
//! restart a held call shows its digest, and says its params are not known, until its agent
//! sends them again.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tollgate_core::json::{self, Limits};
use tollgate_core::transition::is_undecided;
use tollgate_core::{Digest, HumanDecision, PendingTransition, SessionState, Successor};
use tollgate_proto::sp1::{self, ErrorCode};
use tollgate_store::{ops, Change, Session, SessionStore};

use crate::convert;

/// How often a waiting agent's daemon re-reads a held call's state when the store is shared
/// by several daemons (a decision made through another daemon sends this one no event).
const SHARED_STATE_POLL: Duration = Duration::from_millis(200);
use crate::service::{lock, not_found, refuse, Caller, Refusal, Service, SessionInfo};

/// The most held calls one session's shared note is read for (a bound on what another
/// daemon's note can make this one keep; a session holds at most its `max_held_calls`).
const MAX_NOTE_CALLS: usize = 1024;

/// The largest params a held call may show, and a modify may carry, in bytes.
pub const MAX_PARAMS_BYTES: usize = 64 * 1024;

/// What operators see of a held call beyond its state, and a modify's successor params.
/// Kept in the daemon's memory and, for the daemons sharing a store, as the session's note
/// (JSON of this struct), so a call held through one daemon shows its params on another,
/// and an agent waiting on one daemon gets a successor decided through another.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct HeldParams {
    /// The held call's number.
    pub call_number: u64,
    /// The held call's params, canonical, once its agent sent them and they matched.
    pub params_json: Option<String>,
    /// A modify's successor params, canonical, for the agent to run.
    pub successor_json: Option<String>,
    /// The deciding human's note, for the agent waiting for the decision (a reject's
    /// reasons reach its model).
    #[serde(default)]
    pub note: Option<String>,
}

/// What the daemon knows of each session's held calls, by session and held call number.
pub(crate) type HeldMap = HashMap<String, BTreeMap<u64, HeldParams>>;

/// The daemon's record of call `call_number` held in `session_id` (a fresh one if it has
/// none). Records of calls the session no longer holds (`state`) are forgotten here, so
/// the map stays as large as what is held.
fn held_call<'a>(
    held: &'a mut HeldMap,
    session_id: &str,
    call_number: u64,
    state: &SessionState,
) -> &'a mut HeldParams {
    let calls = held.entry(session_id.to_owned()).or_default();
    calls.retain(|n, _| *n == call_number || state.transition_of_call(*n).is_some());
    calls.entry(call_number).or_insert_with(|| HeldParams {
        call_number,
        ..Default::default()
    })
}

/// The held call `p` of session `session_id` as this daemon knows it.
fn known<'a>(held: &'a HeldMap, session_id: &str, p: &PendingTransition) -> Option<&'a HeldParams> {
    held.get(session_id)?.get(&p.call_number)
}

/// What happened to a held call, for consoles and waiting agents.
#[derive(Debug, Clone, PartialEq)]
pub enum HitlEvent {
    /// A call was held, or something operators see of it changed (its params arrived, it
    /// was deferred or escalated).
    Held(Box<sp1::HitlPending>),
    /// A held call is no longer waiting for a human: decided (`approve`, `reject`,
    /// `modify`), expired (`expire`), or released (`released`: its approval was used).
    Resolved {
        /// Its session's organization.
        organization_id: String,
        /// Its session.
        session_id: String,
        /// Its call number.
        call_number: u64,
        /// The decision word, `expire`, or `released`.
        outcome: String,
        /// Who decided (`tollgate` for an expiry).
        operator_id: String,
    },
}

impl HitlEvent {
    /// The organization the event belongs to (who may see it).
    pub fn organization(&self) -> &str {
        match self {
            HitlEvent::Held(p) => &p.organization_id,
            HitlEvent::Resolved {
                organization_id, ..
            } => organization_id,
        }
    }
}

/// Canonical JSON of a params document of at most [`MAX_PARAMS_BYTES`], and its digest.
fn canonical_params(text: &str) -> Result<(String, Digest), Refusal> {
    if text.len() > MAX_PARAMS_BYTES {
        return Err(refuse(
            ErrorCode::MessageTooLarge,
            format!("params over {MAX_PARAMS_BYTES} bytes"),
        ));
    }
    let v = json::parse(
        text.as_bytes(),
        Limits {
            max_bytes: MAX_PARAMS_BYTES,
            max_depth: tollgate_core::call::MAX_PARAMS_DEPTH + 1,
        },
    )
    .map_err(|e| refuse(ErrorCode::InvalidRequest, format!("params: {e}")))?;
    tollgate_core::call::check_canonicalizable(&v).map_err(|e| {
        refuse(
            ErrorCode::InvalidRequest,
            format!("params are not canonicalizable: {e}"),
        )
    })?;
    let bytes = json::to_canonical_vec(&v)
        .map_err(|_| refuse(ErrorCode::InvalidRequest, "params are not canonicalizable"))?;
    let digest = Digest::of(&bytes);
    let canonical = String::from_utf8(bytes)
        .map_err(|_| refuse(ErrorCode::InvalidRequest, "params are not UTF-8"))?;
    Ok((canonical, digest))
}

fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b).max(1)
}

impl<S: SessionStore> Service<S> {
    /// Events of held calls (every organization's: a subscriber filters by
    /// [`HitlEvent::organization`]).
    pub fn hitl_events(&self) -> tokio::sync::broadcast::Receiver<HitlEvent> {
        self.events.subscribe()
    }

    fn hitl_timeout_ns(&self) -> i64 {
        i64::try_from(self.config.limits.hitl_timeout.as_nanos()).unwrap_or(i64::MAX)
    }

    fn expires_at(&self, requested_at_ns: i64, decision: &HumanDecision) -> i64 {
        let undecided = matches!(
            decision,
            HumanDecision::Awaiting | HumanDecision::Defer | HumanDecision::Escalate
        );
        if !undecided || self.config.limits.hitl_timeout.is_zero() {
            return 0;
        }
        requested_at_ns.saturating_add(self.hitl_timeout_ns())
    }

    /// Write the session's held-call params (as this daemon knows them) to the store's
    /// note, for the other daemons sharing the store. Best effort: a failure is logged, and
    /// the other daemons then show the digest alone.
    async fn publish_held(&self, session_id: &str) {
        let held: Option<Vec<HeldParams>> = lock(&self.held)
            .get(session_id)
            .map(|calls| calls.values().cloned().collect());
        let Some(held) = held else { return };
        let Ok(bytes) = serde_json::to_vec(&held) else {
            return;
        };
        if let Err(e) = self.store.set_note(session_id, bytes).await {
            tracing::warn!(%session_id, error = %e, "a held call's params could not be shared");
        }
    }

    /// Take what another daemon sharing the store knows of the session's held call (its
    /// params, a modify's successor) into this daemon's memory, where this daemon has less.
    async fn refresh_held(&self, session_id: &str) {
        let Ok(Some(bytes)) = self.store.note(session_id).await else {
            return;
        };
        // The held calls, or (a daemon from before several held calls) one.
        let Ok(theirs) = serde_json::from_slice::<Vec<HeldParams>>(&bytes)
            .or_else(|_| serde_json::from_slice::<HeldParams>(&bytes).map(|one| vec![one]))
        else {
            tracing::warn!(%session_id, "a shared note that does not decode is ignored");
            return;
        };
        let mut held = lock(&self.held);
        let calls = held.entry(session_id.to_owned()).or_default();
        for t in theirs.into_iter().take(MAX_NOTE_CALLS) {
            let mine = calls.entry(t.call_number).or_insert_with(|| HeldParams {
                call_number: t.call_number,
                ..Default::default()
            });
            if mine.params_json.is_none() {
                mine.params_json = t.params_json;
            }
            if mine.successor_json.is_none() {
                mine.successor_json = t.successor_json;
            }
            if mine.note.is_none() {
                mine.note = t.note;
            }
        }
    }

    /// Before a modify is applied: keep its successor's params with the held call's, here
    /// and in the shared note. The held call is `call_number`, or the session's one
    /// undecided call; a modify that then fails leaves a successor nobody reads (only a
    /// `modify` outcome shows one).
    async fn keep_successor(
        &self,
        session_id: &str,
        call_number: Option<u64>,
        json: &str,
    ) -> Result<(), Refusal> {
        let Some(s) = self
            .store
            .get(session_id)
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
        else {
            return Ok(());
        };
        let Some(call_number) = call_number.or_else(|| {
            let mut open = s.state.transitions().filter(|p| is_undecided(p));
            match (open.next(), open.next()) {
                (Some(p), None) => Some(p.call_number),
                _ => None,
            }
        }) else {
            return Ok(());
        };
        if s.state.transition_of_call(call_number).is_none() {
            return Ok(());
        }
        self.refresh_held(session_id).await;
        held_call(&mut lock(&self.held), session_id, call_number, &s.state).successor_json =
            Some(json.to_owned());
        self.publish_held(session_id).await;
        Ok(())
    }

    /// A session's held calls that wait for a human (awaiting, deferred, escalated), as
    /// operators see them. A decided call (approve, reject, modify, expire) is not shown: it
    /// waits for its agent, not for a human, and cannot be decided again.
    fn pending_views(&self, s: &Session) -> Vec<sp1::HitlPending> {
        s.state
            .transitions()
            .filter(|p| is_undecided(p))
            .map(|p| self.pending_view(s, p))
            .collect()
    }

    /// Held call `p` of session `s` as operators see it.
    fn pending_view(&self, s: &Session, p: &PendingTransition) -> sp1::HitlPending {
        let held =
            known(&lock(&self.held), &s.meta.session_id, p).and_then(|h| h.params_json.clone());
        sp1::HitlPending {
            session_id: s.meta.session_id.clone(),
            agent_id: s.meta.agent_id.clone(),
            organization_id: s.meta.organization_id.clone(),
            transition: Some(convert::pending(
                p,
                self.expires_at(p.requested_at_ns, &p.decision),
            )),
            params_known: held.is_some(),
            params_json: held.unwrap_or_default(),
            budget_remaining_nanos: s.state.budget_remaining.0,
            held_explanation: self.held_explanation(s, p),
            purpose: self
                .activity
                .purpose(&s.meta.session_id, p.call_number)
                .unwrap_or_default(),
        }
    }

    /// Tell consoles a session's held call `call_number`, as it now stands (if it still
    /// waits for a human).
    pub(crate) async fn announce_held(
        &self,
        info: &SessionInfo,
        session_id: &str,
        call_number: u64,
    ) {
        let Ok(Some(s)) = self.store.get(session_id).await else {
            return;
        };
        self.refresh_held(session_id).await;
        match s
            .state
            .transition_of_call(call_number)
            .filter(|p| is_undecided(p))
        {
            Some(p) => {
                let view = self.pending_view(&s, p);
                let _ = self.events.send(HitlEvent::Held(Box::new(view)));
            }
            None => {
                tracing::debug!(org = %info.organization_id, %session_id, call_number, "nothing held to announce");
            }
        }
    }

    /// `hitl_list`: the held calls of `org`, for an operator of it.
    pub async fn hitl_list(
        &self,
        caller: &Caller,
        org: &str,
    ) -> Result<sp1::HitlListResponse, Refusal> {
        if !matches!(caller, Caller::Operator { organizations, .. } if organizations.iter().any(|o| o == org))
        {
            return Err(refuse(
                ErrorCode::AuthenticationFailed,
                "message authentication failed",
            ));
        }
        let sessions = self
            .store
            .pending_hitl(Some(org))
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        for s in &sessions {
            self.refresh_held(&s.meta.session_id).await;
        }
        Ok(sp1::HitlListResponse {
            pending: sessions
                .iter()
                .flat_map(|s| self.pending_views(s))
                .collect(),
        })
    }

    /// `hitl_decide`: an operator of the session's organization decides its held call. The
    /// operator id is the caller's when its credential names one, else the request's.
    /// `modify` takes the successor's params (`successor_params_json`, canonicalized here;
    /// its digest and, when not given, a nonce are the daemon's) or a successor nonce and
    /// digest.
    pub async fn hitl_decide(
        &self,
        caller: &Caller,
        r: sp1::HitlDecideRequest,
        now: i64,
    ) -> Result<sp1::HitlDecideResponse, Refusal> {
        let info = self.operated_session(caller, &r.session_id).await?;
        let operator_id = match caller {
            Caller::Operator {
                operator_id: Some(id),
                ..
            } => id.clone(),
            _ => r.operator_id.clone(),
        };
        if operator_id.trim().is_empty() || operator_id.len() > 256 {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                "operator_id must be 1 to 256 bytes",
            ));
        }
        let decision = HumanDecision::parse(&r.decision);
        let mut successor_json = None;
        let successor = match decision {
            HumanDecision::Modify if !r.successor_params_json.is_empty() => {
                let (canonical, digest) = canonical_params(&r.successor_params_json)?;
                successor_json = Some(canonical);
                Some(Successor {
                    nonce: if r.successor_nonce == 0 {
                        random_nonce()
                    } else {
                        r.successor_nonce
                    },
                    args_digest: digest,
                })
            }
            HumanDecision::Modify => {
                let digest = Digest::from_slice(&r.successor_args_digest).ok_or_else(|| {
                    refuse(
                        ErrorCode::HitlRefused,
                        "modify needs successor_params_json, or a successor_nonce and a 32-byte successor_args_digest",
                    )
                })?;
                Some(Successor {
                    nonce: r.successor_nonce,
                    args_digest: digest,
                })
            }
            _ => None,
        };
        let word = decision.as_str().to_owned();
        if r.note.len() > 1024 {
            return Err(refuse(ErrorCode::InvalidRequest, "note over 1024 bytes"));
        }
        let named = (r.call_number != 0).then_some(r.call_number);
        if let Some(json) = &successor_json {
            // The successor's params reach the shared note before the decision reaches
            // the shared state, so an agent waiting on another daemon never reads a
            // modify without them.
            self.keep_successor(&r.session_id, named, json).await?;
        }
        let operator = operator_id.clone();
        let note = r.note.clone();
        let held_map = &self.held;
        let successor_for_agent = successor_json.clone();
        let note_for_agent = (!r.note.is_empty()).then(|| r.note.clone());
        let (outcome, durable) = self
            .store
            .apply(&r.session_id, move |s: &mut Session| {
                match ops::human_decision(
                    s,
                    named,
                    decision.clone(),
                    successor,
                    &operator,
                    &note,
                    now,
                ) {
                    Ok(record) => {
                        // A modify's params are kept before the session's lock is released,
                        // so whoever reads the decision can read them too.
                        // (`keep_successor` kept them already; this covers a new call held
                        // between that and this lock.)
                        let mut held = lock(held_map);
                        let h =
                            held_call(&mut held, &s.meta.session_id, record.call_number, &s.state);
                        if let Some(json) = successor_for_agent.clone() {
                            h.successor_json = Some(json);
                        }
                        // The note is read by the agent with the decision, as the
                        // successor is (a later decision's replaces a defer's).
                        h.note.clone_from(&note_for_agent);
                        drop(held);
                        Change::Commit(
                            Ok((
                                s.state.transition_of_call(record.call_number).cloned(),
                                record.call_number,
                            )),
                            record.into(),
                        )
                    }
                    Err(e) => Change::Keep(Err(e)),
                }
            })
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?;
        let (pending, call_number) =
            outcome.map_err(|e| refuse(ErrorCode::HitlRefused, e.to_string()))?;
        let entry = durable
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(|| refuse(ErrorCode::DaemonUnavailable, "decision not journaled"))?;
        tracing::info!(session = %r.session_id, operator = %operator_id, decision = %word, "human decision recorded");
        if let Some(json) = &successor_json {
            // For the consoles' history: what the modify changed, while this daemon knows.
            let original = lock(&self.held)
                .get(&r.session_id)
                .and_then(|calls| calls.get(&call_number))
                .and_then(|h| h.params_json.clone());
            self.activity
                .keep_change(&r.session_id, call_number, original, json.clone());
        }
        if !r.note.is_empty() {
            // For an agent waiting on another daemon sharing the store.
            self.publish_held(&r.session_id).await;
        }
        if matches!(word.as_str(), "defer" | "escalate") {
            self.announce_held(&info, &r.session_id, call_number).await;
        } else {
            let _ = self.events.send(HitlEvent::Resolved {
                organization_id: info.organization_id.clone(),
                session_id: r.session_id.clone(),
                call_number,
                outcome: word,
                operator_id,
            });
        }
        Ok(sp1::HitlDecideResponse {
            session_id: r.session_id,
            transition: pending
                .as_ref()
                .map(|p| convert::pending(p, self.expires_at(p.requested_at_ns, &p.decision))),
            audit_entry_id: entry.entry_id.to_string(),
            successor_params_json: successor_json.unwrap_or_default(),
        })
    }

    /// `held_params`: the agent of a held call shows operators its params. Accepted only
    /// for the call held now, and only if their canonical SHA-256 is its args digest.
    pub async fn held_params(
        &self,
        caller: &Caller,
        r: sp1::HeldParams,
    ) -> Result<sp1::HeldParamsAck, Refusal> {
        let info = self.agent_session(caller, &r.session_id).await?;
        let (canonical, digest) = canonical_params(&r.params_json)?;
        let s = self
            .store
            .get(&r.session_id)
            .await
            .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
            .ok_or_else(|| not_found(&r.session_id))?;
        let Some(p) = s.state.transition_of_call(r.call_number) else {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                format!("call {} of `{}` is not held", r.call_number, r.session_id),
            ));
        };
        if p.original_args_digest != Some(digest) {
            return Err(refuse(
                ErrorCode::InvalidRequest,
                "params do not hash to the held call's args digest",
            ));
        }
        held_call(
            &mut lock(&self.held),
            &r.session_id,
            r.call_number,
            &s.state,
        )
        .params_json = Some(canonical);
        self.publish_held(&r.session_id).await;
        self.announce_held(&info, &r.session_id, r.call_number)
            .await;
        Ok(sp1::HeldParamsAck {
            session_id: r.session_id,
            call_number: r.call_number,
        })
    }

    /// The decision on a session's held call, as an agent waiting for it reads it; `None`
    /// while nobody has decided.
    fn outcome_of(&self, s: &Session, call_number: u64) -> Option<sp1::AwaitDecisionResponse> {
        let respond = |outcome: &str, pending: Option<&tollgate_core::PendingTransition>| {
            let (successor, note) = lock(&self.held)
                .get(&s.meta.session_id)
                .and_then(|calls| calls.get(&call_number))
                .map(|h| (h.successor_json.clone(), h.note.clone()))
                .unwrap_or_default();
            sp1::AwaitDecisionResponse {
                session_id: s.meta.session_id.clone(),
                call_number,
                outcome: outcome.to_owned(),
                transition: pending
                    .map(|p| convert::pending(p, self.expires_at(p.requested_at_ns, &p.decision))),
                successor_params_json: if outcome == "modify" {
                    successor.unwrap_or_default()
                } else {
                    String::new()
                },
                note: if pending.is_some() {
                    note.unwrap_or_default()
                } else {
                    String::new()
                },
            }
        };
        let Some(p) = s.state.transition_of_call(call_number) else {
            return Some(respond("none", None));
        };
        match p.decision {
            HumanDecision::Awaiting | HumanDecision::Defer | HumanDecision::Escalate => None,
            HumanDecision::Approve => Some(respond("approve", Some(p))),
            HumanDecision::Modify => Some(respond("modify", Some(p))),
            HumanDecision::Reject => Some(respond("reject", Some(p))),
            HumanDecision::Expire => Some(respond("expire", Some(p))),
            HumanDecision::Unknown(_) => Some(respond("reject", Some(p))),
        }
    }

    /// `await_decision`: wait, at most `timeout_ms` (capped by
    /// `limits.await_decision_max_secs`), for a human's decision on the session's held call
    /// `call_number`; `pending` if nobody decided by then.
    pub async fn await_decision(
        &self,
        caller: &Caller,
        r: sp1::AwaitDecisionRequest,
    ) -> Result<sp1::AwaitDecisionResponse, Refusal> {
        self.agent_session(caller, &r.session_id).await?;
        // Subscribe before reading, so no decision can fall between the two.
        let mut events = self.events.subscribe();
        let wait = Duration::from_millis(u64::from(r.timeout_ms))
            .min(self.config.limits.await_decision_max);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let s = self
                .store
                .get(&r.session_id)
                .await
                .map_err(|e| refuse(ErrorCode::DaemonUnavailable, e.to_string()))?
                .ok_or_else(|| not_found(&r.session_id))?;
            self.refresh_held(&r.session_id).await;
            if let Some(out) = self.outcome_of(&s, r.call_number) {
                return Ok(out);
            }
            // Wait for anything about this session, or the deadline. With a store shared
            // by several daemons, another daemon's operator may decide: no event reaches
            // this one, so re-read the state every `SHARED_STATE_POLL` too.
            let shared = !matches!(
                self.config.state.backend,
                crate::config::StateBackend::Embedded
            );
            let woke = tokio::time::timeout_at(deadline, async {
                loop {
                    let event = if shared {
                        match tokio::time::timeout(SHARED_STATE_POLL, events.recv()).await {
                            Ok(e) => e,
                            Err(_) => return true,
                        }
                    } else {
                        events.recv().await
                    };
                    match event {
                        Ok(HitlEvent::Resolved { session_id, .. })
                            if session_id == r.session_id =>
                        {
                            return true
                        }
                        Ok(_) => {}
                        // Missed events: re-read the state.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return true,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
                    }
                }
            })
            .await;
            if !matches!(woke, Ok(true)) {
                let p = s.state.transition_of_call(r.call_number);
                return Ok(sp1::AwaitDecisionResponse {
                    session_id: r.session_id,
                    call_number: r.call_number,
                    outcome: "pending".into(),
                    transition: p.map(|p| {
                        convert::pending(p, self.expires_at(p.requested_at_ns, &p.decision))
                    }),
                    successor_params_json: String::new(),
                    note: String::new(),
                });
            }
        }
    }

    /// Expire every held call nobody decided within `limits.hitl_timeout_secs`, each
    /// audited (a kind-6 entry, decision `expire`, operator `tollgate`) before consoles and
    /// waiting agents are told. Returns how many expired. The daemon calls this every
    /// second; it does nothing when the timeout is zero.
    pub async fn expire_overdue(&self, now: i64) -> usize {
        if self.config.limits.hitl_timeout.is_zero() {
            return 0;
        }
        let Ok(sessions) = self.store.pending_hitl(None).await else {
            return 0;
        };
        let timeout = self.hitl_timeout_ns();
        let mut expired = 0;
        let overdue: Vec<(Session, u64)> = sessions
            .into_iter()
            .flat_map(|s| {
                let calls: Vec<u64> = s
                    .state
                    .transitions()
                    .filter(|p| {
                        self.expires_at(p.requested_at_ns, &p.decision) != 0
                            && now.saturating_sub(p.requested_at_ns) >= timeout
                    })
                    .map(|p| p.call_number)
                    .collect();
                calls.into_iter().map(move |n| (s.clone(), n))
            })
            .collect();
        for (s, held) in overdue {
            let id = s.meta.session_id.clone();
            let applied = self
                .store
                .apply(&id, move |s: &mut Session| {
                    match ops::expire(s, Some(held), now) {
                        Ok(record) => Change::Commit(Some(record.call_number), record.into()),
                        Err(_) => Change::Keep(None),
                    }
                })
                .await;
            let Ok((Some(call_number), durable)) = applied else {
                continue;
            };
            if let Err(e) = durable.await {
                tracing::error!(session = %id, "expiry not durable: {e}");
                continue;
            }
            expired += 1;
            tracing::info!(session = %id, call_number, "held call expired");
            let _ = self.events.send(HitlEvent::Resolved {
                organization_id: s.meta.organization_id.clone(),
                session_id: id,
                call_number,
                outcome: "expire".into(),
                operator_id: ops::EXPIRY_OPERATOR.into(),
            });
        }
        expired
    }
}
