//! Decision timing (reference `decisionDurationNs`, `queueWaitNs`): [`Timing`], and the
//! per-thread clock of the decision being timed, which the event delivery reads when it builds
//! an admit or reject event (`crate::record::events`). A decision is timed only while a
//! subscriber asks for it (`Interest::DECISION_TIMING`); otherwise no clock is read.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a decision took, in nanoseconds: deciding (without the queue), and waiting in the
/// queue (0 if it never queued).
///
/// ```
/// assert_eq!(llm_bulkhead::Timing::default().decision_ns, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Timing {
    /// Time spent deciding, outside the queue.
    pub decision_ns: u64,
    /// Time spent queued.
    pub queue_wait_ns: u64,
}

/// `d` in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The decision being timed on this thread ([`Interest::DECISION_TIMING`]): when it started
/// and how long it has been queued. Read by [`Subscribers::emit`] when it builds an admit or
/// reject event: that is how the timing reaches events without passing through every hook.
#[derive(Clone, Copy)]
struct DecisionClock {
    start: Instant,
    queued: Duration,
}

impl DecisionClock {
    fn timing(self) -> Timing {
        let total = self.start.elapsed();
        Timing {
            decision_ns: nanos(total.saturating_sub(self.queued)),
            queue_wait_ns: nanos(self.queued),
        }
    }
}

// A per-thread scratch value no protocol reads (set and restored around one decision).
std::thread_local! {
    static DECISION: Cell<Option<DecisionClock>> = const { Cell::new(None) };
}

/// A decision timed on this thread until it is dropped. Inert unless decision timing was
/// asked for. Scopes do not nest: a decision made by a subscriber inside another decision's
/// delivery ends the outer clock too, which is harmless because a decision builds its one
/// admit or reject event (and reads the clock) before any subscriber runs.
pub(crate) struct TimingScope(bool);

impl TimingScope {
    /// Times a decision that started at `start` (`None`: not timed, nothing is touched).
    #[inline(always)]
    pub(crate) fn resume(start: Option<Instant>) -> TimingScope {
        match start {
            None => TimingScope(false),
            Some(start) => TimingScope::enter(start),
        }
    }

    #[cold]
    #[inline(never)]
    fn enter(start: Instant) -> TimingScope {
        let clock = DecisionClock {
            start,
            queued: Duration::ZERO,
        };
        DECISION.with(|d| d.set(Some(clock)));
        TimingScope(true)
    }

    /// Whether this decision is timed.
    pub(crate) fn is_on(&self) -> bool {
        self.0
    }

    /// The decision's time in the queue so far (`wait`).
    pub(crate) fn queued(&self, wait: Duration) {
        if self.0 {
            set_queued(wait);
        }
    }
}

/// Ends the decision timed on this thread, if one is (its admit or reject hook calls this once
/// the event is built, or when nobody subscribed to the event).
#[cold]
#[inline(never)]
pub(crate) fn end() {
    DECISION.with(|d| d.set(None));
}

/// Starts timing a decision on this thread now, without a scope: `try_acquire`'s decision,
/// whose every exit with timing asked for passes through an admit or reject hook that calls
/// [`end`] (so the untimed decision carries nothing to drop on its exits).
#[cold]
#[inline(never)]
pub(crate) fn begin_now() {
    let clock = DecisionClock {
        start: Instant::now(),
        queued: Duration::ZERO,
    };
    DECISION.with(|d| d.set(Some(clock)));
}

/// Records `wait` as the queue time of the decision timed on this thread, if there is one.
pub(crate) fn set_queued(wait: Duration) {
    DECISION.with(|d| {
        if let Some(mut c) = d.get() {
            c.queued = wait;
            d.set(Some(c));
        }
    });
}

impl Drop for TimingScope {
    #[inline(always)]
    fn drop(&mut self) {
        if self.0 {
            end();
        }
    }
}

/// When the decision timed on this thread started, if one is.
pub(crate) fn decision_start() -> Option<Instant> {
    DECISION.with(Cell::get).map(|c| c.start)
}

/// The timing of the decision timed on this thread so far, if one is.
pub(crate) fn current() -> Option<Timing> {
    DECISION.with(Cell::get).map(DecisionClock::timing)
}
