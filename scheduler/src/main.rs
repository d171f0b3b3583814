//! `gpuslice-scheduler`: cluster placement. `simulate` replays production traces against the
//! placement policies.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpuslice_core::topology::Layout;
use gpuslice_scheduler::cluster::{self, ClusterPolicy, TaskMix};
use gpuslice_scheduler::extender::tls;
use gpuslice_scheduler::simulate::{self, Run};
use gpuslice_scheduler::{plot, published, report, trace};

#[derive(Parser)]
#[command(version, about = "gpuslice cluster placement")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace (Alibaba openb format) with the protocol of the fragmentation paper and
    /// report GPU allocation per policy.
    Simulate(SimulateArgs),
    /// Serve the kube-scheduler extender (filter, prioritize and bind) over HTTP. With
    /// `nodeCacheCapable: false`, kube-scheduler sends the Nodes, with the GPUs their agents
    /// publish, in every request; with `nodeCacheCapable: true`, it sends node names and the
    /// extender answers from its node cache, fed by a watch on Nodes through the API server
    /// (`--api-server`, in-cluster configuration or $KUBECONFIG). With API access, the pods
    /// already placed are counted into the learned workload at start, and bind creates the
    /// Binding with a signed assignment (`--assignment-key`).
    Serve(ServeArgs),
    /// Make the certificates of the extender's mutual TLS into a directory: a CA (ca.crt,
    /// ca.key), the extender's server certificate (tls.crt, tls.key) and kube-scheduler's
    /// client certificate (client.crt, client.key), each signed by the CA. Serve with
    /// --tls-cert-file tls.crt --tls-private-key-file tls.key --client-ca-file ca.crt; give
    /// kube-scheduler client.crt, client.key and ca.crt in the extender's tlsConfig.
    TlsCerts(TlsCertsArgs),
}

#[derive(Parser)]
struct TlsCertsArgs {
    /// Directory to write into (made if missing; files already there are not replaced)
    #[arg(long)]
    out: PathBuf,
    /// DNS name (or IP address) kube-scheduler dials the extender by; repeat for several
    #[arg(long = "server-name", default_values_t = ["gpuslice-scheduler.kube-system.svc".to_string(), "localhost".to_string(), "127.0.0.1".to_string()])]
    server_names: Vec<String>,
    /// Common name of kube-scheduler's client certificate
    #[arg(long, default_value = "kube-scheduler")]
    client_name: String,
    /// Days the certificates are valid
    #[arg(long, default_value_t = 365)]
    days: u32,
}

#[derive(Parser)]
struct ServeArgs {
    /// Address to listen on
    #[arg(long, default_value = "0.0.0.0:8888")]
    listen: std::net::SocketAddr,
    /// Node policy for pods that name none, read as gpuslice.io/node-policy is: binpack
    /// (fullest node), spread (emptiest node) or frag-aware; within the node, GPUs are
    /// binpacked unless the container's gpuslice.io/gpu-policy says spread
    #[arg(long, default_value = "frag-aware")]
    default_node_policy: String,
    /// File with the key shared with the node agents, to sign assignments at bind; without
    /// it, bind answers with an error
    #[arg(long)]
    assignment_key: Option<PathBuf>,
    /// API server URL; default: in-cluster configuration or $KUBECONFIG
    #[arg(long)]
    api_server: Option<String>,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-private-key-file)
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM)
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates may call bind: kube-scheduler's, from its extender
    /// tlsConfig. Other callers still reach filter, prioritize, the probes and /metrics.
    /// Without it, bind is served only on a loopback --listen address
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// Common names a client certificate of --client-ca-file must have (comma-separated), as
    /// kube-apiserver's --requestheader-allowed-names; empty: any certificate of that CA. Set
    /// it when the CA signs others' certificates too (a cluster's CA: kube-scheduler's is
    /// system:kube-scheduler)
    #[arg(long, requires = "client_ca_file", value_delimiter = ',')]
    client_allowed_names: Vec<String>,
}

#[derive(Parser)]
struct SimulateArgs {
    /// Node list: sn,cpu_milli,memory_mib,gpu,model
    #[arg(long)]
    nodes: PathBuf,
    /// Pod lists: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,…]; several
    /// (comma-separated or the option repeated) are replayed one after the other on the same
    /// nodes, and compared in one table (with the FGD paper's published figures for the 17
    /// openb pod lists it ran, recognized by their file names)
    #[arg(long, required = true, value_delimiter = ',')]
    pods: Vec<PathBuf>,
    /// Policies, comma-separated: the FGD paper's baselines as its simulator runs them
    /// (random, dot-product, gpu-clustering, gpu-packing, best-fit) and its own policy (fgd,
    /// against the pod list known in advance); binpack, spread (nodes spread, GPUs binpacked:
    /// the meaning of spread everywhere), binpack-spread, spread-binpack (= spread),
    /// spread-spread; frag-aware (gpuslice's, learning the workload as it comes)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "random,dot-product,gpu-clustering,gpu-packing,best-fit,fgd,binpack,spread,frag-aware"
    )]
    policy: Vec<String>,
    /// Seeds: a range `42..51` (inclusive) or a list `1,2,3`
    #[arg(long, default_value = "42..51")]
    seeds: String,
    /// Keep only the first N nodes of the node list (a smaller cluster)
    #[arg(long)]
    node_limit: Option<usize>,
    /// CSV of every run's curve
    #[arg(long, default_value = "simulate.csv")]
    csv: PathBuf,
    /// SVG plot of unallocated GPU against arrived workload (mean over seeds); with several
    /// pod lists, one per trace, named `<stem>-<trace>.svg`
    #[arg(long, default_value = "simulate.svg")]
    plot: PathBuf,
    /// How frag-aware weighs the pods it has seen: one per pod as in the FGD paper, one per
    /// pod plus one per GPU asked for, or by the GPUs asked for only
    #[arg(long, value_enum, default_value = "pods")]
    weighting: Weighting,
    /// A pod list whose pods frag-aware counts before the replay starts (a known workload);
    /// without it the task mix is learned online only
    #[arg(long)]
    mix: Option<PathBuf>,
    /// Worker threads (runs are independent)
    #[arg(long)]
    threads: Option<usize>,
    /// Give every node this GPU layout (pcie: a PCIe switch per pair of GPUs and a NUMA node
    /// per four; nvlink-pairs: the same, each pair bridged by NVLink; nvswitch: every pair
    /// joined through NVSwitches), place multi-GPU pods on
    /// the closest set, and report how close the sets were. The openb traces record no
    /// topology: without it the nodes have none
    #[arg(long)]
    layout: Option<String>,
    /// With --layout: place as if the nodes published no topology (the policy's own sets),
    /// still reporting how close the sets were, to compare with
    #[arg(long, requires = "layout")]
    topology_blind: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Weighting {
    GpuDemand,
    Pods,
    PodsAndGpus,
}

fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    let bad = || format!("--seeds {s:?}: expected a range like 42..51 or a list like 1,2,3");
    if let Some((a, b)) = s.split_once("..") {
        let (a, b): (u64, u64) = (
            a.trim().parse().with_context(bad)?,
            b.trim().parse().with_context(bad)?,
        );
        if a > b {
            bail!("{}: the range is empty", bad());
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|x| x.trim().parse().with_context(bad))
        .collect()
}

/// One pod list to replay.
struct Trace {
    path: PathBuf,
    name: String,
    pods: Vec<trace::PodRow>,
    demands: Vec<cluster::Demand>,
}

fn simulate_cmd(args: SimulateArgs) -> Result<()> {
    let policies: Vec<(String, ClusterPolicy)> = args
        .policy
        .iter()
        .map(|p| {
            p.parse()
                .map(|c| (p.clone(), c))
                .map_err(|e| anyhow::anyhow!("--policy: {e}"))
        })
        .collect::<Result<_>>()?;
    let seeds = parse_seeds(&args.seeds)?;
    let mut models = trace::Models::default();
    let mut nodes = trace::read_nodes(&args.nodes, &mut models)?;
    if let Some(n) = args.node_limit {
        nodes.truncate(n.max(1));
    }
    let layout: Option<Layout> = args
        .layout
        .as_deref()
        .map(|l| l.parse().map_err(|e| anyhow::anyhow!("--layout: {e}")))
        .transpose()?;
    if let (Some(layout), false) = (layout, args.topology_blind) {
        for n in &mut nodes {
            n.topology = Some(std::sync::Arc::new(layout.topology(n.gpus.len())));
        }
    }
    let mut traces = Vec::new();
    for path in &args.pods {
        let pods = trace::read_pods(path)?;
        let demands = pods.iter().map(|p| trace::demand(p, &mut models)).collect();
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        traces.push(Trace {
            path: path.clone(),
            name: published::trace_name(&file).to_string(),
            pods,
            demands,
        });
    }
    let mut prior = TaskMix::new(match args.weighting {
        Weighting::GpuDemand => cluster::Weighting::GpuDemand,
        Weighting::Pods => cluster::Weighting::Pods,
        Weighting::PodsAndGpus => cluster::Weighting::PodsAndGpus,
    });
    if let Some(path) = &args.mix {
        for p in trace::read_pods(path)? {
            prior.observe(&trace::demand(&p, &mut models));
        }
    }
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    if capacity == 0 {
        bail!("{}: the nodes have no GPUs", args.nodes.display());
    }
    tracing::info!(
        "cluster: {} nodes, {} GPUs; {} traces; {} policies × {} seeds",
        nodes.len(),
        capacity / 1000,
        traces.len(),
        policies.len(),
        seeds.len()
    );
    let jobs: Vec<(usize, u64, usize)> = (0..traces.len())
        .flat_map(|t| {
            let n = policies.len();
            seeds
                .iter()
                .flat_map(move |&s| (0..n).map(move |p| (t, s, p)))
        })
        .collect();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut runs: Vec<Run> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(t, seed, p)) = jobs.get(j) else {
                            break done;
                        };
                        let tr = &traces[t];
                        let order = simulate::workload(&tr.pods, capacity, seed);
                        let (name, policy) = &policies[p];
                        let started = std::time::Instant::now();
                        let mut run = simulate::replay(
                            &nodes,
                            &tr.demands,
                            &tr.pods,
                            &order,
                            (name, *policy),
                            &prior,
                            seed,
                            layout,
                        );
                        run.trace.clone_from(&tr.name);
                        tracing::info!(
                            "trace={} policy={name} seed={seed} pods={} placed={} failed={} in {:.1}s",
                            tr.name,
                            order.len(),
                            run.placed,
                            run.failed,
                            started.elapsed().as_secs_f64()
                        );
                        done.push(run);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    let order = |r: &Run| {
        (
            traces.iter().position(|t| t.name == r.trace),
            policies.iter().position(|p| p.0 == r.policy),
            r.seed,
        )
    };
    runs.sort_by_key(order);

    let mut csv = std::io::BufWriter::new(
        std::fs::File::create(&args.csv).with_context(|| format!("{}", args.csv.display()))?,
    );
    report::write_csv(&mut csv, &runs)?;
    csv.flush()?;

    let names: Vec<String> = policies.iter().map(|p| p.0.clone()).collect();
    for (i, tr) in traces.iter().enumerate() {
        let title = format!(
            "{} on {} ({} seeds)",
            tr.path.file_name().unwrap_or_default().to_string_lossy(),
            args.nodes.file_name().unwrap_or_default().to_string_lossy(),
            seeds.len()
        );
        let mine: Vec<Run> = runs
            .iter()
            .filter(|r| r.trace == tr.name)
            .cloned()
            .collect();
        let path = if traces.len() == 1 {
            args.plot.clone()
        } else {
            report::plot_path(&args.plot, &tr.name, i)
        };
        std::fs::write(&path, plot::svg(&title, &report::curves(&mine, &names)))
            .with_context(|| format!("{}", path.display()))?;
        tracing::info!("wrote {}", path.display());
    }
    tracing::info!("wrote {}", args.csv.display());
    let trace_names: Vec<String> = traces.iter().map(|t| t.name.clone()).collect();
    for line in report::summary_lines(&runs, &trace_names, &names) {
        println!("{line}");
    }
    println!();
    print!("{}", report::table(&runs, &trace_names, &names));
    if let Some(l) = &args.layout {
        let placing = if args.topology_blind {
            "the policy's own sets (topology-blind)"
        } else {
            "the closest set"
        };
        println!(
            "\nMulti-GPU pods on {l} nodes, placed on {placing}: share of the pods placed whose GPUs are all joined by NVLink / on one NUMA node / across NUMA nodes (pooled over the seeds)"
        );
        for line in report::closeness_lines(&runs, &trace_names, &names) {
            println!("{line}");
        }
    }
    Ok(())
}

fn serve_cmd(args: ServeArgs) -> Result<()> {
    // The same reading as a pod's gpuslice.io/node-policy.
    let policy: ClusterPolicy = args
        .default_node_policy
        .trim()
        .parse::<gpuslice_core::policy::Policy>()
        .map(gpuslice_scheduler::extender::request::node_policy)
        .map_err(|e| {
            anyhow::anyhow!("--default-node-policy {:?}: {e}", args.default_node_policy)
        })?;
    if args.assignment_key.is_some() {
        tls::check_bind_reach(args.listen, args.client_ca_file.is_some())
            .map_err(anyhow::Error::msg)?;
    }
    let tls_config = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(std::sync::Arc::new(gpuslice_tls::Reloading::new(
            tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.client_ca_file.clone(),
                flags: &tls::FLAGS,
            },
        )?)),
        _ => None,
    };
    let extender = std::sync::Arc::new(gpuslice_scheduler::extender::Extender::new(policy));
    let key = args.assignment_key.as_deref().map(read_key).transpose()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        // API access: --api-server, else in-cluster or $KUBECONFIG when there is any.
        let client = match &args.api_server {
            Some(url) => {
                let uri = url
                    .parse()
                    .with_context(|| format!("--api-server {url:?}: not a URL"))?;
                Some(kube::Client::try_from(kube::Config::new(uri))?)
            }
            None => match kube::Client::try_default().await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("no API access ({e}): no node watch, no bind");
                    None
                }
            },
        };
        if let Some(c) = &client {
            // Not ready (/readyz) until both watches below have listed the cluster.
            extender.expect_watches(2);
            // The placed pods first (their assigned placements must be known before the nodes'
            // publications are taken in), then the Node watch.
            let (extender, c, key) = (extender.clone(), c.clone(), key.clone());
            tokio::spawn(async move {
                let n = gpuslice_scheduler::extender::watch::learn_running_pods(
                    &extender,
                    c.clone(),
                    key.as_deref(),
                )
                .await;
                tracing::info!("learned the task mix from {n} placed pods");
                tokio::join!(
                    gpuslice_scheduler::extender::watch::run(extender.clone(), c.clone()),
                    gpuslice_scheduler::extender::watch::run_pods(extender, c),
                );
            });
        }
        let binder = match (key, client) {
            (Some(key), Some(client)) => Some(std::sync::Arc::new(
                gpuslice_scheduler::extender::bind::Binder { client, key },
            )),
            (None, _) => {
                tracing::warn!("no --assignment-key: bind is not available");
                None
            }
            (Some(_), None) => bail!("--assignment-key needs API access (--api-server)"),
        };
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("--listen {}", args.listen))?;
        let app = gpuslice_scheduler::extender::http::router_with_bind(extender, binder);
        let loopback = args.listen.ip().is_loopback();
        match tls_config {
            Some(config) => {
                tracing::info!("serving the extender on {} (HTTPS)", listener.local_addr()?);
                tls::serve_tls(listener, app, config, args.client_allowed_names, loopback).await
            }
            None => {
                tracing::info!("serving the extender on {}", listener.local_addr()?);
                tls::serve_plain(listener, app, loopback).await
            }
        }
        .context("server")
    })
}

fn tls_certs_cmd(args: &TlsCertsArgs) -> Result<()> {
    let certs = gpuslice_scheduler::certs::make(&args.server_names, &args.client_name, args.days)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("--out {}", args.out.display()))?;
    gpuslice_scheduler::certs::write(&certs, &args.out)?;
    for f in gpuslice_scheduler::certs::FILES {
        println!("{}", args.out.join(f).display());
    }
    Ok(())
}

/// The shared signing key (a mounted Secret).
fn read_key(path: &std::path::Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("--assignment-key {}: {e}", path.display()))?;
    gpuslice_core::assignment::key_from_file(bytes, &path.display().to_string())
        .map_err(|e| anyhow::anyhow!("--assignment-key {e}"))
}

fn main() -> Result<()> {
    gpuslice_manpage::exit_if_asked::<Cli>("1");
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUSLICE_LOG")
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match cli.command {
        Command::Simulate(a) => simulate_cmd(a),
        Command::Serve(a) => serve_cmd(a),
        Command::TlsCerts(a) => tls_certs_cmd(&a),
    }
}
