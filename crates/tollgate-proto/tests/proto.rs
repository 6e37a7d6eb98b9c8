//! The frame and envelope decoders on generated input (the fuzz target's property, in CI).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;
use tollgate_proto::auth::{seal, strip_hmac, Unverified};
use tollgate_proto::sp1::{envelope::Payload, Envelope, PreExecRequest};
use tollgate_proto::{FrameDecoder, MessageKey};

fn sealed() -> Vec<u8> {
    let env = Envelope {
        protocol_version: "1.0.0".into(),
        message_id: "m".into(),
        payload: Some(Payload::PreExec(PreExecRequest {
            session_id: "s_1".into(),
            call_number: 3,
            tool_name: "t".into(),
            tool_params_hash: vec![1; 32],
            ..Default::default()
        })),
        ..Default::default()
    };
    seal(&MessageKey::derive(b"organization secret!"), &env).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_streams_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let key = MessageKey::derive(b"organization secret!");
        let mut d = FrameDecoder::new();
        d.push(&data);
        while let Ok(Some(body)) = d.next_frame() {
            let _ = strip_hmac(&body);
            if let Ok(u) = Unverified::decode(&body) {
                let _ = u.verify(&key);
            }
        }
    }

    #[test]
    fn any_mutation_of_a_sealed_envelope_fails_verification(edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)) {
        let key = MessageKey::derive(b"organization secret!");
        let good = sealed();
        let mut bad = good.clone();
        for (i, x) in edits {
            let at = i.index(bad.len());
            bad[at] ^= x;
        }
        prop_assume!(bad != good);
        let accepted = Unverified::decode(&bad).and_then(|u| u.verify(&key)).is_ok();
        prop_assert!(!accepted);
    }
}
