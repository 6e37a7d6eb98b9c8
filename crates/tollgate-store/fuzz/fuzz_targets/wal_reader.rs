//! Arbitrary bytes into the store's write-ahead log reader, as a whole file and after a
//! valid header (so that record framing, checksums and numbering are reached), and into
//! the log entry decoder. None may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_store::fuzzing::{decode_entry, log_header, read_log};

fuzz_target!(|data: &[u8]| {
    let folded = u64::from(data.first().copied().unwrap_or(0) % 4);
    let _ = read_log(data, folded);
    let mut file = log_header(1);
    file.extend_from_slice(data);
    let _ = read_log(&file, folded);
    let _ = decode_entry(data);
});
