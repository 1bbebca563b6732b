//! Events (reference §10.2): admissions, refusals, usage reports, releases, reconfigurations,
//! borrowed-concurrency abandonments and observe-mode bypasses, delivered synchronously to
//! subscribers.
//!
//! ```
//! use llm_bulkhead::{Bulkhead, Demand, Event};
//! use std::sync::{Arc, Mutex};
//!
//! let b = Bulkhead::new(1).unwrap();
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! let sub = b.subscribe(move |e: &Event| log.lock().unwrap().push(e.name()));
//! drop(b.try_acquire(Demand::slot()).unwrap());
//! let _ = b.try_acquire(Demand::slot()).map(|a| { let _ = b.try_acquire(Demand::slot()); a });
//! drop(sub); // unsubscribes
//! drop(b.try_acquire(Demand::slot()).unwrap());
//! assert_eq!(*seen.lock().unwrap(), ["admit", "release", "admit", "reject", "release"]);
//! ```
//!
//! # Cost when nobody subscribes
//!
//! An admission (`try_acquire`, `acquire`, `acquire_blocking`) pays one `Relaxed` load of a
//! read-mostly flag that lives in the shared state next to the other construction-time
//! settings, never on the cache line of the contended state word, and a branch to an
//! out-of-line `#[cold]` function. The admission remembers the answer in a bit it already
//! carries, so its release reads no flag at all: the plain release tests the same bit mask as
//! before. The other hooks (`report_usage`, abandonment, `apply_limits`, the refusal paths)
//! are one flag load each, off the pair's path.
//!
//! A consequence: a release is reported when its admission was made while someone
//! subscribed. A subscriber therefore sees the release of every admission it saw admitted
//! (while it stays subscribed), and not the releases of admissions made before anyone
//! subscribed.
//!
//! # Delivery
//!
//! Subscribers run synchronously on the thread that caused the event, in subscription order.
//! A release (and an abandonment) is reported after the capacity went back, so a subscriber
//! sees the state the event left. Subscribers may re-enter the bulkhead (acquire, release,
//! `apply_limits`, even subscribe or unsubscribe): the list is copied out of its lock before
//! any subscriber runs. A subscriber that panics is caught, counted in
//! [`Stats::subscriber_panics`](crate::Stats::subscriber_panics), and the others still run;
//! accounting is never affected, because every hook runs after its state change is complete.
//!
//! Events carry what the core knows: ids, revision, priority, class, token figures. Unlike the
//! reference they do not carry the request (the core never sees it); correlate by
//! `admission_id`. The reference's timing fields (`decisionDurationNs`, `queueWaitNs`) are not
//! carried either: reading a clock on every admission is not free (use
//! [`Bulkhead::acquire_blocking_timed`](crate::Bulkhead::acquire_blocking_timed)).
//!
//! # Memory ordering
//!
//! The flag is written only under the subscriber lock and read `Relaxed`: a subscription made
//! concurrently with an operation may or may not see that operation's event; one that
//! happens-before an operation (for example, made earlier on the same thread) always does,
//! because the flag store happens-before the load by program order or by whatever
//! synchronisation ordered the two threads. The subscriber list itself is read under its lock.

use crate::sync::{lock, AtomicBool, AtomicU64, Mutex, Ordering};
use crate::vocab::class::Resources;
use crate::vocab::demand::{Priority, Reconcile, Usage};
use crate::vocab::id::AdmissionId;
use crate::vocab::rejection::Rejection;
use crate::words::limits::LimitsChange;
use std::sync::Arc;

/// Why a borrowed slot was abandoned.
///
/// ```
/// use llm_bulkhead::AbandonCause;
/// assert_eq!(AbandonCause::Deadline.as_str(), "deadline");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum AbandonCause {
    /// The application called `abandon_borrowed_concurrency`.
    Manual,
    /// A borrowed-concurrency deadline of `run` expired.
    Deadline,
}

impl AbandonCause {
    /// The snake_case name.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::AbandonCause::Manual.as_str(), "manual");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AbandonCause::Manual => "manual",
            AbandonCause::Deadline => "deadline",
        }
    }
}

/// A successful admission.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event};
/// let b = Bulkhead::new(1).unwrap();
/// let sub = b.subscribe(|e: &Event| if let Event::Admit(a) = e { assert_eq!(a.revision, 0) });
/// drop(b.try_acquire(Demand::slot()));
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AdmitEvent {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The reservation `r` (0 without a budget).
    pub reserved_tokens: u64,
    /// What it borrowed from the shared remainder.
    pub resources: Resources,
}

/// A refusal: the rejection the caller received, and the class it was for.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event, RejectReason};
/// let b = Bulkhead::new(0).unwrap();
/// let sub = b.subscribe(|e: &Event| if let Event::Reject(r) = e {
///     assert_eq!(r.rejection.reason, RejectReason::ConcurrencyLimit)
/// });
/// assert!(b.try_acquire(Demand::slot()).is_err());
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RejectEvent {
    /// The class the demand was for (with classes).
    pub class: Option<String>,
    /// Reason, constraint, revision and capacity detail.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub rejection: Rejection,
}

/// A usage report that changed the usage or the hold (its sequence incremented).
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(1).token_budget(2_000).build().unwrap();
/// let sub = b.subscribe(|e: &Event| if let Event::Usage(u) = e { assert_eq!(u.delta_tokens, -80) });
/// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
/// a.report_usage(Usage::new(20, 5)).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UsageEvent {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The new sequence number.
    pub sequence: u64,
    /// The reservation `r` (0 without a budget).
    pub reserved_tokens: u64,
    /// The hold before the report.
    pub previous_held_tokens: u64,
    /// The hold after it.
    pub held_tokens: u64,
    /// `held − previous` (negative: refund; positive: overrun).
    pub delta_tokens: i64,
    /// The clamped cumulative usage.
    pub usage: Usage,
    /// The reservation's `max_output` (`None` without a budget).
    pub output_cap: Option<u64>,
    /// `max(0, max_output − output)` (`None` without a budget).
    pub output_remaining: Option<u64>,
    /// `consumed > reserved` (false without a budget).
    pub over_reservation: bool,
    /// The progressive reconciliation, when the report had one.
    pub progressive: Option<Reconcile>,
}

/// A release: the whole hold went back.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap();
/// let sub = b.subscribe(|e: &Event| if let Event::Release(r) = e { assert_eq!(r.refunded_tokens, 380) });
/// let a = b.try_acquire(Demand::tokens(Reservation::new(250, 250).unwrap())).unwrap();
/// a.release(Some(Usage::new(80, 40))).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ReleaseEvent {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The reservation `r` (0 without a budget).
    pub reserved_tokens: u64,
    /// What it borrowed at its decision.
    pub resources: Resources,
    /// The hold just before release.
    pub held_tokens: u64,
    /// `max(0, held − consumed)` at release (early refunds not included).
    pub refunded_tokens: u64,
    /// The usage sequence at release.
    pub usage_sequence: u64,
    /// The usage the release used (explicit, else the last report).
    pub usage: Option<Usage>,
}

/// A borrowed slot returned early; the token hold stays until release.
///
/// ```
/// use llm_bulkhead::{AbandonCause, Bulkhead, ClassLimits, Demand, Event};
/// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default())
///     .default_class("batch").build().unwrap();
/// let sub = b.subscribe(|e: &Event| if let Event::BorrowedConcurrencyAbandon(x) = e {
///     assert_eq!(x.cause, AbandonCause::Manual)
/// });
/// let mut a = b.try_acquire(Demand::slot()).unwrap();
/// assert!(a.abandon_borrowed_concurrency());
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AbandonEvent {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name.
    pub class: Option<String>,
    /// What it borrowed at its decision.
    pub resources: Resources,
    /// Why.
    pub cause: AbandonCause,
    /// The hold it keeps until release.
    pub held_tokens: u64,
}

/// Observe-mode work that runs without an admission: `LlmBulkhead::run` was refused for one of
/// its shadow reasons and ran the work anyway, holding nothing (reference §9.4, `bypass`).
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Event, RejectReason};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Event::Bypass(b) = e {
///     assert_eq!((b.reason, b.raced), (RejectReason::ConcurrencyLimit, false));
///     assert!(b.admission_id.is_shadow());
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(())).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassEvent {
    /// The bypass's shadow id ([`AdmissionId::is_shadow`]).
    pub admission_id: AdmissionId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The refusal's reason.
    pub reason: crate::RejectReason,
    /// The refusal's constraint (with classes).
    pub constraint: Option<crate::Constraint>,
    /// The capacity the refusal saw.
    pub detail: crate::CapacityDetail,
    /// The reservation it would have taken (`None` without a budget); nothing is held.
    pub reservation: Option<crate::Reservation>,
    /// The advisory check said "admit" and the real decision refused (a queue timeout, or
    /// capacity taken in between).
    pub raced: bool,
}

/// A usage report of bypassed work that changed its usage (reference `bypassUsage`). Nothing
/// is held, so there is no hold or delta.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Event, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Event::BypassUsage(u) = e {
///     assert_eq!((u.sequence, u.usage), (1, Usage::new(3, 2)));
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// llm.run_blocking(&LlmRequest::default(), observe, |ctx| ctx.report_usage(Usage::new(3, 2))).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassUsageEvent {
    /// The bypass's shadow id.
    pub admission_id: AdmissionId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The bypassed refusal's reason.
    pub reason: crate::RejectReason,
    /// The new sequence number.
    pub sequence: u64,
    /// The reservation it would have taken (`None` without a budget).
    pub reservation: Option<crate::Reservation>,
    /// The clamped cumulative usage.
    pub usage: Usage,
    /// The reservation's `max_output` (`None` without a budget).
    pub output_cap: Option<u64>,
    /// `max(0, max_output − output)` (`None` without a budget).
    pub output_remaining: Option<u64>,
    /// `consumed > reserved` (false without a budget).
    pub over_reservation: bool,
    /// The progressive reconciliation, when the report had one (validated, not applied).
    pub progressive: Option<Reconcile>,
}

/// Bypassed work finished (reference `bypassRelease`); nothing was held, nothing goes back.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Event, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Event::BypassRelease(r) = e {
///     assert_eq!((r.usage_sequence, r.usage), (0, Some(Usage::new(3, 2))));
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() }
///     .with_usage(|u: &Usage| Some(*u));
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(Usage::new(3, 2))).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassReleaseEvent {
    /// The bypass's shadow id.
    pub admission_id: AdmissionId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The bypassed refusal's reason.
    pub reason: crate::RejectReason,
    /// The reservation it would have taken (`None` without a budget).
    pub reservation: Option<crate::Reservation>,
    /// The usage sequence at the end.
    pub usage_sequence: u64,
    /// The final usage (from the result, else the last report).
    pub usage: Option<Usage>,
}

/// What happened to a de-duplicated `run` (the LLM layer's `LlmBulkhead::run_shared`).
///
/// ```
/// use llm_bulkhead::DedupOutcome;
/// assert_eq!(DedupOutcome::Joined.as_str(), "joined");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum DedupOutcome {
    /// The call joined an identical call in flight (a follower): it runs nothing and takes no
    /// admission of its own (the reference's `dedup` event).
    Joined,
    /// A follower got no result: the leader's could not be shared with it.
    Unshareable,
    /// A follower gave up at its own timeout; the shared call goes on.
    Timeout,
    /// A follower's own cancellation token fired while it waited; the shared call goes on.
    Cancelled,
}

impl DedupOutcome {
    /// The snake_case name.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::DedupOutcome::Unshareable.as_str(), "unshareable");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DedupOutcome::Joined => "joined",
            DedupOutcome::Unshareable => "unshareable",
            DedupOutcome::Timeout => "timeout",
            DedupOutcome::Cancelled => "cancelled",
        }
    }
}

/// A de-duplication event: a follower joined a call in flight, or got no result from it.
/// Carries no request and no key (correlate by class and time).
///
/// ```
/// use llm_bulkhead::{DedupEvent, DedupOutcome};
/// fn joined_in(e: &DedupEvent) -> Option<&str> {
///     (e.outcome == DedupOutcome::Joined).then_some(e.class.as_deref()).flatten()
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DedupEvent {
    /// The class of the follower's partition (with classes).
    pub class: Option<String>,
    /// What happened.
    pub outcome: DedupOutcome,
}

/// One event (reference §10.2). Serialises (feature `serde`) as an object whose `event` field
/// names the kind in snake_case, beside the kind's own fields.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use llm_bulkhead::{Bulkhead, Event};
/// let b = Bulkhead::new(1).unwrap();
/// let sub = b.subscribe(|e: &Event| {
///     let json = serde_json::to_value(e).unwrap();
///     assert_eq!(json["event"], "reconfigure");
///     assert_eq!(json["current"]["max_concurrent"], 2);
/// });
/// b.apply_limits(b.limits().with_revision(1).with_max_concurrent(2)).unwrap();
/// # drop(sub);
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(tag = "event", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Event {
    /// A successful admission.
    Admit(AdmitEvent),
    /// A refusal.
    Reject(RejectEvent),
    /// A usage report that changed something.
    Usage(UsageEvent),
    /// A release.
    Release(ReleaseEvent),
    /// A limits snapshot was installed (boxed: two snapshots are large).
    Reconfigure(Box<LimitsChange>),
    /// A borrowed slot was abandoned.
    BorrowedConcurrencyAbandon(AbandonEvent),
    /// Observe mode ran refused work without an admission (boxed: it carries the detail).
    Bypass(Box<BypassEvent>),
    /// Bypassed work reported usage.
    BypassUsage(BypassUsageEvent),
    /// Bypassed work finished.
    BypassRelease(BypassReleaseEvent),
    /// A de-duplicated run joined a call in flight, or got no result from it.
    Dedup(DedupEvent),
}

impl Event {
    /// The snake_case name of the kind.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Event};
    /// let b = Bulkhead::new(1).unwrap();
    /// let mut next = b.limits();
    /// next.revision += 1;
    /// let change = b.apply_limits(next).unwrap();
    /// assert_eq!(Event::Reconfigure(Box::new(change)).name(), "reconfigure");
    /// ```
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Event::Admit(_) => "admit",
            Event::Reject(_) => "reject",
            Event::Usage(_) => "usage",
            Event::Release(_) => "release",
            Event::Reconfigure(_) => "reconfigure",
            Event::BorrowedConcurrencyAbandon(_) => "borrowed_concurrency_abandon",
            Event::Bypass(_) => "bypass",
            Event::BypassUsage(_) => "bypass_usage",
            Event::BypassRelease(_) => "bypass_release",
            Event::Dedup(_) => "dedup",
        }
    }
}

type Listener = Arc<dyn Fn(&Event) + Send + Sync>;

struct List {
    next_id: u64,
    entries: Arc<[(u64, Listener)]>,
}

/// The subscribers of one bulkhead (in its shared state).
pub(crate) struct Subscribers {
    /// Whether anyone subscribes: the only thing the fast path reads.
    on: AtomicBool,
    list: Mutex<List>,
    panics: AtomicU64,
}

impl Subscribers {
    pub(crate) fn new() -> Subscribers {
        Subscribers {
            on: AtomicBool::new(false),
            list: Mutex::new(List {
                next_id: 0,
                entries: Arc::from(Vec::new()),
            }),
            panics: AtomicU64::new(0),
        }
    }

    /// Whether anyone subscribes (one `Relaxed` load).
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Subscriber panics caught so far.
    pub(crate) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, f: Listener) -> u64 {
        let mut l = lock(&self.list);
        let id = l.next_id;
        l.next_id += 1;
        let mut v: Vec<(u64, Listener)> = l.entries.iter().cloned().collect();
        v.push((id, f));
        l.entries = Arc::from(v);
        self.on.store(true, Ordering::Relaxed);
        id
    }

    pub(crate) fn remove(&self, id: u64) {
        let mut l = lock(&self.list);
        let v: Vec<(u64, Listener)> = l
            .entries
            .iter()
            .filter(|(i, _)| *i != id)
            .cloned()
            .collect();
        self.on.store(!v.is_empty(), Ordering::Relaxed);
        l.entries = Arc::from(v);
    }

    /// Delivers the event `make` builds to every subscriber (nothing if none).
    #[cold]
    #[inline(never)]
    pub(crate) fn emit(&self, make: impl FnOnce() -> Event) {
        let entries = Arc::clone(&lock(&self.list).entries);
        if entries.is_empty() {
            return;
        }
        let event = make();
        for (_, f) in entries.iter() {
            let f = std::panic::AssertUnwindSafe(|| f(&event));
            if std::panic::catch_unwind(f).is_err() {
                self.panics.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
