use super::*;

fn handler() -> Handler {
    Handler {
        name: "gpuslice".into(),
        binary: "/usr/bin/gpuslice-runtime".into(),
    }
}

const V2: &str = r#"# node config, kept as written
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9" # pinned

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"#;

#[test]
fn a_version_2_config_gets_the_handler_and_keeps_everything_else() {
    let mut doc: DocumentMut = V2.parse().unwrap();
    add_handler(&mut doc, &handler()).unwrap();
    let out = doc.to_string();
    assert!(
        out.starts_with("# node config, kept as written\nversion = 2\n"),
        "{out}"
    );
    assert!(
        out.contains("sandbox_image = \"registry.k8s.io/pause:3.9\" # pinned"),
        "{out}"
    );
    assert!(out.contains("default_runtime_name = \"runc\""));
    assert!(
        out.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuslice]"),
        "{out}"
    );
    assert!(
        out.contains(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuslice.options]"
        ),
        "{out}"
    );
    let reread: DocumentMut = out.parse().unwrap();
    let rt = &reread["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpuslice"];
    assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(
        rt["pod_annotations"]
            .as_array()
            .unwrap()
            .get(0)
            .unwrap()
            .as_str(),
        Some("gpuslice.io/*")
    );
    assert_eq!(
        rt["options"]["BinaryName"].as_str(),
        Some("/usr/bin/gpuslice-runtime")
    );
    assert_eq!(reread["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
}

#[test]
fn adding_the_handler_twice_changes_nothing_the_second_time() {
    let mut doc: DocumentMut = V2.parse().unwrap();
    add_handler(&mut doc, &handler()).unwrap();
    let once = doc.to_string();
    add_handler(&mut doc, &handler()).unwrap();
    assert_eq!(doc.to_string(), once);
}

#[test]
fn versions_1_and_3_use_their_own_plugin_names() {
    let mut v1: DocumentMut = "[plugins.cri]\nstream_server_port = \"0\"\n"
        .parse()
        .unwrap();
    add_handler(&mut v1, &handler()).unwrap();
    assert_eq!(
        v1["plugins"]["cri"]["containerd"]["runtimes"]["gpuslice"]["options"]["BinaryName"]
            .as_str(),
        Some("/usr/bin/gpuslice-runtime")
    );
    let mut v3: DocumentMut = "version = 3\n".parse().unwrap();
    add_handler(&mut v3, &handler()).unwrap();
    let out = v3.to_string();
    assert!(
        out.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gpuslice]"),
        "{out}"
    );
}

#[test]
fn a_drop_in_has_the_version_and_the_handler_and_the_main_config_imports_it() {
    let mut main: DocumentMut = V2.parse().unwrap();
    let d = drop_in(&main, &handler()).unwrap();
    let doc: DocumentMut = d.parse().unwrap();
    assert_eq!(doc["version"].as_integer(), Some(2));
    let cri = &doc["plugins"]["io.containerd.grpc.v1.cri"];
    assert!(cri["containerd"]["runtimes"]["gpuslice"].is_table());
    assert_eq!(
        cri["sandbox_image"].as_str(),
        Some("registry.k8s.io/pause:3.9"),
        "the drop-in lost the main table:\n{d}"
    );
    assert_eq!(
        cri["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    add_import(&mut main, "/etc/containerd/conf.d/gpuslice.toml").unwrap();
    add_import(&mut main, "/etc/containerd/conf.d/gpuslice.toml").unwrap();
    assert_eq!(main["imports"].as_array().unwrap().len(), 1);
    assert!(main.to_string().contains("sandbox_image"));
}

#[test]
fn a_config_without_runtimes_keeps_the_default_runc_runtime() {
    let mut doc: DocumentMut = "version = 2\n".parse().unwrap();
    add_handler(&mut doc, &handler()).unwrap();
    let runtimes = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    assert_eq!(
        runtimes["runc"]["runtime_type"].as_str(),
        Some("io.containerd.runc.v2")
    );
    let mut custom: DocumentMut = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"crun\"\n".parse().unwrap();
    add_handler(&mut custom, &handler()).unwrap();
    assert!(
        custom["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
            .get("runc")
            .is_none()
    );
}

#[test]
fn unsupported_or_broken_configs_are_refused_with_a_reason() {
    let mut doc: DocumentMut = "version = 4\n".parse().unwrap();
    assert!(matches!(
        add_handler(&mut doc, &handler()),
        Err(ConfigError::Version(4))
    ));
    let mut doc: DocumentMut = "version = 2\nplugins = 3\n".parse().unwrap();
    let e = add_handler(&mut doc, &handler()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "containerd configuration: `plugins` is not a table"
    );
    let mut doc: DocumentMut = "[plugins.cri]\n".parse().unwrap();
    assert!(matches!(
        add_import(&mut doc, "/x.toml"),
        Err(ConfigError::Version(1))
    ));
    assert!("version = ".parse::<DocumentMut>().is_err());
}

/// Each configuration in `golden/` (`NAME.toml`) with the handler added must read exactly as
/// `NAME.expected.toml`; `GPUSLICE_BLESS=1` writes the expected files from the output (to be
/// read before they are committed).
#[test]
fn golden_configurations_get_exactly_the_expected_handler() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
    let bless = std::env::var_os("GPUSLICE_BLESS").is_some();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".toml") else {
            continue;
        };
        if stem.ends_with(".expected") {
            continue;
        }
        let mut doc: DocumentMut = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        add_handler(&mut doc, &handler()).unwrap();
        let out = doc.to_string();
        let expected_path = dir.join(format!("{stem}.expected.toml"));
        if bless {
            std::fs::write(&expected_path, &out).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        assert_eq!(out, expected, "{name}");
        // Adding it again changes nothing.
        let mut again: DocumentMut = out.parse().unwrap();
        add_handler(&mut again, &handler()).unwrap();
        assert_eq!(again.to_string(), out, "{name} twice");
        checked += 1;
    }
    assert_eq!(checked, 4, "the golden configurations in {}", dir.display());
}

#[test]
fn the_handler_takes_the_default_runc_runtimes_cgroup_driver_and_settings_but_not_its_binary() {
    let mut doc: DocumentMut = include_str!("../golden/v2-nvidia-default.toml")
        .parse()
        .unwrap();
    add_handler(&mut doc, &handler()).unwrap();
    let rt = &doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpuslice"];
    assert_eq!(rt["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        rt["options"]["BinaryName"].as_str(),
        Some("/usr/bin/gpuslice-runtime")
    );
    assert_eq!(rt["privileged_without_host_devices"].as_bool(), Some(false));
    // A default runtime that is not runc's lends nothing.
    let mut kata: DocumentMut = include_str!("../golden/v2-kata-default.toml")
        .parse()
        .unwrap();
    add_handler(&mut kata, &handler()).unwrap();
    let rt = &kata["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["gpuslice"];
    assert!(rt["options"].get("ConfigPath").is_none());
    assert_eq!(rt["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
}

#[test]
fn removing_the_handler_gives_back_the_configuration_it_was_added_to() {
    let mut doc: DocumentMut = V2.parse().unwrap();
    add_handler(&mut doc, &handler()).unwrap();
    assert!(remove_handler(&mut doc, "gpuslice").unwrap());
    assert_eq!(doc.to_string(), V2);
    assert!(
        !remove_handler(&mut doc, "gpuslice").unwrap(),
        "removed twice"
    );
}

#[test]
fn removing_a_handler_from_a_config_without_runtimes_changes_nothing() {
    for text in ["version = 3\n", "version = 2\n[plugins]\n", "# empty\n"] {
        let mut doc: DocumentMut = text.parse().unwrap();
        assert!(!remove_handler(&mut doc, "gpuslice").unwrap());
        assert_eq!(doc.to_string(), text);
    }
    let mut broken: DocumentMut = "version = 2\nplugins = 5\n".parse().unwrap();
    assert!(matches!(
        remove_handler(&mut broken, "gpuslice"),
        Err(ConfigError::NotTable(p)) if p == "plugins"
    ));
}
