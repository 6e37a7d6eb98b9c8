//! Arbitrary bytes into the strict JSON parser: it must never panic, and whatever it
//! accepts must survive canonical writing and re-parsing unchanged (decode, re-encode,
//! compare, as rustls' fuzzers do).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::json::{self, Limits};
use tollgate_core::Params;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_bytes: 1 << 20, max_depth: 128 };
    let Ok(v) = json::parse(data, limits) else { return };
    let _ = Params::json(&v);
    let Ok(canonical) = json::to_canonical_vec(&v) else { return };
    let again = json::parse(&canonical, limits).expect("canonical output must parse");
    let twice = json::to_canonical_vec(&again).expect("re-parsed value must write");
    assert_eq!(canonical, twice, "canonical form is not a fixed point");
});
