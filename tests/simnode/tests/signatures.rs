//! Every function the simulated driver libraries model (their `#[unsafe(no_mangle)]`
//! exports in `tests/fake-libcuda/src` and `tests/fake-nvml/src`) against NVIDIA's own
//! declaration in `cuda.h` / `nvml.h` (CUDA 12.9), as `tests/reference/prototypes.rs` compares
//! them. A type of a fake's own (a function pointer, a structure it declares for itself) is
//! compared by pointer-ness. Not compared: the stubs generated for unmodelled exports (they
//! take no parameters and only answer NOT_SUPPORTED) and functions a macro of the fakes
//! defines; exports the headers do not declare are listed and must stay few.

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
            out.extend(
                prototypes::exported_functions(&std::fs::read_to_string(&path).unwrap())
                    .into_iter()
                    .filter(|d| !d.name.starts_with('$')),
            );
        }
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
    let found = prototypes::compare(&all, true);
    println!("exports the headers do not declare: {:?}", found.undeclared);
    assert!(found.undeclared.len() <= 4, "{:?}", found.undeclared);
    let wrong = found.wrong;
    assert!(
        wrong.is_empty(),
        "{} differences:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
