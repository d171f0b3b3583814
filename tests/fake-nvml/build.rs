//! Calls between the library's own exported functions bind inside the library, as in the real
//! driver: an interposer (libgpuslice.so) sees each call a program makes exactly once. The
//! soname is the real driver's, so that `dlopen("libnvidia-ml.so.1")` finds the library however it was
//! loaded.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
