//! What the benchmark binaries share: how many rounds to run and the median of a sample.

use std::time::Duration;

/// Rounds to run: `BENCH_ROUNDS`, else `default`.
#[must_use]
pub fn rounds(default: usize) -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The median of a non-empty sample.
#[must_use]
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}
