//! Key names (see docs/redis.md): `P:{G}:s:<id>`, `P:{G}:b`, `P:loc:<id>`, `P:idx`,
//! `P:unconfirmed`. `G` is the group tag that puts a session and the budget it spends in
//! one Redis Cluster slot.

use tollgate_core::BudgetScope;
use tollgate_store::{BudgetKey, SessionMeta};

/// The key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// The unit separator: ids cannot hold control characters, so it cannot be in an id.
pub const SEP: char = '\x1f';

impl Keys {
    /// Keys under `prefix` (no `{` or `}`: they would move the Cluster hash tag).
    pub fn new(prefix: &str) -> Result<Keys, String> {
        if prefix.is_empty() || prefix.len() > 64 {
            return Err("key_prefix must be 1 to 64 bytes".to_owned());
        }
        if prefix.contains(['{', '}']) || prefix.chars().any(char::is_control) {
            return Err("key_prefix must not hold `{`, `}` or control characters".to_owned());
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
        })
    }

    /// The group tag of a session: its budget's.
    pub fn group(meta: &SessionMeta) -> String {
        match meta.budget_scope {
            BudgetScope::PerSession => format!("s:{}", meta.session_id),
            BudgetScope::PerAgent => format!("a:{}{SEP}{}", meta.organization_id, meta.agent_id),
            BudgetScope::PerOrganization => format!("o:{}", meta.organization_id),
        }
    }

    /// The group tag of a shared budget key (`None` for a session's own budget).
    pub fn budget_group(key: &BudgetKey) -> Option<String> {
        match key {
            BudgetKey::Session(_) => None,
            BudgetKey::Agent(o, a) => Some(format!("a:{o}{SEP}{a}")),
            BudgetKey::Organization(o) => Some(format!("o:{o}")),
        }
    }

    /// The session hash.
    pub fn session(&self, group: &str, id: &str) -> String {
        format!("{}:{{{group}}}:s:{id}", self.prefix)
    }

    /// The shared budget hash of a group.
    pub fn budget(&self, group: &str) -> String {
        format!("{}:{{{group}}}:b", self.prefix)
    }

    /// Where a session's group is recorded.
    pub fn loc(&self, id: &str) -> String {
        format!("{}:loc:{id}", self.prefix)
    }

    /// A session's note (a held call's params, for other daemons).
    pub fn note(&self, id: &str) -> String {
        format!("{}:note:{id}", self.prefix)
    }

    /// The set of live session ids.
    pub fn idx(&self) -> String {
        format!("{}:idx", self.prefix)
    }

    /// The sorted set of unconfirmed markers.
    pub fn unconfirmed(&self) -> String {
        format!("{}:unconfirmed", self.prefix)
    }

    /// A member of the unconfirmed index.
    pub fn member(group: &str, id: &str, seq: u64) -> String {
        format!("{group}{SEP}{id}{SEP}{seq}")
    }

    /// Parse a member of the unconfirmed index: (group, session id, seq).
    pub fn parse_member(m: &str) -> Option<(String, String, u64)> {
        let (rest, seq) = m.rsplit_once(SEP)?;
        let (group, id) = rest.rsplit_once(SEP)?;
        Some((group.to_owned(), id.to_owned(), seq.parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_and_tags_group_a_session_with_its_budget() {
        for g in ["s:x", "a:org\x1fagent", "o:org"] {
            let m = Keys::member(g, "sess-1", 42);
            assert_eq!(
                Keys::parse_member(&m),
                Some((g.to_owned(), "sess-1".to_owned(), 42))
            );
        }
        assert_eq!(Keys::parse_member("no separators"), None);
        let k = Keys::new("tg").unwrap();
        assert_eq!(k.session("o:org", "s1"), "tg:{o:org}:s:s1");
        assert_eq!(k.budget("o:org"), "tg:{o:org}:b");
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("").is_err());
        assert_eq!(
            Keys::budget_group(&BudgetKey::Agent("o".into(), "a".into())).as_deref(),
            Some("a:o\x1fa")
        );
        assert_eq!(Keys::budget_group(&BudgetKey::Session("s".into())), None);
    }
}
