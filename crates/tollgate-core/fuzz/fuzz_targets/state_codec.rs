//! Arbitrary bytes into the session-state decoder: it must never panic, and whatever it
//! accepts must encode back to the very same bytes (one encoding per state) and decode
//! to the same state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::state_codec::{decode, encode, DecodeLimits};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits { max_bytes: 1 << 20 };
    let Ok(state) = decode(data, limits) else { return };
    let bytes = encode(&state);
    let again = decode(&bytes, limits).expect("encoded state must decode");
    assert_eq!(again, state, "decode(encode(s)) != s");
    assert_eq!(encode(&again), bytes, "encoding is not a fixed point");
});
