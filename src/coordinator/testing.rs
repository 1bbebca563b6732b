//! Fakes for the coordinator's test seam: a manual monotonic clock, a manual wall clock and a
//! manual scheduler whose [`advance`](ManualScheduler::advance) fires every due timer in time
//! order, moving the clock to each timer's instant first. Nothing here sleeps.

use super::clock::{MonotonicClock, Scheduler, Task, Timers, WallClock};
use crate::sync::Mutex;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A monotonic clock that moves only when told.
///
/// ```
/// use llm_bulkhead::coordinator::testing::ManualClock;
/// use llm_bulkhead::coordinator::MonotonicClock;
/// use std::time::Duration;
/// let c = ManualClock::new(Duration::from_millis(1000));
/// c.advance(Duration::from_millis(5));
/// assert_eq!(c.elapsed(), Duration::from_millis(1005));
/// ```
#[derive(Debug)]
pub struct ManualClock(Mutex<Duration>);

impl ManualClock {
    /// A clock reading `start`.
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::testing::ManualClock::new(std::time::Duration::ZERO);
    /// ```
    pub fn new(start: Duration) -> Self {
        ManualClock(Mutex::new(start))
    }

    /// Moves the clock forward by `d` (without firing timers: use
    /// [`ManualScheduler::advance`] for that).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{MonotonicClock, testing::ManualClock};
    /// let c = ManualClock::new(std::time::Duration::ZERO);
    /// c.advance(std::time::Duration::from_secs(1));
    /// assert_eq!(c.elapsed().as_secs(), 1);
    /// ```
    pub fn advance(&self, d: Duration) {
        let mut g = crate::sync::lock(&self.0);
        *g = g.saturating_add(d);
    }

    /// Sets the clock to `at` if that is later (it never goes back).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{MonotonicClock, testing::ManualClock};
    /// use std::time::Duration;
    /// let c = ManualClock::new(Duration::from_secs(2));
    /// c.set(Duration::from_secs(1));
    /// assert_eq!(c.elapsed().as_secs(), 2);
    /// ```
    pub fn set(&self, at: Duration) {
        let mut g = crate::sync::lock(&self.0);
        *g = (*g).max(at);
    }
}

impl MonotonicClock for ManualClock {
    fn elapsed(&self) -> Duration {
        *crate::sync::lock(&self.0)
    }
}

/// A wall clock that moves only when told, in either direction.
///
/// ```
/// use llm_bulkhead::coordinator::testing::ManualWallClock;
/// use llm_bulkhead::coordinator::WallClock;
/// use std::time::{Duration, UNIX_EPOCH};
/// let w = ManualWallClock::new(UNIX_EPOCH + Duration::from_secs(100));
/// w.jump(-5_000);
/// assert_eq!(w.now(), UNIX_EPOCH + Duration::from_secs(95));
/// ```
#[derive(Debug)]
pub struct ManualWallClock(Mutex<SystemTime>);

impl ManualWallClock {
    /// A wall clock reading `start`.
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::testing::ManualWallClock::new(std::time::UNIX_EPOCH);
    /// ```
    pub fn new(start: SystemTime) -> Self {
        ManualWallClock(Mutex::new(start))
    }

    /// Jumps by `delta_ms` milliseconds (negative: back); saturates at the representable ends.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{WallClock, testing::ManualWallClock};
    /// let w = ManualWallClock::new(std::time::UNIX_EPOCH);
    /// w.jump(1_000);
    /// assert_eq!(w.now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(), 1);
    /// ```
    pub fn jump(&self, delta_ms: i64) {
        let mut g = crate::sync::lock(&self.0);
        let d = Duration::from_millis(delta_ms.unsigned_abs());
        let moved = if delta_ms >= 0 {
            g.checked_add(d)
        } else {
            g.checked_sub(d)
        };
        if let Some(t) = moved {
            *g = t;
        }
    }
}

impl WallClock for ManualWallClock {
    fn now(&self) -> SystemTime {
        *crate::sync::lock(&self.0)
    }
}

/// A scheduler driven by hand: tasks run only inside [`advance`](Self::advance), in time
/// order (ties in scheduling order), each after the clock is moved to its instant; a task
/// scheduled while advancing runs in the same advance if it is due by its end.
///
/// ```
/// use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler};
/// use llm_bulkhead::coordinator::{MonotonicClock, Scheduler};
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// let clock = Arc::new(ManualClock::new(Duration::ZERO));
/// let s = ManualScheduler::new(clock.clone());
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// for ms in [30, 10, 20] {
///     let (seen, c) = (seen.clone(), clock.clone());
///     s.schedule(Duration::from_millis(ms), Box::new(move || seen.lock().unwrap().push(c.elapsed().as_millis())));
/// }
/// s.advance(Duration::from_millis(25));
/// assert_eq!(*seen.lock().unwrap(), vec![10, 20]);
/// assert_eq!(clock.elapsed(), Duration::from_millis(25));
/// ```
pub struct ManualScheduler {
    clock: Arc<ManualClock>,
    timers: Mutex<Timers>,
}

impl ManualScheduler {
    /// A scheduler that moves `clock`.
    ///
    /// ```
    /// use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler};
    /// let s = ManualScheduler::new(std::sync::Arc::new(ManualClock::new(std::time::Duration::ZERO)));
    /// assert_eq!(s.pending(), 0);
    /// ```
    pub fn new(clock: Arc<ManualClock>) -> Self {
        ManualScheduler {
            clock,
            timers: Mutex::new(Timers::default()),
        }
    }

    /// Moves the clock forward by `d`, running every task due by then in time order.
    ///
    /// ```
    /// use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler};
    /// use llm_bulkhead::coordinator::MonotonicClock;
    /// use std::time::Duration;
    /// let clock = std::sync::Arc::new(ManualClock::new(Duration::ZERO));
    /// ManualScheduler::new(clock.clone()).advance(Duration::from_millis(7));
    /// assert_eq!(clock.elapsed(), Duration::from_millis(7));
    /// ```
    pub fn advance(&self, d: Duration) {
        let target = self.clock.elapsed().saturating_add(d);
        loop {
            let due = crate::sync::lock(&self.timers).pop_due(target);
            let Some((at, task)) = due else { break };
            self.clock.set(at);
            task();
        }
        self.clock.set(target);
    }

    /// Timers not fired yet.
    ///
    /// ```
    /// use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler};
    /// let s = ManualScheduler::new(std::sync::Arc::new(ManualClock::new(std::time::Duration::ZERO)));
    /// assert_eq!(s.pending(), 0);
    /// ```
    pub fn pending(&self) -> usize {
        crate::sync::lock(&self.timers).len()
    }
}

impl Scheduler for ManualScheduler {
    fn schedule(&self, at: Duration, task: Task) {
        crate::sync::lock(&self.timers).push(at, task);
    }
}

/// A manual monotonic clock, a manual wall clock and a manual scheduler over that clock,
/// bundled; [`clocks`](Self::clocks) hands them to a coordinator.
///
/// ```
/// use llm_bulkhead::coordinator::testing::ManualClocks;
/// use llm_bulkhead::coordinator::MonotonicClock;
/// use std::time::Duration;
/// let m = ManualClocks::new(Duration::from_millis(1000));
/// m.scheduler.advance(Duration::from_millis(5));
/// assert_eq!(m.elapsed.elapsed(), Duration::from_millis(1005));
/// ```
pub struct ManualClocks {
    /// The monotonic clock.
    pub elapsed: Arc<ManualClock>,
    /// The wall clock (starts at 2023-11-14T22:13:20Z, `1_700_000_000_000` ms).
    pub wall: Arc<ManualWallClock>,
    /// The scheduler; its `advance` moves `elapsed`.
    pub scheduler: Arc<ManualScheduler>,
}

impl ManualClocks {
    /// Manual clocks with the monotonic clock at `elapsed_start`.
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::testing::ManualClocks::new(std::time::Duration::ZERO);
    /// ```
    pub fn new(elapsed_start: Duration) -> Self {
        let elapsed = Arc::new(ManualClock::new(elapsed_start));
        let wall = Arc::new(ManualWallClock::new(
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000),
        ));
        let scheduler = Arc::new(ManualScheduler::new(elapsed.clone()));
        ManualClocks {
            elapsed,
            wall,
            scheduler,
        }
    }

    /// The three as a coordinator's [`Clocks`](super::Clocks).
    ///
    /// ```
    /// let m = llm_bulkhead::coordinator::testing::ManualClocks::new(std::time::Duration::ZERO);
    /// let _ = m.clocks();
    /// ```
    pub fn clocks(&self) -> super::Clocks {
        super::Clocks {
            elapsed: self.elapsed.clone(),
            now: self.wall.clone(),
            scheduler: self.scheduler.clone(),
        }
    }
}
