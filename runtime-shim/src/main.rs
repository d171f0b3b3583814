//! `gpuslice-runtime`: an OCI runtime wrapper. On `create` (and `run`) of a container with
//! gpuslice annotations it asks the node agent for a claim and edits the bundle's
//! `config.json` to give the container its GPUs, the driver, the interception library and its
//! limits; then, for every command, it executes the low-level runtime (runc, crun) with argv
//! unchanged. Containers without gpuslice annotations pass through with their spec untouched.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use gpuslice_runtime_shim::config::Config;
use gpuslice_runtime_shim::{args, inject, log};

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let inv = args::parse(&argv);
    let fail = |msg: &str| {
        log::error(inv.log.as_deref(), inv.log_format.as_deref(), msg);
        ExitCode::FAILURE
    };
    let cfg = match Config::load() {
        Ok(c) => c,
        Err(e) => return fail(&format!("{e:#}")),
    };
    let runtime = match cfg.runtime_path() {
        Ok(r) => r,
        Err(e) => return fail(&format!("{e:#}")),
    };
    let mut claimed_now = false;
    if inv.creates() {
        for w in cfg.warnings() {
            log::warn(inv.log.as_deref(), inv.log_format.as_deref(), &w);
        }
        // Fail closed: a GPU container whose injection failed is not created.
        match inject::prepare(&inv, &cfg) {
            Ok(claimed) => claimed_now = claimed,
            Err(e) => return fail(&format!("{e:#}")),
        }
    }
    // A create that fails leaves no container to delete: its slice is given back at once
    // rather than when garbage collection finds it, so the create runs as a child.
    if claimed_now && inv.command.as_deref() == Some("create") {
        let started = std::time::Instant::now();
        let mut code = run_then_release(&runtime, &argv, &inv, &cfg, Release::OnFailure);
        let ran = started.elapsed();
        if code == ExitCode::SUCCESS
            && let Some(pid_file) = &inv.pid_file
        {
            code = report_pid(&runtime, pid_file, &inv, &cfg);
        }
        if std::env::var_os("GPUSLICE_RUNTIME_DEBUG").is_some() {
            eprintln!(
                "gpuslice-runtime: container {}: {} create {ran:?}, pid reported {:?}",
                inv.container_id.as_deref().unwrap_or_default(),
                runtime.display(),
                started.elapsed() - ran
            );
        }
        return code;
    }
    // After a delete the container is gone: run the runtime, then release the claim. Only a
    // container with a slice needs that; every other command is handed over with exec, so
    // signals reach the runtime as before.
    let claimed = inv
        .container_id
        .as_ref()
        .is_some_and(|id| cfg.run_dir.join(id).exists());
    if inv.command.as_deref() == Some("delete") && claimed {
        return run_then_release(&runtime, &argv, &inv, &cfg, Release::OnSuccess);
    }
    let err = Command::new(&runtime)
        .arg0(&runtime)
        .args(&argv[1..])
        .exec();
    fail(&format!("failed to execute {}: {err}", runtime.display()))
}

/// When [`run_then_release`] releases the container's claim.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Release {
    /// After a `delete` that succeeded (a failed delete leaves a container that may still run).
    OnSuccess,
    /// After a `create` that failed (no container holds the slice).
    OnFailure,
}

/// Runs the runtime with argv unchanged, then releases the container's claim as `when` says.
fn run_then_release(
    runtime: &std::path::Path,
    argv: &[OsString],
    inv: &args::Invocation,
    cfg: &Config,
    when: Release,
) -> ExitCode {
    let started = std::time::Instant::now();
    let status = match Command::new(runtime)
        .arg0(runtime)
        .args(&argv[1..])
        .spawn()
        .and_then(|mut child| {
            // The connection to the agent is set up while the runtime works (a release
            // follows a delete), not after it.
            if when == Release::OnSuccess {
                inject::connect(cfg);
            }
            child.wait()
        }) {
        Ok(s) => s,
        Err(e) => {
            log::error(
                inv.log.as_deref(),
                inv.log_format.as_deref(),
                &format!("failed to execute {}: {e}", runtime.display()),
            );
            return ExitCode::FAILURE;
        }
    };
    let ran = started.elapsed();
    if status.success() == (when == Release::OnSuccess)
        && let Some(id) = &inv.container_id
        && let Err(e) = inject::release_if_claimed(id, Some(&inv.owner()), cfg)
    {
        log::error(
            inv.log.as_deref(),
            inv.log_format.as_deref(),
            &format!("container {id}: {e:#}"),
        );
    }
    if when == Release::OnSuccess && std::env::var_os("GPUSLICE_RUNTIME_DEBUG").is_some() {
        eprintln!(
            "gpuslice-runtime: container {}: {} delete {ran:?}, released {:?}",
            inv.container_id.as_deref().unwrap_or_default(),
            runtime.display(),
            started.elapsed() - ran
        );
    }
    ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1))
}

/// Reports the pid of a container the runtime has just created (read from the pid file the
/// engine asked for), in place of a createRuntime hook. A container whose pid the agent did not
/// take is deleted and its slice released: it would otherwise run on a claim the agent
/// counts as never started.
fn report_pid(
    runtime: &std::path::Path,
    pid_file: &std::path::Path,
    inv: &args::Invocation,
    cfg: &Config,
) -> ExitCode {
    let Some(id) = &inv.container_id else {
        return ExitCode::SUCCESS;
    };
    let reported = std::fs::read_to_string(pid_file)
        .map_err(anyhow::Error::from)
        .and_then(|t| t.trim().parse::<u32>().map_err(anyhow::Error::from))
        .and_then(|pid| inject::activate(id, pid, cfg));
    let Err(e) = reported else {
        return ExitCode::SUCCESS;
    };
    let mut delete = Command::new(runtime);
    delete.arg0(runtime);
    if let Some(root) = &inv.root {
        delete.arg("--root").arg(root);
    }
    let _ = delete.args(["delete", "--force", id]).status();
    let _ = inject::release_if_claimed(id, Some(&inv.owner()), cfg);
    log::error(
        inv.log.as_deref(),
        inv.log_format.as_deref(),
        &format!(
            "container {id}: its pid (from {}) could not be reported to the gpuslice agent, so the container is not created: {e:#}",
            pid_file.display()
        ),
    );
    ExitCode::FAILURE
}
