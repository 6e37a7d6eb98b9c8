//! Shadow policies: evaluated on every call, recorded, never enforced (issue 19).
//!
//! Two forms, which can be combined:
//!
//! - a **`@shadow` policy** in a set: the set enforces every other policy; the shadow
//!   policy's *candidate* is the set with that policy enforced too, so its would-be verdict
//!   is exactly the verdict the call would have had had the policy been enforced (the
//!   guards, the other policies and the rule order all included). At most
//!   [`MAX_SHADOW_POLICIES`](crate::load::MAX_SHADOW_POLICIES) per set;
//! - a **set in shadow mode** ([`whole_set`], `[policy] mode = "shadow"`): no policy is
//!   enforced (the guards alone decide, as without `[policy]`), and the one candidate,
//!   named [`SET`], is the set as it would be enforced.
//!
//! A candidate is an ordinary [`Policies`]; a runtime decides the call with the enforced
//! set, then once more with each candidate ([`Shadow::applies_to`] says when the second
//! evaluation can differ at all), and records the would-be verdicts
//! (`tollgate_store::rules::decide`).

use std::sync::Arc;

use tollgate_core::Digest;

use crate::{Policies, PolicyId};

/// The name of the candidate of a set in shadow mode (never a policy id: ids have no `*`).
pub const SET: &str = "*";

/// One shadow candidate.
#[derive(Debug, Clone)]
pub struct Shadow {
    name: String,
    policies: Policies,
    /// The shadow policy's index in `policies`; `None` for a whole set.
    member: Option<usize>,
}

impl Shadow {
    pub(crate) fn policy(id: PolicyId, policies: Policies, member: usize) -> Shadow {
        Shadow {
            name: id.as_str().to_owned(),
            policies,
            member: Some(member),
        }
    }

    /// The `@shadow` policy's id, or [`SET`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The set the would-be verdict is decided with.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Whether the candidate can decide a call of `tool` differently from the enforced
    /// set: a `@shadow` policy only when it can apply to the tool (else the candidate's
    /// policies for that tool are exactly the enforced set's), a whole set always.
    pub fn applies_to(&self, tool: &str) -> bool {
        match self.member {
            None => true,
            Some(i) => self
                .policies
                .inner
                .slice(tool)
                .members
                .binary_search(&i)
                .is_ok(),
        }
    }
}

/// `set` in shadow mode: a set that enforces nothing, whose candidates are `set` itself
/// (named [`SET`]) and then `set`'s own `@shadow` candidates. Its digest is
/// [`shadow_digest`] of `set`'s, so the audit log tells the two modes apart.
pub fn whole_set(set: Policies) -> Policies {
    let digest = shadow_digest(set.digest());
    let mut inner = set.inner.enforcing_nothing(digest);
    let mut shadows = Vec::with_capacity(1 + set.inner.shadows.len());
    shadows.push(Shadow {
        name: SET.to_owned(),
        policies: set.clone(),
        member: None,
    });
    shadows.extend(set.inner.shadows.iter().cloned());
    inner.shadows = shadows;
    inner.shadow_count = set.inner.total;
    inner.shadow_set = true;
    Policies {
        inner: Arc::new(inner),
    }
}

/// The digest of a set in shadow mode: SHA-256 over `tollgate-policy-shadow-set`, `1`
/// and the set's own digest, each length-prefixed as in the set's digest.
pub fn shadow_digest(set: Digest) -> Digest {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (tag, bytes) in [
        ("tollgate-policy-shadow-set", &b"1"[..]),
        ("set", &set.0[..]),
    ] {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    Digest(h.finalize().into())
}
