//! The record set, indexed once: by task id, parent chain, time order, message type and
//! per-pair exchange counts, so that no rule rescans the whole set per envelope (except the
//! few per-request scans of DR-RISK-CARRIED and DR-CHALLENGE-COMPLETE, linear per request).

use std::collections::HashMap;

use crate::catalog::Catalog;
use crate::model::{Envelope, MessageType, Party, Status};
use crate::{Finding, RuleId};

/// Parent walks never take more than this many steps, so a parent cycle in hostile input
/// cannot loop; a consistent chain (hop_count 0..=32) is at most 33 long.
pub const MAX_WALK: usize = 64;

/// Indexed view of one record set.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The envelopes, in input order.
    pub env: &'a [Envelope],
    /// The catalog for HO-DESTINATION-TIER.
    pub catalog: &'a Catalog,
    /// task id -> first envelope with it.
    pub by_id: HashMap<&'a str, usize>,
    /// Each envelope's parent, when parent_task_id resolves.
    pub parent: Vec<Option<usize>>,
    /// Each envelope's children.
    pub children: Vec<Vec<usize>>,
    /// Rank of sent_at: equal timestamps share a rank, later ones have a higher rank.
    // INVARIANT (rank-order): t[a] < t[b] exactly when sent_at[a] < sent_at[b] (the contract
    // makes string order time order); `cumulative` is indexed by these ranks.
    pub t: Vec<u32>,
    /// Interned source and destination party of each envelope.
    pub src: Vec<u32>,
    /// See `src`.
    pub dst: Vec<u32>,
    /// The root: the first envelope with hop_count 0.
    pub root: Option<usize>,
    /// Indices of decision-requests.
    pub requests: Vec<usize>,
    /// Indices of decision-records.
    pub records: Vec<usize>,
    /// Indices of challenges.
    pub challenges: Vec<usize>,
    /// For each envelope index of a request: the requests that supersede it.
    pub superseded_by: HashMap<usize, Vec<usize>>,
    /// For each request index: every decision-record naming it (decider's and co-signing).
    pub records_of: HashMap<usize, Vec<usize>>,
    /// Per time rank j: how many envelopes of rank <= j have tier >= k (k = 0..=5), then how
    /// many carry materiality flag bit b (b = 0..=5).
    pub cumulative: Vec<[u32; 12]>,
    /// Envelopes by tier (0..=5), each list sorted by time rank.
    pub by_tier: [Vec<usize>; 6],
    /// Envelopes by materiality flag bit (0..=5), each list sorted by time rank.
    pub by_flag: [Vec<usize>; 6],
    /// Agent id -> challenges whose target was sent by that agent, sorted by time rank.
    pub challenges_on: HashMap<&'a str, Vec<usize>>,
    /// Challenges with hard_gate true, sorted by time rank.
    pub hard_gates: Vec<usize>,
    /// Agent id -> HARD-gate challenges whose target was sent by that agent, by time rank.
    pub hard_gates_on: HashMap<&'a str, Vec<usize>>,
    /// Decider's record task id -> the co-signing records naming it.
    pub cosigners: HashMap<&'a str, Vec<usize>>,
    /// (source, destination) -> times of that pair's exchanges (delegates, returns and
    /// challenges that did not stop), sorted.
    pub exchanges: HashMap<(u32, u32), Vec<(u32, usize)>>,
}

impl<'a> Ctx<'a> {
    /// Index `env`.
    pub fn new(env: &'a [Envelope], catalog: &'a Catalog) -> Ctx<'a> {
        let n = env.len();
        let mut by_id = HashMap::with_capacity(n);
        for (i, e) in env.iter().enumerate() {
            by_id.entry(e.task_id.as_str()).or_insert(i);
        }
        let mut parent = vec![None; n];
        let mut children = vec![Vec::new(); n];
        for (i, e) in env.iter().enumerate() {
            if let Some(p) = e.parent_task_id.as_deref().and_then(|p| by_id.get(p)) {
                if *p != i {
                    if let Some(slot) = parent.get_mut(i) {
                        *slot = Some(*p);
                    }
                    if let Some(c) = children.get_mut(*p) {
                        c.push(i);
                    }
                }
            }
        }
        let mut times: Vec<&str> = env.iter().map(|e| e.sent_at.as_str()).collect();
        times.sort_unstable();
        times.dedup();
        // INVARIANT (rank-order): ranks are positions in the sorted, deduplicated timestamps.
        let t = env
            .iter()
            .map(|e| {
                let r = times.binary_search(&e.sent_at.as_str()).unwrap_or(0);
                u32::try_from(r).unwrap_or(u32::MAX)
            })
            .collect::<Vec<_>>();
        let mut parties: HashMap<(bool, &str), u32> = HashMap::new();
        let mut intern = |p: &'a Party| {
            let next = u32::try_from(parties.len()).unwrap_or(u32::MAX);
            *parties.entry(p.key()).or_insert(next)
        };
        let src: Vec<u32> = env.iter().map(|e| intern(&e.source)).collect();
        let dst: Vec<u32> = env.iter().map(|e| intern(&e.destination)).collect();
        let root = env.iter().position(|e| e.hop_count == 0);
        let of = |m: MessageType| {
            env.iter()
                .enumerate()
                .filter(|(_, e)| e.message_type == m)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        let requests = of(MessageType::DecisionRequest);
        let records = of(MessageType::DecisionRecord);
        let challenges = of(MessageType::Challenge);
        let mut superseded_by: HashMap<usize, Vec<usize>> = HashMap::new();
        for &r in &requests {
            let sup = env
                .get(r)
                .and_then(|e| e.request.as_ref())
                .and_then(|p| p.supersedes_task_id.as_deref())
                .and_then(|s| by_id.get(s));
            if let Some(&s) = sup {
                superseded_by.entry(s).or_default().push(r);
            }
        }
        let mut records_of: HashMap<usize, Vec<usize>> = HashMap::new();
        for &d in &records {
            let req = env
                .get(d)
                .and_then(|e| e.record.as_ref())
                .and_then(|p| by_id.get(p.request_task_id.as_str()));
            if let Some(&r) = req {
                records_of.entry(r).or_default().push(d);
            }
        }
        let mut exchanges: HashMap<(u32, u32), Vec<(u32, usize)>> = HashMap::new();
        for (i, e) in env.iter().enumerate() {
            if is_exchange(e) {
                if let (Some(s), Some(d), Some(ti)) = (src.get(i), dst.get(i), t.get(i)) {
                    exchanges.entry((*s, *d)).or_default().push((*ti, i));
                }
            }
        }
        for v in exchanges.values_mut() {
            v.sort_unstable();
        }
        let ranks = times.len();
        let mut cumulative = vec![[0u32; 12]; ranks];
        let mut by_tier: [Vec<usize>; 6] = Default::default();
        let mut by_flag: [Vec<usize>; 6] = Default::default();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| t.get(i).copied().unwrap_or(0));
        for &i in &order {
            let Some(e) = env.get(i) else { continue };
            let j = t.get(i).copied().unwrap_or(0) as usize;
            if let Some(row) = cumulative.get_mut(j) {
                for (k, slot) in row.iter_mut().enumerate() {
                    let hit = if k < 6 {
                        usize::from(e.tier) >= k
                    } else {
                        e.flags & (1 << (k - 6)) != 0
                    };
                    *slot += u32::from(hit);
                }
            }
            if let Some(list) = by_tier.get_mut(usize::from(e.tier)) {
                list.push(i);
            }
            for (b, list) in by_flag.iter_mut().enumerate() {
                if e.flags & (1 << b) != 0 {
                    list.push(i);
                }
            }
        }
        for j in 1..ranks {
            if let (Some(prev), Some(cur)) = (cumulative.get(j - 1).copied(), cumulative.get_mut(j))
            {
                for (c, p) in cur.iter_mut().zip(prev) {
                    *c += p;
                }
            }
        }
        let mut challenges_on: HashMap<&'a str, Vec<usize>> = HashMap::new();
        let mut hard_gates = Vec::new();
        let mut hard_gates_on: HashMap<&'a str, Vec<usize>> = HashMap::new();
        for &i in &order {
            let Some(c) = env.get(i).and_then(|e| e.challenge.as_ref()) else {
                continue;
            };
            if env.get(i).map(|e| e.message_type) != Some(MessageType::Challenge) {
                continue;
            }
            if c.hard_gate {
                hard_gates.push(i);
            }
            let target_sender = by_id
                .get(c.proposal_task_id.as_str())
                .and_then(|&tgt| env.get(tgt))
                .and_then(|te| match &te.source {
                    Party::Agent(id) => Some(id.as_str()),
                    Party::Principal { .. } => None,
                });
            if let Some(agent) = target_sender {
                challenges_on.entry(agent).or_default().push(i);
                if c.hard_gate {
                    hard_gates_on.entry(agent).or_default().push(i);
                }
            }
        }
        let mut cosigners: HashMap<&'a str, Vec<usize>> = HashMap::new();
        for &d in &records {
            if let Some(c) = env
                .get(d)
                .and_then(|e| e.record.as_ref())
                .and_then(|p| p.co_signs_task_id.as_deref())
            {
                cosigners.entry(c).or_default().push(d);
            }
        }
        Ctx {
            env,
            catalog,
            by_id,
            parent,
            children,
            t,
            src,
            dst,
            root,
            requests,
            records,
            challenges,
            superseded_by,
            records_of,
            exchanges,
            cumulative,
            by_tier,
            by_flag,
            challenges_on,
            hard_gates,
            hard_gates_on,
            cosigners,
        }
    }

    /// The envelope at `i` (all indices handed out by the index are in range).
    pub fn e(&self, i: usize) -> Option<&'a Envelope> {
        self.env.get(i)
    }

    /// The envelope with this task id.
    pub fn find(&self, task_id: &str) -> Option<usize> {
        self.by_id.get(task_id).copied()
    }

    /// Whether envelope `i` is of message type `m`. The type is the message_type field
    /// alone: a payload that is missing, or that belongs to another type, never changes it
    /// (those are HO-PAYLOAD-* findings).
    pub fn is(&self, i: usize, m: MessageType) -> bool {
        self.e(i).is_some_and(|e| e.message_type == m)
    }

    /// The parent of `i`.
    pub fn parent_of(&self, i: usize) -> Option<usize> {
        self.parent.get(i).copied().flatten()
    }

    /// Proper ancestors of `i`, nearest first, at most [`MAX_WALK`].
    pub fn ancestors(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cur = self.parent_of(i);
        let mut steps = 0usize;
        std::iter::from_fn(move || {
            let c = cur?;
            steps += 1;
            if steps > MAX_WALK || c == i {
                return None;
            }
            cur = self.parent_of(c);
            Some(c)
        })
    }

    /// Whether `d` descends from `a` (a is a proper ancestor of d).
    pub fn descends(&self, d: usize, a: usize) -> bool {
        self.ancestors(d).any(|x| x == a)
    }

    /// Proper descendants of `i` within [`MAX_WALK`] levels (the inverse of [`Ctx::ancestors`]).
    pub fn descendants(&self, i: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        seen.insert(i);
        let mut frontier = vec![i];
        for _ in 0..MAX_WALK {
            let mut next = Vec::new();
            for f in frontier {
                for &c in self.children.get(f).map_or(&[][..], Vec::as_slice) {
                    if seen.insert(c) {
                        out.push(c);
                        next.push(c);
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        out
    }

    /// The time rank of envelope `i`.
    pub fn time(&self, i: usize) -> u32 {
        self.t.get(i).copied().unwrap_or(0)
    }

    /// `y` is causally after `x`: sent at a later second, or a descendant of `x`.
    pub fn after(&self, y: usize, x: usize) -> bool {
        self.time(y) > self.time(x) || self.descends(y, x)
    }

    /// `y` precedes `x`: a different envelope that is not causally after it (the same
    /// second counts as preceding unless `y` descends from `x`).
    pub fn precedes(&self, y: usize, x: usize) -> bool {
        y != x && !self.after(y, x)
    }

    /// Whether the two envelopes have the same sender.
    pub fn same_source(&self, a: usize, b: usize) -> bool {
        self.src.get(a) == self.src.get(b)
    }

    /// Exchanges from `from`'s party to `to`'s party that precede envelope `before`.
    pub fn exchanges_before(&self, from: u32, to: u32, before: usize) -> usize {
        let Some(times) = self.exchanges.get(&(from, to)) else {
            return 0;
        };
        let tb = self.time(before);
        let upto = times.partition_point(|x| x.0 <= tb);
        // Of the pair's exchanges sent no later than `before`, those that are `before` itself
        // or descend from it are causally after it and do not count.
        let in_pair = |i: usize| {
            self.time(i) <= tb
                && self.src.get(i) == Some(&from)
                && self.dst.get(i) == Some(&to)
                && self.e(i).is_some_and(is_exchange)
        };
        let later = usize::from(in_pair(before))
            + self
                .descendants(before)
                .into_iter()
                .filter(|&d| in_pair(d))
                .count();
        upto.saturating_sub(later)
    }

    /// Record a finding about envelope `i`.
    pub fn report(&self, out: &mut Vec<Finding>, rule: RuleId, i: Option<usize>, msg: String) {
        out.push(Finding {
            rule,
            task_id: i.and_then(|i| self.e(i)).map(|e| e.task_id.clone()),
            message: msg,
        });
    }
}

/// An exchange: a delegate, return or challenge that did not stop.
pub fn is_exchange(e: &Envelope) -> bool {
    matches!(
        e.message_type,
        MessageType::Delegate | MessageType::Return | MessageType::Challenge
    ) && e.status != Status::Stopped
}
