//! Each admitted container's directory, `<run-dir>/<container-id>/`:
//!
//! - `limits`: the limits file (root-owned, mode 0444), read by the interception library;
//! - `usage`: the usage region (mode 0666), mapped by every process of the container;
//! - `held`: what the driver holds for the container's processes beyond their counters
//!   (mode 0444, written by the agent alone: [`crate::held`]), mapped by them read-only.
//!
//! The runtime bind-mounts the directory into the container at /run/gpuslice; the agent
//! removes it when the claim is released.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpuslice_core::{Claim, limits, usage};

#[derive(Debug, thiserror::Error)]
#[error("failed to write {path}")]
pub struct RunDirError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
    /// Written to every limits file as each GPU's `context_bytes`: by GPU UUID, what one
    /// context costs there.
    context_bytes: std::collections::BTreeMap<String, u64>,
    /// What to charge per context on a GPU missing from `context_bytes`.
    context_bytes_otherwise: u64,
    /// The CDI directory where a claim's slice spec may have been written
    /// (`gpuslice claim --cdi`): removed with the claim's directory.
    cdi_dir: Option<PathBuf>,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, RunDirError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))
            .map_err(io(&root))?;
        Ok(Self {
            root,
            context_bytes: std::collections::BTreeMap::new(),
            context_bytes_otherwise: 0,
            cdi_dir: None,
        })
    }

    /// Removes the CDI spec of a claim's slice from `dir` with the claim's directory.
    #[must_use]
    pub fn with_cdi_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cdi_dir = dir;
        self
    }

    /// Each CUDA context a container's process creates on a GPU is charged what `costs`
    /// says one costs there (by GPU UUID), or `otherwise`.
    #[must_use]
    pub fn with_context_bytes(
        mut self,
        costs: std::collections::BTreeMap<String, u64>,
        otherwise: u64,
    ) -> Self {
        self.context_bytes = costs;
        self.context_bytes_otherwise = otherwise;
        self
    }

    #[must_use]
    pub fn path(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Creates or refreshes the directory of `claim`. The usage region is created once and
    /// kept on later calls, since processes may already have it mapped.
    pub fn create(&self, claim: &Claim) -> Result<PathBuf, RunDirError> {
        let dir = self.path(&claim.container_id);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(io(&dir))?;
        let mut limits = limits::Limits::from_claim(claim);
        for g in &mut limits.gpus {
            g.context_bytes = self
                .context_bytes
                .get(&g.uuid)
                .copied()
                .unwrap_or(self.context_bytes_otherwise);
        }
        let text = limits.render();
        write_atomic(&dir.join(limits::FILE_NAME), text.as_bytes(), 0o444)?;
        let usage_path = dir.join(usage::FILE_NAME);
        if !usage_path.exists() {
            let region = usage::new_region(claim.gpus.len(), usage::DEFAULT_SLOTS);
            write_atomic(&usage_path, &region, 0o666)?;
        }
        crate::held::create(&dir, claim.gpus.len(), |p, b| {
            write_atomic(p, b, 0o444).map_err(|e| e.source)
        })
        .map_err(io(&dir.join(gpuslice_core::held::FILE_NAME)))?;
        Ok(dir)
    }

    pub fn remove(&self, id: &str) -> Result<(), RunDirError> {
        if let Some(cdi) = &self.cdi_dir {
            let spec = cdi.join(gpuslice_core::layout::cdi_slice_file(id));
            match std::fs::remove_file(&spec) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&spec)(e)),
                _ => {}
            }
        }
        let dir = self.path(id);
        // The sample-request listener may bind the container's socket in the directory while
        // it is being removed (it read the claims just before this one's release): it binds
        // once per claim, so a second pass removes what it put there.
        let mut passes = 0;
        loop {
            passes += 1;
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && passes < 3 => {}
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&dir)(e)),
                _ => return Ok(()),
            }
        }
    }

    /// Ids of the container directories present: every directory here, including one whose
    /// creation a crash interrupted before its limits file was in place (the run directory
    /// belongs to the agent alone).
    #[must_use]
    pub fn list(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }

    /// The mount options this directory lacks of `nosuid`, `nodev` and `noexec`. A container's
    /// root can chmod its writable usage region and write a program into it: only a run
    /// directory on a filesystem mounted with all three keeps that from becoming a setuid
    /// program or a device on the host (packaging/systemd/run-gpuslice.mount mounts one).
    #[must_use]
    pub fn missing_mount_options(&self) -> Vec<&'static str> {
        use nix::sys::statvfs::{FsFlags, statvfs};
        let Ok(st) = statvfs(&self.root) else {
            return vec!["nosuid", "nodev", "noexec"];
        };
        let flags = st.flags();
        [
            (FsFlags::ST_NOSUID, "nosuid"),
            (FsFlags::ST_NODEV, "nodev"),
            (FsFlags::ST_NOEXEC, "noexec"),
        ]
        .into_iter()
        .filter(|(f, _)| !flags.contains(*f))
        .map(|(_, name)| name)
        .collect()
    }

    /// Bytes in use on each of the `gpus` GPUs of container `id`, from its usage region, or
    /// why the region cannot be believed (it is the container's to write).
    pub fn usage(&self, id: &str, gpus: usize) -> Result<Vec<u64>, crate::usage::Tamper> {
        crate::usage::read_totals(&self.path(id), gpus)
    }

    /// The live slots of container `id`'s usage region.
    pub fn live_slots(
        &self,
        id: &str,
        gpus: usize,
    ) -> Result<gpuslice_core::usage::UsageSnapshot, crate::usage::Tamper> {
        crate::usage::read_live(&self.path(id), gpus)
    }

    /// Counts a sample of container `id` as begun ([`crate::held::begin`]); the sample
    /// publishes what it found.
    pub fn begin_held(
        &self,
        id: &str,
        gpus: usize,
    ) -> Result<crate::held::Sample, crate::held::HeldError> {
        crate::held::begin(&self.path(id), gpus)
    }
}

/// Writes `path` whole by a rename. The directory may be a container's, whose root can plant
/// anything in it: the temporary file is made anew (a link planted under its name is removed,
/// never followed) and the rename replaces whatever `path` was without following it.
fn write_atomic(path: &Path, body: &[u8], mode: u32) -> Result<(), RunDirError> {
    let tmp = path.with_extension("tmp");
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            // A directory planted under the name: take it away too.
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(body).map_err(io(&tmp))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io(&tmp))?;
    f.sync_data().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}
