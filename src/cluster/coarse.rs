//! A cheaper clock for the admission path: `CLOCK_MONOTONIC_COARSE` (Linux).
//!
//! The [`ClusterBulkhead`](super::ClusterBulkhead) reads its agent's clock once per admission.
//! On a loaded VM the precise monotonic clock costs 40-130 ns a read, several times the core's
//! whole admit and release; the coarse clock returns the time of the last kernel tick from
//! memory the kernel shares with the process, at a fraction of that. The price is lag: a
//! reading may be up to one tick (`clock_getres`, 1-10 ms) behind, and more on a CPU isolated
//! with `nohz_full`, where the tick stops. A lagging clock makes the lease end later in true
//! time by at most that lag, so the agent refuses a clock whose resolution is above the
//! configuration's `margin` ([`ClusterConfigError::ClockTooCoarse`](super::ClusterConfigError)).

use super::agent::Clock;
use std::time::Duration;

/// Reads `CLOCK_MONOTONIC_COARSE`, or its resolution, in nanoseconds. Where the kernel
/// refuses the clock, a zero reading keeps the clock at its origin (nothing is admitted past
/// a window), and an unknown resolution counts as a whole second.
fn read(resolution: bool) -> u64 {
    let c = crate::os_clock::Coarse::Monotonic;
    let (d, fallback) = if resolution {
        (c.resolution(), Duration::from_secs(1))
    } else {
        (c.now(), Duration::ZERO)
    };
    u64::try_from(d.unwrap_or(fallback).as_nanos()).unwrap_or(u64::MAX)
}

/// A [`Clock`] on `CLOCK_MONOTONIC_COARSE`: cheap to read, up to one kernel tick behind
/// (its [`resolution_ms`](Clock::resolution_ms)). Pass it to
/// [`ClusterAgent::with_clock`](super::ClusterAgent::with_clock).
///
/// ```
/// use llm_bulkhead::cluster::{Clock, CoarseClock};
/// let c = CoarseClock::new();
/// assert!(c.now_ms() <= c.now_ms());
/// assert!((1..=1_000).contains(&c.resolution_ms()));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CoarseClock {
    origin_ns: u64,
    resolution_ms: u64,
}

impl CoarseClock {
    /// A clock whose origin is now.
    ///
    /// ```
    /// let _ = llm_bulkhead::cluster::CoarseClock::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        CoarseClock {
            origin_ns: read(false),
            resolution_ms: read(true).div_ceil(1_000_000).max(1),
        }
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    fn now_ms(&self) -> u64 {
        read(false).saturating_sub(self.origin_ns) / 1_000_000
    }

    fn resolution_ms(&self) -> u64 {
        self.resolution_ms
    }
}
