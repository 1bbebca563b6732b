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
use std::any::Any;
use std::fmt;
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
