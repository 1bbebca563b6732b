//! The coordinator's test seam: the monotonic clock (`elapsed`), the wall clock (`now`) and
//! the scheduler that wakes the coordinator at a not-before time, with the real ones.
//!
//! Monotonic instants are `Duration`s since the clock's own origin: they mean nothing outside
//! the process and are never persisted.

#[cfg(not(loom))]
use crate::sync::{Condvar, Mutex};
use std::collections::BinaryHeap;
#[cfg(not(loom))]
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// The monotonic clock that drives pacing, cooldowns and admission timeouts.
///
/// ```
/// use llm_bulkhead::coordinator::{MonotonicClock, SystemClock};
/// let c = SystemClock::new();
/// assert!(c.elapsed() <= c.elapsed());
/// ```
pub trait MonotonicClock: Send + Sync {
    /// The time since this clock's origin; never decreases. It may be called while the
    /// coordinator's mutex is held (a release with tickets queued reads it there), so it must
    /// not call back into the coordinator.
    fn elapsed(&self) -> Duration;
}

/// The wall clock: only stamps when a ticket was received; no admission rule reads it.
///
/// ```
/// use llm_bulkhead::coordinator::{SystemClock, WallClock};
/// assert!(SystemClock::new().now() > std::time::UNIX_EPOCH);
/// ```
pub trait WallClock: Send + Sync {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// A one-shot task for a [`Scheduler`].
pub type Task = Box<dyn FnOnce() + Send>;

/// Runs a task once its monotonic clock reaches an instant (it may run it later, never
/// earlier; a task whose instant has passed runs soon).
///
/// ```
/// use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler};
/// use llm_bulkhead::coordinator::Scheduler;
/// use std::sync::{Arc, atomic::{AtomicBool, Ordering}};
/// use std::time::Duration;
/// let s = ManualScheduler::new(Arc::new(ManualClock::new(Duration::ZERO)));
/// let fired = Arc::new(AtomicBool::new(false));
/// let f = fired.clone();
/// s.schedule(Duration::from_millis(5), Box::new(move || f.store(true, Ordering::SeqCst)));
/// s.advance(Duration::from_millis(5));
/// assert!(fired.load(Ordering::SeqCst));
/// ```
pub trait Scheduler: Send + Sync {
    /// Runs `task` at monotonic instant `at` (of the clock this scheduler was made with).
    fn schedule(&self, at: Duration, task: Task);
}

/// The real clocks: `std::time::Instant` from the clock's creation, and `SystemTime`.
///
/// ```
/// use llm_bulkhead::coordinator::{MonotonicClock, SystemClock};
/// let c = SystemClock::new();
/// let _ = c.elapsed();
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::SystemClock::new();
    /// ```
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }

    /// The real instant of monotonic instant `at`.
    #[cfg(not(loom))]
    fn instant(&self, at: Duration) -> Option<Instant> {
        self.origin.checked_add(at)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl MonotonicClock for SystemClock {
    fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }
}

impl WallClock for SystemClock {
    /// The wall clock, at the kernel tick's resolution on Linux (`CLOCK_REALTIME_COARSE`:
    /// 1 to 10 ms, a fraction of the precise clock's cost, which every submit would pay for
    /// its received-at stamp); `SystemTime::now()` elsewhere. A stamp needs no more than
    /// JavaScript's `Date.now()` millisecond; inject a [`WallClock`] for a finer one.
    fn now(&self) -> SystemTime {
        coarse_wall_clock().unwrap_or_else(SystemTime::now)
    }
}

/// `CLOCK_REALTIME_COARSE` as a `SystemTime` (`None` if the kernel refuses it).
#[cfg(target_os = "linux")]
fn coarse_wall_clock() -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(crate::os_clock::Coarse::Realtime.now()?)
}

#[cfg(not(target_os = "linux"))]
fn coarse_wall_clock() -> Option<SystemTime> {
    None
}

struct Timer {
    at: Duration,
    seq: u64,
    task: Task,
}

impl PartialEq for Timer {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timer {
    /// Reversed: the heap's top is the earliest timer (ties in scheduling order).
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Timers in time order (ties in scheduling order), shared by the real and the manual
/// scheduler.
#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Timer>,
    seq: u64,
}

impl Timers {
    pub(crate) fn push(&mut self, at: Duration, task: Task) {
        self.seq += 1;
        let seq = self.seq;
        self.heap.push(Timer { at, seq, task });
    }

    /// The earliest timer's instant.
    pub(crate) fn next_at(&self) -> Option<Duration> {
        self.heap.peek().map(|t| t.at)
    }

    /// The earliest timer if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Duration) -> Option<(Duration, Task)> {
        if self.next_at()? > now {
            return None;
        }
        self.heap.pop().map(|t| (t.at, t.task))
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(not(loom))]
struct ThreadShared {
    timers: Mutex<(Timers, bool)>,
    cv: Condvar,
}

// Not under loom: its thread would run outside the model (models pass fake clocks).
#[cfg(not(loom))]
/// The real scheduler: one thread that sleeps until the earliest timer of a [`SystemClock`]
/// and runs due tasks on itself. The thread ends when the scheduler is dropped.
///
/// ```
/// use llm_bulkhead::coordinator::{Scheduler, SystemClock, ThreadScheduler};
/// use std::sync::mpsc;
/// let clock = SystemClock::new();
/// let s = ThreadScheduler::new(clock);
/// let (tx, rx) = mpsc::channel();
/// s.schedule(std::time::Duration::ZERO, Box::new(move || tx.send(()).unwrap()));
/// rx.recv().unwrap();
/// ```
pub struct ThreadScheduler {
    clock: SystemClock,
    shared: Arc<ThreadShared>,
}

#[cfg(not(loom))]
impl ThreadScheduler {
    /// A scheduler for `clock`'s instants, with its thread started.
    ///
    /// # Panics
    ///
    /// If the operating system cannot start a thread.
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::ThreadScheduler::new(llm_bulkhead::coordinator::SystemClock::new());
    /// ```
    pub fn new(clock: SystemClock) -> Self {
        let shared = Arc::new(ThreadShared {
            timers: Mutex::new((Timers::default(), false)),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        crate::sync::thread::Builder::new()
            .name("llm-bulkhead-coordinator-timer".into())
            .spawn(move || run_timers(clock, &s))
            .expect("start the coordinator's timer thread");
        ThreadScheduler { clock, shared }
    }
}

#[cfg(not(loom))]
fn run_timers(clock: SystemClock, s: &ThreadShared) {
    let mut g = crate::sync::lock(&s.timers);
    loop {
        if g.1 {
            return;
        }
        let now = clock.elapsed();
        if let Some((_, task)) = g.0.pop_due(now) {
            // The task is user code (the coordinator's tick, an attempt timeout): run it
            // without the timers' lock.
            drop(g);
            task();
            g = crate::sync::lock(&s.timers);
            continue;
        }
        g = match g.0.next_at() {
            None => {
                s.cv.wait(g)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            }
            Some(at) => {
                let d = clock
                    .instant(at)
                    .map_or(Duration::from_secs(3600), |i| i - Instant::now().min(i));
                s.cv.wait_timeout(g, d)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0
            }
        };
    }
}

#[cfg(not(loom))]
impl Scheduler for ThreadScheduler {
    fn schedule(&self, at: Duration, task: Task) {
        let _ = self.clock;
        crate::sync::lock(&self.shared.timers).0.push(at, task);
        self.shared.cv.notify_one();
    }
}

#[cfg(not(loom))]
impl Drop for ThreadScheduler {
    fn drop(&mut self) {
        crate::sync::lock(&self.shared.timers).1 = true;
        self.shared.cv.notify_one();
    }
}
