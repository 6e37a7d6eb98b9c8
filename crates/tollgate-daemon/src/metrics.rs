//! Prometheus metrics: process-wide counters, gauges and histograms in atomics, and their
//! text exposition (format 0.0.4), written by hand and served at `/metrics` by the control
//! plane (`crate::transport::control`).
//!
//! Each hook is one line where the thing happens: [`verdict`] and [`pre_exec_timer`] in the
//! service core, [`refusal`] where a transport answers with an `Error`, and
//! [`connection_opened`] where a transport accepts a connection. The gauges that describe
//! the store (held calls pending, sessions by status) and the audit writer's counters are
//! read when the page is rendered ([`render`]), not tracked on the way.
//!
//! What this module does **not** do: take a lock or allocate on a hot path (every hook is
//! a few relaxed atomic adds), or put anything a peer chose into a label: organizations,
//! agents, sessions, tools and operators never appear, so the page's size is fixed and it
//! leaks nothing. The one label not fixed in code is a shadow policy's id
//! ([`shadow`]), which comes from the operator's policy files and is bounded
//! ([`MAX_SHADOW_SERIES`]). The counters belong to the process (one daemon per process in
//! production; tests that run several daemons in one process see their sum).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use tollgate_core::{Reason, SessionStatus, Verdict};
use tollgate_proto::sp1::ErrorCode;
use tollgate_store::SessionStore;

use crate::service::Service;

const VERDICT_NAMES: [&str; 3] = ["allow", "deny", "hitl"];
/// Room for every [`Reason`] (24 today); a reason past it is counted as the last slot.
const REASON_SLOTS: usize = 32;
static VERDICTS: [[AtomicU64; REASON_SLOTS]; 3] =
    [const { [const { AtomicU64::new(0) }; REASON_SLOTS] }; 3];

/// Upper bounds of the pre_exec latency buckets, in seconds (and `+Inf` after them).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
static LATENCY_COUNTS: [AtomicU64; LATENCY_BUCKETS.len() + 1] =
    [const { AtomicU64::new(0) }; LATENCY_BUCKETS.len() + 1];
static LATENCY_SUM_NANOS: AtomicU64 = AtomicU64::new(0);

/// Error codes 0 to 15 (Appendix B's and Tollgate's are 1 to 12).
const CODE_SLOTS: usize = 16;
static REFUSALS: [AtomicU64; CODE_SLOTS] = [const { AtomicU64::new(0) }; CODE_SLOTS];

/// The transports connections are counted for; any other name counts as `other`.
pub const TRANSPORTS: [&str; 4] = ["socket", "grpc", "control", "other"];
static CONNECTIONS_TOTAL: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static CONNECTIONS_OPEN: [AtomicI64; 4] = [const { AtomicI64::new(0) }; 4];

/// The most shadow candidates `tollgate_policy_shadow_total` names (across reloads); the
/// evaluations of any further one are counted under `policy="_other"`.
pub const MAX_SHADOW_SERIES: usize = 256;
/// Shadow evaluations by candidate, enforced verdict and would-be verdict. Locked only for
/// verdicts that carry shadow notes (a set with shadow policies in force).
static SHADOW: std::sync::Mutex<std::collections::BTreeMap<String, [[u64; 3]; 3]>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

const fn verdict_row(v: Verdict) -> usize {
    match v {
        Verdict::Allow => 0,
        Verdict::Deny => 1,
        Verdict::Hitl => 2,
    }
}

/// Count the shadow evaluations of one verdict: each note's candidate (a `@shadow`
/// policy's id, or `*` for a set in shadow mode), with the verdict enforced and the one
/// it would have had. Names come from the operator's policy files, never from a peer.
pub fn shadow(enforced: Verdict, notes: &[tollgate_audit::ShadowNote]) {
    if notes.is_empty() {
        return;
    }
    let mut map = SHADOW
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for n in notes {
        let key = if map.contains_key(&n.name) || map.len() < MAX_SHADOW_SERIES {
            n.name.clone()
        } else {
            "_other".to_owned()
        };
        let cell = map.entry(key).or_insert([[0; 3]; 3]);
        if let Some(c) = cell
            .get_mut(verdict_row(enforced))
            .and_then(|r| r.get_mut(verdict_row(n.verdict)))
        {
            *c += 1;
        }
    }
}

/// Count a verdict the core returned, by verdict and reason.
pub fn verdict(v: Verdict, reason: Reason) {
    let row = match v {
        Verdict::Allow => 0,
        Verdict::Deny => 1,
        Verdict::Hitl => 2,
    };
    let slot = (reason as usize).min(REASON_SLOTS - 1);
    if let Some(c) = VERDICTS.get(row).and_then(|r| r.get(slot)) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Times one pre_exec, from its creation to its drop, into the latency histogram.
#[derive(Debug)]
#[must_use = "the timer records when it is dropped"]
pub struct PreExecTimer(Instant);

/// Start timing a pre_exec: hold the result until the request is answered.
pub fn pre_exec_timer() -> PreExecTimer {
    PreExecTimer(Instant::now())
}

impl Drop for PreExecTimer {
    fn drop(&mut self) {
        let elapsed = self.0.elapsed();
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        if let Some(c) = LATENCY_COUNTS.get(bucket) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        LATENCY_SUM_NANOS.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Count an `Error` a transport sent, by its code.
pub fn refusal(code: ErrorCode) {
    let slot = usize::try_from(code as i32)
        .unwrap_or(0)
        .min(CODE_SLOTS - 1);
    if let Some(c) = REFUSALS.get(slot) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Holds one open connection in `tollgate_connections_open`; dropping it closes it.
#[derive(Debug)]
#[must_use = "the connection counts as open until this is dropped"]
pub struct OpenConnection(usize);

static AUDIT_FAILURES: AtomicU64 = AtomicU64::new(0);
static AUDIT_RECOVERIES: AtomicU64 = AtomicU64::new(0);
static AUDIT_REFUSING: AtomicI64 = AtomicI64::new(0);

/// The audit log started refusing entries (a failure to write, sync or rotate).
pub fn audit_failed() {
    AUDIT_FAILURES.fetch_add(1, Ordering::Relaxed);
    AUDIT_REFUSING.store(1, Ordering::Relaxed);
}

/// The audit log recovered and takes entries again.
pub fn audit_recovered() {
    AUDIT_RECOVERIES.fetch_add(1, Ordering::Relaxed);
    AUDIT_REFUSING.store(0, Ordering::Relaxed);
}

/// Count a connection a transport accepted: `"socket"`, `"grpc"` or `"control"` (any other
/// name counts as `"other"`). Keep the result for as long as the connection is open.
///
/// For a transport's author: call it once per accepted connection (a gRPC binding wraps
/// its incoming stream, or counts per stream if that is all it sees), before anything is
/// read from the peer, and drop the guard when the connection ends.
pub fn connection_opened(transport: &str) -> OpenConnection {
    let i = TRANSPORTS
        .iter()
        .position(|t| *t == transport)
        .unwrap_or(TRANSPORTS.len() - 1);
    if let Some(c) = CONNECTIONS_TOTAL.get(i) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(c) = CONNECTIONS_OPEN.get(i) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    OpenConnection(i)
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if let Some(c) = CONNECTIONS_OPEN.get(self.0) {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn seconds(nanos: u64) -> f64 {
    // Exact to the nanosecond for sums below 2^53 ns (104 days of waiting).
    #[allow(clippy::cast_precision_loss)]
    let s = nanos as f64 / 1e9;
    s
}

/// What the store holds now, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreGauges {
    /// Sessions by status: active, paused, terminated, stale.
    pub sessions: [u64; 4],
    /// Sessions with a held call.
    pub hitl_pending: u64,
}

/// Read the store's gauges (a scan of every live session).
pub async fn store_gauges<S: SessionStore>(service: &Service<S>, now: i64) -> StoreGauges {
    let mut g = StoreGauges::default();
    let Ok(sessions) = service.store().list(None).await else {
        return g;
    };
    let stale_after = service.stale_after_ns();
    for s in &sessions {
        let status = if now.saturating_sub(s.last_heartbeat_ns) > stale_after {
            SessionStatus::Stale
        } else {
            s.state.status
        };
        let i = match status {
            SessionStatus::Active => 0,
            SessionStatus::Paused => 1,
            SessionStatus::Terminated => 2,
            SessionStatus::Stale => 3,
        };
        if let Some(n) = g.sessions.get_mut(i) {
            *n += 1;
        }
        if s.state.pending.is_some() {
            g.hitl_pending += 1;
        }
    }
    g
}

/// The whole page for `service`: the process's counters, its audit writer's, its store's
/// gauges.
pub async fn render<S: SessionStore>(service: &Service<S>) -> String {
    let gauges = store_gauges(service, service.now()).await;
    render_with(service.audit().stats(), gauges)
}

/// The page, from the audit writer's counters and the store's gauges.
pub fn render_with(audit: tollgate_audit::Stats, store: StoreGauges) -> String {
    let mut out = String::with_capacity(16 * 1024);
    header(
        &mut out,
        "tollgate_build_info",
        "gauge",
        "The daemon's version (always 1).",
    );
    let _ = writeln!(
        out,
        "tollgate_build_info{{version=\"{}\"}} 1",
        crate::service::DAEMON_VERSION
    );

    header(
        &mut out,
        "tollgate_verdicts_total",
        "counter",
        "pre_exec verdicts, by verdict and SP/1.0.1 reason.",
    );
    for (row, name) in VERDICTS.iter().zip(VERDICT_NAMES) {
        for reason in Reason::ALL {
            let n = row
                .get((*reason as usize).min(REASON_SLOTS - 1))
                .map_or(0, load);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "tollgate_verdicts_total{{verdict=\"{name}\",reason=\"{}\"}} {n}",
                    reason.as_str()
                );
            }
        }
    }

    header(
        &mut out,
        "tollgate_policy_shadow_total",
        "counter",
        "Shadow policy evaluations, by candidate (a @shadow policy's id, or * for a set in shadow mode), the verdict enforced, the verdict it would have given, and whether the two agree.",
    );
    {
        let map = SHADOW
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (policy, rows) in map.iter() {
            for (enforced, row) in VERDICT_NAMES.iter().zip(rows) {
                for (would, n) in VERDICT_NAMES.iter().zip(row) {
                    if *n > 0 {
                        let _ = writeln!(
                            out,
                            "tollgate_policy_shadow_total{{policy=\"{policy}\",enforced=\"{enforced}\",shadow=\"{would}\",agree=\"{}\"}} {n}",
                            enforced == would
                        );
                    }
                }
            }
        }
    }

    header(
        &mut out,
        "tollgate_pre_exec_duration_seconds",
        "histogram",
        "pre_exec handling time in the service core, until the verdict's audit entry is durable.",
    );
    let mut cumulative = 0u64;
    for (i, c) in LATENCY_COUNTS.iter().enumerate() {
        cumulative += load(c);
        let le = LATENCY_BUCKETS
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
        let _ = writeln!(
            out,
            "tollgate_pre_exec_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "tollgate_pre_exec_duration_seconds_sum {}",
        seconds(load(&LATENCY_SUM_NANOS))
    );
    let _ = writeln!(out, "tollgate_pre_exec_duration_seconds_count {cumulative}");

    header(
        &mut out,
        "tollgate_refusals_total",
        "counter",
        "Error replies sent, by SP/1.0 error code (Appendix B and Tollgate's).",
    );
    for (i, c) in REFUSALS.iter().enumerate() {
        let n = load(c);
        let Some(code) = i32::try_from(i)
            .ok()
            .and_then(|v| ErrorCode::try_from(v).ok())
        else {
            continue;
        };
        if code == ErrorCode::Unspecified && n == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "tollgate_refusals_total{{code=\"{}\"}} {n}",
            code.as_str_name()
        );
    }

    header(
        &mut out,
        "tollgate_connections_total",
        "counter",
        "Connections accepted, by transport.",
    );
    for (t, c) in TRANSPORTS.iter().zip(&CONNECTIONS_TOTAL) {
        let _ = writeln!(
            out,
            "tollgate_connections_total{{transport=\"{t}\"}} {}",
            load(c)
        );
    }
    header(
        &mut out,
        "tollgate_connections_open",
        "gauge",
        "Connections open now, by transport.",
    );
    for (t, c) in TRANSPORTS.iter().zip(&CONNECTIONS_OPEN) {
        let _ = writeln!(
            out,
            "tollgate_connections_open{{transport=\"{t}\"}} {}",
            c.load(Ordering::Relaxed)
        );
    }

    header(
        &mut out,
        "tollgate_audit_entries_total",
        "counter",
        "Audit entries written.",
    );
    let _ = writeln!(out, "tollgate_audit_entries_total {}", audit.entries);
    header(
        &mut out,
        "tollgate_audit_batch_entries",
        "summary",
        "Entries per audit write (group commit): sum = entries, count = writes.",
    );
    let _ = writeln!(out, "tollgate_audit_batch_entries_sum {}", audit.entries);
    let _ = writeln!(out, "tollgate_audit_batch_entries_count {}", audit.batches);
    header(
        &mut out,
        "tollgate_audit_fsync_seconds",
        "summary",
        "Time in fsync of the audit log: sum = seconds, count = fsync calls.",
    );
    let _ = writeln!(
        out,
        "tollgate_audit_fsync_seconds_sum {}",
        seconds(audit.sync_nanos)
    );
    let _ = writeln!(out, "tollgate_audit_fsync_seconds_count {}", audit.syncs);
    header(
        &mut out,
        "tollgate_audit_refusing",
        "gauge",
        "1 while the audit log refuses entries after a failure (every change is refused), else 0.",
    );
    let _ = writeln!(
        out,
        "tollgate_audit_refusing {}",
        AUDIT_REFUSING.load(Ordering::Relaxed)
    );
    header(
        &mut out,
        "tollgate_audit_failures_total",
        "counter",
        "Times the audit log started refusing entries (a failure to write, sync or rotate).",
    );
    let _ = writeln!(
        out,
        "tollgate_audit_failures_total {}",
        AUDIT_FAILURES.load(Ordering::Relaxed)
    );
    header(
        &mut out,
        "tollgate_audit_recoveries_total",
        "counter",
        "Times the audit log recovered by itself after a failure.",
    );
    let _ = writeln!(
        out,
        "tollgate_audit_recoveries_total {}",
        AUDIT_RECOVERIES.load(Ordering::Relaxed)
    );

    header(
        &mut out,
        "tollgate_hitl_pending",
        "gauge",
        "Sessions with a held call waiting for (or deferred by) a human.",
    );
    let _ = writeln!(out, "tollgate_hitl_pending {}", store.hitl_pending);
    header(
        &mut out,
        "tollgate_sessions",
        "gauge",
        "Live sessions, by status (stale: missed its heartbeats, as of now).",
    );
    for (name, n) in ["active", "paused", "terminated", "stale"]
        .iter()
        .zip(store.sessions)
    {
        let _ = writeln!(out, "tollgate_sessions{{status=\"{name}\"}} {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `name` (with its labels, exactly as written) on `page`.
    pub(crate) fn sample(page: &str, name: &str) -> Option<f64> {
        page.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn every_reason_fits_a_slot() {
        assert!(Reason::ALL.len() <= REASON_SLOTS);
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }

    #[test]
    fn hooks_move_their_samples() {
        let before = render_with(tollgate_audit::Stats::default(), StoreGauges::default());
        verdict(Verdict::Deny, Reason::MaxRepeatExceeded);
        refusal(ErrorCode::SessionStale);
        drop(pre_exec_timer());
        let open = connection_opened("control");
        let after = render_with(
            tollgate_audit::Stats {
                entries: 10,
                batches: 4,
                syncs: 4,
                sync_nanos: 2_000_000,
            },
            StoreGauges {
                sessions: [3, 1, 0, 2],
                hitl_pending: 1,
            },
        );
        let moved =
            |name: &str| sample(&after, name).unwrap_or(0.0) - sample(&before, name).unwrap_or(0.0);
        assert!(
            moved("tollgate_verdicts_total{verdict=\"deny\",reason=\"max_repeat_exceeded\"}")
                >= 1.0
        );
        assert!(moved("tollgate_refusals_total{code=\"SESSION_STALE\"}") >= 1.0);
        assert!(moved("tollgate_pre_exec_duration_seconds_count") >= 1.0);
        assert!(moved("tollgate_pre_exec_duration_seconds_bucket{le=\"+Inf\"}") >= 1.0);
        assert!(moved("tollgate_connections_total{transport=\"control\"}") >= 1.0);
        assert_eq!(
            sample(&after, "tollgate_audit_batch_entries_sum"),
            Some(10.0)
        );
        assert_eq!(
            sample(&after, "tollgate_audit_batch_entries_count"),
            Some(4.0)
        );
        assert_eq!(
            sample(&after, "tollgate_audit_fsync_seconds_sum"),
            Some(0.002)
        );
        assert_eq!(
            sample(&after, "tollgate_sessions{status=\"stale\"}"),
            Some(2.0)
        );
        assert_eq!(sample(&after, "tollgate_hitl_pending"), Some(1.0));
        drop(open);
        // Unknown transports are `other`.
        let _o = connection_opened("carrier-pigeon");
        let page = render_with(tollgate_audit::Stats::default(), StoreGauges::default());
        assert!(sample(&page, "tollgate_connections_total{transport=\"other\"}").unwrap() >= 1.0);
    }

    /// Every line is a comment or `name{labels} value`, and every family is declared once.
    #[test]
    fn the_page_is_well_formed() {
        let page = render_with(tollgate_audit::Stats::default(), StoreGauges::default());
        let mut types = std::collections::HashSet::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                assert!(
                    types.insert(rest.split(' ').next().unwrap().to_owned()),
                    "{line}"
                );
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (name, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
            let family = name.split('{').next().unwrap();
            assert!(
                types.iter().any(|t| family.starts_with(t.as_str())),
                "{line} has no TYPE"
            );
        }
    }
}
