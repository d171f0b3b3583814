//! Calls between the library's own exported functions bind inside the library, as in the real
//! driver: an interposer (libgpuslice.so) sees each call a program makes exactly once. The
//! soname is the real driver's, so that `dlopen("libnvidia-ml.so.1")` finds the library however
//! it was loaded.
//!
//! Every function the real NVML exports (`tests/reference/libnvidia-ml.symbols`) that this
//! library does not model gets a stub that answers `NVML_ERROR_NOT_SUPPORTED` and is counted.
use std::path::Path;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=src");

    let symbols = read(Path::new("../reference/libnvidia-ml.symbols"));
    let modelled = modelled_functions(Path::new("src"));
    write_generated(&stubs(&symbols, &modelled, "crate::nvmlReturn_t"));
}

include!("../reference/scan.rs");
