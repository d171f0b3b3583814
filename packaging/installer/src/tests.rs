use super::*;

/// An image's files: every program and library the installer copies, as small stand-ins.
fn image(root: &Path) {
    for program in PROGRAMS {
        let path = root.join("usr/bin").join(program);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\n# {program}\n")).unwrap();
    }
    let lib = root.join(layout::INTERCEPTION_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join(layout::INTERCEPTION_LIBRARY_FILE), "ELF library").unwrap();
    for front in layout::FRONTS {
        std::fs::write(lib.join(front.file), front.soname).unwrap();
    }
    let crio = root.join(CRIO_DROP_IN_SOURCE.trim_start_matches('/'));
    std::fs::create_dir_all(crio.parent().unwrap()).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crio/99-gpuslice.conf"),
        crio,
    )
    .unwrap();
}

fn options(host: &Path, source: &Path, engine: Engine) -> Options {
    Options {
        host_root: host.to_owned(),
        source_root: source.to_owned(),
        prefix: "/usr/local/gpuslice".into(),
        engine,
        containerd_config: "/etc/containerd/config.toml".into(),
        crio_drop_in: "/etc/crio/crio.conf.d/99-gpuslice.conf".into(),
        handler: "gpuslice".into(),
        restart: Restart::None,
    }
}

/// Every path under `root` with its content (directories as None).
fn tree(root: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, Option<Vec<u8>>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().to_owned();
            if path.is_dir() {
                out.push((rel, None));
                walk(&path, root, out);
            } else {
                out.push((rel, Some(std::fs::read(&path).unwrap())));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn the_programs_libraries_and_runtime_configuration_land_under_the_prefix_and_go_again() {
    let (host, source) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    image(source.path());
    std::fs::create_dir_all(host.path().join("etc")).unwrap();
    std::fs::write(host.path().join("etc/hostname"), "gpu-node-1\n").unwrap();
    let before = tree(host.path());
    let o = options(host.path(), source.path(), Engine::None);
    install(&o).unwrap();
    let prefix = host.path().join("usr/local/gpuslice");
    for program in PROGRAMS {
        let meta = std::fs::metadata(prefix.join("bin").join(program)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o755
        );
    }
    assert_eq!(
        std::fs::read_to_string(prefix.join("lib/libgpuslice_cuda.so")).unwrap(),
        "libcuda.so.1"
    );
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(host.path().join("etc/gpuslice/runtime.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config["interception_library"],
        "/usr/local/gpuslice/lib/libgpuslice.so"
    );
    assert_eq!(config["hook"], "/usr/local/gpuslice/bin/gpuslice-hook");
    let report = uninstall(&o).unwrap();
    assert!(
        report.iter().all(|(_, u)| *u == Undone::Removed),
        "{report:?}"
    );
    assert_eq!(tree(host.path()), before);
}

#[test]
fn an_operators_runtime_configuration_is_neither_replaced_nor_removed() {
    let (host, source) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    image(source.path());
    std::fs::create_dir_all(host.path().join("etc/gpuslice")).unwrap();
    let mine = "{\"runtime\": \"crun\"}\n";
    std::fs::write(host.path().join("etc/gpuslice/runtime.json"), mine).unwrap();
    let o = options(host.path(), source.path(), Engine::None);
    install(&o).unwrap();
    assert_eq!(
        std::fs::read_to_string(host.path().join("etc/gpuslice/runtime.json")).unwrap(),
        mine
    );
    uninstall(&o).unwrap();
    assert_eq!(
        std::fs::read_to_string(host.path().join("etc/gpuslice/runtime.json")).unwrap(),
        mine
    );
}

#[test]
fn cri_o_gets_the_packaged_drop_in_with_the_wrapper_under_the_prefix_and_the_handler_named() {
    let (host, source) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    image(source.path());
    let mut o = options(host.path(), source.path(), Engine::CriO);
    o.handler = "gpu-slices".into();
    install(&o).unwrap();
    let text =
        std::fs::read_to_string(host.path().join("etc/crio/crio.conf.d/99-gpuslice.conf")).unwrap();
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    let handler = &doc["crio"]["runtime"]["runtimes"]["gpu-slices"];
    assert_eq!(
        handler["runtime_path"].as_str(),
        Some("/usr/local/gpuslice/bin/gpuslice-runtime")
    );
    assert_eq!(handler["runtime_type"].as_str(), Some("oci"));
    assert!(
        doc["crio"]["runtime"]["runtimes"].get("gpuslice").is_none(),
        "{text}"
    );
    uninstall(&o).unwrap();
    assert!(!host.path().join("etc/crio").exists());
}

#[test]
fn installing_again_first_takes_off_the_earlier_installation() {
    let (host, source) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    image(source.path());
    let o = options(host.path(), source.path(), Engine::None);
    let first = install(&o).unwrap();
    let second = install(&o).unwrap();
    assert_eq!(
        first, second,
        "the second install saw the first one's files as the host's"
    );
    uninstall(&o).unwrap();
    assert!(tree(host.path()).is_empty(), "{:?}", tree(host.path()));
}

#[test]
fn a_missing_file_in_the_image_fails_the_install_naming_it() {
    let (host, source) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    image(source.path());
    std::fs::remove_file(source.path().join("usr/bin/gpuslice-hook")).unwrap();
    let e = install(&options(host.path(), source.path(), Engine::None)).unwrap_err();
    assert!(e.to_string().ends_with("usr/bin/gpuslice-hook"), "{e}");
    assert!(
        tree(host.path()).is_empty(),
        "a failed install left {:?}",
        tree(host.path())
    );
}
