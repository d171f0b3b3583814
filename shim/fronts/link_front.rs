// Shared by the build scripts of the two driver fronts (included, not a module).
//
// A front is a shared object with no code of its own: its soname is the driver library's, and it
// needs, in this order, the interception library and the real driver library under a private
// name, found through its RUNPATH (`/usr/lib/gpuslice`, `/usr/lib/gpuslice/driver`) or
// `LD_LIBRARY_PATH`. A lookup through the front (the dynamic linker's, `dlsym` on its handle)
// therefore finds the interception library's function where it has one and the driver's
// otherwise. The linker records a needed library by the soname of a file it is given, so two
// empty stand-ins with those sonames are built here for it to read; they are never installed.

use std::path::Path;
use std::process::Command;

fn link_front(soname: &str, real: &str) {
    let out = std::env::var("OUT_DIR").expect("OUT_DIR");
    let out = Path::new(&out);
    let empty = out.join("empty.c");
    std::fs::write(&empty, "").expect("write empty.c");
    let mut needed = Vec::new();
    for name in ["libgpuslice.so", real] {
        let stand_in = out.join(name);
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-shared", "-nostdlib", "-o"])
            .arg(&stand_in)
            .arg(format!("-Wl,-soname,{name}"))
            .arg(&empty)
            .status()
            .expect("a C compiler (cc) to build the link-time stand-ins");
        assert!(status.success(), "cc failed building {}", stand_in.display());
        needed.push(stand_in);
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    for n in &needed {
        println!("cargo:rustc-cdylib-link-arg={}", n.display());
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,--enable-new-dtags,-rpath,/usr/lib/gpuslice:/usr/lib/gpuslice/driver");
    println!("cargo:rerun-if-changed=../link_front.rs");
}
