//! What each policy reads, found once at load time from its structure (Cedar's JSON form
//! of the policy), never from its text.
//!
//! A policy *reads* `context.args.a.b` when it contains that attribute access (or a `has`
//! test of it). A policy that uses `context.args` or `context` as a whole reads all of the
//! args. The analysis is conservative: it may say a policy reads more than it does, never
//! less, so "this policy does not read the unrepresentable `x`" and "this call needs no
//! params" are safe to act on.

use serde_json::Value as Json;

use crate::args::ArgPath;

/// The deepest policy structure walked; a deeper policy is taken to read all of the args.
const MAX_WALK_DEPTH: usize = 512;

/// The paths below `context` a policy reads (`[]` is the whole of it), sorted, with no
/// path listed whose prefix is also listed.
pub(crate) fn context_read(est: &Json) -> Vec<Vec<String>> {
    let mut reads = Vec::new();
    if !walk(est, 0, &mut reads) {
        return vec![Vec::new()];
    }
    reads.sort();
    reads.dedup();
    // Drop paths covered by a shorter one.
    let mut out: Vec<Vec<String>> = Vec::new();
    for r in reads {
        if !out.iter().any(|o| r.starts_with(o)) {
            out.push(r);
        }
    }
    out
}

/// The paths below `context.args` among `context_reads` (`[]`: all of args).
pub(crate) fn args_read(context_reads: &[Vec<String>]) -> Vec<ArgPath> {
    context_reads
        .iter()
        .filter_map(|p| match p.split_first() {
            None => Some(Vec::new()),
            Some((first, rest)) if first == "args" => Some(rest.to_vec()),
            Some(_) => None,
        })
        .collect()
}

/// Record the reads below `v`; false when the walk went too deep.
fn walk(v: &Json, depth: usize, reads: &mut Vec<Vec<String>>) -> bool {
    if depth > MAX_WALK_DEPTH {
        return false;
    }
    if let Some(path) = context_path(v, 0) {
        reads.push(path);
        return true;
    }
    match v {
        Json::Object(map) => map.values().all(|c| walk(c, depth + 1, reads)),
        Json::Array(items) => items.iter().all(|c| walk(c, depth + 1, reads)),
        _ => true,
    }
}

/// If `v` is `context`, or a chain of attribute accesses and `has` tests on it, the keys.
fn context_path(v: &Json, depth: usize) -> Option<Vec<String>> {
    if depth > MAX_WALK_DEPTH {
        return None;
    }
    let obj = v.as_object()?;
    if obj.len() != 1 {
        return None;
    }
    if obj.get("Var").and_then(Json::as_str) == Some("context") {
        return Some(Vec::new());
    }
    for op in [".", "has"] {
        if let Some(inner) = obj.get(op) {
            let mut path = context_path(inner.get("left")?, depth + 1)?;
            match inner.get("attr")? {
                Json::String(a) => path.push(a.clone()),
                // `has a.b.c` lists the keys.
                Json::Array(keys) => {
                    for k in keys {
                        path.push(k.as_str()?.to_owned());
                    }
                }
                _ => return None,
            }
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(src: &str) -> Vec<Vec<&'static str>> {
        let p: cedar_policy::Policy = src.parse().unwrap();
        let r = args_read(&context_read(&p.to_json().unwrap()));
        r.into_iter()
            .map(|path| {
                path.into_iter()
                    .map(|k| &*Box::leak(k.into_boxed_str()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn finds_every_args_path_and_only_those() {
        assert!(reads("permit(principal, action, resource);").is_empty());
        assert!(reads("permit(principal, action, resource) when { context.cost_usd.greaterThan(decimal(\"1.0\")) && context.session.labels.contains(\"x\") };").is_empty());
        assert_eq!(
            reads("forbid(principal, action, resource) when { context.args.amount > 1 && context.args.p.q == \"x\" };"),
            vec![vec!["amount"], vec!["p", "q"]]
        );
        assert_eq!(
            reads("forbid(principal, action, resource) when { context.args has cmd && context has args.p.q };"),
            vec![vec!["cmd"], vec!["p", "q"]]
        );
        assert_eq!(
            reads("forbid(principal, action, resource) when { context.args[\"a b\"] == 1 };"),
            vec![vec!["a b"]]
        );
        // The whole of args, or of context.
        assert_eq!(
            reads("forbid(principal, action, resource) when { context.args == {} && context.args.x == 1 };"),
            vec![Vec::<&str>::new()]
        );
        assert_eq!(
            reads("forbid(principal, action, resource) when { context == {} };"),
            vec![Vec::<&str>::new()]
        );
        assert_eq!(
            reads("forbid(principal, action, resource) unless { [context.args.x].contains(1) };"),
            vec![vec!["x"]]
        );
        let p: cedar_policy::Policy = "permit(principal, action, resource) when { context.session.labels.contains(\"x\") && context has now && context.session.calls > context.args.n };".parse().unwrap();
        assert_eq!(
            context_read(&p.to_json().unwrap()),
            vec![
                vec!["args".to_owned(), "n".to_owned()],
                vec!["now".to_owned()],
                vec!["session".to_owned(), "calls".to_owned()],
                vec!["session".to_owned(), "labels".to_owned()]
            ]
        );
    }
}
