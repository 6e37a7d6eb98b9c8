//! The names the host sees. Hosts check tool names against `^[a-zA-Z0-9_-]{1,64}$`
//! (Claude Desktop, Cursor and Copilot refuse a tool list with any other), so every name
//! the gateway offers matches it, whatever the upstreams call their tools:
//!
//! 1. The natural name: the upstream's own name with one upstream; with several,
//!    `UPSTREAM` + `gateway.tool_separator` (default `__`) + the upstream's own name.
//! 2. Any character outside `A-Z a-z 0-9 _ -` becomes `_`.
//! 3. A name longer than 64 bytes keeps its first 55 and gets `_` and 8 hex digits of the
//!    SHA-256 of `UPSTREAM`, a zero byte and the own name (64 in all).
//! 4. Names that collide: a natural name that needed no change in 2 or 3 keeps it (the
//!    first in configuration and listing order, if two such collide); every other one of
//!    the group gets the suffix of 3, with a counter in the hashed text until it is unique.
//!
//! The result depends only on the configuration and each upstream's set of tools, so it
//! is the same on every start; `tollgate mcp --check` prints it. The gateway routes by the
//! table ([`Names::route`]), never by splitting a name.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

/// The longest name a host accepts.
pub const MAX_NAME: usize = 64;

/// Whether `name` is a name every known host accepts: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn host_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The table of offered names: public name to (upstream index, the upstream's own name).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    route: HashMap<String, (usize, String)>,
    public: BTreeMap<(usize, String), String>,
}

impl Names {
    /// The upstream and its own name for a public `name`.
    pub fn route(&self, name: &str) -> Option<(usize, &str)> {
        self.route.get(name).map(|(i, own)| (*i, own.as_str()))
    }

    /// The public name of upstream `i`'s `own` name, when it is offered.
    pub fn public(&self, i: usize, own: &str) -> Option<&str> {
        self.public.get(&(i, own.to_owned())).map(String::as_str)
    }
}

fn suffixed(base: &str, upstream: &str, own: &str, round: u32) -> String {
    let mut h = Sha256::new();
    h.update(upstream.as_bytes());
    h.update([0]);
    h.update(own.as_bytes());
    if round > 0 {
        h.update([0]);
        h.update(round.to_be_bytes());
    }
    let digest = h.finalize();
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    // `base` is ASCII after step 2, so any byte offset is a character boundary.
    let keep = base.len().min(MAX_NAME - 9);
    format!("{}_{hex}", base.get(..keep).unwrap_or(base))
}

/// Assign public names. `upstreams` is each upstream's name and its own tool (or prompt)
/// names, in configuration and listing order; `namespaced` is whether there are several
/// upstreams (then names carry the upstream and `separator`).
pub fn assign(upstreams: &[(&str, Vec<String>)], namespaced: bool, separator: &str) -> Names {
    struct Entry {
        i: usize,
        upstream: String,
        own: String,
        natural: String,
        clean: bool,
    }
    let mut entries = Vec::new();
    for (i, (upstream, tools)) in upstreams.iter().enumerate() {
        for own in tools {
            let raw = if namespaced {
                format!("{upstream}{separator}{own}")
            } else {
                own.clone()
            };
            let clean = host_safe(&raw);
            let mut natural: String = raw
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if natural.is_empty() {
                natural.push('_');
            }
            if natural.len() > MAX_NAME {
                natural = suffixed(&natural, upstream, own, 0);
            }
            entries.push(Entry {
                i,
                upstream: (*upstream).to_owned(),
                own: own.clone(),
                natural,
                clean,
            });
        }
    }
    // Which entry keeps each natural name: the first clean one, else none.
    let mut keeper: HashMap<&str, usize> = HashMap::new();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (n, e) in entries.iter().enumerate() {
        *count.entry(e.natural.as_str()).or_default() += 1;
        if e.clean {
            keeper.entry(e.natural.as_str()).or_insert(n);
        }
    }
    let mut names = Names::default();
    let mut taken: std::collections::HashSet<String> = entries
        .iter()
        .enumerate()
        .filter(|(n, e)| {
            count.get(e.natural.as_str()) == Some(&1) || keeper.get(e.natural.as_str()) == Some(n)
        })
        .map(|(_, e)| e.natural.clone())
        .collect();
    for (n, e) in entries.iter().enumerate() {
        let alone = count.get(e.natural.as_str()) == Some(&1);
        let name = if alone || keeper.get(e.natural.as_str()) == Some(&n) {
            e.natural.clone()
        } else {
            let mut round = 0;
            loop {
                let candidate = suffixed(&e.natural, &e.upstream, &e.own, round);
                if taken.insert(candidate.clone()) {
                    break candidate;
                }
                round += 1;
            }
        };
        if names.public.contains_key(&(e.i, e.own.clone())) {
            // An upstream that lists one name twice: the first listing is the one.
            continue;
        }
        names.route.insert(name.clone(), (e.i, e.own.clone()));
        names.public.insert((e.i, e.own.clone()), name);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ups(v: &[(&'static str, &[&str])]) -> Vec<(&'static str, Vec<String>)> {
        v.iter()
            .map(|(u, t)| (*u, t.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn one_upstream_keeps_its_names_and_several_get_the_separator() {
        let one = assign(&ups(&[("github", &["create_issue"])]), false, "__");
        assert_eq!(one.route("create_issue"), Some((0, "create_issue")));
        let two = assign(
            &ups(&[("github", &["create_issue"]), ("files", &["read"])]),
            true,
            "__",
        );
        assert_eq!(two.route("github__create_issue"), Some((0, "create_issue")));
        assert_eq!(two.public(1, "read"), Some("files__read"));
        assert_eq!(two.route("github.create_issue"), None);
    }

    #[test]
    fn dots_spaces_and_unicode_become_underscores_and_long_names_are_cut_with_a_hash() {
        let n = assign(
            &ups(&[("a", &["fs.read", "say hi", "café", &"x".repeat(100)])]),
            false,
            "__",
        );
        assert!(n.route("fs_read").is_some());
        assert!(n.route("say_hi").is_some());
        assert!(n.route("caf_").is_some());
        let long = n.public(0, &"x".repeat(100)).unwrap();
        assert_eq!(long.len(), 64);
        assert!(long.starts_with(&"x".repeat(55)));
        assert!(host_safe(long));
    }

    #[test]
    fn a_clean_name_keeps_it_and_the_one_that_collides_with_it_is_suffixed() {
        // `fs_read` is clean; `fs.read` sanitizes to the same: the clean one keeps it.
        let n = assign(&ups(&[("a", &["fs.read", "fs_read"])]), false, "__");
        assert_eq!(n.route("fs_read"), Some((0, "fs_read")));
        let other = n.public(0, "fs.read").unwrap();
        assert_ne!(other, "fs_read");
        assert!(other.starts_with("fs_read_") && host_safe(other));
        // Two upstreams whose natural names meet: `a__b` + `c` and `a` + `b__c`.
        let n = assign(&ups(&[("a", &["b__c"]), ("a__b", &["c"])]), true, "__");
        assert_eq!(n.route("a__b__c"), Some((0, "b__c")));
        assert!(n.public(1, "c").unwrap().starts_with("a__b__c_"));
    }

    proptest! {
        #[test]
        fn every_name_is_host_safe_unique_and_routes_back(
            tools in proptest::collection::vec(
                proptest::collection::vec("[a-z_.é -]{0,80}", 0..12), 1..4),
            sep in prop_oneof![Just("__"), Just("_"), Just("-")],
        ) {
            let names: Vec<&str> = ["up", "up_x", "u-p"].into_iter().take(tools.len()).collect();
            let input: Vec<(&str, Vec<String>)> =
                names.iter().copied().zip(tools.iter().cloned()).collect();
            let n = assign(&input, input.len() > 1, sep);
            for (i, (_, own)) in input.iter().enumerate() {
                for t in own {
                    let public = n.public(i, t).unwrap();
                    prop_assert!(host_safe(public), "{public:?}");
                    prop_assert_eq!(n.route(public), Some((i, t.as_str())));
                }
            }
            // Stable: the same input gives the same table.
            prop_assert_eq!(n, assign(&input, input.len() > 1, sep));
        }
    }
}
