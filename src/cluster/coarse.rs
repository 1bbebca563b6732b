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

/// Reads `CLOCK_MONOTONIC_COARSE`, or its resolution, in nanoseconds.
fn read(resolution: bool) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both calls write only the `timespec` they are given, which lives on this stack
    // frame for the whole call; the clock id is a constant the kernel knows.
    let rc = unsafe {
        if resolution {
            libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut t)
        } else {
            libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t)
        }
    };
    if rc != 0 {
        // Not on this kernel: a zero reading keeps the clock at its origin (nothing is
        // admitted past a window), and an unknown resolution counts as a whole second.
        return if resolution { 1_000_000_000 } else { 0 };
    }
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
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

#[cfg(test)]
mod tests {
    use super::*;

    // The FFI calls and the conversion of what they wrote (Miri runs these: .ci/run).
    #[test]
    fn the_coarse_clock_reads_forward_from_its_origin() {
        let c = CoarseClock::new();
        let (a, b) = (c.now_ms(), c.now_ms());
        assert!(a <= b);
        assert!((1..=1_000).contains(&c.resolution_ms()));
        assert!(read(false) >= c.origin_ns);
    }
}
