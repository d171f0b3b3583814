//! Texture and surface objects (`cuTexObjectCreate`, `cuSurfObjectCreate`): handles that
//! name memory for kernels to read through the texture units or write through surfaces. The
//! simulated GPU runs no kernel code, so an object is its descriptors, checked as the driver
//! checks them and read back by the `Get` calls; it takes no device memory (the driver's
//! descriptor tables are part of the context).
//!
//! Checked: the resource (an array that exists; a mipmapped array; linear or pitched device
//! memory of this process, its address aligned to the device's texture alignment, a pitch to
//! its pitch alignment, within the device's linear texture limits), a view only over an array,
//! and for a surface an array made with `CUDA_ARRAY3D_SURFACE_LDST`. Anything else is
//! `CUDA_ERROR_INVALID_VALUE`, as is an object that does not exist.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::codes::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN};
use crate::{CUresult, guard, out};

/// `CUDA_RESOURCE_DESC`, `CUDA_TEXTURE_DESC`, `CUDA_RESOURCE_VIEW_DESC` as cuda.h lays them
/// out (144, 104 and 112 bytes); the fields read are at fixed offsets.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct CUDA_RESOURCE_DESC([u8; 144]);
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct CUDA_TEXTURE_DESC([u8; 104]);
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct CUDA_RESOURCE_VIEW_DESC([u8; 112]);

/// `CUresourcetype`.
const RESOURCE_ARRAY: u32 = 0;
const RESOURCE_MIPMAPPED_ARRAY: u32 = 1;
const RESOURCE_LINEAR: u32 = 2;
const RESOURCE_PITCH2D: u32 = 3;
/// `CUDA_ARRAY3D_SURFACE_LDST`.
const SURFACE_LDST: u32 = 0x02;
/// The device attributes the checks read: texture and pitch alignment, and the linear
/// texture limits (1-D width in elements, 2-D width, height and pitch).
const TEXTURE_ALIGNMENT: c_int = 14;
const TEXTURE_PITCH_ALIGNMENT: c_int = 51;
const TEXTURE1D_LINEAR_WIDTH: c_int = 69;
const TEXTURE2D_LINEAR_WIDTH: c_int = 70;
const TEXTURE2D_LINEAR_HEIGHT: c_int = 71;
const TEXTURE2D_LINEAR_PITCH: c_int = 72;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

struct Texture {
    resource: CUDA_RESOURCE_DESC,
    texture: CUDA_TEXTURE_DESC,
    view: Option<CUDA_RESOURCE_VIEW_DESC>,
}

#[derive(Default)]
struct Objects {
    textures: HashMap<u64, Texture>,
    surfaces: HashMap<u64, CUDA_RESOURCE_DESC>,
}

static OBJECTS: LazyLock<Mutex<Objects>> = LazyLock::new(Mutex::default);
/// Handles are never reused (0 is no object).
static NEXT: AtomicU64 = AtomicU64::new(1);

fn objects() -> Result<MutexGuard<'static, Objects>, CUresult> {
    OBJECTS.lock().map_err(|_| CUDA_ERROR_UNKNOWN)
}

/// A current device attribute (0 where it has none).
fn attribute(a: c_int) -> Result<u64, CUresult> {
    let gpu = crate::context::current_gpu()?;
    Ok(crate::attributes::value(gpu, a).map_or(0, |v| u64::try_from(v).unwrap_or(0)))
}

/// Device memory of `bytes` at `ptr` a texture may read: this process's, aligned.
fn texture_memory(ptr: u64, bytes: u64) -> Result<(), CUresult> {
    let align = attribute(TEXTURE_ALIGNMENT)?.max(1);
    if ptr == 0 || !ptr.is_multiple_of(align) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    crate::copy::device_range(
        ptr,
        usize::try_from(bytes).map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
    )
}

/// Bytes of one element of `format` with `channels` channels (1, 2 or 4).
fn element(format: u32, channels: u32) -> Result<u64, CUresult> {
    if ![1, 2, 4].contains(&channels) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let format = c_int::try_from(format).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    Ok(crate::paths::element_size(format)? * u64::from(channels))
}

/// Checks `r` as a texture's (or, with `surface`, a surface's) resource.
fn check_resource(r: &CUDA_RESOURCE_DESC, surface: bool) -> Result<u32, CUresult> {
    let b = &r.0;
    let kind = u32_at(b, 0);
    if u32_at(b, 136) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE); // flags: must be zero
    }
    match kind {
        RESOURCE_ARRAY => {
            let array = u64_at(b, 8);
            let flags = crate::arrays::flags(array as crate::arrays::CUarray)?;
            if surface && flags & SURFACE_LDST == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        _ if surface => return Err(CUDA_ERROR_INVALID_VALUE),
        RESOURCE_MIPMAPPED_ARRAY if u64_at(b, 8) != 0 => {}
        RESOURCE_LINEAR => {
            let size = u64_at(b, 24);
            let element = element(u32_at(b, 16), u32_at(b, 20))?;
            if size == 0 || size / element > attribute(TEXTURE1D_LINEAR_WIDTH)? {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            texture_memory(u64_at(b, 8), size)?;
        }
        RESOURCE_PITCH2D => {
            let (width, height, pitch) = (u64_at(b, 24), u64_at(b, 32), u64_at(b, 40));
            let element = element(u32_at(b, 16), u32_at(b, 20))?;
            let fits = width > 0
                && height > 0
                && width <= attribute(TEXTURE2D_LINEAR_WIDTH)?
                && height <= attribute(TEXTURE2D_LINEAR_HEIGHT)?
                && pitch <= attribute(TEXTURE2D_LINEAR_PITCH)?
                && pitch >= width * element
                && pitch.is_multiple_of(attribute(TEXTURE_PITCH_ALIGNMENT)?.max(1));
            if !fits {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            texture_memory(u64_at(b, 8), pitch * (height - 1) + width * element)?;
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(kind)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectCreate(
    object: *mut u64,
    resource: *const CUDA_RESOURCE_DESC,
    texture: *const CUDA_TEXTURE_DESC,
    view: *const CUDA_RESOURCE_VIEW_DESC,
) -> CUresult {
    guard(|| {
        if object.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's descriptors, each null or of its type.
        let (resource, texture, view) =
            unsafe { (resource.as_ref(), texture.as_ref(), view.as_ref()) };
        let (Some(resource), Some(texture)) = (resource, texture) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let kind = check_resource(resource, false)?;
        let arrays = [RESOURCE_ARRAY, RESOURCE_MIPMAPPED_ARRAY];
        if view.is_some() && !arrays.contains(&kind) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        let t = Texture {
            resource: *resource,
            texture: *texture,
            view: view.copied(),
        };
        objects()?.textures.insert(handle, t);
        out(object, handle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexObjectDestroy(object: u64) -> CUresult {
    destroy(|o| o.textures.remove(&object).is_some())
}

/// What `what` finds of the objects, copied to `to`; none is `CUDA_ERROR_INVALID_VALUE`.
fn part<T: Copy>(to: *mut T, what: impl FnOnce(&Objects) -> Option<T>) -> CUresult {
    guard(|| out(to, what(&*objects()?).ok_or(CUDA_ERROR_INVALID_VALUE)?))
}

/// `what` of texture `object`, copied to `to`.
fn texture_part<T: Copy>(
    to: *mut T,
    object: u64,
    what: impl FnOnce(&Texture) -> Option<T>,
) -> CUresult {
    part(to, |o| o.textures.get(&object).and_then(what))
}

/// Destroys what `remove` takes out of the objects; nothing taken is
/// `CUDA_ERROR_INVALID_VALUE`.
fn destroy(remove: impl FnOnce(&mut Objects) -> bool) -> CUresult {
    guard(|| {
        if remove(&mut *objects()?) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(
    resource: *mut CUDA_RESOURCE_DESC,
    object: u64,
) -> CUresult {
    texture_part(resource, object, |t| Some(t.resource))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(
    texture: *mut CUDA_TEXTURE_DESC,
    object: u64,
) -> CUresult {
    texture_part(texture, object, |t| Some(t.texture))
}

/// A texture made without a view has none to give (`CUDA_ERROR_INVALID_VALUE`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetResourceViewDesc(
    view: *mut CUDA_RESOURCE_VIEW_DESC,
    object: u64,
) -> CUresult {
    texture_part(view, object, |t| t.view)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectCreate(
    object: *mut u64,
    resource: *const CUDA_RESOURCE_DESC,
) -> CUresult {
    guard(|| {
        // SAFETY: the caller's descriptor, null or of its type.
        let resource = unsafe { resource.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if object.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_resource(resource, true)?;
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        objects()?.surfaces.insert(handle, *resource);
        out(object, handle)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuSurfObjectDestroy(object: u64) -> CUresult {
    destroy(|o| o.surfaces.remove(&object).is_some())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(
    resource: *mut CUDA_RESOURCE_DESC,
    object: u64,
) -> CUresult {
    part(resource, |o| o.surfaces.get(&object).copied())
}
