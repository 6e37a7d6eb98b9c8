//! The request model: what a policy sees of a tool call.
//!
//! | Cedar            | Tollgate                                                              |
//! |------------------|-----------------------------------------------------------------------|
//! | `principal`      | `Agent::"ORG/AGENT"`, in `Organization::"ORG"`, with attributes `organization` and `agent` (strings) |
//! | `action`         | `Action::"TOOL"`: one action per tool name                              |
//! | `resource`       | `Upstream::"NAME"`: where the tool lives (the MCP gateway's upstream; [`LOCAL_UPSTREAM`] elsewhere) |
//! | `context.args`   | the call's params ([`crate::args`]); absent when the caller sent none  |
//! | `context.tool`   | the tool name, as a string (for `like "github_*"`)                    |
//! | `context.cost_usd` | the call's estimated cost, `decimal`, rounded **up** to 0.0001 USD  |
//! | `context.now`    | the decision's time, `datetime` (milliseconds, UTC): an input, never read from a clock |
//! | `context.session.calls` | calls the session has had allowed, `Long`                      |
//! | `context.session.budget_initial_usd` | `decimal`, rounded **down** to 0.0001 USD          |
//! | `context.session.budget_remaining_usd` | `decimal`, rounded **down** to 0.0001 USD        |
//! | `context.session.budget_fraction` | remaining ÷ initial, `decimal` in [0, 1], rounded **down**; 0 with no budget |
//! | `context.session.labels` | the session's flow labels, a set of strings                   |
//!
//! Money in Tollgate is exact to the nano-dollar, finer than `decimal`'s four places, so
//! the money fields are *defined* as rounded, each in the direction that keeps the usual
//! rules exact: with a threshold written to four places, `cost_usd.greaterThan(t)` and
//! `budget_remaining_usd.lessThan(t)` (and `budget_fraction.lessThan(t)`) are true exactly
//! when the unrounded amount is above (below) `t`. Arguments, which are the agent's data
//! and whose meaning Tollgate does not know, are never rounded ([`crate::number`]).

use std::collections::{HashMap, HashSet};

use cedar_policy::{Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression};
use tollgate_core::labels::LabelSet;
use tollgate_core::{Money, UnixNanos};

/// The resource of a call outside the MCP gateway: the agent runs the tool itself.
pub const LOCAL_UPSTREAM: &str = "local";

/// Longest organization, agent or upstream name accepted into a principal or resource.
pub const MAX_NAME_BYTES: usize = 256;

/// Whether `upstream` may name a resource ([`tollgate_core::is_upstream_name`]): exactly
/// the names an audited verdict can record (format version 8), so a replay decides for the
/// same resource as the call was decided for; a call naming any other is refused as
/// malformed.
pub use tollgate_core::is_upstream_name;

/// Who is calling, and where the tool lives: the principal and resource of every request
/// of one session. Built once (per session, per policy set) with
/// [`crate::Policies::actor`], because building Cedar's entity store costs more than most
/// evaluations.
#[derive(Debug, Clone)]
pub struct Actor {
    pub(crate) principal: EntityUid,
    pub(crate) resource: EntityUid,
    pub(crate) entities: cedar_policy::Entities,
    /// The policy set this was built for (its digest), so a stale actor is rebuilt.
    pub(crate) set: tollgate_core::Digest,
}

impl Actor {
    /// The principal, `Agent::"ORG/AGENT"`.
    pub fn principal(&self) -> String {
        self.principal.to_string()
    }
}

/// One call, as the policies see it. Everything is an input: the evaluation reads no
/// clock and no store.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The tool's name: the action.
    pub tool: &'a str,
    /// The call's params, when the caller sent them. A policy that applies to this tool
    /// and reads `context.args` refuses a call without them.
    pub args: Option<&'a tollgate_core::json::Value>,
    /// The estimated cost.
    pub cost: Money,
    /// The decision's time.
    pub now: UnixNanos,
    /// The session as it stands before this call.
    pub session: SessionView<'a>,
    /// Whether this call is the re-dispatch a human approved: a permit marked `@hitl`
    /// then counts as a plain permit (a `forbid` still refuses it).
    pub approved: bool,
}

/// What a policy sees of the session.
#[derive(Debug, Clone, Copy)]
pub struct SessionView<'a> {
    /// Calls allowed so far.
    pub calls: u64,
    /// The budget the session started with.
    pub budget_initial: Money,
    /// What is left.
    pub budget_remaining: Money,
    /// Its flow labels.
    pub labels: &'a LabelSet,
}

/// Which context fields a policy (or a slice of policies) reads: the request carries only
/// those, since building Cedar values costs more than most evaluations. A policy cannot
/// observe a field it never names (a `has` test names it too), so leaving the others out
/// changes no outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Needs {
    pub tool: bool,
    pub cost: bool,
    pub now: bool,
    pub calls: bool,
    pub initial: bool,
    pub remaining: bool,
    pub fraction: bool,
    pub labels: bool,
}

impl Needs {
    /// Every field.
    pub fn all() -> Needs {
        Needs {
            tool: true,
            cost: true,
            now: true,
            calls: true,
            initial: true,
            remaining: true,
            fraction: true,
            labels: true,
        }
    }

    /// Add what reading `path` (below `context`) needs.
    pub fn add(&mut self, path: &[String]) {
        let key = |i: usize| path.get(i).map(String::as_str);
        match (key(0), key(1)) {
            (None, _) => *self = Needs::all(),
            (Some("tool"), _) => self.tool = true,
            (Some("cost_usd"), _) => self.cost = true,
            (Some("now"), _) => self.now = true,
            (Some("session"), None) => {
                self.calls = true;
                self.initial = true;
                self.remaining = true;
                self.fraction = true;
                self.labels = true;
            }
            (Some("session"), Some("calls")) => self.calls = true,
            (Some("session"), Some("budget_initial_usd")) => self.initial = true,
            (Some("session"), Some("budget_remaining_usd")) => self.remaining = true,
            (Some("session"), Some("budget_fraction")) => self.fraction = true,
            (Some("session"), Some("labels")) => self.labels = true,
            // `args` is decided separately; other names are not in the context at all.
            _ => {}
        }
    }

    /// Both.
    pub fn union(self, o: Needs) -> Needs {
        Needs {
            tool: self.tool || o.tool,
            cost: self.cost || o.cost,
            now: self.now || o.now,
            calls: self.calls || o.calls,
            initial: self.initial || o.initial,
            remaining: self.remaining || o.remaining,
            fraction: self.fraction || o.fraction,
            labels: self.labels || o.labels,
        }
    }

    pub fn session(&self) -> bool {
        self.calls || self.initial || self.remaining || self.fraction || self.labels
    }
}

/// Names parsed, and extension functions looked up, once per set: Cedar's public
/// constructors (`new_decimal`, `EntityTypeName` from text) run its full parser for a name
/// on every call, and a context built from restricted expressions is evaluated again by
/// Cedar, which together cost more than an evaluation. The context is built from Cedar's
/// values directly instead ([`Names::decimal`] calls the `decimal` constructor itself, with
/// the same text a policy's `decimal("...")` would give it, so the value is the same).
#[derive(Debug, Clone)]
pub(crate) struct Names {
    decimal: &'static cedar_policy_core::ast::ExtensionFunction,
    datetime: &'static cedar_policy_core::ast::ExtensionFunction,
    pub action: EntityTypeName,
}

/// A Cedar value, as the context is built from.
pub(crate) type CedarValue = cedar_policy_core::ast::Value;

impl Names {
    pub fn new() -> Option<Names> {
        use cedar_policy_core::ast::Name;
        use cedar_policy_core::extensions::Extensions;
        let all = Extensions::all_available();
        let decimal = Name::parse_unqualified_name("decimal").ok()?;
        let datetime = Name::parse_unqualified_name("datetime").ok()?;
        Some(Names {
            decimal: all.func(&decimal).ok()?,
            datetime: all.func(&datetime).ok()?,
            action: type_name("Action")?,
        })
    }

    fn call(f: &cedar_policy_core::ast::ExtensionFunction, text: String) -> Option<CedarValue> {
        match f.call(&[CedarValue::from(text)]) {
            Ok(cedar_policy_core::ast::PartialValue::Value(v)) => Some(v),
            _ => None,
        }
    }

    /// `decimal("text")`; `None` if Cedar refuses the text (never for the text
    /// [`crate::number::CedarNumber::decimal_text`] writes).
    pub fn decimal(&self, text: String) -> Option<CedarValue> {
        Names::call(self.decimal, text)
    }

    /// `datetime("text")`; `None` if Cedar refuses the text.
    pub fn datetime(&self, text: String) -> Option<CedarValue> {
        Names::call(self.datetime, text)
    }

    /// `Action::"tool"`.
    pub fn action(&self, tool: &str) -> EntityUid {
        EntityUid::from_type_name_and_id(self.action.clone(), EntityId::new(tool))
    }
}

pub(crate) fn type_name(name: &str) -> Option<EntityTypeName> {
    name.parse().ok()
}

pub(crate) fn uid(kind: &str, id: &str) -> Option<EntityUid> {
    Some(EntityUid::from_type_name_and_id(
        type_name(kind)?,
        EntityId::new(id),
    ))
}

/// The principal's and resource's entities.
pub(crate) fn actor_entities(
    organization: &str,
    agent: &str,
    upstream: &str,
) -> Option<(EntityUid, EntityUid, Vec<Entity>)> {
    let org = uid("Organization", organization)?;
    let principal = uid("Agent", &format!("{organization}/{agent}"))?;
    let resource = uid("Upstream", upstream)?;
    let attrs: HashMap<String, RestrictedExpression> = [
        (
            "organization".to_owned(),
            RestrictedExpression::new_string(organization.to_owned()),
        ),
        (
            "agent".to_owned(),
            RestrictedExpression::new_string(agent.to_owned()),
        ),
    ]
    .into_iter()
    .collect();
    let agent_entity = Entity::new(principal.clone(), attrs, HashSet::from([org.clone()])).ok()?;
    let entities = vec![
        agent_entity,
        Entity::new_no_attrs(org, HashSet::new()),
        Entity::new_no_attrs(resource.clone(), HashSet::new()),
    ];
    Some((principal, resource, entities))
}

/// Nano-dollars per 0.0001 USD.
const NANOS_PER_TICK: i64 = 100_000;

/// A money amount as a `decimal`, rounded up (`ceil`) or down.
pub(crate) fn money_decimal(names: &Names, m: Money, up: bool) -> Option<CedarValue> {
    let q = m.0.div_euclid(NANOS_PER_TICK);
    let r = m.0.rem_euclid(NANOS_PER_TICK);
    let ticks = if up && r != 0 { q + 1 } else { q };
    names.decimal(crate::number::CedarNumber::decimal_text(ticks))
}

/// remaining ÷ initial, rounded down to four places, clamped to [0, 1]; zero when there
/// is no initial budget.
pub(crate) fn fraction_decimal(
    names: &Names,
    remaining: Money,
    initial: Money,
) -> Option<CedarValue> {
    let ticks = if initial.0 <= 0 {
        0
    } else {
        let r = i128::from(remaining.0.max(0));
        let v = (r * 10_000).div_euclid(i128::from(initial.0));
        i64::try_from(v.clamp(0, 10_000)).unwrap_or(0)
    };
    names.decimal(crate::number::CedarNumber::decimal_text(ticks))
}

/// `now` as Cedar `datetime` text: `YYYY-MM-DDThh:mm:ss.sssZ`, truncated to the
/// millisecond. Years outside 0000-9999 are clamped to the range's ends.
pub(crate) fn datetime_text(now: UnixNanos) -> String {
    let ms = now.div_euclid(1_000_000);
    let (min_ms, max_ms) = (-62_167_219_200_000_i64, 253_402_300_799_999_i64);
    let ms = ms.clamp(min_ms, max_ms);
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, rest) = (in_day / 3_600_000, in_day % 3_600_000);
    let (mi, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (the well-known
/// era-based conversion).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes() {
        assert_eq!(datetime_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            datetime_text(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            datetime_text(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(datetime_text(-1_000_000), "1969-12-31T23:59:59.999Z");
        assert_eq!(datetime_text(i64::MAX), "2262-04-11T23:47:16.854Z");
        assert_eq!(datetime_text(i64::MIN), "1677-09-21T00:12:43.145Z");
    }

    #[test]
    fn money_rounds_in_the_documented_direction() {
        let n = Names::new().unwrap();
        let text = |v: Option<CedarValue>| v.unwrap().to_string();
        assert_eq!(
            text(money_decimal(&n, Money(150_000), true)),
            r#"decimal("0.0002")"#
        );
        assert_eq!(
            text(money_decimal(&n, Money(150_000), false)),
            r#"decimal("0.0001")"#
        );
        assert_eq!(
            text(money_decimal(&n, Money(1_000_000_000), true)),
            r#"decimal("1.0000")"#
        );
        assert_eq!(
            text(fraction_decimal(&n, Money(1), Money(3))),
            r#"decimal("0.3333")"#
        );
        assert_eq!(
            text(fraction_decimal(&n, Money(5), Money(0))),
            r#"decimal("0.0000")"#
        );
        assert_eq!(
            text(fraction_decimal(&n, Money(9), Money(3))),
            r#"decimal("1.0000")"#
        );
        assert_eq!(
            text(n.datetime(datetime_text(0))),
            r#"datetime("1970-01-01T00:00:00.000Z")"#
        );
    }
}
