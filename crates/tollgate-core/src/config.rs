//! The guard configuration: the policy `decide` enforces.

use std::fmt;
use std::str::FromStr;

use std::collections::BTreeMap;

use crate::digest::Digest;
use crate::json::{self, Number, Value};
use crate::types::Money;

/// When a human is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HitlMode {
    /// Never: verdicts are ALLOW or DENY only (HITL can still come from opaque context
    /// and from pending transitions, which fail closed).
    #[default]
    Never,
    /// A budget overrun goes to a human instead of being denied.
    OnDeny,
    /// Calls go to a human once the remaining budget fraction is at or below
    /// [`GuardConfig::hitl_budget_threshold`].
    OnThreshold,
    /// Every call goes to a human.
    Always,
}

impl HitlMode {
    /// The lowercase name used in vector files and configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            HitlMode::Never => "never",
            HitlMode::OnDeny => "on_deny",
            HitlMode::OnThreshold => "on_threshold",
            HitlMode::Always => "always",
        }
    }
}

impl fmt::Display for HitlMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A configuration word that names nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{text}`")]
pub struct UnknownWord {
    /// Which setting.
    pub what: &'static str,
    /// The text given.
    pub text: String,
}

impl FromStr for HitlMode {
    type Err = UnknownWord;
    /// Accepts the vector files' words (`never`, `on_deny`, `on_threshold`, `always`) and
    /// the protobuf enum names (`HITL_NEVER`, `HITL_ON_DENY`, `HITL_ON_BUDGET_THRESHOLD`,
    /// `HITL_ALWAYS`), case- and whitespace-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("hitl_").unwrap_or(&t);
        match t {
            "never" => Ok(HitlMode::Never),
            "on_deny" => Ok(HitlMode::OnDeny),
            "on_threshold" | "on_budget_threshold" => Ok(HitlMode::OnThreshold),
            "always" => Ok(HitlMode::Always),
            _ => Err(UnknownWord {
                what: "hitl_mode",
                text: s.to_owned(),
            }),
        }
    }
}

/// Whose money a budget is. The core sees one remaining amount; a store that shares a
/// budget across an agent's or organization's sessions supplies the shared amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BudgetScope {
    /// Each session has its own budget.
    #[default]
    PerSession,
    /// All sessions of one agent share a budget.
    PerAgent,
    /// All sessions of one organization share a budget.
    PerOrganization,
}

impl BudgetScope {
    /// The lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetScope::PerSession => "per_session",
            BudgetScope::PerAgent => "per_agent",
            BudgetScope::PerOrganization => "per_organization",
        }
    }
}

impl FromStr for BudgetScope {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "per_session" | "session" => Ok(BudgetScope::PerSession),
            "per_agent" | "agent" => Ok(BudgetScope::PerAgent),
            "per_organization" | "per_org" | "organization" => Ok(BudgetScope::PerOrganization),
            _ => Err(UnknownWord {
                what: "budget_scope",
                text: s.to_owned(),
            }),
        }
    }
}

/// How a call's reservation is settled when its actual cost arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Settlement {
    /// Charge the larger of the estimate and the actual cost: an estimate is a commitment,
    /// so an under-run is not refunded and an over-run is charged in full. Remaining budget
    /// then never rises. This is what SP/1.0 Appendix A shows (0.500 → 0.498 → 0.496 with
    /// an actual cost below the estimate).
    #[default]
    Conservative,
    /// Charge exactly the actual cost, refunding an over-estimate.
    Actual,
}

impl Settlement {
    /// The lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Settlement::Conservative => "conservative",
            Settlement::Actual => "actual",
        }
    }
}

impl FromStr for Settlement {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "conservative" => Ok(Settlement::Conservative),
            "actual" => Ok(Settlement::Actual),
            _ => Err(UnknownWord {
                what: "settlement",
                text: s.to_owned(),
            }),
        }
    }
}

/// A fraction in [0, 1], held exactly as parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ratio(u32);

/// A fraction outside [0, 1] or not a number.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("ratio `{0}` is not a number between 0 and 1")]
pub struct BadRatio(pub f64);

impl Ratio {
    /// Parts per million in one.
    pub const ONE_PPM: u32 = 1_000_000;

    /// From a float in [0, 1], rounded to the nearest part per million.
    pub fn from_f64(f: f64) -> Result<Ratio, BadRatio> {
        if !(0.0..=1.0).contains(&f) {
            return Err(BadRatio(f));
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(Ratio((f * 1e6).round() as u32))
    }

    /// From parts per million, capped at one.
    pub const fn from_ppm(ppm: u32) -> Ratio {
        Ratio(if ppm > Self::ONE_PPM {
            Self::ONE_PPM
        } else {
            ppm
        })
    }

    /// Parts per million.
    pub const fn ppm(self) -> u32 {
        self.0
    }

    /// As a float.
    pub fn to_f64(self) -> f64 {
        f64::from(self.0) / 1e6
    }
}

/// How many recent nonces a session remembers by default (see [`NonceWindow`](crate::state::NonceWindow)).
pub const DEFAULT_NONCE_WINDOW: u32 = 1024;
/// How many unsettled reservations a session keeps by default.
pub const DEFAULT_MAX_RESERVATIONS: u32 = 1024;

/// How many held calls a session keeps by default, each with its own transition
/// (Tollgate's extension of SP/1.0.1 §3.6; see [`GuardConfig::max_held_calls`]).
pub const DEFAULT_MAX_HELD_CALLS: u32 = 16;

/// The policy for one guard (SP/1.0 §5.2). Every limit is off when zero, except the two
/// bounds on remembered history (`nonce_window`, `max_reservations`), which are at least 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardConfig {
    /// Budget; zero disables every budget rule.
    pub budget: Money,
    /// Whose budget it is (the store's concern; the core sees one remaining amount).
    pub budget_scope: BudgetScope,
    /// Identical consecutive calls allowed before DENY; zero disables.
    pub max_repeat_calls: u32,
    /// Lower the repeat limit by one (not below one) when an error signal shows.
    pub error_amplification: bool,
    /// Wall-clock session timeout in seconds; zero disables.
    pub timeout_seconds: u32,
    /// Length of the per-tool call window in seconds; zero disables windows.
    pub window_duration_s: u32,
    /// Calls of one tool allowed per window; zero disables windows.
    pub window_max_calls: u32,
    /// Calls allowed per session; zero disables.
    pub max_total_calls: u64,
    /// Deny at random under budget pressure (below 20% remaining).
    pub probabilistic_deny: bool,
    /// Scale of the probabilistic denial.
    pub deny_jitter_ratio: Ratio,
    /// When a human is asked.
    pub hitl_mode: HitlMode,
    /// Remaining-budget fraction at or below which ON_THRESHOLD asks a human.
    pub hitl_budget_threshold: Ratio,
    /// How reservations settle against actual costs.
    pub settlement: Settlement,
    /// For nested guard trees (carried, not interpreted by the core).
    pub parent_guard_id: Option<String>,
    /// How many of the most recent allowed nonces a session remembers for rule 3 (at
    /// least 1; default [`DEFAULT_NONCE_WINDOW`]). Older nonces are forgotten; the daemon's
    /// strictly increasing call numbers refuse replayed messages whatever their age.
    pub nonce_window: u32,
    /// How many allowed calls may await their post-exec report (at least 1; default
    /// [`DEFAULT_MAX_RESERVATIONS`]). Past that, the oldest reservation is settled at its
    /// estimate (what it reserved stays spent) and forgotten; a late report for it is
    /// charged like a report for a call with no reservation.
    pub max_reservations: u32,
    /// How many calls a session may hold for a human at once, each with its own pending
    /// transition bound to its own nonce (at least 1; default [`DEFAULT_MAX_HELD_CALLS`]).
    /// 1 is SP/1.0.1 §3.6 exactly: one pending transition resolves every call (a second
    /// call is held behind the first, `hitl_transition:defer_escalate`, and a call whose
    /// nonce is not the transition's is DENIED). Above 1, Tollgate's extension: a call
    /// whose nonce names a held call is resolved against that call's transition by §3.6;
    /// any other call is decided by the rules after rule 4, and a HITL verdict holds it
    /// with a transition of its own while fewer than this many are held (else it is held
    /// behind, recorded nowhere). The published vectors run with 1.
    pub max_held_calls: u32,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            budget: Money::ZERO,
            budget_scope: BudgetScope::PerSession,
            max_repeat_calls: 0,
            error_amplification: false,
            timeout_seconds: 0,
            window_duration_s: 0,
            window_max_calls: 0,
            max_total_calls: 0,
            probabilistic_deny: false,
            deny_jitter_ratio: Ratio::default(),
            hitl_mode: HitlMode::Never,
            hitl_budget_threshold: Ratio::default(),
            settlement: Settlement::Conservative,
            parent_guard_id: None,
            nonce_window: DEFAULT_NONCE_WINDOW,
            max_reservations: DEFAULT_MAX_RESERVATIONS,
            max_held_calls: DEFAULT_MAX_HELD_CALLS,
        }
    }
}

impl GuardConfig {
    /// Whether the budget rules are on.
    pub const fn budget_enabled(&self) -> bool {
        self.budget.is_positive()
    }

    /// Whether several held calls each keep a transition of their own (the extension of
    /// §3.6; see [`GuardConfig::max_held_calls`]).
    pub const fn parallel_holds(&self) -> bool {
        self.max_held_calls > 1
    }

    /// Whether the time-window rule is on.
    pub const fn window_enabled(&self) -> bool {
        self.window_duration_s > 0 && self.window_max_calls > 0
    }

    /// The configuration as a JSON object with every field, exact (money in nano-dollars,
    /// ratios in parts per million): what a session-opened audit entry records, in
    /// canonical form (see [`GuardConfig::to_canonical_json`]).
    ///
    /// ```text
    /// {"budget_nanos":500000000,"budget_scope":"per_session","deny_jitter_ratio_ppm":0,
    ///  "error_amplification":false,"hitl_budget_threshold_ppm":0,"hitl_mode":"never",
    ///  "max_repeat_calls":3,"max_reservations":1024,"max_total_calls":0,
    ///  "nonce_window":1024,"parent_guard_id":null,"probabilistic_deny":false,
    ///  "settlement":"conservative","timeout_seconds":0,"v":1,"window_duration_s":0,
    ///  "window_max_calls":0}
    /// ```
    pub fn to_json(&self) -> Value {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_owned(), v);
        };
        put("v", uint(CONFIG_JSON_VERSION));
        put("budget_nanos", Value::from(self.budget.0));
        put("budget_scope", Value::from(self.budget_scope.as_str()));
        put("max_repeat_calls", uint(self.max_repeat_calls));
        put("error_amplification", Value::Bool(self.error_amplification));
        put("timeout_seconds", uint(self.timeout_seconds));
        put("window_duration_s", uint(self.window_duration_s));
        put("window_max_calls", uint(self.window_max_calls));
        put("max_total_calls", uint(self.max_total_calls));
        put("probabilistic_deny", Value::Bool(self.probabilistic_deny));
        put("deny_jitter_ratio_ppm", uint(self.deny_jitter_ratio.ppm()));
        put("hitl_mode", Value::from(self.hitl_mode.as_str()));
        put(
            "hitl_budget_threshold_ppm",
            uint(self.hitl_budget_threshold.ppm()),
        );
        put("settlement", Value::from(self.settlement.as_str()));
        put(
            "parent_guard_id",
            self.parent_guard_id
                .as_deref()
                .map_or(Value::Null, Value::from),
        );
        put("nonce_window", uint(self.nonce_window));
        put("max_reservations", uint(self.max_reservations));
        // Written only when not SP/1.0's one transition, so a configuration of 1 (and every
        // configuration recorded before the setting existed) keeps its text and digest.
        if self.max_held_calls != 1 {
            put("max_held_calls", uint(self.max_held_calls));
        }
        Value::Object(m)
    }

    /// The canonical JSON text of [`GuardConfig::to_json`].
    pub fn to_canonical_json(&self) -> String {
        let bytes = json::to_canonical_vec(&self.to_json()).unwrap_or_default();
        String::from_utf8(bytes).unwrap_or_default()
    }

    /// SHA-256 of [`GuardConfig::to_canonical_json`]: names the policy a session runs under.
    pub fn digest(&self) -> Digest {
        Digest::of(self.to_canonical_json().as_bytes())
    }

    /// Read a configuration written by [`GuardConfig::to_json`]. Strict: the version must
    /// match, every key must be present with its exact type and range, and no other key
    /// may appear. The one optional key, `max_held_calls`, is 1 when absent (configurations
    /// recorded before it existed held one call at a time).
    pub fn from_json(v: &Value) -> Result<GuardConfig, ConfigJsonError> {
        let Value::Object(m) = v else {
            return Err(ConfigJsonError::NotAnObject);
        };
        const KEYS: [&str; 18] = [
            "v",
            "budget_nanos",
            "budget_scope",
            "max_repeat_calls",
            "error_amplification",
            "timeout_seconds",
            "window_duration_s",
            "window_max_calls",
            "max_total_calls",
            "probabilistic_deny",
            "deny_jitter_ratio_ppm",
            "hitl_mode",
            "hitl_budget_threshold_ppm",
            "settlement",
            "parent_guard_id",
            "nonce_window",
            "max_reservations",
            "max_held_calls",
        ];
        if let Some(k) = m.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(ConfigJsonError::UnknownKey(k.clone()));
        }
        let get = |k: &'static str| m.get(k).ok_or(ConfigJsonError::Missing(k));
        let int = |k: &'static str| -> Result<i128, ConfigJsonError> {
            match get(k)? {
                Value::Number(Number::Int(i)) => Ok(*i),
                _ => Err(ConfigJsonError::Invalid(k)),
            }
        };
        let u32_of = |k: &'static str| -> Result<u32, ConfigJsonError> {
            u32::try_from(int(k)?).map_err(|_| ConfigJsonError::Invalid(k))
        };
        let boolean = |k: &'static str| -> Result<bool, ConfigJsonError> {
            match get(k)? {
                Value::Bool(b) => Ok(*b),
                _ => Err(ConfigJsonError::Invalid(k)),
            }
        };
        let word = |k: &'static str| -> Result<&str, ConfigJsonError> {
            match get(k)? {
                Value::String(s) => Ok(s.as_str()),
                _ => Err(ConfigJsonError::Invalid(k)),
            }
        };
        let ppm = |k: &'static str| -> Result<Ratio, ConfigJsonError> {
            let p = u32_of(k)?;
            if p > Ratio::ONE_PPM {
                return Err(ConfigJsonError::Invalid(k));
            }
            Ok(Ratio::from_ppm(p))
        };
        if int("v")? != i128::from(CONFIG_JSON_VERSION) {
            return Err(ConfigJsonError::Invalid("v"));
        }
        let budget = i64::try_from(int("budget_nanos")?)
            .ok()
            .filter(|b| *b >= 0)
            .ok_or(ConfigJsonError::Invalid("budget_nanos"))?;
        let parent_guard_id = match get("parent_guard_id")? {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            _ => return Err(ConfigJsonError::Invalid("parent_guard_id")),
        };
        let at_least_one = |k: &'static str| -> Result<u32, ConfigJsonError> {
            u32_of(k)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or(ConfigJsonError::Invalid(k))
        };
        Ok(GuardConfig {
            budget: Money(budget),
            budget_scope: word("budget_scope")?
                .parse()
                .map_err(|_| ConfigJsonError::Invalid("budget_scope"))?,
            max_repeat_calls: u32_of("max_repeat_calls")?,
            error_amplification: boolean("error_amplification")?,
            timeout_seconds: u32_of("timeout_seconds")?,
            window_duration_s: u32_of("window_duration_s")?,
            window_max_calls: u32_of("window_max_calls")?,
            max_total_calls: u64::try_from(int("max_total_calls")?)
                .map_err(|_| ConfigJsonError::Invalid("max_total_calls"))?,
            probabilistic_deny: boolean("probabilistic_deny")?,
            deny_jitter_ratio: ppm("deny_jitter_ratio_ppm")?,
            hitl_mode: word("hitl_mode")?
                .parse()
                .map_err(|_| ConfigJsonError::Invalid("hitl_mode"))?,
            hitl_budget_threshold: ppm("hitl_budget_threshold_ppm")?,
            settlement: word("settlement")?
                .parse()
                .map_err(|_| ConfigJsonError::Invalid("settlement"))?,
            parent_guard_id,
            nonce_window: at_least_one("nonce_window")?,
            max_reservations: at_least_one("max_reservations")?,
            max_held_calls: if m.contains_key("max_held_calls") {
                at_least_one("max_held_calls")?
            } else {
                1
            },
        })
    }
}

fn uint(n: impl Into<u64>) -> Value {
    Value::Number(Number::Int(i128::from(n.into())))
}

/// The version of the JSON form [`GuardConfig::to_json`] writes.
pub const CONFIG_JSON_VERSION: u32 = 1;

/// Why a JSON value is not a configuration [`GuardConfig::to_json`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigJsonError {
    /// The value is not a JSON object.
    #[error("a guard configuration must be a JSON object")]
    NotAnObject,
    /// A key is missing.
    #[error("guard configuration: missing key `{0}`")]
    Missing(&'static str),
    /// A key this version does not write.
    #[error("guard configuration: unknown key `{0}`")]
    UnknownKey(String),
    /// A value has the wrong type or is out of range.
    #[error("guard configuration: invalid `{0}`")]
    Invalid(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse() {
        assert_eq!(
            " ON_THRESHOLD ".parse::<HitlMode>().unwrap(),
            HitlMode::OnThreshold
        );
        assert_eq!(
            "HITL_ON_BUDGET_THRESHOLD".parse::<HitlMode>().unwrap(),
            HitlMode::OnThreshold
        );
        assert_eq!("hitl_always".parse::<HitlMode>().unwrap(), HitlMode::Always);
        assert!("sometimes".parse::<HitlMode>().is_err());
        assert_eq!(
            "per_org".parse::<BudgetScope>().unwrap(),
            BudgetScope::PerOrganization
        );
        assert_eq!("actual".parse::<Settlement>().unwrap(), Settlement::Actual);
    }

    #[test]
    fn config_json_round_trips_and_is_strict() {
        let c = GuardConfig {
            budget: Money(500_000_000),
            budget_scope: BudgetScope::PerAgent,
            max_repeat_calls: 3,
            hitl_mode: HitlMode::OnThreshold,
            hitl_budget_threshold: Ratio::from_ppm(150_000),
            settlement: Settlement::Actual,
            parent_guard_id: Some("p".into()),
            nonce_window: 7,
            ..GuardConfig::default()
        };
        let text = c.to_canonical_json();
        assert!(text.starts_with(r#"{"budget_nanos":500000000,"budget_scope":"per_agent","#));
        let back = GuardConfig::from_json(&json::parse_str(&text).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.digest(), c.digest());
        assert_ne!(GuardConfig::default().digest(), c.digest());
        for (from, to, want) in [
            (r#""v":1"#, r#""v":2"#, ConfigJsonError::Invalid("v")),
            (
                r#""nonce_window":7"#,
                r#""nonce_window":0"#,
                ConfigJsonError::Invalid("nonce_window"),
            ),
            (
                r#""budget_nanos":500000000"#,
                r#""budget_nanos":-1"#,
                ConfigJsonError::Invalid("budget_nanos"),
            ),
            (
                r#""v":1"#,
                r#""v":1,"x":1"#,
                ConfigJsonError::UnknownKey("x".into()),
            ),
            (
                r#","settlement":"actual""#,
                "",
                ConfigJsonError::Missing("settlement"),
            ),
        ] {
            let bad = text.replace(from, to);
            assert_eq!(
                GuardConfig::from_json(&json::parse_str(&bad).unwrap()),
                Err(want),
                "{bad}"
            );
        }
    }

    #[test]
    fn ratios_are_exact_ppm() {
        assert_eq!(Ratio::from_f64(0.15).unwrap().ppm(), 150_000);
        assert_eq!(Ratio::from_f64(1.0).unwrap().ppm(), 1_000_000);
        assert!(Ratio::from_f64(1.5).is_err());
        assert!(Ratio::from_f64(-0.1).is_err());
        assert!(Ratio::from_f64(f64::NAN).is_err());
        assert_eq!(Ratio::from_ppm(2_000_000).ppm(), 1_000_000);
    }
}
