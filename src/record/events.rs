//! Events (reference §10.2): admissions, refusals, usage reports, releases, reconfigurations,
//! borrowed-concurrency abandonments, and the events of the layers above the core
//! ([`Event::Extension`]), delivered synchronously to subscribers.
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
//! # Cost when nobody subscribes (to that kind)
//!
//! Subscribers say which kinds they want ([`Interest`]); the bulkhead keeps the union of
//! their interests in one read-mostly word that lives in the shared state next to the other
//! construction-time settings, never on the cache line of the contended state word. An
//! admission (`try_acquire`, `acquire`, `acquire_blocking`) pays one `Relaxed` load of it and
//! a branch to an out-of-line `#[cold]` function when someone wants admissions or releases.
//! The admission remembers the answer in a bit it already carries, so its release reads no
//! flag at all: the plain release tests the same bit mask as before. The other hooks
//! (`report_usage`, abandonment, `apply_limits`, the refusal paths) are one load each, off the
//! pair's path. A subscriber to refusals and reconfigurations only (what
//! [`Telemetry`](crate::telemetry::Telemetry) asks for by default) leaves the pair as it is
//! with nobody subscribed.
//!
//! A consequence: a release is reported when its admission was made while someone
//! subscribed to admissions or releases. A subscriber therefore sees the release of every
//! admission it saw admitted (while it stays subscribed), and not the releases of admissions
//! made before anyone subscribed.
//!
//! # Delivery
//!
//! Subscribers run synchronously on the thread that caused the event, in subscription order,
//! each only for the kinds it asked for. The list is read without a lock and without touching
//! a shared reference count (an `arc-swap` load, which uses a per-thread slot): delivering an
//! event takes no lock and allocates nothing beyond the event itself (a class name, with
//! classes), so two threads deciding at once do not contend on the list. A subscription or an
//! unsubscription replaces the list whole, under a lock that no decision takes.
//!
//! A release (and an abandonment) is reported after the capacity went back, so a subscriber
//! sees the state the event left. Subscribers may re-enter the bulkhead (acquire, release,
//! `apply_limits`, even subscribe or unsubscribe): the list a delivery reads stays alive and
//! unchanged while it runs. A subscriber that panics is caught, counted in
//! [`Stats::subscriber_panics`](crate::Stats::subscriber_panics), and the others still run;
//! accounting is never affected, because every hook runs after its state change is complete.
//!
//! Events carry what the core knows: ids, revision, priority, class, token figures. Unlike the
//! reference they do not carry the request (the core never sees it); correlate by
//! `admission_id`. The reference's timing fields (`decisionDurationNs`, `queueWaitNs`) are
//! carried by admit and reject events ([`AdmitEvent::timing`], [`RejectEvent::timing`]) only
//! while a subscriber asks for them ([`Interest::DECISION_TIMING`]): reading a clock on every
//! decision is not free, so nobody asking, no clock is read (one caller can also time its own
//! calls: [`Bulkhead::acquire_blocking_timed`](crate::Bulkhead::acquire_blocking_timed)).
//!
//! # Memory ordering
//!
//! The interest word is written only under the edit lock, after the new list is stored, and
//! read `Relaxed`: a subscription made concurrently with an operation may or may not see that
//! operation's event; one that happens-before an operation (for example, made earlier on the
//! same thread) always does, because the stores happen-before the loads by program order or by
//! whatever synchronisation ordered the two threads. The list itself is published and read
//! through `arc-swap`, which orders the list's contents before its readers.

pub use crate::record::timing::Timing;
pub(crate) use crate::record::timing::{decision_start, nanos, set_queued, TimingScope};
use crate::sync::{lock, ArcSwap, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::vocab::class::Resources;
use crate::vocab::demand::{Priority, Reconcile, Usage};
use crate::vocab::id::AdmissionId;
use crate::vocab::rejection::Rejection;
use crate::words::limits::LimitsChange;
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

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
    /// How long the decision took and how long of it was queued, when a subscriber asked for
    /// decision timing ([`Interest::DECISION_TIMING`]); `None` otherwise (no clock is read).
    pub timing: Option<Timing>,
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
    /// How long the decision took and how long of it was queued, when a subscriber asked for
    /// decision timing ([`Interest::DECISION_TIMING`]); `None` otherwise (no clock is read).
    pub timing: Option<Timing>,
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

/// One event (reference §10.2). Serialises (feature `serde`) as an object whose `event` field
/// names the kind in snake_case ([`Event::name`]), beside the kind's own fields.
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
    /// An event of a layer above the core, delivered in the same stream (the LLM layer's
    /// events: `llm::LlmEvent::of` reads them).
    Extension(ExtensionEvent),
}

impl Event {
    /// The snake_case name of the kind (an extension's own name for [`Event::Extension`]).
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
            Event::Extension(x) => x.name(),
        }
    }
}

/// What a layer above the core puts in an [`ExtensionEvent`]: its own event type, with its
/// name, its class (for subscribers that label by class without knowing the type), equality
/// and, with `serde`, its fields.
pub(crate) trait Payload: Any + Send + Sync + fmt::Debug {
    /// The event's snake_case name ([`Event::name`]).
    fn name(&self) -> &'static str;
    /// Its class name (with classes).
    fn class(&self) -> Option<&str>;
    /// Itself, for [`ExtensionEvent::downcast_ref`] and equality.
    fn as_any(&self) -> &dyn Any;
    /// Equality with another payload (false for one of another type).
    fn eq_payload(&self, other: &dyn Payload) -> bool;
    /// Itself as a type-erased serde value whose fields are written beside `event`, in the
    /// payload type's declaration order (it must serialise as a struct or a map).
    #[cfg(feature = "serde")]
    fn fields(&self) -> &dyn erased_serde::Serialize;
}

/// An event of a layer above the core ([`Event::Extension`]): a name, a class, and a typed
/// payload that the layer defining it reads back with [`downcast_ref`](Self::downcast_ref).
/// Only the crate's own layers make them. Serialises (feature `serde`) as the
/// payload's fields beside `event`: its name.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Event};
/// use std::sync::{Arc, Mutex};
/// let b = Bulkhead::new(1).unwrap();
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let log = seen.clone();
/// let sub = b.subscribe(move |e: &Event| if let Event::Extension(x) = e {
///     log.lock().unwrap().push((x.name(), x.class().map(str::to_owned)));
/// });
/// drop(b.try_acquire(llm_bulkhead::Demand::slot())); // core events only
/// assert!(seen.lock().unwrap().is_empty());
/// # drop(sub);
/// ```
#[derive(Clone)]
pub struct ExtensionEvent(Arc<dyn Payload>);

impl ExtensionEvent {
    /// Wraps `payload` (one allocation: made only when someone subscribes, inside the
    /// `make` closure of an emit).
    // Only the layers above make them (the `llm` layer).
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    pub(crate) fn new(payload: impl Payload) -> ExtensionEvent {
        ExtensionEvent(Arc::new(payload))
    }

    /// The event's snake_case name (what [`Event::name`] returns).
    ///
    /// ```
    /// use llm_bulkhead::Event;
    /// fn is_extension_named(e: &Event, name: &str) -> bool {
    ///     matches!(e, Event::Extension(x) if x.name() == name)
    /// }
    /// # let _ = is_extension_named;
    /// ```
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The class the event is for (with classes).
    ///
    /// ```
    /// use llm_bulkhead::ExtensionEvent;
    /// fn class(x: &ExtensionEvent) -> &str { x.class().unwrap_or("") }
    /// # let _ = class;
    /// ```
    #[must_use]
    pub fn class(&self) -> Option<&str> {
        self.0.class()
    }

    /// The payload, if it is a `T`.
    ///
    /// ```
    /// use llm_bulkhead::ExtensionEvent;
    /// fn is_text(x: &ExtensionEvent) -> bool { x.downcast_ref::<String>().is_some() }
    /// # let _ = is_text;
    /// ```
    #[must_use]
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }
}

impl fmt::Debug for ExtensionEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl PartialEq for ExtensionEvent {
    fn eq(&self, other: &ExtensionEvent) -> bool {
        self.0.eq_payload(&*other.0)
    }
}

impl Eq for ExtensionEvent {}

#[cfg(feature = "serde")]
impl serde::Serialize for Event {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// The core's kinds, tagged by serde as the derive on `Event` did.
        #[derive(serde::Serialize)]
        #[serde(tag = "event", rename_all = "snake_case")]
        enum Core<'a> {
            Admit(&'a AdmitEvent),
            Reject(&'a RejectEvent),
            Usage(&'a UsageEvent),
            Release(&'a ReleaseEvent),
            Reconfigure(&'a LimitsChange),
            BorrowedConcurrencyAbandon(&'a AbandonEvent),
        }
        let core = match self {
            Event::Admit(e) => Core::Admit(e),
            Event::Reject(e) => Core::Reject(e),
            Event::Usage(e) => Core::Usage(e),
            Event::Release(e) => Core::Release(e),
            Event::Reconfigure(e) => Core::Reconfigure(e),
            Event::BorrowedConcurrencyAbandon(e) => Core::BorrowedConcurrencyAbandon(e),
            Event::Extension(x) => return x.serialize(s),
        };
        core.serialize(s)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for ExtensionEvent {
    /// `event` (the name), then the payload's fields in their declaration order, as the core
    /// events are written.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Flat<'a> {
            event: &'static str,
            #[serde(flatten)]
            fields: &'a dyn erased_serde::Serialize,
        }
        Flat {
            event: self.name(),
            fields: self.0.fields(),
        }
        .serialize(s)
    }
}

type Listener = Arc<dyn Fn(&Event) + Send + Sync>;

/// Which events a subscriber receives ([`Bulkhead::subscribe_to`](crate::Bulkhead::subscribe_to)):
/// a set of event kinds, combined with `|`.
///
/// A decision pays for events only when someone asked for its kind: a subscriber to
/// [`REJECT`](Self::REJECT) and [`RECONFIGURE`](Self::RECONFIGURE) alone (what
/// `telemetry::Telemetry` asks for by default) leaves the
/// acquire + release pair exactly as fast as with nobody subscribed.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event, Interest};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// let b = Bulkhead::new(1).unwrap();
/// let refusals = Arc::new(AtomicU64::new(0));
/// let n = refusals.clone();
/// let sub = b.subscribe_to(Interest::REJECT, move |e: &Event| {
///     assert_eq!(e.name(), "reject");
///     n.fetch_add(1, Ordering::Relaxed);
/// });
/// let held = b.try_acquire(Demand::slot()).unwrap(); // no event built
/// assert!(b.try_acquire(Demand::slot()).is_err());
/// assert_eq!(refusals.load(Ordering::Relaxed), 1);
/// # drop((held, sub));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interest(u32);

impl Interest {
    /// [`Event::Admit`].
    pub const ADMIT: Interest = Interest(1);
    /// [`Event::Reject`].
    pub const REJECT: Interest = Interest(1 << 1);
    /// [`Event::Usage`].
    pub const USAGE: Interest = Interest(1 << 2);
    /// [`Event::Release`] (of admissions made while someone asked for `RELEASE`).
    pub const RELEASE: Interest = Interest(1 << 3);
    /// [`Event::Reconfigure`].
    pub const RECONFIGURE: Interest = Interest(1 << 4);
    /// [`Event::BorrowedConcurrencyAbandon`].
    pub const ABANDON: Interest = Interest(1 << 5);
    /// [`Event::Extension`] (the LLM layer's events).
    pub const EXTENSION: Interest = Interest(1 << 6);
    /// Every kind ([`Bulkhead::subscribe`](crate::Bulkhead::subscribe)).
    pub const ALL: Interest = Interest((1 << 7) - 1);
    /// No kind.
    pub const NONE: Interest = Interest(0);
    /// Not a kind: asks for decision timing. While someone asks for it, every decision reads
    /// the clock when it starts (and a waiter when it queues and leaves the queue), and the
    /// admit and reject events carry [`Timing`] (`AdmitEvent::timing`,
    /// `RejectEvent::timing`). Nobody asking, no clock is read.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Event, Interest};
    /// let b = Bulkhead::new(1).unwrap();
    /// let sub = b.subscribe_to(Interest::ADMIT | Interest::DECISION_TIMING, |e: &Event| {
    ///     if let Event::Admit(a) = e {
    ///         assert_eq!(a.timing.unwrap().queue_wait_ns, 0); // it never queued
    ///     }
    /// });
    /// drop(b.try_acquire(Demand::slot()));
    /// # drop(sub);
    /// ```
    pub const DECISION_TIMING: Interest = Interest(1 << 7);

    /// Whether every kind of `other` is in `self`.
    ///
    /// ```
    /// use llm_bulkhead::Interest;
    /// assert!(Interest::ALL.contains(Interest::REJECT | Interest::ADMIT));
    /// assert!(!Interest::REJECT.contains(Interest::ADMIT));
    /// ```
    #[must_use]
    pub const fn contains(self, other: Interest) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether `self` and `other` share a kind.
    ///
    /// ```
    /// use llm_bulkhead::Interest;
    /// assert!((Interest::REJECT | Interest::ADMIT).intersects(Interest::ADMIT));
    /// ```
    #[must_use]
    pub const fn intersects(self, other: Interest) -> bool {
        self.0 & other.0 != 0
    }

    /// The kind of `event`.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Event, Interest};
    /// let b = Bulkhead::new(1).unwrap();
    /// let change = b.apply_limits(b.limits().with_revision(1)).unwrap();
    /// assert_eq!(Interest::of(&Event::Reconfigure(Box::new(change))), Interest::RECONFIGURE);
    /// ```
    #[must_use]
    pub fn of(event: &Event) -> Interest {
        match event {
            Event::Admit(_) => Interest::ADMIT,
            Event::Reject(_) => Interest::REJECT,
            Event::Usage(_) => Interest::USAGE,
            Event::Release(_) => Interest::RELEASE,
            Event::Reconfigure(_) => Interest::RECONFIGURE,
            Event::BorrowedConcurrencyAbandon(_) => Interest::ABANDON,
            Event::Extension(_) => Interest::EXTENSION,
        }
    }
}

impl std::ops::BitOr for Interest {
    type Output = Interest;
    fn bitor(self, other: Interest) -> Interest {
        Interest(self.0 | other.0)
    }
}

/// One subscriber.
struct Entry {
    id: u64,
    interest: Interest,
    f: Listener,
}

/// The subscribers of one bulkhead (in its shared state).
pub(crate) struct Subscribers {
    /// The union of the subscribers' interests: the only thing the fast path reads.
    mask: AtomicU32,
    /// The list, replaced whole on every change and read without a lock.
    list: ArcSwap<Vec<Entry>>,
    /// Serialises changes (never taken by a decision); holds the next subscriber id.
    edit: Mutex<u64>,
    panics: AtomicU64,
}

// A panic cannot leave the list half-changed: it is replaced whole by one atomic store, and
// every delivery catches its subscribers' panics itself. So a bulkhead stays usable across
// `catch_unwind`, as it was when the list sat behind a `Mutex` (the listeners' own closures
// need not be `RefUnwindSafe`).
impl std::panic::RefUnwindSafe for Subscribers {}
impl std::panic::UnwindSafe for Subscribers {}

impl Subscribers {
    pub(crate) fn new() -> Subscribers {
        Subscribers {
            mask: AtomicU32::new(0),
            list: ArcSwap::from_pointee(Vec::new()),
            edit: Mutex::new(0),
            panics: AtomicU64::new(0),
        }
    }

    /// Whether anyone subscribes to anything (one `Relaxed` load).
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.mask.load(Ordering::Relaxed) != 0
    }

    /// The union of the subscribers' interests (one `Relaxed` load).
    #[inline(always)]
    pub(crate) fn interests(&self) -> Interest {
        Interest(self.mask.load(Ordering::Relaxed))
    }

    /// Whether anyone subscribes to a kind of `interest` (one `Relaxed` load).
    #[inline(always)]
    pub(crate) fn wants(&self, interest: Interest) -> bool {
        self.mask.load(Ordering::Relaxed) & interest.0 != 0
    }

    /// Subscriber panics caught so far.
    pub(crate) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// Replaces the list with `edit(current)` and the mask with its union, under the edit
    /// lock (a decision never takes it).
    fn change(&self, edit: impl FnOnce(&mut u64, &[Entry]) -> Vec<Entry>) {
        let mut next_id = lock(&self.edit);
        let current = self.list.load_full();
        let v = edit(&mut next_id, &current);
        let mask = v.iter().fold(0, |m, e| m | e.interest.0);
        self.list.store(Arc::new(v));
        self.mask.store(mask, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, interest: Interest, f: Listener) -> u64 {
        let mut id = 0;
        self.change(|next_id, current| {
            id = *next_id;
            *next_id += 1;
            let mut v: Vec<Entry> = current.iter().map(Entry::clone).collect();
            v.push(Entry { id, interest, f });
            v
        });
        id
    }

    pub(crate) fn remove(&self, id: u64) {
        self.change(|_, current| {
            current
                .iter()
                .filter(|e| e.id != id)
                .map(Entry::clone)
                .collect()
        });
    }

    /// Delivers the event `make` builds to every subscriber that asked for its kind (nothing
    /// if none). Lock-free: the list is loaded without a lock or a shared reference count
    /// (`arc-swap`), and nothing is allocated beyond what `make` builds.
    #[cold]
    #[inline(never)]
    pub(crate) fn emit(&self, make: impl FnOnce() -> Event) {
        let list = self.list.load();
        if list.is_empty() {
            return;
        }
        let mut event = make();
        let timed = self.wants(Interest::DECISION_TIMING);
        match &mut event {
            Event::Admit(AdmitEvent { timing, .. }) | Event::Reject(RejectEvent { timing, .. })
                if timed =>
            {
                *timing = crate::record::timing::current();
            }
            _ => {}
        }
        let kind = Interest::of(&event);
        for e in list.iter().filter(|e| e.interest.intersects(kind)) {
            let f = std::panic::AssertUnwindSafe(|| (e.f)(&event));
            if std::panic::catch_unwind(f).is_err() {
                self.panics.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Subscribers {
    /// When a decision starting now started, if someone asked for decision timing (one
    /// `Relaxed` load otherwise, and no clock read).
    #[inline(always)]
    pub(crate) fn decision_start(&self) -> Option<Instant> {
        if self.wants(Interest::DECISION_TIMING) {
            Some(Instant::now())
        } else {
            None
        }
    }

    /// Times the decision starting now on this thread ([`TimingScope`]), if asked for.
    #[inline(always)]
    pub(crate) fn time_decision(&self) -> TimingScope {
        TimingScope::resume(self.decision_start())
    }
}

impl Entry {
    fn clone(&self) -> Entry {
        Entry {
            id: self.id,
            interest: self.interest,
            f: Arc::clone(&self.f),
        }
    }
}
