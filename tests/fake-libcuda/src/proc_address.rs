//! `cuGetProcAddress`: the driver entry points by base name, the CUDA version that introduced
//! each variant and its default-stream semantics, as the real driver answers them. The table is
//! the real driver's (`tests/reference/proc-address.tsv`), built into `exports.rs`.

use std::ffi::c_void;

use crate::codes::{
    CU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
};

/// Which default stream a variant uses: the legacy one, or the per-thread one (`_ptds`,
/// `_ptsz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Default,
    PerThread,
}

/// One variant of a driver entry point.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    /// The first CUDA version (1000 × major + 10 × minor) that calls this variant.
    pub version: i32,
    pub stream: Stream,
    pub address: usize,
}

/// Built once: lookups happen on every `cuGetProcAddress`.
static TABLE: std::sync::LazyLock<Vec<Entry>> =
    std::sync::LazyLock::new(crate::exports::proc_address_table);

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

/// The newest variant of `name` no newer than `cuda_version` that the node's driver has, and
/// the `CUdriverProcAddressQueryResult` to report. With the per-thread default-stream flag, the
/// `_ptsz`/`_ptds` variant is returned where the driver has one, as the real driver does.
pub fn lookup(name: &str, cuda_version: i32, flags: u64) -> (Option<*mut c_void>, i32) {
    // A driver has the variants of its own CUDA version and older.
    let driver = crate::state::cuda_version();
    let newest = |stream: Stream| {
        TABLE
            .iter()
            .filter(|e| e.name == name && e.stream == stream && e.version <= cuda_version)
            .filter(|e| e.version <= driver)
            .max_by_key(|e| e.version)
    };
    if flags & PER_THREAD_DEFAULT_STREAM != 0
        && let Some(e) = newest(Stream::PerThread)
    {
        return (Some(e.address as *mut c_void), CU_GET_PROC_ADDRESS_SUCCESS);
    }
    if let Some(e) = newest(Stream::Default) {
        return (Some(e.address as *mut c_void), CU_GET_PROC_ADDRESS_SUCCESS);
    }
    if TABLE.iter().any(|e| e.name == name && e.version <= driver) {
        (None, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    } else {
        (None, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
    }
}
