//! Between the core's types and the wire's.

use tollgate_core::{
    BudgetScope, DenyReason, Digest, GuardConfig, HitlMode, Money, PendingTransition, SessionState,
    SessionStatus, Settlement, Verdict,
};
use tollgate_proto::sp1;

/// The wire verdict. (Zero, UNSPECIFIED, is never sent.)
pub fn verdict(v: Verdict) -> sp1::Verdict {
    match v {
        Verdict::Allow => sp1::Verdict::Allow,
        Verdict::Deny => sp1::Verdict::Deny,
        Verdict::Hitl => sp1::Verdict::Hitl,
    }
}

/// The wire deny reason.
pub fn deny_reason(d: Option<DenyReason>) -> sp1::DenyReason {
    match d {
        None => sp1::DenyReason::Unspecified,
        Some(DenyReason::CircuitOpen) => sp1::DenyReason::CircuitOpen,
        Some(DenyReason::BudgetExhausted) => sp1::DenyReason::BudgetExhausted,
        Some(DenyReason::MaxRepeatExceeded) => sp1::DenyReason::MaxRepeatExceeded,
        Some(DenyReason::WindowExceeded) => sp1::DenyReason::WindowExceeded,
        Some(DenyReason::GlobalLimit) => sp1::DenyReason::GlobalLimit,
        Some(DenyReason::PolicyViolation) => sp1::DenyReason::PolicyViolation,
        Some(DenyReason::AuthFailed) => sp1::DenyReason::AuthFailed,
        Some(DenyReason::Timeout) => sp1::DenyReason::Timeout,
    }
}

/// The wire session status.
pub fn status(s: SessionStatus) -> sp1::SessionStatus {
    match s {
        SessionStatus::Active => sp1::SessionStatus::Active,
        SessionStatus::Paused => sp1::SessionStatus::Paused,
        SessionStatus::Terminated => sp1::SessionStatus::Terminated,
        SessionStatus::Stale => sp1::SessionStatus::Stale,
    }
}

/// The wire guard configuration (dollars as floats for the spec's fields, exact nanos
/// beside them).
pub fn guard(g: &GuardConfig) -> sp1::GuardConfig {
    sp1::GuardConfig {
        budget_usd: g.budget.to_usd(),
        budget_scope: match g.budget_scope {
            BudgetScope::PerSession => sp1::BudgetScope::PerSession,
            BudgetScope::PerAgent => sp1::BudgetScope::PerAgent,
            BudgetScope::PerOrganization => sp1::BudgetScope::PerOrganization,
        } as i32,
        max_repeat_calls: g.max_repeat_calls,
        error_amplification: g.error_amplification,
        timeout_seconds: g.timeout_seconds,
        window_duration_s: g.window_duration_s,
        window_max_calls: g.window_max_calls,
        max_total_calls: u32::try_from(g.max_total_calls).unwrap_or(u32::MAX),
        probabilistic_deny: g.probabilistic_deny,
        deny_jitter_ratio: g.deny_jitter_ratio.to_f64(),
        hitl_mode: match g.hitl_mode {
            HitlMode::Never => sp1::HitlMode::HitlNever,
            HitlMode::OnDeny => sp1::HitlMode::HitlOnDeny,
            HitlMode::OnThreshold => sp1::HitlMode::HitlOnBudgetThreshold,
            HitlMode::Always => sp1::HitlMode::HitlAlways,
        } as i32,
        hitl_budget_threshold: g.hitl_budget_threshold.to_f64(),
        parent_guard_id: g.parent_guard_id.clone().unwrap_or_default(),
        budget_nanos: g.budget.0,
        settlement: match g.settlement {
            Settlement::Conservative => sp1::Settlement::Conservative,
            Settlement::Actual => sp1::Settlement::Actual,
        } as i32,
    }
}

fn digest_bytes(d: Option<Digest>) -> Vec<u8> {
    d.map(|d| d.0.to_vec()).unwrap_or_default()
}

/// The wire pending transition, with the held call's own call number. `expires_at_ns` is
/// when an undecided transition expires (0: never); the caller computes it.
pub fn pending(p: &PendingTransition, expires_at_ns: i64) -> sp1::PendingTransition {
    sp1::PendingTransition {
        decision: p.decision.as_str().to_owned(),
        original_nonce: p.original_nonce.unwrap_or(0),
        original_args_digest: digest_bytes(p.original_args_digest),
        successor_nonce: p.successor_nonce.unwrap_or(0),
        successor_args_digest: digest_bytes(p.successor_args_digest),
        terminal_status: p.terminal_status.as_str().to_owned(),
        tool_name: p.tool_name.clone().unwrap_or_default(),
        requested_at_ns: p.requested_at_ns,
        call_number: p.call_number,
        held_reason: p
            .held_reason
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        estimated_cost_nanos: p.estimated_cost.0,
        operator_id: p.operator_id.clone().unwrap_or_default(),
        expires_at_ns,
    }
}

/// Identity fields for [`session_state`].
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    /// Session id.
    pub session_id: &'a str,
    /// Agent id.
    pub agent_id: &'a str,
    /// Organization id.
    pub organization_id: &'a str,
}

/// The wire session state.
pub fn session_state(
    id: Identity<'_>,
    s: &SessionState,
    config: &GuardConfig,
    last_call_number: u64,
) -> sp1::SessionState {
    let usd = |m: Money| m.to_usd();
    sp1::SessionState {
        session_id: id.session_id.to_owned(),
        agent_id: id.agent_id.to_owned(),
        organization_id: id.organization_id.to_owned(),
        status: status(s.status) as i32,
        budget_initial_usd: usd(s.budget_initial),
        budget_remaining_usd: usd(s.budget_remaining),
        budget_spent_usd: usd(s.budget_spent),
        budget_initial_nanos: s.budget_initial.0,
        budget_remaining_nanos: s.budget_remaining.0,
        budget_spent_nanos: s.budget_spent.0,
        total_calls: s.total_calls,
        repeat_counts: s
            .repeat_counts
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        window_counts: s
            .window_counts
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        circuit_tripped: s.circuit_tripped,
        circuit_trip_reason: s
            .circuit_trip_reason
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        circuit_tripped_at_ns: s.circuit_tripped_at_ns,
        window_start_ns: s.window_start_ns,
        window_duration_s: config.window_duration_s,
        window_max_calls: config.window_max_calls,
        last_tool_name: s.last_tool_name.clone().unwrap_or_default(),
        last_tool_params_hash: digest_bytes(s.last_params_hash),
        last_activity_ns: s.last_activity_ns,
        metadata: Default::default(),
        last_call_number,
        pending_transition: s.pending.as_ref().map(|p| pending(p, 0)),
        started_at_ns: s.started_at_ns,
    }
}
