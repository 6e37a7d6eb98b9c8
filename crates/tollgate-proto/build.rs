//! Compiles proto/sp1.proto and proto/control.proto with protox (pure Rust: no `protoc`
//! needed): prost generates the messages, tonic-prost-build the `ShackleDaemon` gRPC server
//! trait and client from the same descriptor set, and pbjson-build their proto3 JSON mapping
//! (serde `Serialize` and `Deserialize`).

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/sp1.proto");
    println!("cargo:rerun-if-changed=proto/control.proto");
    let fds = protox::compile(["proto/sp1.proto", "proto/control.proto"], ["proto"])?;
    let descriptors = fds.encode_to_vec();
    // The stubs are transport-free (`build_transport(false)`): the daemon and the client
    // bring their own HTTP/2 and TLS.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(fds)?;
    // The JSON mapping: camelCase names out, both spellings in; enums by name; 64-bit
    // integers as strings; bytes as base64; unknown fields are an error.
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".tollgate"])?;
    Ok(())
}
