//! The configuration of the wrapper and the hook: `/etc/gpuslice/runtime.json` (or
//! `$GPUSLICE_RUNTIME_CONFIG`), each scalar field overridable from the environment. Engines
//! start runtimes with a small environment, so the file is the operator's way; the variables
//! serve tests and one-offs.
//!
//! ```json
//! { "runtime": "runc", "driver_root": "/", "run_dir": "/run/gpuslice",
//!   "bus_address": null, "agent_socket": null,
//!   "interception_library": "/usr/lib/gpuslice/libgpuslice.so",
//!   "hook": "/usr/bin/gpuslice-hook",
//!   "extra_mounts": [{"source": "/opt/x", "destination": "/opt/x", "read_only": true}] }
//! ```
//!
//! Every field has a default. Unknown keys are kept (a newer file read by an older binary)
//! and reported by [`Config::warnings`]; a value of the wrong kind is an error naming the
//! file, the key and the value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::driver::{BindMount, DriverError, DriverFiles, DriverRoot};
use crate::nvidia_env::Capabilities;

pub const DEFAULT_CONFIG: &str = "/etc/gpuslice/runtime.json";

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Syntax {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: key {key:?} = {value}: {reason}")]
    Value {
        path: PathBuf,
        key: String,
        value: String,
        reason: String,
    },
    #[error("low-level runtime {0:?} not found in PATH")]
    RuntimeNotFound(String),
}

/// A file or directory of the host that every GPU container gets besides the driver's own
/// files (say, the state directory of a simulated driver).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraMount {
    pub source: PathBuf,
    /// Where it appears in the container (an absolute path).
    pub destination: String,
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

impl From<&ExtraMount> for BindMount {
    fn from(m: &ExtraMount) -> Self {
        Self {
            source: m.source.clone(),
            destination: m.destination.clone(),
            read_only: m.read_only,
            noexec: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Config {
    /// The low-level runtime: a name looked up in PATH, or a path.
    pub runtime: String,
    /// Where the driver's files are: `/` on a GPU node, or a simulated node's root.
    pub driver_root: PathBuf,
    pub run_dir: PathBuf,
    /// The agent's bus; `None` for the system bus.
    pub bus_address: Option<String>,
    /// The agent's private socket, tried before the bus; `None`: the default one
    /// (`/run/gpuslice-agent/private`) when the agent is on the system bus, else none.
    pub agent_socket: Option<String>,
    pub interception_library: PathBuf,
    pub hook: PathBuf,
    /// Mounted into every GPU container besides the driver's files.
    pub extra_mounts: Vec<ExtraMount>,
    /// Give a slice to privileged containers (`CAP_SYS_ADMIN`, or every device allowed),
    /// which can step out of it; refused by default.
    pub allow_privileged: bool,
    /// Keys this version does not know, kept as written.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, Value>,
    /// The file this was read from (none when it did not exist).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            runtime: "runc".into(),
            driver_root: "/".into(),
            run_dir: "/run/gpuslice".into(),
            bus_address: None,
            agent_socket: None,
            interception_library: "/usr/lib/gpuslice/libgpuslice.so".into(),
            hook: default_hook(),
            extra_mounts: Vec::new(),
            allow_privileged: false,
            unknown: BTreeMap::new(),
            source: None,
        }
    }
}

/// `gpuslice-hook` beside this executable, else `/usr/bin/gpuslice-hook`.
fn default_hook() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("gpuslice-hook")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/gpuslice-hook"))
}

/// The environment variable that overrides each scalar key.
const OVERRIDES: &[(&str, &str)] = &[
    ("runtime", "GPUSLICE_LOW_LEVEL_RUNTIME"),
    ("driver_root", "GPUSLICE_DRIVER_ROOT"),
    ("run_dir", "GPUSLICE_RUN_DIR"),
    ("bus_address", "GPUSLICE_BUS_ADDRESS"),
    ("agent_socket", "GPUSLICE_AGENT_SOCKET"),
    ("interception_library", "GPUSLICE_INTERCEPTION_LIBRARY"),
    ("hook", "GPUSLICE_HOOK"),
];

impl Config {
    /// The environment the hooks need (engines start hooks with none): the agent's bus
    /// address when it is not the system bus, and its private socket when one is set.
    #[must_use]
    pub fn hook_env(&self) -> Vec<String> {
        let bus = self
            .bus_address
            .iter()
            .map(|a| format!("GPUSLICE_BUS_ADDRESS={a}"));
        let socket = self
            .agent_socket
            .iter()
            .map(|s| format!("GPUSLICE_AGENT_SOCKET={s}"));
        bus.chain(socket).collect()
    }

    /// Reads the file named by `$GPUSLICE_RUNTIME_CONFIG` (default [`DEFAULT_CONFIG`]; a
    /// missing file means every default), then applies the environment's overrides.
    pub fn load() -> Result<Self, ConfigError> {
        let path = std::env::var_os("GPUSLICE_RUNTIME_CONFIG")
            .map_or_else(|| PathBuf::from(DEFAULT_CONFIG), PathBuf::from);
        let mut cfg = match std::fs::read(&path) {
            Ok(bytes) => Self::parse(&path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        cfg.apply_env(|var| std::env::var(var).ok().filter(|v| !v.is_empty()));
        Ok(cfg)
    }

    /// Reads a configuration file's contents; `path` names it in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|source| ConfigError::Syntax {
            path: path.to_path_buf(),
            source,
        })?;
        if !value.is_object() {
            return Err(ConfigError::Value {
                path: path.to_path_buf(),
                key: String::new(),
                value: short(&value),
                reason: "the configuration is a JSON object".into(),
            });
        }
        let mut cfg: Self = serde_path_to_error::deserialize(&value).map_err(|e| {
            let key = e.path().to_string();
            let at = pointer(&value, &key);
            ConfigError::Value {
                path: path.to_path_buf(),
                value: at.map_or_else(String::new, short),
                key,
                reason: e.into_inner().to_string(),
            }
        })?;
        for m in &cfg.extra_mounts {
            if !m.destination.starts_with('/') || m.destination.split('/').any(|c| c == "..") {
                return Err(ConfigError::Value {
                    path: path.to_path_buf(),
                    key: "extra_mounts".into(),
                    value: format!("{:?}", m.destination),
                    reason: "a destination is an absolute path inside the container, without .."
                        .into(),
                });
            }
        }
        cfg.source = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Applies the environment's overrides (`var` looks one up).
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        for (key, env) in OVERRIDES {
            let Some(v) = var(env) else {
                continue;
            };
            match *key {
                "runtime" => self.runtime = v,
                "driver_root" => self.driver_root = v.into(),
                "run_dir" => self.run_dir = v.into(),
                "bus_address" => self.bus_address = Some(v),
                "agent_socket" => self.agent_socket = Some(v),
                "interception_library" => self.interception_library = v.into(),
                _ => self.hook = v.into(),
            }
        }
    }

    /// What the operator should hear about the file: keys this version ignores.
    #[must_use]
    pub fn warnings(&self) -> Vec<String> {
        let file = self
            .source
            .as_ref()
            .map_or_else(|| DEFAULT_CONFIG.into(), |p| p.display().to_string());
        self.unknown
            .keys()
            .map(|k| format!("{file}: unknown key {k:?} ignored"))
            .collect()
    }

    /// The bind mounts every GPU container gets besides the driver's files.
    #[must_use]
    pub fn extra_bind_mounts(&self) -> Vec<BindMount> {
        self.extra_mounts.iter().map(BindMount::from).collect()
    }

    /// The driver's files for `capabilities` under the driver root, and the bind mounts every
    /// GPU container gets besides.
    pub fn driver_files(&self, capabilities: Capabilities) -> Result<DriverFiles, DriverError> {
        let mut driver = DriverFiles::discover(&DriverRoot::new(&self.driver_root), capabilities)?;
        driver.mounts.extend(self.extra_bind_mounts());
        Ok(driver)
    }

    /// The low-level runtime's executable: a path as given, or the first match in PATH that
    /// is not this wrapper itself.
    pub fn runtime_path(&self) -> Result<PathBuf, ConfigError> {
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
        Err(ConfigError::RuntimeNotFound(self.runtime.clone()))
    }
}

/// The value at a serde path such as `extra_mounts[0].source`.
fn pointer<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut v = root;
    for part in path.split('.') {
        let (name, rest) = part.split_once('[').unwrap_or((part, ""));
        if !name.is_empty() && name != "?" {
            v = v.get(name)?;
        }
        for index in rest.split('[') {
            if let Ok(i) = index.trim_end_matches(']').parse::<usize>() {
                v = v.get(i)?;
            }
        }
    }
    Some(v)
}

/// A value as written, cut short.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/gpuslice/runtime.json"), text.as_bytes())
    }

    #[test]
    fn an_empty_object_means_every_default() {
        let c = parse("{}").unwrap();
        assert_eq!(c.runtime, "runc");
        assert_eq!(c.driver_root, PathBuf::from("/"));
        assert_eq!(c.run_dir, PathBuf::from("/run/gpuslice"));
        assert!(c.extra_mounts.is_empty() && c.warnings().is_empty());
    }

    #[test]
    fn a_value_of_the_wrong_kind_names_the_file_the_key_and_the_value() {
        let e = parse(r#"{"driver_root": 5}"#).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/gpuslice/runtime.json: key \"driver_root\" = 5: "),
            "{e}"
        );
        let e = parse(
            r#"{"extra_mounts": [{"source": "/a", "destination": "/a", "read_only": "yes"}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("extra_mounts[0].read_only") && e.contains("\"yes\""),
            "{e}"
        );
        let e = parse(r#"{"extra_mounts": [{"source": "/a", "destination": "../etc"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("absolute path"), "{e}");
    }

    #[test]
    fn unknown_keys_are_kept_and_warned_about() {
        let c = parse(r#"{"runtime": "crun", "future_knob": {"x": 1}}"#).unwrap();
        assert_eq!(c.runtime, "crun");
        assert_eq!(c.unknown["future_knob"], serde_json::json!({"x": 1}));
        assert_eq!(
            c.warnings(),
            vec!["/etc/gpuslice/runtime.json: unknown key \"future_knob\" ignored"]
        );
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let mut c = parse(r#"{"driver_root": "/a", "run_dir": "/b"}"#).unwrap();
        c.apply_env(|v| (v == "GPUSLICE_DRIVER_ROOT").then(|| "/sim".to_string()));
        assert_eq!(c.driver_root, PathBuf::from("/sim"));
        assert_eq!(c.run_dir, PathBuf::from("/b"));
    }
}
