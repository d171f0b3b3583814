//! The Kubernetes manifests in packaging/kubernetes, read as the API server would read them
//! (typed with k8s-openapi), and checked against the binaries and each other: every flag they
//! pass exists, the extender's verbs and port are the ones it serves, the resources named are
//! the ones the agent advertises, and the example pod asks for what its comment says. No
//! cluster is at hand here, so this is as far as they are tested.

use std::path::PathBuf;
use std::process::Command;

use gpuslice_core::resources;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use serde::Deserialize;
use serde_json::Value;

fn documents(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn kind<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

/// `--flag` of each `--flag=value` argument, and the subcommand if any.
fn flags(args: &[String]) -> Vec<&str> {
    args.iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a))
        .collect()
}

fn help(binary: &str, args: &[&str]) -> String {
    let out = Command::new(gpuslice_testsupport::binary(binary))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn may(role: &ClusterRole, verb: &str, resource: &str) -> bool {
    role.rules.iter().flatten().any(|r| {
        r.resources.iter().flatten().any(|x| x == resource) && r.verbs.iter().any(|v| v == verb)
    })
}

fn can_patch(role: &ClusterRole, resource: &str) -> bool {
    may(role, "patch", resource)
}

#[test]
fn the_agent_daemonset_passes_flags_the_agent_has_and_may_write_what_it_publishes() {
    let docs = documents("gpuslice-agent.yaml");
    let ds: DaemonSet = kind(&docs, "DaemonSet");
    let pod = ds.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    let help = help("gpuslice-agent", &[]);
    for f in flags(&args) {
        assert!(
            help.contains(&format!("--{f}")),
            "gpuslice-agent has no --{f}"
        );
    }
    assert!(args.iter().any(|a| a == "--publish-node"));
    let role: ClusterRole = kind(&docs, "ClusterRole");
    assert!(can_patch(&role, "nodes"), "the annotation");
    assert!(can_patch(&role, "nodes/status"), "the extended resources");
    let key_volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.secret.is_some());
    assert_eq!(
        key_volume.unwrap().secret.unwrap().secret_name.as_deref(),
        Some("gpuslice-assignment-key")
    );
}

#[test]
fn the_extender_stanza_names_the_verbs_port_and_resources_the_extender_serves() {
    let docs = documents("kube-scheduler-config.yaml");
    let cfg = &docs[0];
    assert_eq!(cfg["kind"], "KubeSchedulerConfiguration");
    assert_eq!(cfg["percentageOfNodesToScore"], 100);
    let ext = &cfg["extenders"][0];
    assert_eq!(
        (&ext["filterVerb"], &ext["prioritizeVerb"], &ext["bindVerb"]),
        (
            &Value::from("filter"),
            &Value::from("prioritize"),
            &Value::from("bind")
        )
    );
    assert_eq!(ext["nodeCacheCapable"], true);
    let managed: Vec<&str> = ext["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(managed, [resources::GPU_MEMORY, resources::GPU_CORES]);

    let docs = documents("gpuslice-scheduler.yaml");
    let service: Service = kind(&docs, "Service");
    let port = service.spec.unwrap().ports.unwrap()[0].port;
    assert_eq!(
        ext["urlPrefix"],
        format!("http://gpuslice-scheduler.kube-system.svc:{port}")
    );
    let deployment: Deployment = kind(&docs, "Deployment");
    let args = deployment.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(args[0], "serve");
    assert!(args.contains(&format!("--listen=0.0.0.0:{port}")));
    let help = help("gpuslice-scheduler", &["serve"]);
    for f in flags(&args) {
        assert!(help.contains(&format!("--{f}")), "serve has no --{f}");
    }
    let role: ClusterRole = kind(&docs, "ClusterRole");
    assert!(can_patch(&role, "pods"), "bind writes the assignment");
    assert!(
        can_patch(&role, "nodes"),
        "bind records its placements on the Node"
    );
    assert!(may(&role, "get", "pods"), "bind reads the pod");
    assert!(may(&role, "create", "pods/binding"), "bind binds");
    assert!(may(&role, "list", "pods"), "the mix is learned at start");
    assert!(
        may(&role, "watch", "pods"),
        "placements of deleted pods are given back"
    );
    for verb in ["get", "list", "watch"] {
        assert!(may(&role, verb, "nodes"), "the node cache: {verb}");
    }
}

#[test]
fn the_key_secret_placeholder_is_refused_until_replaced() {
    let docs = documents("gpuslice-assignment-key.yaml");
    let secret: Secret = kind(&docs, "Secret");
    let placeholder = &secret.string_data.unwrap()["key"];
    let e = gpuslice_core::assignment::key_from_file(placeholder.clone().into_bytes(), "key")
        .unwrap_err();
    assert!(e.contains("at least 32 are needed"), "{e}");
}

#[test]
fn the_example_pod_asks_one_slice_for_its_model_and_nothing_for_its_sidecar() {
    let docs = documents("example-pod.yaml");
    let pod: Pod = kind(&docs, "Pod");
    let json = serde_json::to_value(&pod).unwrap();
    let slices = gpuslice_scheduler::extender::pod_slices(&json).unwrap();
    assert_eq!(slices.containers.len(), 1);
    assert_eq!(slices.policy, Some("binpack".parse().unwrap()));
    let model = &slices.containers[0];
    assert_eq!(model.name, "model");
    assert_eq!(model.demand.shape.memory.bytes_of(u64::MAX), 4 << 30);
    assert_eq!(model.demand.shape.cores, 30);
    let written = slices.annotations_to_write();
    assert_eq!(
        written["gpuslice.io/model.memory"],
        (4u64 << 30).to_string()
    );
}

#[test]
fn the_service_monitors_scrape_the_ports_where_the_agent_and_the_extender_serve_metrics() {
    let monitors = documents("monitoring.yaml");
    for (file, workload, name) in [
        ("gpuslice-agent.yaml", "DaemonSet", "gpuslice-agent"),
        (
            "gpuslice-scheduler.yaml",
            "Deployment",
            "gpuslice-scheduler",
        ),
    ] {
        let monitor = monitors
            .iter()
            .find(|d| d["kind"] == "ServiceMonitor" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ServiceMonitor {name}"));
        let docs = documents(file);
        let wanted = monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap();
        // The Service the monitor selects, in the monitor's namespace.
        let service = docs
            .iter()
            .filter(|d| d["kind"] == "Service")
            .find(|d| {
                d["metadata"]["namespace"] == monitor["metadata"]["namespace"]
                    && wanted.iter().all(|(k, v)| &d["metadata"]["labels"][k] == v)
            })
            .unwrap_or_else(|| panic!("{name}: no Service has the labels {wanted:?}"));
        let service: Service = serde_json::from_value(service.clone()).unwrap();
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(endpoint["path"], "/metrics");
        let port = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| Some(p.name.as_deref().unwrap_or("")) == endpoint["port"].as_str())
            })
            .unwrap_or_else(|| panic!("{name}: the Service has no port {}", endpoint["port"]));
        // The port it forwards to is a port of the workload's container, which listens there.
        let target = match &port.target_port {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => s.clone(),
            other => panic!("{name}: targetPort {other:?} names no container port"),
        };
        let doc = docs.iter().find(|d| d["kind"] == workload).unwrap();
        let container = &doc["spec"]["template"]["spec"]["containers"][0];
        let number = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == target.as_str())
            .unwrap_or_else(|| panic!("{name}: no container port {target}"))["containerPort"]
            .as_u64()
            .unwrap();
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let listens = if workload == "DaemonSet" {
            format!("--metrics-address=0.0.0.0:{number}")
        } else {
            format!("--listen=0.0.0.0:{number}")
        };
        assert!(args.contains(&listens.as_str()), "{name}: {args:?}");
        // And the pods the Service selects are the workload's.
        let selector = service.spec.unwrap().selector.unwrap();
        for (k, v) in selector {
            assert_eq!(
                doc["spec"]["template"]["metadata"]["labels"][&k],
                v.as_str()
            );
        }
    }
}
