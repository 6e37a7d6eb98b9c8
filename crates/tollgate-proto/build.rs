//! Compiles proto/sp1.proto with protox (pure Rust: no `protoc` needed) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/sp1.proto");
    let fds = protox::compile(["proto/sp1.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
