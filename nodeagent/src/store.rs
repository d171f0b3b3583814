//! The ledger on disk: one file per claim, `<state-dir>/claims/<container-id>.json`, each
//! written whole to a temporary file, synced and renamed into place. A rename is atomic, so at
//! any instant of a crash a claim file is either the old one, the new one, or absent; a claim
//! is acknowledged only after its rename (and the directory sync) returned. The state
//! directory is locked (`flock`) while an agent runs, so two agents never share a ledger.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use gpuslice_core::Claim;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to access {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another gpuslice-agent holds the ledger in {0}")]
    Locked(PathBuf),
    #[error("claim file {path} is damaged")]
    Damaged {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub struct Store {
    claims: PathBuf,
    _lock: File,
}

impl Store {
    /// Opens (creating) the ledger in `state_dir` and takes its lock.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        let claims = state_dir.join("claims");
        std::fs::create_dir_all(&claims).map_err(io(&claims))?;
        let lock_path = state_dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::Locked(state_dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
        }
        Ok(Self {
            claims,
            _lock: lock,
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.claims.join(format!("{id}.json"))
    }

    /// Every stored claim. Temporary files of writes that never finished are removed; a
    /// damaged claim file is moved aside (`.damaged`) and reported.
    pub fn load(&self) -> Result<(Vec<Claim>, Vec<StoreError>), StoreError> {
        let mut claims = Vec::new();
        let mut damaged = Vec::new();
        for entry in std::fs::read_dir(&self.claims).map_err(io(&self.claims))? {
            let path = entry.map_err(io(&self.claims))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(".tmp") {
                std::fs::remove_file(&path).map_err(io(&path))?;
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let text = std::fs::read(&path).map_err(io(&path))?;
            match serde_json::from_slice::<Claim>(&text) {
                Ok(c) => claims.push(c),
                Err(source) => {
                    let aside = path.with_extension("damaged");
                    std::fs::rename(&path, &aside).map_err(io(&path))?;
                    damaged.push(StoreError::Damaged { path, source });
                }
            }
        }
        claims.sort_by(|a, b| {
            a.created_unix_ms
                .cmp(&b.created_unix_ms)
                .then(a.container_id.cmp(&b.container_id))
        });
        Ok((claims, damaged))
    }

    /// Writes `claim` durably; returns once it would survive a crash.
    pub fn put(&self, claim: &Claim) -> Result<(), StoreError> {
        let path = self.path(&claim.container_id);
        let tmp = self.claims.join(format!("{}.json.tmp", claim.container_id));
        let body = serde_json::to_vec(claim).map_err(|e| io(&path)(e.into()))?;
        let mut f = File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&body).map_err(io(&tmp))?;
        f.sync_data().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        self.sync_dir()
    }

    /// Removes the claim of `id`; `false` when there was none.
    pub fn remove(&self, id: &str) -> Result<bool, StoreError> {
        let path = self.path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => self.sync_dir().map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path)(e)),
        }
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        File::open(&self.claims)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.claims))
    }
}
