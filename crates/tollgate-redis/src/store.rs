//! [`RedisStore`]: the [`SessionStore`] over Redis.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, Value};
use tokio::sync::{mpsc, Mutex as AsyncMutex, OwnedMutexGuard};
use tokio::task::JoinHandle;
use tollgate_audit::{Appended, SessionEvent, WriteError};
use tollgate_core::{SessionState, UnixNanos};
use tollgate_store::{check_id, MAX_ID_BYTES};
use tollgate_store::{
    Arbiter, Budget, BudgetKey, Change, Durable, Journal, Session, SessionStore, Settled,
    StoreError, MAX_NOTE_BYTES,
};

use crate::cas::{
    after_done, after_join, budget_from_fields, check_markers, confirm_commands, dips_into_holds,
    hold_field, orphan_only_fields, plan_commit, plan_open, plan_revert, settle_needs_budget,
    settling_parts, settling_value, view_from_fields, void_budget, Bounds, CasReply, CasRequest,
    ConfirmCommand, Fields, Holds, MarkerAction, Planned, View, MAX_FIELDS,
};
use crate::keys::Keys;
use crate::script::{keys_and_args, settle_keys_and_args, SettleRequest, CAS_LUA};

/// How a [`RedisStore`] reaches Redis and behaves in a fleet.
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` (TLS, ring provider).
    pub url: String,
    /// Prefix of every key (default `tollgate`); no `{`, `}` or control characters.
    pub key_prefix: String,
    /// Deadline of every Redis command, and of an `apply` waiting for another daemon's
    /// unconfirmed change (default 2 s). Past it: [`StoreError::Backend`].
    pub command_timeout: Duration,
    /// How long an ended (TERMINATED) session's hash is kept (default 24 h).
    pub session_ttl: Duration,
    /// How old an unconfirmed change must be before another daemon settles it (default
    /// 10 s). Longer than any journal commit can take.
    pub grace: Duration,
    /// This daemon's id: random per process start ([`RedisOptions::new`]).
    pub daemon_id: String,
    /// How often the sweeper settles old unconfirmed changes (default 5 s).
    pub sweep_interval: Duration,
    /// CAS attempts on version conflicts before [`StoreError::Backend`] "contention"
    /// (default 64).
    pub max_retries: u32,
    /// The largest session record decoded (default 1 MiB).
    pub max_blob_bytes: usize,
    /// For `rediss://`: the certificate authorities (PEM) that Redis's certificate must
    /// chain to, instead of the system's roots. `None` (default): the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a password.
        f.debug_struct("RedisOptions")
            .field("url", &redact(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("command_timeout", &self.command_timeout)
            .field("session_ttl", &self.session_ttl)
            .field("grace", &self.grace)
            .field("daemon_id", &self.daemon_id)
            .field("sweep_interval", &self.sweep_interval)
            .field("max_retries", &self.max_retries)
            .field("max_blob_bytes", &self.max_blob_bytes)
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            format!(
                "{}://***{}",
                url.get(..s).unwrap_or(""),
                url.get(at..).unwrap_or("")
            )
        }
        _ => url.to_owned(),
    }
}

impl RedisOptions {
    /// Defaults for `url`, with a fresh random daemon id.
    pub fn new(url: impl Into<String>) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            key_prefix: "tollgate".to_owned(),
            command_timeout: Duration::from_secs(2),
            session_ttl: Duration::from_secs(24 * 3600),
            grace: Duration::from_secs(10),
            daemon_id: random_daemon_id(),
            sweep_interval: Duration::from_secs(5),
            max_retries: 64,
            max_blob_bytes: 1 << 20,
            ca_pem: None,
        }
    }
}

/// The client for `settings.url`: with `ca_pem`, TLS that trusts exactly those authorities
/// (the URL must then be `rediss://`).
fn open_client(settings: &RedisOptions) -> Result<redis::Client, String> {
    match &settings.ca_pem {
        None => redis::Client::open(settings.url.as_str()).map_err(|e| e.to_string()),
        Some(_) if !settings.url.starts_with("rediss://") => {
            Err("a CA certificate is for TLS: the url must be rediss://".to_owned())
        }
        Some(pem) => redis::Client::build_with_tls(
            settings.url.as_str(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        )
        .map_err(|e| e.to_string()),
    }
}

/// A random daemon id (16 hex digits).
pub fn random_daemon_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No randomness: fall back on time and pid (still distinct per start).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        #[allow(clippy::cast_possible_truncation)]
        let v = (t as u64) ^ u64::from(std::process::id()).rotate_left(32);
        b = v.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Redis's persistence settings, from `CONFIG GET` (or `INFO persistence` where CONFIG
/// is disabled: `appendfsync` is then `unknown`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerDurability {
    /// `yes` or `no`.
    pub appendonly: String,
    /// `always`, `everysec`, `no` or `unknown`.
    pub appendfsync: String,
}

impl ServerDurability {
    /// Whether no acknowledged write can be lost on a Redis crash (AOF, fsync always).
    pub fn is_strict(&self) -> bool {
        self.appendonly == "yes" && self.appendfsync == "always"
    }
}

/// Counters for the bench and the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RedisStats {
    /// Round trips on the path of a call (`create`, `apply`, `get`, …): one pipeline or
    /// command each.
    pub round_trips: u64,
    /// Commands in them.
    pub commands: u64,
    /// Round trips of the background tasks (confirmer, sweeper).
    pub background_round_trips: u64,
    /// CAS attempts that found a version changed.
    pub conflicts: u64,
    /// Markers settled through the arbiter (entry or void).
    pub settled: u64,
    /// Of which voided (state reverted).
    pub voided: u64,
}

#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    commands: AtomicU64,
    background: AtomicU64,
    conflicts: AtomicU64,
    settled: AtomicU64,
    voided: AtomicU64,
}

/// One session's cache entry, behind its async lock.
#[derive(Debug, Default)]
struct Slot {
    group: Option<String>,
    view: Option<View>,
}

/// A daemon's copy of a shared budget from its own last write: version, amounts, holds.
type BudgetCache = Option<(u64, Budget, Holds)>;

enum Confirm {
    /// A marker whose entry committed: HDEL it and ZREM its index member (unless the
    /// session's next write dropped both already).
    Marker {
        /// The session and the change.
        id: String,
        seq: u64,
        session_key: String,
        member: String,
        /// The budget hash and the change's hold on it (a refund), if any.
        hold: Option<(String, String)>,
        /// The change ended the session: its hash's expiry (ms), set now.
        expire: Option<u64>,
        /// The record field holding the record before the change (empty: none).
        prev_record: String,
    },
    /// Just the index member (the marker is gone).
    Index { member: String },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Inner {
    conn: ConnectionManager,
    opts: RedisOptions,
    keys: Keys,
    sha: String,
    journal: Arc<dyn Journal>,
    arbiter: Arc<dyn Arbiter>,
    sessions: Mutex<HashMap<String, Arc<AsyncMutex<Slot>>>>,
    budgets: Mutex<HashMap<String, Arc<AsyncMutex<BudgetCache>>>>,
    in_flight: Mutex<HashMap<String, BTreeSet<u64>>>,
    confirmed: Mutex<HashMap<String, u64>>,
    confirm_tx: mpsc::UnboundedSender<Confirm>,
    counters: Counters,
    closed: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// Session state in Redis, shared by a fleet of daemons. See the crate docs.
#[derive(Debug)]
pub struct RedisStore {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn backend(op: &'static str, message: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        op,
        message: message.to_string(),
    }
}

fn corrupt(reason: &str) -> StoreError {
    StoreError::Corrupt {
        key: "redis".to_owned(),
        reason: reason.to_owned(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A hash from a reply (RESP2 flat array or RESP3 map), bounded.
fn fields_of(v: Value, max_value: usize) -> Result<Fields, StoreError> {
    let pairs: Vec<(Value, Value)> = match v {
        Value::Nil => return Ok(Fields::new()),
        Value::Array(items) => {
            if items.len() > 2 * MAX_FIELDS || items.len() % 2 != 0 {
                return Err(corrupt("hash reply has a bad length"));
            }
            let mut it = items.into_iter();
            let mut out = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(pairs) => {
            if pairs.len() > MAX_FIELDS {
                return Err(corrupt("hash reply has too many fields"));
            }
            pairs
        }
        _ => return Err(corrupt("hash reply is not a hash")),
    };
    let mut f = Fields::new();
    for (k, v) in pairs {
        let k = bytes_of(k, 256)?;
        let k = String::from_utf8(k).map_err(|_| corrupt("field name is not UTF-8"))?;
        f.insert(k, bytes_of(v, max_value)?);
    }
    Ok(f)
}

fn bytes_of(v: Value, max: usize) -> Result<Vec<u8>, StoreError> {
    let b = match v {
        Value::BulkString(b) => b,
        Value::SimpleString(s) => s.into_bytes(),
        Value::Int(i) => i.to_string().into_bytes(),
        _ => return Err(corrupt("expected a string")),
    };
    if b.len() > max {
        return Err(corrupt("value too large"));
    }
    Ok(b)
}

fn u64_of(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) => u64::try_from(*i).map_err(|_| corrupt("negative version")),
        _ => Err(corrupt("expected an integer")),
    }
}

fn cas_reply(v: Value, max_value: usize) -> Result<CasReply, StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt("script reply is not an array"));
    };
    let mut it = items.into_iter();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(Value::Int(1)), Some(sv), Some(bv), None) => Ok(CasReply::Done {
            sv: u64_of(&sv)?,
            bv: u64_of(&bv)?,
        }),
        (Some(Value::Int(0)), Some(s), Some(b), None) => Ok(CasReply::Conflict {
            session: fields_of(s, max_value)?,
            budget: fields_of(b, max_value)?,
        }),
        (Some(Value::Int(4)), None, None, None) => Ok(CasReply::Unstaged),
        (Some(Value::Int(2)), Some(sv), Some(Value::Int(created)), Some(b))
            if it.next().is_none() =>
        {
            Ok(CasReply::Joined {
                sv: u64_of(&sv)?,
                created: created == 1,
                budget: fields_of(b, max_value)?,
            })
        }
        _ => Err(corrupt("script reply has an unknown shape")),
    }
}

/// A write whose staged record was gone when its script ran: nothing was written, and
/// the call fails closed as on any failed write.
fn unstaged(op: &'static str) -> StoreError {
    backend(
        op,
        "the write's staged record was not in Redis when its script ran (held up and swept): nothing was written",
    )
}

/// What a committed change's critical section returns.
enum Written {
    /// Written; the session as written is the slot's view (cloned by `create` only: a
    /// decision's caller does not need it, and its nonce window is most of its size).
    Done(Durable),
    Conflict,
}

impl Inner {
    fn bounds(&self) -> Bounds {
        Bounds {
            max_blob_bytes: self.opts.max_blob_bytes,
        }
    }

    fn max_value(&self) -> usize {
        self.opts
            .max_blob_bytes
            .saturating_mul(2)
            .saturating_add(8192)
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    /// Send one pipeline (one round trip) within the command deadline.
    async fn send(
        &self,
        pipe: &redis::Pipeline,
        n: usize,
        background: bool,
        op: &'static str,
    ) -> Result<Vec<Value>, redis::RedisError> {
        if background {
            self.counters.background.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            self.counters
                .commands
                .fetch_add(u64::try_from(n).unwrap_or(0), Ordering::Relaxed);
        }
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.opts.command_timeout, pipe.query_async(&mut conn)).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from((
                ErrorKind::IoError,
                "timed out",
                format!("{op}: no answer within {:?}", self.opts.command_timeout),
            ))),
        }
    }

    async fn send_store(
        &self,
        pipe: &redis::Pipeline,
        n: usize,
        op: &'static str,
    ) -> Result<Vec<Value>, StoreError> {
        self.send(pipe, n, false, op)
            .await
            .map_err(|e| backend(op, e))
    }

    /// The CAS script, pipelined after `pre` (index writes): one round trip; on NOSCRIPT
    /// the script is loaded and the pipeline sent again.
    async fn cas(
        &self,
        pre: &[redis::Cmd],
        req: &CasRequest,
        op: &'static str,
    ) -> Result<CasReply, StoreError> {
        let (keys, args) = keys_and_args(req);
        let mut pipe = redis::pipe();
        for c in pre {
            pipe.add_command(c.clone()).ignore();
        }
        // The record, staged into its own field by a plain write: it never passes through
        // Lua (docs/redis.md, "Record fields").
        pipe.cmd("HSET")
            .arg(&req.session_key)
            .arg(&req.record_field)
            .arg(req.session_blob.as_slice())
            .ignore();
        let mut eval = redis::cmd("EVALSHA");
        eval.arg(&self.sha).arg(keys.len()).arg(&keys);
        for a in &args {
            eval.arg(a.as_slice());
        }
        pipe.add_command(eval);
        let n = pre.len() + 2;
        let mut reply = self.send(&pipe, n, false, op).await;
        if let Err(e) = &reply {
            if e.kind() == ErrorKind::NoScriptError {
                let mut load = redis::pipe();
                load.cmd("SCRIPT").arg("LOAD").arg(CAS_LUA);
                self.send_store(&load, 1, "script load").await?;
                reply = self.send(&pipe, n, false, op).await;
            }
        }
        let mut values = reply.map_err(|e| backend(op, e))?;
        let last = values
            .pop()
            .ok_or_else(|| corrupt("empty pipeline reply"))?;
        let out = cas_reply(last, self.max_value())?;
        if matches!(out, CasReply::Conflict { .. }) {
            self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        Ok(out)
    }

    fn slot(&self, id: &str) -> Arc<AsyncMutex<Slot>> {
        lock(&self.sessions)
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Sleep `pause` with the shared budget's lock let go (other sessions of the budget go
    /// on meanwhile), and take it again if it was held.
    async fn pause_unlocked(
        &self,
        bguard: &mut Option<OwnedMutexGuard<BudgetCache>>,
        bkey: Option<&str>,
        pause: Duration,
    ) {
        let held = bguard.take().is_some();
        tokio::time::sleep(pause).await;
        if held {
            if let Some(k) = bkey {
                *bguard = Some(self.budget_lock(k).lock_owned().await);
            }
        }
    }

    /// One exponential back-off step of `apply` waiting on another daemon (5 ms doubling
    /// to 200 ms), or `busy` as the error once the command timeout would pass.
    async fn back_off(
        &self,
        bguard: &mut Option<OwnedMutexGuard<BudgetCache>>,
        bkey: Option<&str>,
        started: Instant,
        backoff: &mut Duration,
        busy: &str,
    ) -> Result<(), StoreError> {
        if started.elapsed() + *backoff > self.opts.command_timeout {
            return Err(backend("apply", busy));
        }
        self.pause_unlocked(bguard, bkey, *backoff).await;
        *backoff = (*backoff * 2).min(Duration::from_millis(200));
        Ok(())
    }

    fn budget_lock(&self, key: &str) -> Arc<AsyncMutex<BudgetCache>> {
        lock(&self.budgets)
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    /// Read a session fresh (1 round trip, 2 on a cold cache without its group).
    async fn load(&self, slot: &mut Slot, id: &str) -> Result<(), StoreError> {
        let group = match &slot.group {
            Some(g) => g.clone(),
            None => {
                let mut p = redis::pipe();
                p.cmd("GET").arg(self.keys.loc(id));
                let mut r = self.send_store(&p, 1, "load").await?;
                match r.pop() {
                    Some(Value::Nil) | None => {
                        slot.view = None;
                        return Err(StoreError::NotFound { id: id.to_owned() });
                    }
                    Some(v) => {
                        let g = String::from_utf8(bytes_of(v, 1024)?)
                            .map_err(|_| corrupt("group is not UTF-8"))?;
                        slot.group = Some(g.clone());
                        g
                    }
                }
            }
        };
        let mut p = redis::pipe();
        p.cmd("HGETALL").arg(self.keys.session(&group, id));
        p.cmd("HGETALL").arg(self.keys.budget(&group));
        let mut r = self.send_store(&p, 2, "load").await?.into_iter();
        let (Some(s), Some(b)) = (r.next(), r.next()) else {
            return Err(corrupt("short pipeline reply"));
        };
        let s = fields_of(s, self.max_value())?;
        let b = fields_of(b, self.max_value())?;
        self.set_view(slot, id, &s, &b)
    }

    fn set_view(
        &self,
        slot: &mut Slot,
        id: &str,
        s: &Fields,
        b: &Fields,
    ) -> Result<(), StoreError> {
        let heartbeat = slot.view.as_ref().map(|v| v.session.last_heartbeat_ns);
        match view_from_fields(s, b, self.bounds(), now_ns()) {
            Ok(Some(mut v)) => {
                if v.session.meta.session_id != id {
                    slot.view = None;
                    return Err(corrupt("session record names another session"));
                }
                if let Some(h) = heartbeat {
                    v.session.last_heartbeat_ns = h;
                }
                slot.view = Some(v);
                Ok(())
            }
            Ok(None) => {
                slot.view = None;
                Err(StoreError::NotFound { id: id.to_owned() })
            }
            Err(e) => {
                slot.view = None;
                Err(e)
            }
        }
    }

    /// The session hash's `v` now (0 if absent): one round trip.
    async fn session_version(&self, skey: &str) -> Result<u64, StoreError> {
        let mut p = redis::pipe();
        p.cmd("HGET").arg(skey).arg("v");
        let mut r = self.send_store(&p, 1, "apply").await?;
        match r.pop() {
            Some(Value::Nil) | None => Ok(0),
            Some(v) => std::str::from_utf8(&bytes_of(v, 32)?)
                .ok()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| corrupt("version is not an integer")),
        }
    }

    /// Whether this daemon's change `seq` of session `id` is in flight to its journal.
    fn in_flight(&self, id: &str, seq: u64) -> bool {
        lock(&self.in_flight)
            .get(id)
            .is_some_and(|s| s.contains(&seq))
    }

    fn confirmed_upto(&self, id: &str) -> u64 {
        lock(&self.confirmed).get(id).copied().unwrap_or(0)
    }

    /// What an ended session's other keys get once its end stands: off the index of live
    /// sessions, and its `loc` key expiring after `ttl_ms`.
    fn ended_commands(&self, id: &str, ttl_ms: u64) -> Vec<redis::Cmd> {
        let mut srem = redis::cmd("SREM");
        srem.arg(self.keys.idx()).arg(id);
        let mut pexpire = redis::cmd("PEXPIRE");
        pexpire.arg(self.keys.loc(id)).arg(ttl_ms.max(1));
        vec![srem, pexpire]
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.opts.session_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Settle `seqs` of the slot's session through the arbiter, then drop or revert them
    /// with one CAS. A conflict leaves the slot refreshed: the caller looks again.
    async fn settle(
        &self,
        slot: &mut Slot,
        budget: Option<&mut BudgetCache>,
        id: &str,
        seqs: &[u64],
    ) -> Result<(), StoreError> {
        let group = slot.group.clone().ok_or_else(|| corrupt("no group"))?;
        let view = slot
            .view
            .clone()
            .ok_or(StoreError::NotFound { id: id.to_owned() })?;
        let skey = self.keys.session(&group, id);
        let bkey = view.budget.map(|_| self.keys.budget(&group));
        // A void gives amounts back with a write whose version its entry records: hold
        // the budget first (field `s`), so that no other write comes between.
        let mut release = None;
        if let (true, Some(bk), Some((bv, _))) =
            (settle_needs_budget(&view, seqs), &bkey, view.budget)
        {
            if let Some(cur) = &view.settling {
                let busy = settling_parts(cur).is_some_and(|(d, at, _)| {
                    d != self.opts.daemon_id && now_ms().saturating_sub(at) < ms(self.opts.grace)
                });
                if busy {
                    // Another daemon is settling a change of this budget: let it finish.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    return self.load(slot, id).await;
                }
            }
            let value = settling_value(&self.opts.daemon_id, now_ms(), id);
            let req = SettleRequest {
                session_key: skey.clone(),
                budget_key: bk.clone(),
                expect_sv: view.sv,
                expect_bv: bv,
                expect: view.settling.clone(),
                set: Some(value.clone()),
            };
            match self.settle_cas(&req).await {
                Ok(None) => release = Some(value),
                Ok(Some((session, budget))) => return self.set_view(slot, id, &session, &budget),
                Err(e) => {
                    slot.view = None;
                    return Err(e);
                }
            }
        }
        let mut outcomes = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let settled = tokio::time::timeout(
                self.opts.command_timeout,
                self.arbiter.settle(id, *seq, void_budget(&view, *seq)),
            )
            .await
            .map_err(|_| backend("settle", "the arbiter did not answer in time"))
            .and_then(|r| r);
            let o = match settled {
                Ok(o) => o,
                Err(e) => {
                    if let (Some(value), Some(bk), Some((bv, _))) = (&release, &bkey, view.budget) {
                        // Give the budget up (else it is taken over after grace).
                        let _ = self
                            .settle_cas(&SettleRequest {
                                session_key: skey.clone(),
                                budget_key: bk.clone(),
                                expect_sv: view.sv,
                                expect_bv: bv,
                                expect: Some(value.clone()),
                                set: None,
                            })
                            .await;
                    }
                    return Err(e);
                }
            };
            self.counters.settled.fetch_add(1, Ordering::Relaxed);
            if o == Settled::Void {
                self.counters.voided.fetch_add(1, Ordering::Relaxed);
            }
            tracing::info!(session = id, seq, outcome = ?o, "settled an unconfirmed change");
            outcomes.push((*seq, o));
        }
        let planned = plan_revert(
            &view,
            &skey,
            bkey.as_deref(),
            &outcomes,
            &self.opts.daemon_id,
            self.bounds(),
            self.ttl_ms(),
            release,
        )?;
        // A settlement that leaves the session ended (a kept close, a voided opening):
        // for good, so it leaves the index and its `loc` key expires with it.
        let pre = if planned.request.ttl_ms > 0 {
            self.ended_commands(id, planned.request.ttl_ms)
        } else {
            Vec::new()
        };
        match self.cas(&pre, &planned.request, "settle").await {
            Ok(CasReply::Done { sv, bv }) => {
                let wrote_budget = planned.request.budget_blob.is_some();
                let v = after_done(view, planned, sv, bv);
                if let (Some(cache), Some(b), true) = (budget, v.budget, wrote_budget) {
                    *cache = Some((b.0, b.1, v.holds.clone()));
                }
                slot.view = Some(v);
                for seq in seqs {
                    let _ = self.confirm_tx.send(Confirm::Index {
                        member: Keys::member(&group, id, *seq),
                    });
                }
                Ok(())
            }
            Ok(CasReply::Conflict { session, budget }) => {
                self.set_view(slot, id, &session, &budget)
            }
            Ok(CasReply::Joined { .. }) => {
                slot.view = None;
                Err(corrupt("a join answer to a settlement"))
            }
            Ok(CasReply::Unstaged) => {
                slot.view = None;
                Err(unstaged("settle"))
            }
            Err(e) => {
                slot.view = None;
                Err(e)
            }
        }
    }

    /// Take off a settlement `cur` of session `sid` older than grace if that session has
    /// no unconfirmed change left (its change was confirmed: nothing to give back).
    /// Otherwise leave it: whoever settles that change takes it over.
    async fn clear_settling(
        &self,
        group: &str,
        sid: &str,
        budget_key: &str,
        bv: u64,
        cur: &str,
    ) -> Result<(), StoreError> {
        let skey = self.keys.session(group, sid);
        let mut p = redis::pipe();
        p.cmd("HGETALL").arg(&skey);
        let mut r = self.send_store(&p, 1, "apply").await?;
        let f = fields_of(r.pop().unwrap_or(Value::Nil), self.max_value())?;
        if f.keys().any(|k| k.starts_with(crate::cas::MARKER_FIELD)) {
            return Ok(());
        }
        let sv = f
            .get("v")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        tracing::warn!(session = sid, "took off a settlement its daemon left");
        self.settle_cas(&SettleRequest {
            session_key: skey,
            budget_key: budget_key.to_owned(),
            expect_sv: sv,
            expect_bv: bv,
            expect: Some(cur.to_owned()),
            set: None,
        })
        .await
        .map(|_| ())
    }

    /// The script in `settle` mode: `None` if done, else the current hashes.
    async fn settle_cas(
        &self,
        req: &SettleRequest,
    ) -> Result<Option<(Fields, Fields)>, StoreError> {
        let (keys, args) = settle_keys_and_args(req);
        let mut pipe = redis::pipe();
        let mut eval = redis::cmd("EVALSHA");
        eval.arg(&self.sha).arg(keys.len()).arg(&keys);
        for a in &args {
            eval.arg(a.as_slice());
        }
        pipe.add_command(eval);
        let mut reply = self.send(&pipe, 1, false, "settle").await;
        if let Err(e) = &reply {
            if e.kind() == ErrorKind::NoScriptError {
                let mut load = redis::pipe();
                load.cmd("SCRIPT").arg("LOAD").arg(CAS_LUA);
                self.send_store(&load, 1, "script load").await?;
                reply = self.send(&pipe, 1, false, "settle").await;
            }
        }
        let mut values = reply.map_err(|e| backend("settle", e))?;
        let Value::Array(items) = values
            .pop()
            .ok_or_else(|| corrupt("empty pipeline reply"))?
        else {
            return Err(corrupt("script reply is not an array"));
        };
        let mut it = items.into_iter();
        match (it.next(), it.next(), it.next(), it.next()) {
            (Some(Value::Int(3)), None, None, None) => Ok(None),
            (Some(Value::Int(0)), Some(s), Some(b), None) => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                Ok(Some((
                    fields_of(s, self.max_value())?,
                    fields_of(b, self.max_value())?,
                )))
            }
            _ => Err(corrupt("script reply has an unknown shape")),
        }
    }

    /// Wrap the journal's completion: once the entry is durable, the change is
    /// confirmed (its marker dropped by the confirmer or the next CAS).
    #[allow(clippy::too_many_arguments)]
    fn watch(
        self: &Arc<Self>,
        d: Durable,
        id: String,
        group: String,
        seq: u64,
        held: bool,
        ends: bool,
        prev_record: String,
    ) -> Durable {
        let (completer, pending) = tollgate_audit::pending_pair::<Appended>();
        let inner = Arc::clone(self);
        tokio::spawn(async move {
            let r = d.await;
            if r.is_ok() {
                let mut c = lock(&inner.confirmed);
                let e = c.entry(id.clone()).or_insert(0);
                *e = (*e).max(seq);
            }
            if let Some(set) = lock(&inner.in_flight).get_mut(&id) {
                set.remove(&seq);
            }
            match r {
                Ok(a) => {
                    // A journal with nothing to write completes without a place; the
                    // audit completion needs one: a null place.
                    completer.complete(Ok(a.unwrap_or(Appended {
                        index: 0,
                        entry_id: uuid::Uuid::nil(),
                        hash: tollgate_core::Digest::default(),
                    })));
                    let _ = inner.confirm_tx.send(Confirm::Marker {
                        seq,
                        session_key: inner.keys.session(&group, &id),
                        member: Keys::member(&group, &id, seq),
                        hold: held.then(|| (inner.keys.budget(&group), hold_field(&id, seq))),
                        expire: ends.then(|| inner.ttl_ms()),
                        prev_record,
                        id,
                    });
                }
                Err(e) => completer.complete(Err(WriteError::Failed(e.to_string()))),
            }
        });
        Durable::of(pending)
    }

    /// The critical section of a committed change: CAS, and on success the cache update
    /// and the journal submission, in a task of its own so that a caller that gives up
    /// (drops the future) cannot cut it between the write and the journal.
    #[allow(clippy::too_many_arguments)]
    async fn write_commit(
        self: &Arc<Self>,
        mut slot: OwnedMutexGuard<Slot>,
        mut budget: Option<OwnedMutexGuard<BudgetCache>>,
        id: String,
        pre: Vec<redis::Cmd>,
        planned: Planned,
        event: SessionEvent,
        open: Option<(Session, UnixNanos)>,
    ) -> Result<
        (
            Written,
            OwnedMutexGuard<Slot>,
            Option<OwnedMutexGuard<BudgetCache>>,
        ),
        StoreError,
    > {
        let inner = Arc::clone(self);
        let task = tokio::spawn(async move {
            let r = inner
                .write_commit_inner(
                    &mut slot,
                    budget.as_deref_mut(),
                    &id,
                    &pre,
                    planned,
                    event,
                    open,
                )
                .await;
            (r, slot, budget)
        });
        let (r, slot, budget) = task
            .await
            .map_err(|e| backend("apply", format!("the write task failed: {e}")))?;
        r.map(|w| (w, slot, budget))
    }

    /// `open`: the session before its opening and the opening's time, for a join
    /// ([`CasRequest::join`]): the session is opened again on the budget the script read,
    /// and that opening's record is the one journaled.
    #[allow(clippy::too_many_arguments)]
    async fn write_commit_inner(
        self: &Arc<Self>,
        slot: &mut Slot,
        budget: Option<&mut BudgetCache>,
        id: &str,
        pre: &[redis::Cmd],
        planned: Planned,
        mut event: SessionEvent,
        open: Option<(Session, UnixNanos)>,
    ) -> Result<Written, StoreError> {
        let group = slot.group.clone().ok_or_else(|| corrupt("no group"))?;
        let seq = event.session_seq();
        let held = planned.request.hold.is_some();
        let ends = planned.session.state.status == tollgate_core::SessionStatus::Terminated;
        let prev_record = planned
            .marker
            .as_ref()
            .map(|m| m.prev_field.clone())
            .unwrap_or_default();
        let reply = self.cas(pre, &planned.request, "apply").await;
        let reply = match reply {
            Ok(CasReply::Joined {
                sv,
                created,
                budget: fields,
            }) => {
                let Some((session, now)) = open else {
                    slot.view = None;
                    return Err(corrupt("a join answer to a change"));
                };
                match after_join(planned, &session, now, sv, created, &fields) {
                    Ok((v, record)) => {
                        event = record;
                        Ok((v, created))
                    }
                    Err(e) => {
                        slot.view = None;
                        return Err(e);
                    }
                }
            }
            Ok(CasReply::Done { sv, bv }) => {
                let wrote_budget = planned.request.budget_blob.is_some();
                match slot.view.take() {
                    Some(base) => Ok((after_done(base, planned, sv, bv), wrote_budget)),
                    // create of a session with its own budget: no view before
                    None => Ok((
                        View {
                            sv,
                            blob: planned.request.session_blob,
                            cur: planned.request.record_field,
                            orphans: Vec::new(),
                            budget: None,
                            markers: planned.marker.map(|m| (m.seq, m)).into_iter().collect(),
                            session: planned.session,
                            holds: Holds::new(),
                            settling: None,
                        },
                        wrote_budget,
                    )),
                }
            }
            Ok(CasReply::Conflict { session, budget: b }) => Err(Ok((session, b))),
            Ok(CasReply::Unstaged) => Err(Err(unstaged("apply"))),
            Err(e) => Err(Err(e)),
        };
        match reply {
            Ok((v, wrote_budget)) => {
                if let (Some(cache), Some(b)) = (budget, v.budget) {
                    if wrote_budget || cache.as_ref().is_none_or(|c| c.0 < b.0) {
                        *cache = Some((b.0, b.1, v.holds.clone()));
                    }
                }
                slot.view = Some(v);
                lock(&self.in_flight)
                    .entry(id.to_owned())
                    .or_default()
                    .insert(seq);
                let d = self.journal.submit(event);
                Ok(Written::Done(self.watch(
                    d,
                    id.to_owned(),
                    group,
                    seq,
                    held,
                    ends,
                    prev_record,
                )))
            }
            Err(Ok((session, b))) => {
                if slot.view.is_none() {
                    // create: the caller reads the conflict itself
                    slot.view = view_from_fields(&session, &b, self.bounds(), now_ns())
                        .ok()
                        .flatten();
                    return Ok(Written::Conflict);
                }
                self.set_view(slot, id, &session, &b)?;
                Ok(Written::Conflict)
            }
            Err(Err(e)) => {
                // The write may or may not have happened: read afresh next time.
                slot.view = None;
                Err(e)
            }
        }
    }
}

impl RedisStore {
    /// Connect (within `command_timeout`), load the CAS script, start the confirmer and
    /// the sweeper (on the current tokio runtime). Fails with [`StoreError::Backend`] if
    /// Redis cannot be reached or the options are invalid.
    pub async fn connect(
        settings: RedisOptions,
        journal: Arc<dyn Journal>,
        arbiter: Arc<dyn Arbiter>,
    ) -> Result<RedisStore, StoreError> {
        let keys = Keys::new(&settings.key_prefix).map_err(|e| backend("connect", e))?;
        check_id("daemon_id", &settings.daemon_id)?;
        let client = open_client(&settings).map_err(|e| backend("connect", e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(settings.command_timeout)
            .set_response_timeout(settings.command_timeout)
            .set_number_of_retries(1)
            .set_max_delay(500);
        let conn = tokio::time::timeout(
            settings.command_timeout,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| backend("connect", "Redis did not answer in time"))?
        .map_err(|e| backend("connect", e))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut inner = Inner {
            conn,
            opts: settings,
            keys,
            sha: String::new(),
            journal,
            arbiter,
            sessions: Mutex::default(),
            budgets: Mutex::default(),
            in_flight: Mutex::default(),
            confirmed: Mutex::default(),
            confirm_tx: tx,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
        };
        let mut load = redis::pipe();
        load.cmd("SCRIPT").arg("LOAD").arg(CAS_LUA);
        let mut r = inner.send_store(&load, 1, "script load").await?;
        let sha = r.pop().ok_or_else(|| corrupt("no script sha"))?;
        inner.sha = String::from_utf8(bytes_of(sha, 64)?).map_err(|_| corrupt("bad sha"))?;
        let inner = Arc::new(inner);
        let confirmer = tokio::spawn(confirmer(Arc::clone(&inner), rx));
        let sweeper = tokio::spawn(sweeper(Arc::downgrade(&inner)));
        Ok(RedisStore {
            inner,
            tasks: vec![confirmer, sweeper],
        })
    }

    /// This daemon's id.
    pub fn daemon_id(&self) -> &str {
        &self.inner.opts.daemon_id
    }

    /// The counters so far.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        RedisStats {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            commands: c.commands.load(Ordering::Relaxed),
            background_round_trips: c.background.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            settled: c.settled.load(Ordering::Relaxed),
            voided: c.voided.load(Ordering::Relaxed),
        }
    }

    /// Redis's persistence settings, so `tollgate serve` can warn when they are weaker
    /// than `appendonly yes` + `appendfsync always`.
    pub async fn server_durability(&self) -> Result<ServerDurability, StoreError> {
        let mut p = redis::pipe();
        p.cmd("CONFIG").arg("GET").arg("appendonly");
        p.cmd("CONFIG").arg("GET").arg("appendfsync");
        if let Ok(r) = self.inner.send(&p, 2, true, "config get").await {
            let mut vals = Vec::new();
            for v in r {
                let f = fields_of(v, 64)?;
                vals.push(f.into_values().next().unwrap_or_default());
            }
            if let [a, f] = vals.as_slice() {
                return Ok(ServerDurability {
                    appendonly: String::from_utf8_lossy(a).into_owned(),
                    appendfsync: String::from_utf8_lossy(f).into_owned(),
                });
            }
        }
        // CONFIG disabled (managed Redis): INFO persistence says whether AOF is on.
        let mut p = redis::pipe();
        p.cmd("INFO").arg("persistence");
        let mut r = self
            .inner
            .send(&p, 1, true, "info")
            .await
            .map_err(|e| backend("info", e))?;
        let text = bytes_of(r.pop().unwrap_or(Value::Nil), 1 << 16)?;
        let text = String::from_utf8_lossy(&text);
        let aof = text.lines().any(|l| l.trim() == "aof_enabled:1");
        Ok(ServerDurability {
            appendonly: if aof { "yes" } else { "no" }.to_owned(),
            appendfsync: "unknown".to_owned(),
        })
    }

    /// Settle this daemon's view of every unconfirmed change older than grace now (what
    /// the sweeper does every `sweep_interval`). Returns how many sessions it looked at.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        sweep_once(&self.inner).await
    }

    async fn create_impl(
        &self,
        session: Session,
        now: UnixNanos,
    ) -> Result<(SessionState, Durable), StoreError> {
        let inner = &self.inner;
        inner.check_open()?;
        session.meta.validate()?;
        let id = session.meta.session_id.clone();
        let group = Keys::group(&session.meta);
        let skey = inner.keys.session(&group, &id);
        let shared = session.meta.shared_budget_key().is_some();
        let bkey = shared.then(|| inner.keys.budget(&group));
        let mut slot = inner.slot(&id).lock_owned().await;
        if slot.view.is_some() {
            return Err(StoreError::Exists { id });
        }
        slot.group = Some(group.clone());
        let bguard = match &bkey {
            Some(k) => Some(inner.budget_lock(k).lock_owned().await),
            None => None,
        };
        // One script call, no read before it: a session of a shared budget is written
        // together with an atomic read of the budget (starting it if it does not exist),
        // and opened on the amounts of exactly that read (docs/redis.md, "create").
        let (planned, record) = plan_open(
            &session,
            &skey,
            bkey.as_deref(),
            &inner.opts.daemon_id,
            now_ms(),
            now,
        );
        let seq = planned.session.seq;
        let at = planned.marker.as_ref().map_or(0, |m| m.at_ms);
        let mut pre = Vec::new();
        let mut c = redis::cmd("SET");
        c.arg(inner.keys.loc(&id)).arg(&group).arg("NX");
        pre.push(c);
        let mut c = redis::cmd("SADD");
        c.arg(inner.keys.idx()).arg(&id);
        pre.push(c);
        let mut c = redis::cmd("ZADD");
        c.arg(inner.keys.unconfirmed())
            .arg(at)
            .arg(Keys::member(&group, &id, seq));
        pre.push(c);
        let open = shared.then_some((session, now));
        let (w, slot, _) = inner
            .write_commit(slot, bguard, id.clone(), pre, planned, record, open)
            .await?;
        match w {
            Written::Done(d) => {
                let state = slot
                    .view
                    .as_ref()
                    .map(|v| v.session.state.clone())
                    .ok_or_else(|| corrupt("a written session is not cached"))?;
                Ok((state, d))
            }
            Written::Conflict => {
                // The session hash exists: someone else's session of that id (or an
                // unreadable one).
                drop(slot);
                Err(StoreError::Exists { id })
            }
        }
    }

    async fn apply_impl<R: Send + 'static>(
        &self,
        id: &str,
        mut f: impl FnMut(&mut Session) -> Change<R> + Send,
    ) -> Result<(R, Durable), StoreError> {
        let inner = &self.inner;
        inner.check_open()?;
        let started = Instant::now();
        let mut slot = inner.slot(id).lock_owned().await;
        if slot.view.is_none() {
            inner.load(&mut slot, id).await?;
        }
        let group = slot.group.clone().ok_or_else(|| corrupt("no group"))?;
        let shared = slot
            .view
            .as_ref()
            .and_then(|v| v.session.meta.shared_budget_key())
            .is_some();
        let skey = inner.keys.session(&group, id);
        let bkey = shared.then(|| inner.keys.budget(&group));
        let mut bguard = match &bkey {
            Some(k) => Some(inner.budget_lock(k).lock_owned().await),
            None => None,
        };
        let grace = ms(inner.opts.grace);
        let mut backoff = Duration::from_millis(5);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            if attempts > inner.opts.max_retries.max(1) {
                return Err(backend("apply", "contention: too many conflicting writes"));
            }
            if slot.view.is_none() {
                inner.load(&mut slot, id).await?;
            }
            let view = slot
                .view
                .as_mut()
                .ok_or_else(|| StoreError::NotFound { id: id.to_owned() })?;
            // A fresher copy of the shared budget from this daemon's own last write.
            if let (Some(Some((cbv, cb, ch))), Some((bv, _))) = (bguard.as_deref(), view.budget) {
                if *cbv > bv {
                    view.budget = Some((*cbv, *cb));
                    view.holds = ch.clone();
                    cb.load_into(&mut view.session.state);
                }
            }
            let action = check_markers(
                view,
                &inner.opts.daemon_id,
                inner.confirmed_upto(id),
                &|seq| inner.in_flight(id, seq),
                now_ms(),
                grace,
                false,
            );
            match action {
                MarkerAction::Proceed => {}
                MarkerAction::Wait => {
                    // Other sessions of the shared budget go on meanwhile.
                    inner
                        .back_off(
                            &mut bguard,
                            bkey.as_deref(),
                            started,
                            &mut backoff,
                            "session busy: another daemon's change to it is not yet confirmed",
                        )
                        .await?;
                    attempts -= 1;
                    inner.load(&mut slot, id).await?;
                    continue;
                }
                MarkerAction::WaitOwn => {
                    // This daemon's previous change to the session is still going to the
                    // journal: it never writes on top of an unconfirmed change.
                    if started.elapsed() > inner.opts.command_timeout {
                        return Err(backend(
                            "apply",
                            "the session's previous change is not yet in the audit trail",
                        ));
                    }
                    inner
                        .pause_unlocked(&mut bguard, bkey.as_deref(), Duration::from_millis(1))
                        .await;
                    attempts -= 1;
                    continue;
                }
                MarkerAction::Settle(seqs) => {
                    inner
                        .settle(&mut slot, bguard.as_deref_mut(), id, &seqs)
                        .await?;
                    continue;
                }
            }
            if view.session.state.status == tollgate_core::SessionStatus::Terminated {
                // Its opening was voided (its daemon died before the opening was in the
                // audit trail): the session never existed, and nothing may be decided on
                // it, by any daemon. The agent registers again.
                return Err(StoreError::NotFound { id: id.to_owned() });
            }
            let mut s = view.session.clone();
            match f(&mut s) {
                change @ (Change::Keep(_) | Change::Touch(_)) => {
                    // Nothing to write, but the answer must not come from a stale copy
                    // (another daemon may have changed the session: a human decision, a
                    // settlement): one read of the session's version says.
                    let sv = view.sv;
                    if inner.session_version(&skey).await? != sv {
                        inner.load(&mut slot, id).await?;
                        continue;
                    }
                    return Ok(match change {
                        Change::Touch(r) => {
                            if let Some(v) = slot.view.as_mut() {
                                v.session = s;
                            }
                            (r, Durable::ready())
                        }
                        Change::Keep(r) | Change::Commit(r, _) | Change::End(r, _) => {
                            (r, Durable::ready())
                        }
                    });
                }
                // An end is a commit of the session's TERMINATED state: the script takes
                // it off the index and expires it (`session_ttl`), and every daemon's
                // `apply` then answers NotFound (above).
                Change::Commit(r, mut event) | Change::End(r, mut event) => {
                    if dips_into_holds(view, &s) {
                        // It would spend a refund whose entry is not yet confirmed (a
                        // void would take it back): wait for the holds to go, re-read,
                        // decide again.
                        inner
                            .back_off(
                                &mut bguard,
                                bkey.as_deref(),
                                started,
                                &mut backoff,
                                "budget busy: refunds to it are not yet in the audit trail",
                            )
                            .await?;
                        attempts -= 1;
                        inner.load(&mut slot, id).await?;
                        continue;
                    }
                    let planned = plan_commit(
                        view,
                        &skey,
                        bkey.as_deref(),
                        s,
                        &mut event,
                        &inner.opts.daemon_id,
                        now_ms(),
                        inner.confirmed_upto(id),
                    )?;
                    if let (true, Some(cur)) =
                        (planned.request.budget_blob.is_some(), view.settling.clone())
                    {
                        // A settlement holds the budget (its give-back's version is in
                        // its void entry): wait for it, re-read, decide again. One left
                        // by a daemon that died after its change was confirmed (no
                        // marker left to settle) is taken off after grace.
                        if let (Some((bk, bv)), Some((_, at, sid))) = (
                            bkey.as_ref().zip(view.budget.map(|b| b.0)),
                            settling_parts(&cur),
                        ) {
                            if now_ms().saturating_sub(at) >= grace {
                                inner.clear_settling(&group, sid, bk, bv, &cur).await?;
                            }
                        }
                        inner
                            .back_off(
                                &mut bguard,
                                bkey.as_deref(),
                                started,
                                &mut backoff,
                                "budget busy: another daemon is settling a change of it",
                            )
                            .await?;
                        attempts -= 1;
                        inner.load(&mut slot, id).await?;
                        continue;
                    }
                    let seq = event.session_seq();
                    let mut pre = Vec::new();
                    let mut c = redis::cmd("ZADD");
                    c.arg(inner.keys.unconfirmed())
                        .arg(planned.marker.as_ref().map_or(0, |m| m.at_ms))
                        .arg(Keys::member(&group, id, seq));
                    pre.push(c);
                    if !planned.request.drop.is_empty() {
                        // The index members of the markers this write drops.
                        let mut c = redis::cmd("ZREM");
                        c.arg(inner.keys.unconfirmed());
                        for q in &planned.request.drop {
                            c.arg(Keys::member(&group, id, *q));
                        }
                        pre.push(c);
                    }
                    // An end leaves the index, and its keys expire, only once it is
                    // confirmed (the confirmer) or kept by a settlement: a close voided
                    // after its daemon died leaves the session live and findable.
                    let (w, s2, b2) = inner
                        .write_commit(slot, bguard, id.to_owned(), pre, planned, event, None)
                        .await?;
                    slot = s2;
                    bguard = b2;
                    match w {
                        Written::Done(d) => return Ok((r, d)),
                        Written::Conflict => continue,
                    }
                }
            }
        }
    }

    async fn get_impl(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let mut slot = self.inner.slot(id).lock_owned().await;
        match self.inner.load(&mut slot, id).await {
            // An ended session (closed, or its opening voided) is no session.
            Ok(()) => Ok(slot
                .view
                .as_ref()
                .filter(|v| v.session.state.status != tollgate_core::SessionStatus::Terminated)
                .map(|v| v.session.clone())),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_impl(
        &self,
        org: Option<&str>,
        pending_only: bool,
    ) -> Result<Vec<Session>, StoreError> {
        let mut p = redis::pipe();
        p.cmd("SMEMBERS").arg(self.inner.keys.idx());
        let mut r = self.inner.send_store(&p, 1, "list").await?;
        let ids = match r.pop() {
            Some(Value::Array(items)) => items,
            Some(Value::Set(items)) => items,
            Some(Value::Nil) | None => Vec::new(),
            Some(_) => return Err(corrupt("SMEMBERS reply is not a set")),
        };
        let mut out = Vec::new();
        for v in ids {
            let id = String::from_utf8(bytes_of(v, MAX_ID_BYTES)?)
                .map_err(|_| corrupt("session id is not UTF-8"))?;
            if let Some(s) = self.get_impl(&id).await? {
                if org.is_none_or(|o| s.meta.organization_id == o)
                    && (!pending_only || s.state.pending.is_some())
                {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| a.meta.session_id.cmp(&b.meta.session_id));
        Ok(out)
    }

    async fn budget_impl(&self, key: &BudgetKey) -> Result<Option<Budget>, StoreError> {
        match Keys::budget_group(key) {
            None => {
                let BudgetKey::Session(id) = key else {
                    return Ok(None);
                };
                Ok(self.get_impl(id).await?.map(|s| Budget::of(&s.state)))
            }
            Some(group) => {
                let mut p = redis::pipe();
                p.cmd("HGETALL").arg(self.inner.keys.budget(&group));
                let mut r = self.inner.send_store(&p, 1, "budget").await?;
                let f = fields_of(r.pop().unwrap_or(Value::Nil), self.inner.max_value())?;
                Ok(budget_from_fields(&f)?.map(|b| b.1))
            }
        }
    }
}

impl Inner {
    /// Whether this daemon's cached view of session `id` is past change `seq` and holds
    /// no marker of it: a later write of this daemon, or a settlement, dropped the marker
    /// (and with it its hold and index member). `false` when unsure (no view, or a write
    /// in progress holds the session).
    fn dropped_since(&self, id: &str, seq: u64) -> bool {
        let Some(slot) = lock(&self.sessions).get(id).cloned() else {
            return false;
        };
        let Ok(slot) = slot.try_lock() else {
            return false;
        };
        slot.view
            .as_ref()
            .is_some_and(|v| v.session.seq > seq && !v.markers.contains_key(&seq))
    }

    /// The confirmer took change `seq`'s marker (and hold) off Redis: take it off the
    /// cached view too, so the session's next write does not drop it again (nor its
    /// index member). Left alone when a write holds the session (it drops it itself).
    fn forget_marker(&self, id: &str, seq: u64) {
        let Some(slot) = lock(&self.sessions).get(id).cloned() else {
            return;
        };
        let Ok(mut slot) = slot.try_lock() else {
            return;
        };
        if let Some(v) = slot.view.as_mut() {
            v.markers.remove(&seq);
            v.holds.remove(&hold_field(id, seq));
        }
    }
}

async fn confirmer(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Confirm>) {
    while let Some(first) = rx.recv().await {
        // At once: a daemon that stops (or whose session moves to another daemon) must
        // leave no marker of a confirmed change behind, or the next daemon waits for grace.
        let mut batch = vec![first];
        while batch.len() < 512 {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let mut p = redis::pipe();
        let mut n = 0;
        for c in &batch {
            match c {
                Confirm::Marker { id, seq, .. } if inner.dropped_since(id, *seq) => {}
                Confirm::Marker {
                    id,
                    seq,
                    session_key,
                    member,
                    hold,
                    expire,
                    prev_record,
                } => {
                    // The hold of a refund (its entry is committed: it may be spent now),
                    // an ended session's expiry, and last the marker and the record before
                    // it: cut before it, the marker stays for a settler to finish.
                    let hold = hold.as_ref().map(|(k, h)| (k.as_str(), h.as_str()));
                    if let Some(ms) = expire {
                        // The end is committed: the session leaves the index and its `loc`
                        // key expires (safe alone, before the marker goes).
                        for c in inner.ended_commands(id, *ms) {
                            p.add_command(c).ignore();
                            n += 1;
                        }
                    }
                    for c in confirm_commands(session_key, *seq, hold, *expire, prev_record) {
                        match c {
                            ConfirmCommand::Hdel { key, fields } => {
                                p.cmd("HDEL").arg(key).arg(fields).ignore()
                            }
                            ConfirmCommand::Pexpire { key, ms } => {
                                p.cmd("PEXPIRE").arg(key).arg(ms).ignore()
                            }
                        };
                        n += 1;
                    }
                    p.cmd("ZREM")
                        .arg(inner.keys.unconfirmed())
                        .arg(member)
                        .ignore();
                    n += 1;
                }
                Confirm::Index { member } => {
                    p.cmd("ZREM")
                        .arg(inner.keys.unconfirmed())
                        .arg(member)
                        .ignore();
                    n += 1;
                }
            }
        }
        if n == 0 {
            continue;
        }
        match inner.send(&p, n, true, "confirm").await {
            Ok(_) => {
                for c in &batch {
                    if let Confirm::Marker { id, seq, .. } = c {
                        inner.forget_marker(id, *seq);
                    }
                }
            }
            Err(e) => {
                // The markers stay: this daemon's next change to the session drops them
                // (its confirmed seq), or a sweeper settles them as entries.
                tracing::warn!(error = %e, "could not drop confirmed markers");
            }
        }
    }
}

async fn sweeper(inner: std::sync::Weak<Inner>) {
    loop {
        let interval = match inner.upgrade() {
            Some(i) => i.opts.sweep_interval,
            None => return,
        };
        tokio::time::sleep(interval).await;
        let Some(i) = inner.upgrade() else { return };
        if i.closed.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = sweep_once(&i).await {
            tracing::warn!(error = %e, "sweep failed");
        }
    }
}

async fn sweep_once(inner: &Inner) -> Result<usize, StoreError> {
    let cutoff = now_ms().saturating_sub(ms(inner.opts.grace));
    let mut p = redis::pipe();
    p.cmd("ZRANGEBYSCORE")
        .arg(inner.keys.unconfirmed())
        .arg("-inf")
        .arg(cutoff)
        .arg("LIMIT")
        .arg(0)
        .arg(256);
    let mut r = inner
        .send(&p, 1, true, "sweep")
        .await
        .map_err(|e| backend("sweep", e))?;
    let Some(Value::Array(members)) = r.pop() else {
        return Ok(0);
    };
    let mut sessions: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for m in members {
        let m = String::from_utf8(bytes_of(m, 4 * MAX_ID_BYTES)?)
            .map_err(|_| corrupt("index member is not UTF-8"))?;
        match Keys::parse_member(&m) {
            Some((group, id, _)) => sessions.entry(id).or_insert((group, Vec::new())).1.push(m),
            None => {
                let _ = inner.confirm_tx.send(Confirm::Index { member: m });
            }
        }
    }
    let n = sessions.len();
    for (id, (group, members)) in sessions {
        let mut slot = inner.slot(&id).lock_owned().await;
        slot.group = Some(group.clone());
        match inner.load(&mut slot, &id).await {
            Ok(()) => {}
            Err(StoreError::NotFound { .. }) => {
                // No session there; maybe the staged record of an opening whose pipeline
                // was cut after it (its index member went before it): delete exactly
                // those fields (a later opening stages into a field of its own).
                let key = inner.keys.session(&group, &id);
                let mut p = redis::pipe();
                p.cmd("HGETALL").arg(&key);
                let r = inner
                    .send(&p, 1, true, "sweep")
                    .await
                    .map_err(|e| backend("sweep", e))?;
                let f = fields_of(
                    r.into_iter().next().unwrap_or(Value::Nil),
                    inner.max_value(),
                )?;
                if let Some(orphans) = orphan_only_fields(&f) {
                    // Only while the hash is still no session: an opening held up
                    // between its staging and its script may have made one of these
                    // fields current since the read above (one atomic step).
                    let mut p = redis::pipe();
                    p.cmd("EVAL")
                        .arg(crate::script::SWEEP_ORPHANS_LUA)
                        .arg(1)
                        .arg(&key)
                        .arg(orphans)
                        .ignore();
                    inner
                        .send(&p, 1, true, "sweep")
                        .await
                        .map_err(|e| backend("sweep", e))?;
                }
                for m in members {
                    let _ = inner.confirm_tx.send(Confirm::Index { member: m });
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        let Some(view) = slot.view.clone() else {
            continue;
        };
        let mut bguard = match view.budget {
            Some(_) => Some(
                inner
                    .budget_lock(&inner.keys.budget(&group))
                    .lock_owned()
                    .await,
            ),
            None => None,
        };
        let action = check_markers(
            &view,
            &inner.opts.daemon_id,
            inner.confirmed_upto(&id),
            &|_| false,
            now_ms(),
            ms(inner.opts.grace),
            true,
        );
        match action {
            MarkerAction::Settle(seqs) => {
                inner
                    .settle(&mut slot, bguard.as_deref_mut(), &id, &seqs)
                    .await?;
            }
            MarkerAction::Proceed | MarkerAction::Wait | MarkerAction::WaitOwn => {}
        }
        // Index members whose marker is gone.
        if let Some(v) = &slot.view {
            for m in members {
                if let Some((_, _, seq)) = Keys::parse_member(&m) {
                    if !v.markers.contains_key(&seq) {
                        let _ = inner.confirm_tx.send(Confirm::Index { member: m });
                    }
                }
            }
        }
    }
    Ok(n)
}

impl SessionStore for RedisStore {
    fn create(
        &self,
        session: Session,
        now: UnixNanos,
    ) -> impl Future<Output = Result<(SessionState, Durable), StoreError>> + Send {
        self.create_impl(session, now)
    }

    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Session>, StoreError>> + Send {
        self.get_impl(id)
    }

    fn apply<R: Send + 'static>(
        &self,
        id: &str,
        f: impl FnMut(&mut Session) -> Change<R> + Send,
    ) -> impl Future<Output = Result<(R, Durable), StoreError>> + Send {
        self.apply_impl(id, f)
    }

    fn list(
        &self,
        org: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send {
        self.list_impl(org, false)
    }

    fn pending_hitl(
        &self,
        org: Option<&str>,
    ) -> impl Future<Output = Result<Vec<Session>, StoreError>> + Send {
        self.list_impl(org, true)
    }

    fn budget(
        &self,
        key: &BudgetKey,
    ) -> impl Future<Output = Result<Option<Budget>, StoreError>> + Send {
        self.budget_impl(key)
    }

    fn close(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.closed.store(true, Ordering::Release);
        std::future::ready(Ok(()))
    }

    fn note(&self, id: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send {
        let key = self.inner.keys.note(id);
        async move {
            let mut p = redis::pipe();
            p.cmd("GET").arg(key);
            let mut r = self.inner.send_store(&p, 1, "note").await?;
            match r.pop().unwrap_or(Value::Nil) {
                Value::Nil => Ok(None),
                v => bytes_of(v, MAX_NOTE_BYTES).map(Some),
            }
        }
    }

    fn set_note(
        &self,
        id: &str,
        note: Vec<u8>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let key = self.inner.keys.note(id);
        async move {
            if note.len() > MAX_NOTE_BYTES {
                return Err(StoreError::Backend {
                    op: "note",
                    message: format!("a note holds at most {MAX_NOTE_BYTES} bytes"),
                });
            }
            self.inner.check_open()?;
            // It lives as long as an ended session's keys do.
            let ttl = u64::try_from(self.inner.opts.session_ttl.as_millis()).unwrap_or(u64::MAX);
            let mut p = redis::pipe();
            p.cmd("SET").arg(key).arg(note).arg("PX").arg(ttl.max(1));
            self.inner.send_store(&p, 1, "note").await.map(|_| ())
        }
    }
}
