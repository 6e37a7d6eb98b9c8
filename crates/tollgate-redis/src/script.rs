//! The one server-side part: the CAS script, and [`Fake`], the same contract in Rust.
//!
//! Contract (`EVALSHA sha n KEYS… ARGV…`, atomic over its keys), for a write pipelined
//! just after `HSET KEYS[1] <record field> <new record>` (the record is staged by a plain
//! write and never passes through Lua, which costs Redis several times the write for a
//! long string; see [`crate::cas::RECORD_FIELD`]):
//!
//! ```text
//! `KEYS[1]`  session hash  P:{G}:s:<id>
//! `KEYS[2]`  budget hash   P:{G}:b            (only for a shared budget)
//! `ARGV[1]`  expected session v (0: absent)
//! `ARGV[2]`  expected budget v  (0: absent)    checked only if `ARGV[4]` is not empty;
//!          or `join`: open a session on the shared budget as it is (see below)
//! `ARGV[3]`  the record field the new session record was staged in ("r:…")
//! `ARGV[4]`  new budget record or ""           ("" leaves the budget alone)
//! `ARGV[5]`  daemon id                         (field d)
//! `ARGV[6]`  marker field "u:<seq>" or ""      `ARGV[7]` its value
//! `ARGV[8]`  ttl ms (0: PERSIST the session hash; >0: PEXPIRE)
//! `ARGV[9]`  n, then ARGV[10..9+n]: marker fields to HDEL
//! then     hold field "h:<id>\x1f<seq>" or "", its amount  (HSET on the budget)
//! then     m, then m hold fields to HDEL from the budget
//! then     the settlement in progress this write finishes (field `s`), or ""
//! then     for a join: the marker to push instead if the call starts the budget, or ""
//! then     k, then k orphaned record fields to HDEL
//! ```
//!
//! Let `cur` be the field `c` names (the current record; `b` in a hash written before
//! record fields existed). Versions match: `HSET session v=v+1 c=ARGV[3] d` and the
//! marker `u:<seq>` with, beside it, `p:<seq>` = `cur` (the field still holding the record
//! this write replaces; "" when the session is new), so the record before is kept where it
//! is and never copied; a write with no marker (a revert) deletes `cur` instead. Drop the
//! listed markers with their `p:` fields and the record fields those name, and the listed
//! orphans (never `cur` nor the new record), in one HDEL; set the expiry, write the budget
//! (`v=v+1 b`) if given, put the hold and take the listed holds off the budget hash (holds
//! never change its `v`); reply `{1, new sv, new bv}` (`new bv` 0 if the budget was not
//! written: a version the script did not write comes with no amounts, so the reply never
//! offers one to pair with amounts read elsewhere). A version differs, or the call would
//! write the budget while a settlement it does not name is in progress (field `s` of the
//! budget hash): delete the staged record field, write nothing else; reply `{0, HGETALL
//! session, HGETALL budget}`. A hash without `v` counts as version 0. A call that names
//! the settlement in progress takes `s` off. Versions match but the staged record field is
//! not there (the staging `HSET` failed, or a sweep deleted it as an orphan while the
//! pipeline was held up between the two commands): write nothing; reply `{4}`, so `c`
//! never names a field that does not exist.
//!
//! `settle` in `ARGV[2]` (start, take over or give up a settlement of the shared budget):
//! `ARGV[1]` expected session v, `ARGV[3]` expected budget v, `ARGV[4]` the `s` value expected
//! now ("" none), `ARGV[5]` the new `s` value ("" takes it off). Nothing else is written;
//! reply `{3}`, or the conflict reply if a version or `s` differs.
//!
//! `join` (a session's opening on a shared budget): the session version must match (0:
//! the session must not exist) and the session is written as above; the budget hash is
//! created from `ARGV[4]` (`v=1`) if it does not exist, and left alone if it does; reply
//! `{2, new sv, created (0/1), HGETALL budget}`: the budget's version and amounts as one
//! read, at the instant the session was written, from which the daemon opens the session
//! (its opening entry's `budget_before`) and caches the budget. No version of the budget
//! is expected, so a join never conflicts with spending and needs no read before it.

use std::collections::HashMap;

use crate::cas::{
    marker_field, prev_field, CasReply, CasRequest, Fields, CURRENT_FIELD, LEGACY_RECORD_FIELD,
    RECORD_FIELD,
};

/// The sweeper's delete of a hash's orphaned record fields (`KEYS[1]` the session hash, `ARGV`
/// the fields, at most `cas::MAX_ORPHANS`): only while the hash holds no `v`, that is, is
/// still no session. A CAS script that made one of them current (an opening held up
/// between its staging and its script) ran before or after this whole step, never
/// between the sweeper's read and its delete. Answers the number of fields deleted.
pub const SWEEP_ORPHANS_LUA: &str = "if redis.call('HEXISTS', KEYS[1], 'v') == 0 then \
    return redis.call('HDEL', KEYS[1], unpack(ARGV)) end return 0";

/// The CAS script.
pub const CAS_LUA: &str = r"
local two = #KEYS > 1
local join = ARGV[2] == 'join'
local sv = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local bv = 0
if two then bv = tonumber(redis.call('HGET', KEYS[2], 'v') or '0') end
if ARGV[2] == 'settle' then
  local cur = redis.call('HGET', KEYS[2], 's') or ''
  if sv ~= tonumber(ARGV[1]) or bv ~= tonumber(ARGV[3]) or cur ~= ARGV[4] then
    return {0, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
  end
  if ARGV[5] == '' then redis.call('HDEL', KEYS[2], 's') else redis.call('HSET', KEYS[2], 's', ARGV[5]) end
  return {3}
end
local cur = redis.call('HGET', KEYS[1], 'c') or 'b'
local writes_budget = two and ARGV[4] ~= '' and not join
local settling = false
if two then settling = redis.call('HGET', KEYS[2], 's') end
local n = tonumber(ARGV[9])
local m = tonumber(ARGV[12 + n])
local release = ''
if two then release = ARGV[13 + n + m] end
local blocked = writes_budget and settling and settling ~= release
if sv ~= tonumber(ARGV[1]) or (writes_budget and bv ~= tonumber(ARGV[2])) or blocked then
  if ARGV[3] ~= cur and string.sub(ARGV[3], 1, 2) == 'r:' then redis.call('HDEL', KEYS[1], ARGV[3]) end
  local b = {}
  if two then b = redis.call('HGETALL', KEYS[2]) end
  return {0, redis.call('HGETALL', KEYS[1]), b}
end
if redis.call('HEXISTS', KEYS[1], ARGV[3]) == 0 then return {4} end
local w = {'v', sv + 1, 'c', ARGV[3], 'd', ARGV[5]}
if ARGV[6] ~= '' then
  w[7] = ARGV[6]
  w[8] = ARGV[7]
  w[9] = 'p:' .. string.sub(ARGV[6], 3)
  if sv == 0 then w[10] = '' else w[10] = cur end
end
redis.call('HSET', KEYS[1], unpack(w))
local d = {}
if ARGV[6] == '' and sv > 0 then d[#d + 1] = cur end
for i = 1, n do
  local pf = 'p:' .. string.sub(ARGV[9 + i], 3)
  local p = redis.call('HGET', KEYS[1], pf)
  d[#d + 1] = ARGV[9 + i]
  d[#d + 1] = pf
  if p and (p == 'b' or string.sub(p, 1, 2) == 'r:') and p ~= ARGV[3] and p ~= cur then d[#d + 1] = p end
end
local k = tonumber(ARGV[15 + n + m])
for i = 1, k do
  local f = ARGV[15 + n + m + i]
  if f ~= ARGV[3] and f ~= cur and string.sub(f, 1, 2) == 'r:' then d[#d + 1] = f end
end
if #d > 0 then redis.call('HDEL', KEYS[1], unpack(d)) end
local ttl = tonumber(ARGV[8])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
if two then
  local h = 10 + n
  if ARGV[h] ~= '' then redis.call('HSET', KEYS[2], ARGV[h], ARGV[h + 1]) end
  for i = 1, m do redis.call('HDEL', KEYS[2], ARGV[h + 2 + i]) end
  if settling and release ~= '' and settling == release then redis.call('HDEL', KEYS[2], 's') end
end
if join then
  local created = 0
  if two and bv == 0 and ARGV[4] ~= '' then
    redis.call('HSET', KEYS[2], 'v', 1, 'b', ARGV[4])
    created = 1
    local cm = ARGV[14 + n + m]
    if ARGV[6] ~= '' and cm ~= '' then redis.call('HSET', KEYS[1], ARGV[6], cm) end
  end
  local b = {}
  if two then b = redis.call('HGETALL', KEYS[2]) end
  return {2, sv + 1, created, b}
end
if writes_budget then
  bv = bv + 1
  redis.call('HSET', KEYS[2], 'v', bv, 'b', ARGV[4])
  return {1, sv + 1, bv}
end
return {1, sv + 1, 0}
";

/// A call in `settle` mode: start, take over or give up a settlement of the shared
/// budget (see the contract above).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRequest {
    /// `P:{G}:s:<session_id>`.
    pub session_key: String,
    /// `P:{G}:b`.
    pub budget_key: String,
    /// Versions expected.
    pub expect_sv: u64,
    /// Budget version expected.
    pub expect_bv: u64,
    /// The `s` value expected now (`None`: no settlement in progress).
    pub expect: Option<String>,
    /// The new `s` value (`None`: take it off).
    pub set: Option<String>,
}

/// The script's keys and arguments for a [`SettleRequest`].
pub fn settle_keys_and_args(req: &SettleRequest) -> (Vec<String>, Vec<Vec<u8>>) {
    (
        vec![req.session_key.clone(), req.budget_key.clone()],
        vec![
            req.expect_sv.to_string().into_bytes(),
            b"settle".to_vec(),
            req.expect_bv.to_string().into_bytes(),
            req.expect.clone().unwrap_or_default().into_bytes(),
            req.set.clone().unwrap_or_default().into_bytes(),
        ],
    )
}

/// The script's keys and arguments for `req`, in order.
pub fn keys_and_args(req: &CasRequest) -> (Vec<String>, Vec<Vec<u8>>) {
    let mut keys = vec![req.session_key.clone()];
    if let Some(b) = &req.budget_key {
        keys.push(b.clone());
    }
    let mut args: Vec<Vec<u8>> = vec![
        req.expect_sv.to_string().into_bytes(),
        if req.join {
            b"join".to_vec()
        } else {
            req.expect_bv.to_string().into_bytes()
        },
        req.record_field.clone().into_bytes(),
        req.budget_blob.clone().unwrap_or_default(),
        req.daemon.clone().into_bytes(),
    ];
    match &req.marker {
        Some((seq, m)) => {
            args.push(marker_field(*seq).into_bytes());
            args.push(m.clone());
        }
        None => {
            args.push(Vec::new());
            args.push(Vec::new());
        }
    }
    args.push(req.ttl_ms.to_string().into_bytes());
    args.push(req.drop.len().to_string().into_bytes());
    for seq in &req.drop {
        args.push(marker_field(*seq).into_bytes());
    }
    match &req.hold {
        Some((field, amount)) => {
            args.push(field.clone().into_bytes());
            args.push(amount.to_string().into_bytes());
        }
        None => {
            args.push(Vec::new());
            args.push(Vec::new());
        }
    }
    args.push(req.drop_holds.len().to_string().into_bytes());
    for h in &req.drop_holds {
        args.push(h.clone().into_bytes());
    }
    args.push(req.release.clone().unwrap_or_default().into_bytes());
    args.push(req.created_marker.clone().unwrap_or_default());
    args.push(req.drop_fields.len().to_string().into_bytes());
    for f in &req.drop_fields {
        args.push(f.clone().into_bytes());
    }
    (keys, args)
}

/// An in-memory Redis holding only what the store uses: hashes, with the CAS script
/// run atomically (a `&mut` call). Expiry is recorded, not enforced.
#[derive(Debug, Default, Clone)]
pub struct Fake {
    /// Hashes by key.
    pub hashes: HashMap<String, Fields>,
    /// PEXPIRE given per key (ms).
    pub ttl: HashMap<String, u64>,
}

impl Fake {
    fn version(&self, key: &str) -> u64 {
        self.hashes
            .get(key)
            .and_then(|h| h.get("v"))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0)
    }

    /// HGETALL.
    pub fn hgetall(&self, key: &str) -> Fields {
        self.hashes.get(key).cloned().unwrap_or_default()
    }

    /// HDEL.
    pub fn hdel(&mut self, key: &str, field: &str) {
        if let Some(h) = self.hashes.get_mut(key) {
            h.remove(field);
            if h.is_empty() {
                self.hashes.remove(key);
            }
        }
    }

    fn settling(&self, key: &str) -> Option<String> {
        self.hashes
            .get(key)
            .and_then(|h| h.get("s"))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The script in `settle` mode: `true` if done, else the conflict answer.
    pub fn settle(&mut self, req: &SettleRequest) -> Result<(), CasReply> {
        let sv = self.version(&req.session_key);
        let bv = self.version(&req.budget_key);
        if sv != req.expect_sv
            || bv != req.expect_bv
            || self.settling(&req.budget_key) != req.expect
        {
            return Err(CasReply::Conflict {
                session: self.hgetall(&req.session_key),
                budget: self.hgetall(&req.budget_key),
            });
        }
        match &req.set {
            Some(v) => {
                self.hashes
                    .entry(req.budget_key.clone())
                    .or_default()
                    .insert("s".into(), v.clone().into_bytes());
            }
            None => self.hdel(&req.budget_key, "s"),
        }
        Ok(())
    }

    /// The staging `HSET` alone: a pipeline cut after it, whose script never ran (its
    /// record field stays, an orphan, until a later write deletes it).
    pub fn stage(&mut self, req: &CasRequest) {
        self.hashes
            .entry(req.session_key.clone())
            .or_default()
            .insert(req.record_field.clone(), req.session_blob.clone());
    }

    /// The write's pipeline: the staging `HSET`, then the CAS script.
    pub fn cas(&mut self, req: &CasRequest) -> CasReply {
        self.stage(req);
        self.script(req)
    }

    /// The CAS script alone (after [`Fake::stage`]).
    pub fn script(&mut self, req: &CasRequest) -> CasReply {
        let sv = self.version(&req.session_key);
        let cur = self
            .hashes
            .get(&req.session_key)
            .and_then(|h| h.get(CURRENT_FIELD))
            .map_or_else(
                || LEGACY_RECORD_FIELD.to_owned(),
                |c| String::from_utf8_lossy(c).into_owned(),
            );
        let bv = req.budget_key.as_deref().map_or(0, |k| self.version(k));
        let writes_budget = req.budget_key.is_some() && req.budget_blob.is_some() && !req.join;
        let settling = req.budget_key.as_deref().and_then(|k| self.settling(k));
        let blocked = writes_budget && settling.is_some() && settling != req.release;
        if sv != req.expect_sv || (writes_budget && bv != req.expect_bv) || blocked {
            if req.record_field != cur && req.record_field.starts_with(RECORD_FIELD) {
                self.hdel(&req.session_key, &req.record_field);
            }
            return CasReply::Conflict {
                session: self.hgetall(&req.session_key),
                budget: req
                    .budget_key
                    .as_deref()
                    .map(|k| self.hgetall(k))
                    .unwrap_or_default(),
            };
        }
        let staged = self
            .hashes
            .get(&req.session_key)
            .is_some_and(|h| h.contains_key(&req.record_field));
        if !staged {
            return CasReply::Unstaged;
        }
        let h = self.hashes.entry(req.session_key.clone()).or_default();
        h.insert("v".into(), (sv + 1).to_string().into_bytes());
        h.insert(CURRENT_FIELD.into(), req.record_field.clone().into_bytes());
        h.insert("d".into(), req.daemon.clone().into_bytes());
        match &req.marker {
            Some((seq, m)) => {
                h.insert(marker_field(*seq), m.clone());
                let before = if sv == 0 { String::new() } else { cur.clone() };
                h.insert(prev_field(*seq), before.into_bytes());
            }
            None if sv > 0 => {
                h.remove(&cur);
            }
            None => {}
        }
        for seq in &req.drop {
            h.remove(&marker_field(*seq));
            if let Some(p) = h.remove(&prev_field(*seq)) {
                let p = String::from_utf8_lossy(&p).into_owned();
                if (p == LEGACY_RECORD_FIELD || p.starts_with(RECORD_FIELD))
                    && p != req.record_field
                    && p != cur
                {
                    h.remove(&p);
                }
            }
        }
        for f in &req.drop_fields {
            if *f != req.record_field && *f != cur && f.starts_with(RECORD_FIELD) {
                h.remove(f);
            }
        }
        if req.ttl_ms > 0 {
            self.ttl.insert(req.session_key.clone(), req.ttl_ms);
        } else {
            self.ttl.remove(&req.session_key);
        }
        if let Some(k) = &req.budget_key {
            if let Some((field, amount)) = &req.hold {
                self.hashes
                    .entry(k.clone())
                    .or_default()
                    .insert(field.clone(), amount.to_string().into_bytes());
            }
            for h in &req.drop_holds {
                self.hdel(k, h);
            }
            if settling.is_some() && settling == req.release {
                self.hdel(k, "s");
            }
        }
        if req.join {
            let mut created = false;
            if let (Some(k), Some(b), 0) = (&req.budget_key, &req.budget_blob, bv) {
                let h = self.hashes.entry(k.clone()).or_default();
                h.insert("v".into(), b"1".to_vec());
                h.insert("b".into(), b.clone());
                created = true;
                if let (Some((seq, _)), Some(cm)) = (&req.marker, &req.created_marker) {
                    self.hashes
                        .entry(req.session_key.clone())
                        .or_default()
                        .insert(marker_field(*seq), cm.clone());
                }
            }
            return CasReply::Joined {
                sv: sv + 1,
                created,
                budget: req
                    .budget_key
                    .as_deref()
                    .map(|k| self.hgetall(k))
                    .unwrap_or_default(),
            };
        }
        if let (true, Some(k), Some(b)) = (writes_budget, &req.budget_key, &req.budget_blob) {
            let h = self.hashes.entry(k.clone()).or_default();
            h.insert("v".into(), (bv + 1).to_string().into_bytes());
            h.insert("b".into(), b.clone());
            return CasReply::Done {
                sv: sv + 1,
                bv: bv + 1,
            };
        }
        CasReply::Done { sv: sv + 1, bv: 0 }
    }
}
