//! Modules as the driver reports how it loads them.

use std::ffi::c_int;

use crate::{CUresult, guard, out};

/// `CU_MODULE_EAGER_LOADING` and `CU_MODULE_LAZY_LOADING`.
const EAGER_LOADING: c_int = 1;
const LAZY_LOADING: c_int = 2;

/// Lazy unless `CUDA_MODULE_LOADING=EAGER`, as drivers since CUDA 12.2 do.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    guard(|| {
        let eager =
            std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER"));
        out(mode, if eager { EAGER_LOADING } else { LAZY_LOADING })
    })
}
