//! The agent catalog behind HO-DESTINATION-TIER: agent id to execution tier.

use std::collections::HashMap;

use tollgate_core::json::{self, Limits, Value};

/// An agent's execution tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionTier {
    /// Files and content only.
    StaticReview,
    /// Read-only operational access.
    ReadOnlyRuntime,
    /// Reversible mutation only.
    SandboxMutating,
    /// Gate-only live guards.
    MutatingRuntime,
    /// No declared tier.
    Untiered,
}

impl ExecutionTier {
    fn parse(s: &str) -> Option<ExecutionTier> {
        Some(match s {
            "static-review" => ExecutionTier::StaticReview,
            "read-only-runtime" => ExecutionTier::ReadOnlyRuntime,
            "sandbox-mutating" => ExecutionTier::SandboxMutating,
            "mutating-runtime" => ExecutionTier::MutatingRuntime,
            "untiered" => ExecutionTier::Untiered,
            _ => return None,
        })
    }

    /// The tier as written.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionTier::StaticReview => "static-review",
            ExecutionTier::ReadOnlyRuntime => "read-only-runtime",
            ExecutionTier::SandboxMutating => "sandbox-mutating",
            ExecutionTier::MutatingRuntime => "mutating-runtime",
            ExecutionTier::Untiered => "untiered",
        }
    }

    /// Whether the board may delegate to an agent of this tier.
    pub fn dispatchable(self) -> bool {
        matches!(
            self,
            ExecutionTier::StaticReview | ExecutionTier::ReadOnlyRuntime
        )
    }
}

/// Catalog files larger than this are refused.
pub const MAX_CATALOG_BYTES: usize = 1024 * 1024;

/// Why a catalog file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// Not strict JSON.
    #[error("catalog is not valid JSON: {0}")]
    Json(String),
    /// Not an array of `{"id", "execution_tier"}` objects.
    #[error("catalog entry {index} is malformed: {why}")]
    Entry {
        /// Position in the array.
        index: usize,
        /// What is wrong.
        why: String,
    },
    /// The same agent id twice.
    #[error("catalog lists agent `{0}` twice")]
    Duplicate(String),
}

/// Agent id to execution tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    tiers: HashMap<String, ExecutionTier>,
}

impl Default for Catalog {
    /// The built-in catalog of the contract.
    fn default() -> Self {
        let tiers = [
            ("agentic-security-review-agent", ExecutionTier::StaticReview),
            (
                "agentic-system-architecture-review-agent",
                ExecutionTier::StaticReview,
            ),
            (
                "finance-capital-allocation-advisor-agent",
                ExecutionTier::ReadOnlyRuntime,
            ),
            (
                "legal-regulatory-compliance-agent",
                ExecutionTier::StaticReview,
            ),
            (
                "python-live-policy-gate-agent",
                ExecutionTier::MutatingRuntime,
            ),
        ]
        .into_iter()
        .map(|(id, t)| (id.to_owned(), t))
        .collect();
        Catalog { tiers }
    }
}

impl Catalog {
    /// Parse a catalog file: a JSON array of `{"id": ..., "execution_tier": ...}`.
    /// Bounded like a record set: 1 MiB, depth 3.
    pub fn from_json(bytes: &[u8]) -> Result<Catalog, CatalogError> {
        let v = json::parse(
            bytes,
            Limits {
                max_bytes: MAX_CATALOG_BYTES,
                max_depth: 3,
            },
        )
        .map_err(|e| CatalogError::Json(e.to_string()))?;
        let items = v.as_array().ok_or_else(|| CatalogError::Entry {
            index: 0,
            why: "the catalog is not an array".to_owned(),
        })?;
        let mut tiers = HashMap::new();
        for (index, item) in items.iter().enumerate() {
            let entry = |why: &str| CatalogError::Entry {
                index,
                why: why.to_owned(),
            };
            let o = item.as_object().ok_or_else(|| entry("not an object"))?;
            if o.keys().any(|k| k != "id" && k != "execution_tier") {
                return Err(entry("unknown field"));
            }
            let id = o
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| entry("missing string `id`"))?;
            let tier = o
                .get("execution_tier")
                .and_then(Value::as_str)
                .and_then(ExecutionTier::parse)
                .ok_or_else(|| entry("missing or unknown `execution_tier`"))?;
            if tiers.insert(id.to_owned(), tier).is_some() {
                return Err(CatalogError::Duplicate(id.to_owned()));
            }
        }
        Ok(Catalog { tiers })
    }

    /// The tier of agent `id`, if catalogued.
    pub fn tier(&self, id: &str) -> Option<ExecutionTier> {
        self.tiers.get(id).copied()
    }
}
