//! User objects (CUDA 11.3): a program's resource whose destructor the driver calls once no
//! one holds a reference: the program (`cuUserObjectCreate`, `cuUserObjectRetain`,
//! `cuUserObjectRelease`), a graph (`cuGraphRetainUserObject`, moved from the caller with
//! `CU_GRAPH_USER_OBJECT_MOVE`, `cuGraphReleaseUserObject`, and all of a graph's when it is
//! destroyed), or an executable graph instantiated from such a graph (until it is destroyed).
//! NVIDIA's cuda.core ties the Python objects a graph's nodes use to the graph so. The
//! destructor runs on a thread of the driver's own, never inside the call that dropped the
//! last reference, as the driver's does.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::codes::*;
use crate::graph::{CUgraph, CUgraphExec};
use crate::{CUresult, guard, out};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, the one flag, which is required.
const NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const MOVE: c_uint = 1;

type Destroy = unsafe extern "C" fn(*mut c_void);

struct Object {
    ptr: usize,
    destroy: Destroy,
    refs: u64,
}

#[derive(Default)]
struct Books {
    /// Live objects by handle.
    objects: HashMap<usize, Object>,
    /// References graphs and executable graphs hold: (owner, object) → count.
    held: HashMap<(usize, usize), u64>,
}

static BOOKS: LazyLock<Mutex<Books>> = LazyLock::new(|| Mutex::new(Books::default()));
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x5500_0000);

fn books() -> Result<MutexGuard<'static, Books>, CUresult> {
    BOOKS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// A reference count a call passes: nonzero and at most `INT_MAX`.
fn count_arg(count: c_uint) -> Result<u64, CUresult> {
    if count == 0 || count > i32::MAX as c_uint {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(u64::from(count))
}

impl Books {
    fn object(&mut self, object: usize) -> Result<&mut Object, CUresult> {
        self.objects
            .get_mut(&object)
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// Drops `count` references of `object`; the last one dropped has its destructor run.
    fn release(&mut self, object: usize, count: u64) -> Result<(), CUresult> {
        let o = self.object(object)?;
        o.refs = o.refs.saturating_sub(count);
        if o.refs == 0
            && let Some(o) = self.objects.remove(&object)
        {
            let (ptr, destroy) = (o.ptr, o.destroy);
            // SAFETY: the program's destructor with its own pointer, as it asked; on a thread
            // of its own, as the driver runs it.
            std::thread::spawn(move || unsafe { destroy(ptr as *mut c_void) });
        }
        Ok(())
    }

    /// Releases every reference `owner` (a graph or executable graph) holds.
    fn release_all(&mut self, owner: usize) -> Result<(), CUresult> {
        let mine: Vec<((usize, usize), u64)> = self
            .held
            .iter()
            .filter(|((o, _), _)| *o == owner)
            .map(|(k, v)| (*k, *v))
            .collect();
        for ((_, object), count) in mine {
            self.held.remove(&(owner, object));
            self.release(object, count)?;
        }
        Ok(())
    }

    /// Gives `to` new references to every object `from` holds, as many.
    fn share(&mut self, from: usize, to: usize) -> Result<(), CUresult> {
        let theirs: Vec<(usize, u64)> = self
            .held
            .iter()
            .filter(|((o, _), _)| *o == from)
            .map(|((_, object), count)| (*object, *count))
            .collect();
        for (object, count) in theirs {
            self.object(object)?.refs += count;
            *self.held.entry((to, object)).or_insert(0) += count;
        }
        Ok(())
    }
}

/// Graph `g` is destroyed: the references it holds go.
pub(crate) fn graph_destroyed(g: CUgraph) -> Result<(), CUresult> {
    books()?.release_all(g as usize)
}

/// Executable graph `e` is destroyed: the references it holds go.
pub(crate) fn exec_destroyed(e: CUgraphExec) -> Result<(), CUresult> {
    books()?.release_all(e as usize)
}

/// `to` (an executable graph instantiated from `from`, or a copy of graph `from`) holds
/// references to the objects `from` holds.
pub(crate) fn shared(from: usize, to: usize) -> Result<(), CUresult> {
    books()?.share(from, to)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuUserObjectCreate(
    object: *mut *mut c_void,
    ptr: *mut c_void,
    destroy: Option<Destroy>,
    refs: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let destroy = destroy.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let refs = count_arg(refs)?;
        if flags != NO_DESTRUCTOR_SYNC || object.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = NEXT.fetch_add(16, std::sync::atomic::Ordering::Relaxed);
        books()?.objects.insert(
            handle,
            Object {
                ptr: ptr as usize,
                destroy,
                refs,
            },
        );
        out(object, handle as *mut c_void)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuUserObjectRetain(object: *mut c_void, count: c_uint) -> CUresult {
    guard(|| {
        let count = count_arg(count)?;
        books()?.object(object as usize)?.refs += count;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuUserObjectRelease(object: *mut c_void, count: c_uint) -> CUresult {
    guard(|| {
        let count = count_arg(count)?;
        books()?.release(object as usize, count)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphRetainUserObject(
    g: CUgraph,
    object: *mut c_void,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        crate::graph::graph(g)?;
        let count = count_arg(count)?;
        let mut b = books()?;
        let o = b.object(object as usize)?;
        match flags {
            0 => o.refs += count,
            // The caller's references become the graph's.
            MOVE => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        *b.held.entry((g as usize, object as usize)).or_insert(0) += count;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphReleaseUserObject(
    g: CUgraph,
    object: *mut c_void,
    count: c_uint,
) -> CUresult {
    guard(|| {
        crate::graph::graph(g)?;
        let count = count_arg(count)?;
        let mut b = books()?;
        let key = (g as usize, object as usize);
        let held = b.held.get(&key).copied().unwrap_or(0);
        if held < count {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if held == count {
            b.held.remove(&key);
        } else {
            b.held.insert(key, held - count);
        }
        b.release(object as usize, count)
    })
}
