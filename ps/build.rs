//! Generates the parameter server's gRPC types and stubs from the committed `proto/ps.proto`
//! with protox (a pure-Rust protobuf compiler), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/ps.proto");
    let fds = protox::compile(["proto/ps.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
