//! Compiles proto/sp1.proto with protox (pure Rust: no `protoc` needed): prost generates
//! the messages, tonic-prost-build the `ShackleDaemon` gRPC server trait and client from
//! the same descriptor set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/sp1.proto");
    let fds = protox::compile(["proto/sp1.proto"], ["proto"])?;
    // The stubs are transport-free (`build_transport(false)`): the daemon and the client
    // bring their own HTTP/2 and TLS.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
