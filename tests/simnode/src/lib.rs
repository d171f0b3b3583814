//! The simulated GPU node: a description of its GPUs (`node.json`), the per-process usage
//! records that the fake `libcuda.so.1` writes and the fake `libnvidia-ml.so.1` reads, and the
//! builder of a fake driver root.
//!
//! The fake libraries find the description, in order, at `$GPUSLICE_SIM_NODE`, at
//! `gpuslice-sim/node.json` beside the library file itself, and at
//! `/etc/gpuslice-sim/node.json`.

pub mod devices;
pub mod driver_root;
pub mod node;
pub mod procs;
pub mod unmodelled;

pub use node::{NodeSpec, SimGpu};

/// The directory of the shared library that contains `address` (a function of that library),
/// resolving symbolic links, as the fake libraries find the node description beside them.
// dladdr compares `address` with the loaded objects' ranges; it never reads through it.
#[allow(unsafe_code, clippy::not_unsafe_ptr_arg_deref)]
#[must_use]
pub fn library_dir_of(address: *const std::ffi::c_void) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `address` and fills `info`.
    if unsafe { libc::dladdr(address, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    path.parent().map(std::path::Path::to_path_buf)
}
