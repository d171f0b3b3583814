//! `gpuslice-hook install-hooks`: writes the hooks.d files (the OCI hooks configuration podman
//! and CRI-O read) for this binary where it is installed, with the environment the hook is to
//! run with. The files in `packaging/oci-hooks/` are the same for a binary in `/usr/bin` and
//! the default environment.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The search path hooks run with unless told otherwise (as the NVIDIA toolkit's hook file
/// sets it): engines run hooks with an empty environment.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Which engine's files to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// podman: one precreate hook, which edits the spec as the runtime wrapper does.
    Podman,
    /// CRI-O: prestart (which also reports the pid) and poststop hooks.
    CriO,
}

/// The files for `engine`: (file name, contents), the hook at `binary` run with `env`.
#[must_use]
pub fn files(engine: Engine, binary: &Path, env: &[String]) -> Vec<(String, Value)> {
    let stages: &[(&str, &str)] = match engine {
        Engine::Podman => &[("gpuslice-precreate.json", "precreate")],
        Engine::CriO => &[
            ("gpuslice-crio.json", "prestart"),
            ("gpuslice-crio-poststop.json", "poststop"),
        ],
    };
    stages
        .iter()
        .map(|(name, stage)| {
            let file = json!({
                "version": "1.0.0",
                "hook": {
                    "path": binary.display().to_string(),
                    "args": ["gpuslice-hook", stage],
                    "env": env,
                },
                "when": {"annotations": {"^gpuslice\\.io/.+$": ".*"}},
                "stages": [stage],
            });
            ((*name).to_string(), file)
        })
        .collect()
}

/// What `install-hooks` was asked.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub dir: PathBuf,
    pub engine: Engine,
    pub binary: Option<PathBuf>,
    pub env: Vec<String>,
}

pub const USAGE: &str = "usage: gpuslice-hook install-hooks --dir DIR [--engine podman|cri-o] [--binary PATH] [--env KEY=VALUE]...\n\
    Writes the hooks.d files for this hook (default: the running binary), run with PATH and each --env.";

/// Reads `install-hooks`' arguments (those after the verb).
pub fn parse(args: &[String]) -> Result<Request> {
    let mut dir = None;
    let mut engine = Engine::Podman;
    let mut binary = None;
    let mut env = vec![DEFAULT_PATH.to_string()];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--dir" => dir = Some(PathBuf::from(value("--dir")?)),
            "--binary" => binary = Some(PathBuf::from(value("--binary")?)),
            "--engine" => {
                engine = match value("--engine")?.as_str() {
                    "podman" => Engine::Podman,
                    "cri-o" | "crio" => Engine::CriO,
                    other => bail!("--engine {other:?}: not podman or cri-o"),
                }
            }
            "--env" => {
                let kv = value("--env")?;
                let Some((key, _)) = kv.split_once('=') else {
                    bail!("--env {kv:?}: expected KEY=VALUE");
                };
                if key.is_empty() || key.contains(char::is_whitespace) {
                    bail!("--env {kv:?}: {key:?} is not a variable name");
                }
                // A later PATH replaces the default one.
                env.retain(|e| e.split_once('=').is_none_or(|(k, _)| k != key));
                env.push(kv);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let dir = dir.with_context(|| format!("--dir is required\n{USAGE}"))?;
    Ok(Request {
        dir,
        engine,
        binary,
        env,
    })
}

/// Writes the files of `request`; returns their paths.
pub fn install(request: &Request) -> Result<Vec<PathBuf>> {
    let binary = match &request.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().context("failed to find the running binary")?,
    };
    if !binary.is_absolute() {
        bail!(
            "--binary {}: engines need an absolute path",
            binary.display()
        );
    }
    std::fs::create_dir_all(&request.dir)
        .with_context(|| format!("failed to create {}", request.dir.display()))?;
    let mut written = Vec::new();
    for (name, file) in files(request.engine, &binary, &request.env) {
        let path = request.dir.join(name);
        let text = serde_json::to_string_pretty(&file)? + "\n";
        std::fs::write(&path, text)
            .with_context(|| format!("failed to write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn the_packaged_files_are_what_install_hooks_writes_for_usr_bin() {
        let packaged = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/oci-hooks");
        for engine in [Engine::Podman, Engine::CriO] {
            for (name, file) in files(
                engine,
                Path::new("/usr/bin/gpuslice-hook"),
                &[DEFAULT_PATH.to_string()],
            ) {
                let text = std::fs::read_to_string(packaged.join(&name)).unwrap();
                let on_disk: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(on_disk, file, "{name}");
            }
        }
    }

    #[test]
    fn arguments_name_the_directory_the_engine_and_the_environment() {
        let r = parse(&args(&[
            "--dir",
            "/etc/containers/oci/hooks.d",
            "--engine",
            "cri-o",
            "--env",
            "GPUSLICE_BUS_ADDRESS=unix:path=/run/x",
            "--env",
            "PATH=/opt/bin",
        ]))
        .unwrap();
        assert_eq!(r.engine, Engine::CriO);
        assert_eq!(
            r.env,
            ["GPUSLICE_BUS_ADDRESS=unix:path=/run/x", "PATH=/opt/bin"]
        );
        for (bad, why) in [
            (
                &["--engine", "docker", "--dir", "/x"][..],
                "not podman or cri-o",
            ),
            (
                &["--dir", "/x", "--env", "NOEQUALS"][..],
                "expected KEY=VALUE",
            ),
            (&["--env", "A=1"][..], "--dir is required"),
            (&["--dir"][..], "--dir needs a value"),
        ] {
            let e = parse(&args(bad)).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn install_writes_the_engines_files_for_the_binary_given() {
        let dir = tempfile::tempdir().unwrap();
        let r = Request {
            dir: dir.path().join("hooks.d"),
            engine: Engine::CriO,
            binary: Some(PathBuf::from("/opt/gpuslice/bin/gpuslice-hook")),
            env: vec![DEFAULT_PATH.to_string()],
        };
        let written = install(&r).unwrap();
        assert_eq!(written.len(), 2);
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&written[0]).unwrap()).unwrap();
        assert_eq!(v["hook"]["path"], "/opt/gpuslice/bin/gpuslice-hook");
        assert_eq!(v["stages"][0], "prestart");
        let relative = Request {
            binary: Some(PathBuf::from("gpuslice-hook")),
            ..r
        };
        assert!(
            install(&relative)
                .unwrap_err()
                .to_string()
                .contains("absolute path")
        );
    }
}
