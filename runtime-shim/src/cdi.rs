//! CDI (Container Device Interface) specs for what a gpuslice container gets, for engines
//! that read them (podman, containerd and CRI-O with CDI enabled, the DRA path):
//!
//! - `gpuslice.io/gpu`: the node's whole GPUs, by index and UUID, and `all`
//!   ([`whole_gpus`]). Each device carries a `createRuntime` hook that claims its GPU whole
//!   through the agent, so a whole GPU is never handed out beside slices, and a `poststop`
//!   hook that gives it back.
//! - `gpuslice.io/slice`: one device per claim the agent admitted ([`slice`]), with exactly
//!   the edits the runtime wrapper makes (the limits directory, the fronts, the interception
//!   library), written beside the others in `/var/run/cdi` and removed when the claim is
//!   released.
//! - `gpuslice.io/admin`: GPUs a DRA request allocated for administrative access ([`admin`]),
//!   written and removed by the DRA plugin: no claim, no hook, no wall.
//!
//! The spec's `cdiVersion` is the lowest that has every field used, as the CDI library
//! computes it, so that older engines (podman 4.3, whose CDI library predates the later
//! versions) read them.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::driver::DriverFiles;
use crate::edits::{CONTAINER_RUN_DIR, Edits, HookPoint};

/// The vendor part of every gpuslice CDI kind.
pub const VENDOR: &str = "gpuslice.io";
/// Whole GPUs.
pub const GPU_KIND: &str = "gpuslice.io/gpu";
/// Slices the agent admitted.
pub const SLICE_KIND: &str = gpuslice_core::layout::CDI_SLICE_KIND;
/// GPUs given for administrative access (a DRA request with `adminAccess`): whole, beside
/// whatever holds them, outside every wall.
pub const ADMIN_KIND: &str = "gpuslice.io/admin";
/// Where specs that describe the node are kept.
pub const STATIC_DIR: &str = "/etc/cdi";
/// Where specs that last as long as a claim are written.
pub const DYNAMIC_DIR: &str = "/var/run/cdi";

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The CDI `containerEdits` of `edits`. Device nodes name their node under `driver_root`
/// (`hostPath`) when that is not `/`. Masked paths have no CDI field and are left out.
#[must_use]
pub fn container_edits(edits: &Edits, driver_root: &Path) -> Value {
    let device_nodes: Vec<Value> = edits
        .devices
        .iter()
        .map(|d| {
            let mut node = json!({
                "path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                "fileMode": d.mode, "permissions": "rwm", "uid": 0, "gid": 0
            });
            if driver_root != Path::new("/") {
                node["hostPath"] = json!(driver_root.join(d.path.trim_start_matches('/')));
            }
            node
        })
        .collect();
    let mounts: Vec<Value> = edits
        .mounts
        .iter()
        .map(|m| {
            let mut options = vec![if m.read_only { "ro" } else { "rw" }, "nosuid", "nodev"];
            if m.noexec {
                options.push("noexec");
            }
            options.extend(["rbind", "rprivate"]);
            json!({"hostPath": m.source, "containerPath": m.destination, "options": options})
        })
        .collect();
    let hooks: Vec<Value> = edits
        .hooks
        .iter()
        .map(|h| {
            let mut hook = json!({"hookName": h.point.key(), "path": h.path, "args": h.args});
            if !h.env.is_empty() {
                hook["env"] = json!(h.env);
            }
            if let Some(t) = h.timeout_seconds {
                hook["timeout"] = json!(t);
            }
            hook
        })
        .collect();
    let mut out = serde_json::Map::new();
    for (key, list) in [
        (
            "env",
            edits.env.iter().map(|e| json!(e)).collect::<Vec<_>>(),
        ),
        ("deviceNodes", device_nodes),
        ("mounts", mounts),
        ("hooks", hooks),
    ] {
        if !list.is_empty() {
            out.insert(key.into(), Value::Array(list));
        }
    }
    Value::Object(out)
}

/// A spec of `kind` with `devices` (name, edits) and edits common to all of them.
#[must_use]
pub fn spec(kind: &str, devices: Vec<(String, Value)>, common: Option<Value>) -> Value {
    let mut spec = json!({
        "cdiVersion": "",
        "kind": kind,
        "devices": devices
            .into_iter()
            .map(|(name, edits)| json!({"name": name, "containerEdits": edits}))
            .collect::<Vec<_>>(),
    });
    if let Some(c) = common.filter(|c| c.as_object().is_some_and(|o| !o.is_empty())) {
        spec["containerEdits"] = c;
    }
    spec["cdiVersion"] = json!(minimum_version(&spec));
    spec
}

/// The lowest CDI version that has every field `spec` uses (the CDI library's rules): 0.5.0
/// for device names that begin with a digit and for `hostPath` on device nodes, 0.4.0 for
/// mount types, else 0.3.0.
#[must_use]
pub fn minimum_version(spec: &Value) -> &'static str {
    let devices = spec["devices"].as_array().map_or(&[][..], Vec::as_slice);
    let edits: Vec<&Value> = devices
        .iter()
        .map(|d| &d["containerEdits"])
        .chain([&spec["containerEdits"]])
        .collect();
    let list = |e: &Value, key: &str| e[key].as_array().cloned().unwrap_or_default();
    let digit_name = devices.iter().any(|d| {
        d["name"]
            .as_str()
            .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
    });
    if digit_name
        || edits.iter().any(|e| {
            list(e, "deviceNodes")
                .iter()
                .any(|n| n.get("hostPath").is_some())
        })
    {
        "0.5.0"
    } else if edits
        .iter()
        .any(|e| list(e, "mounts").iter().any(|m| m.get("type").is_some()))
    {
        "0.4.0"
    } else {
        "0.3.0"
    }
}

/// The file a spec of `kind` for `name` is written to (`gpuslice.io-slice-web-1.json`).
#[must_use]
pub fn file_name(kind: &str, name: &str) -> String {
    format!("{}-{name}.json", kind.replace('/', "-"))
}

/// Writes `spec` to `dir/file` (atomically: a reader sees the old spec or the new one).
pub fn write(dir: &Path, file: &str, spec: &Value) -> Result<PathBuf, CdiError> {
    let path = dir.join(file);
    let err = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = dir.join(format!(".{file}.tmp"));
    let body = serde_json::to_vec_pretty(spec).map_err(|e| err(e.into()))?;
    std::fs::write(&tmp, body).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}

/// Removes `dir/file`; a file already gone is not an error.
pub fn remove(dir: &Path, file: &str) -> Result<(), CdiError> {
    let path = dir.join(file);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(CdiError::Remove { path, source: e })
        }
        _ => Ok(()),
    }
}

/// The spec of the slice `edits` were made for (its claim `name`): the device `name` with
/// every edit the wrapper makes, except the hooks that name the container, which a CDI
/// device cannot know: its createRuntime hook reports the pid for the claim `name`
/// (`gpuslice-hook activate --claim NAME`), and the claim is released by whoever made it,
/// or collected by the agent once every reported process is gone, not at poststop. Several
/// containers may use a slice device at once: the agent keeps each one reported while it
/// runs, and they share the slice. The slice's directory is mounted at
/// `/run/gpuslice/NAME`, not `/run/gpuslice`: a container may be given several slice devices
/// (two ResourceClaims), and the interception library finds each there.
#[must_use]
pub fn slice(name: &str, edits: &Edits, driver_root: &Path) -> Value {
    let mut edits = edits.clone();
    let own_dir = format!("{CONTAINER_RUN_DIR}/{name}");
    for m in &mut edits.mounts {
        if let Some(rest) = m.destination.strip_prefix(CONTAINER_RUN_DIR)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            m.destination = format!("{own_dir}{rest}");
        }
    }
    edits.hooks.retain(|h| h.point != HookPoint::Poststop);
    for h in &mut edits.hooks {
        if h.point == HookPoint::CreateRuntime {
            h.args.extend(["--claim".to_string(), name.to_string()]);
        }
    }
    spec(
        SLICE_KIND,
        vec![(name.to_string(), container_edits(&edits, driver_root))],
        None,
    )
}

/// Rewrites the host paths of `spec` (device nodes' `hostPath`, mounts' `hostPath`, hooks'
/// `path`) that lie under `root` as the host sees them: for a writer that sees the host's
/// root at `root` (a plugin in a container with the host mounted at `/host`), while the
/// engine that reads the spec runs on the host.
pub fn rebase(spec: &mut Value, root: &Path) {
    if root == Path::new("/") {
        return;
    }
    let strip = |v: &mut Value| {
        if let Some(p) = v.as_str().map(Path::new)
            && let Ok(rest) = p.strip_prefix(root)
        {
            *v = json!(Path::new("/").join(rest));
        }
    };
    if let Some(devices) = spec.get_mut("devices").and_then(Value::as_array_mut) {
        for d in devices {
            rebase_edits(&mut d["containerEdits"], &strip);
        }
    }
    if let Some(common) = spec.get_mut("containerEdits") {
        rebase_edits(common, &strip);
    }
}

fn rebase_edits(edits: &mut Value, strip: &impl Fn(&mut Value)) {
    for (list, key) in [
        ("deviceNodes", "hostPath"),
        ("mounts", "hostPath"),
        ("hooks", "path"),
    ] {
        if let Some(items) = edits.get_mut(list).and_then(Value::as_array_mut) {
            for item in items {
                if let Some(v) = item.get_mut(key) {
                    strip(v);
                }
            }
        }
    }
}

/// The spec of the node's whole GPUs: a device per GPU, named by its index and by its UUID,
/// and `all`. `gpus` are (index, UUID, minor). Each GPU device has its device node and two
/// hooks of `hook`: `claim-gpu <UUID>` at `createRuntime` (the container's claim on the whole
/// GPU, refused when the GPU holds slices: the container is then not created) and
/// `release-gpu <UUID>` at `poststop`. Every device shares the driver's files and control
/// devices (the real libraries: a whole GPU has no wall).
pub fn whole_gpus(
    driver: &DriverFiles,
    gpus: &[(u32, String, u32)],
    hook: &Path,
    hook_env: &[String],
) -> Result<Value, crate::driver::DriverError> {
    let root = &driver.root.root;
    let hooks_for = |uuids: &[&str]| -> Vec<Value> {
        let mut hooks = Vec::new();
        for (point, verb) in [("createRuntime", "claim-gpu"), ("poststop", "release-gpu")] {
            let mut args = vec!["gpuslice-hook".to_string(), verb.to_string()];
            args.extend(uuids.iter().map(|u| (*u).to_string()));
            let mut h = json!({"hookName": point, "path": hook, "args": args, "timeout": 10});
            if !hook_env.is_empty() {
                h["env"] = json!(hook_env);
            }
            hooks.push(h);
        }
        hooks
    };
    let mut devices = Vec::new();
    let mut all_nodes = Vec::new();
    for (index, uuid, minor) in gpus {
        let node = Edits {
            devices: vec![driver.gpu_device(*minor)?],
            mounts: Vec::new(),
            hooks: Vec::new(),
            masked_paths: Vec::new(),
            env: Vec::new(),
        };
        let mut edits = container_edits(&node, root);
        all_nodes.extend(edits["deviceNodes"].as_array().cloned().unwrap_or_default());
        edits["hooks"] = json!(hooks_for(&[uuid]));
        edits["env"] = json!([format!("{}={uuid}", crate::nvidia_env::VISIBLE_DEVICES)]);
        devices.push((index.to_string(), edits.clone()));
        devices.push((uuid.clone(), edits));
    }
    let uuids: Vec<&str> = gpus.iter().map(|(_, u, _)| u.as_str()).collect();
    devices.push((
        "all".to_string(),
        json!({
            "deviceNodes": all_nodes,
            "hooks": hooks_for(&uuids),
            "env": [format!("{}={}", crate::nvidia_env::VISIBLE_DEVICES, uuids.join(","))],
        }),
    ));
    let common = Edits {
        devices: driver.control_devices.clone(),
        mounts: driver.mounts.clone(),
        hooks: Vec::new(),
        masked_paths: Vec::new(),
        env: Vec::new(),
    };
    Ok(spec(
        GPU_KIND,
        devices,
        Some(container_edits(&common, root)),
    ))
}

/// The spec of device `name` giving the GPUs `gpus` (UUID, minor) for administrative access,
/// as Kubernetes defines it for a request with `adminAccess` in a namespace an administrator
/// labelled for it (to look at GPUs in use: `nvidia-smi`, a monitoring agent): their device
/// nodes, the control devices and the driver's files (the real libraries), and
/// `NVIDIA_VISIBLE_DEVICES`; no hook claims them, so the slices and whole GPUs the agent
/// holds there stay as they are, and nothing holds the container to any of them.
pub fn admin(
    name: &str,
    driver: &DriverFiles,
    gpus: &[(String, u32)],
) -> Result<Value, crate::driver::DriverError> {
    let mut devices = driver.control_devices.clone();
    for (_, minor) in gpus {
        devices.push(driver.gpu_device(*minor)?);
    }
    let uuids: Vec<&str> = gpus.iter().map(|(u, _)| u.as_str()).collect();
    let edits = Edits {
        devices,
        mounts: driver.mounts.clone(),
        hooks: Vec::new(),
        masked_paths: Vec::new(),
        env: vec![format!(
            "{}={}",
            crate::nvidia_env::VISIBLE_DEVICES,
            uuids.join(",")
        )],
    };
    Ok(spec(
        ADMIN_KIND,
        vec![(name.to_string(), container_edits(&edits, &driver.root.root))],
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_lowest_that_has_every_field_used() {
        let s = spec(
            "gpuslice.io/slice",
            vec![("web".into(), json!({"env": ["A=1"]}))],
            None,
        );
        assert_eq!(s["cdiVersion"], "0.3.0");
        let s = spec("gpuslice.io/gpu", vec![("0".into(), json!({}))], None);
        assert_eq!(s["cdiVersion"], "0.5.0", "a name beginning with a digit");
        let s = spec(
            "gpuslice.io/slice",
            vec![(
                "web".into(),
                json!({"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/x/dev/nvidia0"}]}),
            )],
            None,
        );
        assert_eq!(s["cdiVersion"], "0.5.0");
        let s = spec(
            "gpuslice.io/slice",
            vec![("web".into(), json!({}))],
            Some(json!({"mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]})),
        );
        assert_eq!(s["cdiVersion"], "0.4.0");
    }

    #[test]
    fn host_paths_under_the_writers_view_of_the_host_are_rewritten_as_the_host_sees_them() {
        let mut s = spec(
            SLICE_KIND,
            vec![(
                "web".into(),
                json!({
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0"}],
                    "mounts": [{"hostPath": "/host/run/gpuslice/web", "containerPath": "/run/gpuslice"},
                               {"hostPath": "/hostile/x", "containerPath": "/x"}],
                    "hooks": [{"hookName": "createRuntime", "path": "/host/usr/bin/gpuslice-hook"}]
                }),
            )],
            Some(
                json!({"mounts": [{"hostPath": "/host/usr/lib/x/libcuda.so.1", "containerPath": "/usr/lib/x/libcuda.so.1"}]}),
            ),
        );
        rebase(&mut s, Path::new("/host"));
        let e = &s["devices"][0]["containerEdits"];
        assert_eq!(e["deviceNodes"][0]["hostPath"], "/dev/nvidia0");
        assert_eq!(e["mounts"][0]["hostPath"], "/run/gpuslice/web");
        assert_eq!(
            e["mounts"][1]["hostPath"], "/hostile/x",
            "a path component, not a prefix"
        );
        assert_eq!(e["hooks"][0]["path"], "/usr/bin/gpuslice-hook");
        assert_eq!(
            s["containerEdits"]["mounts"][0]["hostPath"],
            "/usr/lib/x/libcuda.so.1"
        );
    }

    #[test]
    fn file_names_are_the_kind_and_the_name() {
        assert_eq!(
            file_name(SLICE_KIND, "web-1"),
            "gpuslice.io-slice-web-1.json"
        );
        assert_eq!(
            file_name(SLICE_KIND, "web-1"),
            gpuslice_core::layout::cdi_slice_file("web-1"),
            "the agent removes the file the CLI writes"
        );
    }
}
