//! The Kubernetes manifests of `packaging/kubernetes` as a user applies them: rendered by
//! kustomize (`kubectl kustomize`), read as the API server reads them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// `packaging/kubernetes`.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes")
}

/// The documents of a YAML stream.
pub fn parse(text: &str, what: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The documents of a file under `packaging/kubernetes`.
pub fn file(name: &str) -> Vec<Value> {
    let path = dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse(&text, name)
}

/// The YAML kustomize renders for the kustomization `name` (`extender`, `dra`, ...).
pub fn render_text(name: &str) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir().join(name))
        .output()
        .expect("kubectl (apt-get install kubernetes-client)");
    assert!(
        out.status.success(),
        "kubectl kustomize {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The documents kustomize renders for the kustomization `name`.
pub fn render(name: &str) -> Vec<Value> {
    parse(&render_text(name), name)
}

/// The one document of `kind` named `name`, typed.
pub fn named<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str, name: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
}

/// The first document of `kind`, typed.
pub fn kind<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}
