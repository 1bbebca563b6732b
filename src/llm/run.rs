//! `run`: admission, work and release in one call, for synchronous closures and async work
//! (reference §9.2), with a reservation preview (`estimate`), an advisory check
//! (`would_admit`) and the borrowed-concurrency deadline (reference §6.2).
//!
//! ```
//! use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
//! use llm_bulkhead::{Bulkhead, Usage};
//!
//! let bulkhead = Bulkhead::builder().max_concurrent(4).token_budget(10_000).build()?;
//! let llm = LlmBulkhead::new(bulkhead, NaiveEstimator);
//! let request = LlmRequest::new("any-model", &["hello there"]);
//!
//! // Sync work; the usage is taken from the result.
//! let options = RunOptions::default().with_usage(|r: &(String, Usage)| Some(r.1));
//! let (text, _) = llm.run_blocking(&request, options, |ctx| {
//!     assert_eq!(ctx.reservation().unwrap().total(), 3 + 2_048);
//!     Ok::<_, std::io::Error>(("hi".to_owned(), Usage::new(3, 1)))
//! })?;
//! assert_eq!(text, "hi");
//!
//! // Async work, on any executor.
//! let n = futures_lite::future::block_on(llm.run(&request, RunOptions::default(), async |ctx| {
//!     ctx.report_usage(Usage::new(3, 0), None).unwrap();
//!     Ok::<_, std::io::Error>(42)
//! }))?;
//! assert_eq!(n, 42);
//! assert_eq!(llm.bulkhead().stats().in_flight, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::dedup::DedupError;
use super::estimate::{EstimateError, ReservationOverride, TokenEstimator};
use super::observe::{hard_refusal, AdmissionKind, Bypassed, Mode, ShadowReasons};
use super::request::LlmRequest;
use crate::record::events::AbandonCause;
use crate::sync::{lock, AtomicBool, Mutex, Ordering};
use crate::{
    Admission, Advice, Bulkhead, ClassId, Demand, Priority, Reconcile, Rejection, Reservation,
    Resources, Usage, UsageError, UsageReport, WaitOptions,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Takes the usage from a successful result (the reference's `getUsage`). Any
/// `Fn(&R) -> Option<Usage>` is one; [`NoUsage`] takes none.
///
/// ```
/// use llm_bulkhead::llm::{NoUsage, UsageFrom};
/// use llm_bulkhead::Usage;
/// assert_eq!(NoUsage.usage_from(&5), None);
/// let f = |r: &u64| Some(Usage::new(*r, 1));
/// assert_eq!(f.usage_from(&5), Some(Usage::new(5, 1)));
/// ```
pub trait UsageFrom<R> {
    /// The usage of `result`, or `None` (the last report is used then).
    ///
    /// ```
    /// use llm_bulkhead::llm::UsageFrom;
    /// use llm_bulkhead::Usage;
    /// let from_pair = |r: &(u64, u64)| Some(Usage::new(r.0, r.1));
    /// assert_eq!(from_pair.usage_from(&(3, 4)), Some(Usage::new(3, 4)));
    /// ```
    fn usage_from(&self, result: &R) -> Option<Usage>;
}

/// Takes no usage from results (the default of [`RunOptions`]).
///
/// ```
/// use llm_bulkhead::llm::{NoUsage, UsageFrom};
/// assert_eq!(NoUsage.usage_from(&"anything"), None);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NoUsage;

impl<R> UsageFrom<R> for NoUsage {
    fn usage_from(&self, _: &R) -> Option<Usage> {
        None
    }
}

impl<R, F: Fn(&R) -> Option<Usage>> UsageFrom<R> for F {
    fn usage_from(&self, result: &R) -> Option<Usage> {
        self(result)
    }
}

/// Fires [`Deadline::Manual`] deadlines: a deadline driven by the application (or a test)
/// rather than by a clock. Cloning shares the trigger; one trigger may drive many runs.
///
/// ```
/// use llm_bulkhead::llm::DeadlineTrigger;
/// let t = DeadlineTrigger::new();
/// assert!(!t.is_fired());
/// t.fire();
/// assert!(t.is_fired());
/// ```
///
/// # Memory ordering
/// The fired flag and the list of armed runs share one mutex, so a run armed concurrently with
/// `fire` is either in the list `fire` takes or sees the flag when it arms, and expires at once.
#[derive(Clone, Default)]
pub struct DeadlineTrigger(Arc<Mutex<TriggerState>>);

#[derive(Default)]
struct TriggerState {
    fired: bool,
    armed: Vec<Weak<Lease>>,
}

impl DeadlineTrigger {
    /// A trigger not fired yet.
    ///
    /// ```
    /// assert!(!llm_bulkhead::llm::DeadlineTrigger::new().is_fired());
    /// ```
    pub fn new() -> DeadlineTrigger {
        DeadlineTrigger::default()
    }

    /// Expires every run armed with this trigger, and every run armed later.
    ///
    /// ```
    /// # use llm_bulkhead::llm::DeadlineTrigger;
    /// let t = DeadlineTrigger::new();
    /// t.fire();
    /// t.fire(); // idempotent
    /// ```
    pub fn fire(&self) {
        let armed = {
            let mut st = lock(&self.0);
            st.fired = true;
            std::mem::take(&mut st.armed)
        };
        for lease in armed.iter().filter_map(Weak::upgrade) {
            lease.expire();
        }
    }

    /// Whether [`fire`](Self::fire) was called.
    ///
    /// ```
    /// # use llm_bulkhead::llm::DeadlineTrigger;
    /// assert!(!DeadlineTrigger::new().is_fired());
    /// ```
    pub fn is_fired(&self) -> bool {
        lock(&self.0).fired
    }

    fn arm(&self, lease: &Arc<Lease>) {
        let fired = {
            let mut st = lock(&self.0);
            if !st.fired {
                st.armed.retain(|w| w.strong_count() > 0);
                st.armed.push(Arc::downgrade(lease));
            }
            st.fired
        };
        if fired {
            lease.expire();
        }
    }
}

impl fmt::Debug for DeadlineTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineTrigger")
            .field("fired", &self.is_fired())
            .finish()
    }
}

/// A borrowed-concurrency deadline (reference §6.2): a clock duration, or a trigger.
///
/// It starts at admission (queue time never counts) and applies only when the admission's slot
/// was borrowed from the shared remainder. On expiry the slot is abandoned (cause `deadline`),
/// the work's stop signal fires, and the run answers [`RunError::Deadline`]; the tokens stay
/// held until the work ends, and a drain counts the admission until then.
///
/// # What it guarantees, and what it does not
/// Expiry returns **this process's** admission slot (an in-process bound): it is not evidence
/// that the upstream provider stopped generating. If the work's remote cancellation is best
/// effort, the provider may go on, and the token accounting done when the work settles is an
/// accounting view, not a measurement of the provider. A hard upstream guarantee needs
/// capacity that is never lent for that resource (an unlent floor: a class's
/// `protected_concurrent`, whose slots are never borrowed, so the deadline never applies to
/// them) or an authoritative provider-side cancellation or partition mechanism.
///
/// ```
/// use llm_bulkhead::llm::{Deadline, DeadlineTrigger};
/// use std::time::Duration;
/// let real = Deadline::After(Duration::from_secs(30));
/// let manual = Deadline::Manual(DeadlineTrigger::new());
/// # let _ = (real, manual);
/// ```
#[derive(Clone, Debug)]
pub enum Deadline {
    /// Expires this long after admission (the crate's timer thread fires it). Must be above
    /// zero.
    After(Duration),
    /// Expires when the trigger fires (before admission: at admission).
    Manual(DeadlineTrigger),
}

/// Options of one `run` (and of `estimate` and `would_admit`, which read the admission part).
///
/// ```
/// use llm_bulkhead::llm::{Deadline, RunOptions};
/// use llm_bulkhead::{Priority, Usage};
/// use std::time::Duration;
/// let o = RunOptions {
///     priority: Priority::High,
///     borrowed_concurrency_deadline: Some(Deadline::After(Duration::from_secs(5))),
///     ..RunOptions::default()
/// }
/// .with_usage(|r: &Usage| Some(*r));
/// # let _ = o;
/// ```
#[derive(Clone)]
pub struct RunOptions<U = NoUsage> {
    /// The demand's priority.
    pub priority: Priority,
    /// The admission class (`None`: the default class).
    pub class: Option<ClassId>,
    /// An explicit reservation used instead of the estimator (only with a budget), checked
    /// for consistency.
    pub reservation: Option<ReservationOverride>,
    /// Timeout and cancellation of the wait for a slot (when the bulkhead queues).
    pub wait: WaitOptions,
    /// Abandon a borrowed slot when this expires (ignored for slots that are not borrowed).
    /// An in-process bound on the slot only, not proof that the provider stopped: see
    /// [`Deadline`] for what it guarantees.
    pub borrowed_concurrency_deadline: Option<Deadline>,
    /// Takes the usage from a successful result.
    pub usage: U,
    /// Enforce (the default) or observe: run refused work anyway, without an admission
    /// (see [`Mode`]).
    pub mode: Mode,
    /// Take part in de-duplication when the bulkhead de-duplicates (the default, `true`);
    /// `false` opts this call out. As in the reference, `true` cannot switch it on for a
    /// bulkhead without it. Read by [`LlmBulkhead::run_shared`] and
    /// [`LlmBulkhead::run_shared_with`] only (`run` and `run_blocking` never de-duplicate).
    pub dedup: bool,
    /// The de-duplication scope (a trusted tenant id, for example): calls share only within
    /// one scope and one class (`None`: the empty scope).
    pub dedup_scope: Option<String>,
    /// Answer the caller at the borrowed-concurrency deadline and hand the work, still
    /// running, to this spawner (the seed's behaviour): it goes on, and settles its tokens
    /// when it ends (a drain counts it until then). Only [`LlmBulkhead::run_shared`] and
    /// [`LlmBulkhead::run_shared_with`] can detach their work (it owns its context and is
    /// `Send + 'static`); `run` and `run_blocking` refuse it as [`RunError::Invalid`].
    pub detach_at_deadline: Option<Detach>,
}

/// A work detached at its deadline, for the application's executor to run to its end.
pub type DetachedWork = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs a [`DetachedWork`] on the application's executor, for example
/// `Arc::new(|w| { tokio::spawn(w); })`.
///
/// ```
/// use llm_bulkhead::llm::{Detach, DetachedWork};
/// use std::sync::{Arc, Mutex};
/// let parked: Arc<Mutex<Vec<DetachedWork>>> = Arc::default();
/// let p = parked.clone();
/// let detach: Detach = Arc::new(move |w: DetachedWork| p.lock().unwrap().push(w));
/// # let _ = detach;
/// ```
pub type Detach = Arc<dyn Fn(DetachedWork) + Send + Sync>;

impl Default for RunOptions<NoUsage> {
    fn default() -> Self {
        RunOptions {
            priority: Priority::Normal,
            class: None,
            reservation: None,
            wait: WaitOptions::default(),
            borrowed_concurrency_deadline: None,
            usage: NoUsage,
            mode: Mode::Enforce,
            dedup: true,
            dedup_scope: None,
            detach_at_deadline: None,
        }
    }
}

impl<U> RunOptions<U> {
    /// The same options, taking the usage from results with `usage`.
    ///
    /// ```
    /// use llm_bulkhead::llm::RunOptions;
    /// use llm_bulkhead::Usage;
    /// let o = RunOptions::default().with_usage(|r: &(u64, u64)| Some(Usage::new(r.0, r.1)));
    /// # let _ = o;
    /// ```
    pub fn with_usage<V>(self, usage: V) -> RunOptions<V> {
        RunOptions {
            priority: self.priority,
            class: self.class,
            reservation: self.reservation,
            wait: self.wait,
            borrowed_concurrency_deadline: self.borrowed_concurrency_deadline,
            usage,
            mode: self.mode,
            dedup: self.dedup,
            dedup_scope: self.dedup_scope,
            detach_at_deadline: self.detach_at_deadline,
        }
    }
}

impl<U> fmt::Debug for RunOptions<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOptions")
            .field("priority", &self.priority)
            .field("class", &self.class)
            .field("reservation", &self.reservation)
            .field("wait", &self.wait)
            .field(
                "borrowed_concurrency_deadline",
                &self.borrowed_concurrency_deadline,
            )
            .field("mode", &self.mode)
            .field("dedup", &self.dedup)
            .field("dedup_scope", &self.dedup_scope)
            .field("detach_at_deadline", &self.detach_at_deadline.is_some())
            .finish_non_exhaustive()
    }
}

/// The borrowed-concurrency deadline expired: the slot was abandoned (cause `deadline`) and
/// the work was asked to stop; its tokens were settled when it finished.
///
/// # What it guarantees, and what it does not
/// This error reports that **this process's** admission slot was returned (an in-process
/// bound): it is not evidence that the upstream provider stopped generating. If the work's remote cancellation is best
/// effort, the provider may go on, and the token accounting done when the work settles is an
/// accounting view, not a measurement of the provider. A hard upstream guarantee needs
/// capacity that is never lent for that resource (an unlent floor: a class's
/// `protected_concurrent`, whose slots are never borrowed, so the deadline never applies to
/// them) or an authoritative provider-side cancellation or partition mechanism.
///
/// ```
/// use llm_bulkhead::llm::DeadlineExpired;
/// fn log(e: &DeadlineExpired) -> String { e.to_string() }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeadlineExpired {
    /// The configured duration (`None` for a manual deadline).
    pub deadline: Option<Duration>,
    /// The admission.
    pub admission_id: crate::AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// Its class.
    pub class: Option<ClassId>,
    /// What it borrowed.
    pub resources: Resources,
}

impl fmt::Display for DeadlineExpired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.deadline {
            Some(d) => write!(f, "borrowed LLM concurrency deadline expired after {d:?}"),
            None => f.write_str("borrowed LLM concurrency deadline fired"),
        }
    }
}

impl std::error::Error for DeadlineExpired {}

/// Why a `run` did not return the work's result.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions};
/// use llm_bulkhead::{Bulkhead, RejectReason};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let r = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| Ok::<_, ()>(()));
/// assert!(matches!(r, Err(RunError::Rejected(ref x)) if x.reason == RejectReason::ConcurrencyLimit));
/// ```
#[derive(Clone, Debug)]
pub enum RunError<E> {
    /// Refused (the rejection carries the reason and the capacity detail).
    Rejected(Rejection),
    /// The request or an option is invalid (the error names the field); nothing changed.
    Invalid(EstimateError),
    /// The borrowed-concurrency deadline expired.
    Deadline(DeadlineExpired),
    /// A de-duplication follower ([`LlmBulkhead::run_shared`]) got no result: its own timeout
    /// passed ([`DedupError::Timeout`]) or the leader's result could not be shared with it
    /// ([`DedupError::Unshareable`]). Counted in [`DedupStats`](super::DedupStats) and seen as
    /// a `dedup` event.
    Shared(DedupError),
    /// The work's own error.
    Work(E),
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Rejected(r) => write!(f, "LLM bulkhead rejected: {r}"),
            RunError::Invalid(e) => write!(f, "invalid run: {e}"),
            RunError::Deadline(d) => d.fmt(f),
            RunError::Shared(d) => write!(f, "de-duplicated run: {d}"),
            RunError::Work(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Rejected(r) => Some(r),
            RunError::Invalid(e) => Some(e),
            RunError::Deadline(d) => Some(d),
            RunError::Shared(d) => Some(d),
            RunError::Work(e) => Some(e),
        }
    }
}

/// The state shared by a run with a borrowed-concurrency deadline and what fires it.
struct Lease {
    admission: Mutex<Option<Admission>>,
    /// The deadline abandoned the slot (the run answers with `Deadline`).
    expired: AtomicBool,
    /// Wakes a work future waiting in [`RunContext::stopped`].
    waker: Mutex<Option<Waker>>,
    /// The admission's identity and figures, readable without the lock.
    about: About,
    /// The context's stop signal, fired with cause `deadline` on expiry.
    stop: Arc<StopState>,
}

/// What the context tells about a leased admission (an owned one answers itself).
struct About {
    deadline: Option<Duration>,
    id: crate::AdmissionId,
    revision: u64,
    priority: Priority,
    class: Option<ClassId>,
    reservation: Option<Reservation>,
    resources: Resources,
}

impl Lease {
    /// Abandons the slot with cause `deadline`, if the admission is still live and its slot
    /// not yet abandoned; then signals the work.
    fn expire(&self) {
        let mut admission = lock(&self.admission);
        let abandoned = admission
            .as_mut()
            .is_some_and(|a| a.abandon_with_cause(AbandonCause::Deadline));
        if abandoned {
            // Under the lock: a run that settles after this abandonment (it takes the
            // admission under the same lock) must see the flag and answer `Deadline`.
            self.expired.store(true, Ordering::Release);
        }
        drop(admission);
        if abandoned {
            if let Some(w) = lock(&self.waker).take() {
                w.wake();
            }
            self.stop.fire(StopCause::Deadline);
        }
    }
}

/// Why a run's [`StopSignal`] fired.
///
/// ```
/// use llm_bulkhead::llm::StopCause;
/// assert_ne!(StopCause::Deadline, StopCause::Ended);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
pub enum StopCause {
    /// The borrowed-concurrency deadline expired (the slot was abandoned).
    Deadline,
    /// The run is over for its caller: it returned, or its future was dropped (the caller
    /// was cancelled by dropping it). Work handed off elsewhere should stop.
    Ended,
    /// The caller's [`CancelToken`](crate::CancelToken) (`options.wait.cancel`) was cancelled.
    /// Observed when the signal is read or polled, not pushed (see [`StopSignal`]).
    Cancelled,
}

const STOP_NONE: u32 = 0;

fn cause_code(c: StopCause) -> u32 {
    match c {
        StopCause::Deadline => 1,
        StopCause::Ended => 2,
        StopCause::Cancelled => 3,
    }
}

fn code_cause(c: u32) -> Option<StopCause> {
    match c {
        1 => Some(StopCause::Deadline),
        2 => Some(StopCause::Ended),
        3 => Some(StopCause::Cancelled),
        _ => None,
    }
}

/// The fired cause (the first one wins) and the wakers of [`StopSignal::stopped`] futures.
struct StopState {
    cause: crate::sync::AtomicU32,
    wakers: Mutex<Vec<Waker>>,
}

impl Default for StopState {
    fn default() -> Self {
        StopState {
            cause: crate::sync::AtomicU32::new(STOP_NONE),
            wakers: Mutex::new(Vec::new()),
        }
    }
}

impl StopState {
    fn fire(&self, cause: StopCause) {
        let won = self
            .cause
            .compare_exchange(
                STOP_NONE,
                cause_code(cause),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if won {
            for w in std::mem::take(&mut *lock(&self.wakers)) {
                w.wake();
            }
        }
    }

    fn cause(&self) -> Option<StopCause> {
        code_cause(self.cause.load(Ordering::Acquire))
    }
}

/// The stop signal of one run, as an owned handle (`Send`, `Sync`, `'static`): hand it to a
/// task or thread the work starts, so that it learns when to stop. It fires when the
/// borrowed-concurrency deadline expires ([`StopCause::Deadline`]) and when the run is over for
/// its caller: the run returned, or its future was dropped ([`StopCause::Ended`]). The caller's
/// [`CancelToken`](crate::CancelToken) (`options.wait.cancel`) fires it too
/// ([`StopCause::Cancelled`]): a [`stopped`](Self::stopped) future leaves its waker with the
/// token, so `cancel` wakes it.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions, StopCause};
/// use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// let signal = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
///     let s = ctx.stop_signal();
///     assert!(!s.is_stopped());
///     Ok::<_, ()>(s)
/// }).unwrap();
/// assert_eq!(signal.cause(), Some(StopCause::Ended)); // the run returned
/// futures_lite::future::block_on(signal.stopped());
/// ```
#[derive(Clone)]
pub struct StopSignal {
    state: Arc<StopState>,
    caller: Option<crate::CancelToken>,
}

impl StopSignal {
    /// Whether the borrowed-concurrency deadline fired it.
    pub(super) fn deadline_fired(&self) -> bool {
        self.state.cause() == Some(StopCause::Deadline)
    }

    /// Registers `w` to be woken when it fires.
    pub(super) fn register(&self, w: &Waker) {
        let mut ws = lock(&self.state.wakers);
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
    }

    /// Why it fired, if it did (the first cause wins; the caller's token is read now).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.stop_signal().cause(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn cause(&self) -> Option<StopCause> {
        self.state.cause().or_else(|| {
            self.caller
                .as_ref()
                .is_some_and(crate::CancelToken::is_cancelled)
                .then_some(StopCause::Cancelled)
        })
    }

    /// Whether it fired.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.stop_signal().is_stopped()); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn is_stopped(&self) -> bool {
        self.cause().is_some()
    }

    /// A future that completes when the signal fires: the deadline, the end of the run, or the
    /// caller's token (each wakes it).
    ///
    /// # Cancel safety
    /// Dropping it forgets its waker registrations; nothing else changes.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let s = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| Ok::<_, ()>(ctx.stop_signal())).unwrap();
    /// futures_lite::future::block_on(s.stopped()); // already fired: the run ended
    /// ```
    pub fn stopped(&self) -> StopSignalFuture {
        StopSignalFuture {
            signal: self.clone(),
            cancel: self
                .caller
                .clone()
                .map(crate::wait::cancel::CancelWake::new),
        }
    }
}

impl fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopSignal")
            .field("cause", &self.cause())
            .finish()
    }
}

/// The future of [`StopSignal::stopped`].
///
/// # Cancel safety
/// Dropping it changes nothing.
///
/// ```
/// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// let s = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| Ok::<_, ()>(ctx.stop_signal())).unwrap();
/// let f: StopSignalFuture = s.stopped();
/// futures_lite::future::block_on(f);
/// ```
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct StopSignalFuture {
    signal: StopSignal,
    /// The caller's token, woken on `cancel` (`None` without a token).
    cancel: Option<crate::wait::cancel::CancelWake>,
}

impl Future for StopSignalFuture {
    type Output = StopCause;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<StopCause> {
        if let Some(c) = self.signal.cause() {
            return Poll::Ready(c);
        }
        // The caller's cancellation wakes it too: leave the waker with the token.
        if let Some(w) = self.cancel.as_mut() {
            if w.poll_cancelled(cx).is_ready() {
                if let Some(c) = self.signal.cause() {
                    return Poll::Ready(c);
                }
            }
        }
        {
            let mut ws = lock(&self.signal.state.wakers);
            if !ws.iter().any(|w| w.will_wake(cx.waker())) {
                ws.push(cx.waker().clone());
            }
        }
        // Re-check after registering: `fire` stores the cause before taking the wakers.
        match self.signal.cause() {
            Some(c) => Poll::Ready(c),
            None => Poll::Pending,
        }
    }
}

/// The context's part of the stop signal: fires `ended` when the context goes (the run
/// returned or its future was dropped).
#[derive(Default)]
struct StopGuard {
    /// Created on the first [`RunContext::stop_signal`], or with a lease.
    state: Option<Arc<StopState>>,
    /// The caller's token (`options.wait.cancel`).
    caller: Option<crate::CancelToken>,
}

impl Drop for StopGuard {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(s) = &self.state {
            s.fire(StopCause::Ended);
        }
    }
}

/// The timer thread fires `After` deadlines by waking this.
impl Wake for Lease {
    fn wake(self: Arc<Self>) {
        self.expire();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.expire();
    }
}

/// An armed lease: cancels the timer entry and settles the admission when dropped.
struct LeaseGuard {
    lease: Arc<Lease>,
    timer: Option<u64>,
}

impl LeaseGuard {
    fn take(&mut self) -> Option<Admission> {
        if let Some(id) = self.timer.take() {
            crate::wait::timer::cancel(id);
        }
        lock(&self.lease.admission).take()
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Released here (the last report is used) when the work panicked or the future was
        // dropped.
        drop(self.take());
    }
}

/// What the work of a `run` gets: the admission's identity and figures, usage reports,
/// abandonment, and the stop signal of the borrowed-concurrency deadline.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(5_000).build().unwrap(), NaiveEstimator);
/// llm.run_blocking(&LlmRequest::new("m", &["abcd"]), RunOptions::default(), |ctx| {
///     assert_eq!((ctx.revision(), ctx.held()), (0, 1 + 2_048));
///     let r = ctx.report_usage(Usage::new(1, 10), None).unwrap();
///     assert_eq!(r.held, 1 + 2_048);
///     assert!(!ctx.stop_requested());
///     Ok::<_, ()>(())
/// }).unwrap();
/// ```
///
/// # Memory ordering
/// With a deadline the admission sits behind a mutex shared with the deadline, so a usage
/// report and the expiry are ordered by that mutex; the stop flag is stored with `Release`
/// after the abandonment and read with `Acquire`.
pub struct RunContext {
    inner: Inner,
    stop: StopGuard,
}

/// The admission: owned, or (with an armed deadline) shared with the deadline.
enum Inner {
    Owned(Admission),
    Leased(LeaseGuard),
    /// Observe mode ran the work without an admission (boxed: rare, and large).
    Bypassed(Box<Bypassed>),
}

impl RunContext {
    pub(super) fn new(admission: Admission, deadline: Option<Deadline>) -> RunContext {
        let deadline = deadline.filter(|_| admission.resources().borrowed_concurrency);
        let Some(deadline) = deadline else {
            return RunContext {
                inner: Inner::Owned(admission),
                stop: StopGuard::default(),
            };
        };
        let after = match &deadline {
            Deadline::After(d) => Some(*d),
            Deadline::Manual(_) => None,
        };
        let about = About {
            deadline: after,
            id: admission.id(),
            revision: admission.revision(),
            priority: admission.priority(),
            class: admission.class(),
            reservation: admission.reservation(),
            resources: admission.resources(),
        };
        let stop = Arc::new(StopState::default());
        let lease = Arc::new(Lease {
            admission: Mutex::new(Some(admission)),
            expired: AtomicBool::new(false),
            waker: Mutex::new(None),
            about,
            stop: stop.clone(),
        });
        let mut guard = LeaseGuard {
            lease: Arc::clone(&lease),
            timer: None,
        };
        match deadline {
            Deadline::After(d) => {
                // Validated before admission: the sum does not overflow.
                let at = Instant::now().checked_add(d).unwrap_or_else(Instant::now);
                guard.timer = Some(crate::wait::timer::register(at, Waker::from(lease)));
            }
            Deadline::Manual(trigger) => trigger.arm(&lease),
        }
        RunContext {
            inner: Inner::Leased(guard),
            stop: StopGuard {
                state: Some(stop),
                caller: None,
            },
        }
    }

    fn bypassed(b: Bypassed) -> RunContext {
        RunContext {
            inner: Inner::Bypassed(Box::new(b)),
            stop: StopGuard::default(),
        }
    }

    /// Makes the stop signal also read the caller's token.
    #[inline(always)]
    pub(super) fn set_caller(&mut self, caller: Option<crate::CancelToken>) {
        if caller.is_some() {
            self.stop.caller = caller;
        }
    }

    /// The run's stop signal as an owned handle, for a task or thread the work starts: it
    /// fires on the borrowed-concurrency deadline, when the run is over for its caller (it
    /// returned, or its future was dropped), and reads the caller's token (see
    /// [`StopSignal`]).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions, StopCause};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let helper = std::thread::spawn(move || {
    ///     let s: llm_bulkhead::llm::StopSignal = rx.recv().unwrap();
    ///     futures_lite::future::block_on(s.stopped()) // woken when the run ends
    /// });
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     tx.send(ctx.stop_signal()).unwrap();
    ///     Ok::<_, ()>(())
    /// }).unwrap();
    /// assert_eq!(helper.join().unwrap(), StopCause::Ended);
    /// ```
    pub fn stop_signal(&mut self) -> StopSignal {
        let state = self.stop.state.get_or_insert_with(Default::default).clone();
        StopSignal {
            state,
            caller: self.stop.caller.clone(),
        }
    }

    /// With an armed deadline: the stop signal and the error the run answers on expiry.
    pub(super) fn deadline_watch(&mut self) -> Option<(StopSignal, DeadlineExpired)> {
        let Inner::Leased(g) = &self.inner else {
            return None;
        };
        let x = &g.lease.about;
        let expired = DeadlineExpired {
            deadline: x.deadline,
            admission_id: x.id,
            revision: x.revision,
            class: x.class,
            resources: x.resources,
        };
        Some((self.stop_signal(), expired))
    }

    /// Whether the caller's token was cancelled.
    fn caller_cancelled(&self) -> bool {
        self.stop
            .caller
            .as_ref()
            .is_some_and(crate::CancelToken::is_cancelled)
    }

    /// Reads the owned admission, the leased one's description, or the bypass.
    fn read<T>(
        &self,
        owned: impl FnOnce(&Admission) -> T,
        leased: impl FnOnce(&About) -> T,
        bypassed: impl FnOnce(&Bypassed) -> T,
    ) -> T {
        match &self.inner {
            Inner::Owned(a) => owned(a),
            Inner::Leased(g) => leased(&g.lease.about),
            Inner::Bypassed(b) => bypassed(b),
        }
    }

    /// Runs `f` on the admission (under the lease's lock when leased); `None` once settled
    /// or when bypassed.
    fn with<T>(&mut self, f: impl FnOnce(&mut Admission) -> T) -> Option<T> {
        match &mut self.inner {
            Inner::Owned(a) => Some(f(a)),
            Inner::Leased(g) => lock(&g.lease.admission).as_mut().map(f),
            Inner::Bypassed(_) => None,
        }
    }

    /// Whether the work holds an admission or was bypassed (observe mode, see [`Mode`]).
    ///
    /// ```
    /// use llm_bulkhead::llm::{AdmissionKind, LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.admission_kind(), AdmissionKind::Admitted); // a slot was free
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn admission_kind(&self) -> AdmissionKind {
        match &self.inner {
            Inner::Bypassed(_) => AdmissionKind::Bypassed,
            _ => AdmissionKind::Admitted,
        }
    }

    /// The reason of the refusal observe mode bypassed (`None` when admitted).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::{Bulkhead, RejectReason};
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_reason(), Some(RejectReason::ConcurrencyLimit));
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn bypass_reason(&self) -> Option<crate::RejectReason> {
        self.bypass_detail().map(|r| r.reason)
    }

    /// The refusal observe mode bypassed, with its constraint, revision and capacity detail
    /// (`None` when admitted).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_detail().unwrap().detail.max_concurrent, 0);
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn bypass_detail(&self) -> Option<&crate::Rejection> {
        match &self.inner {
            Inner::Bypassed(b) => Some(&b.rejection),
            _ => None,
        }
    }

    /// Whether the bypass raced: the advisory check said "admit" and the real decision
    /// refused (a queue timeout, typically). `None` when admitted.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_raced(), Some(false)); // the advisory check refused
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn bypass_raced(&self) -> Option<bool> {
        match &self.inner {
            Inner::Bypassed(b) => Some(b.raced),
            _ => None,
        }
    }

    /// The admission's id.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.admission_id().to_string().len(), 36); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn admission_id(&self) -> crate::AdmissionId {
        self.read(Admission::id, |x| x.id, |b| b.id)
    }

    /// The revision of the limits that authorised the admission.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).initial_revision(7).build().unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.revision(), 7); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn revision(&self) -> u64 {
        self.read(Admission::revision, |x| x.revision, Bypassed::revision)
    }

    /// The priority.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::{Bulkhead, Priority};
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.priority(), Priority::Normal); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn priority(&self) -> Priority {
        self.read(Admission::priority, |x| x.priority, |b| b.priority)
    }

    /// The admission class (`None` without classes).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.class(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn class(&self) -> Option<ClassId> {
        self.read(Admission::class, |x| x.class, |b| b.class)
    }

    /// The reservation taken (`None` without a budget): what `estimate` previewed.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.reservation(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn reservation(&self) -> Option<Reservation> {
        self.read(Admission::reservation, |x| x.reservation, |b| b.reservation)
    }

    /// What the admission borrowed from the shared remainder.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.resources().borrowed_concurrency); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn resources(&self) -> Resources {
        self.read(
            Admission::resources,
            |x| x.resources,
            |_| Resources::default(),
        )
    }

    /// Tokens currently held (0 for bypassed work).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.held(), 0); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn held(&mut self) -> u64 {
        self.with(|a| a.held()).unwrap_or(0)
    }

    /// Reports cumulative usage ([`Admission::report_usage`]). Bypassed work (observe mode)
    /// is validated and clamped the same way but holds nothing (`held` is 0, no overrun or
    /// refund is booked); its sequence moves only when the clamped usage changes.
    ///
    /// # Errors
    /// As [`Admission::report_usage`]; nothing changes.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::{Bulkhead, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(1_200).build().unwrap(),
    ///     |_: &LlmRequest| Ok(llm_bulkhead::Reservation::new(100, 1_000).unwrap()));
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.report_usage(Usage::new(20, 5), None).unwrap().held, 1_020);
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn report_usage(
        &mut self,
        usage: Usage,
        reconcile: Option<Reconcile>,
    ) -> Result<UsageReport, UsageError> {
        if let Inner::Bypassed(b) = &mut self.inner {
            return b.report_usage(usage, reconcile);
        }
        match self.with(|a| a.report_usage(usage, reconcile)) {
            Some(r) => r,
            // Unreachable while the work runs: the admission is settled only after it.
            None => Err(UsageError::Overflow { field: "admission" }),
        }
    }

    /// Returns a borrowed slot early ([`Admission::abandon_borrowed_concurrency`], cause
    /// `manual`). A deadline that fires later then does nothing (reference §6.2). Bypassed
    /// work holds no slot: `false`. The tokens stay held until the work ends. Returning the
    /// slot is an in-process bound, not proof that the provider stopped generating (see
    /// [`Admission::abandon_borrowed_concurrency`] for what it guarantees).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.abandon_borrowed_concurrency()); // no classes: never borrowed
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn abandon_borrowed_concurrency(&mut self) -> bool {
        self.with(Admission::abandon_borrowed_concurrency)
            .unwrap_or(false)
    }

    /// Whether the work should stop: the borrowed-concurrency deadline expired (the slot is
    /// gone; its tokens are settled when it returns), or the caller's token
    /// (`options.wait.cancel`) was cancelled.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.stop_requested()); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn stop_requested(&self) -> bool {
        let expired = match &self.inner {
            Inner::Owned(_) | Inner::Bypassed(_) => false,
            Inner::Leased(g) => g.lease.expired.load(Ordering::Acquire),
        };
        expired || self.caller_cancelled()
    }

    /// A future that completes when the deadline expires (never, without an armed deadline),
    /// or when the caller's token (`options.wait.cancel`) is cancelled; both wake it: race it
    /// against the provider call.
    ///
    /// # Cancel safety
    /// Dropping it changes nothing.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// use futures_lite::future;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let out = future::block_on(llm.run(&LlmRequest::default(), RunOptions::default(), async |ctx| {
    ///     // No deadline: the work's own branch wins.
    ///     Ok::<_, ()>(future::or(async { 1 }, async { ctx.stopped().await; 2 }).await)
    /// }));
    /// assert_eq!(out.unwrap(), 1);
    /// ```
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped {
            ctx: self,
            cancel: self
                .stop
                .caller
                .clone()
                .map(crate::wait::cancel::CancelWake::new),
        }
    }

    /// Settles the admission with `usage` (invalid usage falls back to the last report) and
    /// says whether the deadline expired. Consumes the context: nothing can read it after.
    fn finish(self, usage: Option<Usage>) -> Option<DeadlineExpired> {
        match self.inner {
            Inner::Owned(a) => {
                release(a, usage);
                None
            }
            Inner::Bypassed(mut b) => {
                b.finish(usage);
                None
            }
            Inner::Leased(mut g) => {
                if let Some(a) = g.take() {
                    release(a, usage);
                }
                let x = &g.lease.about;
                g.lease
                    .expired
                    .load(Ordering::Acquire)
                    .then_some(DeadlineExpired {
                        deadline: x.deadline,
                        admission_id: x.id,
                        revision: x.revision,
                        class: x.class,
                        resources: x.resources,
                    })
            }
        }
    }
}

/// Releases `a` with `usage`; invalid usage falls back to the last report.
fn release(a: Admission, usage: Option<Usage>) {
    match usage {
        // Dropping releases with the last report, as `release(None)` does.
        None => drop(a),
        Some(u) => {
            if let Err(e) = a.release(Some(u)) {
                drop(e.admission);
            }
        }
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("admission", &self.admission_kind())
            .field("admission_id", &self.admission_id())
            .field("revision", &self.revision())
            .field("reservation", &self.reservation())
            .field("resources", &self.resources())
            .field("stop_requested", &self.stop_requested())
            .finish_non_exhaustive()
    }
}

/// The future of [`RunContext::stopped`].
///
/// # Cancel safety
/// Dropping it changes nothing.
///
/// ```
/// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
///     let _pending: Stopped<'_> = ctx.stopped(); Ok::<_, ()>(()) }).unwrap();
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Stopped<'a> {
    ctx: &'a RunContext,
    /// The caller's token, woken on `cancel` (`None` without a token).
    cancel: Option<crate::wait::cancel::CancelWake>,
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // The caller's cancellation (registered with the token, so `cancel` wakes it).
        if let Some(w) = self.cancel.as_mut() {
            if w.poll_cancelled(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        let Inner::Leased(g) = &self.ctx.inner else {
            return Poll::Pending;
        };
        if g.lease.expired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        *lock(&g.lease.waker) = Some(cx.waker().clone());
        // Re-check after registering: `expire` sets the flag before taking the waker.
        if g.lease.expired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl fmt::Debug for Stopped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Stopped(..)")
    }
}

/// A bulkhead with a token estimator: turns requests into demands, previews them, and runs
/// work under an admission (reference §9).
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ModelAwareEstimator, RunOptions};
/// use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(
///     Bulkhead::builder().max_concurrent(4).token_budget(10_000).build().unwrap(),
///     ModelAwareEstimator::default(),
/// );
/// let request = LlmRequest::new("gpt-4o", &[&"x".repeat(37)]);
/// assert_eq!(llm.estimate(&request, &RunOptions::default()).unwrap().unwrap().input(), 10);
/// ```
#[derive(Clone)]
pub struct LlmBulkhead {
    pub(super) bulkhead: Bulkhead,
    pub(super) estimator: Arc<dyn TokenEstimator>,
    /// The bulkhead-level de-duplication (`None`: off), see [`LlmBulkhead::with_dedup`].
    pub(super) dedup: Option<Arc<super::shared_run::SharedDedup>>,
}

impl fmt::Debug for LlmBulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmBulkhead")
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl LlmBulkhead {
    /// A front end for `bulkhead` that estimates with `estimator`.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// # let _ = llm;
    /// ```
    pub fn new(bulkhead: Bulkhead, estimator: impl TokenEstimator + 'static) -> LlmBulkhead {
        LlmBulkhead::with_shared_estimator(bulkhead, Arc::new(estimator))
    }

    /// A front end sharing `estimator` (an adaptive estimator the application also feeds,
    /// for example).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead; use std::sync::Arc;
    /// let shared: Arc<dyn TokenEstimator> = Arc::new(NaiveEstimator);
    /// let llm = LlmBulkhead::with_shared_estimator(Bulkhead::new(1).unwrap(), shared.clone());
    /// # let _ = llm;
    /// ```
    pub fn with_shared_estimator(
        bulkhead: Bulkhead,
        estimator: Arc<dyn TokenEstimator>,
    ) -> LlmBulkhead {
        LlmBulkhead {
            bulkhead,
            estimator,
            dedup: None,
        }
    }

    /// The bulkhead.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(3).unwrap(), NaiveEstimator);
    /// assert_eq!(llm.bulkhead().limits().max_concurrent, 3);
    /// ```
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// Exactly what admission will reserve for `request` with `options`: `None` without a
    /// token budget; with one, the per-call override (checked for consistency) or else the
    /// estimator's answer. Changes nothing.
    ///
    /// # Errors
    /// [`EstimateError`] from the estimator or the override, naming the field.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ReservationOverride, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Reservation};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(5, 5).unwrap()));
    /// let r = LlmRequest::default();
    /// assert_eq!(llm.estimate(&r, &RunOptions::default()).unwrap().unwrap().total(), 10);
    /// let o = RunOptions { reservation: Some(ReservationOverride { input: 300, max_output: 400, reserved: None }), ..Default::default() };
    /// assert_eq!(llm.estimate(&r, &o).unwrap().unwrap().total(), 700);
    /// ```
    pub fn estimate<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Option<Reservation>, EstimateError> {
        if !self.bulkhead.shared.has_budget {
            return Ok(None);
        }
        match options.reservation {
            Some(o) => o.resolve().map(Some),
            None => self.estimator.estimate(request).map(Some),
        }
    }

    /// The demand `run` would make for `request` with `options`.
    pub(super) fn demand<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Demand, EstimateError> {
        let mut d = match self.estimate(request, options)? {
            Some(r) => Demand::tokens(r),
            None => Demand::slot(),
        };
        d = d.with_priority(options.priority);
        if let Some(c) = options.class {
            d = d.in_class(c);
        }
        Ok(d)
    }

    /// Would `run` admit `request` now? Advisory: it takes nothing, counts nothing and emits
    /// no event ([`Bulkhead::would_admit`], including its note on precision).
    ///
    /// # Errors
    /// As [`estimate`](Self::estimate): validation comes first, before the closed check.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    /// use llm_bulkhead::{Bulkhead, RejectReason, Reservation};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(100).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(90, 20).unwrap()));
    /// let advice = llm.would_admit(&LlmRequest::default(), &RunOptions::default()).unwrap();
    /// assert_eq!(advice.reason(), Some(RejectReason::BudgetLimit));
    /// assert_eq!(advice.detail().token_budget.unwrap().requested, 110);
    /// ```
    pub fn would_admit<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Advice, EstimateError> {
        Ok(self.bulkhead.would_admit(&self.demand(request, options)?))
    }

    /// Validates the deadline option before anything changes.
    /// `run` and `run_blocking` cannot detach their work.
    fn check_no_detach<U, E>(options: &RunOptions<U>) -> Result<(), RunError<E>> {
        match options.detach_at_deadline {
            None => Ok(()),
            Some(_) => Err(RunError::Invalid(EstimateError::InvalidSetting {
                field: "detach_at_deadline",
                expected: "none: only run_shared can detach its work",
            })),
        }
    }

    pub(super) fn check_deadline<E>(d: &Option<Deadline>) -> Result<(), RunError<E>> {
        if let Some(Deadline::After(d)) = d {
            if d.is_zero() || Instant::now().checked_add(*d).is_none() {
                return Err(RunError::Invalid(EstimateError::InvalidSetting {
                    field: "borrowed_concurrency_deadline",
                    expected: "above zero and representable as an instant",
                }));
            }
        }
        Ok(())
    }

    /// Admits `request` (waiting in the queue if the bulkhead queues), runs `work` on this
    /// thread with a [`RunContext`], and releases: on success with the usage
    /// `options.usage` takes from the result (else the last report), on error and on panic
    /// with the last report. Nothing leaks, whatever `work` does.
    ///
    /// With a borrowed-concurrency deadline (applies only when the admission's slot was
    /// borrowed), expiry abandons the slot (cause `deadline`) and sets
    /// [`RunContext::stop_requested`]; when `work` returns, its tokens are settled and the
    /// answer is [`RunError::Deadline`] (the result is dropped). A deadline that finds the slot
    /// already abandoned does nothing.
    ///
    /// # When the caller hears of the deadline
    /// Here, only when `work` returns: it runs on the caller's thread, so nothing can answer
    /// the caller before it does. This differs from the seed, where the caller is rejected at
    /// expiry and the callback goes on in the background: a blocking closure cannot be
    /// detached from the thread that runs it. Work that must answer at expiry polls
    /// [`RunContext::stop_requested`] (or waits on a [`StopSignal`] in a helper) and returns.
    /// The async [`run`](Self::run) can answer at expiry; see there.
    ///
    /// In observe mode (`options.mode`, see [`Mode`]) a refusal for one of the shadow reasons
    /// runs `work` anyway, bypassed: without an admission, holding nothing, reported by its
    /// own events and `stats().observe`. `shutdown` and `aborted` are still answered.
    ///
    /// # Errors
    /// [`RunError::Invalid`] (before anything changes), [`RunError::Rejected`],
    /// [`RunError::Deadline`], or the work's own error as [`RunError::Work`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Reservation, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(500).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(250, 250).unwrap()));
    /// let options = RunOptions::default().with_usage(|u: &Usage| Some(*u));
    /// let u = llm.run_blocking(&LlmRequest::default(), options, |_| Ok::<_, ()>(Usage::new(80, 40))).unwrap();
    /// let t = llm.bulkhead().stats().token_budget.unwrap();
    /// assert_eq!((t.in_flight_tokens, t.total_consumed, t.total_refunded), (0, 120, 380));
    /// # let _ = u;
    /// ```
    pub fn run_blocking<R, E, U, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> Result<R, RunError<E>>
    where
        U: UsageFrom<R>,
        F: FnOnce(&mut RunContext) -> Result<R, E>,
    {
        Self::check_deadline(&options.borrowed_concurrency_deadline)?;
        Self::check_no_detach(&options)?;
        let demand = self.demand(request, &options).map_err(RunError::Invalid)?;
        let RunOptions {
            wait,
            borrowed_concurrency_deadline,
            usage,
            mode,
            ..
        } = options;
        let caller = wait.cancel.clone();
        let mut ctx = match admit_now(&self.bulkhead, &demand, &wait) {
            Some(a) => RunContext::new(a, borrowed_concurrency_deadline),
            None => match mode {
                Mode::Enforce => {
                    let a = self
                        .bulkhead
                        .acquire_blocking(demand, wait)
                        .map_err(RunError::Rejected)?;
                    RunContext::new(a, borrowed_concurrency_deadline)
                }
                Mode::Observe(shadow) => self
                    .observe_blocking(demand, wait, shadow, borrowed_concurrency_deadline)
                    .map_err(RunError::Rejected)?,
            },
        };
        ctx.set_caller(caller);
        let out = work(&mut ctx);
        settle(ctx, out, &usage)
    }

    /// The observe-mode decision of `run_blocking` after the fast decision declined (see
    /// [`Mode`]): the advisory check, the real acquire, and the bypass.
    #[inline(never)]
    fn observe_blocking(
        &self,
        demand: Demand,
        wait: WaitOptions,
        shadow: ShadowReasons,
        deadline: Option<Deadline>,
    ) -> Result<RunContext, Rejection> {
        let advised = match self.advise(&demand, shadow) {
            Ok(admits) => admits,
            Err(rej) => return self.bypass(&demand, &wait, rej, false),
        };
        match self.bulkhead.acquire_blocking(demand, wait.clone()) {
            Ok(a) => Ok(RunContext::new(a, deadline)),
            Err(rej) if shadow.contains(rej.reason) => self.bypass(&demand, &wait, rej, advised),
            Err(rej) => Err(rej),
        }
    }

    /// The async [`observe_blocking`](Self::observe_blocking).
    pub(super) async fn observe_async(
        &self,
        demand: Demand,
        wait: WaitOptions,
        shadow: ShadowReasons,
        deadline: Option<Deadline>,
    ) -> Result<RunContext, Rejection> {
        let advised = match self.advise(&demand, shadow) {
            Ok(admits) => admits,
            Err(rej) => return self.bypass(&demand, &wait, rej, false),
        };
        match self.bulkhead.acquire(demand, wait.clone()).await {
            Ok(a) => Ok(RunContext::new(a, deadline)),
            Err(rej) if shadow.contains(rej.reason) => self.bypass(&demand, &wait, rej, advised),
            Err(rej) => Err(rej),
        }
    }

    /// The advisory step of observe mode: `Err` with the refusal when it refuses for a shadow
    /// reason (bypass at once), else whether it said "admit".
    fn advise(&self, demand: &Demand, shadow: ShadowReasons) -> Result<bool, Rejection> {
        match self.bulkhead.would_admit(demand) {
            Advice::Refuse(rej) if shadow.contains(rej.reason) => Err(rej),
            advice => Ok(advice.admits()),
        }
    }

    /// Runs the work of `demand`, refused with `rejection`, as bypassed: after the hard check
    /// (`aborted`, `shutdown`), which is never bypassed.
    #[cold]
    fn bypass(
        &self,
        demand: &Demand,
        wait: &WaitOptions,
        rejection: Rejection,
        raced: bool,
    ) -> Result<RunContext, Rejection> {
        if let Some(hard) = hard_refusal(&self.bulkhead, demand, wait) {
            return Err(hard);
        }
        Ok(RunContext::bypassed(Bypassed::begin(
            &self.bulkhead,
            demand,
            rejection,
            raced,
        )))
    }

    /// The async [`run_blocking`](Self::run_blocking): waits for a slot with the async
    /// [`acquire`](Bulkhead::acquire), then awaits `work(&mut ctx)`. Works on any executor
    /// (deadlines run on the crate's timer thread). The request is validated and estimated
    /// when `run` is called, so the future does not borrow it.
    ///
    /// # When the caller hears of the deadline
    /// When `work` returns, as with [`run_blocking`](Self::run_blocking), unless the work
    /// races [`RunContext::stopped`] against its provider call: then the caller is answered
    /// [`RunError::Deadline`] at expiry, whatever the work returns:
    ///
    /// ```
    /// use futures_lite::future;
    /// use llm_bulkhead::llm::{Deadline, DeadlineTrigger, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions};
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default())
    ///     .default_class("batch").build().unwrap(); // every slot borrowed
    /// let llm = LlmBulkhead::new(b, NaiveEstimator);
    /// let trigger = DeadlineTrigger::new();
    /// let options = RunOptions { borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())), ..RunOptions::default() };
    /// let r = future::block_on(llm.run(&LlmRequest::default(), options, async |ctx| {
    ///     let provider_call = future::pending::<Result<&str, ()>>(); // never answers
    ///     trigger.fire(); // (a clock deadline fires on the timer thread)
    ///     future::or(provider_call, async { ctx.stopped().await; Err(()) }).await
    /// }));
    /// assert!(matches!(r, Err(RunError::Deadline(_))));
    /// ```
    ///
    /// The provider call is then dropped, not detached: the work's future borrows its context
    /// and is not `'static`, so it cannot outlive the run, and the tokens are settled at once
    /// with the last usage report. The seed's detached callback, which keeps its tokens until
    /// it settles, needs work that owns its context and an executor to go on running on:
    /// [`run_shared`](Self::run_shared) with [`RunOptions::detach_at_deadline`] offers it
    /// (the caller is answered at expiry and the work is handed to the application's
    /// spawner); `run` refuses that option.
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaks nothing: while it waits for a slot its waiter
    /// leaves the queue (a slot handed to it passes on); once admitted, dropping it drops
    /// the work's future and the context, which releases the admission with the last usage
    /// report, disarms the deadline and fires the run's [`StopSignal`] with
    /// [`StopCause::Ended`] (observe mode: a bypassed run is settled with its last report, and
    /// a `bypass_release` event says so).
    ///
    /// # Errors
    /// As [`run_blocking`](Self::run_blocking).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(2).token_budget(10_000).build().unwrap(), NaiveEstimator);
    /// let fut = llm.run(&LlmRequest::new("m", &["abcd"]), RunOptions::default(), async |ctx| {
    ///     ctx.report_usage(Usage::new(1, 5), None).unwrap();
    ///     Ok::<_, ()>("done")
    /// });
    /// assert_eq!(futures_lite::future::block_on(fut).unwrap(), "done");
    /// let t = llm.bulkhead().stats().token_budget.unwrap();
    /// assert_eq!((t.in_flight_tokens, t.total_consumed), (0, 6));
    /// ```
    pub fn run<'a, R, E, U, F>(
        &'a self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> impl Future<Output = Result<R, RunError<E>>> + 'a
    where
        R: 'a,
        E: 'a,
        U: UsageFrom<R> + 'a,
        F: AsyncFnOnce(&mut RunContext) -> Result<R, E> + 'a,
    {
        // Validation and estimation happen now, so the future does not borrow the request.
        let prepared = Self::check_deadline(&options.borrowed_concurrency_deadline)
            .and_then(|()| Self::check_no_detach(&options))
            .and_then(|()| self.demand(request, &options).map_err(RunError::Invalid));
        async move {
            let demand = prepared?;
            let RunOptions {
                wait,
                borrowed_concurrency_deadline,
                usage,
                mode,
                ..
            } = options;
            let caller = wait.cancel.clone();
            let mut ctx = match admit_now(&self.bulkhead, &demand, &wait) {
                Some(a) => RunContext::new(a, borrowed_concurrency_deadline),
                None => match mode {
                    Mode::Enforce => {
                        // Boxed: the queue node is large, and the future of every run would
                        // carry it.
                        let a = Box::pin(self.bulkhead.acquire(demand, wait))
                            .await
                            .map_err(RunError::Rejected)?;
                        RunContext::new(a, borrowed_concurrency_deadline)
                    }
                    // Boxed for the same reason.
                    Mode::Observe(shadow) => Box::pin(self.observe_async(
                        demand,
                        wait,
                        shadow,
                        borrowed_concurrency_deadline,
                    ))
                    .await
                    .map_err(RunError::Rejected)?,
                },
            };
            ctx.set_caller(caller);
            let out = work(&mut ctx).await;
            settle(ctx, out, &usage)
        }
    }
}

/// The fast decision alone (no cancellation token): the admission if a slot is free and
/// nobody waits, else `None`, having changed and counted nothing, so that the waiting acquire
/// decides again (and counts its refusal) exactly as without this step. It saves building a
/// queue node when none is needed.
///
/// With classes it is the fast attempt of the class protocol (`classed::try_fast`, which
/// declines whenever anyone waits and undoes anything it did when it declines), counted as
/// [`Bulkhead::try_acquire`] counts its success; the full protocol is left to the waiting
/// acquire. Not [`Bulkhead::try_acquire`] itself: its refusal is counted and reported, and the
/// waiting acquire would then count the same demand's refusal a second time.
#[inline]
pub(super) fn admit_now(b: &Bulkhead, demand: &Demand, wait: &WaitOptions) -> Option<Admission> {
    let shared = &*b.shared;
    if wait.cancel.is_some() {
        return None;
    }
    let reservation = shared
        .has_budget
        .then(|| demand.reservation().unwrap_or(Reservation::ZERO));
    let r = reservation.map_or(0, |r| r.total());
    let priority = demand.priority();
    let g = if shared.classed {
        let k = b.class_index(demand.class());
        let a = crate::protocol::classed::try_fast(shared, k, r, priority)?;
        b.count_class_admission(k, r, a.revision, a.resources)
    } else {
        b.try_decide(r, priority).ok()?
    };
    Some(b.admission_from(g, priority, reservation))
}

/// Releases the admission of a finished work and builds the answer.
pub(super) fn settle<R, E, U: UsageFrom<R>>(
    ctx: RunContext,
    out: Result<R, E>,
    usage: &U,
) -> Result<R, RunError<E>> {
    match out {
        Ok(r) => match ctx.finish(usage.usage_from(&r)) {
            Some(d) => Err(RunError::Deadline(d)),
            None => Ok(r),
        },
        Err(e) => Err(match ctx.finish(None) {
            Some(d) => RunError::Deadline(d),
            None => RunError::Work(e),
        }),
    }
}
