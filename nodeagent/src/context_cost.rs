//! What one CUDA context costs on each GPU, measured on the node's own driver: a child process
//! (the agent itself, run with a hidden flag) creates a context on every GPU in turn and asks
//! NVML how much device memory the driver then holds for it. The figure depends on the card,
//! the driver and the CUDA version, so it is measured where it is used, never configured by
//! hand; the agent charges it to a slice for each context a process creates
//! (`context_bytes` in the limits file) until its sampling of the driver corrects the figure
//! for the process (see [`crate::held`]).
//!
//! The probe runs in a child so that the driver's threads, its memory and any crash of the
//! driver stay out of the agent, and a driver that hangs is given up on after a timeout.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuslice_core::layout::{CUDA_SONAME, LIBRARY_DIRS};

/// The hidden flag that makes `gpuslice-agent` the probe.
pub const PROBE_FLAG: &str = "--probe-context-cost";

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot load the CUDA driver {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("the CUDA driver's {call} failed with error {code}")]
    Cuda { call: &'static str, code: c_int },
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("the probe {0}")]
    Child(String),
}

/// Which CUDA driver to load: the one in a driver root's library directories, or the
/// system's.
#[must_use]
pub fn cuda_library(driver_root: &Path) -> PathBuf {
    LIBRARY_DIRS
        .iter()
        .map(|d| driver_root.join(d).join(CUDA_SONAME))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(CUDA_SONAME))
}

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [c_char; 16], c_int) -> c_int;
type CuCtxCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int;
type CuCtxSynchronize = unsafe extern "C" fn() -> c_int;
type CuCtxDestroy = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML names a GPU, from the 16 bytes CUDA
/// gives.
fn uuid_text(b: &[u8; 16]) -> String {
    let hex =
        |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// The probe itself: creates a context on each GPU of the driver `cuda`, reads what NVML
/// (`nvml`) says this process then holds there, and destroys it. By GPU UUID.
pub fn probe(cuda: &Path, nvml: &Path) -> Result<BTreeMap<String, u64>, ProbeError> {
    let load = |reason: String| ProbeError::Load {
        library: cuda.display().to_string(),
        reason,
    };
    // SAFETY: loading the node's CUDA driver, whose initialisers are the driver's own; this
    // process exists only to do so.
    let lib = unsafe { libloading::Library::new(cuda) }.map_err(|e| load(e.to_string()))?;
    macro_rules! sym {
        ($name:literal, $ty:ty) => {
            // SAFETY: the symbol has this C signature in cuda.h.
            *unsafe { lib.get::<$ty>($name) }.map_err(|e| load(e.to_string()))?
        };
    }
    let init = sym!(b"cuInit", CuInit);
    let count = sym!(b"cuDeviceGetCount", CuDeviceGetCount);
    let get = sym!(b"cuDeviceGet", CuDeviceGet);
    let uuid = sym!(b"cuDeviceGetUuid", CuDeviceGetUuid);
    let create = sym!(b"cuCtxCreate_v2", CuCtxCreate);
    let sync = sym!(b"cuCtxSynchronize", CuCtxSynchronize);
    let destroy = sym!(b"cuCtxDestroy_v2", CuCtxDestroy);
    let check = |call: &'static str, code: c_int| match code {
        0 => Ok(()),
        code => Err(ProbeError::Cuda { call, code }),
    };
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(nvml.as_os_str())
        .init()
        .map_err(|e| ProbeError::Nvml(e.to_string()))?;
    // SAFETY: the driver's entry points, called with valid out-pointers, in the order the
    // driver API requires (cuInit first).
    unsafe {
        check("cuInit", init(0))?;
        let mut n = 0;
        check("cuDeviceGetCount", count(&raw mut n))?;
        let mut out = BTreeMap::new();
        for ordinal in 0..n {
            let mut dev = 0;
            check("cuDeviceGet", get(&raw mut dev, ordinal))?;
            let mut raw = [0 as c_char; 16];
            check("cuDeviceGetUuid", uuid(&raw mut raw, dev))?;
            let name = uuid_text(&raw.map(|c| c as u8));
            let device = nvml
                .device_by_uuid(name.as_str())
                .map_err(|e| ProbeError::Nvml(format!("{name}: {e}")))?;
            let before = holders(&device);
            let mut ctx = std::ptr::null_mut();
            check("cuCtxCreate_v2", create(&raw mut ctx, 0, dev))?;
            check("cuCtxSynchronize", sync())?;
            let after = holders(&device);
            check("cuCtxDestroy_v2", destroy(ctx))?;
            if let Some(bytes) = own_share(&before, &after) {
                out.insert(name, bytes);
            }
        }
        Ok(out)
    }
}

/// The processes holding memory on `device`: (pid, bytes).
fn holders(device: &nvml_wrapper::Device<'_>) -> Vec<(u32, u64)> {
    device
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| match p.used_gpu_memory {
            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some((p.pid, b)),
            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
        })
        .collect()
}

/// What this process holds, from the holders before and after it made its context: its own
/// pid where NVML names it so, else (in a PID namespace of its own, where NVML's pids are
/// the host's) the one process that appeared meanwhile.
fn own_share(before: &[(u32, u64)], after: &[(u32, u64)]) -> Option<u64> {
    let me = std::process::id();
    if let Some(&(_, b)) = after.iter().find(|(p, _)| *p == me) {
        return Some(b);
    }
    let new: Vec<u64> = after
        .iter()
        .filter(|(p, _)| !before.iter().any(|(q, _)| q == p))
        .map(|&(_, b)| b)
        .collect();
    (new.len() == 1).then(|| new[0])
}

/// Runs the probe in a child (`exe` with [`PROBE_FLAG`]) and reads its answer, giving up
/// after `timeout`.
pub fn measure(
    exe: &Path,
    cuda: &Path,
    nvml: &Path,
    timeout: Duration,
) -> Result<BTreeMap<String, u64>, ProbeError> {
    use std::io::Read;
    let mut child = std::process::Command::new(exe)
        .arg(PROBE_FLAG)
        .arg(cuda)
        .arg(nvml)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| ProbeError::Child(format!("cannot start {}: {e}", exe.display())))?;
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProbeError::Child(format!(
                    "gave no answer within {timeout:?}"
                )));
            }
            Err(e) => return Err(ProbeError::Child(e.to_string())),
        }
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(ProbeError::Child(format!(
            "failed ({status}): {}",
            err.trim()
        )));
    }
    serde_json::from_str(&out)
        .map_err(|e| ProbeError::Child(format!("answered {out:?}, not a JSON map: {e}")))
}

/// The probe's entry: `gpuslice-agent --probe-context-cost CUDA NVML` prints a JSON map of
/// GPU UUID to bytes, or fails with the reason.
pub fn probe_main(args: &[String]) -> std::process::ExitCode {
    let (Some(cuda), Some(nvml)) = (args.first(), args.get(1)) else {
        eprintln!("usage: gpuslice-agent {PROBE_FLAG} CUDA_LIBRARY NVML_LIBRARY");
        return std::process::ExitCode::from(2);
    };
    match probe(Path::new(cuda), Path::new(nvml)) {
        Ok(m) => {
            println!("{}", serde_json::to_string(&m).unwrap_or_default());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_written_as_nvml_writes_it() {
        let b = [
            0x5a, 0x1c, 0xe0, 0x00, 0x00, 0x00, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0x51, 0x00,
        ];
        assert_eq!(uuid_text(&b), "GPU-5a1ce000-0000-4000-8000-000000005100");
    }

    #[test]
    fn the_probe_finds_itself_by_pid_or_as_the_one_new_process() {
        let me = std::process::id();
        assert_eq!(own_share(&[(1, 5)], &[(1, 5), (me, 700)]), Some(700));
        // Host pids only (a PID namespace of its own): the one that appeared is the probe.
        assert_eq!(own_share(&[(1, 5)], &[(1, 5), (999_999, 700)]), Some(700));
        assert_eq!(own_share(&[], &[(999_998, 1), (999_999, 2)]), None);
    }
}
