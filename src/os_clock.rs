//! The kernel's coarse clocks (Linux), read through one `unsafe` call: the coordinator's
//! received-at stamp reads `CLOCK_REALTIME_COARSE`, the cluster's `CoarseClock`
//! `CLOCK_MONOTONIC_COARSE` and its resolution. Each returns the time of the last kernel tick
//! from memory the kernel shares with the process: a fraction of the precise clocks' cost, at
//! 1 to 10 ms resolution.
//!
//! Miri runs the reading (`.ci/run`); it has no `clock_getres`, so the resolution's test is
//! skipped there (the call is the same `unsafe` block, through the other function).

// Each of the two features uses one clock; the unit tests use both.
#![cfg_attr(
    not(all(feature = "coordinator", feature = "cluster")),
    allow(dead_code)
)]

use std::time::Duration;

/// A coarse clock of the kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coarse {
    /// `CLOCK_MONOTONIC_COARSE`: never goes back, counts from an unspecified origin.
    Monotonic,
    /// `CLOCK_REALTIME_COARSE`: since the Unix epoch; jumps with the wall clock.
    Realtime,
}

impl Coarse {
    fn id(self) -> libc::clockid_t {
        match self {
            Coarse::Monotonic => libc::CLOCK_MONOTONIC_COARSE,
            Coarse::Realtime => libc::CLOCK_REALTIME_COARSE,
        }
    }

    /// Its reading (`None` if the kernel refuses the clock).
    pub(crate) fn now(self) -> Option<Duration> {
        call(libc::clock_gettime, self.id())
    }

    /// Its resolution: how far a reading may lag (`None` if the kernel refuses the clock).
    pub(crate) fn resolution(self) -> Option<Duration> {
        call(libc::clock_getres, self.id())
    }
}

/// `f(clock, &mut timespec)` (`clock_gettime` or `clock_getres`), what it wrote as a
/// `Duration`.
fn call(
    f: unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int,
    clock: libc::clockid_t,
) -> Option<Duration> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both functions write one `timespec` through the pointer, which points to a
    // live, writable `timespec` on this stack frame, and keep no reference to it; the clock id
    // is one of `Coarse`'s constants (an id the kernel does not know is an error return, not
    // undefined behaviour).
    let rc = unsafe { f(clock, &mut t) };
    if rc != 0 {
        return None;
    }
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec)
        .ok()
        .filter(|&n| n < 1_000_000_000)?;
    Some(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clocks_read_what_the_kernel_wrote() {
        let (a, b) = (
            Coarse::Monotonic.now().unwrap(),
            Coarse::Monotonic.now().unwrap(),
        );
        assert!(a <= b);
        // After 2001-09-09 (10^9 s since the epoch).
        assert!(Coarse::Realtime.now().unwrap() > Duration::from_secs(1_000_000_000));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri has no clock_getres")]
    fn a_coarse_clocks_resolution_is_at_most_a_second() {
        for c in [Coarse::Monotonic, Coarse::Realtime] {
            let r = c.resolution().unwrap();
            assert!(
                r > Duration::ZERO && r <= Duration::from_secs(1),
                "{c:?}: {r:?}"
            );
        }
    }
}
