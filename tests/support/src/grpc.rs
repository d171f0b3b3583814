//! gRPC clients over a Unix socket, as the kubelet dials its plugins and containerd's CRI.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the gRPC server listening on `socket` (the URI is a placeholder: every
/// connection goes to the socket).
pub async fn unix_channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .expect("a constant URI")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// As [`unix_channel`], trying again for up to `patience` while the connection fails: the
/// socket file appears when the server binds it, a moment before it listens, and the
/// kubelet's own dialer tries again too.
pub async fn unix_channel_when_listening(socket: &Path, patience: Duration) -> Channel {
    let started = Instant::now();
    loop {
        match unix_channel(socket).await {
            Ok(channel) => return channel,
            Err(_) if started.elapsed() < patience => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{}: {e:?}", socket.display()),
        }
    }
}
