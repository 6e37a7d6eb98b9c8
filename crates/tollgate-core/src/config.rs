//! The guard configuration: the policy `decide` enforces.

use std::fmt;
use std::str::FromStr;

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

/// The policy for one guard (SP/1.0 §5.2). Every limit is off when zero.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
}

impl GuardConfig {
    /// Whether the budget rules are on.
    pub const fn budget_enabled(&self) -> bool {
        self.budget.is_positive()
    }

    /// Whether the time-window rule is on.
    pub const fn window_enabled(&self) -> bool {
        self.window_duration_s > 0 && self.window_max_calls > 0
    }
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
    fn ratios_are_exact_ppm() {
        assert_eq!(Ratio::from_f64(0.15).unwrap().ppm(), 150_000);
        assert_eq!(Ratio::from_f64(1.0).unwrap().ppm(), 1_000_000);
        assert!(Ratio::from_f64(1.5).is_err());
        assert!(Ratio::from_f64(-0.1).is_err());
        assert!(Ratio::from_f64(f64::NAN).is_err());
        assert_eq!(Ratio::from_ppm(2_000_000).ppm(), 1_000_000);
    }
}
