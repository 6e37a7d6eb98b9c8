//! Compiles proto/sp1.proto and proto/control.proto with protox (pure Rust: no `protoc`
//! needed) and prost, then generates their proto3 JSON mapping (serde `Serialize` and
//! `Deserialize`) with pbjson-build from the same descriptor set.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/sp1.proto");
    println!("cargo:rerun-if-changed=proto/control.proto");
    let fds = protox::compile(["proto/sp1.proto", "proto/control.proto"], ["proto"])?;
    let descriptors = fds.encode_to_vec();
    prost_build::Config::new().compile_fds(fds)?;
    // The JSON mapping: camelCase names out, both spellings in; enums by name; 64-bit
    // integers as strings; bytes as base64; unknown fields are an error.
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".tollgate"])?;
    Ok(())
}
