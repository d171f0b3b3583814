//! Reading a container's usage region without trusting it. The region lives in the
//! container's directory, which the container can write: its root may replace the file with a
//! FIFO (a plain read would block forever), a symbolic link to a host file, a directory, a
//! device node, a huge or a truncated file, or garbage. Every read here opens the file without
//! following a link and without blocking, checks that it is a regular file of exactly the size
//! the agent created, reads that many bytes and no more, and checks the header against the
//! claim; anything else is a [`Tamper`], never a stall and never a read of something else.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use gpuslice_core::usage::{self, UsageSnapshot};

/// Why a container's usage region cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Tamper {
    #[error("the usage region is missing")]
    Missing,
    #[error("the usage region is a symbolic link")]
    Symlink,
    #[error("the usage region is a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("the usage region is {found} bytes, {expected} expected")]
    Size { found: u64, expected: u64 },
    #[error("the usage region's header was rewritten: {0}")]
    Header(String),
    #[error("the usage region cannot be read: {0}")]
    Io(String),
}

impl Tamper {
    /// A short name of the kind of tampering, for metric labels.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Symlink => "symlink",
            Self::NotRegular(_) => "not_regular",
            Self::Size { .. } => "size",
            Self::Header(_) => "header",
            Self::Io(_) => "io",
        }
    }

    /// Whether this is what a container that has not started yet shows: no region at all
    /// is tampering only once the container runs.
    #[must_use]
    pub fn is_missing(&self) -> bool {
        matches!(self, Self::Missing)
    }
}

fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Bytes in use on each of the `gpus` GPUs of the container whose directory is `dir`.
pub fn read_totals(dir: &Path, gpus: usize) -> Result<Vec<u64>, Tamper> {
    let expected = usage::region_size(usage::DEFAULT_SLOTS) as u64;
    let path = dir.join(usage::FILE_NAME);
    // O_PATH opens nothing (no FIFO rendezvous, no device open); O_NOFOLLOW refuses a link.
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Tamper::Missing,
            Some(libc::ELOOP) => Tamper::Symlink,
            _ => Tamper::Io(e.to_string()),
        })?;
    let meta = handle.metadata().map_err(|e| Tamper::Io(e.to_string()))?;
    let t = meta.file_type();
    if t.is_symlink() {
        return Err(Tamper::Symlink);
    }
    if !t.is_file() {
        return Err(Tamper::NotRegular(kind(t)));
    }
    if meta.len() != expected {
        return Err(Tamper::Size {
            found: meta.len(),
            expected,
        });
    }
    // Reopen the very inode the handle names for reading; it is a regular file, so the read
    // cannot block on a writer, and no more than the expected bytes are read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&handle)
        ))
        .map_err(|e| Tamper::Io(e.to_string()))?;
    let reopened = file.metadata().map_err(|e| Tamper::Io(e.to_string()))?;
    if (reopened.dev(), reopened.ino()) != (meta.dev(), meta.ino()) || !reopened.is_file() {
        return Err(Tamper::Io("the file changed while it was opened".into()));
    }
    let mut buf = Vec::with_capacity(expected as usize);
    file.take(expected)
        .read_to_end(&mut buf)
        .map_err(|e| Tamper::Io(e.to_string()))?;
    if buf.len() as u64 != expected {
        return Err(Tamper::Size {
            found: buf.len() as u64,
            expected,
        });
    }
    let snapshot = UsageSnapshot::parse(&buf).map_err(|e| Tamper::Header(e.to_string()))?;
    if snapshot.gpu_count != gpus {
        return Err(Tamper::Header(format!(
            "it names {} GPU(s), the claim has {gpus}",
            snapshot.gpu_count
        )));
    }
    let slots = u32::from_le_bytes([buf[16], buf[17], buf[18], buf[19]]) as usize;
    if slots != usage::DEFAULT_SLOTS {
        return Err(Tamper::Header(format!(
            "it has {slots} slots, {} were made",
            usage::DEFAULT_SLOTS
        )));
    }
    Ok(snapshot.totals())
}
