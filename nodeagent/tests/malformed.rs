//! Malformed and impossible requests are refused with a message that names the annotation, the
//! value and the reason, and leave nothing behind.

mod common;

use common::*;
use gpuslice_testsupport::{agent::Agent, bus::Bus, sim::SimNode};

/// (annotations, the key the message must name, its value, words of the reason, D-Bus error).
type Case = (
    Vec<(&'static str, &'static str)>,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const INVALID: &str = "io.gpuslice.Agent1.Error.InvalidRequest";
const REFUSED: &str = "io.gpuslice.Agent1.Error.Refused";

fn cases() -> Vec<Case> {
    let m = "gpuslice.io/memory";
    let c = "gpuslice.io/cores";
    let g = "gpuslice.io/gpus";
    let d = "gpuslice.io/devices";
    vec![
        (vec![(m, "")], m, "", "empty value", INVALID),
        (vec![(m, "-1Gi")], m, "-1Gi", "negative", INVALID),
        (vec![(m, "0")], m, "0", "greater than zero", INVALID),
        (vec![(m, "0Mi")], m, "0Mi", "greater than zero", INVALID),
        (vec![(m, "lots")], m, "lots", "not a number", INVALID),
        (vec![(m, "2GB")], m, "2GB", "unknown unit", INVALID),
        (vec![(m, "1e9")], m, "1e9", "unknown unit", INVALID),
        (vec![(m, "1.5.5Gi")], m, "1.5.5Gi", "not a number", INVALID),
        (vec![(m, "0.3")], m, "0.3", "whole number of bytes", INVALID),
        (vec![(m, "150%")], m, "150%", "at most 100%", INVALID),
        (vec![(m, "0%")], m, "0%", "greater than zero", INVALID),
        (
            vec![(m, "99999999999Ti")],
            m,
            "99999999999Ti",
            "too large",
            INVALID,
        ),
        (
            vec![(m, "1Gi\u{1b}[31m")],
            m,
            "1Gi\u{1b}[31m",
            "control characters",
            INVALID,
        ),
        (vec![(m, "1Gi"), (c, "0")], c, "0", "at least 1", INVALID),
        (vec![(m, "1Gi"), (c, "-5")], c, "-5", "negative", INVALID),
        (
            vec![(m, "1Gi"), (c, "101")],
            c,
            "101",
            "at most 100",
            INVALID,
        ),
        (
            vec![(m, "1Gi"), (c, "half")],
            c,
            "half",
            "percentage",
            INVALID,
        ),
        (
            vec![(c, "50")],
            c,
            "50",
            "needs a memory limit too",
            INVALID,
        ),
        (vec![(g, "0")], g, "0", "at least 1", INVALID),
        (vec![(g, "-1")], g, "-1", "negative", INVALID),
        (vec![(g, "1.5")], g, "1.5", "whole number", INVALID),
        (vec![(g, "17")], g, "17", "at most 16", INVALID),
        (
            vec![(d, "0,0"), (m, "1Gi")],
            d,
            "0,0",
            "listed twice",
            INVALID,
        ),
        (
            vec![(d, "0,,1"), (m, "1Gi")],
            d,
            "0,,1",
            "empty entry",
            INVALID,
        ),
        (
            vec![(d, "GPU-abc")],
            d,
            "GPU-abc",
            "neither a GPU index nor a GPU UUID",
            INVALID,
        ),
        (
            vec![(d, "0,1"), (g, "1")],
            d,
            "0,1",
            "names 2 GPUs",
            INVALID,
        ),
        (
            vec![(m, "1Gi"), ("gpuslice.io/gpu-policy", "fastest")],
            "gpuslice.io/gpu-policy",
            "fastest",
            "unknown policy",
            INVALID,
        ),
        (
            vec![(m, "1Gi"), ("gpuslice.io/node-policy", "random")],
            "gpuslice.io/node-policy",
            "random",
            "unknown policy",
            INVALID,
        ),
        (
            vec![("gpuslice.io/memroy", "1Gi")],
            "gpuslice.io/memroy",
            "1Gi",
            "unknown gpuslice annotation",
            INVALID,
        ),
        (
            vec![("gpuslice.io/colour", "blue")],
            "gpuslice.io/colour",
            "blue",
            "unknown gpuslice annotation",
            INVALID,
        ),
        (
            vec![("gpuslice.io/Web.memory", "1Gi")],
            "gpuslice.io/Web.memory",
            "1Gi",
            "not a container name",
            INVALID,
        ),
        (
            vec![("gpuslice.io/web.node-policy", "spread")],
            "gpuslice.io/web.node-policy",
            "spread",
            "per pod",
            INVALID,
        ),
        (vec![(m, "16Gi")], m, "16Gi", "has only 15Gi", REFUSED),
        (
            vec![(m, "100%"), (g, "3")],
            g,
            "3",
            "this node has 2 GPU(s)",
            REFUSED,
        ),
        (vec![(d, "7"), (m, "1Gi")], d, "7", "no GPU 7", REFUSED),
        (
            vec![(d, "GPU-00000000-0000-0000-0000-000000000000"), (m, "1Gi")],
            d,
            "GPU-00000000-0000-0000-0000-000000000000",
            "no GPU",
            REFUSED,
        ),
        (
            vec![(m, "1Gi"), ("gpuslice.io/gpu-policy", "frag-aware")],
            "gpuslice.io/gpu-policy",
            "frag-aware",
            "decided by gpuslice-scheduler",
            REFUSED,
        ),
    ]
}

#[tokio::test]
async fn every_malformed_or_impossible_request_is_refused_naming_annotation_value_and_reason() {
    let sim = SimNode::new(2, "T4", None);
    let bus = Bus::start();
    let agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    let cases = cases();
    assert!(cases.len() >= 30);
    for (i, (annotations, key, value, why, error)) in cases.iter().enumerate() {
        let e = p
            .claim(&format!("bad-{i}"), ann(annotations))
            .await
            .expect_err(&format!("case {i} {annotations:?} was admitted"));
        let (name, msg) = method_error(&e).unwrap_or_else(|| panic!("case {i}: {e}"));
        assert_eq!(&name, error, "case {i}: {msg}");
        assert!(
            msg.contains(&format!("annotation {key}={value:?}")),
            "case {i}: message does not name {key}={value:?}: {msg}"
        );
        assert!(
            msg.contains(why),
            "case {i}: message does not say {why:?}: {msg}"
        );
    }
    let s = status(&p).await;
    assert!(s.slices.is_empty(), "{:?}", s.slices);
    assert_eq!(std::fs::read_dir(&agent.run_dir).unwrap().count(), 0);
}

#[tokio::test]
async fn bad_container_ids_and_requests_without_annotations_are_refused() {
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let p = proxy(&bus.address).await;
    for id in ["../etc", "a/b", "", ".."] {
        let e = p
            .claim(id, ann(&[("gpuslice.io/memory", "1Gi")]))
            .await
            .unwrap_err();
        let (_, msg) = method_error(&e).unwrap();
        assert!(msg.contains(&format!("container id {id:?}")), "{msg}");
    }
    let e = p
        .claim("plain", ann(&[("org.example/x", "1")]))
        .await
        .unwrap_err();
    assert!(
        method_error(&e)
            .unwrap()
            .1
            .contains("no gpuslice.io annotations")
    );
}

#[test]
fn an_annotation_that_is_not_utf8_is_refused_by_the_cli_naming_it() {
    use std::os::unix::ffi::OsStrExt;
    let sim = SimNode::new(1, "T4", None);
    let bus = Bus::start();
    let _agent = Agent::start(&agent_exe(), &bus, &sim, &[]);
    let arg = std::ffi::OsStr::from_bytes(b"gpuslice.io/memory=2\xffGi");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["--bus-address", &bus.address, "claim", "c1", "-a"])
        .arg(arg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("annotation gpuslice.io/memory=") && err.contains("not valid UTF-8"),
        "{err}"
    );
    let s: gpuslice_agent_api::Status =
        serde_json::from_slice(&cli(&bus.address, &["status", "--json"]).stdout).unwrap();
    assert!(s.slices.is_empty());
}
