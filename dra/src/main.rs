//! `gpuslice-dra-plugin`: the DRA kubelet plugin of driver `gpuslice.io`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use gpuslice_dra::prepare::Plugin;

#[derive(Parser)]
#[command(
    name = "gpuslice-dra-plugin",
    version,
    about = "The DRA kubelet plugin of gpuslice: prepares ResourceClaims as GPU slices through the node agent"
)]
struct Args {
    /// This node's name (the pool of its devices).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Where the DRA socket is created (the kubelet's plugins directory for this driver).
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpuslice.io")]
    plugin_dir: PathBuf,
    /// The kubelet's plugin registration directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// Where each prepared claim's CDI spec is written (the agent removes it on release).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Where this process sees the host's root filesystem (`/host` when the plugin runs in a
    /// container with the host mounted there; the runtime configuration's paths then lie
    /// under it). The CDI specs it writes name host paths as the host sees them.
    #[arg(long, default_value = "/")]
    host_root: PathBuf,
    /// The API server's URL; in-cluster or $KUBECONFIG configuration when absent.
    #[arg(long)]
    api_server: Option<String>,
    /// How often the node's ResourceSlice is checked against the agent's inventory and the
    /// slices of ResourceClaims the API server no longer has are released, in seconds (both
    /// also happen at start).
    #[arg(long, default_value_t = 60)]
    publish_interval: u64,
    /// D-Bus address of the agent's bus instead of the system bus.
    #[arg(long, env = "GPUSLICE_BUS_ADDRESS")]
    bus_address: Option<String>,
}

#[tokio::main]
async fn main() -> Result<()> {
    gpuslice_manpage::exit_if_asked::<Args>("8");
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUSLICE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args = Args::parse();
    let client = match &args.api_server {
        Some(url) => {
            let uri = url.parse().with_context(|| format!("--api-server {url}"))?;
            kube::Client::try_from(kube::Config::new(uri))?
        }
        None => kube::Client::try_default()
            .await
            .context("no Kubernetes configuration")?,
    };
    let conn = gpuslice_agent_api::connect(args.bus_address.as_deref())
        .await
        .context("failed to reach the gpuslice agent over D-Bus")?;
    let agent = gpuslice_agent_api::AgentProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    let runtime = gpuslice_runtime_shim::config::Config::load()?;
    let plugin = Arc::new(Plugin {
        node: args.node_name,
        client,
        agent,
        runtime,
        cdi_dir: args.cdi_dir,
        host_root: args.host_root,
    });
    let publisher = plugin.clone();
    let every = std::time::Duration::from_secs(args.publish_interval.max(1));
    tokio::spawn(async move {
        loop {
            let published = async {
                let text = publisher.agent.inventory().await?;
                let inventory = serde_json::from_str(&text)?;
                gpuslice_dra::publish::publish(&publisher.client, &publisher.node, &inventory)
                    .await?;
                anyhow::Ok(())
            };
            if let Err(e) = published.await {
                tracing::warn!("publishing the node's ResourceSlice: {e:#}");
            }
            match publisher.collect().await {
                Ok(released) => {
                    for id in released {
                        tracing::info!("released {id}: its ResourceClaim is gone");
                    }
                }
                Err(e) => tracing::warn!("collecting claims that are gone: {e}"),
            }
            tokio::time::sleep(every).await;
        }
    });
    let dra = args.plugin_dir.join("dra.sock");
    let registration = args
        .registry_dir
        .join(format!("{}-reg.sock", gpuslice_dra::DRIVER));
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    gpuslice_dra::server::serve(plugin, &dra, &registration, shutdown).await
}
