//! What the installer did to a host, kept on the host (`<prefix>/installed.json`) so that
//! removal undoes exactly that and nothing the operator did since: a file is taken back only
//! while it is still what the installer wrote (as dpkg treats conffiles); an edited one stays,
//! and removal says so.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an installation record: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// One file the installer wrote, by its path on the host (not under the host root's mount
/// point, so the record stays right wherever the host is mounted next time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: PathBuf,
    /// SHA-256 of what the installer wrote, hex.
    pub sha256: String,
    /// What the file held before (None: it did not exist).
    pub before: Option<String>,
}

/// Everything the installer did, in the order it did it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub entries: Vec<Entry>,
    /// Directories it created, outermost first.
    pub dirs: Vec<PathBuf>,
}

/// What undoing one entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undone {
    Removed,
    Restored,
    /// The file changed since the installer wrote it, and was left as it is.
    KeptEdited,
    /// It was already gone.
    Missing,
}

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `path` (a host path) under `root`.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, RecordError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RecordError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `bytes` to `path` through a new file renamed over it, so that a running program
/// (the runtime wrapper, while containerd runs it) is replaced, never rewritten in place.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), RecordError> {
    let err = |source| RecordError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("gpuslice-new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    file.write_all(bytes).map_err(err)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

impl Record {
    pub fn load(path: &Path) -> Result<Option<Record>, RecordError> {
        let Some(bytes) = read_optional(path)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RecordError::Parse {
                path: path.to_owned(),
                source,
            })
    }

    pub fn save(&self, path: &Path) -> Result<(), RecordError> {
        let text = serde_json::to_vec_pretty(self).expect("a record serializes");
        write_atomically(path, &text, 0o644)
    }

    /// Creates the host directory `dir` (and its missing parents) under `root`, remembering
    /// those it made.
    pub fn make_dir(&mut self, root: &Path, dir: &Path) -> Result<(), RecordError> {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(d) = at {
            if under(root, d).exists() {
                break;
            }
            missing.push(d.to_owned());
            at = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(under(root, &d)).map_err(|source| RecordError::Write {
                path: under(root, &d),
                source,
            })?;
            self.dirs.push(d);
        }
        Ok(())
    }

    /// Writes `bytes` to the host file `path` under `root` and remembers what it held before.
    pub fn put(
        &mut self,
        root: &Path,
        path: &Path,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), RecordError> {
        if let Some(dir) = path.parent() {
            self.make_dir(root, dir)?;
        }
        let file = under(root, path);
        let before = read_optional(&file)?;
        write_atomically(&file, bytes, mode)?;
        self.entries.push(Entry {
            path: path.to_owned(),
            sha256: sha256(bytes),
            before: before.map(|b| String::from_utf8_lossy(&b).into_owned()),
        });
        Ok(())
    }

    /// Remembers a host file something else changed from `before` to what it holds now.
    pub fn changed(
        &mut self,
        root: &Path,
        path: &Path,
        before: Option<Vec<u8>>,
    ) -> Result<(), RecordError> {
        let file = under(root, path);
        let now = read_optional(&file)?.unwrap_or_default();
        self.entries.push(Entry {
            path: path.to_owned(),
            sha256: sha256(&now),
            before: before.map(|b| String::from_utf8_lossy(&b).into_owned()),
        });
        Ok(())
    }

    /// Undoes one entry: a file still as written is removed, or given back what it held.
    pub fn undo(root: &Path, entry: &Entry) -> Result<Undone, RecordError> {
        let file = under(root, &entry.path);
        let Some(now) = read_optional(&file)? else {
            return Ok(Undone::Missing);
        };
        if sha256(&now) != entry.sha256 {
            return Ok(Undone::KeptEdited);
        }
        match &entry.before {
            Some(text) => {
                let mode = std::fs::metadata(&file)
                    .map(|m| m.permissions().mode() & 0o7777)
                    .unwrap_or(0o644);
                write_atomically(&file, text.as_bytes(), mode)?;
                Ok(Undone::Restored)
            }
            None => {
                std::fs::remove_file(&file).map_err(|source| RecordError::Write {
                    path: file.clone(),
                    source,
                })?;
                Ok(Undone::Removed)
            }
        }
    }

    /// Removes the directories the installer made that are empty now, innermost first.
    pub fn remove_dirs(&self, root: &Path) {
        for d in self.dirs.iter().rev() {
            // A directory something else put files in since stays.
            let _ = std::fs::remove_dir(under(root, d));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_over_another_is_given_back_and_a_new_one_removed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/old.conf"), "operator's\n").unwrap();
        let mut record = Record::default();
        record
            .put(root.path(), Path::new("/etc/old.conf"), b"ours\n", 0o644)
            .unwrap();
        record
            .put(
                root.path(),
                Path::new("/opt/x/bin/tool"),
                b"#!/bin/true\n",
                0o755,
            )
            .unwrap();
        assert_eq!(
            record.dirs,
            [
                Path::new("/opt"),
                Path::new("/opt/x"),
                Path::new("/opt/x/bin")
            ]
        );
        let mode = std::fs::metadata(root.path().join("opt/x/bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        let undone: Vec<_> = record
            .entries
            .iter()
            .map(|e| Record::undo(root.path(), e).unwrap())
            .collect();
        assert_eq!(undone, [Undone::Restored, Undone::Removed]);
        record.remove_dirs(root.path());
        assert_eq!(
            std::fs::read_to_string(root.path().join("etc/old.conf")).unwrap(),
            "operator's\n"
        );
        assert!(!root.path().join("opt").exists());
    }

    #[test]
    fn a_file_edited_after_the_install_is_left_as_the_operator_made_it() {
        let root = tempfile::tempdir().unwrap();
        let mut record = Record::default();
        record
            .put(
                root.path(),
                Path::new("/etc/gpuslice/runtime.json"),
                b"{}",
                0o644,
            )
            .unwrap();
        std::fs::write(
            root.path().join("etc/gpuslice/runtime.json"),
            "{\"runtime\":\"crun\"}",
        )
        .unwrap();
        assert_eq!(
            Record::undo(root.path(), &record.entries[0]).unwrap(),
            Undone::KeptEdited
        );
        record.remove_dirs(root.path());
        assert!(root.path().join("etc/gpuslice/runtime.json").exists());
    }

    #[test]
    fn a_record_survives_a_save_and_load_and_a_damaged_one_is_named() {
        let root = tempfile::tempdir().unwrap();
        let mut record = Record::default();
        record
            .put(root.path(), Path::new("/a"), b"1", 0o600)
            .unwrap();
        let path = root.path().join("installed.json");
        record.save(&path).unwrap();
        assert_eq!(Record::load(&path).unwrap(), Some(record));
        assert_eq!(
            Record::load(&root.path().join("absent.json")).unwrap(),
            None
        );
        std::fs::write(&path, "{\"entries\": 5").unwrap();
        let e = Record::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("installed.json is not an installation record"),
            "{e}"
        );
    }
}
