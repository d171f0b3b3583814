//! The wrapper's configuration: `/etc/gpuslice/runtime.json` (or `$GPUSLICE_RUNTIME_CONFIG`),
//! each field overridable from the environment. Engines start runtimes with a small
//! environment, so the file is the operator's way; the variables serve tests and one-offs.
//!
//! ```json
//! { "runtime": "runc", "driver_root": "/", "run_dir": "/run/gpuslice",
//!   "bus_address": null, "interception_library": "/usr/lib/gpuslice/libgpuslice.so",
//!   "hook": "/usr/bin/gpuslice-hook" }
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const DEFAULT_CONFIG: &str = "/etc/gpuslice/runtime.json";

#[derive(Debug, Clone)]
pub struct Config {
    /// The low-level runtime: a name looked up in PATH, or a path.
    pub runtime: String,
    pub driver_root: PathBuf,
    pub run_dir: PathBuf,
    /// The agent's bus; `None` for the system bus.
    pub bus_address: Option<String>,
    pub interception_library: PathBuf,
    pub hook: PathBuf,
}

fn field(file: &serde_json::Value, key: &str, env: &str) -> Option<String> {
    std::env::var(env)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            file.get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
}

impl Config {
    pub fn load() -> Result<Self> {
        let path =
            std::env::var("GPUSLICE_RUNTIME_CONFIG").unwrap_or_else(|_| DEFAULT_CONFIG.into());
        let file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{path} is not valid JSON"))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(e) => return Err(e).with_context(|| format!("failed to read {path}")),
        };
        let hook_default = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("gpuslice-hook")))
            .filter(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("/usr/bin/gpuslice-hook"));
        Ok(Self {
            runtime: field(&file, "runtime", "GPUSLICE_LOW_LEVEL_RUNTIME")
                .unwrap_or_else(|| "runc".into()),
            driver_root: field(&file, "driver_root", "GPUSLICE_DRIVER_ROOT")
                .map_or_else(|| "/".into(), PathBuf::from),
            run_dir: field(&file, "run_dir", "GPUSLICE_RUN_DIR")
                .map_or_else(|| "/run/gpuslice".into(), PathBuf::from),
            bus_address: field(&file, "bus_address", "GPUSLICE_BUS_ADDRESS"),
            interception_library: field(
                &file,
                "interception_library",
                "GPUSLICE_INTERCEPTION_LIBRARY",
            )
            .map_or_else(|| "/usr/lib/gpuslice/libgpuslice.so".into(), PathBuf::from),
            hook: field(&file, "hook", "GPUSLICE_HOOK").map_or(hook_default, PathBuf::from),
        })
    }

    /// The low-level runtime's executable: a path as given, or the first match in PATH that
    /// is not this wrapper itself.
    pub fn runtime_path(&self) -> Result<PathBuf> {
        if self.runtime.contains('/') {
            return Ok(PathBuf::from(&self.runtime));
        }
        let me = std::env::current_exe()
            .ok()
            .and_then(|p| p.canonicalize().ok());
        let path = std::env::var_os("PATH").unwrap_or_else(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        });
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(&self.runtime);
            if is_executable(&candidate) && candidate.canonicalize().ok() != me {
                return Ok(candidate);
            }
        }
        bail!("low-level runtime {:?} not found in PATH", self.runtime)
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
