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
    read_live(dir, gpus).map(|s| s.totals())
}

/// The live slots of the usage region of the container whose directory is `dir`.
pub fn read_live(dir: &Path, gpus: usize) -> Result<UsageSnapshot, Tamper> {
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
    (&file)
        .take(expected)
        .read_to_end(&mut buf)
        .map_err(|e| Tamper::Io(e.to_string()))?;
    if buf.len() as u64 != expected {
        return Err(Tamper::Size {
            found: buf.len() as u64,
            expected,
        });
    }
    let mut snapshot = UsageSnapshot::parse(&buf).map_err(|e| Tamper::Header(e.to_string()))?;
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
    // Only live owners' slots count: a slot's owner holds its lock until it exits or execs
    // (a process killed before any library process reaped its slot holds nothing). A region
    // where no slot is locked at all is an older library's, which takes no locks: all count.
    let locked: std::collections::HashSet<usize> = snapshot
        .slots
        .iter()
        .map(|s| s.index)
        .filter(|i| slot_locked(&file, *i))
        .collect();
    if !locked.is_empty() {
        snapshot.slots.retain(|s| locked.contains(&s.index));
    }
    Ok(snapshot)
}

/// Whether some process holds slot `index`'s lock (an open-file-description lock on byte
/// `SLOT_LOCK_BASE + index`); asking takes no lock and never waits.
fn slot_locked(file: &std::fs::File, index: usize) -> bool {
    let start = usage::SLOT_LOCK_BASE + index as u64;
    let Ok(start) = i64::try_from(start) else {
        return false;
    };
    let mut fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: 1,
        l_pid: 0,
    };
    nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_GETLK(&mut fl)).is_ok()
        && fl.l_type != libc::F_UNLCK as libc::c_short
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region of one GPU with slot 0 (pid 10) holding 100 bytes and slot 1 (pid 11) 1000.
    fn region(dir: &Path) -> std::fs::File {
        let mut r = usage::new_region(1, usage::DEFAULT_SLOTS);
        for (i, pid, used) in [(0usize, 10u32, 100u64), (1, 11, 1000)] {
            let at = usage::HEADER_SIZE + i * usage::SLOT_SIZE;
            r[at..at + 4].copy_from_slice(&pid.to_le_bytes());
            r[at + usage::SLOT_USED..at + usage::SLOT_USED + 8]
                .copy_from_slice(&used.to_le_bytes());
        }
        r[usage::HEADER_HIGH_WATER..usage::HEADER_HIGH_WATER + 4]
            .copy_from_slice(&2u32.to_le_bytes());
        let path = dir.join(usage::FILE_NAME);
        std::fs::write(&path, r).unwrap();
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    fn lock(file: &std::fs::File, slot: usize) {
        let fl = libc::flock {
            l_type: libc::F_WRLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: i64::try_from(usage::SLOT_LOCK_BASE).unwrap() + slot as i64,
            l_len: 1,
            l_pid: 0,
        };
        nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&fl)).unwrap();
    }

    #[test]
    fn only_slots_whose_owner_holds_its_lock_count() {
        let dir = tempfile::tempdir().unwrap();
        let file = region(dir.path());
        // No slot locked: an older library's region, every slot counts.
        assert_eq!(read_totals(dir.path(), 1).unwrap(), vec![1100]);
        // Slot 0's owner lives; slot 1's is gone (its lock went with it).
        lock(&file, 0);
        assert_eq!(read_totals(dir.path(), 1).unwrap(), vec![100]);
        lock(&file, 1);
        assert_eq!(read_totals(dir.path(), 1).unwrap(), vec![1100]);
    }
}
