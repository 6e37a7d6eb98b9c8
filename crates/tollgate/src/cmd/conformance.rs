//! `tollgate conformance [--format text|json] [--bench [--iterations N]] FILE...`: run SP/1.0
//! decision vectors.
//!
//! Prints one line per vector (`PASS name` or `FAIL name: expected VERDICT reason, got
//! VERDICT reason`), then `N passed, M failed`; exits 0 when all pass and 1 otherwise. A
//! file that cannot be read or holds no vectors counts as one failure.
//!
//! With `--bench`, each vector is read and its params classified once, checked once like
//! above, and then only `decide` is run on it in a loop (`N` timed decisions after `N/10`
//! untimed ones). A passing vector prints `name<TAB>ns per decision`; a failing one prints
//! its `FAIL` line and is not timed. Then a summary line (`V vectors, D decisions, mean X
//! ns/vector, total T ms`, the mean taken over the vectors' ns per decision) and
//! `N passed, M failed`, with the same exit codes.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tollgate_core::decide;
use tollgate_core::json::{self, Number, Value};
use tollgate_core::vectors::{self, Outcome, Prepared};

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
    /// Time `decide` alone over each passing vector (after checking it once).
    #[arg(long)]
    pub bench: bool,
    /// With --bench: timed decisions per vector (1 to 1,000,000,000).
    #[arg(
        long,
        default_value_t = 1_000_000,
        requires = "bench",
        value_parser = clap::value_parser!(u64).range(1..=1_000_000_000)
    )]
    pub iterations: u64,
    /// Vector files: the published shape (`{"fixtures": [...]}`) or a bare array.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Every vector of every file, in order, with the file it came from: ready to run, or the
/// failure that stops it (an unreadable file, an unreadable vector).
fn prepare(files: &[PathBuf]) -> Vec<(String, Result<Prepared, Outcome>)> {
    let mut items = Vec::new();
    for path in files {
        let file = path.display().to_string();
        let prepared = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| vectors::prepare_file(&bytes).map_err(|e| e.to_string()));
        match prepared {
            Ok(list) => items.extend(list.into_iter().map(|p| (file.clone(), p))),
            Err(e) => items.push((
                file.clone(),
                Err(Outcome {
                    name: file.clone(),
                    expected: None,
                    got: None,
                    problems: vec![format!("cannot read vectors: {e}")],
                }),
            )),
        }
    }
    items
}

/// Run every vector of every file.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let items = prepare(&args.files);
    let failed = if args.bench {
        bench(args, &items)
    } else {
        check(args, &items)
    };
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Check each vector once and report; returns how many failed.
fn check(args: &Args, items: &[(String, Result<Prepared, Outcome>)]) -> usize {
    let results: Vec<(&str, Outcome)> = items
        .iter()
        .map(|(file, item)| {
            let outcome = match item {
                Ok(p) => p.check(),
                Err(o) => o.clone(),
            };
            (file.as_str(), outcome)
        })
        .collect();
    let passed = results.iter().filter(|(_, o)| o.passed()).count();
    let failed = results.len() - passed;
    match args.format {
        Format::Text => {
            for (_, o) in &results {
                outln!("{o}");
            }
            outln!("{passed} passed, {failed} failed");
        }
        Format::Json => outln!("{}", to_json(&results, passed, failed)),
    }
    failed
}

/// One vector under `--bench`: timed, or the failure that kept it from being timed.
struct Timed<'a> {
    file: &'a str,
    name: String,
    result: Result<f64, Outcome>,
}

/// Check each vector once, time `decide` on the ones that pass, report; returns how many
/// failed.
fn bench(args: &Args, items: &[(String, Result<Prepared, Outcome>)]) -> usize {
    let mut rows = Vec::with_capacity(items.len());
    let mut total_ns: u128 = 0;
    for (file, item) in items {
        let row = match item {
            Err(o) => Timed {
                file,
                name: o.name.clone(),
                result: Err(o.clone()),
            },
            Ok(p) => {
                let outcome = p.check();
                let result = if outcome.passed() {
                    let ns = time_decide(p, args.iterations);
                    total_ns = total_ns.saturating_add(ns);
                    #[allow(clippy::cast_precision_loss)]
                    Ok(ns as f64 / args.iterations as f64)
                } else {
                    Err(outcome)
                };
                Timed {
                    file,
                    name: p.vector().name.clone(),
                    result,
                }
            }
        };
        rows.push(row);
    }
    let timed: Vec<f64> = rows.iter().filter_map(|r| r.result.clone().ok()).collect();
    let failed = rows.len() - timed.len();
    #[allow(clippy::cast_precision_loss)]
    let mean = if timed.is_empty() {
        0.0
    } else {
        timed.iter().sum::<f64>() / timed.len() as f64
    };
    let vectors = u64::try_from(timed.len()).unwrap_or(u64::MAX);
    let decisions = vectors.saturating_mul(args.iterations);
    match args.format {
        Format::Text => {
            for r in &rows {
                match &r.result {
                    Ok(ns) => outln!("{}\t{ns:.1}", r.name),
                    Err(o) => outln!("{o}"),
                }
            }
            #[allow(clippy::cast_precision_loss)]
            let total_ms = total_ns as f64 / 1e6;
            outln!("{vectors} vectors, {decisions} decisions, mean {mean:.1} ns/vector, total {total_ms:.1} ms");
            outln!("{} passed, {failed} failed", timed.len());
        }
        Format::Json => {
            let s = |t: &str| Value::String(t.to_owned());
            let int = |n: u128| Value::Number(Number::Int(i128::try_from(n).unwrap_or(i128::MAX)));
            let float = |f: f64| Value::Number(Number::Float((f * 10.0).round() / 10.0));
            let results = rows
                .iter()
                .map(|r| {
                    let mut m = BTreeMap::new();
                    m.insert("file".to_owned(), s(r.file));
                    m.insert("name".to_owned(), s(&r.name));
                    match &r.result {
                        Ok(ns) => {
                            m.insert("status".to_owned(), s("pass"));
                            m.insert("ns_per_decision".to_owned(), float(*ns));
                        }
                        Err(o) => {
                            m.insert("status".to_owned(), s("fail"));
                            m.insert(
                                "problems".to_owned(),
                                Value::Array(o.problems.iter().map(|p| s(p)).collect()),
                            );
                        }
                    }
                    Value::Object(m)
                })
                .collect();
            let mut top = BTreeMap::new();
            top.insert("results".to_owned(), Value::Array(results));
            top.insert("iterations".to_owned(), int(u128::from(args.iterations)));
            top.insert("vectors".to_owned(), int(u128::from(vectors)));
            top.insert("decisions".to_owned(), int(u128::from(decisions)));
            top.insert("mean_ns_per_vector".to_owned(), float(mean));
            top.insert("total_ns".to_owned(), int(total_ns));
            top.insert("passed".to_owned(), int(timed.len() as u128));
            top.insert("failed".to_owned(), int(failed as u128));
            let bytes = json::to_canonical_vec(&Value::Object(top)).unwrap_or_default();
            outln!("{}", String::from_utf8(bytes).unwrap_or_default());
        }
    }
    failed
}

/// Nanoseconds taken by `iterations` calls of `decide` on `p`'s inputs, after
/// `iterations / 10` (at least one) untimed calls. Nothing but `decide` is in the loop: the
/// call was built, and its params classified, beforehand.
fn time_decide(p: &Prepared, iterations: u64) -> u128 {
    let v = p.vector();
    let call = p.call();
    let once = || {
        black_box(decide(
            black_box(&v.config),
            black_box(&v.state),
            black_box(&call),
            black_box(v.now_ns),
            black_box(v.rng),
        ))
    };
    for _ in 0..iterations.div_ceil(10) {
        once();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        once();
    }
    start.elapsed().as_nanos()
}

fn to_json(results: &[(&str, Outcome)], passed: usize, failed: usize) -> String {
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
