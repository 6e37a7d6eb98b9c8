//! Evaluation: one call against the policies that can apply to its tool.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use cedar_policy::{Context, Entities, EntityUid, Request};
use cedar_policy_core::ast::{EntityUIDEntry, Literal, ValueKind};
use cedar_policy_core::evaluator::Evaluator;
use cedar_policy_core::extensions::Extensions;
use smol_str::SmolStr;
use tollgate_core::labels::{Label, LabelSet};

use crate::args::{self, overlaps, ArgIssue, ArgPath, Shape};
use crate::load::{DefaultEffect, Inner, PolicyId, Slice};
use crate::model::{self, Actor, Call, CedarValue};

/// What the policies make of one call. The guards (SP/1.0's rules) decide the rest; see
/// the crate documentation for how the two combine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The effect.
    pub effect: Effect,
    /// Labels to add to the session if the call is ALLOWed (those it does not carry yet,
    /// in label order). Empty unless `effect` is [`Effect::Pass`] or [`Effect::Permit`].
    pub labels: Vec<Label>,
}

/// The policies' effect on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// No policy decides: the guards' verdict stands, naming no policy. (Default `allow`
    /// and no `permit` matched, or no policy applies to the tool.)
    Pass,
    /// A `permit` matched: the guards' verdict stands, and an ALLOW names this policy (the
    /// first matching permit, in set order).
    Permit {
        /// The permit.
        policy: PolicyId,
    },
    /// A `permit` marked `@hitl` matched, and nothing forbids the call: a human decides.
    Hitl {
        /// The permit.
        policy: PolicyId,
        /// Its `@hitl("...")` text, for operators (empty for a bare `@hitl`).
        message: String,
    },
    /// The call is refused, by this policy, for this cause.
    Deny {
        /// The policy.
        policy: PolicyId,
        /// Why.
        cause: DenyCause,
    },
    /// Default `deny`, and no `permit` matched.
    DefaultDeny,
}

/// Why a policy refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyCause {
    /// A `forbid` matched.
    Forbid,
    /// The policy reads `context.args` and the call carried no params.
    ParamsRequired,
    /// The policy reads an argument that has no Cedar value.
    Unrepresentable {
        /// The argument's path below `context.args` (empty: all of them).
        path: ArgPath,
        /// Why.
        issue: ArgIssue,
    },
    /// Evaluating the policy failed (a missing attribute, a type error, an overflow):
    /// Cedar would skip the policy; Tollgate refuses the call.
    Error(String),
    /// Allowing the call would give the session more than
    /// [`MAX_LABELS`](tollgate_core::labels::MAX_LABELS) labels; this policy adds one.
    LabelLimit,
}

/// The longest evaluation error message kept in a [`DenyCause::Error`].
const MAX_ERROR_TEXT: usize = 512;

impl Effect {
    /// The verdict's reason string for this effect, or `None` for the effects that leave
    /// the guards' reason standing: `policy:<id>` for a forbid and for a hold,
    /// `policy_error:<id>`, `policy_params_required:<id>`, `policy_unrepresentable:<id>`,
    /// `policy_label_limit:<id>`, and `policy_default_deny`.
    pub fn reason(&self) -> Option<String> {
        Some(match self {
            Effect::Pass | Effect::Permit { .. } => return None,
            Effect::Hitl { policy, .. } => format!("policy:{policy}"),
            Effect::Deny { policy, cause } => match cause {
                DenyCause::Forbid => format!("policy:{policy}"),
                DenyCause::ParamsRequired => format!("policy_params_required:{policy}"),
                DenyCause::Unrepresentable { .. } => format!("policy_unrepresentable:{policy}"),
                DenyCause::Error(_) => format!("policy_error:{policy}"),
                DenyCause::LabelLimit => format!("policy_label_limit:{policy}"),
            },
            Effect::DefaultDeny => "policy_default_deny".to_owned(),
        })
    }

    /// The deciding policy, if one decided.
    pub fn policy(&self) -> Option<&PolicyId> {
        match self {
            Effect::Permit { policy }
            | Effect::Hitl { policy, .. }
            | Effect::Deny { policy, .. } => Some(policy),
            Effect::Pass | Effect::DefaultDeny => None,
        }
    }
}

fn outcome(effect: Effect) -> Outcome {
    Outcome {
        effect,
        labels: Vec::new(),
    }
}

impl Inner {
    pub(crate) fn slice(&self, tool: &str) -> &Slice {
        self.slices.get(tool).unwrap_or(&self.other)
    }

    fn deny(&self, i: usize, cause: DenyCause) -> Outcome {
        match self.meta.get(i) {
            Some(m) => outcome(Effect::Deny {
                policy: m.id.clone(),
                cause,
            }),
            None => outcome(Effect::DefaultDeny),
        }
    }

    /// The first member (in set order) among `ids`.
    fn first(&self, ids: impl Iterator<Item = String>) -> Option<usize> {
        ids.filter_map(|id| self.index_of.get(&id).copied()).min()
    }

    pub(crate) fn evaluate(&self, actor: &Actor, call: &Call<'_>) -> Outcome {
        let slice = self.slice(call.tool);
        if slice.members.is_empty() {
            return outcome(match self.default {
                DefaultEffect::Allow => Effect::Pass,
                DefaultEffect::Deny => Effect::DefaultDeny,
            });
        }
        // Arguments: refused without them if a policy here reads them; unrepresentable
        // parts refuse the policies that read them.
        let readers = || {
            slice
                .members
                .iter()
                .copied()
                .filter(|&i| self.meta.get(i).is_some_and(|m| !m.reads.is_empty()))
        };
        let args_value = match call.args {
            None => {
                if let Some(i) = readers().next() {
                    return self.deny(i, DenyCause::ParamsRequired);
                }
                None
            }
            Some(params) => {
                if readers().next().is_none() {
                    // Nobody reads them: do not pay for converting them.
                    None
                } else {
                    let shape = self.shapes.get(call.tool).unwrap_or(&Shape::Unknown);
                    let converted = args::to_cedar(params, shape, &self.names);
                    for i in readers() {
                        let Some(m) = self.meta.get(i) else { continue };
                        for (path, issue) in &converted.issues {
                            if m.reads.iter().any(|r| overlaps(r, path)) {
                                return self.deny(
                                    i,
                                    DenyCause::Unrepresentable {
                                        path: path.clone(),
                                        issue: *issue,
                                    },
                                );
                            }
                        }
                    }
                    Some(converted.value)
                }
            }
        };

        let Some(context) = context(&self.names, slice.needs, call, args_value) else {
            // Our own values always build; if one did not, nothing may pass.
            return self.deny(
                slice.members.first().copied().unwrap_or(usize::MAX),
                DenyCause::Error("the request could not be built".into()),
            );
        };
        // Cedar's evaluator on each condition, combined as Cedar's authorizer combines
        // them (a policy that errs is skipped, a satisfied forbid wins), with what Tollgate
        // adds: the first satisfied forbid in set order decides (so evaluation stops
        // there), else the first policy that erred refuses the call.
        let known = |uid: &EntityUid| EntityUIDEntry::known(uid.as_ref().clone(), None);
        let request = cedar_policy_core::ast::Request::new_unchecked(
            known(&actor.principal),
            known(&self.names.action(call.tool)),
            known(&actor.resource),
            Some(context),
        );
        let evaluator = Evaluator::new(
            request,
            actor.entities.as_ref(),
            Extensions::all_available(),
        );
        let mut first_error: Option<(usize, String)> = None;
        let mut permits: Vec<usize> = Vec::new();
        for c in &slice.conditions {
            let satisfied = match evaluator.interpret(&c.expr, &c.env) {
                Ok(v) => match v.value_kind() {
                    ValueKind::Lit(Literal::Bool(b)) => Ok(*b),
                    // A conjunction is a boolean or an error; never reached.
                    _ => Err("the policy's condition is not a boolean".to_owned()),
                },
                Err(e) => Err(e.to_string()),
            };
            match satisfied {
                Ok(true) if c.forbid => return self.deny(c.index, DenyCause::Forbid),
                Ok(true) => permits.push(c.index),
                Ok(false) => {}
                Err(text) => {
                    if first_error.as_ref().is_none_or(|(j, _)| c.index < *j) {
                        first_error = Some((c.index, text));
                    }
                }
            }
        }
        if let Some((i, text)) = first_error {
            let text: String = text.chars().take(MAX_ERROR_TEXT).collect();
            return self.deny(i, DenyCause::Error(text));
        }
        if permits.is_empty() {
            // Nothing forbade, nothing erred: no permit matched.
            return outcome(match self.default {
                DefaultEffect::Allow => Effect::Pass,
                DefaultEffect::Deny => Effect::DefaultDeny,
            });
        }
        // Permits were evaluated in set order.
        if !call.approved {
            for &i in &permits {
                if let Some(m) = self.meta.get(i) {
                    if let Some(message) = &m.hitl {
                        return outcome(Effect::Hitl {
                            policy: m.id.clone(),
                            message: message.clone(),
                        });
                    }
                }
            }
        }
        // Labels of every matching permit, checked against the bound.
        let mut labels: LabelSet = call.session.labels.clone();
        for &i in &permits {
            let Some(m) = self.meta.get(i) else { continue };
            match labels.with(&m.labels) {
                Ok(l) => labels = l,
                Err(_) => return self.deny(i, DenyCause::LabelLimit),
            }
        }
        let added = call.session.labels.missing(labels.iter());
        let Some(first) = permits.first().and_then(|&i| self.meta.get(i)) else {
            return outcome(Effect::Pass);
        };
        Outcome {
            effect: Effect::Permit {
                policy: first.id.clone(),
            },
            labels: added,
        }
    }

    /// Whether `tool` is refused for `actor` whatever the call: an unconditional `forbid`
    /// covers it (the first, in set order), or the default is `deny` and no `permit` can
    /// apply to it.
    pub(crate) fn denies_unconditionally(&self, actor: &Actor, tool: &str) -> Option<Effect> {
        let slice = self.slice(tool);
        if !slice.unconditional_forbids.is_empty() {
            let action = self.names.action(tool);
            let request = Request::new(
                actor.principal.clone(),
                action,
                actor.resource.clone(),
                Context::empty(),
                None,
            )
            .ok()?;
            let response = self.authorizer.is_authorized(
                &request,
                &slice.unconditional_forbids,
                &actor.entities,
            );
            if let Some(i) = self.first(response.diagnostics().reason().map(ToString::to_string)) {
                let m = self.meta.get(i)?;
                return Some(Effect::Deny {
                    policy: m.id.clone(),
                    cause: DenyCause::Forbid,
                });
            }
        }
        (self.default == DefaultEffect::Deny && !slice.has_permit).then_some(Effect::DefaultDeny)
    }

    /// The first policy that can apply to `tool` and reads `context.args`.
    pub(crate) fn reads_args(&self, tool: &str) -> Option<PolicyId> {
        self.slice(tool)
            .members
            .iter()
            .filter_map(|&i| self.meta.get(i))
            .find(|m| !m.reads.is_empty())
            .map(|m| m.id.clone())
    }

    pub(crate) fn actor(&self, organization: &str, agent: &str, upstream: &str) -> Option<Actor> {
        let bounded = |s: &str| s.len() <= model::MAX_NAME_BYTES;
        if !(bounded(organization) && bounded(agent) && model::is_upstream_name(upstream)) {
            return None;
        }
        let (principal, resource, mut entities) =
            model::actor_entities(organization, agent, upstream)?;
        if let Some(schema) = &self.schema {
            if let Ok(actions) = schema.action_entities() {
                entities.extend(actions);
            }
        }
        let entities = Entities::from_entities(entities, None).ok()?;
        Some(Actor {
            principal,
            resource,
            entities,
            set: self.digest,
        })
    }
}

/// The request's context: the fields `needs` names, built as Cedar values (not as
/// restricted expressions for Cedar to evaluate again: see [`model::Names`]).
fn context(
    names: &model::Names,
    needs: model::Needs,
    call: &Call<'_>,
    args: Option<CedarValue>,
) -> Option<cedar_policy_core::ast::Context> {
    let s = &call.session;
    let mut pairs: BTreeMap<SmolStr, CedarValue> = BTreeMap::new();
    if needs.tool {
        pairs.insert("tool".into(), CedarValue::from(call.tool));
    }
    if needs.cost {
        pairs.insert(
            "cost_usd".into(),
            model::money_decimal(names, call.cost, true)?,
        );
    }
    if needs.now {
        pairs.insert(
            "now".into(),
            names.datetime(model::datetime_text(call.now))?,
        );
    }
    if needs.session() {
        let mut session: BTreeMap<SmolStr, CedarValue> = BTreeMap::new();
        if needs.calls {
            let calls = i64::try_from(s.calls).unwrap_or(i64::MAX);
            session.insert("calls".into(), CedarValue::from(calls));
        }
        if needs.initial {
            session.insert(
                "budget_initial_usd".into(),
                model::money_decimal(names, s.budget_initial, false)?,
            );
        }
        if needs.remaining {
            session.insert(
                "budget_remaining_usd".into(),
                model::money_decimal(names, s.budget_remaining, false)?,
            );
        }
        if needs.fraction {
            session.insert(
                "budget_fraction".into(),
                model::fraction_decimal(names, s.budget_remaining, s.budget_initial)?,
            );
        }
        if needs.labels {
            let labels = s.labels.iter().map(|l| CedarValue::from(l.as_str()));
            session.insert("labels".into(), CedarValue::set(labels, None));
        }
        pairs.insert(
            "session".into(),
            CedarValue::record_arc(Arc::new(session), None),
        );
    }
    if let Some(a) = args {
        pairs.insert("args".into(), a);
    }
    Some(cedar_policy_core::ast::Context::Value(Arc::new(pairs)))
}

/// The distinct tools some policy names (for listings and tests).
pub(crate) fn named_tools(inner: &Inner) -> HashSet<&str> {
    inner.slices.keys().map(String::as_str).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cedar_policy::RestrictedExpression;
    use proptest::prelude::*;
    use tollgate_core::json::parse_str;
    use tollgate_core::labels::LabelSet;
    use tollgate_core::Money;

    use crate::model::SessionView;

    /// The context as Cedar's public API builds it from restricted expressions (what
    /// `context` did before it built values directly): the reference.
    fn reference(call: &Call<'_>, args: Option<RestrictedExpression>) -> Context {
        let s = &call.session;
        let money = |m: Money, up: bool| {
            let (q, r) = (m.0.div_euclid(100_000), m.0.rem_euclid(100_000));
            let ticks = if up && r != 0 { q + 1 } else { q };
            RestrictedExpression::new_decimal(crate::number::CedarNumber::decimal_text(ticks))
        };
        let fraction = if s.budget_initial.0 <= 0 {
            0
        } else {
            let v = (i128::from(s.budget_remaining.0.max(0)) * 10_000)
                .div_euclid(i128::from(s.budget_initial.0));
            i64::try_from(v.clamp(0, 10_000)).unwrap()
        };
        let labels = s
            .labels
            .iter()
            .map(|l| RestrictedExpression::new_string(l.as_str().to_owned()));
        let session = RestrictedExpression::new_record([
            (
                "calls".to_owned(),
                RestrictedExpression::new_long(i64::try_from(s.calls).unwrap_or(i64::MAX)),
            ),
            (
                "budget_initial_usd".to_owned(),
                money(s.budget_initial, false),
            ),
            (
                "budget_remaining_usd".to_owned(),
                money(s.budget_remaining, false),
            ),
            (
                "budget_fraction".to_owned(),
                RestrictedExpression::new_decimal(crate::number::CedarNumber::decimal_text(
                    fraction,
                )),
            ),
            ("labels".to_owned(), RestrictedExpression::new_set(labels)),
        ])
        .unwrap();
        let mut pairs = vec![
            (
                "tool".to_owned(),
                RestrictedExpression::new_string(call.tool.to_owned()),
            ),
            ("cost_usd".to_owned(), money(call.cost, true)),
            (
                "now".to_owned(),
                RestrictedExpression::new_datetime(model::datetime_text(call.now)),
            ),
            ("session".to_owned(), session),
        ];
        if let Some(a) = args {
            pairs.push(("args".to_owned(), a));
        }
        Context::from_pairs(pairs).unwrap()
    }

    /// `args` as Cedar's JSON reader gives it (numbers as Long or `decimal`, as
    /// `crate::number` maps them).
    fn reference_args(v: &tollgate_core::json::Value) -> RestrictedExpression {
        use tollgate_core::json::Value as J;
        match v {
            J::Bool(b) => RestrictedExpression::new_bool(*b),
            J::String(s) => RestrictedExpression::new_string(s.clone()),
            J::Number(n) => match crate::number::map_number(n, None).unwrap() {
                crate::number::CedarNumber::Long(i) => RestrictedExpression::new_long(i),
                crate::number::CedarNumber::Decimal(d) => {
                    RestrictedExpression::new_decimal(crate::number::CedarNumber::decimal_text(d))
                }
            },
            J::Array(a) => RestrictedExpression::new_set(a.iter().map(reference_args)),
            J::Object(m) => RestrictedExpression::new_record(
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), reference_args(v))),
            )
            .unwrap(),
            J::Null => unreachable!("no null in the generated args"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The context built from values is the one Cedar builds from restricted
        /// expressions, for every field, any money (negative, huge, fractional nanos),
        /// any time and any labels.
        #[test]
        fn the_context_is_the_one_cedar_builds(
            cost in any::<i64>(),
            initial in any::<i64>(),
            remaining in any::<i64>(),
            calls in any::<u64>(),
            now in any::<i64>(),
            labels in proptest::collection::vec("[a-z][a-z0-9-]{0,12}", 0..5),
            amount in -1_000_000_000i64..1_000_000_000,
            places in 0u32..5,
        ) {
            let names = model::Names::new().unwrap();
            let labels: Vec<_> = labels
                .iter()
                .map(|l| tollgate_core::labels::Label::parse(l).unwrap())
                .collect();
            let labels = LabelSet::new().with(&labels).unwrap();
            let number = if places == 0 {
                amount.to_string()
            } else {
                format!("{}.{:0width$}", amount, amount.unsigned_abs() % 10u64.pow(places), width = places as usize)
            };
            let params = parse_str(&format!(
                r#"{{"amount": {number}, "to": "x@y", "tags": ["a", 1, true], "nested": {{"k": [2.5], "n": null}}}}"#
            ))
            .unwrap();
            let call = Call {
                tool: "pay",
                args: Some(&params),
                cost: Money(cost),
                now,
                session: SessionView {
                    calls,
                    budget_initial: Money(initial),
                    budget_remaining: Money(remaining),
                    labels: &labels,
                },
                approved: false,
            };
            let converted = args::to_cedar(&params, &Shape::Unknown, &names);
            prop_assert!(converted.issues.is_empty(), "{:?}", converted.issues);
            let ours = Context::from(context(&names, model::Needs::all(), &call, Some(converted.value)).unwrap());
            prop_assert_eq!(ours, reference(&call, Some(reference_args(&params))));
        }
    }
}
