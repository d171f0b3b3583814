//! Kubernetes' path without a kubelet: containerd's CRI API, driven by a CRI client, runs a pod
//! with runtime handler `gpuslice` (configured by `gpuslice-containerd`) and gpuslice pod
//! annotations, from a locally built and imported image.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{CHECKS, Containerd, Node, text};
use gpuslice_testsupport::{binary, rootfs, wait_for};
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::Channel;

const IMAGE: &str = "localhost/gpuslice-test:latest";

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A docker-archive image of `rootfs` (one layer), as `docker save` writes it.
fn image_archive(rootfs: &Path, dir: &Path) -> PathBuf {
    let img = dir.join("image");
    std::fs::create_dir_all(&img).unwrap();
    sh(Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .arg("-cf")
        .arg(img.join("layer.tar"))
        .arg("."));
    let digest = sh(Command::new("sha256sum").arg(img.join("layer.tar")));
    let digest = digest.split_whitespace().next().unwrap();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sleep", "3600"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{digest}")]}
    });
    std::fs::write(img.join("config.json"), config.to_string()).unwrap();
    let manifest = serde_json::json!([{"Config": "config.json", "RepoTags": [IMAGE], "Layers": ["layer.tar"]}]);
    std::fs::write(img.join("manifest.json"), manifest.to_string()).unwrap();
    let archive = dir.join("image.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&img)
        .arg("-cf")
        .arg(&archive)
        .args(["manifest.json", "config.json", "layer.tar"]));
    archive
}

/// A containerd with its CRI plugin. `restrict_oom_score_adj`: root on the test machines may not
/// lower a process's OOM score (no CAP_SYS_RESOURCE), which the pause container asks for.
fn containerd_with_cri(node: &Node) -> Containerd {
    let extra = format!(
        "\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{IMAGE}\"\n  disable_apparmor = true\n  restrict_oom_score_adj = true\n"
    );
    Containerd::start(node, "containerd-cri", &extra, false)
}

async fn cri(socket: &Path) -> RuntimeServiceClient<Channel> {
    let channel = gpuslice_testsupport::grpc::unix_channel(socket)
        .await
        .expect("CRI connection");
    RuntimeServiceClient::new(channel)
}

fn sandbox_config(annotations: &[(&str, &str)]) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "gpu-pod".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        // Host network: the pod shares the node's UTS namespace, so it sets no hostname.
        hostname: String::new(),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect::<HashMap<_, _>>(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A containerd with its CRI plugin and the test image imported, holding `programs`.
fn containerd_with_image(node: &Node, programs: &[&Path]) -> Containerd {
    let rootfs = rootfs::busybox(&node.work.path().join("image-rootfs"), programs);
    let c = containerd_with_cri(node);
    let archive = image_archive(&rootfs, &c.dir);
    sh(Command::new("ctr")
        .arg("--address")
        .arg(&c.socket)
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&archive));
    c
}

/// RunPodSandbox with the gpuslice handler; the sandbox id.
async fn run_sandbox(
    client: &mut RuntimeServiceClient<Channel>,
    c: &Containerd,
    config: &PodSandboxConfig,
) -> String {
    client
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: "gpuslice".into(),
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox: {e}\n{}",
                std::fs::read_to_string(c.dir.join("containerd.log")).unwrap_or_default()
            )
        })
        .into_inner()
        .pod_sandbox_id
}

/// CreateContainer of a container named `worker` running `command` in the test image.
async fn create_worker(
    client: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    config: &PodSandboxConfig,
    command: &[&str],
) -> Result<String, tonic::Status> {
    let request = CreateContainerRequest {
        pod_sandbox_id: sandbox.to_string(),
        config: Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "worker".into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            command: command.iter().map(|c| (*c).to_string()).collect(),
            log_path: "worker.log".into(),
            ..Default::default()
        }),
        sandbox_config: Some(config.clone()),
    };
    client
        .create_container(request)
        .await
        .map(|r| r.into_inner().container_id)
}

/// StopPodSandbox then RemovePodSandbox.
async fn remove_sandbox(client: &mut RuntimeServiceClient<Channel>, sandbox: String) {
    client
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: sandbox.clone(),
        })
        .await
        .expect("StopPodSandbox");
    client
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        })
        .await
        .expect("RemovePodSandbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_the_gpuslice_runtime_handler_gets_its_slice_through_the_cri_api() {
    let node = Node::new();
    let c = containerd_with_image(&node, &[&binary("nvidia-smi")]);
    let mut client = cri(&c.socket).await;
    // The pod also names another pod in annotations of its own, so that the agent's Events
    // about its slice would land there: the engine's names must win.
    let config = sandbox_config(&[
        ("gpuslice.io/memory", "2Gi"),
        ("io.kubernetes.cri.sandbox-namespace", "kube-system"),
        ("io.kubernetes.cri.sandbox-name", "kube-apiserver"),
        (
            "io.kubernetes.cri-o.Labels",
            r#"{"io.kubernetes.pod.namespace":"kube-system","io.kubernetes.pod.name":"etcd"}"#,
        ),
    ]);
    let sandbox = run_sandbox(&mut client, &c, &config).await;
    assert!(node.status().slices.is_empty(), "the pod sandbox got a GPU");

    let container = create_worker(&mut client, &sandbox, &config, &["/bin/sleep", "60"])
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
    client
        .start_container(StartContainerRequest {
            container_id: container.clone(),
        })
        .await
        .expect("StartContainer");

    let slices = node.status().slices;
    assert_eq!(slices.len(), 1, "{slices:?}");
    assert_eq!(slices[0].claim.container_id, container);
    // The claim knows its pod as containerd names it, for the agent's Kubernetes Events, not
    // as the pod's own annotations claimed.
    let pod = slices[0]
        .claim
        .pod
        .clone()
        .expect("the claim names its pod");
    assert_eq!(
        (
            pod.namespace.as_str(),
            pod.name.as_str(),
            pod.uid.as_str(),
            pod.container.as_str()
        ),
        ("default", "gpu-pod", "uid-1", "worker")
    );
    let out = client
        .exec_sync(ExecSyncRequest {
            container_id: container.clone(),
            cmd: vec!["/bin/sh".into(), "-c".into(), CHECKS.into()],
            timeout: 20,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    common::assert_gpu_checks(&t);

    remove_sandbox(&mut client, sandbox).await;
    assert!(
        wait_for(Duration::from_secs(10), || node.status().slices.is_empty()),
        "the claim outlived the pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_pod_annotation_fails_create_container_with_the_reason() {
    let node = Node::new();
    let c = containerd_with_image(&node, &[]);
    let mut client = cri(&c.socket).await;
    let config = sandbox_config(&[("gpuslice.io/memory", "-2Gi")]);
    let sandbox = run_sandbox(&mut client, &c, &config).await;
    let msg = match create_worker(&mut client, &sandbox, &config, &["/bin/true"]).await {
        Err(status) => status.message().to_string(),
        Ok(id) => {
            let e = client
                .start_container(StartContainerRequest { container_id: id })
                .await
                .expect_err("a malformed request started");
            e.message().to_string()
        }
    };
    eprintln!("containerd said: {msg}");
    assert!(
        msg.contains("annotation gpuslice.io/memory=") && msg.contains("negative"),
        "{msg}"
    );
    assert!(node.status().slices.is_empty());
    remove_sandbox(&mut client, sandbox).await;
}
