//! The [`Admission`] guard: what a successful decision gives, and how its tokens are settled.

use crate::record::events::{AbandonCause, Event, ReleaseEvent, UsageEvent};
use crate::record::stats::Counters;
use crate::shared::{Shared, SlotRef};
use crate::vocab::class::{ClassId, Resources};
use crate::vocab::demand::{Reconcile, Reservation, Usage};
use crate::vocab::error::UsageError;
use crate::vocab::id::AdmissionId;
use crate::words::state::MAX_TOKENS;
use crate::Priority;
use std::fmt;

mod settle;
pub(crate) use settle::checked_report;
use settle::*;

/// What a usage report left behind (CONTRACT.md §5).
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(1).token_budget(1_200).build().unwrap();
/// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
/// let r = a.report_usage(Usage::new(20, 5)).unwrap();
/// assert_eq!((r.sequence, r.held, r.consumed, r.output_remaining), (1, 1_020, 25, Some(995)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UsageReport {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// The admission's class (`None` without classes), as [`Admission::class`] gives it.
    pub class: Option<ClassId>,
    /// Increments whenever the clamped usage or the hold changes.
    pub sequence: u64,
    /// The reservation `r` (0 without a budget).
    pub reserved: u64,
    /// The current hold (0 after release or without a budget).
    pub held: u64,
    /// `input + output` of the clamped cumulative usage.
    pub consumed: u64,
    /// The reservation's `max_output` (`None` without a budget).
    pub output_cap: Option<u64>,
    /// `max(0, max_output − output)` (`None` without a budget).
    pub output_remaining: Option<u64>,
    /// `consumed > reserved` (always false without a budget).
    pub over_reservation: bool,
}

/// What a release settled.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap();
/// let a = b.try_acquire(Demand::tokens(Reservation::new(300, 200).unwrap())).unwrap();
/// let r = a.release(Some(Usage::new(100, 50))).unwrap();
/// assert_eq!((r.held, r.consumed, r.refunded), (500, Some(150), 350));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ReleaseReport {
    /// The admission.
    pub admission_id: AdmissionId,
    /// The revision that authorised it.
    pub revision: u64,
    /// The admission's class (`None` without classes), as [`Admission::class`] gives it.
    pub class: Option<ClassId>,
    /// The reservation `r` (0 without a budget).
    pub reserved: u64,
    /// The hold just before release; all of it went back to the budget.
    pub held: u64,
    /// `max(0, held − consumed)` (bookkeeping; 0 without usage or without a budget).
    pub refunded: u64,
    /// Consumption, when usage is known (the explicit usage, else the last report).
    pub consumed: Option<u64>,
    /// The usage the release used.
    pub usage: Option<Usage>,
    /// The usage sequence at release.
    pub usage_sequence: u64,
}

/// `release` was given invalid usage: nothing changed, and the admission comes back so that
/// nothing is lost (dropping it releases it without usage).
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Usage};
/// let b = Bulkhead::new(1).unwrap();
/// let a = b.try_acquire(Demand::slot()).unwrap();
/// let err = a.release(Some(Usage::new(u64::MAX, 1))).unwrap_err();
/// assert_eq!(b.stats().in_flight, 1);        // still held
/// err.admission.release(None).unwrap();      // settle it properly
/// assert_eq!(b.stats().in_flight, 0);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ReleaseError {
    /// What was wrong.
    pub error: UsageError,
    /// The admission, still held.
    pub admission: Box<Admission>,
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "release refused, admission still held: {}", self.error)
    }
}

impl std::error::Error for ReleaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A successful admission: a global slot and, with a token budget, a token hold.
///
/// It is `Send + 'static`, so it can move into a spawned task or thread. Dropping it releases
/// it (without usage: the last report is used), also during a panic unwind; `release` consumes
/// it, so a second release cannot be written.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(4).token_budget(10_000).build().unwrap();
/// let mut a = b.try_acquire(Demand::tokens(Reservation::new(1_000, 500).unwrap())).unwrap();
/// assert_eq!((a.revision(), a.held()), (0, 1_500));
/// std::thread::spawn(move || {
///     a.report_usage(Usage::new(900, 100)).unwrap();
///     a.release(Some(Usage::new(900, 300))).unwrap();
/// }).join().unwrap();
/// assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 0);
/// ```
///
/// # Memory ordering
///
/// Releasing an admission (dropping it, or [`release`](Admission::release)) *happens-before*
/// the admission that reuses its capacity, as with a semaphore: whatever the work did before
/// the release is visible to the work admitted with that slot (or those tokens) afterwards.
/// The release's CAS of the state word is `AcqRel` and so is the admission's CAS; when the slot
/// is handed to a queued waiter instead, the hand-off's CAS (`AcqRel`, made by the releasing
/// thread after the release) and the waiter's `Acquire` load of its answer carry the same
/// edge. With classes, the class-word and shared-word RMWs are `SeqCst`. Statistics are
/// `Relaxed` bookkeeping and order nothing.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// let b = Bulkhead::new(1).unwrap();
/// let data = Arc::new(AtomicU64::new(0));
/// let a = b.try_acquire(Demand::slot()).unwrap();
/// let d = data.clone();
/// std::thread::spawn(move || {
///     d.store(42, Ordering::Relaxed); // work under the admission
///     drop(a); // the release
/// }).join().unwrap();
/// let _next = b.try_acquire(Demand::slot()).unwrap(); // reuses the slot
/// assert_eq!(data.load(Ordering::Relaxed), 42);
/// ```
#[must_use = "dropping an Admission releases its slot and tokens at once"]
pub struct Admission {
    /// The slot (and the pointer to the shared state it keeps alive); `None` once released.
    slot: Option<SlotRef>,
    id: AdmissionId,
    revision: u64,
    reservation: Option<Reservation>,
    held: u64,
    /// The last usage reported (clamped); zero before the first report
    /// ([`ClassBits::REPORTED`] says which, so no `Option` tag takes a word).
    reported: Usage,
    sequence: u64,
    /// Priority, class, attribution, abandonment and whether usage was reported, packed (see
    /// [`ClassBits`]). One word keeps `Admission` small and free of byte-sized fields, which
    /// the no-class fast path feels
    /// (a byte field next to others made the moves of a new admission stall on store
    /// forwarding: 12.6 → 21 ns per pair).
    class: ClassBits,
}

/// `[observed @63][reported @62][borrowed tokens @8..38][high priority @7][pinned @6][abandoned @5][borrowed slot @4]
/// [class index @1..4][has class @0]`. "Pinned": at abandonment a `Bulkhead` handle was counted (and forgotten)
/// to keep the shared state alive in place of the returned slot; `settle_classed` turns it
/// back into a handle and drops it. Borrowed tokens fit: a reservation's borrowed part is at
/// most the budget (`MAX_CLASSED_TOKENS` < 2^30).
#[derive(Clone, Copy, PartialEq, Eq)]
struct ClassBits(u64);

pub(crate) use crate::protocol::ClassCode;

impl ClassCode {
    /// The class index and the resources this code records.
    pub(crate) fn parts(self) -> (Option<usize>, Resources) {
        let bits = ClassBits(self.0);
        (bits.index(), bits.resources())
    }
}

impl ClassBits {
    const HAS: u64 = 1;
    const BORROWED_SLOT: u64 = 1 << 4;
    const ABANDONED: u64 = 1 << 5;
    const PINNED: u64 = 1 << 6;
    const HIGH: u64 = 1 << 7;
    /// Someone subscribed to events when it was admitted: its release goes through the
    /// observed path (`crate::record::events`), so the plain release reads no flag.
    const OBSERVED: u64 = 1 << 63;
    /// Usage was reported (`Admission::reported` is meaningful); a release with nothing to
    /// book tests it with the class flags, in the same word.
    const REPORTED: u64 = 1 << 62;
    /// The borrowed tokens (bits 8–61).
    const BORROWED_TOKENS: u64 = ((1 << 54) - 1) << 8;
    /// A slot or tokens borrowed.
    const BORROWED: u64 = Self::BORROWED_SLOT | Self::BORROWED_TOKENS;

    /// The class bits of an admission of class `k` with `r` (priority not set).
    fn of_class(k: usize, r: Resources) -> ClassBits {
        ClassBits(
            Self::HAS
                | ((k as u64) << 1)
                | if r.borrowed_concurrency {
                    Self::BORROWED_SLOT
                } else {
                    0
                }
                | (r.borrowed_tokens << 8),
        )
    }
    /// From a [`ClassCode`] (class bits without the priority) and the priority.
    #[inline]
    fn new(class: ClassCode, priority: Priority, observed: bool) -> ClassBits {
        let high = match priority {
            Priority::High => Self::HIGH,
            Priority::Normal => 0,
        };
        let observed = if observed { Self::OBSERVED } else { 0 };
        ClassBits(class.0 | high | observed)
    }
    #[inline]
    fn priority(self) -> Priority {
        if self.0 & Self::HIGH != 0 {
            Priority::High
        } else {
            Priority::Normal
        }
    }

    #[inline]
    fn index(self) -> Option<usize> {
        (self.0 & Self::HAS != 0).then_some(self.class_index())
    }
    /// The class index field (meaningful only with [`HAS`](Self::HAS) set).
    #[inline]
    fn class_index(self) -> usize {
        ((self.0 >> 1) & 7) as usize
    }
    fn resources(self) -> Resources {
        Resources {
            borrowed_concurrency: self.0 & Self::BORROWED_SLOT != 0,
            borrowed_tokens: (self.0 & !(Self::OBSERVED | Self::REPORTED)) >> 8,
        }
    }
    fn has(self, flag: u64) -> bool {
        self.0 & flag != 0
    }
    /// Whether the admission borrowed a slot or tokens (its release then most likely returns
    /// borrowed capacity: `crate::protocol::classed::release`'s hint).
    #[inline]
    fn borrowed(self) -> bool {
        self.0 & Self::BORROWED != 0
    }
}

/// What settling an admission returned.
struct Settled {
    held: u64,
    consumed: Option<u64>,
    refunded: u64,
    usage: Option<Usage>,
}

impl Admission {
    #[inline]
    pub(crate) fn new(
        slot: SlotRef,
        id: AdmissionId,
        revision: u64,
        priority: Priority,
        reservation: Option<Reservation>,
        class: ClassCode,
        observed: bool,
    ) -> Admission {
        Admission {
            slot: Some(slot),
            id,
            revision,
            reservation,
            held: reservation.map_or(0, |r| r.total()),
            reported: Usage {
                input: 0,
                output: 0,
            },
            sequence: 0,
            class: ClassBits::new(class, priority, observed),
        }
    }

    /// The packed class part of an admission of class `k` with `resources` (see
    /// [`ClassCode`]).
    pub(crate) fn class_code(k: usize, resources: Resources) -> ClassCode {
        ClassCode(ClassBits::of_class(k, resources).0)
    }

    /// The admission class (`None` on a bulkhead without classes).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    /// let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap().class(), Some(b.class_id("a").unwrap()));
    /// ```
    #[must_use]
    pub fn class(&self) -> Option<ClassId> {
        let k = self.class.index()?;
        self.shared().map(|s| ClassId::new(s.class_owner, k))
    }

    /// How the admission's capacity was attributed at its decision: whether its slot and how
    /// many of its tokens came from the shared remainder (`{false, 0}` without classes).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    /// let b = Bulkhead::builder().max_concurrent(2)
    ///     .class("a", ClassLimits { protected_concurrent: 1, ..Default::default() }).default_class("a").build().unwrap();
    /// let first = b.try_acquire(Demand::slot()).unwrap();
    /// let second = b.try_acquire(Demand::slot()).unwrap();
    /// assert!(!first.resources().borrowed_concurrency && second.resources().borrowed_concurrency);
    /// ```
    #[must_use]
    pub fn resources(&self) -> Resources {
        self.class.resources()
    }

    /// Returns a borrowed slot at once, keeping the token hold until release (CONTRACT.md §5).
    /// Idempotent: true only the first time, and only for an admission whose slot was borrowed.
    ///
    /// The admission stays in flight until it is released: the caller must still call
    /// [`release`](Self::release) (or drop it), and until then a [`drain`](crate::Bulkhead::drain)
    /// without a deadline keeps waiting; use a bounded drain when shutdown must go on despite
    /// an unsettled caller.
    ///
    /// # What it guarantees, and what it does not
    /// Returning the slot is a bound on **this process's** admission slot only. It is not
    /// evidence that the upstream provider stopped generating: if the work's remote
    /// cancellation is best effort, the provider may go on consuming capacity the slot count no
    /// longer shows, and the token accounting that follows when the work settles is an
    /// accounting view, not a measurement of what the provider did. A hard upstream guarantee
    /// needs capacity that is never lent for that resource (an unlent floor: a class's
    /// `protected_concurrent`, whose slots are never borrowed and so never abandoned) or an
    /// authoritative provider-side cancellation or partition mechanism.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    /// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default()).default_class("batch").build().unwrap();
    /// let mut a = b.try_acquire(Demand::slot()).unwrap();
    /// assert!(a.abandon_borrowed_concurrency());
    /// assert!(!a.abandon_borrowed_concurrency());
    /// assert_eq!(b.stats().in_flight, 0);            // the slot is back
    /// assert_eq!(b.stats().admissions_in_flight, 1); // the admission is not settled yet
    /// let other = b.try_acquire(Demand::slot()).unwrap();
    /// # drop((a, other));
    /// ```
    pub fn abandon_borrowed_concurrency(&mut self) -> bool {
        self.abandon_with_cause(AbandonCause::Manual)
    }

    /// [`abandon_borrowed_concurrency`](Self::abandon_borrowed_concurrency) with its cause
    /// (`deadline` is what `run`'s borrowed-concurrency deadline uses).
    pub(crate) fn abandon_with_cause(&mut self, cause: AbandonCause) -> bool {
        let Some(k) = self.class.index() else {
            return false;
        };
        if self.class.has(ClassBits::ABANDONED) || !self.class.has(ClassBits::BORROWED_SLOT) {
            return false;
        }
        let Some(slot) = self.slot.as_ref() else {
            return false;
        };
        self.class.0 |= ClassBits::ABANDONED;
        let shared = slot.get();
        let c = shared.counters.local(Counters::new);
        c.abandoned.add(1);
        if cause == AbandonCause::Deadline {
            c.abandoned_deadline.add(1);
        }
        c.classes[k].abandoned.add(1);
        // Take a handle first, while the slot still keeps the state alive; then return the
        // slot. With no handle left nobody can use the slot, so it is kept until release.
        if let Some(pin) = slot.try_pin() {
            crate::protocol::classed::return_slot_only(shared, k);
            // Its pump's wake-ups, after the decrease's operation (`crate::wait::list`).
            crate::protocol::class_pump::deliver_deferred();
            // Counted, and turned back into a handle by `settle_classed`.
            std::mem::forget(pin);
            self.class.0 |= ClassBits::PINNED;
        }
        // The state is still alive: kept by the forgotten pin, or by the slot not returned.
        crate::handle::events::emit(shared, || {
            crate::record::events::Event::BorrowedConcurrencyAbandon(
                crate::record::events::AbandonEvent {
                    admission_id: self.id,
                    revision: self.revision,
                    priority: self.priority(),
                    class: crate::handle::events::class_name(shared, Some(k)),
                    resources: self.resources(),
                    cause,
                    held_tokens: self.held,
                },
            )
        });
        true
    }

    /// The shared state, while the slot is held.
    #[inline]
    fn shared(&self) -> Option<&Shared> {
        self.slot.as_ref().map(SlotRef::get)
    }

    /// The admission's id (unique, UUID-formatted).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// let b = Bulkhead::new(1).unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap().id().to_string().len(), 36);
    /// ```
    #[must_use]
    pub fn id(&self) -> AdmissionId {
        self.id
    }

    /// The revision of the limits that authorised this admission; never relabelled.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// let b = Bulkhead::builder().max_concurrent(1).initial_revision(7).build().unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap().revision(), 7);
    /// ```
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The demand's priority.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand, Priority};
    /// let b = Bulkhead::new(1).unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap().priority(), Priority::Normal);
    /// ```
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.class.priority()
    }

    /// The reservation taken (`None` on a bulkhead without a token budget).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// let d = Demand::tokens(Reservation::new(5, 5).unwrap());
    /// assert_eq!(Bulkhead::new(1).unwrap().try_acquire(d).unwrap().reservation(), None);
    /// ```
    #[must_use]
    pub fn reservation(&self) -> Option<Reservation> {
        self.reservation
    }

    /// The last usage reported (`None` before the first report).
    #[inline]
    fn last_report(&self) -> Option<Usage> {
        self.class.has(ClassBits::REPORTED).then_some(self.reported)
    }

    /// Tokens currently held (0 without a budget).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(100).build().unwrap();
    /// let a = b.try_acquire(Demand::tokens(Reservation::new(30, 20).unwrap())).unwrap();
    /// assert_eq!(a.held(), 50);
    /// ```
    #[must_use]
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The current usage sequence number.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// assert_eq!(Bulkhead::new(1).unwrap().try_acquire(Demand::slot()).unwrap().sequence(), 0);
    /// ```
    #[must_use]
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Reports cumulative usage and corrects the hold (CONTRACT.md §5): the hold becomes
    /// `input + max(max_output, output)`. To reconcile progressively (release processed input
    /// and generated output from the hold) use
    /// [`report_usage_reconciled`](Self::report_usage_reconciled).
    ///
    /// Usage is clamped so neither field decreases. Growth is booked as overrun with no
    /// admission check; shrinkage as refund. The sequence increments whenever the clamped
    /// usage or the hold changes.
    ///
    /// # Errors
    /// [`UsageError`] for sums that overflow, or a hold that cannot be held at all; nothing
    /// changes.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(2_000).build().unwrap();
    /// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// assert_eq!(a.report_usage(Usage::new(20, 100)).unwrap().held, 1_020);
    /// ```
    pub fn report_usage(&mut self, usage: Usage) -> Result<UsageReport, UsageError> {
        self.report_usage_reconciled(usage, None)
    }

    /// [`report_usage`](Self::report_usage) with progressive reconciliation (`reconcile`: a
    /// [`Reconcile`], or an `Option` of one, `None` being `report_usage`).
    ///
    /// Usage is clamped so neither field decreases. Without `reconcile` the hold becomes
    /// `input + max(max_output, output)`; with it, `remaining_output + safety_margin +
    /// max(0, output − max_output)`. Growth is booked as overrun with no admission check;
    /// shrinkage as refund. The sequence increments whenever the clamped usage or the hold
    /// changes.
    ///
    /// # Errors
    /// [`UsageError`] for sums that overflow, `remaining_output` above the output cap, or a
    /// hold that cannot be held at all; nothing changes.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reconcile, Reservation, Usage};
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(2_000).build().unwrap();
    /// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// let r = a.report_usage_reconciled(Usage::new(20, 100), Reconcile { remaining_output: 900, safety_margin: 50 }).unwrap();
    /// assert_eq!(r.held, 950);
    /// assert_eq!(b.stats().token_budget.unwrap().total_refunded, 150);
    /// ```
    pub fn report_usage_reconciled(
        &mut self,
        usage: Usage,
        reconcile: impl Into<Option<Reconcile>>,
    ) -> Result<UsageReport, UsageError> {
        let reconcile = reconcile.into();
        let (clamped, consumed) =
            checked_report(usage, self.last_report(), self.reservation, reconcile)?;
        let released = self.slot.is_none();
        let new_hold = match self.reservation {
            Some(res) if !released => {
                let cap = res.max_output();
                let hold = match reconcile {
                    None => clamped.input.checked_add(cap.max(clamped.output)),
                    Some(rc) => rc
                        .remaining_output
                        .checked_add(rc.safety_margin)
                        .and_then(|h| h.checked_add(clamped.output.saturating_sub(cap))),
                };
                hold.ok_or(UsageError::Overflow { field: "hold" })?
            }
            _ => self.held,
        };
        let class = self.class.index();
        if let Some(shared) = self.shared() {
            if new_hold > self.held {
                let delta = new_hold - self.held;
                match class {
                    None => grow_hold(shared, delta, new_hold)?,
                    Some(k) => grow_class_hold(shared, k, delta, new_hold)?,
                }
            } else if new_hold < self.held {
                let delta = self.held - new_hold;
                let c = shared.counters.local(Counters::new);
                match class {
                    // Release, like any return of capacity.
                    // Token waiting: refunded tokens go to the queued head first.
                    None => crate::protocol::plain::return_tokens(shared, delta),
                    Some(k) => {
                        crate::protocol::classed::return_tokens(shared, k, delta);
                        crate::protocol::class_pump::deliver_deferred();
                        c.classes[k].refunded.add(delta);
                    }
                }
                c.total_refunded.add(delta);
            }
        }
        let bumped = !released && (self.last_report() != Some(clamped) || new_hold != self.held);
        if bumped {
            self.sequence += 1;
        }
        let previous = self.held;
        self.held = new_hold;
        self.reported = clamped;
        self.class.0 |= ClassBits::REPORTED;
        let reserved = self.reservation.map_or(0, |r| r.total());
        let report = UsageReport {
            admission_id: self.id,
            revision: self.revision,
            class: self.class(),
            sequence: self.sequence,
            reserved,
            held: self.held,
            consumed,
            output_cap: self.reservation.map(|r| r.max_output()),
            output_remaining: self
                .reservation
                .map(|r| r.max_output().saturating_sub(clamped.output)),
            over_reservation: self.reservation.is_some() && consumed > reserved,
        };
        if bumped {
            if let Some(shared) = self.shared() {
                crate::handle::events::emit(shared, || {
                    Event::Usage(UsageEvent {
                        admission_id: self.id,
                        revision: self.revision,
                        priority: self.priority(),
                        class: crate::handle::events::class_name(shared, class),
                        sequence: report.sequence,
                        reserved_tokens: reserved,
                        previous_held_tokens: previous,
                        held_tokens: new_hold,
                        delta_tokens: signed_delta(previous, new_hold),
                        usage: clamped,
                        output_cap: report.output_cap,
                        output_remaining: report.output_remaining,
                        over_reservation: report.over_reservation,
                        progressive: reconcile,
                    })
                });
            }
        }
        Ok(report)
    }

    /// Releases the admission: the slot and the whole current hold go back at once.
    ///
    /// `usage`, when given, is the final usage; otherwise the last report is used. Consumption
    /// is counted whenever usage is known; `refunded = max(0, held − consumed)` is bookkeeping.
    ///
    /// # Errors
    /// [`ReleaseError`] when `usage` overflows; nothing changed and the admission is returned
    /// inside the error.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(2_000).build().unwrap();
    /// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// a.report_usage(Usage::new(100, 250)).unwrap();
    /// let r = a.release(None).unwrap(); // falls back to the last report
    /// assert_eq!((r.consumed, r.refunded), (Some(350), 750));
    /// ```
    pub fn release(mut self, usage: Option<Usage>) -> Result<ReleaseReport, ReleaseError> {
        if let Some(u) = usage {
            if u.total().is_none() {
                return Err(ReleaseError {
                    error: UsageError::Overflow { field: "usage" },
                    admission: Box::new(self),
                });
            }
        }
        // Before settling: the class id carries the bulkhead's identity, read through the slot.
        let class = self.class();
        let s = self.settle(usage).unwrap_or(Settled {
            held: 0,
            consumed: None,
            refunded: 0,
            usage,
        });
        Ok(ReleaseReport {
            admission_id: self.id,
            revision: self.revision,
            class,
            reserved: self.reservation.map_or(0, |r| r.total()),
            held: s.held,
            refunded: s.refunded,
            consumed: s.consumed,
            usage: s.usage,
            usage_sequence: self.sequence,
        })
    }

    /// Settles in place as [`release`](Self::release) does, for an owner that has no use for
    /// the report: `usage` that overflows falls back to the last report (as `release`'s error
    /// does once its admission is dropped). The admission is settled after it (its drop does
    /// nothing); it is not moved, so an admission held inside a larger value is not copied.
    /// Used by the LLM layer's run context only.
    #[cfg(feature = "llm")]
    #[inline(always)]
    pub(crate) fn settle_final(&mut self, usage: Option<Usage>) {
        self.settle_quietly(usage.filter(|u| u.total().is_some()));
    }

    /// Whether a release with `usage` is the plain one: no class, nothing to book, no event.
    /// Whether usage was reported is a flag of the class word, tested with the others: nothing
    /// of `reported` is read (an earlier `Option<Usage>` copied before its test was a 16-byte
    /// load that stalled on store forwarding over the 8-byte store of its tag).
    #[inline(always)]
    fn is_plain_release(&self, usage: Option<Usage>) -> bool {
        usage.is_none()
            && self.class.0
                & (ClassBits::HAS
                    | ClassBits::ABANDONED
                    | ClassBits::OBSERVED
                    | ClassBits::REPORTED)
                == 0
    }

    /// What the out-of-line ends of a release need to know of the admission: copies, not
    /// `&self` (taking the admission's address would keep it in memory).
    #[inline(always)]
    fn described(&self) -> Described {
        Described {
            id: self.id,
            revision: self.revision,
            class: self.class,
            reservation: self.reservation,
            sequence: self.sequence,
        }
    }

    /// Returns the slot and the whole hold; `None` if already released. Statistics are written
    /// before the slot goes back: the return may free the shared state (see
    /// `crate::shared`).
    #[inline(always)]
    fn settle(&mut self, usage: Option<Usage>) -> Option<Settled> {
        let slot = self.slot.take()?;
        let held = std::mem::take(&mut self.held);
        if self.is_plain_release(usage) {
            // The plain release: nothing to book, one RMW. Kept this small so that dropping
            // an admission inlines.
            slot.return_slot(held);
            return Some(Settled {
                held,
                consumed: None,
                refunded: 0,
                usage: None,
            });
        }
        let usage = usage.or(self.last_report());
        Some(settle_other(slot, held, usage, self.described()))
    }

    /// [`settle`](Self::settle) for a caller with no use for what it settled (the drop,
    /// `settle_final`): the out-of-line end returns nothing, so a class release with nothing
    /// to book (`settle_quiet`) is the class release alone, with no result to write.
    #[inline(always)]
    fn settle_quietly(&mut self, usage: Option<Usage>) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let held = std::mem::take(&mut self.held);
        if self.is_plain_release(usage) {
            // As in `settle`.
            slot.return_slot(held);
            return;
        }
        let usage = usage.or(self.last_report());
        settle_quiet(slot, held, usage, self.described());
    }
}

impl Drop for Admission {
    #[inline(always)]
    fn drop(&mut self) {
        self.settle_quietly(None);
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("id", &self.id)
            .field("revision", &self.revision)
            .field("priority", &self.priority())
            .field("reservation", &self.reservation)
            .field("held", &self.held)
            .field("sequence", &self.sequence)
            .field("released", &self.slot.is_none())
            .finish()
    }
}
