//! Requests for a fresh sample of the driver, one datagram socket per container
//! ([`gpuslice_core::held::REQUEST_SOCKET`] in its directory, which the container sees
//! read-only; a socket can still be sent to through a read-only mount). The interception
//! library sends a datagram when an allocation would bring the container near its limit on a
//! sample older than a moment, so that what the driver took since the last sample (a
//! framework's start-up, a pool's reservation) is charged before the last bytes are granted.
//!
//! What a datagram says is never read: it only marks its container as asking. Requests
//! coalesce (one pending mark per container, whatever the number of datagrams), and the
//! backstop serves them at most once per [`MIN_GAP`], so a container that sends without end
//! costs the agent one small sample of its own GPUs per gap and nothing more.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// The least time between two samples made on request.
pub const MIN_GAP: Duration = Duration::from_millis(10);

/// The containers' sockets and the requests they received.
#[derive(Default)]
pub struct Requests {
    pending: Mutex<BTreeSet<String>>,
    arrived: tokio::sync::Notify,
    listeners: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Requests {
    /// Listens for the containers `ids` (each with its directory `dir_of(id)`), and for no
    /// others. Once a container's socket is bound, a sample is counted as begun in its file
    /// ([`crate::held::begin`] with the GPU count `gpus_of(id)`): its processes know from
    /// then on that they may ask. A socket that cannot be made is logged; that container's
    /// requests are not taken, and its processes do not wait for them.
    pub fn listen_for(
        self: &std::sync::Arc<Self>,
        ids: &[String],
        dir_of: impl Fn(&str) -> std::path::PathBuf,
        gpus_of: impl Fn(&str) -> usize,
    ) {
        let mut listeners = self
            .listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        listeners.retain(|id, task| {
            let keep = ids.contains(id) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for id in ids {
            if listeners.contains_key(id) {
                continue;
            }
            let dir = dir_of(id);
            let path = dir.join(gpuslice_core::held::REQUEST_SOCKET);
            match bind(&path) {
                Ok(socket) => {
                    if let Err(e) = crate::held::begin(&dir, gpus_of(id)) {
                        tracing::debug!(container = %id, "sample requests not announced: {e}");
                    }
                    let me = std::sync::Arc::clone(self);
                    let owner = id.clone();
                    let task = tokio::spawn(async move { me.receive(&owner, socket).await });
                    listeners.insert(id.clone(), task);
                }
                Err(e) => {
                    tracing::debug!(container = %id, path = %path.display(), "no socket for sample requests: {e}");
                }
            }
        }
    }

    async fn receive(&self, id: &str, socket: tokio::net::UnixDatagram) {
        let mut buf = [0u8; 64];
        loop {
            match socket.recv(&mut buf).await {
                Ok(_) => {
                    self.pending
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(id.to_string());
                    self.arrived.notify_one();
                }
                Err(e) => {
                    tracing::debug!(container = %id, "sample requests end: {e}");
                    return;
                }
            }
        }
    }

    /// Waits until some container has asked.
    pub async fn asked(&self) {
        self.arrived.notified().await;
    }

    /// The containers that asked since the last call.
    pub fn take(&self) -> BTreeSet<String> {
        std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// A datagram socket at `path` that anyone can send to (the container's users are not the
/// agent's), replacing what a previous agent left there.
fn bind(path: &Path) -> std::io::Result<tokio::net::UnixDatagram> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let socket = tokio::net::UnixDatagram::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn datagrams_from_anyone_mark_their_container_once_and_say_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        for id in ["a", "b"] {
            let dir = root.path().join(id);
            std::fs::create_dir(&dir).unwrap();
            crate::held::create(&dir, 1, |p, b| std::fs::write(p, b)).unwrap();
        }
        let requests = Arc::new(Requests::default());
        let ids = vec!["a".to_string(), "b".to_string()];
        requests.listen_for(&ids, |id| root.path().join(id), |_| 1);
        let path = root
            .path()
            .join("a")
            .join(gpuslice_core::held::REQUEST_SOCKET);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        // Its processes are told they may ask.
        let held = std::fs::read(root.path().join("a").join(gpuslice_core::held::FILE_NAME));
        let at = gpuslice_core::held::HEADER_BEGUN;
        assert_eq!(
            u64::from_le_bytes(held.unwrap()[at..at + 8].try_into().unwrap()),
            1
        );
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        sender.set_nonblocking(true).unwrap();
        // More than the socket queues: the rest are refused to the sender, not waited for.
        let sent = (0..100)
            .filter(|_| sender.send_to(b"anything at all", &path).is_ok())
            .count();
        assert!(sent >= 1);
        tokio::time::timeout(Duration::from_secs(5), requests.asked())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(requests.take(), BTreeSet::from(["a".to_string()]));
        assert!(requests.take().is_empty());
    }

    #[tokio::test]
    async fn a_container_no_longer_listed_stops_being_heard() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        let requests = Arc::new(Requests::default());
        requests.listen_for(&["a".to_string()], |id| root.path().join(id), |_| 1);
        requests.listen_for(&[], |id| root.path().join(id), |_| 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let path = root
            .path()
            .join("a")
            .join(gpuslice_core::held::REQUEST_SOCKET);
        let sender = std::os::unix::net::UnixDatagram::unbound().unwrap();
        // The socket is closed: the datagram has nowhere to go.
        assert!(sender.send_to(b"x", &path).is_err());
        assert!(requests.take().is_empty());
    }
}
