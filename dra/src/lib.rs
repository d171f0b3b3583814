//! The DRA kubelet plugin: registers with the kubelet as driver `gpuslice.io`, serves the DRA
//! gRPC service (v1 and v1beta1) and prepares each ResourceClaim allocated to this node as
//! slices claimed through the node agent (the same admission and the same wall as every
//! other gpuslice container), answering with the CDI devices the runtime injects.

pub mod prepare;
pub mod publish;
pub mod request;
pub mod server;

/// The kubelet's plugin APIs, compiled from `proto/` (kept unchanged from kubernetes/kubelet).
pub mod proto {
    /// `pluginregistration` (v1): the registration service a plugin serves to the kubelet.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// The DRA service as Kubernetes 1.34 and later call it.
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// The DRA service as Kubernetes 1.32 and 1.33 call it.
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// The driver name the plugin registers and ResourceSlices and claims carry.
pub const DRIVER: &str = "gpuslice.io";
/// The service versions the plugin serves, as the kubelet names them.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
