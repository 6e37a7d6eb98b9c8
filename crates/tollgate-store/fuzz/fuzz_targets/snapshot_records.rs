//! Arbitrary bytes into the snapshot's record decoders (a session record, a budget record
//! and a budget key), the only bytes the store itself reads back. None may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_store::fuzzing::{decode_budget, decode_session};

fuzz_target!(|data: &[u8]| {
    let _ = decode_session(data);
    let _ = decode_budget(data);
});
