//! The agent's private socket: its D-Bus interface served peer to peer, without the bus
//! daemon in between, as systemd serves `/run/systemd/private` to `systemctl`. The runtime
//! wrapper and the hook, which run as root at every GPU container's create and delete,
//! connect here first: no bus handshake and no name to assign, and each call takes one hop
//! instead of two.
//!
//! Who may use it: the socket is made mode 0600 (root's) under a temporary name and only
//! then renamed into place, in a directory only root can write (another is refused), so no
//! other user can ever connect or put a socket of their own in its place; every call that
//! changes the ledger checks again that the peer's uid, which the kernel gives for the
//! socket, is 0 (`AgentApi::require_root`); and clients take the socket only when the kernel
//! says root listens on it.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::net::UnixListener;

use crate::OBJECT_PATH;
use crate::dbus::{AgentApi, Shared};

/// How long a client has to finish the D-Bus handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PrivateSocketError {
    #[error("{path} exists and is not a socket; not replacing it")]
    NotASocket { path: PathBuf },
    #[error(
        "{dir}: {why}, so another user could put their own socket in place of the agent's; give the private socket a directory only root can write"
    )]
    UnsafeDirectory { dir: PathBuf, why: String },
    #[error("failed to set up the private socket {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PrivateSocketError + '_ {
    move |source| PrivateSocketError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Listens at `path`, replacing the socket a previous agent left there (the caller holds the
/// ledger's lock, so no other agent is using it). Must run inside the tokio runtime.
pub fn listen(path: &Path) -> Result<UnixListener, PrivateSocketError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let meta = std::fs::metadata(dir).map_err(io(dir))?;
    let unsafe_dir = |why: String| PrivateSocketError::UnsafeDirectory {
        dir: dir.to_path_buf(),
        why,
    };
    if meta.uid() != 0 {
        return Err(unsafe_dir(format!("owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "mode {:o} lets others write",
            meta.mode() & 0o7777
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(io(path))?,
        Ok(_) => {
            return Err(PrivateSocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    let mut name = path.as_os_str().to_owned();
    name.push(".new");
    let staging = PathBuf::from(name);
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(io(&staging))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .map_err(io(&staging))?;
    std::fs::rename(&staging, path).map_err(io(path))?;
    Ok(listener)
}

/// Serves the agent's interface on every connection made to `listener`, until the agent
/// stops.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!("private socket: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let handshake = async {
                zbus::connection::Builder::unix_stream(stream)
                    .server(zbus::Guid::generate())?
                    .p2p()
                    .serve_at(OBJECT_PATH, AgentApi::new(shared))?
                    .build()
                    .await
            };
            let conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    tracing::debug!("private socket: handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!("private socket: handshake timed out");
                    return;
                }
            };
            // Every message also comes out of this stream; it ends with the connection.
            let mut messages = zbus::MessageStream::from(&conn);
            while let Some(m) = messages.next().await {
                if m.is_err() {
                    break;
                }
            }
        });
    }
}
