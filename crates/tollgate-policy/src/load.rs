//! Loading a policy set: parse every file, check Tollgate's annotations, give every
//! policy its id, validate against the schema if there is one, index by tool, digest.
//!
//! Every problem is a [`Finding`] with a stable code, the file, line and column of the
//! offending text where there is one, and a help line where one helps. Loading reports
//! *every* finding it can (all files are parsed even after one fails), and succeeds only
//! when none is an error.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use cedar_policy::{ActionConstraint, Authorizer, Effect as CedarEffect, PolicySet};
use miette::Diagnostic;
use tollgate_core::labels::Label;
use tollgate_core::Digest;

use crate::args::{ArgPath, Shape};
use crate::{analysis, schema};

/// The largest policy or schema file, in bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// The most policy files in one set.
pub const MAX_FILES: usize = 256;
/// The most policies in one set.
pub const MAX_POLICIES: usize = 10_000;
/// The deepest nesting of `(`, `[` and `{` in a policy file (checked before Cedar parses).
pub const MAX_NESTING: usize = 64;
/// The longest annotation value, in bytes.
pub const MAX_ANNOTATION_BYTES: usize = 1024;
/// The longest policy id, in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// The most `@shadow` policies in one set: each is evaluated on every call it can apply
/// to, as an extra evaluation of the set (docs/policy.md, "Shadow").
pub const MAX_SHADOW_POLICIES: usize = 15;

/// A file's name (as errors show it) and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The name errors use, usually the path as given.
    pub name: String,
    /// The text.
    pub text: String,
}

impl Source {
    /// A source from a name and text.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Source {
        Source {
            name: name.into(),
            text: text.into(),
        }
    }
}

/// What happens to a call that no `permit` matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DefaultEffect {
    /// Nothing: the SP/1.0 guards decide as they would without policies.
    #[default]
    Allow,
    /// A DENY ([`crate::Effect::DefaultDeny`]).
    Deny,
}

impl DefaultEffect {
    /// `allow` or `deny`.
    pub const fn as_str(self) -> &'static str {
        match self {
            DefaultEffect::Allow => "allow",
            DefaultEffect::Deny => "deny",
        }
    }

    /// Parse `allow` or `deny`.
    pub fn parse(text: &str) -> Option<DefaultEffect> {
        match text {
            "allow" => Some(DefaultEffect::Allow),
            "deny" => Some(DefaultEffect::Deny),
            _ => None,
        }
    }
}

/// How to load a set.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// What happens to a call no `permit` matches.
    pub default: DefaultEffect,
    /// The schema, if any ([`crate::schema`]).
    pub schema: Option<Source>,
}

/// A policy's id: its `@id("...")` annotation, or `policyN` (its position in the set,
/// counting from 0 in file order) when it has none.
///
/// INVARIANT (id-alphabet): 1 to [`MAX_ID_BYTES`] bytes of ASCII letters, digits and
/// `.`, `_`, `-`, `:`, `/`; checked by [`PolicyId::parse`], the only constructor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyId(Arc<str>);

impl PolicyId {
    /// Check `text` against the id alphabet.
    pub fn parse(text: &str) -> Option<PolicyId> {
        let ok = !text.is_empty()
            && text.len() <= MAX_ID_BYTES
            && text.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/')
            });
        ok.then(|| PolicyId(text.into()))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// The set is refused.
    Error,
    /// Worth a look; the set loads.
    Warning,
}

/// Where in a file: line and column count from 1, the column in characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Location {
    /// The file's name as given in its [`Source`].
    pub file: String,
    /// The line.
    pub line: usize,
    /// The column.
    pub column: usize,
}

/// One problem found while loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// A stable name: `tollgate::...` for Tollgate's checks, Cedar's own code (such as
    /// `cedar_policy_core::validator::...`) for Cedar's.
    pub code: String,
    /// What is wrong.
    pub message: String,
    /// The file (and, where known, the line and column).
    pub file: Option<String>,
    /// The line and column, where known.
    pub location: Option<Location>,
    /// How to fix it, where a hint helps.
    pub help: Option<String>,
}

impl fmt::Display for Finding {
    /// `file:line:col: error[code]: message` and, on the next line, `  help: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.location, &self.file) {
            (Some(l), _) => write!(f, "{}:{}:{}: ", l.file, l.line, l.column)?,
            (None, Some(file)) => write!(f, "{file}: ")?,
            (None, None) => {}
        }
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}[{}]: {}", self.code, self.message)?;
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

/// The set was refused: at least one finding is an error. All findings are listed,
/// warnings included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe(findings))]
pub struct LoadError {
    /// Every finding, in file order.
    pub findings: Vec<Finding>,
}

fn describe(findings: &[Finding]) -> String {
    let errors: Vec<String> = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(ToString::to_string)
        .collect();
    format!(
        "policy set refused ({} errors): {}",
        errors.len(),
        errors.join("; ")
    )
}

/// A loaded set, with the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The set.
    pub policies: crate::Policies,
    /// Warnings (never errors).
    pub warnings: Vec<Finding>,
}

/// What Tollgate knows about one policy.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub id: PolicyId,
    pub forbid: bool,
    /// `@hitl`: the operator's message (possibly empty).
    pub hitl: Option<String>,
    /// `@label`: labels attached when a call this permits is allowed.
    pub labels: Vec<Label>,
    /// Paths below `context.args` it reads.
    pub reads: Vec<ArgPath>,
    /// The other context fields it reads.
    pub needs: crate::model::Needs,
    /// No `when` or `unless`.
    pub unconditional: bool,
    /// `@shadow`: evaluated and recorded, never enforced.
    pub shadow: bool,
}

/// The policies that can apply to one tool, as a Cedar set of their own.
#[derive(Debug, Clone, Default)]
pub(crate) struct Slice {
    /// Each member's condition, forbids first, then permits, each in set order.
    pub conditions: Vec<Condition>,
    /// Indexes into `Inner::meta`, ascending.
    pub members: Vec<usize>,
    /// The members that are unconditional forbids.
    pub unconditional_forbids: PolicySet,
    /// Whether any member is a permit.
    pub has_permit: bool,
    /// The context fields its members read.
    pub needs: crate::model::Needs,
}

/// One policy's condition: Cedar's conjunction of its scope constraints and its `when`
/// and `unless` clauses, built once when the set is loaded. (Cedar's authorizer builds it
/// again, a copy of the whole expression, for every policy of every request.)
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    /// Index into `Inner::meta`.
    pub index: usize,
    /// A `forbid`.
    pub forbid: bool,
    /// The expression.
    pub expr: cedar_policy_core::ast::Expr,
    /// Its slots (none: Tollgate loads static policies only).
    pub env: cedar_policy_core::ast::SlotEnv,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub default: DefaultEffect,
    pub digest: Digest,
    pub schema: Option<cedar_policy::Schema>,
    pub shapes: BTreeMap<String, Shape>,
    pub meta: Vec<Meta>,
    pub index_of: HashMap<String, usize>,
    /// By tool name: the slice for a tool that some policy names.
    pub slices: HashMap<String, Slice>,
    /// The slice for every other tool: the policies whose action scope is any action.
    pub other: Slice,
    pub authorizer: Authorizer,
    pub names: crate::model::Names,
    /// Every policy of the files, the shadow ones included.
    pub total: usize,
    /// How many of them run in shadow (all of them for a set in shadow mode).
    pub shadow_count: usize,
    /// The whole set runs in shadow ([`crate::shadow::whole_set`]).
    pub shadow_set: bool,
    /// The shadow candidates, in set order ([`crate::shadow`]).
    pub shadows: Vec<crate::shadow::Shadow>,
}

struct Parsed {
    file: usize,
    start: usize,
    policy: cedar_policy::Policy,
}

/// Findings being gathered over a set's files (the loader's, and `derive`'s checks).
pub(crate) struct Ctx<'a> {
    pub(crate) files: &'a [Source],
    pub(crate) findings: Vec<Finding>,
}

impl Ctx<'_> {
    /// The file and location of byte `offset` of file `file`.
    pub(crate) fn at(
        &self,
        file: usize,
        offset: Option<usize>,
    ) -> (Option<String>, Option<Location>) {
        let Some(src) = self.files.get(file) else {
            return (None, None);
        };
        let loc = offset.map(|o| {
            let (line, column) = line_col(&src.text, o);
            Location {
                file: src.name.clone(),
                line,
                column,
            }
        });
        (Some(src.name.clone()), loc)
    }

    /// Record a finding.
    pub(crate) fn push(
        &mut self,
        severity: Severity,
        code: &str,
        message: String,
        place: (Option<String>, Option<Location>),
        help: Option<String>,
    ) {
        self.findings.push(Finding {
            severity,
            code: code.to_owned(),
            message,
            file: place.0,
            location: place.1,
            help,
        });
    }

    fn error(
        &mut self,
        code: &str,
        message: String,
        place: (Option<String>, Option<Location>),
        help: Option<&str>,
    ) {
        self.push(
            Severity::Error,
            code,
            message,
            place,
            help.map(str::to_owned),
        );
    }

    /// A Cedar diagnostic, located in `file` at its first labelled span.
    fn diagnostic(&mut self, severity: Severity, file: usize, d: &dyn Diagnostic, fallback: &str) {
        let offset = d.labels().and_then(|mut l| l.next()).map(|l| l.offset());
        let code = d
            .code()
            .map_or_else(|| fallback.to_owned(), |c| c.to_string());
        let help = d.help().map(|h| h.to_string());
        let place = self.at(file, offset);
        self.push(severity, &code, d.to_string(), place, help);
    }
}

/// 1-based line and character column of byte `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut off = offset.min(text.len());
    while !text.is_char_boundary(off) {
        off -= 1;
    }
    let before = text.get(..off).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// The byte offset where nesting of `(`, `[`, `{` first passes [`MAX_NESTING`], outside
/// strings and comments.
pub(crate) fn too_deep(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = bytes.get(i) {
                    if c == b'\\' {
                        i += 1;
                    } else if c == b'"' {
                        break;
                    }
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while bytes.get(i).is_some_and(|&c| c != b'\n') {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(i);
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The annotations Tollgate reads, and those it lets through as documentation.
const KNOWN_ANNOTATIONS: &[&str] = &[
    "id",
    "hitl",
    "label",
    "shadow",
    "description",
    "owner",
    "doc",
];

/// Load `files` into one set.
pub fn load(files: &[Source], options: &Options) -> Result<Loaded, LoadError> {
    let mut cx = Ctx {
        files,
        findings: Vec::new(),
    };
    if files.len() > MAX_FILES {
        cx.error(
            "tollgate::too-many-files",
            format!("{} policy files; at most {MAX_FILES}", files.len()),
            (None, None),
            None,
        );
    }

    // The schema first: validation needs it.
    let (schema, shapes) = match &options.schema {
        None => (None, BTreeMap::new()),
        Some(s) => match load_schema(s) {
            Ok((schema, shapes)) => (Some(schema), shapes),
            Err(f) => {
                cx.findings.extend(f);
                (None, BTreeMap::new())
            }
        },
    };

    // Parse every file.
    let mut parsed: Vec<Parsed> = Vec::new();
    for (i, src) in files.iter().enumerate().take(MAX_FILES) {
        if src.text.len() > MAX_FILE_BYTES {
            let place = cx.at(i, None);
            cx.error(
                "tollgate::file-too-large",
                format!(
                    "{} bytes; a policy file holds at most {MAX_FILE_BYTES}",
                    src.text.len()
                ),
                place,
                Some("split the policies into several files"),
            );
            continue;
        }
        if let Some(off) = too_deep(&src.text) {
            let place = cx.at(i, Some(off));
            cx.error(
                "tollgate::nesting",
                format!("brackets nest deeper than {MAX_NESTING}"),
                place,
                None,
            );
            continue;
        }
        match src.text.parse::<PolicySet>() {
            Err(errs) => {
                for e in errs.iter() {
                    cx.diagnostic(Severity::Error, i, e, "cedar::parse");
                }
            }
            Ok(set) => {
                for t in set.templates() {
                    let off = t.as_ref().loc().map(|l| l.start());
                    let place = cx.at(i, off);
                    cx.error(
                        "tollgate::template",
                        "templates (policies with ?principal or ?resource slots) are not supported"
                            .into(),
                        place,
                        Some("write the entity in place of the slot"),
                    );
                }
                let mut in_file: Vec<Parsed> = set
                    .policies()
                    .map(|p| Parsed {
                        file: i,
                        start: p.as_ref().loc().map_or(0, |l| l.start()),
                        policy: p.clone(),
                    })
                    .collect();
                in_file.sort_by_key(|p| p.start);
                parsed.extend(in_file);
            }
        }
    }
    if parsed.len() > MAX_POLICIES {
        cx.error(
            "tollgate::too-many-policies",
            format!(
                "{} policies; a set holds at most {MAX_POLICIES}",
                parsed.len()
            ),
            (None, None),
            None,
        );
        parsed.truncate(MAX_POLICIES);
    }

    // Ids and annotations.
    let mut meta = Vec::with_capacity(parsed.len());
    let mut policies = Vec::with_capacity(parsed.len());
    let mut first_at: HashMap<PolicyId, (Option<String>, Option<Location>)> = HashMap::new();
    let mut file_of: HashMap<String, usize> = HashMap::new();
    for (n, p) in parsed.iter().enumerate() {
        let place = cx.at(p.file, Some(p.start));
        let Some(m) = annotations(&mut cx, p, n, place.clone()) else {
            continue;
        };
        if let Some(prev) = first_at.get(&m.id) {
            let earlier = prev.1.as_ref().map_or_else(String::new, |l| {
                format!(" (first at {}:{}:{})", l.file, l.line, l.column)
            });
            cx.error(
                "tollgate::duplicate-id",
                format!("policy id `{}` is used twice{earlier}", m.id),
                place,
                Some("give every policy its own @id"),
            );
            continue;
        }
        first_at.insert(m.id.clone(), place);
        file_of.insert(m.id.as_str().to_owned(), p.file);
        policies.push(p.policy.new_id(cedar_policy::PolicyId::new(m.id.as_str())));
        meta.push(m);
    }

    // One Cedar set (for validation and the digest).
    let mut full = PolicySet::new();
    for p in &policies {
        if let Err(e) = full.add(p.clone()) {
            cx.error("tollgate::policy-set", e.to_string(), (None, None), None);
        }
    }
    if let Some(schema) = &schema {
        let result = cedar_policy::Validator::new(schema.clone())
            .validate(&full, cedar_policy::ValidationMode::Strict);
        for e in result.validation_errors() {
            let file = file_of
                .get(e.policy_id().to_string().as_str())
                .copied()
                .unwrap_or(usize::MAX);
            cx.diagnostic(Severity::Error, file, e, "cedar::validation");
        }
        for w in result.validation_warnings() {
            let file = file_of
                .get(w.policy_id().to_string().as_str())
                .copied()
                .unwrap_or(usize::MAX);
            cx.diagnostic(Severity::Warning, file, w, "cedar::validation");
        }
    }

    let shadow: Vec<usize> = (0..meta.len())
        .filter(|&i| meta.get(i).is_some_and(|m| m.shadow))
        .collect();
    if shadow.len() > MAX_SHADOW_POLICIES {
        cx.error(
            "tollgate::too-many-shadow",
            format!(
                "{} @shadow policies; a set holds at most {MAX_SHADOW_POLICIES}",
                shadow.len()
            ),
            (None, None),
            Some("each @shadow policy is one more evaluation of every call; run a whole set in shadow with `mode = \"shadow\"`"),
        );
    }

    if cx.findings.iter().any(|f| f.severity == Severity::Error) {
        return Err(LoadError {
            findings: cx.findings,
        });
    }

    let digest = digest(options, &policies, &meta);
    let Some(names) = crate::model::Names::new() else {
        cx.error(
            "tollgate::internal",
            "Cedar's names do not parse".into(),
            (None, None),
            None,
        );
        return Err(LoadError {
            findings: cx.findings,
        });
    };
    let base = Base {
        default: options.default,
        digest,
        schema,
        shapes,
        names,
        total: meta.len(),
    };
    // The enforced set holds the policies not in shadow; each `@shadow` policy's
    // candidate is the enforced set with that policy enforced too, in set order.
    let enforced: Vec<usize> = (0..meta.len()).filter(|i| !shadow.contains(i)).collect();
    let mut shadows = Vec::with_capacity(shadow.len());
    for &s in &shadow {
        let mut idx = enforced.clone();
        let at = idx.partition_point(|&i| i < s);
        idx.insert(at, s);
        let Some(m) = meta.get(s) else { continue };
        let candidate = base.build(&policies, &meta, &idx, Vec::new());
        shadows.push(crate::shadow::Shadow::policy(
            m.id.clone(),
            crate::Policies {
                inner: Arc::new(candidate),
            },
            at,
        ));
    }
    let mut inner = base.build(&policies, &meta, &enforced, shadows);
    inner.shadow_count = shadow.len();
    Ok(Loaded {
        policies: crate::Policies {
            inner: Arc::new(inner),
        },
        warnings: cx.findings,
    })
}

/// What every set built from one load shares.
pub(crate) struct Base {
    pub default: DefaultEffect,
    pub digest: Digest,
    pub schema: Option<cedar_policy::Schema>,
    pub shapes: BTreeMap<String, Shape>,
    pub names: crate::model::Names,
    pub total: usize,
}

impl Base {
    /// The set of the policies at `idx` (ascending indexes into `policies` and `meta`).
    pub(crate) fn build(
        &self,
        policies: &[cedar_policy::Policy],
        meta: &[Meta],
        idx: &[usize],
        shadows: Vec<crate::shadow::Shadow>,
    ) -> Inner {
        let ps: Vec<cedar_policy::Policy> = idx
            .iter()
            .filter_map(|&i| policies.get(i).cloned())
            .collect();
        let ms: Vec<Meta> = idx.iter().filter_map(|&i| meta.get(i).cloned()).collect();
        let index_of = ms
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id.as_str().to_owned(), i))
            .collect();
        let (slices, other) = index(&ps, &ms, self.schema.as_ref());
        Inner {
            default: self.default,
            digest: self.digest,
            schema: self.schema.clone(),
            shapes: self.shapes.clone(),
            meta: ms,
            index_of,
            slices,
            other,
            authorizer: Authorizer::new(),
            names: self.names.clone(),
            total: self.total,
            shadow_count: 0,
            shadow_set: false,
            shadows,
        }
    }
}

impl Inner {
    /// A set that enforces nothing (default allow, no policy), sharing this one's schema:
    /// what a set in shadow mode enforces.
    pub(crate) fn enforcing_nothing(&self, digest: Digest) -> Inner {
        let base = Base {
            default: DefaultEffect::Allow,
            digest,
            schema: self.schema.clone(),
            shapes: self.shapes.clone(),
            names: self.names.clone(),
            total: self.total,
        };
        base.build(&[], &[], &[], Vec::new())
    }
}

/// Check one policy's annotations and give it its id.
fn annotations(
    cx: &mut Ctx<'_>,
    p: &Parsed,
    n: usize,
    place: (Option<String>, Option<Location>),
) -> Option<Meta> {
    let policy = &p.policy;
    let forbid = policy.effect() == CedarEffect::Forbid;
    let mut ok = true;
    for (key, value) in policy.annotations() {
        if !KNOWN_ANNOTATIONS.contains(&key) {
            let help = "Tollgate reads @id, @hitl, @label and @shadow, and allows @description, @owner and @doc; a misspelt @hitl or @label would silently change what the policy does";
            cx.error(
                "tollgate::unknown-annotation",
                format!("unknown annotation `@{key}`"),
                place.clone(),
                Some(help),
            );
            ok = false;
        }
        if value.len() > MAX_ANNOTATION_BYTES {
            cx.error(
                "tollgate::annotation-too-long",
                format!("annotation `@{key}` is longer than {MAX_ANNOTATION_BYTES} bytes"),
                place.clone(),
                None,
            );
            ok = false;
        }
    }
    let id = match policy.annotation("id") {
        Some(text) => match PolicyId::parse(text) {
            Some(id) => Some(id),
            None => {
                cx.error(
                    "tollgate::bad-id",
                    format!("`@id(\"{}\")` is not a policy id", text.escape_default()),
                    place.clone(),
                    Some("an id is 1 to 128 ASCII letters, digits and . _ - : /"),
                );
                None
            }
        },
        None => {
            cx.push(
                Severity::Warning,
                "tollgate::no-id",
                format!("policy has no @id; it is `policy{n}`, which changes when policies are added before it"),
                place.clone(),
                Some("add @id(\"...\") so verdicts and the audit log name it stably".into()),
            );
            PolicyId::parse(&format!("policy{n}"))
        }
    };
    let hitl = policy.annotation("hitl").map(str::to_owned);
    let mut labels = Vec::new();
    if let Some(text) = policy.annotation("label") {
        for part in text.split(',').map(str::trim) {
            match Label::parse(part) {
                Ok(l) => labels.push(l),
                Err(e) => {
                    cx.error("tollgate::bad-label", e.to_string(), place.clone(), None);
                    ok = false;
                }
            }
        }
    }
    if forbid && (hitl.is_some() || !labels.is_empty()) {
        cx.error(
            "tollgate::forbid-annotation",
            "@hitl and @label apply to `permit` policies; a `forbid` always denies".into(),
            place.clone(),
            Some("to hold matching calls for a human, write `@hitl permit(...)`"),
        );
        ok = false;
    }
    let context_reads = match policy.to_json() {
        Ok(est) => analysis::context_read(&est),
        // Conservative: a policy whose structure cannot be read reads everything.
        Err(_) => vec![Vec::new()],
    };
    let reads = analysis::args_read(&context_reads);
    let mut needs = crate::model::Needs::default();
    for path in &context_reads {
        needs.add(path);
    }
    let id = id?;
    ok.then(|| Meta {
        id,
        forbid,
        hitl,
        labels,
        reads,
        needs,
        unconditional: !policy.has_non_scope_constraint(),
        shadow: policy.annotation("shadow").is_some(),
    })
}

fn load_schema(
    s: &Source,
) -> Result<(cedar_policy::Schema, BTreeMap<String, Shape>), Vec<Finding>> {
    let files = std::slice::from_ref(s);
    let mut cx = Ctx {
        files,
        findings: Vec::new(),
    };
    if s.text.len() > MAX_FILE_BYTES {
        let place = cx.at(0, None);
        cx.error(
            "tollgate::file-too-large",
            format!(
                "{} bytes; a schema holds at most {MAX_FILE_BYTES}",
                s.text.len()
            ),
            place,
            None,
        );
        return Err(cx.findings);
    }
    let fragment = if s.name.ends_with(".json") {
        cedar_policy::SchemaFragment::from_json_str(&s.text).map_err(|e| {
            cx.diagnostic(Severity::Error, 0, &e, "cedar::schema");
        })
    } else {
        cedar_policy::SchemaFragment::from_cedarschema_str(&s.text)
            .map(|(f, _warnings)| f)
            .map_err(|e| {
                cx.diagnostic(Severity::Error, 0, &e, "cedar::schema");
            })
    };
    let Ok(fragment) = fragment else {
        return Err(cx.findings);
    };
    let json = match fragment.to_json_value() {
        Ok(j) => j,
        Err(e) => {
            cx.diagnostic(Severity::Error, 0, &e, "cedar::schema");
            return Err(cx.findings);
        }
    };
    let augmented = match schema::augment(json) {
        Ok(a) => a,
        Err(p) => {
            let place = cx.at(0, None);
            cx.error(p.code, p.message, place, None);
            return Err(cx.findings);
        }
    };
    let shapes = schema::arg_shapes(&augmented);
    match cedar_policy::Schema::from_json_value(augmented) {
        Ok(schema) => Ok((schema, shapes)),
        Err(e) => {
            cx.diagnostic(Severity::Error, 0, &e, "cedar::schema");
            Err(cx.findings)
        }
    }
}

/// The set's digest: SHA-256 over a versioned, length-prefixed serialization of the
/// default, the schema's text and every policy's id and source text, in id order. File
/// names, file order and the text between policies (comments, blank lines) do not count;
/// a policy's own text, comments inside it included, does.
fn digest(options: &Options, policies: &[cedar_policy::Policy], meta: &[Meta]) -> Digest {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut field = |tag: &str, bytes: &[u8]| {
        h.update(tag.as_bytes());
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field("tollgate-policy-set", b"1");
    field("default", options.default.as_str().as_bytes());
    match &options.schema {
        Some(s) => field("schema", s.text.as_bytes()),
        None => field("no-schema", b""),
    }
    let mut entries: Vec<(&str, String)> = meta
        .iter()
        .zip(policies)
        .map(|(m, p)| (m.id.as_str(), p.to_string()))
        .collect();
    entries.sort();
    for (id, text) in entries {
        field("id", id.as_bytes());
        field("policy", text.as_bytes());
    }
    Digest(h.finalize().into())
}

/// The per-tool slices: each named action's policies plus the any-action ones.
fn index(
    policies: &[cedar_policy::Policy],
    meta: &[Meta],
    schema: Option<&cedar_policy::Schema>,
) -> (HashMap<String, Slice>, Slice) {
    // For `action in Action::"group"`: the group's members, from the schema.
    let mut members_of: HashMap<String, Vec<String>> = HashMap::new();
    if let Some(s) = schema {
        if let Ok(entities) = s.action_entities() {
            for e in entities.iter() {
                let uid = e.uid();
                for anc in entities.ancestors(&uid).into_iter().flatten() {
                    members_of
                        .entry(anc.id().unescaped().to_owned())
                        .or_default()
                        .push(uid.id().unescaped().to_owned());
                }
            }
        }
    }
    let mut any: Vec<usize> = Vec::new();
    let mut named: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, p) in policies.iter().enumerate() {
        let action_ids: Vec<String> = match p.action_constraint() {
            ActionConstraint::Any => {
                any.push(i);
                continue;
            }
            ActionConstraint::Eq(uid) => vec![uid.id().unescaped().to_owned()],
            ActionConstraint::In(uids) => {
                uids.iter().map(|u| u.id().unescaped().to_owned()).collect()
            }
        };
        for a in action_ids {
            for m in members_of.get(&a).into_iter().flatten() {
                named.entry(m.clone()).or_default().push(i);
            }
            named.entry(a).or_default().push(i);
        }
    }
    let build = |idx: &mut Vec<usize>| -> Slice {
        idx.sort_unstable();
        idx.dedup();
        let mut slice = Slice::default();
        for &i in idx.iter() {
            let (Some(p), Some(m)) = (policies.get(i), meta.get(i)) else {
                continue;
            };
            let ast: &cedar_policy_core::ast::Policy = p.as_ref();
            slice.conditions.push(Condition {
                index: i,
                forbid: m.forbid,
                expr: ast.condition(),
                env: ast.env().clone(),
            });
            if m.forbid && m.unconditional {
                let _ = slice.unconditional_forbids.add(p.clone());
            }
            slice.has_permit |= !m.forbid;
            slice.needs = slice.needs.union(m.needs);
        }
        slice.conditions.sort_by_key(|c| (!c.forbid, c.index));
        slice.members = idx.clone();
        slice
    };
    let mut slices = HashMap::new();
    for (tool, mut idx) in named {
        idx.extend(any.iter().copied());
        slices.insert(tool, build(&mut idx));
    }
    let other = build(&mut any);
    (slices, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters_from_one() {
        let t = "ab\ncdé\nfg";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 3), (2, 1));
        assert_eq!(line_col(t, 7), (2, 4)); // after the two-byte é
        assert_eq!(line_col(t, 6), (2, 3)); // inside é: its start
        assert_eq!(line_col(t, 999), (3, 3));
    }

    #[test]
    fn nesting_is_bounded_outside_strings_and_comments() {
        let deep = format!(
            "permit(principal, action, resource) when {{ {}true{} }};",
            "(".repeat(70),
            ")".repeat(70)
        );
        assert!(too_deep(&deep).is_some());
        let quoted = format!(
            "permit(principal, action, resource) when {{ \"{}\" == \"\\\"\" }}; // {}",
            "(".repeat(70),
            "[".repeat(70)
        );
        assert_eq!(too_deep(&quoted), None);
    }
}
