fn main() {
    // The real library's soname, so that programs linked against it record the right name.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
