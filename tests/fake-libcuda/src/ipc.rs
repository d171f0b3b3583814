//! Legacy interprocess memory and events. Memory (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`,
//! `cuIpcCloseMemHandle`): a process exports an allocation of `cuMemAlloc` as a handle,
//! another process opens the handle and maps the same memory at an address of its own. The
//! memory stays the exporter's: it is charged to the exporter, and the importer's usage
//! record does not count it, as NVML reports the real driver's processes. Events
//! (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`): an event made with
//! `CU_EVENT_INTERPROCESS` is opened in another process as an event of its own that shares
//! its record time, so that a wait there waits for what the exporter recorded.
//!
//! Simulated device memory is private host memory, so exporting an allocation moves it into
//! a memfd at the same address (its contents copied, pages never written left unbacked); the
//! handle names the exporting process and that descriptor, which the importer opens through
//! `/proc/<pid>/fd` (the two processes share a PID namespace, as the processes of one
//! container do). The exporter freeing the allocation while an importer has it open leaves
//! the importer's mapping in place, uncharged (the real driver calls this undefined).

use std::collections::HashMap;
use std::ffi::{c_char, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{LazyLock, Mutex, MutexGuard};

use std::sync::atomic::AtomicU64;

use gpuslice_cuda_abi::cuda::{
    CU_EVENT_DISABLE_TIMING, CU_IPC_HANDLE_SIZE, CUDA_ERROR_MAP_FAILED, CUevent, CUipcEventHandle,
    CUipcMemHandle,
};

use crate::codes::*;
use crate::state::{self, Allocation};
use crate::{CUdeviceptr, CUresult, current_ctx, guard, out};

/// Marks a handle this driver made ("GSIM").
const MAGIC: u32 = 0x4753_494D;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the one flag (peer access needs nothing here).
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// What a handle names, in its first 40 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Exported {
    pid: u32,
    fd: i32,
    /// The exporter's address of the allocation: with the pid, which allocation it is.
    base: u64,
    len: u64,
    /// The node GPU it is on.
    index: u64,
}

impl Exported {
    fn encode(self) -> CUipcMemHandle {
        let mut b = [0u8; CU_IPC_HANDLE_SIZE];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.base.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.index.to_le_bytes());
        CUipcMemHandle {
            reserved: b.map(|x| x as c_char),
        }
    }

    fn decode(h: &CUipcMemHandle) -> Option<Self> {
        let b = h.reserved.map(|x| x as u8);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        (u32_at(0) == MAGIC).then(|| Self {
            pid: u32_at(4),
            fd: i32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
            base: u64_at(16),
            len: u64_at(24),
            index: u64_at(32),
        })
    }
}

/// This process's exported allocations (by address) and the memfd each now lives in.
static EXPORTS: LazyLock<Mutex<HashMap<u64, OwnedFd>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Memory this process opened: by what the handle names, its address here and how many
/// times it was opened. Never held while the driver's state is locked (its free takes this
/// lock under that one).
static IMPORTS: LazyLock<Mutex<HashMap<Exported, (u64, u32)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn lock<T>(m: &'static Mutex<T>) -> Result<MutexGuard<'static, T>, CUresult> {
    m.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// Moves the allocation at `base` (`len` bytes) into a memfd mapped at the same address.
fn share(base: u64, len: usize) -> Result<OwnedFd, CUresult> {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"gpuslice-sim-ipc".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: a descriptor just created and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on the descriptor just created.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), i64::try_from(len).unwrap_or(i64::MAX)) } != 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    const PAGE: usize = 4096;
    // SAFETY: the allocation's `len` bytes at `base` are mapped by this driver.
    let memory = unsafe { std::slice::from_raw_parts(base as *const u8, len) };
    for (i, page) in memory.chunks(PAGE).enumerate() {
        if page.iter().all(|&b| b == 0) {
            continue;
        }
        // SAFETY: writes the page's bytes into the memfd at its offset.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                page.as_ptr().cast(),
                page.len(),
                (i * PAGE) as libc::off_t,
            )
        };
        if n != page.len() as isize {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    // SAFETY: replaces the allocation's private mapping, whose contents the memfd now holds,
    // with the memfd at the same address and length.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_MAP_FAILED);
    }
    Ok(fd)
}

/// The allocation at `base` was freed (or its context destroyed): exported, its memfd is
/// closed (an importer's mapping keeps the memory); opened from another process, it is
/// forgotten.
pub(crate) fn freed(base: u64) {
    if let Ok(mut e) = EXPORTS.lock() {
        e.remove(&base);
    }
    if let Ok(mut i) = IMPORTS.lock() {
        i.retain(|_, &mut (addr, _)| addr != base);
    }
}

/// Memory opened from another process is not freed by `cuMemFree`.
pub(crate) fn is_imported(ptr: u64) -> bool {
    IMPORTS
        .lock()
        .is_ok_and(|m| m.values().any(|&(addr, _)| addr == ptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    guard(|| {
        let d = state::get()?;
        let (len, index) = {
            let inner = d.lock();
            let a = inner.allocs.get(&dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            (a.len, a.index)
        };
        if is_imported(dptr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut exports = lock(&EXPORTS)?;
        let fd = match exports.get(&dptr) {
            Some(fd) => fd.as_raw_fd(),
            None => {
                let fd = share(dptr, len)?;
                let raw = fd.as_raw_fd();
                exports.insert(dptr, fd);
                raw
            }
        };
        let e = Exported {
            pid: std::process::id(),
            fd,
            base: dptr,
            len: len as u64,
            index: index as u64,
        };
        out(handle, e.encode())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let ctx = current_ctx()?;
        if flags & !LAZY_ENABLE_PEER_ACCESS != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let e = Exported::decode(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        // A process's own memory is not opened through a handle.
        if e.pid == std::process::id() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        if let Some((addr, refs)) = lock(&IMPORTS)?.get_mut(&e) {
            *refs += 1;
            return out(dptr, *addr);
        }
        let path = format!("/proc/{}/fd/{}\0", e.pid, e.fd);
        // SAFETY: a NUL-terminated path.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = usize::try_from(e.len).map_err(|_| CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: a new shared mapping of the exporter's memfd; the descriptor may close after.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_MAP_FAILED);
        }
        let addr = p as u64;
        // Known to the copies and pointer queries as device memory of the exporter's GPU,
        // charged nothing here.
        let d = state::get()?;
        d.lock().allocs.insert(
            addr,
            Allocation {
                index: usize::try_from(e.index).unwrap_or(ctx.node_index),
                charge: 0,
                len: len.max(1),
                context: crate::context::current_handle() as usize,
            },
        );
        lock(&IMPORTS)?.insert(e, (addr, 1));
        out(dptr, addr)
    })
}

/// The CUDA 4.0 name of the same call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuIpcOpenMemHandle_v2(dptr, handle, flags) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult {
    guard(|| {
        let mut imports = lock(&IMPORTS)?;
        let key = imports
            .iter()
            .find(|(_, (addr, _))| *addr == dptr)
            .map(|(k, _)| *k)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let last = imports.get_mut(&key).is_some_and(|(_, refs)| {
            *refs -= 1;
            *refs == 0
        });
        if last {
            imports.remove(&key);
            drop(imports);
            // Unmaps it and forgets it; nothing was charged for it.
            state::get()?.free(dptr)?;
        }
        Ok(())
    })
}

/// Marks an event handle this driver made ("GSEV").
const EVENT_MAGIC: u32 = 0x4753_4556;

/// One word of memory shared between processes (an interprocess event's record time): the
/// first word of a memfd page, mapped.
pub(crate) struct SharedWord {
    word: std::ptr::NonNull<AtomicU64>,
    /// Kept open by the process that made it, for the others to open through `/proc`.
    fd: OwnedFd,
}

// SAFETY: the word is an atomic in a shared mapping that lives as long as this value.
unsafe impl Send for SharedWord {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for SharedWord {}

impl SharedWord {
    /// A new word, 0.
    pub(crate) fn new() -> Result<Self, CUresult> {
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"gpuslice-sim-event".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: a descriptor just created and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on the descriptor just created.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) } != 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Self::map(fd)
    }

    /// The word another process made, by its descriptor there.
    fn open(pid: u32, fd: i32) -> Result<Self, CUresult> {
        let path = format!("/proc/{pid}/fd/{fd}\0");
        // SAFETY: a NUL-terminated path.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        Self::map(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    fn map(fd: OwnedFd) -> Result<Self, CUresult> {
        // SAFETY: a new shared mapping of the memfd's first page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_MAP_FAILED);
        }
        let word = std::ptr::NonNull::new(p.cast::<AtomicU64>()).ok_or(CUDA_ERROR_MAP_FAILED)?;
        Ok(Self { word, fd })
    }

    pub(crate) fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping made in `map`, page-aligned, unmapped only on drop.
        unsafe { self.word.as_ref() }
    }
}

impl Drop for SharedWord {
    fn drop(&mut self) {
        // SAFETY: the page mapped in `map`; no reference to the word outlives this value.
        unsafe { libc::munmap(self.word.as_ptr().cast(), 4096) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetEventHandle(
    handle: *mut CUipcEventHandle,
    e: CUevent,
) -> CUresult {
    guard(|| {
        let ev = crate::stream::event(e)?;
        if !ev.interprocess() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let word = ev.share()?;
        let mut b = [0u8; CU_IPC_HANDLE_SIZE];
        b[0..4].copy_from_slice(&EVENT_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&std::process::id().to_le_bytes());
        b[8..12].copy_from_slice(&word.fd.as_raw_fd().to_le_bytes());
        out(
            handle,
            CUipcEventHandle {
                reserved: b.map(|x| x as c_char),
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    e: *mut CUevent,
    handle: CUipcEventHandle,
) -> CUresult {
    guard(|| {
        current_ctx()?;
        let b = handle.reserved.map(|x| x as u8);
        let field = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        if field(0) != EVENT_MAGIC {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if field(4) == std::process::id() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        let word = SharedWord::open(field(4), field(8) as i32)?;
        let flags = crate::stream::EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
        out(e, crate::stream::new_event(flags, Some(word))?)
    })
}
