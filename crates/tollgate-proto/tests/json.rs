//! The proto3 JSON mapping of the SP/1.0 and control-plane messages: what the control
//! plane's WebSocket sends and reads (docs/protocol.md, "The control plane").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tollgate_proto::control::{control_event, control_request, ControlEvent, ControlRequest};
use tollgate_proto::sp1;

#[test]
fn a_decision_request_reads_from_camel_case_or_proto_names() {
    let camel: ControlRequest = serde_json::from_str(
        r#"{"requestId":"r1","hitlDecide":{"sessionId":"s_1","decision":"modify",
            "note":"smaller","successorParamsJson":"{\"n\":1}","successorNonce":"42"}}"#,
    )
    .unwrap();
    let snake: ControlRequest = serde_json::from_str(
        r#"{"request_id":"r1","hitl_decide":{"session_id":"s_1","decision":"modify",
            "note":"smaller","successor_params_json":"{\"n\":1}","successor_nonce":42}}"#,
    )
    .unwrap();
    assert_eq!(camel, snake);
    let Some(control_request::Body::HitlDecide(d)) = camel.body else {
        panic!("not a decision: {camel:?}");
    };
    assert_eq!(d.successor_nonce, 42);
    assert_eq!(d.successor_params_json, r#"{"n":1}"#);
}

#[test]
fn events_write_camel_case_64_bit_integers_as_strings_enums_by_name_and_bytes_as_base64() {
    let e = ControlEvent {
        request_id: String::new(),
        body: Some(control_event::Body::Held(sp1::HitlPending {
            session_id: "s_1".into(),
            organization_id: "acme".into(),
            transition: Some(sp1::PendingTransition {
                original_nonce: 7,
                original_args_digest: vec![0xff; 2],
                call_number: 3,
                ..Default::default()
            }),
            budget_remaining_nanos: 9_500_000_000,
            ..Default::default()
        })),
    };
    let v: serde_json::Value = serde_json::to_value(&e).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"held": {
            "sessionId": "s_1",
            "organizationId": "acme",
            "transition": {"originalNonce": "7", "originalArgsDigest": "//8=", "callNumber": "3"},
            "budgetRemainingNanos": "9500000000"
        }})
    );
    let err = ControlEvent {
        request_id: "r9".into(),
        body: Some(control_event::Body::Error(sp1::Error {
            code: sp1::ErrorCode::HitlRefused as i32,
            message: "no".into(),
            retry_after_ms: 0,
        })),
    };
    assert_eq!(
        serde_json::to_value(&err).unwrap(),
        serde_json::json!({"requestId": "r9", "error": {"code": "HITL_REFUSED", "message": "no"}})
    );
    // And back.
    let back: ControlEvent = serde_json::from_value(serde_json::to_value(&e).unwrap()).unwrap();
    assert_eq!(back, e);
}

#[test]
fn unknown_message_types_and_fields_are_errors() {
    for text in [
        r#"{"requestId":"r1","frobnicate":{}}"#,
        r#"{"hitlList":{"organizationId":"acme","extra":1}}"#,
        r#"{"hitlList":{},"subscribe":{}}"#,
        r#"[1,2]"#,
    ] {
        assert!(
            serde_json::from_str::<ControlRequest>(text).is_err(),
            "{text} was read"
        );
    }
}

/// Every JSON example of the control plane's section of docs/protocol.md is a message the
/// daemon reads or writes, exactly: it decodes as a request or an event, and encodes back
/// to the same JSON (so no field is misspelled, mistyped or out of place).
#[test]
fn the_documented_examples_are_exact() {
    let doc = include_str!("../../../docs/protocol.md");
    let section = doc
        .split_once("## 9. The control plane")
        .expect("docs/protocol.md has the control plane section")
        .1;
    let mut seen = 0;
    for block in section.split("```json\n").skip(1) {
        let text = block.split_once("\n```").unwrap().0;
        let want: serde_json::Value = serde_json::from_str(text).unwrap();
        let got = match serde_json::from_str::<ControlRequest>(text) {
            Ok(r) => serde_json::to_value(&r).unwrap(),
            Err(_) => {
                let e: ControlEvent = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("neither a request nor an event ({e}): {text}"));
                serde_json::to_value(&e).unwrap()
            }
        };
        assert_eq!(got, want, "{text}");
        seen += 1;
    }
    assert!(seen >= 14, "only {seen} examples found");
}
