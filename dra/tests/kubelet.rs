//! The plugin as the kubelet uses it: a stand-in kubelet finds the registration socket,
//! asks for the plugin's info, confirms the registration, then calls NodePrepareResources and
//! NodeUnprepareResources over the real gRPC socket (v1 and v1beta1), with the ResourceClaim
//! allocated in the stand-in API server. The prepared CDI device is then used by real podman
//! on the simulated node, and the container meets its wall. No real kubelet or API server
//! runs here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpuslice_dra::proto::{registration as reg, v1, v1beta1};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::{agent::Agent, binary, bus::Bus, rootfs, sim::SimNode, wait_for};
use serde_json::json;
use tonic::transport::Channel;

const CDI_DIR: &str = "/var/run/cdi";
const GIB: u64 = 1 << 30;

struct Plugin {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Plugin {
    fn registration_socket(&self) -> PathBuf {
        self.dir.path().join("registry/gpuslice.io-reg.sock")
    }
}

/// The runtime configuration of `sim` in a file, and the variables that point the plugin's
/// CDI edits at the built interception library and hook.
fn runtime_env(sim: &SimNode, bus: &Bus, agent: &Agent, dir: &Path) -> Vec<(String, String)> {
    let config = dir.join("runtime.json");
    std::fs::write(&config, sim.runtime_config().to_string()).unwrap();
    vec![
        (
            "GPUSLICE_RUNTIME_CONFIG".into(),
            config.display().to_string(),
        ),
        (
            "GPUSLICE_RUN_DIR".into(),
            agent.run_dir.display().to_string(),
        ),
        ("GPUSLICE_BUS_ADDRESS".into(), bus.address.clone()),
        (
            "GPUSLICE_INTERCEPTION_LIBRARY".into(),
            gpuslice_testsupport::target_dir()
                .join("libgpuslice.so")
                .display()
                .to_string(),
        ),
        (
            "GPUSLICE_HOOK".into(),
            binary("gpuslice-hook").display().to_string(),
        ),
    ]
}

fn start_plugin(api: &ApiServer, env: &[(String, String)], extra: &[&str]) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(binary("gpuslice-dra-plugin"))
        .args([
            "--node-name",
            "gpu-node-1",
            "--api-server",
            &api.url,
            "--cdi-dir",
            CDI_DIR,
        ])
        .arg("--plugin-dir")
        .arg(dir.path().join("plugins/gpuslice.io"))
        .arg("--registry-dir")
        .arg(dir.path().join("registry"))
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("GPUSLICE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let plugin = Plugin { child, dir };
    assert!(
        wait_for(Duration::from_secs(10), || plugin
            .registration_socket()
            .exists()),
        "the plugin made no registration socket"
    );
    plugin
}

/// Held by each test's node: one at a time. Every plugin removes, at its start and at each
/// publication, the administrative-access specs in /var/run/cdi (the one directory podman
/// reads) whose ResourceClaim its API server does not have, as a node's single plugin
/// should; tests running at once, each with its own API server, removed each other's.
static ONE_NODE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A simulated node of `gpus` T4s (15 GiB) with its agent (CDI specs in /var/run/cdi, which
/// podman reads) and a stand-in API server.
struct Node {
    sim: SimNode,
    bus: Bus,
    agent: Agent,
    work: tempfile::TempDir,
    api: ApiServer,
    /// Last: released once the rest is gone.
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl Node {
    fn new(gpus: u32) -> Self {
        let alone = ONE_NODE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sim = SimNode::new(gpus, "T4", Some(15 * GIB));
        let bus = Bus::start();
        let agent = Agent::start(
            &binary("gpuslice-agent"),
            &bus,
            &sim,
            &["--cdi-dir", CDI_DIR],
        );
        Self {
            sim,
            bus,
            agent,
            work: tempfile::tempdir().unwrap(),
            api: ApiServer::start(),
            _alone: alone,
        }
    }

    /// The plugin for this node, with `extra` flags.
    fn plugin(&self, extra: &[&str]) -> Plugin {
        let env = runtime_env(&self.sim, &self.bus, &self.agent, self.work.path());
        start_plugin(&self.api, &env, extra)
    }

    fn status(&self) -> serde_json::Value {
        agent_status(&self.bus)
    }
}

/// The kubelet's name of the ResourceClaim `default/name`.
fn claim(uid: &str, name: &str) -> v1::Claim {
    v1::Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// The DRA service (v1) the plugin's registration names, as the kubelet reaches it.
async fn kubelet(plugin: &Plugin) -> Kubelet {
    let mut registration = reg::registration_client::RegistrationClient::new(
        channel(plugin.registration_socket()).await,
    );
    let info = registration
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    v1::dra_plugin_client::DraPluginClient::new(channel(PathBuf::from(info.endpoint)).await)
}

/// A channel to the gRPC server on `socket`, tried again for up to 10 s while it is not yet
/// listening.
async fn channel(socket: PathBuf) -> Channel {
    gpuslice_testsupport::grpc::unix_channel_when_listening(&socket, Duration::from_secs(10)).await
}

/// A ResourceClaim for the whole of `gpu-<index>`: no capacity requested (the device's
/// default consumes all of its memory), so no consumed capacity is recorded.
fn whole_gpu_claim(name: &str, uid: &str, index: u32) -> serde_json::Value {
    let mut c = allocated_claim(name, uid, index, "0");
    let result = &mut c["status"]["allocation"]["devices"]["results"][0];
    result.as_object_mut().unwrap().remove("consumedCapacity");
    result.as_object_mut().unwrap().remove("shareID");
    c
}

/// A ResourceClaim as kube-scheduler leaves it: allocated from `gpu-<index>` of this node,
/// consuming `memory` of it (consumable capacity).
fn allocated_claim(name: &str, uid: &str, index: u32, memory: &str) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpuslice.io", "capacity": {"requests": {"memory": memory}}}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpuslice.io", "pool": "gpu-node-1",
            "device": format!("gpu-{index}"), "shareID": "7b1f0c2e-0000-4000-8000-000000000001",
            "consumedCapacity": {"memory": memory}
        }]}}}
    })
}

/// Adds to `claim`'s results a copy of its first, as `change` makes it.
fn add_result_like_the_first(
    claim: &mut serde_json::Value,
    change: impl FnOnce(&mut serde_json::Value),
) {
    let results = &mut claim["status"]["allocation"]["devices"]["results"];
    let mut result = results[0].clone();
    change(&mut result);
    results.as_array_mut().unwrap().push(result);
}

type Kubelet = v1::dra_plugin_client::DraPluginClient<Channel>;

/// Prepares the ResourceClaim `name` (uid `uid`), put on the API server as `object`, through
/// a plugin started on `node`, which must succeed: the plugin, the kubelet's channel to it,
/// and each device result's name with its CDI devices.
async fn prepare_one(
    node: &Node,
    uid: &str,
    name: &str,
    object: serde_json::Value,
) -> (Plugin, Kubelet, Vec<(String, Vec<String>)>) {
    node.api.put_resource_claim(object);
    let plugin = node.plugin(&[]);
    let mut dra = kubelet(&plugin).await;
    let answer = prepare_claims(&mut dra, &[claim(uid, name)]).await;
    let prepared = &answer.claims[uid];
    assert_eq!(prepared.error, "");
    let named = prepared
        .devices
        .iter()
        .map(|d| (d.device_name.clone(), d.cdi_device_ids.clone()))
        .collect();
    (plugin, dra, named)
}

/// NodePrepareResources (v1) for `claims`, as the kubelet calls it.
async fn prepare_claims(
    dra: &mut Kubelet,
    claims: &[v1::Claim],
) -> v1::NodePrepareResourcesResponse {
    dra.node_prepare_resources(v1::NodePrepareResourcesRequest {
        claims: claims.to_vec(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// NodeUnprepareResources (v1) for `claims`.
async fn unprepare_claims(
    dra: &mut Kubelet,
    claims: &[v1::Claim],
) -> v1::NodeUnprepareResourcesResponse {
    dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
        claims: claims.to_vec(),
    })
    .await
    .unwrap()
    .into_inner()
}

fn podman(work: &Path, args: &[&str]) -> Output {
    rootfs::podman(work, &[], args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_prepared_through_the_kubelets_grpc_runs_in_podman_behind_its_wall() {
    let node = Node::new(2);
    let uid = format!(
        "0b6e3c9a-{:04x}-4000-8000-000000000001",
        std::process::id() & 0xffff
    );
    node.api
        .put_resource_claim(allocated_claim("slice", &uid, 1, "2Gi"));
    let plugin = node.plugin(&[]);

    // Registration, as the kubelet's plugin watcher does it.
    let mut registration = reg::registration_client::RegistrationClient::new(
        channel(plugin.registration_socket()).await,
    );
    let info = registration
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpuslice.io");
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    registration
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();

    let endpoint = PathBuf::from(&info.endpoint);
    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(endpoint.clone()).await);
    let claim = claim(&uid, "slice");
    let prepare = || v1::NodePrepareResourcesRequest {
        claims: vec![claim.clone()],
    };
    let answer = dra
        .node_prepare_resources(prepare())
        .await
        .unwrap()
        .into_inner();
    let prepared = &answer.claims[&uid];
    assert_eq!(prepared.error, "");
    let id = format!("dra-{uid}-0");
    assert_eq!(prepared.devices.len(), 1);
    let device = &prepared.devices[0];
    assert_eq!(
        (
            device.request_names.clone(),
            device.pool_name.as_str(),
            device.device_name.as_str()
        ),
        (vec!["gpu".to_string()], "gpu-node-1", "gpu-1")
    );
    assert_eq!(device.cdi_device_ids, [format!("gpuslice.io/slice={id}")]);
    assert_eq!(
        device.share_id.as_deref(),
        Some("7b1f0c2e-0000-4000-8000-000000000001")
    );
    // Prepared twice (a kubelet retry, a restarted plugin): the same answer, one slice.
    let again = dra
        .node_prepare_resources(prepare())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&uid], *prepared);
    let status = node.status();
    assert_eq!(status["slices"].as_array().unwrap().len(), 1, "{status}");
    assert_eq!(status["slices"][0]["gpus"][0]["index"], 1);
    assert_eq!(status["slices"][0]["gpus"][0]["memory_bytes"], 2 * GIB);
    let spec_file = Path::new(CDI_DIR).join(format!("gpuslice.io-slice-{id}.json"));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
    gpuslice_testsupport::cdi::assert_valid(&spec);

    // The runtime injects the CDI device: the container sees GPU 1 behind a 2 GiB wall.
    let r = rootfs_with_wall(&node);
    let cdi_device = device.cdi_device_ids[0].clone();
    // The process's context is charged to the slice: what is left of it is the slice less
    // one context.
    let room = (2u64 << 30) - node.sim.spec.gpus[1].context_bytes;
    let script = format!(
        "/usr/bin/nvidia-smi --query-gpu=uuid,memory.total --format=csv,noheader; /usr/bin/wall procaddr alloc {room}"
    );
    let args = [
        &rootfs::PODMAN_RUN[..],
        &[
            "--device",
            &cdi_device,
            "--rootfs",
            &r,
            "/bin/sh",
            "-c",
            &script,
        ],
    ]
    .concat();
    let out = podman(node.work.path(), &args);
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("{}, 2048 MiB", node.sim.spec.gpus[1].uuid)),
        "{t}"
    );
    for want in [
        "fit=CUDA_SUCCESS",
        "free_at_fit=0 ",
        "over=CUDA_ERROR_OUT_OF_MEMORY",
    ] {
        assert!(t.contains(want), "{want:?} not in {t}");
    }
    // A privileged container given the claim's device (a pod whose securityContext says
    // `privileged`) is not started: it could mount its own limits over the slice's.
    let privileged = [
        &rootfs::PODMAN_RUN[..],
        &[
            "--privileged",
            "--device",
            &cdi_device,
            "--rootfs",
            &r,
            "/bin/true",
        ],
    ]
    .concat();
    let out = podman(node.work.path(), &privileged);
    let t = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && t.contains("but is privileged (it has CAP_SYS_ADMIN)"),
        "{out:?}"
    );
    // The container has exited; the claim lives until the kubelet unprepares it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 1);

    // A kubelet of 1.32/1.33 unprepares through v1beta1.
    let mut old = v1beta1::dra_plugin_client::DraPluginClient::new(channel(endpoint).await);
    let done = old
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "default".into(),
                uid: uid.clone(),
                name: "slice".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.claims[&uid].error, "");
    assert!(node.status()["slices"].as_array().unwrap().is_empty());
    assert!(
        !spec_file.exists(),
        "the agent removes the spec with the claim"
    );
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_two_gpus_runs_in_one_container_behind_a_wall_on_each() {
    let node = Node::new(2);
    let uid = format!(
        "0b6e3c9a-{:04x}-4000-8000-000000000002",
        std::process::id() & 0xffff
    );
    // `count: 2` of 2Gi each: kube-scheduler leaves one result per GPU, both of request gpu.
    let mut pair = allocated_claim("pair", &uid, 0, "2Gi");
    add_result_like_the_first(&mut pair, |second| {
        second["device"] = json!("gpu-1");
        second["consumedCapacity"]["memory"] = json!("2048Mi");
    });
    let (plugin, _dra, named) = prepare_one(&node, &uid, "pair", pair).await;
    let id = format!("dra-{uid}-0");
    assert_eq!(
        named,
        [
            ("gpu-0".to_string(), vec![format!("gpuslice.io/slice={id}")]),
            ("gpu-1".to_string(), vec![])
        ]
    );
    // One slice holds both GPUs.
    let status = node.status();
    let slices = status["slices"].as_array().unwrap();
    assert_eq!(slices.len(), 1, "{status}");
    let gpus: Vec<(u64, u64)> = slices[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["index"].as_u64().unwrap(),
                g["memory_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(gpus, [(0, 2 * GIB), (1, 2 * GIB)]);

    // The container is given every CDI device of the claim's devices, as the kubelet passes
    // them: it sees both GPUs, and fills each to its wall.
    let ids: Vec<String> = named.into_iter().flat_map(|(_, ids)| ids).collect();
    fills_each_gpu_to_its_wall(&node, &ids, "");
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_consuming_different_parts_of_its_gpus_is_a_slice_on_each() {
    let node = Node::new(2);
    let uid = format!(
        "0b6e3c9a-{:04x}-4000-8000-000000000005",
        std::process::id() & 0xffff
    );
    // One request given 2Gi and 30% of gpu-0, 2Gi and 20% of gpu-1: a slice gives each of
    // its GPUs the same, so these are two slices. Before, the request was refused ("ask for
    // these GPUs in separate requests"), which a pod cannot do once it is scheduled.
    let mut pair = allocated_claim("uneven", &uid, 0, "2Gi");
    pair["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["cores"] =
        json!("30");
    add_result_like_the_first(&mut pair, |second| {
        second["device"] = json!("gpu-1");
        second["consumedCapacity"]["cores"] = json!("20");
    });
    let (plugin, mut dra, named) = prepare_one(&node, &uid, "uneven", pair).await;
    assert_eq!(
        named,
        [
            (
                "gpu-0".to_string(),
                vec![format!("gpuslice.io/slice=dra-{uid}-0")]
            ),
            (
                "gpu-1".to_string(),
                vec![format!("gpuslice.io/slice=dra-{uid}-1")]
            )
        ]
    );
    let status = node.status();
    let mut slices: Vec<(u64, u64, u64)> = status["slices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["gpus"].as_array().unwrap().clone())
        .map(|g| {
            (
                g["index"].as_u64().unwrap(),
                g["memory_bytes"].as_u64().unwrap(),
                g["cores"].as_u64().unwrap(),
            )
        })
        .collect();
    slices.sort_unstable();
    assert_eq!(slices, [(0, 2 * GIB, 30), (1, 2 * GIB, 20)], "{status}");
    // A container given the request's devices has both slices, and fills each GPU to its
    // wall.
    let ids: Vec<String> = named.into_iter().flat_map(|(_, ids)| ids).collect();
    fills_each_gpu_to_its_wall(&node, &ids, "");
    let answer = unprepare_claims(&mut dra, &[claim(&uid, "uneven")]).await;
    assert_eq!(answer.claims[&uid].error, "");
    assert_eq!(node.status()["slices"], json!([]));
    drop(plugin);
}

/// A busybox root file system with `nvidia-smi` and the wall program, by its path.
fn rootfs_with_wall(node: &Node) -> String {
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    std::fs::copy(
        rootfs::wall_program(node.work.path()),
        rootfs.join("usr/bin/wall"),
    )
    .unwrap();
    rootfs.display().to_string()
}

/// Runs a container given the CDI devices `ids` on a node of two GPUs, `prelude` first: it
/// must see both behind a 2 GiB wall, fill each to it and be refused beyond. Returns what
/// the container wrote.
fn fills_each_gpu_to_its_wall(node: &Node, ids: &[String], prelude: &str) -> String {
    let r = rootfs_with_wall(node);
    let room = (2u64 << 30) - node.sim.spec.gpus[0].context_bytes;
    let script = format!(
        "{prelude}\n/usr/bin/nvidia-smi --query-gpu=uuid,memory.total --format=csv,noheader; \\
         for d in 0 1; do echo gpu=$d; CUDA_VISIBLE_DEVICES=$d /usr/bin/wall procaddr alloc {room}; done"
    );
    let mut args: Vec<String> = rootfs::PODMAN_RUN.iter().map(|a| a.to_string()).collect();
    for id in ids {
        args.extend(["--device".to_string(), id.clone()]);
    }
    args.extend(["--rootfs", &r, "/bin/sh", "-c", &script].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = podman(node.work.path(), &args);
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{t}");
    for g in &node.sim.spec.gpus {
        assert!(t.contains(&format!("{}, 2048 MiB", g.uuid)), "{t}");
    }
    let (first, second) = t
        .split_once("gpu=0")
        .and_then(|(_, rest)| rest.split_once("gpu=1"))
        .unwrap_or_else(|| panic!("{t}"));
    for (d, seen) in [(0, first), (1, second)] {
        for want in [
            "fit=CUDA_SUCCESS",
            "free_at_fit=0 ",
            "over=CUDA_ERROR_OUT_OF_MEMORY",
        ] {
            assert!(seen.contains(want), "GPU {d}: {want:?} not in {t}");
        }
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_given_two_claims_runs_behind_the_wall_of_each() {
    let node = Node::new(2);
    let uid = |n: u32| {
        format!(
            "0b6e3c9a-{:04x}-4000-8000-00000000001{n}",
            std::process::id() & 0xffff
        )
    };
    // Two ResourceClaims (a pod's two claims, both named by one container), on GPUs 0 and 1.
    for gpu in [0, 1] {
        node.api.put_resource_claim(allocated_claim(
            &format!("half-{gpu}"),
            &uid(gpu),
            gpu,
            "2Gi",
        ));
    }
    let plugin = node.plugin(&[]);
    let mut dra = kubelet(&plugin).await;
    let answer = prepare_claims(
        &mut dra,
        &[claim(&uid(0), "half-0"), claim(&uid(1), "half-1")],
    )
    .await;
    let mut ids = Vec::new();
    for gpu in [0, 1] {
        let prepared = &answer.claims[&uid(gpu)];
        assert_eq!(prepared.error, "");
        ids.extend(
            prepared
                .devices
                .iter()
                .flat_map(|d| d.cdi_device_ids.clone()),
        );
    }
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 2);
    // Each slice's directory is mounted at /run/gpuslice/<claim>; the library finds both.
    // Root in the container plants limits of 15 GB per GPU where a container directory
    // would be, and as one more beside the mounted ones: only mounts count.
    let big: String = node
        .sim
        .spec
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            format!(
                "gpu.{i}.uuid={}\\ngpu.{i}.memory_bytes=15000000000\\n",
                g.uuid
            )
        })
        .collect();
    let prelude = format!(
        "for d in /run/gpuslice /run/gpuslice/planted; do mkdir -p $d && \
         printf 'version=1\\ncontainer_id=planted\\ngpus=2\\n{big}' > $d/limits && echo planted $d; done"
    );
    let t = fills_each_gpu_to_its_wall(&node, &ids, &prelude);
    for planted in ["planted /run/gpuslice\n", "planted /run/gpuslice/planted\n"] {
        assert!(t.contains(planted), "{planted:?} not in {t}");
    }
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_does_not_fit_in_whole_or_in_part_or_was_replaced_is_refused_and_holds_nothing()
 {
    let node = Node::new(1);
    node.api
        .put_resource_claim(allocated_claim("huge", "uid-huge", 0, "64Gi"));
    node.api
        .put_resource_claim(allocated_claim("other", "uid-now", 0, "1Gi"));
    // Two requests: the first fits, the second does not; nothing of the claim may stay held.
    let mut half = allocated_claim("half", "uid-half", 0, "1Gi");
    add_result_like_the_first(&mut half, |second| {
        second["consumedCapacity"]["memory"] = json!("64Gi");
        second["request"] = json!("big");
    });
    node.api.put_resource_claim(half);
    // Opaque parameters for the driver, which takes none: refused, not left unread.
    let mut configured = allocated_claim("configured", "uid-configured", 0, "1Gi");
    configured["status"]["allocation"]["devices"]["config"] = json!([{
        "source": "FromClaim", "requests": ["gpu"],
        "opaque": {"driver": "gpuslice.io", "parameters": {"sharing": "time-slicing"}}
    }]);
    node.api.put_resource_claim(configured);
    let plugin = node.plugin(&[]);
    let mut dra = kubelet(&plugin).await;
    let answer = prepare_claims(
        &mut dra,
        &[
            claim("uid-huge", "huge"),
            claim("uid-then", "other"),
            claim("uid-half", "half"),
            claim("uid-configured", "configured"),
        ],
    )
    .await;
    let configured = &answer.claims["uid-configured"].error;
    assert!(
        configured.contains("ResourceClaim default/configured: config 0 (source FromClaim)")
            && configured.contains("time-slicing"),
        "{configured}"
    );
    let huge = &answer.claims["uid-huge"].error;
    assert!(
        huge.contains("ResourceClaim default/huge") && huge.contains("64Gi"),
        "{huge}"
    );
    let half = &answer.claims["uid-half"].error;
    assert!(
        half.contains("ResourceClaim default/half") && half.contains("64Gi"),
        "{half}"
    );
    let replaced = &answer.claims["uid-then"].error;
    assert!(
        replaced.contains("has uid uid-now, not uid-then"),
        "{replaced}"
    );
    assert!(node.status()["slices"].as_array().unwrap().is_empty());
    drop(plugin);
}

fn agent_status(bus: &Bus) -> serde_json::Value {
    let out = Command::new(binary("gpuslice"))
        .args(["--bus-address", &bus.address, "status", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_publishes_the_nodes_resource_slice_with_shareable_gpus() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let node = Node::new(2);
    let plugin = node.plugin(&[]);
    let name = "gpu-node-1-gpuslice.io";
    assert!(
        wait_for(Duration::from_secs(10), || node
            .api
            .objects
            .lock()
            .unwrap()
            .resource_slices
            .contains_key(name)),
        "no ResourceSlice was published"
    );
    let raw = node.api.objects.lock().unwrap().resource_slices[name].clone();
    // Read back as the API's own type: every field name is one the API server knows.
    let slice: ResourceSlice = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(slice.spec.driver, "gpuslice.io");
    assert_eq!(slice.spec.node_name.as_deref(), Some("gpu-node-1"));
    assert_eq!(
        (
            slice.spec.pool.name.as_str(),
            slice.spec.pool.resource_slice_count
        ),
        ("gpu-node-1", 1)
    );
    let devices = slice.spec.devices.unwrap();
    assert_eq!(
        devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["gpu-0", "gpu-1"]
    );
    let d = &devices[1];
    assert_eq!(d.allow_multiple_allocations, Some(true));
    let attrs = d.attributes.as_ref().unwrap();
    assert_eq!(
        attrs["uuid"].string.as_deref(),
        Some(node.sim.spec.gpus[1].uuid.as_str())
    );
    assert_eq!(
        attrs["model"].string.as_deref(),
        Some(node.sim.spec.gpus[1].name.as_str())
    );
    assert_eq!(attrs["driverVersion"].version.as_deref(), Some("550.54.15"));
    assert_eq!(
        attrs["cudaDriverVersion"].version.as_deref(),
        Some("12.4.0")
    );
    // NVML's NVML_BRAND_NVIDIA, as NVIDIA's DRA driver writes it.
    assert_eq!(attrs["brand"].string.as_deref(), Some("Nvidia"));
    let (major, minor) = node.sim.spec.gpus[1].compute_capability;
    assert_eq!(
        attrs["computeCapability"].version.as_deref(),
        Some(format!("{major}.{minor}.0").as_str())
    );
    let capacity = d.capacity.as_ref().unwrap();
    assert_eq!(capacity["memory"].value.0, (15 * GIB).to_string());
    let range = capacity["memory"]
        .request_policy
        .as_ref()
        .unwrap()
        .valid_range
        .as_ref()
        .unwrap();
    assert_eq!(
        (
            range.min.0.as_str(),
            range.step.as_ref().unwrap().0.as_str()
        ),
        ("268435456", "268435456")
    );
    assert_eq!(capacity["cores"].value.0, "100");
    // Unchanged inventory, no new generation: the plugin replaces the slice only when it changed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        node.api.objects.lock().unwrap().resource_slices[name]["spec"]["pool"]["generation"],
        1
    );
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slices_of_a_claim_the_api_server_no_longer_has_are_released() {
    let node = Node::new(1);
    let uid = format!(
        "5e1f0c2e-{:04x}-4000-8000-000000000002",
        std::process::id() & 0xffff
    );
    node.api
        .put_resource_claim(allocated_claim("gone", &uid, 0, "1Gi"));
    let kept = format!(
        "5e1f0c2e-{:04x}-4000-8000-000000000003",
        std::process::id() & 0xffff
    );
    node.api
        .put_resource_claim(allocated_claim("kept", &kept, 0, "1Gi"));
    let plugin = node.plugin(&["--publish-interval", "1"]);
    let mut dra = kubelet(&plugin).await;
    let answer = prepare_claims(&mut dra, &[claim(&uid, "gone"), claim(&kept, "kept")]).await;
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 2);
    // Deleted while its pod could not be unprepared: the plugin notices and gives it back.
    node.api.delete_resource_claim("default", "gone");
    let spec_file = Path::new(CDI_DIR).join(format!("gpuslice.io-slice-dra-{uid}-0.json"));
    assert!(
        wait_for(Duration::from_secs(10), || node.status()["slices"]
            .as_array()
            .unwrap()
            .len()
            == 1),
        "the slice of the deleted claim is still held"
    );
    assert_eq!(
        node.status()["slices"][0]["container_id"],
        format!("dra-{kept}-0")
    );
    assert!(!spec_file.exists());
    unprepare_claims(&mut dra, &[claim(&kept, "kept")]).await;
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_gpu_claim_survives_an_agent_restart_between_prepare_and_unprepare() {
    let mut node = Node::new(2);
    let uid = format!(
        "6a2d0c2e-{:04x}-4000-8000-000000000004",
        std::process::id() & 0xffff
    );
    node.api
        .put_resource_claim(whole_gpu_claim("whole", &uid, 0));
    let plugin = node.plugin(&[]);
    let mut dra = kubelet(&plugin).await;
    let whole = claim(&uid, "whole");
    let answer = prepare_claims(&mut dra, std::slice::from_ref(&whole)).await;
    assert_eq!(answer.claims[&uid].error, "");
    assert_eq!(answer.claims[&uid].devices[0].share_id, None);
    let before = node.status();
    assert_eq!(before["slices"][0]["exclusive"], true, "{before}");
    assert_eq!(before["slices"][0]["gpus"][0]["memory_bytes"], 15 * GIB);

    // The agent dies and comes back: the prepared claim is still held, whole.
    node.agent.kill9();
    node.agent.restart();
    let after = node.status();
    assert_eq!(
        after["slices"], before["slices"],
        "the restart lost or changed the claim"
    );
    // Another claim for the same GPU is refused while it is held.
    node.api
        .put_resource_claim(allocated_claim("late", "uid-late", 0, "1Gi"));
    let late = prepare_claims(&mut dra, &[claim("uid-late", "late")]).await;
    assert!(!late.claims["uid-late"].error.is_empty(), "{late:?}");
    let done = unprepare_claims(&mut dra, &[whole]).await;
    assert_eq!(done.claims[&uid].error, "");
    assert!(node.status()["slices"].as_array().unwrap().is_empty());
    drop(plugin);
}

const ADMIN_ACCESS: &str = "resource.kubernetes.io/admin-access";

/// A claim named `name` (uid `uid`, in `default`) whose one request, with `adminAccess`, was
/// allocated GPU `gpu` whole beside whatever else is there.
fn admin_claim(name: &str, uid: &str, gpu: u32) -> serde_json::Value {
    let mut claim = whole_gpu_claim(name, uid, gpu);
    claim["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = json!(true);
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
    claim
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_access_is_refused_in_a_namespace_not_or_no_longer_labelled_for_it() {
    // Kubernetes checks the label when the claim is made; a claim made while it was there
    // keeps adminAccess after an operator removes it, or comes from an API server that does
    // not check. Each prepare checks the namespace again, and a refusal gives nothing.
    let node = Node::new(2);
    let tag = std::process::id() & 0xffff;
    let uid = format!("ad000c2e-{tag:04x}-4000-8000-000000000003");
    // A slice of GPU 1 (request "gpu", result 0) and GPU 0 for the administrator (request
    // "admin", result 1).
    let mut mixed = allocated_claim("admin", &uid, 1, "1Gi");
    add_result_like_the_first(&mut mixed, |admin| {
        admin["request"] = json!("admin");
        admin["device"] = json!("gpu-0");
        admin["adminAccess"] = json!(true);
        let fields = admin.as_object_mut().unwrap();
        fields.remove("consumedCapacity");
        fields.remove("shareID");
    });
    node.api.put_resource_claim(mixed);
    let plugin = node.plugin(&["--publish-interval", "1"]);
    let mut dra = kubelet(&plugin).await;
    let spec_file = Path::new(CDI_DIR).join(format!("gpuslice.io-admin-dra-{uid}-1.json"));
    let slices = || node.status()["slices"].as_array().unwrap().len();
    let refused = prepare_claims(&mut dra, &[claim(&uid, "admin")]).await;
    let error = &refused.claims[&uid].error;
    assert!(
        error.contains("ResourceClaim default/admin: request \"admin\": admin access refused: namespace default is not labelled resource.kubernetes.io/admin-access=true (it is unset)"),
        "{refused:?}"
    );
    assert!(refused.claims[&uid].devices.is_empty(), "{refused:?}");
    assert!(!spec_file.exists(), "a refused admin claim left its spec");
    assert_eq!(slices(), 0, "the claim's slice request was claimed");

    // Labelled, both are given; the label taken away (or set to anything else), the claim is
    // refused whole: its slice released, the spec of the earlier prepare gone.
    node.api.put_namespace("default", &[(ADMIN_ACCESS, "true")]);
    let given = prepare_claims(&mut dra, &[claim(&uid, "admin")]).await;
    assert_eq!(given.claims[&uid].error, "", "{given:?}");
    assert!(spec_file.exists());
    assert_eq!(slices(), 1);
    node.api.put_namespace("default", &[(ADMIN_ACCESS, "yes")]);
    let again = prepare_claims(&mut dra, &[claim(&uid, "admin")]).await;
    assert!(
        again.claims[&uid].error.contains("(it is \"yes\")"),
        "{again:?}"
    );
    assert!(
        !spec_file.exists(),
        "the refused claim's spec is still there"
    );
    assert_eq!(slices(), 0, "the refused claim's slice is still held");
    drop(plugin);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_admin_access_sees_a_gpu_in_use_whole_and_claims_nothing() {
    let node = Node::new(2);
    let tag = std::process::id() & 0xffff;
    let uid = format!("ad000c2e-{tag:04x}-4000-8000-000000000001");
    node.api
        .put_resource_claim(allocated_claim("tenant", &uid, 1, "2Gi"));
    // An administrator's claim on the same GPU (`adminAccess`, in a namespace labelled for
    // it): kube-scheduler allocates it beside the tenant's, consuming nothing.
    let admin = format!("ad000c2e-{tag:04x}-4000-8000-000000000002");
    node.api.put_resource_claim(admin_claim("admin", &admin, 1));
    node.api.put_namespace("default", &[(ADMIN_ACCESS, "true")]);
    let plugin = node.plugin(&["--publish-interval", "1"]);
    let mut dra = kubelet(&plugin).await;
    let answer = prepare_claims(&mut dra, &[claim(&uid, "tenant"), claim(&admin, "admin")]).await;
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );
    let id = format!("dra-{admin}-0");
    let device = &answer.claims[&admin].devices[0];
    assert_eq!(device.cdi_device_ids, [format!("gpuslice.io/admin={id}")]);
    // Nothing claimed: the tenant's slice is the GPU's only one.
    let status = node.status();
    let slices = status["slices"].as_array().unwrap();
    assert_eq!(slices.len(), 1, "{status}");
    assert_eq!(slices[0]["container_id"], format!("dra-{uid}-0"));
    let spec_file = Path::new(CDI_DIR).join(format!("gpuslice.io-admin-{id}.json"));
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
    gpuslice_testsupport::cdi::assert_valid(&spec);

    // The administrator's container sees that GPU, whole, with the real driver.
    let rootfs = rootfs::busybox(&node.work.path().join("rootfs"), &[&binary("nvidia-smi")]);
    let r = rootfs.display().to_string();
    let cdi_device = device.cdi_device_ids[0].clone();
    let args = [
        &rootfs::PODMAN_RUN[..],
        &[
            "--device",
            &cdi_device,
            "--rootfs",
            &r,
            "/usr/bin/nvidia-smi",
            "--query-gpu=uuid,memory.total",
            "--format=csv,noheader",
        ],
    ]
    .concat();
    let out = podman(node.work.path(), &args);
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        t.trim(),
        format!("{}, 15360 MiB", node.sim.spec.gpus[1].uuid),
        "{out:?}"
    );
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 1);

    // Unprepared, its spec goes; the tenant's slice stays.
    let done = unprepare_claims(&mut dra, &[claim(&admin, "admin")]).await;
    assert_eq!(done.claims[&admin].error, "");
    assert!(!spec_file.exists());
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 1);
    // Prepared again and then deleted while its pod could not be unprepared: the plugin
    // removes the spec as it releases the slices of deleted claims.
    let again = prepare_claims(&mut dra, &[claim(&admin, "admin")]).await;
    assert_eq!(again.claims[&admin].error, "");
    assert!(spec_file.exists());
    node.api.delete_resource_claim("default", "admin");
    assert!(
        wait_for(Duration::from_secs(10), || !spec_file.exists()),
        "the spec of the deleted admin claim is still there"
    );
    assert_eq!(node.status()["slices"].as_array().unwrap().len(), 1);
    unprepare_claims(&mut dra, &[claim(&uid, "tenant")]).await;
    drop(plugin);
}
