//! Rust declarations of driver functions against NVIDIA's own prototypes in `cuda.h`,
//! `cudaGL.h`, `cudaVDPAU.h` and `nvml.h` (CUDA 12.9; the interop headers need the system's
//! `GL/gl.h` and `vdpau/vdpau.h`, from Debian's `libgl-dev` and `libvdpau-dev`): a C++ program
//! built with the real headers prints, for each header prototype, the number of parameters and each one's size, signedness, pointer-ness and
//! pointee size, and the Rust side is compared with it. Where a declaration deliberately says
//! less (`*mut c_void` for a structure it does not read, `CUmemPropHead` and
//! `CUgraphNodeParamsHead` for the head of a structure, a C `int` for an enum), only what it
//! claims is compared: a pointer, no more than the structure's size, an integer of the same
//! size. Included by the interception library's and the simulated driver's tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A function as Rust declares it: its name and the text of each parameter's type and of
/// the result's.
#[derive(Debug, Clone)]
pub struct Declaration {
    pub name: String,
    pub params: Vec<String>,
    pub result: String,
}

/// One parameter (or the result) as the Rust declaration has it.
#[derive(Debug)]
enum Ty {
    /// An integer or enum of this many bytes; `signed` where Rust says so.
    Int { size: usize, signed: bool },
    /// An opaque handle: a pointer whose pointee is not compared.
    Handle,
    /// A structure passed by value, of this many bytes.
    Struct { size: usize },
    /// A pointer to this many bytes (0: to `c_void`, anything).
    Pointer { pointee: usize, at_most: bool },
}

/// A parameter (or the result) as the header declares it.
#[derive(Debug)]
#[allow(dead_code)]
struct HeaderTy {
    size: usize,
    pointer: bool,
    signed: bool,
    pointee: usize,
    is_enum: bool,
}

fn scalar(name: &str) -> Option<Ty> {
    let int = |size, signed| Some(Ty::Int { size, signed });
    match name {
        "u8" | "c_uchar" => int(1, false),
        "u16" | "c_ushort" => int(2, false),
        "c_int" | "i32" => int(4, true),
        "c_uint" | "u32" | "CUresult" | "nvmlReturn_t" => int(4, false),
        "CUdevice" => int(4, true),
        "usize" => int(8, false),
        "u64" | "c_ulonglong" | "CUdeviceptr" | "CUmemGenericAllocationHandle" => int(8, false),
        "CUcontext" | "CUstream" | "CUevent" | "CUmemoryPool" | "CUarray" | "CUmipmappedArray"
        | "CUfunction" | "CUgraph" | "CUgraphExec" | "CUgraphNode" | "CUgreenCtx"
        | "CUdevResourceDesc" | "CUmodule" | "CUlibrary" | "nvmlDevice_t" => Some(Ty::Handle),
        "CUipcMemHandle" | "CUipcEventHandle" => Some(Ty::Struct {
            size: gpuslice_cuda_abi::cuda::CU_IPC_HANDLE_SIZE,
        }),
        "CUmemLocation" => Some(Ty::Struct {
            size: std::mem::size_of::<gpuslice_cuda_abi::cuda::CUmemLocation>(),
        }),
        _ => None,
    }
}

/// Bytes of the types a pointer may point at in the table.
fn pointee_size(name: &str) -> Option<(usize, bool)> {
    use gpuslice_cuda_abi::{cuda::*, nvml::*};
    use std::mem::size_of;
    Some(match name {
        "c_void" => (0, false),
        "c_char" => (1, false),
        "c_int" | "c_uint" | "CUdevice" => (4, false),
        "usize" | "u64" | "CUdeviceptr" | "CUmemGenericAllocationHandle" => (8, false),
        "CUcontext" | "CUevent" | "CUmemoryPool" | "CUarray" | "CUmipmappedArray" | "CUgraph"
        | "CUgraphExec" | "CUgraphNode" | "CUgreenCtx" | "CUdevResourceDesc" | "CUmodule"
        | "CUlibrary" | "nvmlDevice_t" => (8, false),
        "CUdevResource" => (size_of::<CUdevResource>(), false),
        "CUuuid" => (size_of::<CUuuid>(), false),
        "CUmemLocation" => (size_of::<CUmemLocation>(), false),
        "CUipcMemHandle" => (size_of::<CUipcMemHandle>(), false),
        "CUipcEventHandle" => (size_of::<CUipcEventHandle>(), false),
        "CUDA_ARRAY_DESCRIPTOR" => (size_of::<CUDA_ARRAY_DESCRIPTOR>(), false),
        "CUDA_ARRAY3D_DESCRIPTOR" => (size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), false),
        "CUDA_ARRAY_MEMORY_REQUIREMENTS" => (size_of::<CUDA_ARRAY_MEMORY_REQUIREMENTS>(), false),
        "CUlaunchConfig" => (size_of::<CUlaunchConfig>(), false),
        "CUlaunchAttributeValue" => (size_of::<CUlaunchAttributeValue>(), false),
        "CUDA_LAUNCH_PARAMS" => (size_of::<CUDA_LAUNCH_PARAMS>(), false),
        "CUDA_MEM_ALLOC_NODE_PARAMS" => (size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>(), false),
        "CUDA_MEMSET_NODE_PARAMS" => (size_of::<CUDA_MEMSET_NODE_PARAMS>(), false),
        "CUDA_KERNEL_NODE_PARAMS_v2" => (size_of::<CUDA_KERNEL_NODE_PARAMS_v2>(), true),
        "CUDA_GRAPH_INSTANTIATE_PARAMS" => (size_of::<CUDA_GRAPH_INSTANTIATE_PARAMS>(), false),
        "CUmemPropHead" => (size_of::<CUmemPropHead>(), true),
        "CUgraphNodeParamsHead" => (size_of::<CUgraphNodeParamsHead>(), true),
        "nvmlMemory_t" => (size_of::<nvmlMemory_t>(), false),
        "nvmlMemory_v2_t" => (size_of::<nvmlMemory_v2_t>(), false),
        "nvmlProcessUtilizationSample_t" => (size_of::<nvmlProcessUtilizationSample_t>(), false),
        _ => return None,
    })
}

fn parse_type(t: &str, lenient: bool) -> Ty {
    let t = t.trim();
    if let Some(rest) = t
        .strip_prefix("*mut ")
        .or_else(|| t.strip_prefix("*const "))
    {
        // A pointer to a pointer points at 8 bytes.
        if rest.starts_with('*') {
            return Ty::Pointer {
                pointee: 8,
                at_most: false,
            };
        }
        let rest = rest.rsplit("::").next().unwrap_or(rest);
        let (pointee, at_most) = match pointee_size(rest) {
            Some(p) => p,
            None if lenient => (0, false),
            None => panic!("unknown pointee {rest:?}"),
        };
        return Ty::Pointer { pointee, at_most };
    }
    let t = t.rsplit("::").next().unwrap_or(t);
    match scalar(t) {
        Some(ty) => ty,
        // A type of the declaring crate's own (a function pointer, a handle): a pointer.
        None if lenient => Ty::Handle,
        None => panic!("unknown type {t:?}"),
    }
}

/// The name the headers declare a function under: a per-thread variant has the signature of
/// its base function (cuda.h declares it only when the per-thread default stream is chosen).
pub fn header_name(name: &str) -> &str {
    name.strip_suffix("_ptsz")
        .or_else(|| name.strip_suffix("_ptds"))
        .unwrap_or(name)
}

fn reference_dir() -> PathBuf {
    std::env::var_os("GPUSLICE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/gpuslice/reference")
        })
}

/// The CUDA 13.0 headers in place of 12.9's (`nvml.h` still 12.9's): for entry points only
/// drivers of CUDA 13 have.
#[allow(dead_code)]
pub fn header_dirs_13() -> Vec<PathBuf> {
    let cuda = reference_dir().join("cuda13/nvidia/cu13/include");
    assert!(
        cuda.join("cuda.h").exists(),
        "{} lacks NVIDIA's CUDA 13.0 headers: run scripts/reference-driver (scripts/test does)",
        cuda.display()
    );
    let mut dirs = header_dirs();
    dirs[0] = cuda;
    dirs
}

pub fn header_dirs() -> Vec<PathBuf> {
    let dir = reference_dir();
    let r = dir.join("cuda12/nvidia");
    let dirs = vec![r.join("cuda_runtime/include"), r.join("nvml_dev/include")];
    assert!(
        dirs[0].join("cuda.h").exists(),
        "{} lacks NVIDIA's headers: run scripts/reference-driver (scripts/test does)",
        dir.display()
    );
    dirs
}

const PRELUDE: &str = r#"
#include <cstdio>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <cuda.h>
#include <cudaGL.h>
#include <vdpau/vdpau.h>
#include <cudaVDPAU.h>
#include <nvml.h>
template <typename F> struct sig;
template <typename R, typename... A> struct sig<R (*)(A...)> {
    using ret = R;
    using args = std::tuple<A...>;
    static constexpr std::size_t n = sizeof...(A);
};
template <typename T, typename = void> struct complete : std::false_type {};
template <typename T> struct complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};
template <typename T> void describe(const char *fn, int i) {
    using P = std::remove_cv_t<std::remove_pointer_t<T>>;
    std::size_t pointee = 0;  // 0 also for a handle's opaque structure
    if constexpr (std::is_pointer_v<T> && !std::is_void_v<P> && !std::is_function_v<P>) {
        if constexpr (complete<P>::value) pointee = sizeof(P);
    }
    std::printf("%s %d %zu %d %d %zu %d\n", fn, i, sizeof(T), (int)std::is_pointer_v<T>,
                (int)std::is_signed_v<T>, pointee, (int)std::is_enum_v<T>);
}
template <std::size_t I, typename S> void arg(const char *fn) {
    if constexpr (I < S::n) describe<std::tuple_element_t<I, typename S::args>>(fn, I);
}
int main() {
"#;

/// The `extern "C"` functions a Rust source exports by name (`#[unsafe(no_mangle)]`), with
/// their parameter and result types as written.
pub fn exported_functions(source: &str) -> Vec<Declaration> {
    let mut out = Vec::new();
    for (at, _) in source.match_indices("#[unsafe(no_mangle)]") {
        let rest = &source[at..];
        let Some(f) = rest.find("extern \"C\" fn ") else {
            continue;
        };
        let rest = &rest[f + "extern \"C\" fn ".len()..];
        let Some(open) = rest.find('(') else { continue };
        let name = rest[..open].trim().to_string();
        // The parameter list ends at the parenthesis that balances the first.
        let mut depth = 0;
        let mut close = open;
        for (i, c) in rest[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let params = split_params(&rest[open + 1..close]);
        let after = rest[close + 1..].trim_start();
        let result = after
            .strip_prefix("->")
            .map(|r| {
                r.trim_start()
                    .split(|c: char| c == '{' || c.is_whitespace())
                    .next()
                    .unwrap_or("")
            })
            .unwrap_or("")
            .to_string();
        out.push(Declaration {
            name,
            params,
            result,
        });
    }
    out
}

/// The types of a parameter list `a: T, b: U` (commas inside parentheses do not split).
pub fn split_params(list: &str) -> Vec<String> {
    let mut params = Vec::new();
    let (mut depth, mut start) = (0, 0);
    let list = list.trim().trim_end_matches(',');
    for (i, c) in list.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' if !list[..i].ends_with('-') => depth -= 1,
            ',' if depth == 0 => {
                params.push(list[start..i].to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    if !list[start..].trim().is_empty() {
        params.push(list[start..].to_string());
    }
    params
        .iter()
        .map(|p| {
            p.split_once(':')
                .map_or(p.as_str(), |(_, t)| t)
                .trim()
                .to_string()
        })
        .collect()
}

/// What the comparison found.
pub struct Comparison {
    /// Differences between a declaration and the header's prototype.
    pub wrong: Vec<String>,
    /// Declared functions the headers do not declare.
    pub undeclared: Vec<String>,
}

impl Comparison {
    /// Fails, listing them, if any declaration differs from its prototype.
    pub fn assert_none_wrong(&self) {
        assert!(
            self.wrong.is_empty(),
            "{} differences:\n{}",
            self.wrong.len(),
            self.wrong.join("\n")
        );
    }
}

/// Compares `declared` with the headers' prototypes. With `lenient`, a type this module does
/// not know is compared by pointer-ness only.
pub fn compare(declared: &[Declaration], lenient: bool) -> Comparison {
    compare_in(declared, lenient, &header_dirs())
}

/// [`compare`], then what the CUDA 12.9 headers do not declare (entry points of CUDA 13
/// drivers) against the CUDA 13.0 headers: both comparisons, the second's `undeclared` what
/// neither declares.
pub fn compare_with_13(declared: &[Declaration], lenient: bool) -> (Comparison, Comparison) {
    let found = compare(declared, lenient);
    let newer: Vec<Declaration> = declared
        .iter()
        .filter(|d| found.undeclared.contains(&d.name))
        .cloned()
        .collect();
    let newer = compare_in(&newer, lenient, &header_dirs_13());
    (found, newer)
}

/// [`compare`] with the headers in `dirs`.
pub fn compare_in(declared: &[Declaration], lenient: bool, dirs: &[PathBuf]) -> Comparison {
    let mut parsed: Vec<(String, Vec<Ty>, Ty)> = declared
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                d.params.iter().map(|p| parse_type(p, lenient)).collect(),
                parse_type(&d.result, lenient),
            )
        })
        .collect();
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("signatures");
    let mut undeclared = Vec::new();
    // Built again without the names the compiler reports undeclared, until it builds.
    loop {
        let missing = build(&parsed, work.path(), &exe, dirs);
        if missing.is_empty() {
            break;
        }
        parsed.retain(|(name, ..)| !missing.contains(name));
        undeclared.extend(missing);
    }
    let run = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    // name → (count, position → what the header's type is); position -1 is the result.
    let mut header: BTreeMap<String, (usize, BTreeMap<i32, HeaderTy>)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            [name, "n", n] => header.entry(name.into()).or_default().0 = n.parse().unwrap(),
            [name, i, size, ptr, signed, pointee, is_enum] => {
                header.entry(name.into()).or_default().1.insert(
                    i.parse().unwrap(),
                    HeaderTy {
                        size: size.parse().unwrap(),
                        pointer: ptr == "1",
                        signed: signed == "1",
                        pointee: pointee.parse().unwrap(),
                        is_enum: is_enum == "1",
                    },
                );
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let mut wrong = Vec::new();
    for (name, params, result) in &parsed {
        let (count, args) = &header[name];
        if *count != params.len() {
            wrong.push(format!(
                "{name}: {} parameters, the header has {count}",
                params.len()
            ));
            continue;
        }
        for (i, ty) in std::iter::once((-1, result))
            .chain(params.iter().enumerate().map(|(i, t)| (i as i32, t)))
        {
            let h = &args[&i];
            let ok = match ty {
                // An enum's signedness is the compiler's choice; an integer's must agree.
                Ty::Int { size, signed } => {
                    !h.pointer && h.size == *size && (h.is_enum || h.signed == *signed)
                }
                Ty::Handle => h.pointer && h.size == 8,
                Ty::Struct { size } => !h.pointer && h.size == *size,
                Ty::Pointer { pointee: 0, .. } => h.pointer,
                Ty::Pointer {
                    pointee,
                    at_most: true,
                } => h.pointer && *pointee <= h.pointee,
                Ty::Pointer {
                    pointee,
                    at_most: false,
                } => h.pointer && *pointee == h.pointee,
            };
            if !ok {
                wrong.push(format!(
                    "{name} {}: ours {ty:?}, the header's {h:?}",
                    if i < 0 {
                        "result".to_string()
                    } else {
                        format!("parameter {i}")
                    }
                ));
            }
        }
    }
    Comparison { wrong, undeclared }
}

/// Builds the program printing the prototypes of `parsed` at `exe`. Returns the names the
/// headers do not declare (the program was not built), or none (it was).
fn build(
    parsed: &[(String, Vec<Ty>, Ty)],
    work: &Path,
    exe: &Path,
    dirs: &[PathBuf],
) -> Vec<String> {
    let mut src = String::from(PRELUDE);
    for (name, params, _) in parsed {
        let h = header_name(name);
        src.push_str(&format!(
            "    {{ using S = sig<decltype(&{h})>; std::printf(\"{name} n %zu\\n\", S::n); describe<S::ret>(\"{name}\", -1);\n"
        ));
        for i in 0..params.len() {
            src.push_str(&format!("      arg<{i}, S>(\"{name}\");\n"));
        }
        src.push_str("    }\n");
    }
    src.push_str("    return 0;\n}\n");
    let cpp = work.join("signatures.cpp");
    std::fs::write(&cpp, &src).unwrap();
    let mut compiler = Command::new("g++-11");
    compiler.arg("-std=c++17");
    // The legacy 32-bit entry points (cuMemAlloc without _v2) are declared under this name.
    compiler.arg("-D__CUDA_API_VERSION_INTERNAL");
    for d in dirs {
        compiler.arg("-I").arg(d);
    }
    let built = compiler
        .arg("-o")
        .arg(exe)
        .arg(&cpp)
        .output()
        .expect("g++-11 (apt-get install g++-11)");
    if built.status.success() {
        return Vec::new();
    }
    let errors = String::from_utf8_lossy(&built.stderr);
    let missing: Vec<String> = parsed
        .iter()
        .map(|(name, ..)| name)
        .filter(|name| errors.contains(&format!("‘{}’ was not declared", header_name(name))))
        .cloned()
        .collect();
    assert!(
        !missing.is_empty(),
        "the prototypes program did not build: {errors}"
    );
    missing
}
