//! Paths of the container, resolved by the kernel beneath its open root filesystem:
//! `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` walks one component at a time from a
//! descriptor, so no component may be a link and nothing outside the root can be reached,
//! whatever is renamed meanwhile: what is checked is what is used (the descriptor), never a
//! path looked up again. Mounts go onto the descriptor's `/proc/self/fd` link, which the kernel
//! resolves to that very inode.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag, mkdirat, mknodat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// The container's root filesystem, open.
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

fn how(flags: OFlag, mode: u32) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
}

/// The parts of an absolute container path; `..` and anything but plain names refused.
fn parts(inner: &str) -> Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in Path::new(inner).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            _ => bail!("{inner:?} is not a plain absolute path"),
        }
    }
    if out.is_empty() {
        bail!("{inner:?} names the root itself");
    }
    Ok(out)
}

impl Root {
    pub fn open(path: &Path) -> Result<Self> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("failed to open the root filesystem {}", path.display()))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn error(&self, inner: &str, e: Errno) -> anyhow::Error {
        if e == Errno::ELOOP {
            anyhow::anyhow!(
                "refusing to follow a symbolic link on the way to {inner} in the container's root filesystem {}",
                self.path.display()
            )
        } else if e == Errno::EXDEV {
            anyhow::anyhow!(
                "{inner} leads out of the container's root filesystem {}",
                self.path.display()
            )
        } else {
            anyhow::Error::from(e).context(format!(
                "{inner} in the container's root filesystem {}",
                self.path.display()
            ))
        }
    }

    /// The directory holding `inner`, made where missing, and the last part's name.
    fn parent<'a>(&self, inner: &'a str) -> Result<(OwnedFd, &'a OsStr)> {
        let parts = parts(inner)?;
        let (last, dirs) = parts.split_last().context("empty path")?;
        let mut dir = self.fd.try_clone()?;
        for part in dirs {
            let open = |d: &OwnedFd| openat2(d, *part, how(OFlag::O_PATH | OFlag::O_DIRECTORY, 0));
            dir = match open(&dir) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    match mkdirat(&dir, *part, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(self.error(inner, e)),
                    }
                    open(&dir).map_err(|e| self.error(inner, e))?
                }
                Err(e) => return Err(self.error(inner, e)),
            };
        }
        Ok((dir, *last))
    }

    /// A descriptor of `inner` as a mount target: a directory (made where missing) when
    /// `directory`, else a file (an empty one made where missing).
    pub fn target(&self, inner: &str, directory: bool) -> Result<OwnedFd> {
        let (dir, name) = self.parent(inner)?;
        if directory {
            match mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(self.error(inner, e)),
            }
            openat2(&dir, name, how(OFlag::O_PATH | OFlag::O_DIRECTORY, 0))
        } else {
            match openat2(&dir, name, how(OFlag::O_PATH, 0)) {
                Err(Errno::ENOENT) => {
                    drop(openat2(
                        &dir,
                        name,
                        how(OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDONLY, 0o644),
                    ));
                    openat2(&dir, name, how(OFlag::O_PATH, 0))
                }
                other => other,
            }
        }
        .map_err(|e| self.error(inner, e))
    }

    /// Creates the character device `inner` (replacing a file of that name) with `mode`.
    pub fn device(&self, inner: &str, mode: u32, dev: u64) -> Result<()> {
        let (dir, name) = self.parent(inner)?;
        let _ = unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir);
        mknodat(
            &dir,
            name,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(mode),
            dev,
        )
        .map_err(|e| self.error(inner, e))?;
        // mknod applies the umask: set the mode on the node just made, by descriptor.
        let node = openat2(&dir, name, how(OFlag::O_PATH, 0)).map_err(|e| self.error(inner, e))?;
        std::fs::set_permissions(
            fd_path(&node),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .with_context(|| format!("failed to set the mode of {inner}"))
    }
}

/// The `/proc/self/fd` link of a descriptor, which the kernel resolves to its very inode.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbolic_link_anywhere_on_the_way_is_refused_and_nothing_is_made_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("usr/passwd")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        let e = root
            .target("/usr/lib/x86_64-linux-gnu/libcuda.so.1", false)
            .unwrap_err();
        assert!(
            e.to_string().contains("refusing to follow a symbolic link"),
            "{e}"
        );
        assert!(root.target("/usr/passwd", false).is_err());
        assert!(root.target("/../etc/passwd", false).is_err());
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "made outside"
        );
        let fd = root.target("/usr/bin/x", false).unwrap();
        assert_eq!(
            std::fs::canonicalize(fd_path(&fd)).unwrap(),
            std::fs::canonicalize(dir.path().join("usr/bin/x")).unwrap()
        );
        let d = root.target("/run/gpuslice", true).unwrap();
        assert!(std::fs::metadata(fd_path(&d)).unwrap().is_dir());
    }
}
