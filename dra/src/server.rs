//! The two sockets a DRA plugin serves: the registration socket the kubelet finds in its
//! plugins_registry directory, and the DRA service (v1 and v1beta1) at the endpoint the
//! registration names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::prepare::{Plugin, Prepared};
use crate::proto::{registration as reg, v1, v1beta1};

/// The registration service.
pub struct Registration {
    /// The DRA socket the kubelet is to call.
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: crate::DRIVER.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: crate::SUPPORTED_VERSIONS
                .iter()
                .map(|v| (*v).to_string())
                .collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!("the kubelet refused the registration: {}", s.error);
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The DRA service, once for each version the kubelet may speak.
#[derive(Clone)]
pub struct Dra(pub Arc<Plugin>);

/// The claims of a request as (namespace, uid, name).
type Claims = Vec<(String, String, String)>;

impl Dra {
    async fn prepare(&self, claims: Claims) -> Vec<(String, Result<Vec<Prepared>, String>)> {
        let mut out = Vec::new();
        for (namespace, uid, name) in claims {
            let result = self.0.prepare(&namespace, &uid, &name).await;
            if let Err(e) = &result {
                tracing::warn!("preparing {namespace}/{name}: {e}");
            }
            out.push((uid, result));
        }
        out
    }

    async fn unprepare(&self, claims: Claims) -> Vec<(String, Result<(), String>)> {
        let mut out = Vec::new();
        for (_, uid, _) in claims {
            let result = self.0.unprepare(&uid).await;
            out.push((uid, result));
        }
        out
    }
}

/// The same service in both versions: only the generated types differ.
macro_rules! dra_service {
    ($v:ident, $device:expr) => {
        #[tonic::async_trait]
        impl $v::dra_plugin_server::DraPlugin for Dra {
            async fn node_prepare_resources(
                &self,
                request: Request<$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<$v::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| (c.namespace, c.uid, c.name))
                    .collect();
                let claims = self
                    .prepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        let response = match r {
                            Ok(devices) => $v::NodePrepareResourceResponse {
                                devices: devices.into_iter().map($device).collect(),
                                error: String::new(),
                            },
                            Err(error) => $v::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new($v::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$v::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| (c.namespace, c.uid, c.name))
                    .collect();
                let claims = self
                    .unprepare(claims)
                    .await
                    .into_iter()
                    .map(|(uid, r)| {
                        (
                            uid,
                            $v::NodeUnprepareResourceResponse {
                                error: r.err().unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new($v::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_service!(v1, |d: Prepared| v1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
    share_id: d.share_id,
});
dra_service!(v1beta1, |d: Prepared| v1beta1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
});

/// Serves the DRA service on `dra_socket` and the registration on `registration_socket`
/// until `shutdown` completes. Stale sockets of an earlier run are replaced.
pub async fn serve(
    plugin: Arc<Plugin>,
    dra_socket: &Path,
    registration_socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use anyhow::Context;
    for s in [dra_socket, registration_socket] {
        if let Some(dir) = s.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let _ = std::fs::remove_file(s);
    }
    let dra = tokio::net::UnixListener::bind(dra_socket)
        .with_context(|| format!("listening on {}", dra_socket.display()))?;
    let reg = tokio::net::UnixListener::bind(registration_socket)
        .with_context(|| format!("listening on {}", registration_socket.display()))?;
    let service = Dra(plugin);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(service.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(service))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(dra), {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.changed().await;
            }
        });
    let reg_server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            Registration {
                endpoint: dra_socket.to_path_buf(),
            },
        ))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(reg), {
            let mut rx = stop_rx;
            async move {
                let _ = rx.changed().await;
            }
        });
    tracing::info!(
        "serving DRA on {} and registration on {}",
        dra_socket.display(),
        registration_socket.display()
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (a, b) = tokio::join!(dra_server, reg_server);
    a?;
    b?;
    Ok(())
}
