//! The CRI-O drop-in (packaging/crio/99-gpuslice.conf), read as TOML the way CRI-O reads its
//! configuration: a runtime handler that runs the wrapper as an OCI runtime. CRI-O is not
//! packaged for Debian 12, so no CRI-O reads it here.

#[test]
fn the_crio_drop_in_names_the_wrapper_as_an_oci_runtime_handler() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/crio/99-gpuslice.conf");
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    let handler = doc["crio"]["runtime"]["runtimes"]["gpuslice"]
        .as_table()
        .expect("[crio.runtime.runtimes.gpuslice]");
    let keys: Vec<&str> = handler.iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["runtime_path", "runtime_type", "runtime_root"],
        "only keys crio.conf(5) documents"
    );
    // The wrapper where the packages install it, as `gpuslice-containerd configure` names it.
    assert_eq!(
        handler["runtime_path"].as_str(),
        Some("/usr/bin/gpuslice-runtime")
    );
    assert_eq!(handler["runtime_type"].as_str(), Some("oci"));
    // One of the state roots the agent looks in by default (gpuslice-agent --runtime-root).
    assert_eq!(handler["runtime_root"].as_str(), Some("/run/runc"));
    // The handler name is the RuntimeClass's.
    let runtime_class = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/kubernetes/base/runtimeclass.yaml"),
    )
    .unwrap();
    assert!(
        runtime_class
            .lines()
            .any(|l| l.trim() == "handler: gpuslice"),
        "{runtime_class}"
    );
}
