//! A container's root owns its directory (mounted at /run/gpuslice) and may put anything in
//! place of its usage region. Whatever it puts there, the real agent answers `status` and
//! `/metrics` at once, reads nothing it was pointed to, reports the tampering, and the other
//! containers' figures stay right. Its own files in that directory cannot be turned against
//! the host either.

mod common;

use std::ffi::CString;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use gpuslice_core::usage;
use gpuslice_testsupport::{agent::Agent, bus::Bus, http, sim::SimNode};

/// Replaces `path` by a FIFO.
fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}

/// A trick: its name, the kind of tampering the agent reports, and how it is played on the
/// region's path.
type Trick = (&'static str, &'static str, Box<dyn Fn(&Path)>);

/// The tricks a container's root can play on its usage region.
fn tricks(host_secret: &Path) -> Vec<Trick> {
    let secret = host_secret.to_path_buf();
    vec![
        ("fifo", "not_regular", Box::new(mkfifo)),
        (
            "symlink to a host file",
            "symlink",
            Box::new(move |p: &Path| symlink(&secret, p).unwrap()),
        ),
        (
            "directory",
            "not_regular",
            Box::new(|p: &Path| std::fs::create_dir(p).unwrap()),
        ),
        (
            "huge file",
            "size",
            Box::new(|p: &Path| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(64 << 30).unwrap();
            }),
        ),
        (
            "truncated file",
            "size",
            Box::new(|p: &Path| std::fs::write(p, b"GPSLUSG1").unwrap()),
        ),
        (
            "garbage of the right size",
            "header",
            Box::new(|p: &Path| {
                std::fs::write(p, vec![0xA5u8; usage::region_size(usage::DEFAULT_SLOTS)]).unwrap()
            }),
        ),
    ]
}

fn scrape(agent: &Agent) -> String {
    let (status, _, body) = http::get(&agent.metrics_address, "/metrics").expect("scrape");
    assert!(status.contains("200"), "{status}");
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn whatever_replaces_a_usage_region_the_agent_answers_at_once_and_reports_it() {
    let sim = SimNode::new(1, "A10", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &["--gc-interval", "200ms"]);
    let p = proxy(&bus.address).await;
    let mut announced = p.receive_usage_tampered().await.expect("subscribe");
    p.claim("victim", ann(&[("gpuslice.io/memory", "2Gi")]))
        .await
        .expect("claim victim");
    p.claim("bystander", ann(&[("gpuslice.io/memory", "1Gi")]))
        .await
        .expect("claim bystander");
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("shadow");
    std::fs::write(&secret, "root:$6$secret\n").unwrap();
    let region = agent.run_dir.join("victim").join(usage::FILE_NAME);
    for (name, kind, trick) in tricks(&secret) {
        if region.is_dir() {
            std::fs::remove_dir(&region).unwrap();
        } else {
            let _ = std::fs::remove_file(&region);
        }
        trick(&region);
        let started = Instant::now();
        let s = tokio::time::timeout(Duration::from_secs(2), status(&p))
            .await
            .unwrap_or_else(|_| panic!("{name}: status did not answer"));
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(100),
            "{name}: status took {took:?}"
        );
        let victim = s
            .slices
            .iter()
            .find(|x| x.claim.container_id == "victim")
            .unwrap();
        assert_eq!(victim.used_bytes, vec![0], "{name}: nothing read from it");
        assert_eq!(s.slices.len(), 2, "{name}: the other slice is still listed");
        let body = scrape(&agent);
        let line =
            format!("gpuslice_slice_usage_tampered{{container=\"victim\",kind=\"{kind}\"}} 1");
        assert!(body.contains(&line), "{name}: no {line} in\n{body}");
        assert!(
            !body.contains("container=\"bystander\",kind="),
            "{name}: the bystander is not blamed"
        );
    }
    // Each tampering is announced on the bus once, for the container that did it.
    let mut events = Vec::new();
    while events.len() < 6 {
        let Ok(Some(signal)) = tokio::time::timeout(Duration::from_secs(3), announced.next()).await
        else {
            break;
        };
        let args = signal.args().expect("signal arguments");
        events.push((args.container_id().to_string(), args.reason().to_string()));
    }
    assert_eq!(events.len(), 6, "one UsageTampered per trick: {events:?}");
    assert!(events.iter().all(|(id, _)| id == "victim"), "{events:?}");
    assert!(
        events.iter().any(|(_, why)| why.contains("FIFO")),
        "{events:?}"
    );
    assert!(
        agent.log().contains("usage region tampered with"),
        "the tampering is logged:\n{}",
        agent.log()
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "root:$6$secret\n",
        "the host file was neither read into the status nor written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_link_planted_where_the_agent_writes_is_removed_not_followed() {
    let sim = SimNode::new(1, "A10", None);
    let bus = Bus::start();
    let mut agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    p.claim("c1", ann(&[("gpuslice.io/memory", "2Gi")]))
        .await
        .expect("claim");
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("passwd");
    std::fs::write(&target, "root:x:0:0\n").unwrap();
    let dir = agent.run_dir.join("c1");
    // The container deletes its limits file and plants links where the agent writes next.
    std::fs::remove_file(dir.join("limits")).unwrap();
    symlink(&target, dir.join("limits.tmp")).unwrap();
    // A restarted agent recreates the missing limits file of a stored claim.
    agent.restart();
    let p = proxy(&bus.address).await;
    let s = status(&p).await;
    assert_eq!(s.slices.len(), 1);
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "root:x:0:0\n",
        "the host file behind the planted link is untouched"
    );
    let limits = std::fs::symlink_metadata(dir.join("limits")).unwrap();
    assert!(limits.is_file(), "the limits file is a regular file again");
    assert!(
        std::fs::read_to_string(dir.join("limits"))
            .unwrap()
            .contains("gpu.0.memory_bytes=2147483648")
    );
}

/// A tmpfs mounted on a fresh directory with `options`, unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(options: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount (util-linux)")
            .success();
        assert!(ok, "mount -t tmpfs -o {options} (needs root)");
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn the_agent_warns_when_its_run_directory_would_let_a_container_plant_setuid_programs() {
    use gpuslice_nodeagent::rundir::RunDir;
    let hardened = Tmpfs::mount("mode=0755,nosuid,nodev,noexec");
    let plain = Tmpfs::mount("mode=0755");
    let missing = |t: &Tmpfs| {
        RunDir::new(t.0.path().join("run"))
            .unwrap()
            .missing_mount_options()
    };
    assert!(missing(&hardened).is_empty(), "{:?}", missing(&hardened));
    assert_eq!(missing(&plain), vec!["nosuid", "nodev", "noexec"]);

    let sim = SimNode::new(1, "A10", None);
    let bus = Bus::start();
    let warned = |base: &Path| {
        let agent = Agent::start_in(base, &agent_exe(), &bus, &sim, &[], &[]);
        agent.log().contains("not mounted nosuid,nodev,noexec")
    };
    assert!(warned(plain.0.path()), "no warning on a plain tmpfs");
    assert!(!warned(hardened.0.path()), "a warning on a hardened tmpfs");
}
