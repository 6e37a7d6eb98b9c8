//! `tollgate policy check --tools`: a tools file (MCP tool definitions with their input
//! JSON Schemas) and policy text, checked against each other.
//!
//! The input is split at its first two `\0` bytes into policy text, the tools file and an
//! author schema (Cedar's schema syntax; none when absent or empty, so an author schema's
//! comparison with the tools, `schema-drift`, is fuzzed too). Reading the tools file must
//! give tools or a finding, never panic; checking the policies against the tools must give
//! a report, and rendering it a text and an exit code of 0 or 1.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_policy::derive::{check, parse_tools, render};
use tollgate_policy::{DefaultEffect, Options, Source};

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let policy = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let tools = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let schema = parts
        .next()
        .filter(|s| !s.is_empty())
        .map(|s| Source::new("fuzz.cedarschema", String::from_utf8_lossy(s).into_owned()));
    let Ok(tools) = parse_tools(&Source::new("fuzz-tools.json", tools)) else {
        return;
    };
    let options = Options {
        default: DefaultEffect::Allow,
        schema,
    };
    let files = [Source::new("fuzz.cedar", policy)];
    let report = check(&files, &options, &tools);
    let (_, code) = render(&report, "fuzz-tools.json");
    assert!(code <= 1, "exit code {code}");
});
