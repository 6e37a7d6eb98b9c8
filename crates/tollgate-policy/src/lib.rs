//! # tollgate-policy: Cedar policies over Tollgate's tool calls
//!
//! Rules on which tools an agent may call and with which arguments, written in
//! [Cedar](https://www.cedarpolicy.com/) and evaluated as a pure function: [`load()`] a set
//! from its files (and an optional schema), then [`Policies::evaluate`] one call at a time.
//!
//! What this crate does **not** do: no I/O in loading or evaluation (the caller passes
//! the files' text; [`files`], the one module that reads files, reads those a `[policy]`
//! section names, bounded, for every configuration that has one), no clock (the decision's time is an input, [`Call::now`]), no randomness, no
//! threads, no global state. It does not decide a verdict on its own either: it says what
//! the policies make of a call ([`Outcome`]) and the SP/1.0 guards in `tollgate-core`
//! decide the rest. An evaluation reads nothing but its arguments, so the same set, call
//! and session give the same outcome everywhere (daemon, library guard, MCP gateway, a
//! later replay of the audit log).
//!
//! ## The model
//!
//! [`model`] has the full table. In short: the principal is `Agent::"ORG/AGENT"`, the
//! action is `Action::"TOOL"` (one per tool name, so a schema types each tool's arguments
//! separately), the resource is `Upstream::"NAME"`, and the context holds `args` (the
//! call's params, numbers mapped by [`number`]), `tool`, `cost_usd`, `now` and `session`
//! (`calls`, budget, `labels`).
//!
//! ## Outcomes
//!
//! For one call, in this order ([`Effect`]):
//! 1. a policy that can apply to the tool reads `context.args` and the call has no params:
//!    DENY `policy_params_required:<id>`;
//! 2. a policy reads an argument with no Cedar value (a number with more than four places,
//!    an integer beyond 64 bits, ...): DENY `policy_unrepresentable:<id>`;
//! 3. a `forbid` matches: DENY `policy:<id>` (forbid overrides permit, as in Cedar);
//! 4. a policy fails to evaluate (a missing attribute, a type error): DENY
//!    `policy_error:<id>`. Cedar itself skips such a policy, which for a `forbid` would be
//!    a silent ALLOW;
//! 5. a matching `permit` is marked `@hitl` and the call is not the human-approved
//!    re-dispatch ([`Call::approved`]): HITL `policy:<id>`;
//! 6. matching permits' `@label`s would pass the session's bound: DENY
//!    `policy_label_limit:<id>`;
//! 7. some `permit` matches: [`Effect::Permit`] (the guards decide; the labels of the
//!    matching permits are attached if the call is ALLOWed);
//! 8. none matches: [`Effect::DefaultDeny`] with `default = "deny"`, else
//!    [`Effect::Pass`].
//!
//! "First" is always the first in set order (files in the order given, policies in file
//! order), so every outcome names exactly one policy and does so deterministically.
//!
//! ## Annotations
//!
//! `@id("...")` names a policy (else it is `policyN`); `@hitl` or `@hitl("message")` on a
//! permit holds the calls it matches for a human; `@label("a, b")` on a permit attaches
//! flow labels; `@shadow` runs a policy in [`shadow`] (evaluated and recorded, never
//! enforced). `@description`, `@owner` and `@doc` are free text. Any other annotation is
//! an error: a misspelt `@hitl` must not quietly turn a hold into an allow.

#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod analysis;
pub mod args;
pub mod compose;
pub mod derive;
mod eval;
pub mod files;
pub mod load;
pub mod model;
pub mod number;
pub mod schema;
pub mod shadow;

use std::sync::Arc;

use tollgate_core::Digest;

pub use eval::{DenyCause, Effect, Outcome};
pub use load::{
    load, DefaultEffect, Finding, LoadError, Loaded, Location, Options, PolicyId, Severity, Source,
};
pub use model::{Actor, Call, SessionView, LOCAL_UPSTREAM};

/// A loaded, validated, indexed policy set. Cheap to clone (shared), immutable, `Send` and
/// `Sync`: a reload makes a new one.
#[derive(Debug, Clone)]
pub struct Policies {
    pub(crate) inner: Arc<load::Inner>,
}

impl Policies {
    /// The set's digest ([`load()`] says what it covers): what the audit log records so an
    /// auditor can tell which rules were in force.
    pub fn digest(&self) -> Digest {
        self.inner.digest
    }

    /// What happens to a call no `permit` matches.
    pub fn default_effect(&self) -> DefaultEffect {
        self.inner.default
    }

    /// How many policies the files hold, the shadow ones included.
    pub fn len(&self) -> usize {
        self.inner.total
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inner.total == 0
    }

    /// How many of the policies run in shadow ([`shadow`]): the `@shadow` ones, or all of
    /// them for a set in shadow mode.
    pub fn shadow_len(&self) -> usize {
        self.inner.shadow_count
    }

    /// Whether the whole set runs in shadow ([`shadow::whole_set`]): it enforces nothing.
    pub fn is_shadow_set(&self) -> bool {
        self.inner.shadow_set
    }

    /// The shadow candidates, in set order: each call is decided once more with each
    /// ([`shadow::Shadow`]); empty without shadow policies.
    pub fn shadows(&self) -> &[shadow::Shadow] {
        &self.inner.shadows
    }

    /// The enforced policies' ids, in set order (a `@shadow` policy is not enforced).
    pub fn ids(&self) -> impl Iterator<Item = &PolicyId> {
        self.inner.meta.iter().map(|m| &m.id)
    }

    /// The `@hitl` text of policy `id` (empty for a bare `@hitl`), or `None` when the set
    /// has no such policy or it is not marked `@hitl`.
    pub fn hitl_message(&self, id: &str) -> Option<&str> {
        let i = *self.inner.index_of.get(id)?;
        self.inner.meta.get(i)?.hitl.as_deref()
    }

    /// The tools some policy names in its action scope, sorted.
    pub fn named_tools(&self) -> Vec<&str> {
        let mut v: Vec<&str> = eval::named_tools(&self.inner).into_iter().collect();
        v.sort_unstable();
        v
    }

    /// The principal and resource for calls by `agent` of `organization` to tools of
    /// `upstream` ([`LOCAL_UPSTREAM`] outside the MCP gateway). `None` when a name is
    /// longer than [`model::MAX_NAME_BYTES`], or `upstream` is not a name
    /// ([`model::is_upstream_name`]: empty, or with a control character).
    pub fn actor(&self, organization: &str, agent: &str, upstream: &str) -> Option<Actor> {
        self.inner.actor(organization, agent, upstream)
    }

    /// What the policies make of `call` by `actor`. Pure: the same arguments give the same
    /// outcome. An `actor` built for another set still works for the principal and
    /// resource, but action groups declared by a schema are those of the set it was built
    /// for: build actors again after a reload.
    pub fn evaluate(&self, actor: &Actor, call: &Call<'_>) -> Outcome {
        self.inner.evaluate(actor, call)
    }

    /// Whether every call of `tool` by `actor` is refused whatever its arguments and the
    /// session: an unconditional `forbid` covers it, or the default is `deny` and no
    /// `permit` can apply to it. (The MCP gateway hides such tools from `tools/list`.)
    pub fn denies_unconditionally(&self, actor: &Actor, tool: &str) -> Option<Effect> {
        self.inner.denies_unconditionally(actor, tool)
    }

    /// The first policy that can apply to `tool` and reads `context.args`: calls of that
    /// tool need their params to be decided.
    pub fn reads_args(&self, tool: &str) -> Option<PolicyId> {
        self.inner.reads_args(tool)
    }
}

impl Actor {
    /// Whether this actor was built for `policies`.
    pub fn is_for(&self, policies: &Policies) -> bool {
        self.set == policies.digest()
    }
}
