//! Finding the command, the container id and the bundle in an OCI runtime's argv, tolerant
//! of the global flags of runc and crun, which are passed through untouched.

use std::ffi::OsString;
use std::path::PathBuf;

/// Global flags that take a value (runc and crun), in `--flag value` form.
const GLOBAL_WITH_VALUE: &[&str] = &[
    "--root",
    "--log",
    "--log-format",
    "--criu",
    "--rootless",
    "--cgroup-manager",
];
/// Flags of `create`/`run` that take a value.
const CREATE_WITH_VALUE: &[&str] = &[
    "--bundle",
    "-b",
    "--console-socket",
    "--pid-file",
    "--preserve-fds",
];

/// What the wrapper needs from argv.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Invocation {
    /// The runtime command (`create`, `run`, `start`, `delete`, …), if any.
    pub command: Option<String>,
    /// The container id: the first positional argument after the command.
    pub container_id: Option<String>,
    /// `--bundle`/`-b`, for create and run (default: the current directory).
    pub bundle: Option<PathBuf>,
    /// `--log`: where runc's callers read errors.
    pub log: Option<PathBuf>,
    /// `--log-format`: `text` or `json`.
    pub log_format: Option<String>,
    /// `--root`: the runtime's state directory (containerd gives one per namespace).
    pub root: Option<PathBuf>,
    /// `--pid-file` of `create`/`run`: where the runtime writes the container's pid.
    pub pid_file: Option<PathBuf>,
}

impl Invocation {
    /// Who owns the container's claim: the runtime's state directory, which tells containers
    /// of the same id apart (runc roots, containerd namespaces). runc's default root when
    /// none is given.
    #[must_use]
    pub fn owner(&self) -> String {
        let root = self
            .root
            .as_deref()
            .unwrap_or_else(|| std::path::Path::new("/run/runc"));
        format!("runtime-root:{}", root.display())
    }

    /// True for the commands that create a container.
    #[must_use]
    pub fn creates(&self) -> bool {
        matches!(self.command.as_deref(), Some("create" | "run"))
    }
}

/// Reads argv (including argv\[0\]).
#[must_use]
pub fn parse(argv: &[OsString]) -> Invocation {
    let args: Vec<String> = argv
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut inv = Invocation::default();
    let mut i = 0;
    // Global flags before the command.
    while i < args.len() {
        let a = &args[i];
        if !a.starts_with('-') {
            break;
        }
        let (flag, inline) = split_flag(a);
        let value = if GLOBAL_WITH_VALUE.contains(&flag) {
            match inline {
                Some(v) => Some(v.to_string()),
                None => {
                    i += 1;
                    args.get(i).cloned()
                }
            }
        } else {
            None
        };
        match flag {
            "--log" => inv.log = value.map(PathBuf::from),
            "--log-format" => inv.log_format = value,
            "--root" => inv.root = value.map(PathBuf::from),
            _ => {}
        }
        i += 1;
    }
    inv.command = args.get(i).cloned();
    i += 1;
    let creates = inv.creates();
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            inv.container_id = inv.container_id.take().or_else(|| args.get(i + 1).cloned());
            break;
        }
        if a.starts_with('-') && a.len() > 1 {
            let (flag, inline) = split_flag(a);
            let takes_value = creates && CREATE_WITH_VALUE.contains(&flag);
            if takes_value {
                let value = match inline {
                    Some(v) => Some(v.to_string()),
                    None => {
                        i += 1;
                        args.get(i).cloned()
                    }
                };
                match flag {
                    "--bundle" | "-b" => inv.bundle = value.map(PathBuf::from),
                    "--pid-file" => inv.pid_file = value.map(PathBuf::from),
                    _ => {}
                }
            }
        } else if inv.container_id.is_none() {
            inv.container_id = Some(a.clone());
        }
        i += 1;
    }
    if creates && inv.bundle.is_none() {
        inv.bundle = std::env::current_dir().ok();
    }
    inv
}

fn split_flag(a: &str) -> (&str, Option<&str>) {
    match a.split_once('=') {
        Some((f, v)) if a.starts_with("--") => (f, Some(v)),
        _ => (a, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn create_with_containerd_style_global_flags_is_found() {
        let inv = parse(&argv(
            "runc --root /run/containerd/runc/k8s.io --log /run/x/log.json --log-format json create --bundle /b --pid-file /b/init.pid c1",
        ));
        assert_eq!(inv.command.as_deref(), Some("create"));
        assert_eq!(inv.container_id.as_deref(), Some("c1"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.pid_file, Some(PathBuf::from("/b/init.pid")));
        assert_eq!(inv.log, Some(PathBuf::from("/run/x/log.json")));
        assert_eq!(inv.log_format.as_deref(), Some("json"));
        assert_eq!(inv.owner(), "runtime-root:/run/containerd/runc/k8s.io");
        assert_eq!(
            parse(&argv("runc delete c1")).owner(),
            "runtime-root:/run/runc"
        );
    }

    #[test]
    fn podman_style_flags_with_equals_and_the_id_before_flags_are_found() {
        let inv = parse(&argv(
            "runc --systemd-cgroup --log=/l --root=/r create -b /bundle --console-socket /s id9 --no-pivot",
        ));
        assert_eq!(inv.command.as_deref(), Some("create"));
        assert_eq!(inv.container_id.as_deref(), Some("id9"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/bundle")));
        let inv = parse(&argv("crun --cgroup-manager systemd run --bundle=/x myid"));
        assert_eq!(
            (inv.command.as_deref(), inv.container_id.as_deref()),
            (Some("run"), Some("myid"))
        );
        assert_eq!(inv.bundle, Some(PathBuf::from("/x")));
    }

    #[test]
    fn other_commands_keep_their_id_and_have_no_bundle() {
        let inv = parse(&argv("runc --root /r delete --force c2"));
        assert_eq!(
            (
                inv.command.as_deref(),
                inv.container_id.as_deref(),
                inv.bundle.as_deref()
            ),
            (Some("delete"), Some("c2"), None)
        );
        assert!(!inv.creates());
        assert_eq!(parse(&argv("runc --version")).command, None);
    }
}
