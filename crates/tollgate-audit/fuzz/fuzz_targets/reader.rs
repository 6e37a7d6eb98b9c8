//! Arbitrary bytes into every reader of tollgate-audit: the verifier, the record and
//! header parsers, and the checkpoint and key file parsers. None may panic.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_audit::format::{self, FileHeader};
use tollgate_audit::{checkpoint::Checkpoint, keys, verify, SigningKey, VerifyOptions};

/// A validly signed header, so that record parsing and chain checks are reached.
fn header() -> &'static [u8] {
    static H: OnceLock<Vec<u8>> = OnceLock::new();
    H.get_or_init(|| {
        let k = SigningKey::from_bytes(&[1; 32]);
        FileHeader::new_signed(&k, 0, 0, format::genesis_hash(), 0).encode()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        0 => {
            let _ = verify(&[("f", rest)], &VerifyOptions::default());
        }
        1 => {
            // Two files, split where the next byte says.
            let at = usize::from(rest.first().copied().unwrap_or(0)) * 8;
            let (a, b) = rest.split_at(at.min(rest.len()));
            let _ = verify(&[("a", a), ("b", b)], &VerifyOptions::default());
        }
        2 => {
            let _ = format::parse_record(rest);
            let _ = FileHeader::decode(rest);
        }
        3 => {
            // A valid header followed by arbitrary records, with and without signature
            // checks (without, the index, link and hand-over paths are reached).
            let mut file = header().to_vec();
            file.extend_from_slice(rest);
            let _ = verify(&[("f", &file)], &VerifyOptions::default());
            let opts = VerifyOptions {
                check_signatures: false,
                ..VerifyOptions::default()
            };
            let _ = verify(&[("f", &file), ("g", &file)], &opts);
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            let _ = Checkpoint::parse(&text);
            let _ = keys::parse_secret_key(&text);
            let _ = keys::parse_public_key(&text);
        }
    }
});
