//! What the simulated cluster tests share: replica clocks that drift within the stated rate
//! bound, and a deterministic, bounded proptest runner.
#![allow(dead_code)]

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Replicas in a simulation.
pub const REPLICAS: usize = 3;

/// The clock-rate bound the configurations state (1 %).
pub const RATE_PPM: i64 = 10_000;

/// A replica's clock: its local time at store time `t`, and true durations of local ones.
#[derive(Clone, Copy, Debug)]
pub struct DriftClock {
    pub offset: u64,
    pub drift_ppm: i64,
}

impl DriftClock {
    pub fn local(&self, t: u64) -> u64 {
        self.offset + (i128::from(t) * i128::from(1_000_000 + self.drift_ppm) / 1_000_000) as u64
    }

    /// True duration of `local_ms` on this clock (rounded up: the pessimistic end).
    pub fn true_span(&self, local_ms: u64) -> u64 {
        (u128::from(local_ms) * 1_000_000).div_ceil((1_000_000 + self.drift_ppm) as u128) as u64
    }
}

/// Each replica's drift, within the rate bound.
pub fn drifts() -> impl Strategy<Value = [i64; REPLICAS]> {
    [
        -RATE_PPM..=RATE_PPM,
        -RATE_PPM..=RATE_PPM,
        -RATE_PPM..=RATE_PPM,
    ]
}

/// A deterministic runner of `cases` cases (no persistence), shrinking at most
/// `max_shrink_iters` steps.
pub fn runner(cases: u32, max_shrink_iters: u32) -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases,
            max_shrink_iters,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    )
}
