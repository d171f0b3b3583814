//! Every function the simulated driver libraries model (their `#[unsafe(no_mangle)]`
//! exports in `tests/fake-libcuda/src` and `tests/fake-nvml/src`) against NVIDIA's own
//! declaration in `cuda.h` / `nvml.h` (CUDA 12.9; CUDA 13.0's `cuda.h` for what only drivers of
//! CUDA 13 have), as `tests/reference/prototypes.rs` compares
//! them. A type of a fake's own (a function pointer, a structure it declares for itself) is
//! compared by pointer-ness. Functions the fakes' macros define are read from the macros'
//! invocations (`name => target(params)[, extra: type]*;` lines, `scalar_getter!`). Not
//! compared: the stubs generated for unmodelled exports (they take no parameters and only
//! answer NOT_SUPPORTED). Exports the headers do not declare are listed and must stay few.

#[path = "../../reference/prototypes.rs"]
mod prototypes;

use std::path::Path;

use prototypes::Declaration;

fn exports(dir: &str) -> Vec<Declaration> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).unwrap();
            out.extend(
                prototypes::exported_functions(&source)
                    .into_iter()
                    .filter(|d| !d.name.starts_with('$')),
            );
            out.extend(macro_functions(&source));
        }
    }
    out
}

/// The functions the fakes' macros define, from their invocations: `name => target(a: T, ...)`
/// lines (extra parameters after the closing parenthesis: `, b: U`) returning `CUresult`, and
/// `scalar_getter!(name, T, ...)` (`(nvmlDevice_t, *mut T) -> nvmlReturn_t`).
fn macro_functions(source: &str) -> Vec<Declaration> {
    let mut out = Vec::new();
    for line in source.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("scalar_getter!(") {
            let mut parts = rest.splitn(3, ',');
            let (Some(name), Some(ty)) = (parts.next(), parts.next()) else {
                continue;
            };
            out.push(Declaration {
                name: name.trim().to_string(),
                params: vec!["nvmlDevice_t".into(), format!("*mut {}", ty.trim())],
                result: "nvmlReturn_t".into(),
            });
            continue;
        }
        let Some((name, call)) = line.split_once(" => ") else {
            continue;
        };
        let (Some(open), Some(close)) = (call.find('('), call.rfind(')')) else {
            continue;
        };
        if !name.starts_with("cu") || !line.ends_with(';') {
            continue;
        }
        let mut params = prototypes::split_params(&call[open + 1..close]);
        let extra = call[close + 1..].trim_end_matches(';');
        params.extend(prototypes::split_params(extra.trim_start_matches(',')));
        out.push(Declaration {
            name: name.to_string(),
            params,
            result: "CUresult".into(),
        });
    }
    out
}

#[test]
fn every_function_the_simulated_driver_models_matches_nvidias_prototype() {
    let mut all = exports("../fake-libcuda/src");
    let cuda = all.len();
    all.extend(exports("../fake-nvml/src"));
    assert!(
        cuda > 150 && all.len() > cuda + 20,
        "the fakes' exports were not found: {cuda} CUDA, {} NVML",
        all.len() - cuda
    );
    let macros = all
        .iter()
        .filter(|d| d.name.ends_with("_ptsz") || d.name.ends_with("_ptds"))
        .count();
    assert!(
        macros > 30,
        "the macro-defined variants were not read: {macros}"
    );
    println!(
        "{} functions, {macros} of them per-thread variants",
        all.len()
    );
    // Entry points of CUDA 13 drivers (the simulated 580's) against the 13.0 headers.
    let (found, newer) = prototypes::compare_with_13(&all, true);
    found.assert_none_wrong();
    let by_13 = found.undeclared.len() - newer.undeclared.len();
    println!(
        "of those, declared by CUDA 13.0: {by_13}; by neither: {:?}",
        newer.undeclared
    );
    assert!(by_13 >= 5, "{:?}", newer.undeclared);
    assert!(newer.undeclared.len() <= 4, "{:?}", newer.undeclared);
    newer.assert_none_wrong();
}
