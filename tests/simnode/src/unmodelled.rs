//! Entry points of the real driver libraries that the simulation does not model: each exists
//! in the fake library (a program that links or looks it up finds it, as with the real driver)
//! and answers "not supported". Every call is counted, so that the next gap a real client runs
//! into is visible: the first call of each name in a process appends
//! `<pid> <program> first <name>` to the log, and at exit the process appends
//! `<pid> <program> counts <name>=<calls> ...`.
//!
//! The log is `$GPUSLICE_SIM_UNMODELLED_LOG`, else `unmodelled.log` in the node's state
//! directory once the library knows the node. Each fake library links its own copy of this
//! module, so counts are per library.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

pub const LOG_ENV: &str = "GPUSLICE_SIM_UNMODELLED_LOG";
pub const LOG_FILE: &str = "unmodelled.log";

static CALLS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
/// The node's state directory, once the library has loaded the node description.
static STATE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Tells the recorder where the node keeps its state (the log's default place).
pub fn set_state_dir(dir: &std::path::Path) {
    let _ = STATE_DIR.set(dir.to_path_buf());
}

/// Counts one call of `name`.
#[allow(unsafe_code)]
pub fn record(name: &'static str) {
    let first = {
        let mut calls = CALLS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let was_empty = calls.is_empty();
        let n = calls.entry(name).or_insert(0);
        *n += 1;
        if was_empty {
            // SAFETY: `summary` is an extern "C" fn taking nothing; atexit runs it once.
            unsafe { libc::atexit(summary) };
        }
        *n == 1
    };
    if first {
        append(&format!("first {name}"));
    }
}

/// Each unmodelled name this process called, with how often.
#[must_use]
pub fn counts() -> BTreeMap<&'static str, u64> {
    CALLS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

extern "C" fn summary() {
    let pairs: Vec<String> = counts().iter().map(|(n, c)| format!("{n}={c}")).collect();
    append(&format!("counts {}", pairs.join(" ")));
}

fn log_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(LOG_ENV) {
        return Some(p.into());
    }
    STATE_DIR.get().map(|d| d.join(LOG_FILE))
}

fn append(what: &str) {
    let Some(path) = log_path() else { return };
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    // One write per line with O_APPEND: lines of concurrent processes do not interleave.
    let line = format!("{} {program} {what}\n", std::process::id());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Reads a log: for each program, the unmodelled names its processes called and how often
/// (from the exit summaries; a name called by a process that did not exit normally counts 1).
#[must_use]
pub fn summarise(log: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut firsts: BTreeMap<(String, String), BTreeMap<String, u64>> = BTreeMap::new();
    let mut summed: BTreeMap<(String, String), BTreeMap<String, u64>> = BTreeMap::new();
    for line in log.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(pid), Some(program), Some(kind), Some(rest)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let key = (pid.to_string(), program.to_string());
        match kind {
            "first" => {
                firsts.entry(key).or_default().insert(rest.to_string(), 1);
            }
            "counts" => {
                let counts = summed.entry(key).or_default();
                for pair in rest.split_whitespace() {
                    if let Some((n, c)) = pair.split_once('=') {
                        counts.insert(n.to_string(), c.parse().unwrap_or(1));
                    }
                }
            }
            _ => {}
        }
    }
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (key, names) in firsts {
        let exact = summed.remove(&key);
        let per_program = out.entry(key.1.clone()).or_default();
        for (name, one) in names {
            let n = exact
                .as_ref()
                .and_then(|e| e.get(&name))
                .copied()
                .unwrap_or(one);
            *per_program.entry(name).or_insert(0) += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_sums_exact_counts_per_program_and_counts_one_for_a_process_that_died() {
        let log = "10 python3 first cuStreamQuery\n10 python3 first cuEventCreate\n\
                   11 python3 first cuStreamQuery\n\
                   10 python3 counts cuEventCreate=2 cuStreamQuery=40\n\
                   12 app first cuLinkCreate_v2\n";
        let s = summarise(log);
        assert_eq!(s["python3"]["cuStreamQuery"], 41);
        assert_eq!(s["python3"]["cuEventCreate"], 2);
        assert_eq!(s["app"]["cuLinkCreate_v2"], 1);
    }
}
