//! Architecture invariants that a test can keep (ARCHITECTURE.md, "Invariants"): which
//! crates may depend on what. Reads the workspace's own manifests, nothing outside it.

use std::path::Path;

/// The names under `[dependencies]` of a crate's manifest.
fn dependencies(krate: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['.', '=', ' ']).next().unwrap().to_owned();
            out.push(name);
        }
    }
    out
}

fn assert_only(krate: &str, allowed: &[&str]) {
    let deps = dependencies(krate);
    assert!(
        !deps.is_empty(),
        "{krate}: no dependencies read: the parser is wrong"
    );
    for d in &deps {
        assert!(
            allowed.contains(&d.as_str()),
            "{krate} depends on `{d}`, which its layer must not"
        );
    }
}

#[test]
fn the_pure_and_storage_layers_have_no_runtime_network_or_protobuf() {
    // The core: no I/O, no clock, no randomness, no async.
    assert_only(
        "tollgate-core",
        &["sha2", "aho-corasick", "ryu", "thiserror"],
    );
    // The board gate: pure too.
    assert_only("tollgate-board", &["tollgate-core", "thiserror", "regex"]);
    // The policies: Cedar over the core; no async, no sockets, no protobuf (its one file
    // reader, `files`, reads what a `[policy]` section names).
    assert_only(
        "tollgate-policy",
        &[
            "tollgate-core",
            "cedar-policy",
            "cedar-policy-core",
            "miette",
            "serde",
            "serde_json",
            "sha2",
            // Cedar's string type, for building a request's context as Cedar values.
            "smol_str",
            "thiserror",
        ],
    );
    // Storage and audit: files, but no async runtime, no sockets, no protobuf. The store
    // reads and writes through the audit log (its write-ahead log), never the reverse;
    // rustix (its `process` feature only) tells it whose files it opens. It decides a call
    // through tollgate-policy (`rules::decide`), which is pure (below).
    assert_only(
        "tollgate-store",
        &[
            "tollgate-core",
            "tollgate-audit",
            "tollgate-policy",
            "redb",
            "rustix",
            "tracing",
            "thiserror",
        ],
    );
    assert_only(
        "tollgate-audit",
        &[
            "tollgate-core",
            "sha2",
            "thiserror",
            "ed25519-dalek",
            "getrandom",
            "uuid",
            "zstd",
        ],
    );
    // Only the proto crate knows protobuf. Its gRPC stubs are transport-free (tonic's
    // codegen types only: no sockets, no HTTP, no TLS; the daemon and the client bring
    // those), and its JSON mapping is serde's.
    assert_only(
        "tollgate-proto",
        &[
            "prost",
            "prost-types",
            "hmac",
            "sha2",
            "thiserror",
            "tonic",
            "tonic-prost",
            "serde",
            "pbjson",
        ],
    );
}

#[test]
fn the_postgres_sink_knows_the_journal_and_the_database_only() {
    // The PostgreSQL audit sink: the store's journal traits, the audit format (it signs
    // through the audit crate's Chainer, never a copy), the database driver and rustls
    // with ring. No protobuf, no daemon, no HTTP.
    assert_only(
        "tollgate-pg",
        &[
            "tollgate-core",
            "tollgate-audit",
            "tollgate-store",
            "tokio",
            "tokio-postgres",
            "tokio-postgres-rustls",
            "rustls",
            "sha2",
            "ed25519-dalek",
            "thiserror",
            "tracing",
        ],
    );
}

#[test]
fn the_redis_store_knows_the_store_contract_and_redis_only() {
    // The Redis session store: the store's trait and records, the audit events it hands to
    // its journal, the Redis client and rustls with ring. It decides nothing itself (the
    // daemon's closure does) and knows no daemon, protobuf or PostgreSQL.
    assert_only(
        "tollgate-redis",
        &[
            "tollgate-core",
            "tollgate-audit",
            "tollgate-store",
            "tokio",
            "tracing",
            "redis",
            "getrandom",
            "uuid",
            "rustls",
        ],
    );
}
