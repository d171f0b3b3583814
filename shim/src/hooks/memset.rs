//! Memsets: the driver sets device memory with kernels of its own, on the SMs a share
//! divides, so on a paced GPU a memset passes the same gate as a kernel launch (`pacing`): in
//! a slice given a window of each cycle it is issued in that window only, and paced from
//! NVML's samples it takes blocks from the bucket by its size. Every memset entry point the
//! driver exports is here, the CUDA 2.0 ones of 32-bit addresses too, or a tenant would keep
//! the SMs busy through them unpaced. A memset captured into a graph runs nothing now; a
//! graph's memset nodes are paced with its launches (`graph`).

use std::ffi::{c_uchar, c_uint, c_ushort};

use super::launch::{launched, pace_blocks};
use super::real_or_return;
use crate::ffi::*;

/// The bytes one thread block of the driver's memset kernels is taken to set, for the
/// bucket of a GPU paced from samples. Their grids are the driver's own, so this is a
/// guess; the pacing corrects for it, since it sets the rate from the utilization measured
/// for what was launched, memsets included.
const BYTES_PER_BLOCK: u64 = 64 * 1024;

/// The blocks a memset of `bytes` counts for in a bucket.
#[must_use]
pub fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(BYTES_PER_BLOCK).max(1)
}

/// The blocks of a memset node's parameters `p`.
#[must_use]
pub fn node_blocks(p: &CUDA_MEMSET_NODE_PARAMS) -> u64 {
    blocks(bytes_2d(
        p.width as u64,
        p.height as u64,
        u64::from(p.element_size),
    ))
}

/// Waits for the slice's SM share, if it has one, to allow setting `bytes` on `stream`
/// (`ptsz`: the per-thread default stream's variant), then passes the memset on (`call`).
#[inline]
fn set(bytes: u64, stream: CUstream, ptsz: bool, call: impl FnOnce() -> CUresult) -> CUresult {
    match pace_blocks(blocks(bytes), stream, ptsz) {
        None => call(),
        paced => launched(paced, call(), stream, ptsz),
    }
}

/// `bytes` of `count` elements of `size` bytes.
fn bytes(count: impl Into<u64>, size: u64) -> u64 {
    count.into().saturating_mul(size)
}

/// `bytes` of a 2-D memset: `height` rows of `width` elements of `size` bytes.
fn bytes_2d(width: impl Into<u64>, height: impl Into<u64>, size: u64) -> u64 {
    bytes(width, size).saturating_mul(height.into())
}

macro_rules! memsets {
    ($(
        $hook:ident => $name:ident ( $($arg:ident : $ty:ty),* ),
            bytes $bytes:expr, stream $stream:expr, ptsz $ptsz:expr;
    )*) => {
        $(
            pub unsafe fn $hook($($arg: $ty),*) -> CUresult {
                let f = real_or_return!($name);
                // SAFETY: the caller's arguments, passed on unchanged.
                set($bytes, $stream, $ptsz, || unsafe { f($($arg),*) })
            }
        )*
    };
}

const NULL: CUstream = std::ptr::null_mut();

memsets! {
    legacy_memset_d8 => cuMemsetD8(dst: c_uint, value: c_uchar, n: c_uint),
        bytes bytes(n, 1), stream NULL, ptsz false;
    legacy_memset_d16 => cuMemsetD16(dst: c_uint, value: c_ushort, n: c_uint),
        bytes bytes(n, 2), stream NULL, ptsz false;
    legacy_memset_d32 => cuMemsetD32(dst: c_uint, value: c_uint, n: c_uint),
        bytes bytes(n, 4), stream NULL, ptsz false;
    legacy_memset_d2d8 => cuMemsetD2D8(dst: c_uint, pitch: c_uint, value: c_uchar, width: c_uint, height: c_uint),
        bytes bytes_2d(width, height, 1), stream NULL, ptsz false;
    legacy_memset_d2d16 => cuMemsetD2D16(dst: c_uint, pitch: c_uint, value: c_ushort, width: c_uint, height: c_uint),
        bytes bytes_2d(width, height, 2), stream NULL, ptsz false;
    legacy_memset_d2d32 => cuMemsetD2D32(dst: c_uint, pitch: c_uint, value: c_uint, width: c_uint, height: c_uint),
        bytes bytes_2d(width, height, 4), stream NULL, ptsz false;
    memset_d8 => cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, n: usize),
        bytes bytes(n as u64, 1), stream NULL, ptsz false;
    memset_d8_ptds => cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: c_uchar, n: usize),
        bytes bytes(n as u64, 1), stream NULL, ptsz true;
    memset_d8_async => cuMemsetD8Async(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream),
        bytes bytes(n as u64, 1), stream stream, ptsz false;
    memset_d8_async_ptsz => cuMemsetD8Async_ptsz(dst: CUdeviceptr, value: c_uchar, n: usize, stream: CUstream),
        bytes bytes(n as u64, 1), stream stream, ptsz true;
    memset_d16 => cuMemsetD16_v2(dst: CUdeviceptr, value: c_ushort, n: usize),
        bytes bytes(n as u64, 2), stream NULL, ptsz false;
    memset_d16_ptds => cuMemsetD16_v2_ptds(dst: CUdeviceptr, value: c_ushort, n: usize),
        bytes bytes(n as u64, 2), stream NULL, ptsz true;
    memset_d16_async => cuMemsetD16Async(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream),
        bytes bytes(n as u64, 2), stream stream, ptsz false;
    memset_d16_async_ptsz => cuMemsetD16Async_ptsz(dst: CUdeviceptr, value: c_ushort, n: usize, stream: CUstream),
        bytes bytes(n as u64, 2), stream stream, ptsz true;
    memset_d32 => cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize),
        bytes bytes(n as u64, 4), stream NULL, ptsz false;
    memset_d32_ptds => cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: c_uint, n: usize),
        bytes bytes(n as u64, 4), stream NULL, ptsz true;
    memset_d32_async => cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream),
        bytes bytes(n as u64, 4), stream stream, ptsz false;
    memset_d32_async_ptsz => cuMemsetD32Async_ptsz(dst: CUdeviceptr, value: c_uint, n: usize, stream: CUstream),
        bytes bytes(n as u64, 4), stream stream, ptsz true;
    memset_d2d8 => cuMemsetD2D8_v2(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 1), stream NULL, ptsz false;
    memset_d2d8_ptds => cuMemsetD2D8_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 1), stream NULL, ptsz true;
    memset_d2d8_async => cuMemsetD2D8Async(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 1), stream stream, ptsz false;
    memset_d2d8_async_ptsz => cuMemsetD2D8Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uchar, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 1), stream stream, ptsz true;
    memset_d2d16 => cuMemsetD2D16_v2(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 2), stream NULL, ptsz false;
    memset_d2d16_ptds => cuMemsetD2D16_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 2), stream NULL, ptsz true;
    memset_d2d16_async => cuMemsetD2D16Async(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 2), stream stream, ptsz false;
    memset_d2d16_async_ptsz => cuMemsetD2D16Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_ushort, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 2), stream stream, ptsz true;
    memset_d2d32 => cuMemsetD2D32_v2(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 4), stream NULL, ptsz false;
    memset_d2d32_ptds => cuMemsetD2D32_v2_ptds(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize),
        bytes bytes_2d(width as u64, height as u64, 4), stream NULL, ptsz true;
    memset_d2d32_async => cuMemsetD2D32Async(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 4), stream stream, ptsz false;
    memset_d2d32_async_ptsz => cuMemsetD2D32Async_ptsz(dst: CUdeviceptr, pitch: usize, value: c_uint, width: usize, height: usize, stream: CUstream),
        bytes bytes_2d(width as u64, height as u64, 4), stream stream, ptsz true;
}
