//! One way to build a set and a call.

use tollgate_core::json::{parse_str, Value};
use tollgate_core::labels::LabelSet;
use tollgate_core::Money;
use tollgate_policy::{
    load, Actor, Call, DefaultEffect, Options, Outcome, Policies, SessionView, Source,
};

pub const NOW: i64 = 1_700_000_000_000_000_000;

/// A set from one file's text.
pub fn set(text: &str) -> Policies {
    set_with(&[("p.cedar", text)], DefaultEffect::Allow, None)
}

pub fn set_with(files: &[(&str, &str)], default: DefaultEffect, schema: Option<&str>) -> Policies {
    let sources: Vec<Source> = files.iter().map(|(n, t)| Source::new(*n, *t)).collect();
    let options = Options {
        default,
        schema: schema.map(|s| Source::new("schema.cedarschema", s)),
    };
    match load(&sources, &options) {
        Ok(l) => l.policies,
        Err(e) => panic!("{e}"),
    }
}

pub fn actor(p: &Policies) -> Actor {
    p.actor("acme", "bot", "local").unwrap()
}

/// A session with a 10 USD budget, 4 left, and these labels.
pub struct Session {
    pub labels: LabelSet,
    pub calls: u64,
    pub initial: Money,
    pub remaining: Money,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            labels: LabelSet::new(),
            calls: 3,
            initial: Money(10_000_000_000),
            remaining: Money(4_000_000_000),
        }
    }
}

impl Session {
    pub fn view(&self) -> SessionView<'_> {
        SessionView {
            calls: self.calls,
            budget_initial: self.initial,
            budget_remaining: self.remaining,
            labels: &self.labels,
        }
    }
}

pub fn json(text: &str) -> Value {
    parse_str(text).unwrap()
}

/// Evaluate `tool` with `args` (None: no params) in a default session.
pub fn eval(p: &Policies, tool: &str, args: Option<&str>) -> Outcome {
    eval_in(p, &Session::default(), tool, args, false)
}

pub fn eval_in(
    p: &Policies,
    s: &Session,
    tool: &str,
    args: Option<&str>,
    approved: bool,
) -> Outcome {
    let value = args.map(json);
    let call = Call {
        tool,
        args: value.as_ref(),
        cost: Money(1_000_000),
        now: NOW,
        session: s.view(),
        approved,
    };
    p.evaluate(&actor(p), &call)
}

/// The outcome's reason string, or "-" for effects that leave the guards' reason.
pub fn reason(o: &Outcome) -> String {
    o.effect.reason().unwrap_or_else(|| "-".into())
}
