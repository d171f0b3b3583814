//! An engine that can only run hooks: plain runc with gpuslice-hook as prestart and poststop
//! hooks (CRI-O's hooks.d files), no wrapper and no spec edit. The prestart hook injects the
//! slice into the container's mount namespace, opens its cgroup v1 device controller to the
//! GPU and reports the container's pid.

mod common;

use std::time::Duration;

use common::{CHECKS, Node, text};
use gpuslice_testsupport::{binary, wait_for};

#[test]
fn runc_with_only_the_hooks_gets_the_slice_injected_at_prestart() {
    let node = Node::new();
    let bundle = node.bundle(
        "hooked",
        &["/bin/sleep", "60"],
        &[("gpuslice.io/memory", "2Gi")],
    );
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let env: Vec<String> = node.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
    let hook = |verb: &str| serde_json::json!({"path": binary("gpuslice-hook"), "args": ["gpuslice-hook", verb], "env": env});
    spec["hooks"] = serde_json::json!({
        "prestart": [hook("prestart")],
        "poststop": [hook("poststop")],
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let b = bundle.display().to_string();

    let out = node.runc(&["create", "--bundle", &b, "hooked1"]);
    assert!(out.status.success(), "create failed: {}", text(&out));
    // The prestart hook reported the pid before the container's program runs.
    assert!(
        matches!(
            node.status().slices[0].claim.state,
            gpuslice_core::ClaimState::Active {
                cgroups: Some(_),
                ..
            }
        ),
        "{:?}",
        node.status().slices
    );
    let out = node.runc(&["start", "hooked1"]);
    assert!(out.status.success(), "start failed: {}", text(&out));
    let s = node.status();
    assert_eq!(s.slices.len(), 1);
    assert!(matches!(
        s.slices[0].claim.state,
        gpuslice_core::ClaimState::Active { .. }
    ));

    let out = node.runc(&["exec", "hooked1", "/bin/sh", "-c", CHECKS]);
    common::assert_gpu_checks(&text(&out));

    assert!(node.runc(&["kill", "hooked1", "KILL"]).status.success());
    assert!(wait_for(Duration::from_secs(10), || text(
        &node.runc(&["state", "hooked1"])
    )
    .contains("\"stopped\"")));
    assert!(node.runc(&["delete", "hooked1"]).status.success());
    assert!(
        node.status().slices.is_empty(),
        "poststop did not release the claim"
    );
}

#[test]
fn a_bad_request_at_prestart_stops_the_container_with_the_reason() {
    let node = Node::new();
    let bundle = node.bundle("hookbad", &["/bin/true"], &[("gpuslice.io/gpus", "9")]);
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let env: Vec<String> = node.env().iter().map(|(k, v)| format!("{k}={v}")).collect();
    spec["hooks"] = serde_json::json!({"prestart": [{"path": binary("gpuslice-hook"), "args": ["gpuslice-hook", "prestart"], "env": env}]});
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let b = bundle.display().to_string();
    let out = node.runc(&["run", "--bundle", &b, "hookbad1"]);
    assert!(!out.status.success(), "a container without its slice ran");
    let t = text(&out);
    // runc quotes the hook's stderr, escaping its quotes.
    assert!(
        t.contains(r#"annotation gpuslice.io/gpus=\"9\""#) && t.contains("this node has 2 GPU(s)"),
        "{t}"
    );
    assert!(node.status().slices.is_empty());
}
