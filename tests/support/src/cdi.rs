//! Checks a CDI spec against the CDI project's own JSON schema (tests/reference/cdi, v1.1.0),
//! with no network: `defs.json` is registered as a resource beside `schema.json`.

use std::path::Path;

/// Fails unless `spec` is valid against the CDI JSON schema, naming each violation.
pub fn assert_valid(spec: &serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference/cdi");
    let read = |f: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join(f)).expect("CDI schema file"))
            .expect("CDI schema is JSON")
    };
    let registry = jsonschema::Registry::new()
        .add("file:///cdi/defs.json", read("defs.json"))
        .expect("defs.json")
        .prepare()
        .expect("registry");
    let validator = jsonschema::options()
        .with_base_uri("file:///cdi/schema.json")
        .with_registry(&registry)
        .build(&read("schema.json"))
        .expect("schema.json");
    let errors: Vec<String> = validator
        .iter_errors(spec)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:?} in {spec:#}");
}
