//! CUDA forward compatibility: an image that carries NVIDIA's cuda-compat package
//! (`/usr/local/cuda/compat/libcuda.so.<version>` and its companions) for a newer driver than
//! the host's runs with that library, as the NVIDIA toolkit arranges it. Here the image's
//! `libcuda` becomes the real driver behind the front (so the wall stays in front of it), and
//! its companions replace the host's under their names.
//!
//! The files are the tenant's: they are used only when they resolve, symbolic links
//! followed, to regular files inside the container's root filesystem (an image's link to a
//! host path is not followed out of it). Nothing of the image runs yet when this is decided.

use std::path::{Path, PathBuf};

use crate::edits::Edits;
use gpuslice_core::layout::{REAL_CUDA, REAL_DRIVER_DIR};

/// Where the cuda-compat package puts its libraries in an image.
pub const COMPAT_DIR: &str = "usr/local/cuda/compat";

/// The libraries of the compat package, by name prefix (`libcuda.so` first).
pub const STEMS: &[&str] = &[
    "libcuda.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libcudadebugger.so",
];

/// The compat libraries an image carries for a newer driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compat {
    /// The driver version they are of (`560.28.03`).
    pub version: String,
    /// (name prefix, the file on the host, inside the root filesystem).
    pub files: Vec<(&'static str, PathBuf)>,
}

fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// The compat libraries in `rootfs` when they are of a newer driver than `host_version`.
#[must_use]
pub fn find(rootfs: &Path, host_version: &str) -> Option<Compat> {
    let root = std::fs::canonicalize(rootfs).ok()?;
    let dir = std::fs::canonicalize(rootfs.join(COMPAT_DIR)).ok()?;
    if !dir.starts_with(&root) {
        return None;
    }
    let names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    // The file of `name`, when it resolves to a regular file inside the root filesystem.
    let inside = |name: &str| -> Option<PathBuf> {
        let p = std::fs::canonicalize(dir.join(name)).ok()?;
        (p.starts_with(&root) && p.is_file()).then_some(p)
    };
    let version = names
        .iter()
        .filter_map(|n| n.strip_prefix("libcuda.so."))
        .filter(|v| v.split('.').count() >= 2 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
        .filter(|v| inside(&format!("libcuda.so.{v}")).is_some())
        .max_by_key(|v| {
            v.split('.')
                .map(|p| p.parse::<u32>().unwrap_or(0))
                .collect::<Vec<_>>()
        })?
        .to_string();
    if major(&version)? <= major(host_version)? {
        return None;
    }
    let files = STEMS
        .iter()
        .filter_map(|stem| Some((*stem, inside(&format!("{stem}.{version}"))?)))
        .collect();
    Some(Compat { version, files })
}

/// Puts `compat`'s libraries in place of the host driver's in `edits`: its `libcuda` as the
/// real driver behind the front, its companions under every name the host's have.
pub fn apply(edits: &mut Edits, compat: &Compat) {
    let real = format!("{REAL_DRIVER_DIR}/{REAL_CUDA}");
    for m in &mut edits.mounts {
        let name = m.destination.rsplit('/').next().unwrap_or_default();
        for (stem, file) in &compat.files {
            let replaces = if *stem == "libcuda.so" {
                m.destination == real
            } else {
                !m.destination.starts_with(REAL_DRIVER_DIR)
                    && name
                        .strip_prefix(stem)
                        .is_some_and(|rest| rest.starts_with('.'))
            };
            if replaces {
                m.source.clone_from(file);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let compat = dir.path().join(COMPAT_DIR);
        std::fs::create_dir_all(&compat).unwrap();
        for f in files {
            std::fs::write(compat.join(f), "elf").unwrap();
        }
        dir
    }

    #[test]
    fn a_newer_compat_driver_is_found_and_an_older_one_is_not() {
        let root = root_with(&[
            "libcuda.so.560.28.03",
            "libnvidia-ptxjitcompiler.so.560.28.03",
        ]);
        let c = find(root.path(), "550.54.15").unwrap();
        assert_eq!(c.version, "560.28.03");
        assert_eq!(c.files.len(), 2);
        assert!(
            find(root.path(), "560.35.03").is_none(),
            "same branch: the host's is used"
        );
        assert!(
            find(root.path(), "570.86.10").is_none(),
            "older than the host's"
        );
    }

    #[test]
    fn a_compat_directory_that_leads_out_of_the_image_is_not_followed() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("libcuda.so.999.1.1"), "host file").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/local/cuda")).unwrap();
        std::os::unix::fs::symlink(host.path(), root.path().join(COMPAT_DIR)).unwrap();
        assert_eq!(find(root.path(), "550.54.15"), None);
        // A file inside that links out is not taken either.
        let root = root_with(&[]);
        std::os::unix::fs::symlink(
            host.path().join("libcuda.so.999.1.1"),
            root.path().join(COMPAT_DIR).join("libcuda.so.999.1.1"),
        )
        .unwrap();
        assert_eq!(find(root.path(), "550.54.15"), None);
    }
}
