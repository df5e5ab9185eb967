//! Compiles the .proto files under `proto/` with protox (pure Rust, so no system
//! `protoc` is needed) and generates prost messages plus tonic clients and servers.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
    "tessera/v1/agent.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The transport helper `XClient::connect(url)` would clash with the generated
        // method for the `AgentService.Connect` RPC; clients build a `Channel` instead.
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
