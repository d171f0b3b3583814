use super::*;
use crate::driver::{BindMount, DeviceNode};
use crate::edits::{Hook, HookPoint};

fn edits() -> Edits {
    Edits {
        devices: vec![
            DeviceNode {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
                mode: 0o666,
            },
            DeviceNode {
                path: "/dev/nvidia1".into(),
                major: 195,
                minor: 1,
                mode: 0o666,
            },
        ],
        mounts: vec![BindMount {
            source: "/run/gpuslice/c1".into(),
            destination: "/run/gpuslice".into(),
            read_only: false,
            noexec: false,
        }],
        hooks: vec![Hook {
            point: HookPoint::Poststop,
            path: "/usr/bin/gpuslice-hook".into(),
            args: vec!["gpuslice-hook".into(), "poststop".into()],
            env: vec!["GPUSLICE_BUS_ADDRESS=unix:path=/run/bus".into()],
            timeout_seconds: None,
        }],
        masked_paths: vec!["/proc/driver/nvidia/gpus/0000:17:00.0".into()],
        env: vec!["NVIDIA_VISIBLE_DEVICES=GPU-1".into()],
    }
}

fn base() -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "x-vendor-field": {"kept": true}},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": "pid"}], "resources": {"devices": [{"allow": false, "access": "rwm"}]}},
        "annotations": {"gpuslice.io/memory": "2Gi"},
        "unknownTopLevel": [1, 2, 3]
    })
}

#[test]
fn applying_edits_adds_devices_rules_mounts_and_hooks_and_keeps_unknown_fields() {
    let mut spec = base();
    apply(&mut spec, &edits()).unwrap();
    assert_eq!(spec["unknownTopLevel"], json!([1, 2, 3]));
    assert_eq!(spec["process"]["x-vendor-field"], json!({"kept": true}));
    assert_eq!(spec["linux"]["devices"][1]["path"], "/dev/nvidia1");
    assert_eq!(spec["linux"]["devices"][1]["fileMode"], json!(0o020_666));
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(
        rules[0],
        json!({"allow": false, "access": "rwm"}),
        "the deny-all rule stays first"
    );
    assert_eq!(
        rules[2],
        json!({"allow": true, "type": "c", "major": 195, "minor": 1, "access": "rwm"})
    );
    assert_eq!(spec["mounts"][0]["destination"], "/proc");
    assert_eq!(
        spec["mounts"][1]["options"],
        json!(["rbind", "rprivate", "nosuid", "nodev", "rw"])
    );
    assert_eq!(
        spec["hooks"]["poststop"][0]["args"],
        json!(["gpuslice-hook", "poststop"])
    );
}

#[test]
fn applying_edits_twice_equals_applying_once() {
    let mut once = base();
    apply(&mut once, &edits()).unwrap();
    let mut twice = once.clone();
    apply(&mut twice, &edits()).unwrap();
    assert_eq!(once, twice);
}

#[test]
fn a_spec_with_null_or_missing_sections_is_filled_in() {
    let mut spec = json!({"ociVersion": "1.0.2", "linux": {"resources": null}, "hooks": null});
    apply(&mut spec, &edits()).unwrap();
    assert_eq!(
        spec["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(spec["hooks"]["poststop"].as_array().unwrap().len(), 1);
}

#[test]
fn a_spec_whose_sections_have_the_wrong_type_is_refused() {
    let mut spec = json!({"linux": {"devices": "nope"}});
    assert!(matches!(
        apply(&mut spec, &edits()),
        Err(SpecError::NotArray("devices"))
    ));
}

#[test]
fn annotations_are_read_as_strings() {
    assert_eq!(
        annotations(&base())
            .get("gpuslice.io/memory")
            .map(String::as_str),
        Some("2Gi")
    );
    assert!(annotations(&json!({})).is_empty());
}

#[test]
fn a_spec_with_cap_sys_admin_or_every_device_allowed_is_privileged() {
    let plain = json!({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}},
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]}}});
    assert_eq!(privileged(&plain), None);
    let admin = json!({"process": {"capabilities": {"effective": ["CAP_SYS_ADMIN"]}}});
    assert_eq!(privileged(&admin).as_deref(), Some("it has CAP_SYS_ADMIN"));
    let devices = json!({"linux": {"resources": {"devices": [{"allow": true, "access": "rwm"}]}}});
    assert_eq!(
        privileged(&devices).as_deref(),
        Some("its device cgroup allows every device")
    );
}

#[test]
fn the_environment_entry_replaces_the_images_and_other_gpus_are_masked() {
    let mut spec = base();
    spec["process"]["env"] = json!([
        "PATH=/bin",
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_VISIBLE_DEVICES_X=1"
    ]);
    spec["linux"] = json!({"maskedPaths": ["/proc/kcore"]});
    apply(&mut spec, &edits()).unwrap();
    assert_eq!(
        spec["process"]["env"],
        json!([
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES_X=1",
            "NVIDIA_VISIBLE_DEVICES=GPU-1"
        ])
    );
    assert_eq!(
        spec["linux"]["maskedPaths"],
        json!(["/proc/kcore", "/proc/driver/nvidia/gpus/0000:17:00.0"])
    );
    let once = spec.clone();
    apply(&mut spec, &edits()).unwrap();
    assert_eq!(spec, once);
}

#[test]
fn the_slices_given_are_the_directories_mounted_right_under_the_run_directory() {
    let mut spec = base();
    spec["mounts"] = json!([
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/run/gpuslice/web-1", "source": "/run/gpuslice/web-1"},
        {"destination": "/run/gpuslice/web-1/usage", "source": "/run/gpuslice/web-1/usage"},
        {"destination": "/run/gpuslice/dra-x-0", "source": "/run/gpuslice/dra-x-0"},
        {"destination": "/run/gpuslice-other", "source": "/tmp"}
    ]);
    assert_eq!(slices_given(&spec), ["web-1", "dra-x-0"]);
    // The wrapper's own mount at /run/gpuslice is not a device's.
    apply(&mut spec, &edits()).unwrap();
    assert_eq!(slices_given(&spec), ["web-1", "dra-x-0"]);
    assert!(slices_given(&base()).is_empty());
}
