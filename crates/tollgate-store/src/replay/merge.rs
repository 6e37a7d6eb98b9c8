//! The order in which a fleet's chains are folded (`tollgate policy replay --postgres`).
//!
//! Each daemon of a fleet writes its own chain, and no chain's order is a session's or a
//! shared budget's: a session resumed on another daemon goes on in that daemon's chain,
//! and a shared budget is spent through every daemon. What orders them is in the entries
//! (docs/audit-format.md, "Session events" and "Folding a shared budget"):
//!
//! - a session's changes by their `session_seq`: every place from 1 to the session's last
//!   is held by exactly one entry across all chains (the change's own entry, or a void);
//! - a shared budget's writes by their `budget_version`: each version is written once.
//!
//! [`merge`] gives one order of every chain's session entries and voids that keeps both:
//! a topological order of the graph whose edges are "place `n` before place `n + 1` of a
//! session" and "version `v` before the next version written of a budget", with ties
//! (entries no edge orders, such as two sessions with budgets of their own) broken by
//! the entry's time, then its chain and index. Places and versions are checked on the
//! way: a place held twice or missing below a session's last, or a budget version named
//! twice, is an error (the chains are not one fleet's whole history); so is a cycle
//! (chains whose orders contradict each other).
//!
//! A void is ordered by its session's place only: it names two versions of the budget
//! (the voided write and its give-back, with other writes in between), and changes
//! nothing a replay reads (the recorded fold takes each entry's own budget amounts).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use tollgate_audit::{Event, SessionEvent};

use crate::session::BudgetKey;

/// One chain's verified entries, in chain order: each with its index in the chain.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    /// The chain's id (`chains.chain_id` in PostgreSQL).
    pub id: String,
    /// Its entries: (index, event).
    pub entries: Vec<(u64, Event)>,
}

/// An entry of the chains given to [`merge`]: chain `chain` (its position in the slice),
/// entry `entry` (its position in that chain's `entries`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct At {
    /// The chain's position.
    pub chain: usize,
    /// The entry's position in the chain's entries.
    pub entry: usize,
}

/// Why the chains cannot be folded as one fleet's history.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Two entries hold one place of a session.
    #[error("session `{session}`: place {seq} is held by two entries ({first} and {second})")]
    PlaceTwice {
        /// The session.
        session: String,
        /// The place (`session_seq`).
        seq: u64,
        /// Where the first entry is (`chain C entry I`).
        first: String,
        /// Where the second is.
        second: String,
    },
    /// A place below the session's last is held by no entry.
    #[error("session `{session}`: place {seq} is held by no entry of any chain, though place {last} is (a chain is missing, or the fleet was still committing it: replay again)")]
    PlaceMissing {
        /// The session.
        session: String,
        /// The missing place.
        seq: u64,
        /// The session's last place.
        last: u64,
    },
    /// Two entries name one version of a shared budget: two changes were computed from
    /// one state of the budget (a lost update).
    #[error(
        "shared budget {budget}: version {version} is named by two entries ({first} and {second})"
    )]
    VersionTwice {
        /// The budget.
        budget: String,
        /// The version.
        version: u64,
        /// Where the first entry is.
        first: String,
        /// Where the second is.
        second: String,
    },
    /// A session spending its own budget names a shared budget's version.
    #[error("{at}: a change of session `{session}`, which spends a budget of its own, names shared budget version {version}")]
    VersionOfOwnBudget {
        /// The session.
        session: String,
        /// The version.
        version: u64,
        /// Where the entry is.
        at: String,
    },
    /// The sessions' orders and the budgets' orders contradict each other.
    #[error("the chains' orders contradict each other: {left} entries cannot be ordered by their sessions' places and their budgets' versions (one of them: {example})")]
    Cycle {
        /// How many entries were left.
        left: usize,
        /// Where one of them is.
        example: String,
    },
}

/// Where entry `at` is, as a person reads it: `chain C entry I`.
fn name(chains: &[Chain], at: At) -> String {
    let c = chains.get(at.chain);
    let index = c
        .and_then(|c| c.entries.get(at.entry))
        .map_or(0, |(i, _)| *i);
    format!("chain {} entry {index}", c.map_or("?", |c| c.id.as_str()))
}

fn budget_name(k: &BudgetKey) -> String {
    match k {
        BudgetKey::Session(s) => format!("of session `{s}`"),
        BudgetKey::Agent(o, a) => format!("of agent `{o}/{a}`"),
        BudgetKey::Organization(o) => format!("of organization `{o}`"),
    }
}

/// A node of the order's graph: an entry, its time, the nodes that must come after it,
/// and how many must come before it.
struct Node {
    at: At,
    time: i64,
    next: Vec<usize>,
    incoming: usize,
}

fn edge(nodes: &mut [Node], from: usize, to: usize) {
    if let Some(n) = nodes.get_mut(from) {
        n.next.push(to);
    }
    if let Some(n) = nodes.get_mut(to) {
        n.incoming += 1;
    }
}

fn at_of(nodes: &[Node], node: usize) -> At {
    nodes.get(node).map_or(
        At {
            chain: usize::MAX,
            entry: usize::MAX,
        },
        |n| n.at,
    )
}

/// Every session entry and void of `chains`, in an order that folds: each session's
/// places in order, each shared budget's versions in order (see the module's text).
/// Entries of other kinds (policy sets, hand-overs, recoveries) are left out: they
/// change no session.
pub fn merge(chains: &[Chain]) -> Result<Vec<At>, MergeError> {
    // The nodes, their places and versions.
    let mut nodes: Vec<Node> = Vec::new();
    let mut places: HashMap<&str, BTreeMap<u64, usize>> = HashMap::new();
    let mut shared: HashMap<&str, Option<BudgetKey>> = HashMap::new();
    let mut budget_writes: Vec<(usize, &SessionEvent)> = Vec::new();
    for (c, chain) in chains.iter().enumerate() {
        for (e, (_, event)) in chain.entries.iter().enumerate() {
            let (session, seq, time) = match event {
                Event::Session(s) => {
                    if let SessionEvent::Opened(o) = s {
                        let key = crate::ops::opened_meta(o).shared_budget_key();
                        shared.insert(&o.session_id, key);
                    }
                    if s.budget_version() != 0 {
                        budget_writes.push((nodes.len(), s));
                    }
                    (s.session_id(), s.session_seq(), s.timestamp_ns())
                }
                Event::Void(v) => (v.session_id.as_str(), v.session_seq, v.timestamp_ns),
                _ => continue,
            };
            let at = At { chain: c, entry: e };
            let node = nodes.len();
            nodes.push(Node {
                at,
                time,
                next: Vec::new(),
                incoming: 0,
            });
            if let Some(other) = places.entry(session).or_default().insert(seq, node) {
                return Err(MergeError::PlaceTwice {
                    session: session.to_owned(),
                    seq,
                    first: name(chains, at_of(&nodes, other)),
                    second: name(chains, at),
                });
            }
        }
    }
    for (session, held) in &places {
        let mut prev: Option<(u64, usize)> = None;
        for (&seq, &node) in held {
            let expected = prev.map_or(1, |(p, _)| p.saturating_add(1));
            if seq != expected {
                let last = held.keys().next_back().copied().unwrap_or(seq);
                return Err(MergeError::PlaceMissing {
                    session: (*session).to_owned(),
                    seq: expected,
                    last,
                });
            }
            if let Some((_, p)) = prev {
                edge(&mut nodes, p, node);
            }
            prev = Some((seq, node));
        }
    }
    // The shared budgets' versions (voids aside: see the module's text).
    let mut versions: HashMap<BudgetKey, BTreeMap<u64, usize>> = HashMap::new();
    for (node, s) in budget_writes {
        let version = s.budget_version();
        let at = at_of(&nodes, node);
        let Some(key) = shared.get(s.session_id()).cloned().flatten() else {
            return Err(MergeError::VersionOfOwnBudget {
                session: s.session_id().to_owned(),
                version,
                at: name(chains, at),
            });
        };
        let map = versions.entry(key.clone()).or_default();
        if let Some(other) = map.insert(version, node) {
            return Err(MergeError::VersionTwice {
                budget: budget_name(&key),
                version,
                first: name(chains, at_of(&nodes, other)),
                second: name(chains, at),
            });
        }
    }
    for map in versions.values() {
        let mut prev = None;
        for &node in map.values() {
            if let Some(p) = prev {
                edge(&mut nodes, p, node);
            }
            prev = Some(node);
        }
    }
    // Kahn's algorithm, the earliest entry first among those free to go.
    let mut ready: BinaryHeap<Reverse<(i64, At, usize)>> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.incoming == 0)
        .map(|(i, n)| Reverse((n.time, n.at, i)))
        .collect();
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(Reverse((_, at, node))) = ready.pop() {
        out.push(at);
        let next = nodes
            .get_mut(node)
            .map(|n| std::mem::take(&mut n.next))
            .unwrap_or_default();
        for to in next {
            if let Some(n) = nodes.get_mut(to) {
                n.incoming = n.incoming.saturating_sub(1);
                if n.incoming == 0 {
                    ready.push(Reverse((n.time, n.at, to)));
                }
            }
        }
    }
    if out.len() < nodes.len() {
        let example = nodes
            .iter()
            .find(|n| n.incoming > 0)
            .map_or_else(String::new, |n| name(chains, n.at));
        return Err(MergeError::Cycle {
            left: nodes.len() - out.len(),
            example,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{Policy, Session};
    use std::sync::Arc;
    use tollgate_core::{BudgetScope, Digest, GuardConfig, Money, Params, ToolCall};

    /// Session `id` (spending organization `o`'s budget): its opening and `calls` ALLOWs,
    /// at times `t0`, `t0 + 1`, ...
    fn session(id: &str, calls: u64, t0: i64) -> Vec<SessionEvent> {
        let policy = Arc::new(Policy::new(GuardConfig {
            budget: Money(1_000_000_000),
            budget_scope: BudgetScope::PerOrganization,
            ..GuardConfig::default()
        }));
        let meta = crate::session::SessionMeta {
            session_id: id.into(),
            agent_id: "a".into(),
            organization_id: "o".into(),
            budget_scope: BudgetScope::PerOrganization,
            created_at_ns: t0,
        };
        let mut s = Session::new(meta, policy, t0);
        let mut out = vec![crate::ops::open(&mut s, t0).into()];
        for n in 1..=calls {
            let call = ToolCall {
                tool_name: "t",
                params: Params::digest(Digest([n as u8; 32])),
                nonce: Some(n),
                estimated_cost: Money(1),
                raw_params: None,
            };
            let d = tollgate_core::decide(&s.policy.config, &s.state, &call, t0, 0.5);
            out.push(crate::ops::verdict_with(&mut s, &call, &d, None, n, t0 + n as i64).into());
        }
        out
    }

    fn chain(id: &str, events: Vec<SessionEvent>) -> Chain {
        Chain {
            id: id.into(),
            entries: events
                .into_iter()
                .enumerate()
                .map(|(i, e)| (i as u64, Event::Session(e)))
                .collect(),
        }
    }

    fn seqs(chains: &[Chain], order: &[At]) -> Vec<(String, u64)> {
        order
            .iter()
            .map(|at| match &chains[at.chain].entries[at.entry].1 {
                Event::Session(e) => (e.session_id().to_owned(), e.session_seq()),
                Event::Void(v) => (v.session_id.clone(), v.session_seq),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_session_served_by_two_daemons_is_folded_by_its_places_whatever_the_times() {
        let s = session("s", 3, 100);
        // The daemon that went on has a clock behind: its entries are older by time.
        let mut later = s[2..].to_vec();
        for e in &mut later {
            if let SessionEvent::Verdict(v) = e {
                v.timestamp_ns -= 50;
            }
        }
        let chains = [chain("b", later), chain("a", s[..2].to_vec())];
        let order = merge(&chains).unwrap();
        assert_eq!(
            seqs(&chains, &order),
            [
                ("s".into(), 1),
                ("s".into(), 2),
                ("s".into(), 3),
                ("s".into(), 4)
            ]
        );
    }

    #[test]
    fn a_shared_budgets_versions_order_its_writes_across_sessions() {
        // Two sessions; their writes of the budget alternate by version, against times.
        let mut a = session("a", 2, 100);
        let mut b = session("b", 2, 10);
        for (e, v) in a.iter_mut().zip([1, 2, 4]) {
            e.set_budget_version(v);
        }
        for (e, v) in b.iter_mut().zip([0, 3, 5]) {
            e.set_budget_version(v);
        }
        let chains = [chain("x", b), chain("y", a)];
        let order = merge(&chains).unwrap();
        let got = seqs(&chains, &order);
        let pos = |s: &str, q: u64| got.iter().position(|g| *g == (s.to_owned(), q)).unwrap();
        // Version 2 (a's call 1) before version 3 (b's call 1), before version 4 (a's
        // call 2), before version 5 (b's call 2).
        assert!(pos("a", 2) < pos("b", 2), "{got:?}");
        assert!(pos("b", 2) < pos("a", 3), "{got:?}");
        assert!(pos("a", 3) < pos("b", 3), "{got:?}");
    }

    #[test]
    fn places_held_twice_or_missing_and_versions_named_twice_are_refused() {
        let s = session("s", 3, 100);
        let twice = [chain("a", s.clone()), chain("b", s[1..2].to_vec())];
        assert!(matches!(
            merge(&twice),
            Err(MergeError::PlaceTwice { seq: 2, .. })
        ));
        let mut gap = s.clone();
        gap.remove(2);
        assert!(matches!(
            merge(&[chain("a", gap)]),
            Err(MergeError::PlaceMissing {
                seq: 3,
                last: 4,
                ..
            })
        ));
        let mut lost = s.clone();
        lost[1].set_budget_version(2);
        lost[2].set_budget_version(2);
        assert!(matches!(
            merge(&[chain("a", lost)]),
            Err(MergeError::VersionTwice { version: 2, .. })
        ));
        // Places and versions that contradict each other.
        let mut crossed = s;
        crossed[1].set_budget_version(3);
        crossed[2].set_budget_version(2);
        assert!(matches!(
            merge(&[chain("a", crossed)]),
            Err(MergeError::Cycle { .. })
        ));
    }
}
