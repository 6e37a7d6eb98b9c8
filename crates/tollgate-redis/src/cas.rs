//! The compare-and-set protocol, as pure functions over a daemon's cached view of one
//! session (and its shared budget): what a change writes, what the script must check,
//! which unconfirmed markers block, wait or need settling, and what a void restores.
//!
//! The store ([`crate::RedisStore`]) runs these against Redis (the Lua script in
//! [`crate::script`]); the model test runs the *same* functions against the in-memory
//! fake of the script ([`crate::script::Fake`]). Nothing here talks to a server.

use std::collections::BTreeMap;

use tollgate_audit::SessionEvent;
use tollgate_core::json::{self, Limits, Number, Value};
use tollgate_core::NonceWindow;
use tollgate_core::{Money, SessionStatus, UnixNanos};
use tollgate_store::record::{
    decode_budget, decode_session, encode_budget, encode_session, encode_session_into,
};
use tollgate_store::{ops, Budget, Session, Settled, StoreError};

/// A Redis hash as the script returns it: field name to value.
pub type Fields = BTreeMap<String, Vec<u8>>;

/// The most fields a session hash may hold (blob, version, daemon, markers).
pub const MAX_FIELDS: usize = 1024;

/// The field prefix of an unconfirmed marker (`u:<seq>`).
pub const MARKER_FIELD: &str = "u:";

/// The field prefix that says where the record a marker's change replaced is (`p:<seq>`):
/// written by the script itself, so the daemon never sends it. Its value is the name of
/// the record field ([`RECORD_FIELD`], or [`LEGACY_RECORD_FIELD`]) that held the session
/// before the change, or empty for the session's opening; in a hash written before
/// record fields existed it is the record itself.
pub const PREV_FIELD: &str = "p:";

/// The field name of the pointer to the record before change `seq` (beside its marker).
pub fn prev_field(seq: u64) -> String {
    format!("{PREV_FIELD}{seq}")
}

/// The field that names the field holding the current record (`c`).
pub const CURRENT_FIELD: &str = "c";

/// The prefix of a record field (`r:<seq>:<daemon>:<n>`). A change's record is written
/// into a fresh one by a plain `HSET` pipelined just before the script (so the record
/// never passes through Lua: a script that copies a long string costs Redis several times
/// more than the write), and the script makes it current by pointing [`CURRENT_FIELD`] at
/// it, only if the versions match (else it deletes it). The record it replaces stays
/// where it is, named by the change's `p:<seq>`, until the marker is dropped.
pub const RECORD_FIELD: &str = "r:";

/// Where a hash written before record fields existed keeps its record (`b`), and where
/// the script looks when [`CURRENT_FIELD`] is absent.
pub const LEGACY_RECORD_FIELD: &str = "b";

/// The most record fields a view lists as orphans (staged by a write whose script never
/// ran: a pipeline cut by a lost connection), for the next write to delete.
pub const MAX_ORPHANS: usize = 16;

/// A record field name no other write uses: the change's seq, the daemon, and a counter
/// of this process. Unique, because two writes racing for one version must never stage
/// into one field (the loser's `HSET` would overwrite the winner's record), and a retry
/// must never overwrite a field an earlier attempt made current.
pub fn staged_record_field(seq: u64, daemon: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{RECORD_FIELD}{seq}:{daemon}:{n}")
}

/// The current record of a session hash: the field [`CURRENT_FIELD`] names, or
/// [`LEGACY_RECORD_FIELD`] in a hash written before record fields existed.
pub fn current_record(session: &Fields) -> Option<&Vec<u8>> {
    match session.get(CURRENT_FIELD) {
        Some(c) => session.get(std::str::from_utf8(c).ok()?),
        None => session.get(LEGACY_RECORD_FIELD),
    }
}

/// The fields of a session hash that holds nothing but staged records (no `v`): openings
/// whose pipelines were cut after the staging `HSET`, so no session was ever written
/// there. `None` for any other hash. The sweeper deletes exactly these fields (a later
/// opening stages into a field of its own, which is never among them).
pub fn orphan_only_fields(session: &Fields) -> Option<Vec<String>> {
    (!session.is_empty()
        && !session.contains_key("v")
        && session.keys().all(|k| k.starts_with(RECORD_FIELD)))
    .then(|| session.keys().take(MAX_ORPHANS).cloned().collect())
}

/// Whether a `p:<seq>` value names a record field (rather than holding an old-layout
/// record itself, or being empty).
fn names_record_field(v: &[u8]) -> bool {
    v == LEGACY_RECORD_FIELD.as_bytes() || v.starts_with(RECORD_FIELD.as_bytes())
}

/// The first bytes of a session record in its stored form (field `b`): [`encode_stored`].
pub const STORED_MAGIC: &[u8; 4] = b"TGS2";

/// A session record as the session hash stores it (field `b`): [`STORED_MAGIC`], the
/// length of the JSON part (u32, little-endian), the record's canonical JSON
/// ([`encode_session`]) with `seen_nonces` empty, then the nonce window, oldest first,
/// 8 bytes (u64, little-endian) each. The window is most of a long-running session's
/// record (1,024 nonces by default): as bytes it is copied, not formatted and parsed,
/// on every change. A record whose JSON part would not fit a u32 is written as plain
/// JSON (which [`decode_stored`] also reads, as it reads records written before this
/// form). `s` is left as it was.
pub fn encode_stored(s: &mut Session) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 1024 + 8 * s.state.seen_nonces.len());
    out.extend_from_slice(STORED_MAGIC);
    out.extend_from_slice(&[0; 4]);
    // The JSON part, written in place (its length filled in after).
    let nonces = std::mem::take(&mut s.state.seen_nonces);
    encode_session_into(s, &mut out);
    s.state.seen_nonces = nonces;
    let Ok(len) = u32::try_from(out.len() - 8) else {
        return encode_session(s);
    };
    if let Some(l) = out.get_mut(4..8) {
        l.copy_from_slice(&len.to_le_bytes());
    }
    for n in &s.state.seen_nonces {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

/// Decode a stored session record ([`encode_stored`], or plain JSON) of at most
/// `max_bytes`; its heartbeat is `now`. The nonce part must be whole 8-byte nonces with no
/// repeat, and the JSON part's own `seen_nonces` empty.
pub fn decode_stored(bytes: &[u8], max_bytes: usize, now: i64) -> Result<Session, StoreError> {
    if bytes.len() > max_bytes {
        return Err(bad("session record too large"));
    }
    let Some(rest) = bytes.strip_prefix(STORED_MAGIC.as_slice()) else {
        return decode_session(bytes, max_bytes, now).map_err(|e| bad(&format!("session: {e}")));
    };
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| bad("stored record: short header"))?;
    let len =
        usize::try_from(u32::from_le_bytes(*len)).map_err(|_| bad("stored record: bad length"))?;
    if len > rest.len() {
        return Err(bad("stored record: its JSON part is cut short"));
    }
    let (json, tail) = rest.split_at(len);
    if tail.len() % 8 != 0 {
        return Err(bad("stored record: a nonce is cut short"));
    }
    let mut s = decode_session(json, max_bytes, now).map_err(|e| bad(&format!("session: {e}")))?;
    if !s.state.seen_nonces.is_empty() {
        return Err(bad("stored record: nonces in its JSON part"));
    }
    let window: NonceWindow = tail
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    if window.len() != tail.len() / 8 {
        return Err(bad("stored record: a nonce appears twice"));
    }
    s.state.seen_nonces = window;
    Ok(s)
}

/// The field prefix of a hold in the budget hash (`h:<session_id>\x1f<seq>`): a refund
/// whose entry is not yet known to be committed, by its amount (nano-dollars).
pub const HOLD_FIELD: &str = "h:";

/// The budget-hash field of a settlement in progress: `<daemon>\x1f<at_ms>\x1f<session>`. While it is
/// there, only the write that names it (the settlement's own) writes the budget, so the
/// settling daemon knows, before a void is decided, the version its give-back will have
/// (the void entry records it: `revert_version`).
pub const SETTLING_FIELD: &str = "s";

/// The holds of a shared budget: field name to amount.
pub type Holds = BTreeMap<String, i64>;

/// The budget-hash field of the hold of change `seq` of session `id`.
pub fn hold_field(id: &str, seq: u64) -> String {
    format!("{HOLD_FIELD}{id}\x1f{seq}")
}

/// One command of the confirmer's pipeline ([`confirm_commands`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmCommand {
    /// `HDEL key fields…`.
    Hdel {
        /// The hash.
        key: String,
        /// Its fields to delete.
        fields: Vec<String>,
    },
    /// `PEXPIRE key ms`.
    Pexpire {
        /// The key.
        key: String,
        /// Milliseconds.
        ms: u64,
    },
}

/// What the confirmer sends once change `seq` of a session is confirmed (its entry
/// committed), in order: the change's hold (`hold`: the budget hash and the hold's field),
/// if it put one (a refund); for a change that ended the session, the hash's expiry
/// (`expire_ms`: the session's TTL, set only now that no unconfirmed change is left in it:
/// see [`plan_commit`]); and last, the marker and the record before it from the session
/// hash `session_key`.
///
/// The commands go in one pipeline, not a transaction: a dropped connection or a Redis
/// restart can cut it after any of them. So the marker goes last: while it is there,
/// whoever settles it (an entry: its place is claimed) drops the hold and sets the expiry
/// in the same script call ([`plan_revert`]), and everything before it is safe alone (the
/// entry is committed: the change is never voided, so its refund need not be held). A
/// marker dropped first would leave, if the pipeline were cut there, a hold that nothing
/// takes off: its amount could never be spent again.
pub fn confirm_commands(
    session_key: &str,
    seq: u64,
    hold: Option<(&str, &str)>,
    expire_ms: Option<u64>,
    prev_record: &str,
) -> Vec<ConfirmCommand> {
    let mut out = Vec::with_capacity(3);
    if let Some((budget_key, field)) = hold {
        out.push(ConfirmCommand::Hdel {
            key: budget_key.to_owned(),
            fields: vec![field.to_owned()],
        });
    }
    if let Some(ms) = expire_ms {
        out.push(ConfirmCommand::Pexpire {
            key: session_key.to_owned(),
            ms: ms.max(1),
        });
    }
    let mut fields = vec![marker_field(seq), prev_field(seq)];
    if !prev_record.is_empty() {
        fields.push(prev_record.to_owned());
    }
    out.push(ConfirmCommand::Hdel {
        key: session_key.to_owned(),
        fields,
    });
    out
}

/// The holds in a budget hash (fields `h:…`), bounded like the hash.
pub fn holds_from_fields(f: &Fields) -> Result<Holds, StoreError> {
    let mut out = Holds::new();
    for (k, v) in f.range(HOLD_FIELD.to_owned()..) {
        if !k.starts_with(HOLD_FIELD) {
            break;
        }
        let amount = std::str::from_utf8(v)
            .ok()
            .filter(|t| t.len() <= 20)
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|a| *a > 0)
            .ok_or_else(|| bad("a hold is not a positive integer"))?;
        out.insert(k.clone(), amount);
    }
    Ok(out)
}

/// The settlement in progress in a budget hash (field `s`), if any.
pub fn settling_of(f: &Fields) -> Result<Option<String>, StoreError> {
    match f.get(SETTLING_FIELD) {
        None => Ok(None),
        Some(v) if v.len() <= 256 => String::from_utf8(v.clone())
            .map(Some)
            .map_err(|_| bad("settling field is not UTF-8")),
        Some(_) => Err(bad("settling field too large")),
    }
}

/// Who started a settlement, when, of which session (`daemon`, `at_ms`, `session_id`),
/// from its `s` value.
pub fn settling_parts(v: &str) -> Option<(&str, i64, &str)> {
    let mut it = v.splitn(3, '\x1f');
    let (d, at, id) = (it.next()?, it.next()?, it.next()?);
    Some((d, at.parse().ok()?, id))
}

/// The `s` value of a settlement of session `id` started by `me` at `now_ms`.
pub fn settling_value(me: &str, now_ms: i64, id: &str) -> String {
    format!("{me}\x1f{now_ms}\x1f{id}")
}

/// Whether the settlements of `seqs` need the budget held: a voided one would give
/// amounts back (a write of the budget whose version the void records).
pub fn settle_needs_budget(view: &View, seqs: &[u64]) -> bool {
    view.budget.is_some()
        && seqs.iter().any(|q| {
            view.markers
                .get(q)
                .is_some_and(|m| m.delta_remaining != 0 || m.delta_spent != 0)
        })
}

/// What the void of marker `seq` records about the shared budget (audit format 4):
/// the voided write's version and amounts, and `revert_version`, the version of the
/// give-back write (the view's budget version + 1: the settling daemon holds the budget,
/// so no other write comes between), 0 if nothing is given back.
pub fn void_budget(view: &View, seq: u64) -> tollgate_store::VoidBudget {
    let Some(m) = view.markers.get(&seq) else {
        return tollgate_store::VoidBudget::default();
    };
    if m.budget_version == 0 {
        return tollgate_store::VoidBudget::default();
    }
    let gives_back = m.delta_remaining != 0 || m.delta_spent != 0;
    tollgate_store::VoidBudget {
        budget_version: m.budget_version,
        budget_before: Money(m.budget_before),
        budget_after: Money(m.budget_before.wrapping_add(m.delta_remaining)),
        revert_version: match (gives_back, view.budget) {
            (true, Some((bv, _))) => bv.saturating_add(1),
            _ => 0,
        },
    }
}

/// The sum of `holds` (saturating).
pub fn held(holds: &Holds) -> i64 {
    holds.values().fold(0i64, |a, b| a.saturating_add(*b))
}

/// One call of the CAS script (see [`crate::script`] for the contract).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CasRequest {
    /// `P:{G}:s:<session_id>`.
    pub session_key: String,
    /// `P:{G}:b`, for a shared budget.
    pub budget_key: Option<String>,
    /// The session hash's `v` the change was decided on (0: the session must not exist).
    pub expect_sv: u64,
    /// The budget hash's `v` the change was decided on (0: the budget must not exist).
    /// Checked only when `budget_blob` is given (the change writes the budget).
    pub expect_bv: u64,
    /// The new session record.
    pub session_blob: Vec<u8>,
    /// The record field it is staged into ([`staged_record_field`]), which the script
    /// makes current.
    pub record_field: String,
    /// Record fields to delete with the write: orphans the view found
    /// ([`View::orphans`]).
    pub drop_fields: Vec<String>,
    /// The new budget record, if the change moved the shared budget.
    pub budget_blob: Option<Vec<u8>>,
    /// The writing daemon's id (field `d`).
    pub daemon: String,
    /// The unconfirmed marker to push: (seq, encoded [`Marker`]).
    pub marker: Option<(u64, Vec<u8>)>,
    /// Marker seqs to drop (confirmed or settled).
    pub drop: Vec<u64>,
    /// Expire the session hash after this many milliseconds (an ended session); 0: keep.
    pub ttl_ms: u64,
    /// A hold to put on the shared budget with this write (a refund): (field, amount).
    pub hold: Option<(String, i64)>,
    /// Holds to take off the shared budget (their changes are confirmed or settled).
    pub drop_holds: Vec<String>,
    /// The settlement in progress this write finishes (its `s` value): the write may
    /// write the budget while it is there, and takes it off. `None`: a budget write is
    /// refused (a conflict) while any settlement is in progress.
    pub release: Option<String>,
    /// For a join: the marker to push instead if the call starts the budget (it then
    /// wrote budget version 1, which a void of the opening must name).
    pub created_marker: Option<Vec<u8>>,
    /// A session's opening on a shared budget: `expect_bv` is not used; `budget_blob`
    /// starts the budget if it does not exist yet; the answer is [`CasReply::Joined`].
    pub join: bool,
}

/// What the script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasReply {
    /// Written: the session hash's new `v`, and the budget hash's new `v` if the call
    /// wrote the budget (0 if it did not: a version the call did not write is not
    /// answered, so it can never be paired with amounts from another read).
    Done {
        /// New session version.
        sv: u64,
        /// Budget version the call wrote (0: none).
        bv: u64,
    },
    /// A join ([`CasRequest::join`]) wrote the session: its new `v`, whether the call
    /// started the budget, and the budget hash as the call read it (version and amounts
    /// of one instant: the one the session was opened at).
    Joined {
        /// New session version.
        sv: u64,
        /// The call created the budget hash (from the request's `budget_blob`).
        created: bool,
        /// The budget hash after the call (empty without a budget key).
        budget: Fields,
    },
    /// A version differed: nothing was written; the current hashes (empty if absent).
    Conflict {
        /// The session hash.
        session: Fields,
        /// The budget hash (empty without a budget key or if absent).
        budget: Fields,
    },
    /// The versions matched, but the record field the write staged was not there when the
    /// script ran (the staging failed, or a sweep took it for an orphan while the pipeline
    /// was held up): nothing was written. The store answers it as a failed write.
    Unstaged,
}

/// The field name of marker `seq`.
pub fn marker_field(seq: u64) -> String {
    format!("{MARKER_FIELD}{seq}")
}

/// A change pushed to Redis whose audit entry is not yet known to be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The session version the change produced.
    pub seq: u64,
    /// The daemon that made it (random per process start).
    pub daemon: String,
    /// When it was made (Unix milliseconds, the daemon's clock).
    pub at_ms: i64,
    /// The session record before it, as stored (empty for the session's opening). Not
    /// part of the marker's value: the script keeps it in field `p:<seq>` ([`PREV_FIELD`]),
    /// copied from the `b` the change replaced.
    pub prev: Vec<u8>,
    /// The field holding `prev` in Redis (its `p:<seq>` value): dropped with the marker.
    /// Empty when there is none (the opening, or an old-layout marker whose `p:<seq>`
    /// holds the record itself).
    pub prev_field: String,
    /// What it moved the shared budget's `remaining` by (0 for a per-session budget).
    pub delta_remaining: i64,
    /// What it moved the shared budget's `spent` by.
    pub delta_spent: i64,
    /// The shared budget version its write produced (0: it wrote none).
    pub budget_version: u64,
    /// The shared budget's remaining amount before it.
    pub budget_before: i64,
}

fn bad(what: &str) -> StoreError {
    StoreError::Corrupt {
        key: "redis".to_owned(),
        reason: what.to_owned(),
    }
}

impl Marker {
    /// Canonical JSON, without `prev` (its own field, written by the script).
    pub fn encode(&self) -> Vec<u8> {
        let mut m = BTreeMap::new();
        let int = |i: i128| Value::Number(Number::Int(i));
        m.insert("seq".to_owned(), int(i128::from(self.seq)));
        m.insert("daemon".to_owned(), Value::from(self.daemon.as_str()));
        m.insert("at_ms".to_owned(), int(i128::from(self.at_ms)));
        m.insert("dr".to_owned(), int(i128::from(self.delta_remaining)));
        m.insert("ds".to_owned(), int(i128::from(self.delta_spent)));
        m.insert("bv".to_owned(), int(i128::from(self.budget_version)));
        m.insert("br".to_owned(), int(i128::from(self.budget_before)));
        let mut out = Vec::with_capacity(160);
        let _ = json::write_canonical(&Value::Object(m), &mut out);
        out
    }

    /// Decode a marker of at most `max_bytes`, with `prev`, the record before it (from
    /// its `p:<seq>` field, resolved), and `prev_field`, the field that holds it. A marker
    /// written before that field holds `prev` itself; one with neither is corrupt (a void
    /// could not restore the record before it).
    pub fn decode(
        bytes: &[u8],
        max_bytes: usize,
        prev: Option<&[u8]>,
        prev_field: String,
    ) -> Result<Marker, StoreError> {
        let v = json::parse(
            bytes,
            Limits {
                max_bytes,
                max_depth: 4,
            },
        )
        .map_err(|e| bad(&format!("marker: {e}")))?;
        let m = v.as_object().ok_or_else(|| bad("marker: not an object"))?;
        let get = |k: &str| m.get(k).ok_or_else(|| bad("marker: missing key"));
        let i = |k: &str| get(k)?.as_i64().ok_or_else(|| bad("marker: bad integer"));
        let s = |k: &str| {
            get(k)?
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad("marker: bad string"))
        };
        Ok(Marker {
            seq: get("seq")?.as_u64().ok_or_else(|| bad("marker: bad seq"))?,
            daemon: s("daemon")?,
            at_ms: i("at_ms")?,
            prev: match (prev, m.get("prev")) {
                (Some(p), _) => p.to_vec(),
                (None, Some(_)) => s("prev")?.into_bytes(),
                (None, None) => return Err(bad("marker: its record before is missing")),
            },
            prev_field,
            delta_remaining: i("dr")?,
            delta_spent: i("ds")?,
            // Markers written before these fields: 0 (the void then records no budget).
            budget_version: match m.get("bv") {
                Some(v) => v.as_u64().ok_or_else(|| bad("marker: bad bv"))?,
                None => 0,
            },
            budget_before: match m.get("br") {
                Some(v) => v.as_i64().ok_or_else(|| bad("marker: bad br"))?,
                None => 0,
            },
        })
    }
}

/// Bounds on what a daemon decodes from Redis.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The largest session record.
    pub max_blob_bytes: usize,
}

/// A daemon's copy of one session as stored: versions, record, markers, shared budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The session hash's `v`.
    pub sv: u64,
    /// The session record as stored at `sv`: the `prev` of the next change's marker, so a
    /// change never encodes the record it replaces.
    pub blob: Vec<u8>,
    /// The field holding it ([`CURRENT_FIELD`]'s value, or [`LEGACY_RECORD_FIELD`]).
    pub cur: String,
    /// Record fields that neither hold the current record nor a marker's record before
    /// (at most [`MAX_ORPHANS`]): the next write deletes them.
    pub orphans: Vec<String>,
    /// The session, its shared budget's amounts loaded.
    pub session: Session,
    /// Unconfirmed markers by seq.
    pub markers: BTreeMap<u64, Marker>,
    /// The shared budget hash's `v` and amounts (`None` for a per-session budget).
    pub budget: Option<(u64, Budget)>,
    /// The shared budget's holds as of that version, or more (holds are only put with a
    /// write of the budget, which changes its version; taking one off does not).
    pub holds: Holds,
    /// A settlement in progress on the shared budget (its `s` value), as of the read.
    pub settling: Option<String>,
}

fn parse_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| s.len() <= 20)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("version is not an integer"))
}

/// Decode a shared budget hash: `None` if absent (empty).
pub fn budget_from_fields(f: &Fields) -> Result<Option<(u64, Budget)>, StoreError> {
    if f.is_empty() {
        return Ok(None);
    }
    let v = parse_u64(f.get("v").ok_or_else(|| bad("budget without v"))?)?;
    let b = f.get("b").ok_or_else(|| bad("budget without b"))?;
    if b.len() > 4096 {
        return Err(bad("budget record too large"));
    }
    let budget = decode_budget(b).map_err(|e| bad(&format!("budget: {e}")))?;
    Ok(Some((v, budget)))
}

/// Decode a session hash and its budget hash into a view; `None` if the session hash is
/// absent. The heartbeat is `now` (not stored).
pub fn view_from_fields(
    session: &Fields,
    budget: &Fields,
    bounds: Bounds,
    now: i64,
) -> Result<Option<View>, StoreError> {
    if session.is_empty() {
        return Ok(None);
    }
    if session.len() > MAX_FIELDS {
        return Err(bad("session hash has too many fields"));
    }
    if !session.contains_key("v") && session.keys().all(|k| k.starts_with(RECORD_FIELD)) {
        // Only records staged by openings whose script never ran (their pipelines were
        // cut): no session was written. The sweeper deletes them.
        return Ok(None);
    }
    let sv = parse_u64(session.get("v").ok_or_else(|| bad("session without v"))?)?;
    let cur = match session.get(CURRENT_FIELD) {
        Some(c) if c.starts_with(RECORD_FIELD.as_bytes()) => {
            String::from_utf8(c.clone()).map_err(|_| bad("current record field is not UTF-8"))?
        }
        Some(_) => return Err(bad("current record field is not a record field")),
        None => LEGACY_RECORD_FIELD.to_owned(),
    };
    let blob = session
        .get(&cur)
        .ok_or_else(|| bad("session without its current record"))?;
    let mut s = decode_stored(blob, bounds.max_blob_bytes, now)?;
    let mut markers = BTreeMap::new();
    let mut kept = std::collections::BTreeSet::new();
    kept.insert(cur.as_str());
    for (k, v) in session {
        if let Some(seq) = k.strip_prefix(MARKER_FIELD) {
            let seq = parse_u64(seq.as_bytes())?;
            let (prev, prev_name) = match session.get(&prev_field(seq)) {
                Some(p) if names_record_field(p) => {
                    let name = std::str::from_utf8(p)
                        .map_err(|_| bad("record field name is not UTF-8"))?;
                    let (name, rec) = session
                        .get_key_value(name)
                        .ok_or_else(|| bad("marker: its record before is missing"))?;
                    kept.insert(name.as_str());
                    (Some(rec.as_slice()), name.clone())
                }
                Some(p) => (Some(p.as_slice()), String::new()),
                None => (None, String::new()),
            };
            let m = Marker::decode(
                v,
                bounds.max_blob_bytes.saturating_mul(2) + 4096,
                prev,
                prev_name,
            )?;
            if m.seq != seq {
                return Err(bad("marker seq differs from its field"));
            }
            markers.insert(seq, m);
        }
    }
    let orphans = session
        .keys()
        .filter(|k| k.starts_with(RECORD_FIELD) && !kept.contains(k.as_str()))
        .take(MAX_ORPHANS)
        .cloned()
        .collect();
    let (budget, holds, settling) = if s.meta.shared_budget_key().is_some() {
        let b = budget_from_fields(budget)?.ok_or_else(|| bad("shared budget is missing"))?;
        b.1.load_into(&mut s.state);
        (Some(b), holds_from_fields(budget)?, settling_of(budget)?)
    } else {
        (None, Holds::new(), None)
    };
    Ok(Some(View {
        sv,
        blob: blob.clone(),
        cur,
        orphans,
        session: s,
        markers,
        budget,
        holds,
        settling,
    }))
}

/// What the unconfirmed markers of a view mean for a daemon about to change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerAction {
    /// None blocks: go ahead.
    Proceed,
    /// Another daemon's change (or an orphan of this one's) is unconfirmed and younger
    /// than grace: back off, re-read, retry.
    Wait,
    /// Only this daemon's own change, in flight to its journal, is unconfirmed: wait for
    /// its entry to commit (no re-read needed), then retry.
    WaitOwn,
    /// These markers (ascending) are older than grace: settle them first.
    Settle(Vec<u64>),
}

/// Classify `view`'s markers for daemon `me`: its own markers up to `confirmed_upto`
/// have committed entries (they are dropped with its next write); `in_flight` says
/// which of its own are submitted to its journal and not yet complete.
///
/// A daemon never writes on top of an unconfirmed change, not even its own: so at most
/// one change of a session is unconfirmed at a time, and settling it cannot race a later
/// change stacked on it (whose entry could otherwise commit after the change below it
/// was voided). With `sweep` (the sweeper), every marker older than grace and not
/// confirmed by `me` is settled, in flight or not.
pub fn check_markers(
    view: &View,
    me: &str,
    confirmed_upto: u64,
    in_flight: &dyn Fn(u64) -> bool,
    now_ms: i64,
    grace_ms: i64,
    sweep: bool,
) -> MarkerAction {
    let mut settle = Vec::new();
    let mut wait = false;
    let mut wait_own = false;
    for m in view.markers.values() {
        let mine = m.daemon == me;
        if mine && m.seq <= confirmed_upto {
            continue;
        }
        let old = now_ms.saturating_sub(m.at_ms) >= grace_ms;
        if mine && in_flight(m.seq) && !sweep {
            wait_own = true;
        } else if old {
            settle.push(m.seq);
        } else {
            wait = true;
        }
    }
    if !settle.is_empty() {
        MarkerAction::Settle(settle)
    } else if wait {
        MarkerAction::Wait
    } else if wait_own {
        MarkerAction::WaitOwn
    } else {
        MarkerAction::Proceed
    }
}

/// A planned write and what the view becomes once it succeeds.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The script call.
    pub request: CasRequest,
    /// The session after the change.
    pub session: Session,
    /// The pushed marker.
    pub marker: Option<Marker>,
    /// A join's marker if it starts the budget ([`CasRequest::created_marker`]).
    pub created_marker: Option<Marker>,
}

/// Plan the write of a committed change: `s` is the session after the closure ran on a
/// copy of `view.session`, `event` the record it returned (given the budget version the
/// write will produce, if it writes the shared budget: the view's version + 1, which the
/// script checks). Checks what the embedded engine checks (one change, through `ops`, to
/// this session). `confirmed_upto`: own markers up to it have committed entries and are
/// dropped.
///
/// A commit sets no expiry, not even one that ends the session (`Change::End`): it pushes
/// an unconfirmed marker, and a hash holding one must not expire, or a daemon that died
/// before its entry committed leaves a change that is neither in the log nor voidable
/// (the settler finds nothing to revert). An end's expiry is set once its marker goes:
/// by the confirmer ([`confirm_commands`]) or by the settlement that settles it
/// ([`plan_revert`]).
#[allow(clippy::too_many_arguments)]
pub fn plan_commit(
    view: &View,
    session_key: &str,
    budget_key: Option<&str>,
    mut s: Session,
    event: &mut SessionEvent,
    me: &str,
    now_ms: i64,
    confirmed_upto: u64,
) -> Result<Planned, StoreError> {
    let id = view.session.meta.session_id.as_str();
    let seq = view.session.seq;
    if event.session_seq() != seq.saturating_add(1)
        || s.seq != event.session_seq()
        || event.session_id() != id
        || s.meta != view.session.meta
        || s.last_call_number < view.session.last_call_number
    {
        return Err(StoreError::Failed {
            message: format!(
                "session `{id}`: a commit did not follow its state (version {seq} to {}, entry {})",
                s.seq,
                event.session_seq()
            ),
        });
    }
    let old = Budget::of(&view.session.state);
    let new = Budget::of(&s.state);
    let (budget_blob, dr, ds) = match (&view.budget, budget_key) {
        (Some(_), Some(_)) if new != old => (
            Some(encode_budget(&new)),
            new.remaining.0.wrapping_sub(old.remaining.0),
            new.spent.0.wrapping_sub(old.spent.0),
        ),
        _ => (None, 0, 0),
    };
    event.set_budget_version(match (&budget_blob, view.budget) {
        (Some(_), Some((bv, _))) => bv.saturating_add(1),
        _ => 0,
    });
    let marker = Marker {
        seq: s.seq,
        daemon: me.to_owned(),
        at_ms: now_ms,
        prev: view.blob.clone(),
        prev_field: view.cur.clone(),
        delta_remaining: dr,
        delta_spent: ds,
        budget_version: event.budget_version(),
        budget_before: if event.budget_version() == 0 {
            0
        } else {
            old.remaining.0
        },
    };
    let drop = own_confirmed(view, me, confirmed_upto);
    // A refund is held until its entry is confirmed: nobody spends it before (a void
    // takes it back, and must find it there).
    let hold = (dr > 0).then(|| (hold_field(id, s.seq), dr));
    let drop_holds = if view.budget.is_some() {
        drop.iter().map(|q| hold_field(id, *q)).collect()
    } else {
        Vec::new()
    };
    Ok(Planned {
        request: CasRequest {
            session_key: session_key.to_owned(),
            budget_key: budget_key.map(str::to_owned),
            expect_sv: view.sv,
            expect_bv: view.budget.map_or(0, |b| b.0),
            session_blob: encode_stored(&mut s),
            record_field: staged_record_field(s.seq, me),
            drop_fields: view.orphans.clone(),
            budget_blob,
            daemon: me.to_owned(),
            marker: Some((s.seq, marker.encode())),
            drop,
            ttl_ms: 0,
            hold,
            drop_holds,
            release: None,
            created_marker: None,
            join: false,
        },
        session: s,
        marker: Some(marker),
        created_marker: None,
    })
}

fn own_confirmed(view: &View, me: &str, confirmed_upto: u64) -> Vec<u64> {
    view.markers
        .values()
        .filter(|m| m.daemon == me && m.seq <= confirmed_upto)
        .map(|m| m.seq)
        .collect()
}

/// Plan the settlement of markers `outcomes` (ascending seq, each settled by the
/// arbiter): drop those whose entry holds the place; for voided ones, restore the
/// session to the record before the lowest voided one (keeping the highest voided seq:
/// the versions stay used) and take their budget deltas back from the shared budget.
#[allow(clippy::too_many_arguments)]
pub fn plan_revert(
    view: &View,
    session_key: &str,
    budget_key: Option<&str>,
    outcomes: &[(u64, Settled)],
    me: &str,
    bounds: Bounds,
    ttl_ms: u64,
    release: Option<String>,
) -> Result<Planned, StoreError> {
    let first_void = outcomes.iter().find(|(_, o)| *o == Settled::Void);
    let mut s = view.session.clone();
    let mut budget = view.budget.map(|b| b.1);
    if let Some((low, _)) = first_void {
        if outcomes
            .iter()
            .any(|(seq, o)| seq > low && *o == Settled::Entry)
        {
            return Err(StoreError::Failed {
                message: format!(
                    "session `{}`: an entry holds a version after a voided one",
                    view.session.meta.session_id
                ),
            });
        }
        let m = view
            .markers
            .get(low)
            .ok_or_else(|| bad("settled marker is not in the view"))?;
        let top = outcomes.iter().map(|(seq, _)| *seq).max().unwrap_or(*low);
        if m.prev.is_empty() {
            // The opening itself is void: the session never existed; it stays ended.
            s.state.status = SessionStatus::Terminated;
        } else {
            let heartbeat = s.last_heartbeat_ns;
            s = decode_stored(&m.prev, bounds.max_blob_bytes, heartbeat)
                .map_err(|e| bad(&format!("marker prev: {e}")))?;
        }
        s.seq = top.max(s.seq);
        if let Some(b) = budget.as_mut() {
            for (seq, _) in outcomes.iter().filter(|(q, _)| q >= low) {
                if let Some(v) = view.markers.get(seq) {
                    b.remaining = Money(b.remaining.0.wrapping_sub(v.delta_remaining));
                    b.spent = Money(b.spent.0.wrapping_sub(v.delta_spent));
                }
            }
            b.load_into(&mut s.state);
        }
    }
    let changed_budget = match (view.budget, budget) {
        (Some((_, old)), Some(new)) if old != new => Some(encode_budget(&new)),
        _ => None,
    };
    // An ended session expires once no unconfirmed change is left in its hash.
    let settled_all = view
        .markers
        .keys()
        .all(|q| outcomes.iter().any(|(seq, _)| seq == q));
    let ttl = if s.state.status == SessionStatus::Terminated && settled_all {
        ttl_ms
    } else {
        0
    };
    Ok(Planned {
        request: CasRequest {
            session_key: session_key.to_owned(),
            budget_key: budget_key.map(str::to_owned),
            expect_sv: view.sv,
            expect_bv: view.budget.map_or(0, |b| b.0),
            session_blob: encode_stored(&mut s),
            record_field: staged_record_field(s.seq, me),
            drop_fields: view.orphans.clone(),
            budget_blob: changed_budget,
            daemon: me.to_owned(),
            marker: None,
            drop: outcomes.iter().map(|(seq, _)| *seq).collect(),
            ttl_ms: ttl,
            hold: None,
            drop_holds: if view.budget.is_some() {
                outcomes
                    .iter()
                    .map(|(seq, _)| hold_field(&view.session.meta.session_id, *seq))
                    .collect()
            } else {
                Vec::new()
            },
            release,
            created_marker: None,
            join: false,
        },
        session: s,
        marker: None,
        created_marker: None,
    })
}

/// Whether the change from `view.session` to `s` spends money that is held (refunds not
/// yet confirmed): it lowers the shared budget's remaining amount below the sum of the
/// holds. Such a change is not written; the store waits for the holds to go (their
/// entries confirmed, or their changes settled) and decides again.
pub fn dips_into_holds(view: &View, s: &Session) -> bool {
    if view.budget.is_none() || view.holds.is_empty() {
        return false;
    }
    let old = Budget::of(&view.session.state);
    let new = Budget::of(&s.state);
    new.remaining < old.remaining && new.remaining.0 < held(&view.holds)
}

/// Plan the opening of `session` (at version 0, its own starting budget in its state):
/// one script call, with no read before it. For a shared budget it is a join
/// ([`CasRequest::join`]): the budget is started from the session's own amounts if it
/// does not exist, and otherwise left alone; either way the session is then opened on the
/// amounts the script answers ([`after_join`]), never on amounts read before.
/// Returns the write and the opening's record for a session with its own budget (a
/// join's record is made by [`after_join`]).
pub fn plan_open(
    session: &Session,
    session_key: &str,
    budget_key: Option<&str>,
    me: &str,
    now_ms: i64,
    now: UnixNanos,
) -> (Planned, SessionEvent) {
    let mut s = session.clone();
    let record = ops::open(&mut s, now);
    let marker = Marker {
        seq: s.seq,
        daemon: me.to_owned(),
        at_ms: now_ms,
        prev: Vec::new(),
        prev_field: String::new(),
        delta_remaining: 0,
        delta_spent: 0,
        budget_version: 0,
        budget_before: 0,
    };
    let shared = budget_key.is_some() && session.meta.shared_budget_key().is_some();
    let created = shared.then(|| Marker {
        budget_version: 1,
        budget_before: s.state.budget_remaining.0,
        ..marker.clone()
    });
    let request = CasRequest {
        session_key: session_key.to_owned(),
        budget_key: budget_key.map(str::to_owned),
        expect_sv: 0,
        expect_bv: 0,
        session_blob: encode_stored(&mut s),
        record_field: staged_record_field(s.seq, me),
        drop_fields: Vec::new(),
        budget_blob: shared.then(|| encode_budget(&Budget::of(&s.state))),
        daemon: me.to_owned(),
        marker: Some((s.seq, marker.encode())),
        drop: Vec::new(),
        ttl_ms: 0,
        hold: None,
        drop_holds: Vec::new(),
        release: None,
        created_marker: created.as_ref().map(Marker::encode),
        join: shared,
    };
    (
        Planned {
            request,
            session: s,
            marker: Some(marker),
            created_marker: created,
        },
        record.into(),
    )
}

/// The view and the opening's record after a join was written (`Joined`): `session` is
/// the session before its opening (as given to [`plan_open`]), opened again at `now` on
/// the budget hash the script read, so the cached (version, amounts) pair and the
/// record's `budget_before` are those of one read, taken when the session was written.
/// The record's `budget_version` is 1 if this opening started the budget (it wrote
/// version 1), else 0 (a join writes no budget).
pub fn after_join(
    planned: Planned,
    session: &Session,
    now: UnixNanos,
    sv: u64,
    created: bool,
    budget: &Fields,
) -> Result<(View, SessionEvent), StoreError> {
    let (bv, b) = budget_from_fields(budget)?.ok_or_else(|| bad("a joined budget is missing"))?;
    let mut s = session.clone();
    b.load_into(&mut s.state);
    let mut record = ops::open(&mut s, now);
    record.budget_version = u64::from(created);
    let view = View {
        sv,
        blob: planned.request.session_blob,
        cur: planned.request.record_field,
        orphans: Vec::new(),
        budget: Some((bv, b)),
        holds: holds_from_fields(budget)?,
        settling: settling_of(budget)?,
        markers: if created {
            planned.created_marker
        } else {
            planned.marker
        }
        .map(|m| (m.seq, m))
        .into_iter()
        .collect(),
        session: s,
    };
    Ok((view, record.into()))
}

/// The view after `planned` was written (`Done { sv, bv }`), from the `view` it was
/// planned on (consumed: its markers, each with the record before it, are moved, not
/// copied).
pub fn after_done(view: View, planned: Planned, sv: u64, bv: u64) -> View {
    let mut markers = view.markers;
    for seq in &planned.request.drop {
        markers.remove(seq);
    }
    if let Some(m) = planned.marker {
        markers.insert(m.seq, m);
    }
    // A budget the script did not write keeps the version this view read (the reply's
    // may be newer, with amounts this view does not have).
    let budget = match (view.budget, &planned.request.budget_blob) {
        (Some(_), Some(_)) => Some((bv, Budget::of(&planned.session.state))),
        (b, _) => b,
    };
    let mut holds = view.holds;
    for h in &planned.request.drop_holds {
        holds.remove(h);
    }
    if let Some((h, amount)) = &planned.request.hold {
        holds.insert(h.clone(), *amount);
    }
    let settling = if planned.request.release.is_some() {
        None
    } else {
        view.settling
    };
    View {
        sv,
        blob: planned.request.session_blob,
        cur: planned.request.record_field,
        orphans: Vec::new(),
        session: planned.session,
        markers,
        budget,
        holds,
        settling,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker() -> Marker {
        Marker {
            seq: 7,
            daemon: "d1".into(),
            at_ms: 1_700_000_000_000,
            prev: br#"{"v":2,"x":"\"quoted\""}"#.to_vec(),
            prev_field: "r:6:d1:0".into(),
            delta_remaining: -9_000_000_000_000_000,
            delta_spent: 5,
            budget_version: 12,
            budget_before: 77,
        }
    }

    #[test]
    fn markers_round_trip_exactly_and_are_bounded() {
        let m = marker();
        let bytes = m.encode();
        // The record before is not in the value (the script keeps it beside it).
        assert!(!String::from_utf8_lossy(&bytes).contains("quoted"));
        let name = || m.prev_field.clone();
        assert_eq!(
            Marker::decode(&bytes, 1 << 20, Some(&m.prev), name()).unwrap(),
            m
        );
        assert!(Marker::decode(&bytes, bytes.len() - 1, Some(&m.prev), name()).is_err());
        assert!(Marker::decode(b"{\"seq\":1}", 1 << 20, Some(b""), name()).is_err());
        // Without its field the marker is corrupt: a void could not restore anything.
        assert!(Marker::decode(&bytes, 1 << 20, None, name()).is_err());
    }

    #[test]
    fn a_marker_written_with_its_record_inline_still_reads() {
        let m = marker();
        let mut map = BTreeMap::new();
        let int = |i: i128| Value::Number(Number::Int(i));
        map.insert("seq".to_owned(), int(7));
        map.insert("daemon".to_owned(), Value::from("d1"));
        map.insert("at_ms".to_owned(), int(1_700_000_000_000));
        map.insert(
            "prev".to_owned(),
            Value::from(String::from_utf8_lossy(&m.prev).as_ref()),
        );
        map.insert("dr".to_owned(), int(-9_000_000_000_000_000));
        map.insert("ds".to_owned(), int(5));
        map.insert("bv".to_owned(), int(12));
        map.insert("br".to_owned(), int(77));
        let bytes = json::to_canonical_vec(&Value::Object(map)).unwrap();
        let m = Marker {
            prev_field: String::new(),
            ..m
        };
        assert_eq!(
            Marker::decode(&bytes, 1 << 20, None, String::new()).unwrap(),
            m
        );
    }

    fn session_with(nonces: &[u64], reservations: &[(u64, i64)]) -> Session {
        use tollgate_core::state::Reservation;
        use tollgate_core::{BudgetScope, GuardConfig};
        use tollgate_store::{Policy, SessionMeta};
        let mut s = Session::new(
            SessionMeta {
                session_id: "s-1".into(),
                agent_id: "agent \"q\"".into(),
                organization_id: "org".into(),
                budget_scope: BudgetScope::PerSession,
                created_at_ns: 5,
            },
            std::sync::Arc::new(Policy::new(GuardConfig {
                budget: Money(1_000),
                ..GuardConfig::default()
            })),
            9,
        );
        s.seq = 3;
        s.last_call_number = 44;
        s.state.seen_nonces = nonces.iter().copied().collect();
        for (c, a) in reservations {
            s.state.reservations.insert(
                *c,
                Reservation {
                    estimated: Money(*a),
                    deducted: Money(*a),
                },
            );
        }
        s
    }

    proptest::proptest! {
        /// The stored form holds exactly the record: decoding it gives the session back,
        /// whose canonical record is the one the JSON form writes, nonces in their order.
        #[test]
        fn the_stored_form_is_the_record(
            nonces in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..200),
            res in proptest::collection::vec((1u64..1000, 0i64..5000), 0..20),
        ) {
            let mut s = session_with(&nonces, &res);
            let stored = encode_stored(&mut s);
            proptest::prop_assert!(stored.starts_with(STORED_MAGIC));
            // Byte for byte the documented layout: magic, the JSON part's length, the
            // JSON part (the record without its nonces), the nonces.
            let mut bare = s.clone();
            bare.state.seen_nonces = Default::default();
            let json = encode_session(&bare);
            let mut layout = STORED_MAGIC.to_vec();
            layout.extend_from_slice(&u32::try_from(json.len()).unwrap().to_le_bytes());
            layout.extend_from_slice(&json);
            for n in &s.state.seen_nonces {
                layout.extend_from_slice(&n.to_le_bytes());
            }
            proptest::prop_assert_eq!(&stored, &layout);
            let back = decode_stored(&stored, 1 << 20, 9).unwrap();
            proptest::prop_assert_eq!(encode_session(&back), encode_session(&s));
            proptest::prop_assert_eq!(&back.state.seen_nonces, &s.state.seen_nonces);
            // The JSON form (records written before the stored form) still reads.
            let plain = decode_stored(&encode_session(&s), 1 << 20, 9).unwrap();
            proptest::prop_assert_eq!(encode_session(&plain), encode_session(&s));
        }

        #[test]
        fn stored_garbage_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let mut b = STORED_MAGIC.to_vec();
            b.extend_from_slice(&bytes);
            let _ = decode_stored(&b, 1 << 20, 0);
            let _ = decode_stored(&bytes, 1 << 20, 0);
        }
    }

    #[test]
    fn a_stored_record_that_lies_is_refused() {
        let mut s = session_with(&[7, 3, 9], &[]);
        let good = encode_stored(&mut s);
        // A nonce cut short.
        assert!(decode_stored(&good[..good.len() - 1], 1 << 20, 0).is_err());
        // A nonce twice.
        let mut twice = good.clone();
        twice.extend_from_slice(&7u64.to_le_bytes());
        assert!(decode_stored(&twice, 1 << 20, 0).is_err());
        // A JSON part longer than the record.
        let mut long = good.clone();
        long[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_stored(&long, 1 << 20, 0).is_err());
        // Nonces in the JSON part beside the binary ones.
        let json = encode_session(&s);
        let mut both = STORED_MAGIC.to_vec();
        both.extend_from_slice(&u32::try_from(json.len()).unwrap().to_le_bytes());
        both.extend_from_slice(&json);
        assert!(decode_stored(&both, 1 << 20, 0).is_err());
        // Past the bound.
        assert!(decode_stored(&good, good.len() - 1, 0).is_err());
    }

    #[test]
    fn versions_must_be_plain_integers() {
        let mut s = Fields::new();
        s.insert("v".into(), b"12x".to_vec());
        s.insert("b".into(), b"{}".to_vec());
        let b = Fields::new();
        let bounds = Bounds {
            max_blob_bytes: 1 << 20,
        };
        assert!(view_from_fields(&s, &b, bounds, 0).is_err());
        assert_eq!(view_from_fields(&Fields::new(), &b, bounds, 0), Ok(None));
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = Marker::decode(&bytes, 1 << 20, None, String::new());
            let mut f = Fields::new();
            f.insert("v".into(), bytes.clone());
            f.insert("b".into(), bytes.clone());
            f.insert("u:1".into(), bytes.clone());
            f.insert("p:1".into(), b"r:1".to_vec());
            f.insert("c".into(), b"r:2".to_vec());
            f.insert("r:2".into(), bytes);
            let _ = budget_from_fields(&f);
            let _ = view_from_fields(&f, &f, Bounds { max_blob_bytes: 1 << 20 }, 0);
        }
    }
}
