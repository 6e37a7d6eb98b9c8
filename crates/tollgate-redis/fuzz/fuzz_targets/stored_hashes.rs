//! Arbitrary bytes into everything the store decodes of what it reads back from Redis: a
//! stored session record (either form: `TGS2` binary or JSON), an unconfirmed change's
//! marker (with and without its `p:<seq>` record), and a session hash with its budget hash
//! (the hash's fields are the input split at 0xff bytes into names and values: its `c`
//! naming the current record field, record fields, markers naming their records before,
//! orphans). None may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_redis::cas::{
    budget_from_fields, current_record, decode_stored, orphan_only_fields, view_from_fields,
    Bounds, Fields, Marker,
};

fuzz_target!(|data: &[u8]| {
    let _ = decode_stored(data, 1 << 20, 0);
    let _ = Marker::decode(data, 1 << 21, None, String::new());
    let _ = Marker::decode(data, 1 << 21, Some(data), "r:1:d:0".to_owned());
    let mut parts = data.split(|b| *b == 0xff);
    let mut fields = Fields::new();
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        fields.insert(String::from_utf8_lossy(name).into_owned(), value.to_vec());
    }
    let _ = budget_from_fields(&fields);
    let _ = current_record(&fields);
    let _ = orphan_only_fields(&fields);
    let bounds = Bounds {
        max_blob_bytes: 1 << 20,
    };
    let _ = view_from_fields(&fields, &fields, bounds, 0);
});
