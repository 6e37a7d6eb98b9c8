//! Evaluation: one call against the policies that can apply to its tool.

use std::collections::HashSet;

use cedar_policy::{Context, Decision, Entities, Request, RestrictedExpression};
use tollgate_core::labels::{Label, LabelSet};

use crate::args::{self, overlaps, ArgIssue, ArgPath, Shape};
use crate::load::{DefaultEffect, Inner, PolicyId, Slice};
use crate::model::{self, Actor, Call};

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

        let Some(request) = request(&self.names, slice.needs, actor, call, args_value) else {
            // Our own values always build; if one did not, nothing may pass.
            return self.deny(
                slice.members.first().copied().unwrap_or(usize::MAX),
                DenyCause::Error("the request could not be built".into()),
            );
        };
        let response = self
            .authorizer
            .is_authorized(&request, &slice.set, &actor.entities);
        let diagnostics = response.diagnostics();
        if response.decision() == Decision::Deny {
            if let Some(i) = self.first(diagnostics.reason().map(ToString::to_string)) {
                return self.deny(i, DenyCause::Forbid);
            }
        }
        let errored = diagnostics.errors().map(|e| match e {
            cedar_policy::AuthorizationError::PolicyEvaluationError(e) => {
                (e.policy_id().to_string(), e.inner().to_string())
            }
        });
        let mut first_error: Option<(usize, String)> = None;
        for (id, text) in errored {
            if let Some(&i) = self.index_of.get(&id) {
                if first_error.as_ref().is_none_or(|(j, _)| i < *j) {
                    first_error = Some((i, text));
                }
            }
        }
        if let Some((i, text)) = first_error {
            let text: String = text.chars().take(MAX_ERROR_TEXT).collect();
            return self.deny(i, DenyCause::Error(text));
        }
        if response.decision() == Decision::Deny {
            // Nothing forbade, nothing errored: no permit matched.
            return outcome(match self.default {
                DefaultEffect::Allow => Effect::Pass,
                DefaultEffect::Deny => Effect::DefaultDeny,
            });
        }
        let mut permits: Vec<usize> = diagnostics
            .reason()
            .filter_map(|id| self.index_of.get(&id.to_string()).copied())
            .collect();
        permits.sort_unstable();
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
        if !(bounded(organization) && bounded(agent) && bounded(upstream)) {
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

fn request(
    names: &model::Names,
    needs: model::Needs,
    actor: &Actor,
    call: &Call<'_>,
    args: Option<RestrictedExpression>,
) -> Option<Request> {
    let s = &call.session;
    let mut pairs: Vec<(String, RestrictedExpression)> = Vec::with_capacity(5);
    if needs.tool {
        pairs.push((
            "tool".to_owned(),
            RestrictedExpression::new_string(call.tool.to_owned()),
        ));
    }
    if needs.cost {
        pairs.push((
            "cost_usd".to_owned(),
            model::money_decimal(names, call.cost, true),
        ));
    }
    if needs.now {
        pairs.push((
            "now".to_owned(),
            names.datetime(model::datetime_text(call.now)),
        ));
    }
    if needs.session() {
        let mut session: Vec<(String, RestrictedExpression)> = Vec::with_capacity(5);
        if needs.calls {
            let calls = i64::try_from(s.calls).unwrap_or(i64::MAX);
            session.push(("calls".to_owned(), RestrictedExpression::new_long(calls)));
        }
        if needs.initial {
            session.push((
                "budget_initial_usd".to_owned(),
                model::money_decimal(names, s.budget_initial, false),
            ));
        }
        if needs.remaining {
            session.push((
                "budget_remaining_usd".to_owned(),
                model::money_decimal(names, s.budget_remaining, false),
            ));
        }
        if needs.fraction {
            session.push((
                "budget_fraction".to_owned(),
                model::fraction_decimal(names, s.budget_remaining, s.budget_initial),
            ));
        }
        if needs.labels {
            let labels = s
                .labels
                .iter()
                .map(|l| RestrictedExpression::new_string(l.as_str().to_owned()));
            session.push(("labels".to_owned(), RestrictedExpression::new_set(labels)));
        }
        pairs.push((
            "session".to_owned(),
            RestrictedExpression::new_record(session).ok()?,
        ));
    }
    if let Some(a) = args {
        pairs.push(("args".to_owned(), a));
    }
    let context = Context::from_pairs(pairs).ok()?;
    let action = names.action(call.tool);
    Request::new(
        actor.principal.clone(),
        action,
        actor.resource.clone(),
        context,
        None,
    )
    .ok()
}

/// The distinct tools some policy names (for listings and tests).
pub(crate) fn named_tools(inner: &Inner) -> HashSet<&str> {
    inner.slices.keys().map(String::as_str).collect()
}
