//! Calls between the library's own exported functions bind inside the library, as in the real
//! driver: an interposer (libgpuslice.so) sees each call a program makes exactly once.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
