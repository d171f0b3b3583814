//! Compiles the kubelet's plugin APIs (proto/, kept unchanged from kubernetes/kubelet).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/pluginregistration/v1/api.proto",
            "proto/dra/v1/api.proto",
            "proto/dra/v1beta1/api.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
