//! Every function the interception library declares (its table in `src/api.rs`) against
//! NVIDIA's own declaration in `cuda.h` / `nvml.h` (CUDA 12.9; CUDA 13.0 for what only CUDA 13
//! drivers export), as
//! `tests/reference/prototypes.rs` compares them.

#[path = "../../tests/reference/prototypes.rs"]
mod prototypes;

use std::path::Path;

use prototypes::Declaration;

/// Every function of the table in `src/api.rs`.
fn declarations() -> Vec<Declaration> {
    let api =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api.rs")).unwrap();
    let mut out = Vec::new();
    for line in api.lines().map(str::trim) {
        let Some(rest) = line
            .strip_prefix("Cuda fn ")
            .or_else(|| line.strip_prefix("Nvml fn "))
        else {
            continue;
        };
        let (name, rest) = rest.split_once('(').unwrap();
        let (params, rest) = rest.rsplit_once(") -> ").unwrap();
        let result = rest.split([' ', ';']).next().unwrap();
        let params = if params.trim().is_empty() {
            Vec::new()
        } else {
            params
                .split(", ")
                .map(|p| p.split_once(':').unwrap().1.trim().to_string())
                .collect()
        };
        out.push(Declaration {
            name: name.to_string(),
            params,
            result: result.to_string(),
        });
    }
    assert!(
        out.len() > 60,
        "the table in src/api.rs was not found: {} entries",
        out.len()
    );
    out
}

#[test]
fn every_function_the_library_declares_matches_nvidias_prototype() {
    let (found, newer) = prototypes::compare_with_13(&declarations(), false);
    found.assert_none_wrong();
    assert!(
        newer.undeclared.is_empty(),
        "the library declares functions the headers do not: {:?}",
        newer.undeclared
    );
    newer.assert_none_wrong();
}
