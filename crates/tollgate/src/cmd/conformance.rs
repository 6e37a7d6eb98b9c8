//! `tollgate conformance [--format text|json] FILE...`: run SP/1.0 decision vectors.
//!
//! Prints one line per vector (`PASS name` or `FAIL name: expected VERDICT reason, got
//! VERDICT reason`), then `N passed, M failed`; exits 0 when all pass and 1 otherwise. A
//! file that cannot be read or holds no vectors counts as one failure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use tollgate_core::json::{self, Number, Value};
use tollgate_core::vectors::{self, Outcome};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per vector, then a summary line.
    Text,
    /// One JSON document.
    Json,
}

/// Arguments of `tollgate conformance`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Vector files: the published shape (`{"fixtures": [...]}`) or a bare array.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Run every vector of every file.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut results: Vec<(String, Outcome)> = Vec::new();
    for path in &args.files {
        let file = path.display().to_string();
        let outcomes = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| vectors::run_file(&bytes).map_err(|e| e.to_string()));
        match outcomes {
            Ok(list) => results.extend(list.into_iter().map(|o| (file.clone(), o))),
            Err(e) => results.push((
                file.clone(),
                Outcome {
                    name: file.clone(),
                    expected: None,
                    got: None,
                    problems: vec![format!("cannot read vectors: {e}")],
                },
            )),
        }
    }
    let passed = results.iter().filter(|(_, o)| o.passed()).count();
    let failed = results.len() - passed;
    match args.format {
        Format::Text => {
            for (_, o) in &results {
                println!("{o}");
            }
            println!("{passed} passed, {failed} failed");
        }
        Format::Json => println!("{}", to_json(&results, passed, failed)),
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn to_json(results: &[(String, Outcome)], passed: usize, failed: usize) -> String {
    let s = |t: &str| Value::String(t.to_owned());
    let count = |n: usize| Value::Number(Number::Int(i128::try_from(n).unwrap_or(i128::MAX)));
    let items = results
        .iter()
        .map(|(file, o)| {
            let mut m = BTreeMap::new();
            m.insert("file".to_owned(), s(file));
            m.insert("name".to_owned(), s(&o.name));
            m.insert(
                "status".to_owned(),
                s(if o.passed() { "pass" } else { "fail" }),
            );
            if let Some((verdict, reason)) = &o.expected {
                let mut e = BTreeMap::new();
                e.insert("verdict".to_owned(), s(verdict));
                e.insert("reason".to_owned(), s(reason));
                m.insert("expected".to_owned(), Value::Object(e));
            }
            if let Some(d) = &o.got {
                let mut g = BTreeMap::new();
                g.insert("verdict".to_owned(), s(d.verdict.as_str()));
                g.insert("reason".to_owned(), s(d.reason.as_str()));
                g.insert("probabilistic".to_owned(), Value::Bool(d.probabilistic));
                if let Some(dr) = d.deny_reason {
                    g.insert("deny_reason".to_owned(), s(dr.as_str()));
                }
                m.insert("got".to_owned(), Value::Object(g));
            }
            m.insert(
                "problems".to_owned(),
                Value::Array(o.problems.iter().map(|p| s(p)).collect()),
            );
            Value::Object(m)
        })
        .collect();
    let mut top = BTreeMap::new();
    top.insert("results".to_owned(), Value::Array(items));
    top.insert("passed".to_owned(), count(passed));
    top.insert("failed".to_owned(), count(failed));
    let bytes = json::to_canonical_vec(&Value::Object(top)).unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}
