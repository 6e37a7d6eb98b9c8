//! Everything tollgate-policy parses: policy text, schema text, and a call's params.
//!
//! The input is split at the first two `\0` bytes into policy text, schema text (empty:
//! no schema) and params JSON. Loading must return a set or findings, never panic; a set
//! must then give an outcome for the params, with and without them, approved or not, and
//! every outcome's labels must fit the session's bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::json::{parse, Limits};
use tollgate_core::labels::LabelSet;
use tollgate_core::Money;
use tollgate_policy::{load, Call, DefaultEffect, Options, SessionView, Source};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let policy = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let schema = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let params = parts.next().unwrap_or_default();
    let options = Options {
        default: if data.len() % 2 == 0 { DefaultEffect::Allow } else { DefaultEffect::Deny },
        schema: (!schema.is_empty()).then(|| Source::new("fuzz.cedarschema", schema)),
    };
    let Ok(loaded) = load(&[Source::new("fuzz.cedar", policy)], &options) else {
        return;
    };
    let p = loaded.policies;
    let Some(actor) = p.actor("acme", "bot", "local") else {
        return;
    };
    let args = parse(params, Limits::default()).ok();
    let labels = LabelSet::new();
    let tools: Vec<String> = p.named_tools().into_iter().map(str::to_owned).chain(["other".to_owned()]).collect();
    for tool in &tools {
        for approved in [false, true] {
            for a in [None, args.as_ref()] {
                let call = Call {
                    tool,
                    args: a,
                    cost: Money(1_234_567),
                    now: 1_700_000_000_000_000_000,
                    session: SessionView { calls: 3, budget_initial: Money(10), budget_remaining: Money(3), labels: &labels },
                    approved,
                };
                let o = p.evaluate(&actor, &call);
                assert!(labels.with(&o.labels).is_ok());
                let _ = o.effect.reason();
            }
        }
        let _ = p.denies_unconditionally(&actor, tool);
        let _ = p.reads_args(tool);
    }
});
