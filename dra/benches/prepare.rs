//! Prepare and unprepare latency of the DRA plugin, as a kubelet sees it (gRPC over its Unix
//! socket: the ResourceClaim read from a stand-in API server, the claim through the agent,
//! the CDI spec written), next to the agent's own claim and release round trips over D-Bus,
//! interleaved in one run against the same agent.
//!
//! Run: `cargo build --release --workspace && cargo bench -p gpuslice-dra --bench prepare`
//! (`BENCH_ROUNDS`, default 500). Needs root (the simulated node's device nodes).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuslice_dra::proto::{registration as reg, v1};
use gpuslice_testsupport::apiserver::ApiServer;
use gpuslice_testsupport::bench::rounds;
use gpuslice_testsupport::{agent::Agent, binary, bus::Bus, sim::SimNode, wait_for};
use serde_json::json;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

async fn channel(socket: PathBuf) -> tonic::transport::Channel {
    gpuslice_testsupport::grpc::unix_channel(&socket)
        .await
        .expect("plugin socket")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = rounds(500);
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let work = tempfile::tempdir().expect("tempdir");
    let cdi = work.path().join("cdi");
    let cdi_arg = cdi.display().to_string();
    let agent = Agent::start(
        &binary("gpuslice-agent"),
        &bus,
        &sim,
        &["--cdi-dir", &cdi_arg, "--max-sharers", "64"],
    );
    let config = work.path().join("runtime.json");
    std::fs::write(&config, sim.runtime_config().to_string()).expect("runtime.json");
    let api = ApiServer::start();
    let uids: Vec<String> = (0..n)
        .map(|i| format!("00000000-0000-4000-8000-{i:012}"))
        .collect();
    for (i, uid) in uids.iter().enumerate() {
        api.put_resource_claim(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("c{i}"), "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpuslice.io", "pool": "gpu-node-1",
                "device": "gpu-0", "consumedCapacity": {"memory": "256Mi", "cores": "1"}
            }]}}}
        }));
    }
    let dir = work.path();
    let mut plugin = Command::new(env!("CARGO_BIN_EXE_gpuslice-dra-plugin"))
        .args([
            "--node-name",
            "gpu-node-1",
            "--api-server",
            &api.url,
            "--cdi-dir",
            &cdi_arg,
        ])
        .arg("--plugin-dir")
        .arg(dir.join("plugins"))
        .arg("--registry-dir")
        .arg(dir.join("registry"))
        .env("GPUSLICE_RUNTIME_CONFIG", &config)
        .env("GPUSLICE_RUN_DIR", &agent.run_dir)
        .env("GPUSLICE_BUS_ADDRESS", &bus.address)
        .env(
            "GPUSLICE_INTERCEPTION_LIBRARY",
            gpuslice_testsupport::target_dir().join("libgpuslice.so"),
        )
        .env("GPUSLICE_HOOK", binary("gpuslice-hook"))
        .env("GPUSLICE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("gpuslice-dra-plugin");
    let registration = dir.join("registry/gpuslice.io-reg.sock");
    assert!(
        wait_for(Duration::from_secs(10), || registration.exists()),
        "no plugin socket"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut prepare, mut unprepare, mut claim, mut release) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    rt.block_on(async {
        let mut r = reg::registration_client::RegistrationClient::new(channel(registration).await);
        let info = r
            .get_info(reg::InfoRequest {})
            .await
            .expect("GetInfo")
            .into_inner();
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(
            channel(PathBuf::from(info.endpoint)).await,
        );
        let conn = gpuslice_agent_api::connect(Some(&bus.address))
            .await
            .expect("bus");
        let agent = gpuslice_agent_api::AgentProxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .expect("proxy");
        let annotations: std::collections::HashMap<&str, &str> = [
            ("gpuslice.io/memory", "256Mi"),
            ("gpuslice.io/cores", "1"),
            ("gpuslice.io/devices", "0"),
        ]
        .into();
        for (i, uid) in uids.iter().enumerate() {
            let c = v1::Claim {
                namespace: "default".into(),
                uid: uid.clone(),
                name: format!("c{i}"),
            };
            let t = Instant::now();
            let a = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![c.clone()],
                })
                .await
                .expect("prepare")
                .into_inner();
            prepare.push(t.elapsed());
            assert_eq!(a.claims[uid].error, "", "prepare failed");
            let t = Instant::now();
            dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![c] })
                .await
                .expect("unprepare");
            unprepare.push(t.elapsed());
            let id = format!("direct-{i}");
            let t = Instant::now();
            agent.claim(&id, annotations.clone()).await.expect("claim");
            claim.push(t.elapsed());
            let t = Instant::now();
            agent.release(&id).await.expect("release");
            release.push(t.elapsed());
        }
    });
    let _ = plugin.kill();
    let _ = plugin.wait();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (name, v) in [
        ("prepare", &mut prepare),
        ("unprepare", &mut unprepare),
        ("claim", &mut claim),
        ("release", &mut release),
    ] {
        let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
        println!(
            "bench=dra_prepare rounds={n} op={name} p50_ms={:.3} p99_ms={:.3}",
            ms(p50),
            ms(p99)
        );
    }
    println!(
        "bench=dra_prepare prepare_over_claim_p50={:.2}",
        ms(percentile(&mut prepare, 0.5)) / ms(percentile(&mut claim, 0.5))
    );
}
