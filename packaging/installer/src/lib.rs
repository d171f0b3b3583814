//! `gpuslice-install`: what the node image's installer container does on a Kubernetes node, as
//! the NVIDIA container toolkit's container does for its runtime. From the image's own files
//! (the Debian package's layout) it puts the runtime wrapper, the hook, the CLI and the
//! interception library with its fronts under a prefix on the host (`/usr/local/gpuslice`),
//! writes `/etc/gpuslice/runtime.json` when the host has none, adds the runtime handler to
//! containerd's configuration through `gpuslice-containerd configure` (or writes CRI-O's
//! drop-in), and restarts the engine when asked. Removal undoes what the record
//! ([`record`]) says it did, leaving what the operator changed since.

pub mod record;

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_core::layout;
pub use record::{Record, RecordError, Undone};
use record::{read_optional, under};

/// The programs put on the host, from the image's `/usr/bin`.
pub const PROGRAMS: &[&str] = &[
    "gpuslice-runtime",
    "gpuslice-hook",
    "gpuslice",
    "gpuslice-containerd",
];

/// CRI-O's drop-in as packaged, in the image.
const CRIO_DROP_IN_SOURCE: &str = "/usr/share/gpuslice/cri-o/99-gpuslice.conf";
/// The runtime configuration on the host.
const RUNTIME_CONFIG: &str = "/etc/gpuslice/runtime.json";

/// Why installing or removing failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{program} failed ({status}): {stderr}")]
    Program {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("failed to run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    CrioDropIn { path: PathBuf, reason: String },
}

/// The container engine whose configuration gets the runtime handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Containerd,
    #[value(name = "cri-o")]
    CriO,
    /// Only the files; the operator configures the engine.
    None,
}

/// How the engine learns of its new configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Not at all: the operator restarts it.
    None,
    /// `systemctl restart <engine>.service` run in the host's root (chroot).
    Systemd,
}

/// Where things are, and what to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the host's `/` is mounted (`/host` in the DaemonSet).
    pub host_root: PathBuf,
    /// Where the files to install are (`/` in the image).
    pub source_root: PathBuf,
    /// Where on the host the programs and libraries go (`bin/`, `lib/`).
    pub prefix: PathBuf,
    pub engine: Engine,
    /// containerd's configuration, as a host path.
    pub containerd_config: PathBuf,
    /// Where CRI-O's drop-in goes, as a host path.
    pub crio_drop_in: PathBuf,
    /// The runtime handler (the RuntimeClass's `handler`).
    pub handler: String,
    pub restart: Restart,
}

impl Options {
    fn record_path(&self) -> PathBuf {
        under(&self.host_root, &self.prefix.join("installed.json"))
    }

    fn source(&self, path: &str) -> PathBuf {
        under(&self.source_root, Path::new(path))
    }

    /// The containerd configurator shipped in the image.
    fn configurator(&self) -> PathBuf {
        self.source("/usr/bin/gpuslice-containerd")
    }

    fn engine_unit(&self) -> Option<&'static str> {
        match self.engine {
            Engine::Containerd => Some("containerd.service"),
            Engine::CriO => Some("crio.service"),
            Engine::None => None,
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), InstallError> {
    let program = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| InstallError::Spawn {
        program: program.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(InstallError::Program {
        program,
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, InstallError> {
    std::fs::read(path).map_err(|source| {
        RecordError::Read {
            path: path.to_owned(),
            source,
        }
        .into()
    })
}

/// The runtime configuration for programs under `prefix`.
fn runtime_config(prefix: &Path) -> String {
    let lib = prefix.join("lib").join(layout::INTERCEPTION_LIBRARY_FILE);
    let hook = prefix.join("bin/gpuslice-hook");
    let config = serde_json::json!({
        "interception_library": lib,
        "hook": hook,
    });
    serde_json::to_string_pretty(&config).expect("a JSON value serializes") + "\n"
}

/// CRI-O's drop-in with the wrapper under `prefix`.
fn crio_drop_in(
    source: &Path,
    text: &str,
    handler: &str,
    runtime: &Path,
) -> Result<String, InstallError> {
    let fail = |reason: String| InstallError::CrioDropIn {
        path: source.to_owned(),
        reason,
    };
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e| fail(format!("not TOML: {e}")))?;
    let runtimes = doc["crio"]["runtime"]["runtimes"]
        .as_table_mut()
        .ok_or_else(|| fail("no [crio.runtime.runtimes] table".into()))?;
    let (name, table) = runtimes
        .iter_mut()
        .next()
        .ok_or_else(|| fail("no runtime handler in it".into()))?;
    let mut table = table
        .as_table()
        .cloned()
        .ok_or_else(|| fail(format!("runtime {} is not a table", name.get())))?;
    table.insert(
        "runtime_path",
        toml_edit::value(runtime.display().to_string()),
    );
    runtimes.clear();
    runtimes.insert(handler, toml_edit::Item::Table(table));
    Ok(doc.to_string())
}

/// Installs onto the host. An earlier installation still recorded there is taken off first,
/// so that an installer restarted after a crash starts from the host as it was.
pub fn install(o: &Options) -> Result<Record, InstallError> {
    if Record::load(&o.record_path())?.is_some() {
        uninstall(o)?;
    }
    let mut record = Record::default();
    if let Err(e) = apply(o, &mut record) {
        // What was done before the failure is undone: the host is left as it was.
        for entry in record.entries.iter().rev() {
            let _ = Record::undo(&o.host_root, entry);
        }
        record.remove_dirs(&o.host_root);
        return Err(e);
    }
    record.save(&o.record_path())?;
    restart(o)?;
    Ok(record)
}

fn apply(o: &Options, record: &mut Record) -> Result<(), InstallError> {
    let root = &o.host_root;
    for program in PROGRAMS {
        let bytes = read(&o.source(&format!("/usr/bin/{program}")))?;
        record.put(root, &o.prefix.join("bin").join(program), &bytes, 0o755)?;
    }
    let libraries = std::iter::once(layout::INTERCEPTION_LIBRARY_FILE)
        .chain(layout::FRONTS.iter().map(|f| f.file));
    for library in libraries {
        let bytes = read(&o.source(&format!("{}/{library}", layout::INTERCEPTION_DIR)))?;
        record.put(root, &o.prefix.join("lib").join(library), &bytes, 0o644)?;
    }
    // The operator's runtime configuration wins: it is written only where there is none.
    if read_optional(&under(root, Path::new(RUNTIME_CONFIG)))?.is_none() {
        let text = runtime_config(&o.prefix);
        record.put(root, Path::new(RUNTIME_CONFIG), text.as_bytes(), 0o644)?;
    }
    let wrapper = o.prefix.join("bin/gpuslice-runtime");
    match o.engine {
        Engine::Containerd => {
            let config = under(root, &o.containerd_config);
            if let Some(dir) = o.containerd_config.parent() {
                record.make_dir(root, dir)?;
            }
            let before = read_optional(&config)?;
            run(Command::new(o.configurator())
                .arg("configure")
                .arg("--config")
                .arg(&config)
                .arg("--handler")
                .arg(&o.handler)
                .arg("--runtime-path")
                .arg(&wrapper))?;
            record.changed(root, &o.containerd_config, before)?;
        }
        Engine::CriO => {
            let source = o.source(CRIO_DROP_IN_SOURCE);
            let text = String::from_utf8_lossy(&read(&source)?).into_owned();
            let text = crio_drop_in(&source, &text, &o.handler, &wrapper)?;
            record.put(root, &o.crio_drop_in, text.as_bytes(), 0o644)?;
        }
        Engine::None => {}
    }
    Ok(())
}

/// What removal did to each file.
pub type Report = Vec<(PathBuf, Undone)>;

/// Takes off what the recorded installation put on the host. containerd's configuration,
/// when edited since, loses only the handler (`gpuslice-containerd unconfigure`).
pub fn uninstall(o: &Options) -> Result<Report, InstallError> {
    let path = o.record_path();
    let Some(record) = Record::load(&path)? else {
        return Ok(Vec::new());
    };
    let root = &o.host_root;
    let mut report = Vec::new();
    for entry in record.entries.iter().rev() {
        let mut undone = Record::undo(root, entry)?;
        if undone == Undone::KeptEdited && entry.path == o.containerd_config {
            run(Command::new(o.configurator())
                .arg("unconfigure")
                .arg("--config")
                .arg(under(root, &entry.path))
                .arg("--handler")
                .arg(&o.handler))?;
            undone = Undone::Restored;
        }
        report.push((entry.path.clone(), undone));
    }
    std::fs::remove_file(&path).map_err(|source| RecordError::Write {
        path: path.clone(),
        source,
    })?;
    record.remove_dirs(root);
    restart(o)?;
    Ok(report)
}

fn restart(o: &Options) -> Result<(), InstallError> {
    match (o.restart, o.engine_unit()) {
        (Restart::Systemd, Some(unit)) => {
            run(Command::new("chroot")
                .arg(&o.host_root)
                .args(["systemctl", "restart", unit]))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
