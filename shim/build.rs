//! Links the unwinder statically (as `gcc -static-libgcc` does for a shared library), so that
//! loading libgpuslice.so into every process of a container does not also load libgcc_s: one
//! library fewer to open and map at each start-up. `-lgcc_s`, which the standard library asks
//! for, is answered by a linker script naming the static archives.
fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join("libgcc_s.so"), "INPUT(-lgcc_eh -lgcc)\n").expect("linker script");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-rosegment");
}
