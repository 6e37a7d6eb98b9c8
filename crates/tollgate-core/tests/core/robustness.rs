//! The fuzz targets' properties, run on generated input in the normal suite so CI checks
//! them too (`cargo fuzz` runs the same properties coverage-guided, see fuzz/).

use proptest::prelude::*;
use tollgate_core::json::{self, Limits};
use tollgate_core::vectors::run_file;
use tollgate_core::Params;

const SP10: &[u8] = include_bytes!("../../../../tests/data/sp1/conformance.json");

fn mutated_vector_file() -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::vec((0usize..SP10.len(), any::<u8>()), 1..8)).prop_map(|edits| {
        let mut bytes = SP10.to_vec();
        for (at, b) in edits {
            bytes[at] = b;
        }
        bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_and_canonical_form_is_a_fixed_point(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let limits = Limits { max_bytes: 1 << 20, max_depth: 128 };
        if let Ok(v) = json::parse(&data, limits) {
            let _ = Params::json(&v);
            if let Ok(c) = json::to_canonical_vec(&v) {
                let again = json::parse(&c, limits).unwrap();
                prop_assert_eq!(json::to_canonical_vec(&again).unwrap(), c);
            }
        }
    }

    #[test]
    fn json_text_round_trips(text in r#"\{("[a-z\\u00e9\\\\"]{0,4}":(-?[0-9]{1,25}|[0-9]\.[0-9]{1,17}(e-?[0-9]{1,3})?|"[^"\\]{0,6}"|true|null),){0,4}"k":\[\]\}"#) {
        if let Ok(v) = json::parse_str(&text) {
            if let Ok(c) = json::to_canonical_vec(&v) {
                prop_assert_eq!(json::parse(&c, Limits::default()).unwrap(), v);
            }
        }
    }

    #[test]
    fn mutated_vector_files_never_panic(bytes in mutated_vector_file()) {
        let _ = run_file(&bytes);
    }
}
