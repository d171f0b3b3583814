//! `gpuslice-containerd`: adds the `gpuslice` runtime handler to containerd's configuration.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpuslice_containerd::{Handler, add_handler, add_import, drop_in, remove_handler, version};
use toml_edit::DocumentMut;

#[derive(Parser)]
#[command(version, about = "Configure containerd to run GPU slices")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Add the runtime handler to containerd's configuration, in place or as a drop-in.
    Configure {
        /// containerd's main configuration file.
        #[arg(long, default_value = "/etc/containerd/config.toml")]
        config: PathBuf,
        /// Write the handler to this drop-in file and make the main configuration import it,
        /// instead of editing the main configuration's tables.
        #[arg(long)]
        drop_in: Option<PathBuf>,
        /// The runtime handler name (a RuntimeClass's `handler`).
        #[arg(long, default_value = "gpuslice")]
        handler: String,
        /// Path of gpuslice-runtime.
        #[arg(long, default_value = "/usr/bin/gpuslice-runtime")]
        runtime_path: String,
        /// Print what would be written instead of writing it.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove the runtime handler from containerd's configuration (in place), leaving
    /// everything else as it is.
    Unconfigure {
        /// containerd's main configuration file.
        #[arg(long, default_value = "/etc/containerd/config.toml")]
        config: PathBuf,
        /// The runtime handler name.
        #[arg(long, default_value = "gpuslice")]
        handler: String,
        /// Print what would be written instead of writing it.
        #[arg(long)]
        dry_run: bool,
    },
}

fn read(path: &Path) -> Result<DocumentMut> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .parse()
            .with_context(|| format!("{} is not valid TOML", path.display())),
        // containerd 1.6+ reads configuration version 2 by default.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok("version = 2\n".parse()?),
        Err(e) => Err(e).with_context(|| format!("failed to read {}", path.display())),
    }
}

fn write(path: &Path, text: &str, dry_run: bool) -> Result<()> {
    if dry_run {
        println!("# {}\n{text}", path.display());
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("failed to create {}", dir.display()))?;
    }
    let tmp = path.with_extension("toml.gpuslice-tmp");
    std::fs::write(&tmp, text).with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("failed to write {}", path.display()))
}

fn main() -> Result<()> {
    gpuslice_manpage::exit_if_asked::<Cli>("8");
    match Cli::parse().command {
        Command::Configure {
            config,
            drop_in,
            handler,
            runtime_path,
            dry_run,
        } => configure(
            &config,
            drop_in.as_deref(),
            &Handler {
                name: handler,
                binary: runtime_path,
            },
            dry_run,
        ),
        Command::Unconfigure {
            config,
            handler,
            dry_run,
        } => unconfigure(&config, &handler, dry_run),
    }
}

fn configure(config: &Path, drop: Option<&Path>, handler: &Handler, dry_run: bool) -> Result<()> {
    let mut doc = read(config)?;
    version(&doc).with_context(|| config.display().to_string())?;
    match drop {
        Some(path) => {
            write(path, &drop_in(&doc, handler)?, dry_run)?;
            add_import(&mut doc, &path.display().to_string())
                .with_context(|| format!("{}: cannot import a drop-in", config.display()))?;
        }
        None => add_handler(&mut doc, handler).with_context(|| config.display().to_string())?,
    }
    write(config, &doc.to_string(), dry_run)?;
    if !dry_run {
        eprintln!(
            "gpuslice-containerd: runtime handler {:?} configured; restart containerd to load it",
            handler.name
        );
    }
    Ok(())
}

fn unconfigure(config: &Path, handler: &str, dry_run: bool) -> Result<()> {
    let mut doc = match std::fs::read_to_string(config) {
        Ok(text) => text
            .parse::<DocumentMut>()
            .with_context(|| format!("{} is not valid TOML", config.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "gpuslice-containerd: {} does not exist; nothing to remove",
                config.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("failed to read {}", config.display())),
    };
    if !remove_handler(&mut doc, handler).with_context(|| config.display().to_string())? {
        eprintln!(
            "gpuslice-containerd: {} has no runtime handler {handler:?}; nothing to remove",
            config.display()
        );
        return Ok(());
    }
    write(config, &doc.to_string(), dry_run)?;
    if !dry_run {
        eprintln!(
            "gpuslice-containerd: runtime handler {handler:?} removed; restart containerd to unload it"
        );
    }
    Ok(())
}
