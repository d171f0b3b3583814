//! Calls between the library's own exported functions bind inside the library, as in the real
//! driver: an interposer (libgpuslice.so) sees each call a program makes exactly once. The
//! soname is the real driver's, so that `dlopen("libcuda.so.1")` finds the library however it was
//! loaded.
//!
//! The real driver's export list and `cuGetProcAddress` table (`tests/reference/`, derived
//! from NVIDIA's files by `tests/reference/generate.py`) become: a stub for every export this
//! library does not model (it answers `CUDA_ERROR_NOT_SUPPORTED` and is counted), and the
//! table `cuGetProcAddress` answers from, with the rows of the newer entry points it models
//! (`proc-address-newer.tsv`) and of those a CUDA 13.0 driver answers beyond them
//! (`proc-address-13000.tsv`, stubs where not modelled).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");

    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=../reference");
    let reference = Path::new("../reference");
    // The reference driver's table, the newer entry points modelled beyond it, and those a
    // CUDA 13.0 driver (580) answers beyond both: `cuGetProcAddress` gives each to nodes whose
    // driver is at least as new as its variant.
    let newest = read(&reference.join("proc-address-13000.tsv"));
    let table = read(&reference.join("proc-address.tsv"))
        + &read(&reference.join("proc-address-newer.tsv"))
        + &newest;
    // Every export of the reference driver, and the newest driver's symbols it lacks.
    let mut symbols = read(&reference.join("libcuda.symbols"));
    let known: std::collections::BTreeSet<String> = symbols.lines().map(String::from).collect();
    for symbol in newest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split('\t').nth(3))
        .collect::<std::collections::BTreeSet<_>>()
    {
        if !known.contains(symbol) {
            symbols.push_str(symbol);
            symbols.push('\n');
        }
    }
    let modelled: BTreeMap<String, String> = modelled_functions(Path::new("src"))
        .into_iter()
        .map(|(name, stem)| match stem.as_str() {
            "lib" => (name, "crate".to_string()),
            _ => (name, format!("crate::{stem}")),
        })
        .collect();

    let mut out = stubs(&symbols, &modelled, "crate::CUresult");
    let path_of = |symbol: &str| match modelled.get(symbol) {
        Some(module) => format!("{module}::{symbol}"),
        None => format!("crate::exports::{symbol}"),
    };
    writeln!(
        out,
        "pub(crate) fn proc_address_table() -> Vec<crate::proc_address::Entry> {{\n    vec!["
    )
    .unwrap();
    for row in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let cols: Vec<&str> = row.split('\t').collect();
        let [name, version, stream, symbol] = cols[..] else {
            panic!("proc-address.tsv: malformed row {row:?}");
        };
        let stream = match stream {
            "default" => "Default",
            "ptds" | "ptsz" => "PerThread",
            other => panic!("proc-address.tsv: unknown stream kind {other:?}"),
        };
        writeln!(
            out,
            "        crate::proc_address::Entry {{ name: {name:?}, version: {version}, stream: crate::proc_address::Stream::{stream}, address: {} as *const () as usize }},",
            path_of(symbol)
        )
        .unwrap();
    }
    out.push_str("    ]\n}\n");
    write_generated(&out);
}

include!("../reference/scan.rs");
