//! Any bytes in a container's usage region are read by the agent without a panic, and only a
//! region of the size and layout it made yields totals.
#![no_main]

use std::sync::LazyLock;

use gpuslice_core::usage::{self, UsageSnapshot};
use libfuzzer_sys::fuzz_target;

static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().unwrap());

fuzz_target!(|bytes: &[u8]| {
    if let Ok(s) = UsageSnapshot::parse(bytes) {
        let _ = s.totals();
    }
    std::fs::write(DIR.path().join(usage::FILE_NAME), bytes).unwrap();
    for gpus in [1, 2] {
        if let Ok(totals) = gpuslice_nodeagent::usage::read_totals(DIR.path(), gpus) {
            assert_eq!(totals.len(), gpus);
            assert_eq!(bytes.len(), usage::region_size(usage::DEFAULT_SLOTS));
        }
    }
});
