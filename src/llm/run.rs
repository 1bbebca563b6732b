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
//!     assert_eq!(ctx.reservation().unwrap().total(), 4 + 7 + 2_048); // text, message, output
//!     Ok::<_, std::io::Error>(("hi".to_owned(), Usage::new(3, 1)))
//! })?;
//! assert_eq!(text, "hi");
//!
//! // Async work, on any executor.
//! let n = futures_lite::future::block_on(llm.run(&request, RunOptions::default(), async |ctx| {
//!     ctx.report_usage(Usage::new(3, 0)).unwrap();
//!     Ok::<_, std::io::Error>(42)
//! }))?;
//! assert_eq!(n, 42);
//! assert_eq!(llm.bulkhead().stats().in_flight, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::dedup::DedupError;
use super::estimate::{EstimateError, ReservationOverride, TokenEstimator};
use super::observe::id::RunId;
use super::observe::stats::ObserveCounters;
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

mod acquire;
#[cfg(feature = "cluster")]
mod cluster;
mod context;
mod llm_bulkhead;
mod timed;
pub use acquire::AcquireError;
pub use context::{RunContext, Stopped};
pub use llm_bulkhead::LlmBulkhead;
pub(super) use llm_bulkhead::{acquire_noting, admit_now, race_deadline, settle, settle_raced};
use timed::AdmittedTimes;
pub(super) use timed::{NoWatch, Stopwatch};
pub use timed::{RunTimed, RunTiming};

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
    #[must_use]
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
    #[must_use]
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
/// held until the work ends, and a drain counts the admission until then. When the caller is
/// answered depends on the entry point (contract §12): the async
/// [`run`](LlmBulkhead::run) at expiry (the work's future is dropped then, which ends it),
/// [`run_blocking`](LlmBulkhead::run_blocking) when the work returns (it runs on the caller's
/// thread), [`run_shared`](LlmBulkhead::run_shared) with
/// [`detach_at_deadline`](RunOptions::detach_at_deadline) at expiry while the work goes on.
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
    /// bulkhead without it. [`LlmBulkhead::run_shared`] and [`LlmBulkhead::run_shared_with`]
    /// de-duplicate; `run` and `run_blocking` cannot (their work is neither `Send` nor
    /// `'static`), so on a bulkhead whose de-duplication is enabled they refuse `true` as
    /// [`RunError::Invalid`] (field `dedup`) instead of silently running alone: pass `false`,
    /// or call `run_shared`. The request-level acquires never de-duplicate (the seed's
    /// `acquire()`) and do not read it.
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
/// the work was asked to stop; its tokens were settled when it finished (the async `run`
/// finishes it at expiry by dropping its future). With classes, `class` serialises as the
/// class's name.
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
#[non_exhaustive]
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
#[non_exhaustive]
pub enum RunError<E> {
    /// Refused (the rejection carries the reason and the capacity detail).
    Rejected(Rejection),
    /// The request or an option is invalid (the error names the field); nothing changed.
    Invalid(EstimateError),
    /// The borrowed-concurrency deadline expired.
    Deadline(DeadlineExpired),
    /// A de-duplication follower ([`LlmBulkhead::run_shared`]) got no result: its own timeout
    /// passed ([`DedupError::Timeout`]) or the leader's result could not be shared with it
    /// ([`DedupError::Unshareable`]), or its own token was cancelled
    /// ([`DedupError::Cancelled`]). Counted in [`DedupStats`](super::DedupStats) and seen as a
    /// `dedup` event, and counted as a refusal of this caller (reasons `timeout`,
    /// `unshareable_result`, `aborted`) with a `reject` event.
    Shared(DedupError),
    /// The work's own error.
    Work(E),
    /// A cluster-managed bulkhead ([`LlmBulkhead::clustered`], feature `cluster`): the
    /// replica's share had lapsed at the commit (nothing ran; the admission was given back at
    /// once), or the admission deadline cut the work ([`ClusterRunError::Cut`]: the async
    /// `run` drops the work's future there, `run_blocking` answers so when the work returns;
    /// tokens settled with the last usage report either way).
    ///
    /// [`ClusterRunError::Cut`]: crate::cluster::ClusterRunError::Cut
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    Cluster(crate::cluster::ClusterRunError),
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Rejected(r) => write!(f, "LLM bulkhead rejected: {r}"),
            RunError::Invalid(e) => write!(f, "invalid run: {e}"),
            RunError::Deadline(d) => d.fmt(f),
            RunError::Shared(d) => write!(f, "de-duplicated run: {d}"),
            RunError::Work(e) => e.fmt(f),
            #[cfg(feature = "cluster")]
            RunError::Cluster(e) => write!(f, "cluster: {e}"),
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
            #[cfg(feature = "cluster")]
            RunError::Cluster(e) => Some(e),
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
pub(super) struct About {
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
#[non_exhaustive]
pub enum StopCause {
    /// The borrowed-concurrency deadline expired (the slot was abandoned).
    Deadline,
    /// The run is over for its caller: it returned, or its future was dropped (the caller
    /// was cancelled by dropping it). Work handed off elsewhere should stop.
    Ended,
    /// The caller's [`CancelToken`](crate::CancelToken) (`options.wait.cancel`) was cancelled.
    /// Observed when the signal is read or polled, not pushed (see [`StopSignal`]).
    Cancelled,
    /// The admission deadline of a cluster-managed bulkhead passed (`max_admission` after the
    /// admission, fired by the cluster agent's step; feature `cluster`): the work must end.
    Cut,
}

const STOP_NONE: u32 = 0;

fn cause_code(c: StopCause) -> u32 {
    match c {
        StopCause::Deadline => 1,
        StopCause::Ended => 2,
        StopCause::Cancelled => 3,
        StopCause::Cut => 4,
    }
}

fn code_cause(c: u32) -> Option<StopCause> {
    match c {
        1 => Some(StopCause::Deadline),
        2 => Some(StopCause::Ended),
        3 => Some(StopCause::Cancelled),
        4 => Some(StopCause::Cut),
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
/// borrowed-concurrency deadline expires ([`StopCause::Deadline`]), at a cluster admission's
/// deadline ([`StopCause::Cut`], on a bulkhead built with `LlmBulkhead::clustered`), and
/// when the run is over for
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
    /// Whether a deadline fired it: the borrowed-concurrency deadline, or a cluster
    /// admission's (the run answers then, without waiting for the work).
    pub(super) fn deadline_fired(&self) -> bool {
        matches!(
            self.state.cause(),
            Some(StopCause::Deadline | StopCause::Cut)
        )
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
    #[must_use]
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
    #[must_use]
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
pub(super) struct StopGuard {
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
pub(super) struct LeaseGuard {
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
