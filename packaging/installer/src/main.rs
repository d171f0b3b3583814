//! `gpuslice-install`: the node image's installer (see the library's documentation).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use gpuslice_installer::{Engine, Options, Restart, Undone, install, uninstall};
use nix::sys::signal::{SigSet, Signal};

#[derive(Parser)]
#[command(
    name = "gpuslice-install",
    version,
    about = "Put gpuslice's runtime side onto this node from the node image, or take it off"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install onto the host and exit.
    Install(Where),
    /// Take off what the last install put there, and exit.
    Uninstall(Where),
    /// Install, wait for SIGTERM or SIGINT, then take it off again: a DaemonSet container's
    /// command, so that deleting the DaemonSet leaves the nodes as they were.
    Run {
        #[command(flatten)]
        place: Where,
        /// Leave the installation in place when stopped.
        #[arg(long)]
        keep: bool,
    },
}

#[derive(Args)]
struct Where {
    /// Where the host's root file system is mounted.
    #[arg(long, default_value = "/host")]
    host_root: PathBuf,
    /// Where the files to install are (the image's root).
    #[arg(long, default_value = "/")]
    source_root: PathBuf,
    /// Host directory for the programs (bin/) and the interception library (lib/).
    #[arg(long, default_value = "/usr/local/gpuslice")]
    prefix: PathBuf,
    /// The engine whose configuration gets the runtime handler.
    #[arg(long, value_enum, default_value = "containerd")]
    engine: Engine,
    /// containerd's configuration file on the host.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    containerd_config: PathBuf,
    /// Where CRI-O's drop-in goes on the host.
    #[arg(long, default_value = "/etc/crio/crio.conf.d/99-gpuslice.conf")]
    crio_drop_in: PathBuf,
    /// The runtime handler name (the RuntimeClass's `handler`).
    #[arg(long, default_value = "gpuslice")]
    handler: String,
    /// Restart the engine after a change: none, or systemd (systemctl in the host's root).
    #[arg(long, value_enum, default_value = "none")]
    restart: Restart,
}

impl Where {
    fn options(&self) -> Options {
        Options {
            host_root: self.host_root.clone(),
            source_root: self.source_root.clone(),
            prefix: self.prefix.clone(),
            engine: self.engine,
            containerd_config: self.containerd_config.clone(),
            crio_drop_in: self.crio_drop_in.clone(),
            handler: self.handler.clone(),
            restart: self.restart,
        }
    }
}

fn do_install(o: &Options) -> Result<()> {
    let record = install(o).with_context(|| format!("install onto {}", o.host_root.display()))?;
    for entry in &record.entries {
        eprintln!("gpuslice-install: wrote {}", entry.path.display());
    }
    eprintln!("gpuslice-install: installed under {}", o.prefix.display());
    Ok(())
}

fn do_uninstall(o: &Options) -> Result<()> {
    let report =
        uninstall(o).with_context(|| format!("uninstall from {}", o.host_root.display()))?;
    if report.is_empty() {
        eprintln!("gpuslice-install: nothing recorded as installed on this host");
    }
    for (path, undone) in report {
        let what = match undone {
            Undone::Removed => "removed",
            Undone::Restored => "restored",
            Undone::KeptEdited => "kept (edited since the install)",
            Undone::Missing => "already gone",
        };
        eprintln!("gpuslice-install: {} {what}", path.display());
    }
    Ok(())
}

fn main() -> Result<()> {
    gpuslice_manpage::exit_if_asked::<Cli>("8");
    match Cli::parse().command {
        Command::Install(place) => do_install(&place.options()),
        Command::Uninstall(place) => do_uninstall(&place.options()),
        Command::Run { place, keep } => {
            // Blocked before anything else, so that a stop during the install is not lost;
            // as a container's first process, the default actions would be ignored anyway.
            let mut signals = SigSet::empty();
            signals.add(Signal::SIGTERM);
            signals.add(Signal::SIGINT);
            signals.thread_block().context("block SIGTERM and SIGINT")?;
            let o = place.options();
            do_install(&o)?;
            let signal = signals.wait().context("wait for SIGTERM or SIGINT")?;
            eprintln!("gpuslice-install: {signal}");
            if keep {
                return Ok(());
            }
            do_uninstall(&o)
        }
    }
}
