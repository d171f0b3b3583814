//! The virtual-memory API after `cuMemCreate` (charged in `alloc`): the driver frees a physical
//! allocation at the later of its last `cuMemRelease` and its last `cuMemUnmap`, so a handle
//! released while still mapped keeps its charge until then. Each `cuMemRetainAllocationHandle`
//! is one more reference to release: the charge stays until the last of them, or a tenant
//! would retain a mapped allocation, release and unmap it (its charge given back), and map the
//! retained handle again, holding memory no counter shows.

use std::collections::{BTreeMap, HashMap};

use super::real_or_return;
use crate::ffi::*;
use crate::slice::{self, Charge, Kind};

/// What this process has mapped.
#[derive(Default)]
pub struct Mappings {
    /// Start address → (handle, size).
    at: BTreeMap<CUdeviceptr, (CUmemGenericAllocationHandle, usize)>,
    /// Handle → how many mappings of it exist.
    count: HashMap<CUmemGenericAllocationHandle, u32>,
    /// Released handles still mapped, with the charge they keep.
    released: HashMap<CUmemGenericAllocationHandle, Charge>,
    /// Handle → references `cuMemRetainAllocationHandle` added and no release took yet.
    retained: HashMap<CUmemGenericAllocationHandle, u32>,
}

impl Mappings {
    /// Forgets the charges of released handles on slice position `gpu`.
    pub fn forget(&mut self, gpu: usize) {
        self.released.retain(|_, c| c.gpu != gpu);
    }
}

fn mappings(s: &slice::Slice) -> std::sync::MutexGuard<'_, Mappings> {
    s.vmm
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub unsafe fn mem_retain_allocation_handle(
    handle: *mut CUmemGenericAllocationHandle,
    addr: *mut std::ffi::c_void,
) -> CUresult {
    let f = real_or_return!(cuMemRetainAllocationHandle);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(handle, addr) };
    if r == CUDA_SUCCESS
        && !handle.is_null()
        && let Some(s) = slice::get()
    {
        // SAFETY: the driver wrote the handle on success.
        let h = unsafe { handle.read() };
        *mappings(s).retained.entry(h).or_insert(0) += 1;
    }
    r
}

pub unsafe fn mem_release(handle: CUmemGenericAllocationHandle) -> CUresult {
    let f = real_or_return!(cuMemRelease);
    // SAFETY: the caller's argument, passed on unchanged.
    let call = || unsafe { f(handle) };
    let Some(s) = slice::get() else {
        return call();
    };
    if mappings(s).retained.get(&handle).is_some_and(|n| *n > 0) {
        // Not the last reference: the allocation stays, and its charge.
        let r = call();
        if r == CUDA_SUCCESS {
            let mut vmm = mappings(s);
            if let Some(n) = vmm.retained.get_mut(&handle) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    vmm.retained.remove(&handle);
                }
            }
        }
        return r;
    }
    let charge = s.take(Kind::Physical, handle);
    let r = call();
    match charge {
        Some(c) if r == CUDA_SUCCESS => {
            let mut vmm = mappings(s);
            if vmm.count.get(&handle).is_some_and(|n| *n > 0) {
                vmm.released.insert(handle, c);
            } else {
                drop(vmm);
                s.settle(c);
            }
        }
        Some(c) => s.put_back(Kind::Physical, handle, c),
        None => {}
    }
    r
}

pub unsafe fn mem_map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> CUresult {
    let f = real_or_return!(cuMemMap);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(ptr, size, offset, handle, flags) };
    if r == CUDA_SUCCESS
        && let Some(s) = slice::get()
    {
        let mut vmm = mappings(s);
        vmm.at.insert(ptr, (handle, size));
        *vmm.count.entry(handle).or_insert(0) += 1;
    }
    r
}

pub unsafe fn mem_unmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    let f = real_or_return!(cuMemUnmap);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { f(ptr, size) };
    if r != CUDA_SUCCESS {
        return r;
    }
    let Some(s) = slice::get() else {
        return r;
    };
    let end = ptr.saturating_add(size as u64);
    let mut freed = Vec::new();
    {
        let mut vmm = mappings(s);
        let starts: Vec<CUdeviceptr> = vmm.at.range(ptr..end).map(|(k, _)| *k).collect();
        for start in starts {
            let Some((handle, _)) = vmm.at.remove(&start) else {
                continue;
            };
            let left = vmm.count.get_mut(&handle).map(|n| {
                *n = n.saturating_sub(1);
                *n
            });
            if left == Some(0) {
                vmm.count.remove(&handle);
                if let Some(c) = vmm.released.remove(&handle) {
                    freed.push(c);
                }
            }
        }
    }
    for c in freed {
        s.settle(c);
    }
    r
}
