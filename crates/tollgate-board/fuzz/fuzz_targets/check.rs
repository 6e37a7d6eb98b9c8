//! Arbitrary bytes into the board gate and the digest: they must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let report = tollgate_board::check(data, &tollgate_board::Catalog::default());
    // Every finding carries a rule id from the published list.
    for f in &report.findings {
        assert!(tollgate_board::RuleId::from_id(f.rule.as_str()).is_some());
    }
    let _ = tollgate_board::digest(data);
});
