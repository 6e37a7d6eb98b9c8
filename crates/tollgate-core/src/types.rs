//! The vocabulary of a decision: verdicts, reasons, deny reasons, money.

use std::fmt;
use std::str::FromStr;

/// What the runtime must do with a proposed tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Execute as requested.
    Allow,
    /// Do not execute; the session's circuit trips.
    Deny,
    /// Do not execute; a human decides. Never downgraded to ALLOW.
    Hitl,
}

impl Verdict {
    /// `ALLOW`, `DENY` or `HITL`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "ALLOW",
            Verdict::Deny => "DENY",
            Verdict::Hitl => "HITL",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that names no verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown verdict `{0}` (expected ALLOW, DENY or HITL)")]
pub struct UnknownVerdict(pub String);

impl FromStr for Verdict {
    type Err = UnknownVerdict;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_uppercase().as_str() {
            "ALLOW" => Ok(Verdict::Allow),
            "DENY" => Ok(Verdict::Deny),
            "HITL" => Ok(Verdict::Hitl),
            _ => Err(UnknownVerdict(s.to_owned())),
        }
    }
}

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal => $verdict:ident, )*) => {
        /// The stable reason vocabulary of SP/1.0.1 §3.5, plus the reasons of the seed's
        /// extension layers (§3.7). The string of each variant is part of the protocol:
        /// it is what auditors and conformance vectors compare.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $( $(#[$doc])* $variant, )*
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)*];

            /// The exact, stable reason string.
            pub const fn as_str(self) -> &'static str {
                match self { $( Reason::$variant => $text, )* }
            }

            /// The verdict this reason is normally reported with. (`budget_overrun` is
            /// also reported with HITL when `hitl_mode` is ON_DENY.)
            pub const fn usual_verdict(self) -> Verdict {
                match self { $( Reason::$variant => Verdict::$verdict, )* }
            }
        }

        impl FromStr for Reason {
            type Err = UnknownReason;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s { $( $text => Ok(Reason::$variant), )* _ => Err(UnknownReason(s.to_owned())) }
            }
        }
    };
}

reasons! {
    /// No rule matched.
    WithinThresholds = "within_thresholds" => Allow,
    /// The session's circuit was tripped by an earlier DENY.
    CircuitOpen = "circuit_open" => Deny,
    /// Budget remaining is zero or below (or a probabilistic denial under budget pressure).
    BudgetExhausted = "budget_exhausted" => Deny,
    /// This call's estimated cost exceeds the remaining budget.
    BudgetOverrun = "budget_overrun" => Deny,
    /// The same call repeated past the limit.
    MaxRepeatExceeded = "max_repeat_exceeded" => Deny,
    /// `params` cannot be canonicalized.
    MalformedInput = "policy_violation:malformed_input" => Deny,
    /// The nonce was seen before: a replay.
    DuplicateNonce = "policy_violation:duplicate_nonce" => Deny,
    /// A re-dispatch of a transition that is already terminal.
    DuplicateResumeNoEffect = "policy_violation:duplicate_resume_no_effect" => Deny,
    /// The call a human approved, released once.
    TransitionApprove = "hitl_transition:approve" => Allow,
    /// The successor of a human MODIFY, with the successor's arguments.
    TransitionModifySuccessor = "hitl_transition:modify_successor" => Allow,
    /// A human rejected the call.
    TransitionReject = "hitl_transition:reject" => Deny,
    /// The original of a MODIFY tried to execute.
    TransitionSupersededOriginal = "hitl_transition:superseded_original" => Deny,
    /// The approval was already consumed, expired or revoked.
    TransitionTerminalNoEffect = "hitl_transition:terminal_no_effect" => Deny,
    /// The call is not the authorized call (nonce differs).
    TransitionNonceMismatch = "hitl_transition:nonce_mismatch" => Deny,
    /// The arguments differ from the approved arguments.
    TransitionDigestMismatch = "hitl_transition:digest_mismatch" => Deny,
    /// The approval binds neither a nonce nor a digest.
    TransitionUnboundAuthorization = "hitl_transition:unbound_authorization" => Deny,
    /// The human decision is not one this implementation knows.
    TransitionUnknownDecision = "hitl_transition:unknown_decision" => Deny,
    /// Deferred or escalated, or still awaiting a human.
    TransitionDeferEscalate = "hitl_transition:defer_escalate" => Hitl,
    /// `hitl_mode` is ALWAYS.
    HitlAllCalls = "hitl_all_calls" => Hitl,
    /// Remaining budget fraction at or below the threshold.
    BudgetThreshold = "budget_threshold" => Hitl,
    /// Context that cannot be evaluated deterministically.
    OpaqueContext = "fail_closed:opaque_context" => Hitl,
    /// Extension (seed §3.7): too many calls of this tool in the current time window.
    WindowExceeded = "window_exceeded" => Deny,
    /// Extension: the session's call cap is reached.
    GlobalLimit = "global_limit" => Deny,
    /// Extension: the session's wall-clock timeout has passed.
    Timeout = "timeout" => Deny,
    /// A policy refused the call (issue 18; the reason on the wire names the policy,
    /// `policy:<id>`, and the audit entry's policy note says which and why). What a
    /// refusal that trips the circuit records as the trip's reason.
    PolicyDeny = "policy_deny" => Deny,
    /// A policy's `@hitl` permit held the call for a human (the wire names the policy).
    PolicyHold = "policy_hold" => Hitl,
}

/// Text that names no reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reason `{0}`")]
pub struct UnknownReason(pub String);

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Reason {
    /// Whether this is one of the two reasons a policy's verdict is applied with
    /// ([`Reason::PolicyDeny`], [`Reason::PolicyHold`]); `decide` never returns them.
    pub const fn is_policy(self) -> bool {
        matches!(self, Reason::PolicyDeny | Reason::PolicyHold)
    }

    /// The coarse deny reason of the wire protocol (the seed's list) for a DENY with this
    /// reason; `None` for reasons that are not denials.
    pub const fn deny_reason(self) -> Option<DenyReason> {
        Some(match self {
            Reason::CircuitOpen => DenyReason::CircuitOpen,
            Reason::BudgetExhausted | Reason::BudgetOverrun => DenyReason::BudgetExhausted,
            Reason::MaxRepeatExceeded => DenyReason::MaxRepeatExceeded,
            Reason::WindowExceeded => DenyReason::WindowExceeded,
            Reason::GlobalLimit => DenyReason::GlobalLimit,
            Reason::Timeout => DenyReason::Timeout,
            Reason::MalformedInput
            | Reason::DuplicateNonce
            | Reason::DuplicateResumeNoEffect
            | Reason::TransitionReject
            | Reason::TransitionSupersededOriginal
            | Reason::TransitionTerminalNoEffect
            | Reason::TransitionNonceMismatch
            | Reason::TransitionDigestMismatch
            | Reason::TransitionUnboundAuthorization
            | Reason::TransitionUnknownDecision
            | Reason::PolicyDeny => DenyReason::PolicyViolation,
            Reason::WithinThresholds
            | Reason::TransitionApprove
            | Reason::TransitionModifySuccessor
            | Reason::TransitionDeferEscalate
            | Reason::HitlAllCalls
            | Reason::BudgetThreshold
            | Reason::OpaqueContext
            | Reason::PolicyHold => return None,
        })
    }
}

/// The coarse deny reasons of the wire protocol: the seed's list (§3.4), plus `Timeout`,
/// which the seed's `timeout_seconds` needs and its list forgot. The fine-grained
/// [`Reason`] string travels beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// Circuit breaker previously tripped.
    CircuitOpen,
    /// Budget remaining ≤ 0 or cost > remaining.
    BudgetExhausted,
    /// Same tool and params repeated too many times.
    MaxRepeatExceeded,
    /// Too many calls in the current time window.
    WindowExceeded,
    /// Session-wide call limit reached.
    GlobalLimit,
    /// Duplicate nonce, malformed input, or a refused HITL transition.
    PolicyViolation,
    /// Authentication failure (reported by the daemon, never by `decide`).
    AuthFailed,
    /// The session's wall-clock timeout passed.
    Timeout,
}

impl DenyReason {
    /// The upper-case name used on the wire and in the audit log.
    pub const fn as_str(self) -> &'static str {
        match self {
            DenyReason::CircuitOpen => "CIRCUIT_OPEN",
            DenyReason::BudgetExhausted => "BUDGET_EXHAUSTED",
            DenyReason::MaxRepeatExceeded => "MAX_REPEAT_EXCEEDED",
            DenyReason::WindowExceeded => "WINDOW_EXCEEDED",
            DenyReason::GlobalLimit => "GLOBAL_LIMIT",
            DenyReason::PolicyViolation => "POLICY_VIOLATION",
            DenyReason::AuthFailed => "AUTH_FAILED",
            DenyReason::Timeout => "TIMEOUT",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of [`crate::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// ALLOW, DENY or HITL.
    pub verdict: Verdict,
    /// The stable reason string.
    pub reason: Reason,
    /// The coarse reason, for DENY only.
    pub deny_reason: Option<DenyReason>,
    /// Whether a DENY came from the probabilistic layer (it reads as `budget_exhausted`).
    pub probabilistic: bool,
}

impl Decision {
    pub(crate) const fn new(verdict: Verdict, reason: Reason) -> Decision {
        Decision {
            verdict,
            reason,
            deny_reason: match verdict {
                Verdict::Deny => reason.deny_reason(),
                Verdict::Allow | Verdict::Hitl => None,
            },
            probabilistic: false,
        }
    }

    pub(crate) const fn of(reason: Reason) -> Decision {
        Decision::new(reason.usual_verdict(), reason)
    }
}

/// An exact amount of US dollars, as a whole number of nano-dollars (10⁻⁹ USD).
///
/// INVARIANT (exact-money): the core never does arithmetic on floating-point money.
/// Floats are converted once, at the edge, by [`Money::from_usd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Money(pub i64);

/// A dollar amount that cannot be represented exactly enough, or at all.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum MoneyError {
    /// NaN or ±infinity.
    #[error("amount `{0}` is not a finite number")]
    NonFinite(f64),
    /// Outside ±9.2 billion dollars.
    #[error("amount `{0}` is out of range")]
    OutOfRange(f64),
    /// Negative where only non-negative amounts make sense.
    #[error("amount `{0}` is negative")]
    Negative(f64),
}

impl Money {
    /// Zero dollars.
    pub const ZERO: Money = Money(0);
    /// Nano-dollars per dollar.
    pub const NANOS_PER_USD: i64 = 1_000_000_000;

    /// Convert a dollar amount, rounding to the nearest nano-dollar. The decimal the float
    /// was written as (0.1, 0.002) is recovered exactly, because nine decimal places is far
    /// inside f64's precision for amounts below ~9 million dollars.
    pub fn from_usd(usd: f64) -> Result<Money, MoneyError> {
        if !usd.is_finite() {
            return Err(MoneyError::NonFinite(usd));
        }
        let nanos = (usd * 1e9).round();
        // i64::MAX is 9.22e18; stay clear of the rounding edge.
        if nanos.abs() > 9.0e18 {
            return Err(MoneyError::OutOfRange(usd));
        }
        #[allow(clippy::cast_possible_truncation)]
        Ok(Money(nanos as i64))
    }

    /// Like [`Money::from_usd`], but refuses negative amounts (costs, budgets).
    ///
    /// The sign is checked on the amount as given, before it is rounded to nano-dollars:
    /// `-4e-10` is refused, not rounded to zero (negative zero is zero).
    pub fn from_usd_non_negative(usd: f64) -> Result<Money, MoneyError> {
        if usd < 0.0 {
            return Err(MoneyError::Negative(usd));
        }
        Money::from_usd(usd)
    }

    /// The amount in dollars, for display and the wire.
    #[allow(clippy::cast_precision_loss)]
    pub fn to_usd(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Saturating addition.
    pub const fn saturating_add(self, other: Money) -> Money {
        Money(self.0.saturating_add(other.0))
    }

    /// Saturating subtraction.
    pub const fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }

    /// Whether the amount is above zero.
    pub const fn is_positive(self) -> bool {
        self.0 > 0
    }
}

/// A cost an agent reported (a post-exec `actual_cost_usd`), as the core settles it.
///
/// Settlement must never refund on input it cannot read: a reported cost that is not a
/// finite, non-negative amount is [`ReportedCost::Unreadable`] and is charged as the
/// call's estimate; a finite amount too large for the nano-dollar range is
/// [`ReportedCost::OverRange`] and charges everything that remains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportedCost {
    /// A readable amount, exact in nano-dollars (never negative).
    Exact(Money),
    /// NaN, ±infinity or negative.
    Unreadable,
    /// Finite and non-negative, but at or beyond the nano-dollar range (about 9.2e9 USD).
    OverRange,
}

impl ReportedCost {
    /// Classify a reported dollar amount. The sign is checked before rounding: any
    /// negative amount, however small (−4e-10, which rounds to zero nano-dollars), is
    /// [`ReportedCost::Unreadable`]; negative zero is zero. Rounding to the nano-dollar
    /// then happens as in [`Money::from_usd`].
    pub fn from_usd(usd: f64) -> ReportedCost {
        // The sign first, on the amount as reported: a negative cost too small to round
        // to a nano-dollar (`-4e-10`) is still negative, never a zero cost.
        if usd < 0.0 {
            return ReportedCost::Unreadable;
        }
        match Money::from_usd(usd) {
            Ok(m) if m.0 >= 0 => ReportedCost::Exact(m),
            Ok(_) | Err(MoneyError::NonFinite(_) | MoneyError::Negative(_)) => {
                ReportedCost::Unreadable
            }
            Err(MoneyError::OutOfRange(_)) if usd > 0.0 => ReportedCost::OverRange,
            Err(MoneyError::OutOfRange(_)) => ReportedCost::Unreadable,
        }
    }

    /// The readable amount, if any.
    pub const fn exact(self) -> Option<Money> {
        match self {
            ReportedCost::Exact(m) => Some(m),
            _ => None,
        }
    }
}

impl fmt::Display for Money {
    /// Dollars with nine decimal places, trailing zeros trimmed: `0.498`, `10`, `-0.5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let whole = abs / 1_000_000_000;
        let frac = abs % 1_000_000_000;
        if frac == 0 {
            return write!(f, "{sign}{whole}");
        }
        let mut digits = [0u8; 9];
        let mut rest = frac;
        for slot in digits.iter_mut().rev() {
            *slot = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        let end = digits.iter().rposition(|&d| d != b'0').map_or(0, |i| i + 1);
        let frac_text = std::str::from_utf8(digits.get(..end).unwrap_or_default()).unwrap_or("");
        write!(f, "{sign}{whole}.{frac_text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_strings_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "duplicate reason string {r}");
            assert_eq!(r.as_str().parse::<Reason>().unwrap(), *r);
            assert_eq!(r.as_str(), r.as_str().to_lowercase());
        }
        assert_eq!(Reason::ALL.len(), 26);
        assert!("CIRCUIT_OPEN".parse::<Reason>().is_err());
    }

    #[test]
    fn deny_reasons_only_for_denials() {
        for r in Reason::ALL {
            assert_eq!(
                r.deny_reason().is_some(),
                r.usual_verdict() == Verdict::Deny,
                "{r}"
            );
        }
    }

    #[test]
    fn money_converts_exactly() {
        assert_eq!(Money::from_usd(0.1).unwrap(), Money(100_000_000));
        assert_eq!(Money::from_usd(0.002).unwrap(), Money(2_000_000));
        assert_eq!(Money::from_usd(0.0015).unwrap(), Money(1_500_000));
        assert_eq!(Money::from_usd(0.5).unwrap().to_string(), "0.5");
        assert_eq!(Money(498_000_000).to_string(), "0.498");
        assert_eq!(Money(10_000_000_000).to_string(), "10");
        assert_eq!(Money(-1).to_string(), "-0.000000001");
        assert!(Money::from_usd(f64::NAN).is_err());
        assert!(Money::from_usd(1e12).is_err());
        assert!(Money::from_usd_non_negative(-0.01).is_err());
        assert_eq!(Money::from_usd_non_negative(-0.0).unwrap(), Money::ZERO);
        // The sign before the rounding: -4e-10 rounds to 0 nano-dollars but is negative.
        for tiny in [-4e-10, -1e-12, -f64::MIN_POSITIVE] {
            assert_eq!(
                Money::from_usd_non_negative(tiny),
                Err(MoneyError::Negative(tiny))
            );
        }
    }

    #[test]
    fn verdict_parses() {
        assert_eq!(" allow ".parse::<Verdict>().unwrap(), Verdict::Allow);
        assert!("maybe".parse::<Verdict>().is_err());
    }
}
