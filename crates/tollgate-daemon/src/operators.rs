//! The control plane's operators: bearer tokens (only their SHA-256 is configured, and
//! compared in constant time), their expiry, a limit on failed sign-ins per peer address,
//! and what an operator's console reads beyond the HITL handlers (the sessions of an
//! organization).
//!
//! What this module does **not** do: decide or change anything. A signed-in operator is a
//! [`Caller::Operator`] whose id comes from the token, and decides through the same
//! `Service::hitl_decide` every transport calls.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use tollgate_proto::sp1;
use tollgate_store::SessionStore;

use crate::config::Operator;
use crate::service::{Caller, Refusal, Service};

/// The prefix of a token `new_token` makes (tokens of any other form are accepted too: the
/// daemon only ever compares hashes).
pub const TOKEN_PREFIX: &str = "tgo_";

/// The SHA-256 of a token, as `[[operator]] token_sha256` holds it (in hex).
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh random token: [`TOKEN_PREFIX`] and 64 hex digits (256 bits).
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&b)))
}

/// Whether `token` has the form [`new_token`] makes: [`TOKEN_PREFIX`] and 64 lowercase hex
/// digits (256 bits). Such a token is looked at even when its address has spent its
/// failed sign-ins: no one guesses 256 random bits.
pub fn is_strong_token(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal, in time that depends only on the length.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Why a token was refused. The peer is told only "authentication failed" or "token
/// expired"; which operator a token almost matched is never said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefused {
    /// No configured operator has this token (never had, or it was removed: revoked).
    #[error("authentication failed")]
    Unknown,
    /// The operator's `expires_at` has passed.
    #[error("token expired")]
    Expired,
}

/// The configured operators, by token hash.
#[derive(Debug, Clone, Default)]
pub struct Operators {
    list: Vec<Operator>,
}

impl Operators {
    /// The operators of the configuration.
    pub fn new(list: Vec<Operator>) -> Operators {
        Operators { list }
    }

    /// The operator whose token this is, if it has not expired at `now_ns`. Every
    /// configured hash is compared, in constant time, whatever matches. The empty string
    /// is no one's token, even if a configured hash is SHA-256 of it.
    pub fn authenticate(&self, token: &str, now_ns: i64) -> Result<&Operator, TokenRefused> {
        // An empty token is never one: a missing or malformed credential reads as "".
        if token.is_empty() {
            return Err(TokenRefused::Unknown);
        }
        let hash = token_sha256(token);
        let mut found = None;
        for op in &self.list {
            if constant_time_eq(&op.token_sha256, &hash) {
                found = Some(op);
            }
        }
        let op = found.ok_or(TokenRefused::Unknown)?;
        if op.expires_at_ns.is_some_and(|t| now_ns >= t) {
            return Err(TokenRefused::Expired);
        }
        Ok(op)
    }

    /// Whether an operator's token is still good at `now_ns` (for a connection that
    /// signed in earlier).
    pub fn still_valid(op: &Operator, now_ns: i64) -> bool {
        op.expires_at_ns.is_none_or(|t| now_ns < t)
    }

    /// How many are configured.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// The caller an operator's requests are made as.
pub fn caller(op: &Operator) -> Caller {
    Caller::Operator {
        organizations: op.organizations.clone(),
        operator_id: Some(op.id.clone()),
    }
}

/// Failed sign-ins allowed in a burst from one address.
pub const AUTH_FAILURE_BURST: u32 = 10;
/// One more failed sign-in is allowed after each such interval.
pub const AUTH_FAILURE_REFILL: Duration = Duration::from_secs(6);
/// Addresses tracked at most (beyond: new addresses are not limited, the old still are).
pub const AUTH_LIMITER_MAX_PEERS: usize = 65_536;

/// A failure budget per peer address: [`AUTH_FAILURE_BURST`] failed sign-ins, refilled one
/// per [`AUTH_FAILURE_REFILL`]. While an address's budget is empty every sign-in from it is
/// refused, right or wrong, without looking at the token. Time is passed in.
#[derive(Debug, Default)]
pub struct AuthLimiter {
    peers: HashMap<IpAddr, (f64, Instant)>,
    last_sweep: Option<Instant>,
}

impl AuthLimiter {
    /// A limiter that remembers nothing yet.
    pub fn new() -> AuthLimiter {
        AuthLimiter::default()
    }

    fn refilled(&self, peer: &IpAddr, now: Instant) -> f64 {
        let burst = f64::from(AUTH_FAILURE_BURST);
        self.peers.get(peer).map_or(burst, |(left, at)| {
            let gained = now.saturating_duration_since(*at).as_secs_f64()
                / AUTH_FAILURE_REFILL.as_secs_f64();
            (left + gained).min(burst)
        })
    }

    /// `Err(retry_after_ms)` if `peer` may not try now.
    pub fn check(&self, peer: &IpAddr, now: Instant) -> Result<(), u64> {
        let left = self.refilled(peer, now);
        if left >= 1.0 {
            return Ok(());
        }
        let wait = (1.0 - left) * AUTH_FAILURE_REFILL.as_secs_f64() * 1000.0;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Err((wait.ceil() as u64).max(1))
    }

    /// Record a failed sign-in from `peer`.
    pub fn failed(&mut self, peer: &IpAddr, now: Instant) {
        self.sweep(now);
        let left = self.refilled(peer, now);
        if self.peers.len() >= AUTH_LIMITER_MAX_PEERS && !self.peers.contains_key(peer) {
            return;
        }
        self.peers.insert(*peer, ((left - 1.0).max(0.0), now));
    }

    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(60))
        {
            return;
        }
        self.last_sweep = Some(now);
        // A full budget is the same as no entry.
        let full = AUTH_FAILURE_REFILL * AUTH_FAILURE_BURST;
        self.peers
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < full);
    }

    /// Addresses tracked.
    pub fn tracked(&self) -> usize {
        self.peers.len()
    }
}

/// The most sessions one `sessions` request returns.
pub const MAX_SESSIONS_LISTED: usize = 500;

impl<S: SessionStore> Service<S> {
    /// The sessions of `org` for an operator of it: at most `limit` (capped at
    /// [`MAX_SESSIONS_LISTED`]; 0 means the cap), most recently active first, each as
    /// `get_session_state` shows it (staleness as of `now`), and how many there are in all.
    pub async fn operator_sessions(
        &self,
        caller: &Caller,
        org: &str,
        limit: usize,
        now: i64,
    ) -> Result<(Vec<sp1::SessionState>, u64), Refusal> {
        if !matches!(caller, Caller::Operator { organizations, .. } if organizations.iter().any(|o| o == org))
        {
            return Err(crate::service::refuse(
                sp1::ErrorCode::AuthenticationFailed,
                "message authentication failed",
            ));
        }
        let mut sessions = self.store.list(Some(org)).await.map_err(|e| {
            crate::service::refuse(sp1::ErrorCode::DaemonUnavailable, e.to_string())
        })?;
        let total = sessions.len() as u64;
        sessions.sort_by(|a, b| {
            b.state
                .last_activity_ns
                .cmp(&a.state.last_activity_ns)
                .then_with(|| a.meta.session_id.cmp(&b.meta.session_id))
        });
        let limit = if limit == 0 {
            MAX_SESSIONS_LISTED
        } else {
            limit.min(MAX_SESSIONS_LISTED)
        };
        let stale_after = self.stale_after_ns();
        let out = sessions
            .iter_mut()
            .take(limit)
            .map(|s| {
                if now.saturating_sub(s.last_heartbeat_ns) > stale_after {
                    s.state.status = tollgate_core::SessionStatus::Stale;
                }
                crate::convert::session_state(
                    crate::convert::Identity {
                        session_id: &s.meta.session_id,
                        agent_id: &s.meta.agent_id,
                        organization_id: &s.meta.organization_id,
                    },
                    &s.state,
                    &s.policy.config,
                    s.last_call_number,
                )
            })
            .collect();
        Ok((out, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: &str, token: &str, expires_at_ns: Option<i64>) -> Operator {
        Operator {
            id: id.into(),
            token_sha256: token_sha256(token),
            organizations: vec!["acme".into()],
            expires_at_ns,
        }
    }

    #[test]
    fn tokens_hash_as_documented() {
        // SHA-256("test"), as `printf test | sha256sum` prints it.
        assert_eq!(
            hex(&token_sha256("test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        let t = new_token().unwrap();
        assert!(t.starts_with(TOKEN_PREFIX) && t.len() == TOKEN_PREFIX.len() + 64);
        assert_ne!(t, new_token().unwrap());
    }

    #[test]
    fn right_wrong_revoked_and_expired_tokens() {
        let ops = Operators::new(vec![
            op("alice", "a-token", None),
            op("bob", "b-token", Some(100)),
        ]);
        assert_eq!(ops.authenticate("a-token", 0).unwrap().id, "alice");
        assert_eq!(ops.authenticate("b-token", 99).unwrap().id, "bob");
        assert_eq!(
            ops.authenticate("b-token", 100).unwrap_err(),
            TokenRefused::Expired
        );
        assert_eq!(
            ops.authenticate("a-token ", 0).unwrap_err(),
            TokenRefused::Unknown
        );
        assert_eq!(ops.authenticate("", 0).unwrap_err(), TokenRefused::Unknown);
        // The empty string is refused even when it is configured.
        let ops_empty = Operators::new(vec![op("nobody", "", None)]);
        assert_eq!(
            ops_empty.authenticate("", 0).unwrap_err(),
            TokenRefused::Unknown
        );
        // Revoked: the operator is gone from the configuration.
        let ops = Operators::new(vec![op("bob", "b-token", None)]);
        assert_eq!(
            ops.authenticate("a-token", 0).unwrap_err(),
            TokenRefused::Unknown
        );
    }

    #[test]
    fn failed_sign_ins_are_limited_per_address() {
        let t0 = Instant::now();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        let mut l = AuthLimiter::new();
        for _ in 0..AUTH_FAILURE_BURST {
            assert!(l.check(&a, t0).is_ok());
            l.failed(&a, t0);
        }
        let wait = l.check(&a, t0).unwrap_err();
        assert_eq!(wait, AUTH_FAILURE_REFILL.as_millis() as u64);
        // Another address is not affected.
        assert!(l.check(&b, t0).is_ok());
        // One refill interval later, one more try.
        let t1 = t0 + AUTH_FAILURE_REFILL;
        assert!(l.check(&a, t1).is_ok());
        l.failed(&a, t1);
        assert!(l.check(&a, t1).is_err());
        // Long after, the address is forgotten (its budget is full again).
        let later = t1 + AUTH_FAILURE_REFILL * (AUTH_FAILURE_BURST + 1);
        l.failed(&b, later);
        assert_eq!(l.tracked(), 1);
        assert!(l.check(&a, later).is_ok());
    }
}
