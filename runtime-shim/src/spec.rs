//! Applying [`Edits`] to an OCI runtime spec (`config.json`) held as JSON, so that every
//! field this code does not know survives. Remove-then-add: applying twice equals applying
//! once.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::edits::Edits;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config.json field `{0}` is not an object")]
    NotObject(&'static str),
    #[error("config.json field `{0}` is not an array")]
    NotArray(&'static str),
}

/// The annotations of a spec (empty when it has none).
#[must_use]
pub fn annotations(spec: &Value) -> std::collections::BTreeMap<String, String> {
    spec.get("annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The container's environment (`process.env`).
#[must_use]
pub fn env(spec: &Value) -> Vec<String> {
    spec["process"]["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The claims whose slice directories the spec mounts already, right under
/// `/run/gpuslice` (where a CDI slice device mounts its own: [`crate::cdi::slice`]).
#[must_use]
pub fn slices_given(spec: &Value) -> Vec<String> {
    let prefix = format!("{}/", crate::edits::CONTAINER_RUN_DIR);
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["destination"].as_str()?.strip_prefix(&prefix))
        .filter(|name| !name.is_empty() && !name.contains('/'))
        .map(str::to_string)
        .collect()
}

/// Whether a Kubernetes runtime (containerd's CRI plugin or CRI-O) created the container:
/// they write the container's type into its annotations.
#[must_use]
pub fn created_by_kubernetes(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    use gpuslice_core::annotations::{CRI_CONTAINER_TYPE, CRIO_CONTAINER_TYPE};
    annotations.contains_key(CRI_CONTAINER_TYPE) || annotations.contains_key(CRIO_CONTAINER_TYPE)
}

/// Why a container with this spec could step out of any slice, if it could: with
/// `CAP_SYS_ADMIN` it can remount its limits directory and preload list, and with a device
/// cgroup that allows every device it can open every GPU (a privileged container has both).
#[must_use]
pub fn privileged(spec: &Value) -> Option<String> {
    let caps = &spec["process"]["capabilities"];
    let has_admin = ["bounding", "effective", "permitted"].iter().any(|set| {
        caps[*set]
            .as_array()
            .is_some_and(|c| c.iter().any(|v| v.as_str() == Some("CAP_SYS_ADMIN")))
    });
    if has_admin {
        return Some("it has CAP_SYS_ADMIN".into());
    }
    let allows_all = spec["linux"]["resources"]["devices"]
        .as_array()
        .is_some_and(|rules| {
            rules.iter().any(|r| {
                r["allow"].as_bool() == Some(true)
                    && matches!(r["type"].as_str(), None | Some("a"))
                    && r["major"].is_null()
                    && r["minor"].is_null()
            })
        });
    allows_all.then(|| "its device cgroup allows every device".into())
}

fn object<'a>(
    parent: &'a mut Value,
    key: &'static str,
) -> Result<&'a mut Map<String, Value>, SpecError> {
    let map = parent.as_object_mut().ok_or(SpecError::NotObject(key))?;
    let v = map.entry(key).or_insert_with(|| json!({}));
    if v.is_null() {
        *v = json!({});
    }
    v.as_object_mut().ok_or(SpecError::NotObject(key))
}

fn array<'a>(
    parent: &'a mut Map<String, Value>,
    key: &'static str,
) -> Result<&'a mut Vec<Value>, SpecError> {
    let v = parent.entry(key).or_insert_with(|| json!([]));
    if v.is_null() {
        *v = json!([]);
    }
    v.as_array_mut().ok_or(SpecError::NotArray(key))
}

/// Applies `edits` to `spec`.
pub fn apply(spec: &mut Value, edits: &Edits) -> Result<(), SpecError> {
    {
        let linux = object(spec, "linux")?;
        let devices = array(linux, "devices")?;
        for d in &edits.devices {
            devices.retain(|v| v.get("path").and_then(Value::as_str) != Some(&d.path));
            devices.push(json!({
                "path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                "fileMode": 0o020_000 | d.mode, "uid": 0, "gid": 0
            }));
        }
        let resources = linux.entry("resources").or_insert_with(|| json!({}));
        if resources.is_null() {
            *resources = json!({});
        }
        let resources = resources
            .as_object_mut()
            .ok_or(SpecError::NotObject("resources"))?;
        let rules = array(resources, "devices")?;
        for d in &edits.devices {
            rules.retain(|r| {
                !(r.get("allow") == Some(&json!(true))
                    && r.get("type").and_then(Value::as_str) == Some("c")
                    && r.get("major") == Some(&json!(d.major))
                    && r.get("minor") == Some(&json!(d.minor)))
            });
            rules.push(json!({"allow": true, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}));
        }
    }
    {
        let root = spec.as_object_mut().ok_or(SpecError::NotObject("(root)"))?;
        let mounts = array(root, "mounts")?;
        for m in &edits.mounts {
            mounts.retain(|v| v.get("destination").and_then(Value::as_str) != Some(&m.destination));
            let mode = if m.read_only { "ro" } else { "rw" };
            let mut options = vec!["rbind", "rprivate", "nosuid", "nodev", mode];
            if m.noexec {
                options.push("noexec");
            }
            mounts.push(json!({
                "destination": m.destination, "type": "bind", "source": m.source,
                "options": options
            }));
        }
    }
    if !edits.masked_paths.is_empty() {
        let masked = array(object(spec, "linux")?, "maskedPaths")?;
        for p in &edits.masked_paths {
            if !masked.iter().any(|v| v.as_str() == Some(p)) {
                masked.push(json!(p));
            }
        }
    }
    if !edits.env.is_empty() {
        let env = array(object(spec, "process")?, "env")?;
        for e in &edits.env {
            let key = e.split_once('=').map_or(e.as_str(), |(k, _)| k);
            env.retain(|v| {
                v.as_str()
                    .is_none_or(|v| v.split_once('=').map_or(v, |(k, _)| k) != key)
            });
            env.push(json!(e));
        }
    }
    let hooks = object(spec, "hooks")?;
    for h in &edits.hooks {
        let list = array(hooks, h.point.key())?;
        list.retain(|v| {
            !(v.get("path").and_then(Value::as_str) == Some(&h.path)
                && v.get("args") == Some(&json!(h.args)))
        });
        let mut hook = json!({"path": h.path, "args": h.args});
        if !h.env.is_empty() {
            hook["env"] = json!(h.env);
        }
        if let Some(t) = h.timeout_seconds {
            hook["timeout"] = json!(t);
        }
        list.push(hook);
    }
    Ok(())
}

/// Reads `config.json`.
pub fn read(path: &Path) -> Result<Value, SpecError> {
    let text = std::fs::read(path).map_err(|source| SpecError::Read {
        path: path.into(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| SpecError::Parse {
        path: path.into(),
        source,
    })
}

/// Writes `config.json` atomically: a temporary file beside it renamed over it, so that a
/// crash leaves the old spec or the new one, never half of one. It is not synced: a bundle
/// does not outlive a reboot of the host.
pub fn write(path: &Path, spec: &Value) -> Result<(), SpecError> {
    let err = |source| SpecError::Write {
        path: path.into(),
        source,
    };
    let tmp = path.with_extension("json.gpuslice-tmp");
    let body = serde_json::to_vec(spec).map_err(|e| err(e.into()))?;
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(&body).map_err(err)?;
    if let Ok(meta) = std::fs::metadata(path) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests;
