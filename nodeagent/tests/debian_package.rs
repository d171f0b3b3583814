//! The node's Debian package, built by `scripts/package-deb` (cargo-deb) from the debug build,
//! installed with dpkg into a fresh Debian root made by debootstrap (`scripts/debian-root`),
//! upgraded over itself with an edited configuration, and purged; lintian checks it first.
//!
//! Needs root (chroot) and the workspace's binaries built (`cargo build --workspace`, as
//! `scripts/test` does first); the first run downloads the Debian root (about 80 MB).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuslice_testsupport::run_ok as run;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the package with `revision` into `dir` and returns its path.
fn package(dir: &Path, revision: u32) -> PathBuf {
    let out = run(Command::new(repo().join("scripts/package-deb"))
        .args(["--profile", "dev", "--no-build", "--output"])
        .arg(dir)
        .args(["--", "--deb-revision", &revision.to_string()]));
    let path = PathBuf::from(stdout(&out).trim());
    assert!(path.is_file(), "package-deb printed {path:?}");
    path
}

/// A fresh Debian root unpacked from the cached debootstrap tarball.
fn debian_root(dir: &Path) -> PathBuf {
    let tarball = stdout(&run(&mut Command::new(repo().join("scripts/debian-root"))));
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    run(Command::new("tar")
        .args(["--numeric-owner", "-xf", tarball.trim(), "-C"])
        .arg(&root));
    root
}

fn chroot(root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.arg(root)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive");
    cmd
}

/// Every path under `root` (not crossing into other file systems), relative to it.
fn tree(root: &Path) -> BTreeSet<String> {
    let out = run(Command::new("find").arg(root).arg("-xdev"));
    stdout(&out)
        .lines()
        .filter_map(|l| l.strip_prefix(root.to_str().unwrap()))
        .map(str::to_owned)
        .collect()
}

/// Paths dpkg itself, logs and the run directory may change on an install and a purge.
fn bookkeeping(path: &str) -> bool {
    (path.starts_with("/var/lib/dpkg/") && !path.starts_with("/var/lib/dpkg/info/gpuslice."))
        || path.starts_with("/var/log/")
        || path.starts_with("/run/")
        || path.starts_with("/tmp/")
}

const PROGRAMS: &[&str] = &[
    "gpuslice-agent",
    "gpuslice",
    "gpuslice-containerd",
    "gpuslice-dra-plugin",
];

#[test]
fn the_debian_package_installs_into_a_fresh_debian_upgrades_keeping_an_edited_configuration_and_purges_to_nothing()
 {
    let dir = tempfile::tempdir().unwrap();
    let first = package(&dir.path().join("1"), 1);
    let second = package(&dir.path().join("2"), 2);
    let root = debian_root(dir.path());
    let before = tree(&root);
    for deb in [&first, &second] {
        std::fs::copy(deb, root.join("tmp").join(deb.file_name().unwrap())).unwrap();
    }
    let in_root = |deb: &Path| format!("/tmp/{}", deb.file_name().unwrap().to_str().unwrap());

    // Debian's own package checker finds nothing wrong (errors or warnings; the one about
    // an upload to Debian's archive closing no bug does not apply to a package of our own).
    let lint = Command::new("lintian")
        .args([
            "--fail-on",
            "error,warning",
            "--suppress-tags",
            "initial-upload-closes-no-bugs",
        ])
        .arg(&first)
        .output()
        .expect("lintian (apt-get install lintian)");
    let said =
        String::from_utf8_lossy(&lint.stdout).to_string() + &String::from_utf8_lossy(&lint.stderr);
    let complaints: Vec<_> = said
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
        .collect();
    assert!(
        lint.status.success() && complaints.is_empty(),
        "lintian:\n{said}"
    );

    // Install.
    run(&mut chroot(&root, &["dpkg", "-i", &in_root(&first)]));
    let status = stdout(&run(&mut chroot(&root, &["dpkg", "-s", "gpuslice"])));
    assert!(status.contains("Status: install ok installed"), "{status}");
    for file in [
        "usr/lib/gpuslice/libgpuslice.so",
        "usr/lib/gpuslice/libgpuslice_cuda.so",
        "usr/lib/gpuslice/libgpuslice_nvml.so",
        "usr/lib/systemd/system/gpuslice-agent.service",
        "usr/lib/systemd/system/run-gpuslice.mount",
        "usr/share/dbus-1/system.d/io.gpuslice.Agent1.conf",
        "usr/share/dbus-1/system-services/io.gpuslice.Agent1.service",
        "usr/share/containers/oci/hooks.d/gpuslice-precreate.json",
        "usr/share/gpuslice/cri-o/99-gpuslice.conf",
        "etc/gpuslice/agent.conf",
        "etc/gpuslice/runtime.json",
        "usr/bin/gpuslice-runtime",
        "usr/bin/gpuslice-hook",
        "usr/share/lintian/overrides/gpuslice",
    ] {
        assert!(root.join(file).is_file(), "{file} is not installed");
    }
    // The two programs that run at every container start are shipped statically linked.
    for program in ["gpuslice-runtime", "gpuslice-hook"] {
        let ldd = chroot(&root, &["ldd", &format!("/usr/bin/{program}")])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&ldd.stdout).to_string()
            + &String::from_utf8_lossy(&ldd.stderr);
        assert!(said.contains("statically linked"), "ldd {program}: {said}");
    }
    let conffiles =
        std::fs::read_to_string(root.join("var/lib/dpkg/info/gpuslice.conffiles")).unwrap();
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/gpuslice/agent.conf", "/etc/gpuslice/runtime.json"]
    );
    // The binaries run there: their libraries are the Debian root's, as the package declares.
    for program in PROGRAMS {
        let version = stdout(&run(&mut chroot(
            &root,
            &[&format!("/usr/bin/{program}"), "--version"],
        )));
        assert_eq!(
            version.trim(),
            format!("{program} {}", env!("CARGO_PKG_VERSION"))
        );
    }
    let hook = chroot(&root, &["/usr/bin/gpuslice-hook"]).output().unwrap();
    assert!(String::from_utf8_lossy(&hook.stderr).contains("usage: gpuslice-hook precreate"));
    // Each program's manual page, and one per subcommand, made from its clap definition.
    for page in [
        "man8/gpuslice-agent.8.gz",
        "man1/gpuslice.1.gz",
        "man1/gpuslice-claim.1.gz",
        "man8/gpuslice-containerd-configure.8.gz",
        "man8/gpuslice-dra-plugin.8.gz",
        "man8/gpuslice-runtime.8.gz",
        "man8/gpuslice-hook.8.gz",
    ] {
        let path = root.join("usr/share/man").join(page);
        let text = stdout(&run(Command::new("zcat").arg(&path)));
        let name = page.split('/').nth(1).unwrap().trim_end_matches(".gz");
        let (title, section) = name.rsplit_once('.').unwrap();
        assert!(
            text.contains(&format!(".TH {title} {section} ")),
            "{page}:\n{text}"
        );
    }
    let agent_page = stdout(&run(
        Command::new("zcat").arg(root.join("usr/share/man/man8/gpuslice-agent.8.gz"))
    ));
    assert!(
        agent_page.contains("\\-\\-over\\-limit\\-action"),
        "{agent_page}"
    );
    // The service is enabled for the next boot, as dh_installsystemd does, and systemd finds
    // nothing wrong with the units as installed.
    assert!(
        root.join("etc/systemd/system/multi-user.target.wants/gpuslice-agent.service")
            .is_symlink()
    );
    run(&mut chroot(
        &root,
        &[
            "systemd-analyze",
            "verify",
            "/usr/lib/systemd/system/gpuslice-agent.service",
            "/usr/lib/systemd/system/run-gpuslice.mount",
        ],
    ));
    // The check above can fail: a unit whose program is missing does.
    std::fs::write(
        root.join("tmp/broken.service"),
        "[Service]\nExecStart=/usr/bin/gpuslice-absent\n",
    )
    .unwrap();
    let broken = chroot(&root, &["systemd-analyze", "verify", "/tmp/broken.service"])
        .output()
        .unwrap();
    assert!(
        !broken.status.success(),
        "systemd-analyze verify accepted a unit without its program"
    );

    // Upgrade over an edited configuration: dpkg keeps the operator's file without asking.
    let conf = root.join("etc/gpuslice/agent.conf");
    let edited =
        std::fs::read_to_string(&conf).unwrap() + "GPUSLICE_AGENT_OPTS=\"--max-sharers 4\"\n";
    std::fs::write(&conf, &edited).unwrap();
    run(&mut chroot(&root, &["dpkg", "-i", &in_root(&second)]));
    let status = stdout(&run(&mut chroot(&root, &["dpkg", "-s", "gpuslice"])));
    assert!(
        status.contains(&format!("Version: {}-2", env!("CARGO_PKG_VERSION"))),
        "{status}"
    );
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), edited);

    // Purge: everything the package and its scripts put there goes, the configuration and
    // the service's enablement included; nothing else changes.
    run(&mut chroot(&root, &["dpkg", "--purge", "gpuslice"]));
    let after = tree(&root);
    let added: Vec<_> = after
        .difference(&before)
        .filter(|p| !bookkeeping(p))
        .collect();
    let removed: Vec<_> = before
        .difference(&after)
        .filter(|p| !bookkeeping(p))
        .collect();
    assert!(added.is_empty(), "left behind after purge: {added:#?}");
    assert!(removed.is_empty(), "removed by the package: {removed:#?}");
    let status = chroot(&root, &["dpkg", "-s", "gpuslice"]).output().unwrap();
    assert!(
        !status.status.success(),
        "dpkg still knows gpuslice after purge"
    );
}
