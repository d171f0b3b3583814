//! The Kubernetes manifests in packaging/kubernetes as kustomize renders its overlays, read as
//! the API server would read them (typed with k8s-openapi), validated against the Kubernetes
//! API's own schemas for each supported version (kubernetes-validate), and checked against the
//! binaries and each other: every flag they pass exists, the extender's verbs and port are the
//! ones it serves, the resources named are the ones the agent advertises, and the example pod
//! asks for what its comment says. No cluster is at hand here, so this is as far as they are
//! tested.

use std::process::Command;

use gpuslice_core::resources;
use gpuslice_testsupport::manifests::{self, file, named, render};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use serde_json::Value;

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

/// The container `name` of a DaemonSet.
fn container(ds: &DaemonSet, name: &str) -> k8s_openapi::api::core::v1::Container {
    let pod = ds.spec.template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
        .clone()
}

#[test]
fn the_agent_daemonset_passes_flags_the_agent_has_and_may_write_what_it_publishes() {
    let docs = render("extender");
    let ds: DaemonSet = named(&docs, "DaemonSet", "gpuslice-agent");
    let agent = container(&ds, "agent");
    let args = agent.args.clone().unwrap();
    assert_eq!(
        agent.command.as_deref(),
        Some(&["gpuslice-agent".to_string()][..])
    );
    let help = help("gpuslice-agent", &[]);
    for f in flags(&args) {
        assert!(
            help.contains(&format!("--{f}")),
            "gpuslice-agent has no --{f}"
        );
    }
    assert!(args.iter().any(|a| a == "--publish-node"));
    assert!(
        args.iter()
            .any(|a| a == "--assignment-key=/etc/gpuslice/assignment/key")
    );
    let role: ClusterRole = named(&docs, "ClusterRole", "gpuslice-agent");
    assert!(can_patch(&role, "nodes"), "the annotation");
    assert!(can_patch(&role, "nodes/status"), "the extended resources");
    assert!(args.iter().any(|a| a == "--kube-events"));
    let events = |verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == "events.k8s.io")
                && r.resources.iter().flatten().any(|x| x == "events")
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    assert!(
        events("create") && events("patch"),
        "Events and their series"
    );
    let pod = ds.spec.template.spec.unwrap();
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
fn the_installer_container_runs_the_installer_with_flags_it_has_and_the_hosts_root_writable() {
    for overlay in ["extender", "dra"] {
        let docs = render(overlay);
        let ds: DaemonSet = named(&docs, "DaemonSet", "gpuslice-agent");
        let installer = container(&ds, "installer");
        assert_eq!(
            installer.command.as_deref(),
            Some(&["gpuslice-install".to_string()][..])
        );
        let args = installer.args.clone().unwrap();
        assert_eq!(
            args[0], "run",
            "{overlay}: the installer must stay to take it all off"
        );
        let help = help("gpuslice-install", &["run"]);
        for f in flags(&args) {
            assert!(
                help.contains(&format!("--{f}")),
                "gpuslice-install run has no --{f}"
            );
        }
        let mount = installer
            .volume_mounts
            .unwrap()
            .into_iter()
            .find(|m| m.mount_path == "/host")
            .expect("the host's root at /host");
        assert_ne!(
            mount.read_only,
            Some(true),
            "{overlay}: the installer writes the host"
        );
        assert_eq!(
            installer.image,
            container(&ds, "agent").image,
            "one node image"
        );
        assert!(
            installer
                .security_context
                .unwrap()
                .privileged
                .unwrap_or(false)
        );
    }
}

#[test]
fn without_the_extender_the_agent_neither_publishes_nor_needs_the_assignment_key() {
    let docs = render("dra");
    let ds: DaemonSet = named(&docs, "DaemonSet", "gpuslice-agent");
    let args = container(&ds, "agent").args.unwrap();
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--publish-node") || a.starts_with("--assignment-key")),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a == "--kube-events"), "{args:?}");
}

#[test]
fn no_overlay_carries_a_secret_that_applying_it_again_would_put_over_the_real_key() {
    for overlay in ["extender", "dra", "monitoring"] {
        let secrets: Vec<_> = render(overlay)
            .into_iter()
            .filter(|d| d["kind"] == "Secret")
            .collect();
        assert!(secrets.is_empty(), "{overlay}: {secrets:?}");
    }
}

#[test]
fn in_every_overlay_the_agents_metrics_answer_only_the_certificate_prometheus_scrapes_with() {
    // The ServiceMonitor scrapes over HTTPS, trusting the CA of the agents' Secret for the
    // Service's name, and presents the scraper's client certificate.
    let monitors = render("monitoring");
    let monitor = monitors
        .iter()
        .find(|d| d["kind"] == "ServiceMonitor" && d["metadata"]["name"] == "gpuslice-agent")
        .unwrap();
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    let tls = &endpoint["tlsConfig"];
    let agents_secret = tls["ca"]["secret"]["name"].as_str().unwrap();
    assert_eq!(tls["ca"]["secret"]["key"], "ca.crt");
    assert_eq!(tls["serverName"], "gpuslice-agent-metrics.kube-system.svc");
    let scraper = tls["cert"]["secret"]["name"].as_str().unwrap();
    assert_eq!(tls["keySecret"]["name"], scraper);
    assert_ne!(
        scraper, agents_secret,
        "the agents need not hold the scraper's key"
    );
    for overlay in ["extender", "dra"] {
        let docs = render(overlay);
        let ds: DaemonSet = named(&docs, "DaemonSet", "gpuslice-agent");
        let agent = container(&ds, "agent");
        let args = agent.args.clone().unwrap();
        let value = |flag: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{flag}=")))
                .unwrap_or_else(|| panic!("{overlay}: the agent runs without {flag}: {args:?}"))
        };
        assert_eq!(value("--metrics-client-allowed-names"), "prometheus");
        // Each file is in the mount of the agents' Secret, under the key the monitor reads.
        let mounts = agent.volume_mounts.clone().unwrap_or_default();
        let volumes = ds
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .clone()
            .unwrap();
        for (flag, key) in [
            ("--metrics-tls-cert-file", "tls.crt"),
            ("--metrics-tls-private-key-file", "tls.key"),
            ("--metrics-client-ca-file", "ca.crt"),
        ] {
            let path = std::path::Path::new(value(flag));
            assert_eq!(path.file_name().unwrap(), key, "{overlay}: {flag}");
            let mount = mounts
                .iter()
                .find(|m| path.parent() == Some(std::path::Path::new(&m.mount_path)))
                .unwrap_or_else(|| panic!("{overlay}: nothing mounted where {flag} reads"));
            let volume = volumes.iter().find(|v| v.name == mount.name).unwrap();
            assert_eq!(
                volume
                    .secret
                    .as_ref()
                    .and_then(|s| s.secret_name.as_deref()),
                Some(agents_secret),
                "{overlay}: {flag}"
            );
        }
    }
}

#[test]
fn the_extender_stanza_names_the_verbs_port_and_resources_the_extender_serves() {
    let docs = render("extender");
    let map: k8s_openapi::api::core::v1::ConfigMap =
        named(&docs, "ConfigMap", "gpuslice-kube-scheduler-config");
    let text = &map.data.unwrap()["kube-scheduler-config.yaml"];
    let cfg = &manifests::parse(text, "kube-scheduler-config.yaml")[0];
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

    let service: Service = named(&docs, "Service", "gpuslice-scheduler");
    let port = service.spec.unwrap().ports.unwrap()[0].port;
    assert_eq!(
        ext["urlPrefix"],
        format!("https://gpuslice-scheduler.kube-system.svc:{port}")
    );
    // kube-scheduler presents the client certificate bind answers.
    assert_eq!(ext["enableHTTPS"], true);
    for file in ["certFile", "keyFile", "caFile"] {
        assert!(
            ext["tlsConfig"][file].is_string(),
            "tlsConfig has no {file}"
        );
    }
    let deployment: Deployment = named(&docs, "Deployment", "gpuslice-scheduler");
    let args = deployment.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert_eq!(args[0], "serve");
    assert!(args.contains(&format!("--listen=0.0.0.0:{port}")));
    // Reachable from other pods: bind is served only with kube-scheduler's client CA.
    for flag in [
        "--tls-cert-file",
        "--tls-private-key-file",
        "--client-ca-file",
    ] {
        assert!(
            args.iter().any(|a| a.starts_with(&format!("{flag}="))),
            "serve without {flag}: {args:?}"
        );
    }
    let help = help("gpuslice-scheduler", &["serve"]);
    for f in flags(&args) {
        assert!(help.contains(&format!("--{f}")), "serve has no --{f}");
    }
    let role: ClusterRole = named(&docs, "ClusterRole", "gpuslice-scheduler");
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
    let docs = file("examples/assignment-key.yaml");
    let secret: Secret = named(&docs, "Secret", "gpuslice-assignment-key");
    let placeholder = &secret.string_data.unwrap()["key"];
    let e = gpuslice_core::assignment::key_from_file(placeholder.clone().into_bytes(), "key")
        .unwrap_err();
    assert!(e.contains("at least 32 are needed"), "{e}");
}

#[test]
fn the_example_pod_asks_one_slice_for_its_model_and_nothing_for_its_sidecar() {
    let docs = file("examples/pod.yaml");
    let pod: Pod = manifests::kind(&docs, "Pod");
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
    let monitors = render("monitoring");
    let docs = render("extender");
    for (workload, name) in [
        ("DaemonSet", "gpuslice-agent"),
        ("Deployment", "gpuslice-scheduler"),
    ] {
        let monitor = monitors
            .iter()
            .find(|d| d["kind"] == "ServiceMonitor" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no ServiceMonitor {name}"));
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
        let doc = docs
            .iter()
            .find(|d| d["kind"] == workload && d["metadata"]["name"] == name)
            .unwrap();
        let port_named = |c: &Value| {
            c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == target.as_str())
                .cloned()
        };
        let container = doc["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| port_named(c).is_some())
            .unwrap_or_else(|| panic!("{name}: no container port {target}"));
        let number = port_named(container).unwrap()["containerPort"]
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

/// The Kubernetes versions the extender overlay is validated for; DRA's need resource.k8s.io/v1
/// (1.34 and later).
const EXTENDER_VERSIONS: &[&str] = &["1.32.0", "1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"];
const DRA_VERSIONS: &[&str] = &["1.34.0", "1.35.0", "1.36.0", "1.37.0"];
/// Kinds of other projects' APIs, which the Kubernetes schemas do not hold: the Prometheus
/// Operator's. They are checked against the binaries above instead.
const FOREIGN_KINDS: &[&str] = &["ServiceMonitor"];

/// kubernetes-validate in strict mode (unknown fields are errors) on `files` for `version`:
/// its complaints, and whether it passed them.
fn validate(files: &[std::path::PathBuf], version: &str) -> (bool, Vec<String>) {
    let out = Command::new(manifests::dir().join("../../scripts/kubernetes-validate"))
        .args(["--strict", "--quiet", "-k", version])
        .args(files)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.success(),
        said.lines().map(str::to_owned).collect(),
    )
}

#[test]
fn every_overlay_and_example_is_valid_for_the_kubernetes_api_of_each_supported_version() {
    let dir = tempfile::tempdir().unwrap();
    let rendered = |name: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, manifests::render_text(name)).unwrap();
        path
    };
    let (extender, dra, monitoring) = (
        rendered("extender"),
        rendered("dra"),
        rendered("monitoring"),
    );
    let example = |name: &str| manifests::dir().join("examples").join(name);
    let sets = [
        (
            vec![
                extender,
                monitoring,
                example("pod.yaml"),
                example("assignment-key.yaml"),
            ],
            EXTENDER_VERSIONS,
        ),
        (vec![dra, example("dra-pod.yaml")], DRA_VERSIONS),
    ];
    for (files, versions) in sets {
        for version in versions {
            let (passed, said) = validate(&files, version);
            let complaints: Vec<_> = said
                .iter()
                .filter(|l| {
                    !FOREIGN_KINDS
                        .iter()
                        .any(|k| l.contains(&format!("schema for kind {k} ")))
                })
                .collect();
            assert!(
                passed && complaints.is_empty(),
                "Kubernetes {version}: {said:#?}"
            );
        }
    }
}

#[test]
fn the_schema_check_fails_a_manifest_with_a_field_the_kubernetes_api_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let text = manifests::render_text("extender");
    let broken = text.replacen("hostPID: true", "hostPID: true\n      hostPIDs: true", 1);
    assert_ne!(broken, text);
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, broken).unwrap();
    let (passed, said) = validate(&[path], "1.34.0");
    assert!(!passed, "{said:#?}");
    assert!(
        said.iter().any(|l| l.contains("'hostPIDs' was unexpected")),
        "{said:#?}"
    );
}
