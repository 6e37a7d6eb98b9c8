//! Arbitrary bytes as a conformance vector file: reading, deciding and comparing must never
//! panic, whatever the file says.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tollgate_core::vectors::run_file(data);
});
