//! Timed runs (reference `decisionDurationNs`, `queueWaitNs` through `run`): [`RunTiming`] on
//! the result of [`LlmBulkhead::run_timed`], [`LlmBulkhead::run_blocking_timed`] and
//! [`LlmBulkhead::run_shared_timed`] (and `run_shared_with_timed`), and
//! [`RunContext::timing`] for the work. Only these calls
//! read a clock (the bulkhead's [`Clock`], [`LlmBulkhead::with_clock`]); `run`, `run_blocking`
//! and `run_shared` share their code through [`Stopwatch`], whose untimed kind is a
//! zero-sized no-op the compiler removes.
//!
//! # What is measured
//! Three readings bound the decision: when it starts (after validation and estimation), when
//! the fast decision declined and the waiting acquire began (only if it did), and when the
//! admission or refusal came back. `queue_wait_ns` is the span of the waiting acquire when
//! the call actually queued (0 otherwise: a demand answered at once, or refused on entry,
//! never queued), and `decision_ns` the rest. `work_ns` runs from the admission until the run
//! answered its caller: the work returned, or its future was dropped (or, with
//! `detach_at_deadline`, handed on) at the deadline.

use super::*;
use crate::llm::clock::Clock;
use crate::record::events::nanos;
use crate::Timing;

/// How long a timed run spent deciding, queued and running its work, in nanoseconds of the
/// bulkhead's clock ([`LlmBulkhead::with_clock`]).
///
/// ```
/// use llm_bulkhead::llm::RunTiming;
/// let t = RunTiming::default();
/// assert_eq!((t.decision_ns, t.queue_wait_ns, t.work_ns), (0, 0, None));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RunTiming {
    /// Time spent deciding, outside the queue (0 for a call refused as invalid before any
    /// decision).
    pub decision_ns: u64,
    /// Time spent queued for admission (0 if it never queued). A de-duplication follower,
    /// which takes no admission, counts here its wait for the shared call.
    pub queue_wait_ns: u64,
    /// Time from the admission until the run answered (the work returned, or was dropped or
    /// detached at the deadline); `None` when no work ran (invalid, refused, a follower).
    pub work_ns: Option<u64>,
}

impl RunTiming {
    /// The decision's part, as the core's [`Timing`] (the type admit and reject events carry).
    ///
    /// ```
    /// use llm_bulkhead::llm::RunTiming;
    /// assert_eq!(RunTiming::default().decision().queue_wait_ns, 0);
    /// ```
    #[must_use]
    pub fn decision(&self) -> Timing {
        Timing {
            decision_ns: self.decision_ns,
            queue_wait_ns: self.queue_wait_ns,
        }
    }
}

/// The answer of a timed run, and its [`RunTiming`].
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions, RunTimed};
/// use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// let t: RunTimed<_> = llm.run_blocking_timed(&LlmRequest::default(), RunOptions::default(), |_| Ok::<_, ()>(5));
/// assert_eq!(t.value.unwrap(), 5);
/// assert!(t.timing.work_ns.is_some());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunTimed<T> {
    /// What the untimed call returns.
    pub value: T,
    /// How long it took.
    pub timing: RunTiming,
}

/// The timing of a run's admission, as the context keeps it.
#[derive(Clone, Copy, Debug)]
pub(in crate::llm) struct AdmittedTimes {
    pub(in crate::llm) timing: Timing,
    pub(in crate::llm) admitted_at: Instant,
}

/// The readings of one run, taken by the timed calls and skipped by the others.
pub(in crate::llm) trait Stopwatch: Send {
    /// The answer: the bare result, or the result with its timing.
    type Out<T>;
    /// Where a flight's leader leaves its timing for the caller that led it.
    type Cell: Clone + Send + Sync + 'static;
    /// The decision starts.
    fn start(&mut self);
    /// The fast decision declined: the waiting acquire starts.
    fn waiting(&mut self);
    /// Where the waiting acquire says whether it queued (`None`: nobody asks).
    fn queued(&mut self) -> Option<&mut bool>;
    /// The decision came back (admitted or refused).
    fn decided(&mut self);
    /// The decision came back with `ctx`: its timing goes on the context.
    fn admitted(&mut self, ctx: &mut RunContext);
    /// The run answers its caller.
    fn ended(&mut self);
    /// A de-duplication follower was answered: its whole wait is queue time.
    fn followed(&mut self);
    /// The answer, wrapped.
    fn wrap<T>(self, value: T) -> Self::Out<T>;
    /// A new cell for a flight's leader.
    fn cell(&self) -> Self::Cell;
    /// Leaves this run's timing in `cell` (a flight's leader).
    fn publish(&self, cell: &Self::Cell);
    /// The answer with the timing the leader left in `cell`.
    fn wrap_from<T>(self, cell: &Self::Cell, value: T) -> Self::Out<T>;

    /// The answer `settle` builds once the work ended (built in place: the untimed calls
    /// return it as it is, without a copy through [`wrap`](Self::wrap)).
    #[inline(always)]
    fn answer<T>(mut self, settle: impl FnOnce() -> T) -> Self::Out<T>
    where
        Self: Sized,
    {
        self.ended();
        self.wrap(settle())
    }

    /// The answer of a run refused at its decision with `error` (the core's refusal, the
    /// cluster's share too small, or a lapsed cluster share right after the core's commit).
    #[inline(always)]
    fn refused_with<R, E>(mut self, error: RunError<E>) -> Self::Out<Result<R, RunError<E>>>
    where
        Self: Sized,
    {
        self.decided();
        self.wrap(Err(error))
    }
}

/// The untimed runs: nothing is read, and every step is a no-op.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::llm) struct NoWatch;

impl Stopwatch for NoWatch {
    type Out<T> = T;
    type Cell = ();
    #[inline(always)]
    fn start(&mut self) {}
    #[inline(always)]
    fn waiting(&mut self) {}
    #[inline(always)]
    fn queued(&mut self) -> Option<&mut bool> {
        None
    }
    #[inline(always)]
    fn decided(&mut self) {}
    #[inline(always)]
    fn admitted(&mut self, _: &mut RunContext) {}
    #[inline(always)]
    fn ended(&mut self) {}
    #[inline(always)]
    fn followed(&mut self) {}
    #[inline(always)]
    fn wrap<T>(self, value: T) -> T {
        value
    }
    #[inline(always)]
    fn answer<T>(self, settle: impl FnOnce() -> T) -> T {
        settle()
    }
    #[inline(always)]
    fn cell(&self) {}
    #[inline(always)]
    fn publish(&self, (): &()) {}
    #[inline(always)]
    fn wrap_from<T>(self, (): &(), value: T) -> T {
        value
    }
}

/// The timed runs: the readings of the bulkhead's clock (`None`: [`Instant::now`]).
#[derive(Clone)]
pub(in crate::llm) struct Watch {
    clock: Option<Arc<dyn Clock>>,
    start: Option<Instant>,
    waiting: Option<Instant>,
    queued: bool,
    decided: Option<Instant>,
    timing: RunTiming,
}

impl Watch {
    pub(in crate::llm) fn new(clock: Option<Arc<dyn Clock>>) -> Watch {
        Watch {
            clock,
            start: None,
            waiting: None,
            queued: false,
            decided: None,
            timing: RunTiming::default(),
        }
    }

    fn now(&self) -> Instant {
        match &self.clock {
            Some(c) => c.now(),
            None => Instant::now(),
        }
    }
}

/// `to - from`, 0 if the clock went back (a broken clock) or a reading is missing.
fn span(from: Option<Instant>, to: Instant) -> Duration {
    from.map_or(Duration::ZERO, |f| to.saturating_duration_since(f))
}

impl Stopwatch for Watch {
    type Out<T> = RunTimed<T>;
    type Cell = Arc<Mutex<Option<RunTiming>>>;

    fn start(&mut self) {
        self.start = Some(self.now());
    }

    fn waiting(&mut self) {
        self.waiting = Some(self.now());
    }

    fn queued(&mut self) -> Option<&mut bool> {
        Some(&mut self.queued)
    }

    fn decided(&mut self) {
        let now = self.now();
        let total = span(self.start, now);
        let queue = if self.queued {
            span(self.waiting, now)
        } else {
            Duration::ZERO
        };
        self.decided = Some(now);
        self.timing.decision_ns = nanos(total.saturating_sub(queue));
        self.timing.queue_wait_ns = nanos(queue);
    }

    fn admitted(&mut self, ctx: &mut RunContext) {
        self.decided();
        if let Some(at) = self.decided {
            ctx.times = Some(Box::new(AdmittedTimes {
                timing: self.timing.decision(),
                admitted_at: at,
            }));
        }
    }

    fn ended(&mut self) {
        let now = self.now();
        self.timing.work_ns = Some(nanos(span(self.decided, now)));
    }

    fn followed(&mut self) {
        let now = self.now();
        self.timing.decision_ns = 0;
        self.timing.queue_wait_ns = nanos(span(self.start, now));
        self.timing.work_ns = None;
    }

    fn wrap<T>(self, value: T) -> RunTimed<T> {
        RunTimed {
            value,
            timing: self.timing,
        }
    }

    fn cell(&self) -> Self::Cell {
        Arc::new(Mutex::new(None))
    }

    fn publish(&self, cell: &Self::Cell) {
        *lock(cell) = Some(self.timing);
    }

    fn wrap_from<T>(self, cell: &Self::Cell, value: T) -> RunTimed<T> {
        let timing = lock(cell).take().unwrap_or(self.timing);
        RunTimed { value, timing }
    }
}

impl LlmBulkhead {
    /// The same front end, timing its timed runs with `clock` instead of the system clock
    /// (a [`ManualClock`](crate::llm::ManualClock) in tests). Untimed calls read no clock.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    /// let t = llm.run_blocking_timed(&LlmRequest::default(), RunOptions::default(), |_| {
    ///     clock.advance(Duration::from_millis(250)); // the provider call
    ///     Ok::<_, ()>(())
    /// });
    /// assert_eq!(t.timing.work_ns, Some(250_000_000));
    /// ```
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> LlmBulkhead {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// A stopwatch on this bulkhead's clock.
    pub(in crate::llm) fn watch(&self) -> Watch {
        Watch::new(self.clock.clone())
    }

    /// [`run_blocking`](Self::run_blocking), also reporting how long the decision took, how
    /// long of it was spent queued, and how long the work ran ([`RunTiming`]; see the module
    /// docs of `src/llm/run/timed.rs` for the readings). The work reads the decision's part
    /// from [`RunContext::timing`]. The clock is read only for this call.
    ///
    /// # Errors
    /// As [`run_blocking`](Self::run_blocking), inside [`RunTimed::value`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    /// let t = llm.run_blocking_timed(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.timing().unwrap().queue_wait_ns, 0); // a free slot: no queue
    ///     assert_eq!(ctx.admitted_at(), Some(clock.origin()));
    ///     clock.advance(Duration::from_millis(40));
    ///     Ok::<_, ()>("done")
    /// });
    /// assert_eq!(t.value.unwrap(), "done");
    /// assert_eq!((t.timing.decision_ns, t.timing.work_ns), (0, Some(40_000_000)));
    /// ```
    pub fn run_blocking_timed<R, E, U, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> RunTimed<Result<R, RunError<E>>>
    where
        U: UsageFrom<R>,
        F: FnOnce(&mut RunContext) -> Result<R, E>,
    {
        self.run_blocking_in(request, options, work, self.watch())
    }

    /// [`run`](Self::run), also reporting its [`RunTiming`] (as
    /// [`run_blocking_timed`](Self::run_blocking_timed)). At the borrowed-concurrency deadline
    /// the work's time ends at expiry, when its future is dropped.
    ///
    /// # Cancel safety
    /// As [`run`](Self::run).
    ///
    /// # Errors
    /// As [`run`](Self::run), inside [`RunTimed::value`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    /// let t = futures_lite::future::block_on(llm.run_timed(&LlmRequest::default(), RunOptions::default(), async |_ctx| {
    ///     clock.advance(Duration::from_millis(7));
    ///     Ok::<_, ()>(1)
    /// }));
    /// assert_eq!((t.value.unwrap(), t.timing.work_ns), (1, Some(7_000_000)));
    /// ```
    pub fn run_timed<'a, R, E, U, F>(
        &'a self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> impl Future<Output = RunTimed<Result<R, RunError<E>>>> + 'a
    where
        R: 'a,
        E: 'a,
        U: UsageFrom<R> + 'a,
        F: AsyncFnOnce(&mut RunContext) -> Result<R, E> + 'a,
    {
        self.run_in(request, options, work, self.watch())
    }
}
