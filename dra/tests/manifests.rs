//! packaging/kubernetes/dra (as kustomize renders it) and the example claim and pod read as
//! the API server would read them (typed with
//! k8s-openapi), and checked against the plugin: the flags it passes exist, the RBAC allows
//! every call the plugin makes, the example claim asks for capacities in the plugin's request
//! policy and selects by attributes the plugin publishes. No cluster is at hand here, so this
//! is as far as the manifests are tested.

use std::process::Command;

use gpuslice_core::inventory::{GpuInfo, Inventory};
use gpuslice_testsupport::manifests::{self, kind, named};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use serde_json::Value;

/// The DRA overlay as kustomize renders it, and the example claim and pod.
fn documents() -> Vec<Value> {
    let mut docs = manifests::render("dra");
    docs.extend(manifests::file("examples/dra-pod.yaml"));
    docs
}

#[test]
fn the_plugins_daemonset_passes_flags_it_has_and_mounts_where_the_kubelet_looks() {
    let docs = documents();
    let ds: DaemonSet = named(&docs, "DaemonSet", "gpuslice-dra-plugin");
    let pod = ds.spec.template.spec.unwrap();
    let c = &pod.containers[0];
    let help = Command::new(gpuslice_testsupport::binary("gpuslice-dra-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for a in c.args.iter().flatten() {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(flag),
            "{flag} is not a flag of gpuslice-dra-plugin"
        );
    }
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    for path in [
        "/var/lib/kubelet/plugins/gpuslice.io",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/run/dbus",
        "/host",
    ] {
        assert!(mounts.contains(&path), "{path} not mounted: {mounts:?}");
        assert!(
            path == "/host" || help.contains(path) || path == "/run/dbus",
            "{path} is not where the plugin looks"
        );
    }
    // The runtime configuration it is given points under the host root it names.
    let env: std::collections::HashMap<String, String> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    let mut cfg = gpuslice_runtime_shim::config::Config::default();
    cfg.apply_env(|k| env.get(k).cloned());
    for p in [
        &cfg.driver_root,
        &cfg.run_dir,
        &cfg.interception_library,
        &cfg.hook,
    ] {
        assert!(
            p.starts_with("/host"),
            "{} is not under --host-root=/host",
            p.display()
        );
    }
    // ... where the DaemonSet's installer puts the library and the hook.
    let install_help = Command::new(gpuslice_testsupport::binary("gpuslice-install"))
        .args(["install", "--help"])
        .output()
        .unwrap();
    let install_help = String::from_utf8(install_help.stdout).unwrap();
    let prefix = install_help
        .split("--prefix <PREFIX>")
        .nth(1)
        .and_then(|rest| rest.split("[default: ").nth(1))
        .and_then(|rest| rest.split(']').next())
        .expect("gpuslice-install's default --prefix");
    let host = std::path::Path::new("/host").join(prefix.trim_start_matches('/'));
    assert_eq!(cfg.interception_library, host.join("lib/libgpuslice.so"));
    assert_eq!(cfg.hook, host.join("bin/gpuslice-hook"));
}

#[test]
fn the_plugins_role_allows_every_call_it_makes() {
    let role: ClusterRole = named(&documents(), "ClusterRole", "gpuslice-dra-plugin");
    let may_in = |group: &str, verb: &str, resource: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    let may = |verb: &str, resource: &str| may_in("resource.k8s.io", verb, resource);
    assert!(may("get", "resourceclaims") && may("list", "resourceclaims"));
    assert!(may_in("", "get", "namespaces"), "get namespaces");
    for verb in ["get", "create", "update"] {
        assert!(may(verb, "resourceslices"), "{verb} resourceslices");
    }
}

#[test]
fn the_example_claim_asks_within_the_request_policy_by_attributes_the_plugin_publishes() {
    let docs = documents();
    let class: DeviceClass = kind(&docs, "DeviceClass");
    let template: ResourceClaimTemplate = kind(&docs, "ResourceClaimTemplate");
    let pod: Pod = kind(&docs, "Pod");
    let class_cel = &class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    assert_eq!(
        class_cel,
        &format!("device.driver == \"{}\"", gpuslice_dra::DRIVER)
    );

    let request = &template
        .spec
        .as_ref()
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()[0];
    let exactly = request.exactly.as_ref().unwrap();
    assert_eq!(
        exactly.device_class_name,
        class.metadata.name.clone().unwrap()
    );
    let requests = exactly
        .capacity
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    let memory = gpuslice_core::quantity::parse_memory(&requests["memory"].0).unwrap();
    let bytes = memory.bytes_of(16 << 30);
    assert_eq!(
        bytes % gpuslice_dra::publish::MEMORY_STEP_BYTES,
        0,
        "a multiple of the step"
    );
    let cores: u32 = requests["cores"].0.parse().unwrap();
    assert!(cores <= 100);

    // Every attribute and capacity the selector names is one the plugin publishes.
    let inventory = Inventory {
        driver_version: "550.54.15".into(),
        cuda_driver_version: Some(12040),
        gpus: vec![GpuInfo {
            index: 0,
            uuid: "GPU-1".into(),
            name: "Tesla T4".into(),
            memory_total_bytes: 16 << 30,
            memory_reserved_bytes: 0,
            minor: 0,
            pci_bus_id: "00000000:17:00.0".into(),
            numa_node: Some(0),
            compute_capability: None,
            brand: None,
        }],
        topology: None,
    };
    let slice = gpuslice_dra::publish::resource_slice("n", &inventory, 1);
    let device = &slice.spec.devices.unwrap()[0];
    let cel = &exactly.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    for (prefix, names) in [
        (
            "device.attributes[\"gpuslice.io\"].",
            device
                .attributes
                .as_ref()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>(),
        ),
        (
            "device.capacity[\"gpuslice.io\"].",
            device.capacity.as_ref().unwrap().keys().cloned().collect(),
        ),
    ] {
        for used in cel.split(prefix).skip(1) {
            let name: String = used
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(
                names.contains(&name),
                "{prefix}{name} is not published: {names:?}"
            );
        }
    }
    let spec = pod.spec.unwrap();
    let claims = spec.resource_claims.unwrap();
    assert_eq!(
        claims[0].resource_claim_template_name.as_deref(),
        template.metadata.name.as_deref()
    );
    let used = &spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .claims
        .as_ref()
        .unwrap()[0]
        .name;
    assert_eq!(used, &claims[0].name);
}
