//! The few facts read from the host: where the driver's files are, and when a process started.

use std::path::{Path, PathBuf};

/// Directories under a driver root where the driver's libraries live, in lookup order.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
    "lib",
];

/// The NVML library's soname.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";
/// The CUDA driver library's soname.
pub const CUDA_SONAME: &str = "libcuda.so.1";

/// A tree holding the driver's user-space files: `/` on a GPU node, or a simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    pub root: PathBuf,
}

impl DriverRoot {
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The first file named `soname` in the driver root's library directories.
    #[must_use]
    pub fn find_library(&self, soname: &str) -> Option<PathBuf> {
        LIBRARY_DIRS
            .iter()
            .map(|d| self.root.join(d).join(soname))
            .find(|p| p.exists())
    }

    /// Path of device node `name` (e.g. `nvidia0`) under this root.
    #[must_use]
    pub fn device(&self, name: &str) -> PathBuf {
        self.root.join("dev").join(name)
    }
}

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`), or
/// `None` when no such process exists.
#[must_use]
pub fn process_start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 of a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
#[must_use]
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After ")" come field 3 (state) onwards; start time is field 22, the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let stat =
            "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
    }

    #[test]
    fn own_process_has_a_start_time_and_a_free_pid_has_none() {
        let me = std::process::id();
        assert!(process_start_time(Path::new("/proc"), me).is_some());
        assert_eq!(process_start_time(Path::new("/proc"), u32::MAX - 1), None);
    }
}
