//! `gpuslice-agent`: the node agent daemon.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use gpuslice_core::Policy;
use gpuslice_core::fit::Rules;
use gpuslice_nodeagent::duration;
use gpuslice_nodeagent::gc::{self, Evidence};
use gpuslice_nodeagent::metrics_http::{self, MetricsTls};
use gpuslice_nodeagent::service::{self, Config};
use gpuslice_nodeagent::throttle::{ShareAction, ShareBackstop};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OverLimitAction {
    Log,
    Kill,
    Stop,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OverShareAction {
    Log,
    Throttle,
}

#[derive(Clone, Copy, ValueEnum)]
enum GpuPolicy {
    Binpack,
    Spread,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The gpuslice node agent: admits GPU slices, keeps the node's ledger, serves D-Bus and metrics.
#[derive(Parser)]
#[command(name = "gpuslice-agent", version)]
struct Args {
    /// Root of the driver installation (where libnvidia-ml.so.1 and /dev/nvidia* are).
    #[arg(long, env = "GPUSLICE_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,
    /// NVML library to load instead of the one found in the driver root.
    #[arg(long, env = "GPUSLICE_NVML_LIBRARY")]
    nvml_library: Option<PathBuf>,
    /// Where the ledger lives (one file per claim). Claims describe running containers, so a
    /// tmpfs such as /run is the right home, as for runc's and containerd's own state.
    #[arg(long, default_value = "/run/gpuslice-agent")]
    state_dir: PathBuf,
    /// Where each container's limits directory is created.
    #[arg(long, default_value = "/run/gpuslice")]
    run_dir: PathBuf,
    /// The CDI directory where `gpuslice claim --cdi` writes a slice's spec; the agent
    /// removes a claim's spec when the claim is released ("off" to look after none).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: String,
    /// D-Bus address to serve on instead of the system bus.
    #[arg(long, env = "GPUSLICE_BUS_ADDRESS")]
    bus_address: Option<String>,
    /// Where to serve the same D-Bus interface to root peer to peer, without the bus daemon
    /// (the runtime wrapper and the hook connect there first): a socket made mode 0600.
    /// Default: `private` in the state directory; "off" for none.
    #[arg(long)]
    private_socket: Option<String>,
    /// Address for the Prometheus endpoint (/metrics), or "off".
    #[arg(long, default_value = "127.0.0.1:9401")]
    metrics_address: String,
    /// Serve the metrics endpoint over HTTPS with this certificate chain (PEM; with
    /// --metrics-tls-private-key-file)
    #[arg(long, requires = "metrics_tls_private_key_file")]
    metrics_tls_cert_file: Option<PathBuf>,
    /// The private key of --metrics-tls-cert-file (PEM)
    #[arg(long, requires = "metrics_tls_cert_file")]
    metrics_tls_private_key_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates may read /metrics (Prometheus's, from its scrape
    /// configuration's tls_config); others are refused (HTTP 403), /healthz answers everyone.
    /// /metrics names every container and pod with a slice on the node: give it where the
    /// endpoint is reachable beyond the node
    #[arg(long, requires = "metrics_tls_cert_file")]
    metrics_client_ca_file: Option<PathBuf>,
    /// Common names a client certificate of --metrics-client-ca-file must have (comma
    /// separated; empty: any of that CA). Set it when the CA signs others' certificates too
    #[arg(long, requires = "metrics_client_ca_file", value_delimiter = ',')]
    metrics_client_allowed_names: Vec<String>,
    /// Most slices on one GPU.
    #[arg(long, default_value_t = 16)]
    max_sharers: u32,
    /// GPU placement when a request names no policy.
    #[arg(long, value_enum, default_value = "binpack")]
    default_gpu_policy: GpuPolicy,
    /// How often to look for claims of containers that are gone.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    gc_interval: std::time::Duration,
    /// How long a claim may wait for its container to start before it can be collected
    /// (only when no OCI runtime knows the container).
    #[arg(long, default_value = "2m", value_parser = duration::parse)]
    pending_timeout: std::time::Duration,
    /// OCI runtime state roots that tell a created container exists (repeatable).
    #[arg(long = "runtime-root")]
    runtime_roots: Vec<PathBuf>,
    /// Device memory charged to a slice for each CUDA context a process creates (e.g.
    /// 520Mi), instead of what the agent measures one to cost on each GPU at start (it
    /// creates one on the node's driver and asks NVML). Either way, what the driver really
    /// holds for each process is charged from the next sample (--enforce-interval).
    #[arg(long, value_parser = parse_bytes)]
    context_reservation: Option<u64>,
    /// How often the enforcement backstop compares what the driver says each container's
    /// processes hold (NVML, per process) with its slice, and publishes what the driver holds
    /// for them beyond what they counted; between these, a container near its limit is
    /// sampled when it asks (at most every 10ms). 0 turns it off.
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    enforce_interval: std::time::Duration,
    /// What the backstop does to a container over its slice: log (log, count, D-Bus signal),
    /// kill (also SIGKILL its newest process on that GPU) or stop (also SIGKILL the
    /// container's first process, which ends the whole container).
    #[arg(long, value_enum, default_value = "log")]
    over_limit_action: OverLimitAction,
    /// How far over its slice a container may be before the backstop acts (the driver's own
    /// reservations not charged by the interception library), e.g. 64Mi.
    #[arg(long, default_value = "64Mi", value_parser = parse_bytes)]
    over_limit_tolerance: u64,
    /// File holding the key shared with gpuslice-scheduler: claims carrying a
    /// gpuslice.io/assignment are honoured only if it is signed with this key for this node.
    /// Without it, assignments are refused.
    #[arg(long)]
    assignment_key: Option<PathBuf>,
    /// This node's name as Kubernetes knows it (assignments name it); default $NODE_NAME,
    /// else the host name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Publish this node's GPUs and their allocation on its Kubernetes Node (annotation
    /// gpuslice.io/node-state), for gpuslice-scheduler.
    #[arg(long)]
    publish_node: bool,
    /// Post Kubernetes Events (events.k8s.io/v1) on the pod of a slice refused, found
    /// tampered with, found over its slice or over its SM share, as `kubectl describe pod`
    /// shows them.
    #[arg(long)]
    kube_events: bool,
    /// API server URL for --publish-node and --kube-events; default: in-cluster
    /// configuration or $KUBECONFIG.
    #[arg(long)]
    kube_api: Option<String>,
    /// How often to check whether the publication changed.
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    publish_interval: std::time::Duration,
    /// How often to ask the driver for its per-process SM utilization samples, counted as
    /// each slice's SM time (gpuslice_slice_sm_seconds_total); under the driver's sampling
    /// period (a sixth of a second on data-center GPUs), so that none is missed. 0 turns it
    /// off.
    #[arg(long, default_value = "100ms", value_parser = duration::parse)]
    sm_sample_interval: std::time::Duration,
    /// What to do about a container whose processes keep a GPU busier than its slice's SM
    /// share (as the driver measures it; needs --sm-sample-interval): log, or throttle (also
    /// freeze the container's cgroup until its average is back within its share).
    #[arg(long, value_enum, default_value = "throttle")]
    over_share_action: OverShareAction,
    /// GPU time a slice may use beyond its SM share (and the tolerance) before the agent
    /// holds it, e.g. 30s. Default: 10s, and at least 60 of the driver's sampling periods
    /// (which name one process each: the count of one slice among several busy ones is noisy).
    #[arg(long, value_parser = duration::parse)]
    sm_share_burst: Option<std::time::Duration>,
    /// Points of the GPU's time a slice may use beyond its SM share on average before the
    /// agent holds it (the driver's count is right over many periods, not in each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    sm_share_tolerance: u32,
    /// The cgroup namespace in which the containers' cgroups are read, recorded and frozen,
    /// joined at start where the agent's own is another (an agent in a pod). Default: that of
    /// the host's first process, `<proc-root>/1/ns/cgroup`.
    #[arg(long)]
    host_cgroup_namespace: Option<PathBuf>,
    /// The proc filesystem holding the containers' processes.
    #[arg(long, default_value = "/proc")]
    proc_root: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// The shared signing key (a mounted Secret).
fn read_key(path: &std::path::Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("--assignment-key {}: {e}", path.display()))?;
    gpuslice_core::assignment::key_from_file(bytes, &path.display().to_string())
        .map_err(|e| anyhow::anyhow!("--assignment-key {e}"))
}

/// A size in bytes: `300Mi`, `1Gi`, `314572800`.
fn parse_bytes(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    match gpuslice_core::quantity::parse_memory(s) {
        Ok(gpuslice_core::quantity::MemoryQuantity::Bytes(b)) => Ok(b),
        Ok(_) => Err(format!("{s:?}: a size in bytes, not a share of the GPU")),
        Err(e) => Err(format!("{s:?}: {e}")),
    }
}

fn main() -> Result<std::process::ExitCode> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(gpuslice_nodeagent::context_cost::PROBE_FLAG) {
        return Ok(gpuslice_nodeagent::context_cost::probe_main(&argv[2..]));
    }
    gpuslice_manpage::exit_if_asked::<Args>("8");
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUSLICE_LOG")
        .unwrap_or_else(|_| "info".into());
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match args.log_format {
        LogFormat::Text => sub.init(),
        LogFormat::Json => sub.json().init(),
    }
    let metrics_address = match args.metrics_address.as_str() {
        "off" | "" => None,
        a => Some(a.parse::<SocketAddr>().with_context(|| {
            format!("--metrics-address {a:?}: not an address like 127.0.0.1:9401")
        })?),
    };
    let host_cgroup_namespace = args
        .host_cgroup_namespace
        .clone()
        .unwrap_or_else(|| args.proc_root.join("1/ns/cgroup"));
    let cfg = Config {
        driver_root: args.driver_root,
        nvml_library: args.nvml_library,
        private_socket: match args.private_socket.as_deref() {
            Some("off" | "") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => Some(args.state_dir.join("private")),
        },
        state_dir: args.state_dir,
        run_dir: args.run_dir,
        cdi_dir: (args.cdi_dir != "off").then(|| PathBuf::from(&args.cdi_dir)),
        bus_address: args.bus_address,
        metrics_address,
        metrics_tls: match (
            args.metrics_tls_cert_file,
            args.metrics_tls_private_key_file,
        ) {
            (Some(cert), Some(key)) => Some(MetricsTls {
                files: gpuslice_tls::TlsFiles {
                    cert,
                    key,
                    client_ca: args.metrics_client_ca_file,
                    flags: &metrics_http::FLAGS,
                },
                allowed_names: args.metrics_client_allowed_names,
            }),
            _ => None,
        },
        rules: Rules {
            max_sharers: args.max_sharers,
        },
        default_policy: match args.default_gpu_policy {
            GpuPolicy::Binpack => Policy::Binpack,
            GpuPolicy::Spread => Policy::Spread,
        },
        gc_interval: args.gc_interval,
        evidence: Evidence {
            proc_root: args.proc_root,
            runtime_roots: if args.runtime_roots.is_empty() {
                gc::default_runtime_roots()
            } else {
                args.runtime_roots
            },
            pending_timeout: args.pending_timeout,
        },
        context_reservation: args.context_reservation,
        backstop: (!args.enforce_interval.is_zero()).then_some(service::Backstop {
            interval: args.enforce_interval,
            action: match args.over_limit_action {
                OverLimitAction::Log => gpuslice_nodeagent::backstop::Action::Log,
                OverLimitAction::Kill => gpuslice_nodeagent::backstop::Action::Kill,
                OverLimitAction::Stop => gpuslice_nodeagent::backstop::Action::Stop,
            },
            tolerance: args.over_limit_tolerance,
        }),
        publish: args.publish_node.then_some(args.publish_interval),
        kube_events: args.kube_events,
        kube_api: args.kube_api.clone(),
        sm_sample_interval: (!args.sm_sample_interval.is_zero()).then_some(args.sm_sample_interval),
        share_backstop: ShareBackstop {
            action: match args.over_share_action {
                OverShareAction::Log => ShareAction::Log,
                OverShareAction::Throttle => ShareAction::Throttle,
            },
            burst: args.sm_share_burst,
            tolerance: f64::from(args.sm_share_tolerance) / 100.0,
        },
        trust: gpuslice_nodeagent::ledger::Trust {
            key: args
                .assignment_key
                .as_ref()
                .map(|p| read_key(p))
                .transpose()?,
            node: match args.node_name {
                Some(n) => n,
                None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .context("--node-name not given and the host name is unreadable")?
                    .trim()
                    .to_string(),
            },
        },
    };
    // Before any thread starts: every thread then reads cgroups in the host's namespace.
    match gpuslice_nodeagent::throttle::see_host_cgroups(&host_cgroup_namespace) {
        Ok(true) => tracing::info!(
            namespace = %host_cgroup_namespace.display(),
            "joined the host's cgroup namespace to read the containers' cgroups"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            "{e}: containers in cgroups outside the agent's own cgroup namespace cannot be held to their SM share"
        ),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(service::run(cfg))
        .inspect_err(|e| tracing::error!("{e:#}"))?;
    Ok(std::process::ExitCode::SUCCESS)
}
