//! Statistics: per-thread counters on the hot path, summed on read.
//!
//! No statistic is a shared atomic. Quantities that are state (slots in use, tokens held,
//! available capacity) are derived from the state word; event counts (admissions, releases,
//! refusals by reason, token totals) live in one `Counters` block per thread, each written
//! only by its own thread, and are summed by [`Bulkhead::stats`](crate::Bulkhead::stats).
//! Every amount and every sum saturates at `u64::MAX` instead of wrapping: a usage report
//! of `u64::MAX − 1` tokens followed by one of 5 leaves `total_consumed` at `u64::MAX`, never
//! at a small number. A count of decisions goes up by ones (`Stripe::incr`), which could not
//! reach `u64::MAX` in centuries, so the decision paths do not test for it.
//!
//! # Memory ordering
//!
//! Counters are `Relaxed`. A `stats()` call racing with admissions sees each counter at some
//! recent value; counters are not a consistent cut of one instant (nor are they needed for any
//! decision). Once all threads are quiescent and synchronised with the reader (for example by
//! joining them), every count is exact.

use crate::sync::Stripe;
use crate::vocab::rejection::RejectReason;
use crate::words::limits::LimitsSnapshot;

/// One thread's event counters.
///
/// Releases are not counted: every admission holds a slot until it is released, so
/// `released = admitted − slots in use`, and the release path writes no counter unless it
/// has usage to book.
#[derive(Default)]
pub(crate) struct Counters {
    /// Distinguishes this entry's admission ids from other threads' (see `crate::vocab::id`):
    /// the entry's key spread in place (`AdmissionId::key_bits`).
    pub(crate) key: u64,
    /// This thread's grace-period marker for this bulkhead's decisions (`crate::grace`): on
    /// the line the decision writes anyway, found by the same lookup. Read it through
    /// [`Counters::reader`].
    #[cfg(not(loom))]
    reader: crate::grace::Reader,
    /// Under loom every thread shares one entry (`crate::sync::Stripes`), so the entry holds
    /// one marker per loom thread instead, indexed like the process-wide cells
    /// (`crate::sync::per_thread::index`): each is still written by its thread alone and
    /// scanned by the grace period, as the native markers are, so loom checks the protocol of
    /// markers kept in counters entries (`loom-tests/tests/tag_wrap.rs`).
    #[cfg(loom)]
    readers: [crate::grace::Reader; crate::sync::per_thread::LOOM_THREADS],
    pub(crate) admitted: Stripe,
    /// Refusals by [`RejectReason::index`]; one more entry than there are counted reasons, for
    /// `UnknownClass` (never counted), so that indexing by any reason needs no bounds check.
    pub(crate) rejected: [Stripe; 8],
    pub(crate) total_reserved: Stripe,
    pub(crate) total_consumed: Stripe,
    pub(crate) total_refunded: Stripe,
    pub(crate) total_overrun: Stripe,
    /// Borrowed slots abandoned (all causes).
    pub(crate) abandoned: Stripe,
    /// Of which by an expired deadline (cause `deadline`).
    pub(crate) abandoned_deadline: Stripe,
    /// Releases of abandoned admissions.
    pub(crate) abandoned_settled: Stripe,
    /// Queue waits that ended, their total and this thread's longest (ns).
    pub(crate) waits: Stripe,
    pub(crate) wait_ns: Stripe,
    pub(crate) wait_max_ns: Stripe,
    pub(crate) classes: [ClassCounters; crate::vocab::class::MAX_CLASSES],
}

/// One thread's counters for one class.
#[derive(Default)]
pub(crate) struct ClassCounters {
    pub(crate) admitted: Stripe,
    /// Releases of abandoned admissions of this class (other releases are derived:
    /// `admitted − in flight − abandoned and not yet released`, so a release books nothing).
    pub(crate) abandoned_settled: Stripe,
    pub(crate) rejected: [Stripe; 7],
    pub(crate) reserved: Stripe,
    pub(crate) consumed: Stripe,
    pub(crate) refunded: Stripe,
    pub(crate) overrun: Stripe,
    pub(crate) borrowed_admissions: Stripe,
    pub(crate) borrowed_tokens: Stripe,
    pub(crate) abandoned: Stripe,
}

impl Counters {
    /// The calling thread's decision marker in this entry (the entry is the calling thread's
    /// natively; under loom, the calling thread's slot of the shared entry).
    #[inline(always)]
    pub(crate) fn reader(&self) -> &crate::grace::Reader {
        #[cfg(not(loom))]
        {
            &self.reader
        }
        #[cfg(loom)]
        {
            &self.readers[crate::sync::per_thread::index()]
        }
    }

    /// Visits every decision marker this entry holds (one natively, one per loom thread
    /// under loom).
    pub(crate) fn for_each_reader(&self, f: &mut dyn FnMut(&crate::grace::Reader)) {
        #[cfg(not(loom))]
        f(&self.reader);
        #[cfg(loom)]
        for r in &self.readers {
            f(r)
        }
    }

    pub(crate) fn new() -> Counters {
        Counters {
            key: crate::vocab::id::AdmissionId::key_bits(crate::vocab::id::next_key()),
            ..Counters::default()
        }
    }
}

/// Refusals counted by reason.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
/// let b = Bulkhead::builder().max_concurrent(0).build().unwrap();
/// let _ = b.try_acquire(Demand::slot());
/// assert_eq!(b.stats().rejected_by_reason.get(RejectReason::ConcurrencyLimit), 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RejectCounts {
    /// `concurrency_limit` refusals.
    pub concurrency_limit: u64,
    /// `queue_limit` refusals.
    pub queue_limit: u64,
    /// `budget_limit` refusals.
    pub budget_limit: u64,
    /// `timeout` refusals.
    pub timeout: u64,
    /// `aborted` refusals.
    pub aborted: u64,
    /// `shutdown` refusals.
    pub shutdown: u64,
    /// `unshareable_result` refusals (callers of a shared call whose share of its result
    /// could not be made).
    pub unshareable_result: u64,
}

impl RejectCounts {
    /// The count for one reason.
    ///
    /// ```
    /// # use llm_bulkhead::{RejectCounts, RejectReason};
    /// assert_eq!(RejectCounts::default().get(RejectReason::Timeout), 0);
    /// ```
    #[must_use]
    pub fn get(&self, reason: RejectReason) -> u64 {
        match reason {
            RejectReason::ConcurrencyLimit => self.concurrency_limit,
            RejectReason::QueueLimit => self.queue_limit,
            RejectReason::BudgetLimit => self.budget_limit,
            RejectReason::Timeout => self.timeout,
            RejectReason::Aborted => self.aborted,
            RejectReason::Shutdown => self.shutdown,
            RejectReason::UnshareableResult => self.unshareable_result,
            RejectReason::UnknownClass => 0,
        }
    }

    /// The sum over all reasons.
    ///
    /// ```
    /// # use llm_bulkhead::RejectCounts;
    /// let mut c = RejectCounts::default();
    /// (c.timeout, c.shutdown) = (2, 1);
    /// assert_eq!(c.total(), 3);
    /// ```
    #[must_use]
    pub fn total(&self) -> u64 {
        RejectReason::COUNTED.iter().map(|r| self.get(*r)).sum()
    }

    pub(crate) fn slot(&mut self, reason: RejectReason) -> &mut u64 {
        match reason {
            RejectReason::ConcurrencyLimit => &mut self.concurrency_limit,
            RejectReason::QueueLimit => &mut self.queue_limit,
            RejectReason::BudgetLimit => &mut self.budget_limit,
            RejectReason::Timeout => &mut self.timeout,
            RejectReason::Aborted => &mut self.aborted,
            RejectReason::Shutdown => &mut self.shutdown,
            RejectReason::UnshareableResult => &mut self.unshareable_result,
            // Only called for `RejectReason::COUNTED`, which does not hold it.
            RejectReason::UnknownClass => unreachable!("unknown_class is never counted"),
        }
    }
}

/// Token budget statistics.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap();
/// let a = b.try_acquire(Demand::tokens(Reservation::new(400, 100).unwrap())).unwrap();
/// a.release(Some(Usage::new(100, 50))).unwrap();
/// let t = b.stats().token_budget.unwrap();
/// assert_eq!((t.total_reserved, t.total_consumed, t.total_refunded), (500, 150, 350));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct TokenStats {
    /// The budget `B`.
    pub budget: u64,
    /// The high-priority reserve `H`.
    pub high_priority_reserve: u64,
    /// Tokens held in flight `T`.
    pub in_flight_tokens: u64,
    /// `max(0, B − T)` (not priority-adjusted, as in the reference).
    pub available: u64,
    /// Sum of reservations at admission.
    pub total_reserved: u64,
    /// Sum of reported consumption at release.
    pub total_consumed: u64,
    /// Tokens returned early (usage reports) or at release below the hold.
    pub total_refunded: u64,
    /// Hold growth booked by usage reports.
    pub total_overrun: u64,
}

/// A snapshot of a bulkhead's state and counters.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand};
/// let b = Bulkhead::builder().max_concurrent(2).build().unwrap();
/// let a = b.try_acquire(Demand::slot()).unwrap();
/// assert_eq!((b.stats().in_flight, b.stats().available_slots), (1, 1));
/// drop(a);
/// let s = b.stats();
/// assert_eq!((s.admitted, s.released, s.in_flight), (1, 1, 0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Stats {
    /// The current limits.
    pub limits: LimitsSnapshot,
    /// Whether `close()` was called.
    pub closed: bool,
    /// Global slots in use.
    pub in_flight: u64,
    /// Admissions not yet released (equals `in_flight` unless slots were abandoned).
    pub admissions_in_flight: u64,
    /// Waiters queued.
    pub pending: u64,
    /// Waiters ever queued.
    pub queued_total: u64,
    /// Waits that ended (admitted, refused, timed out or cancelled) and, with
    /// [`measure_queue_waits`](crate::BulkheadBuilder::measure_queue_waits), their total and
    /// longest duration in nanoseconds (the waiter reads the clock when it joins the queue and
    /// when it leaves; never on the fast path).
    pub queue_waits: QueueWaits,
    /// `max(0, max_concurrent − in_flight)`.
    pub available_slots: u64,
    /// Successful admissions.
    pub admitted: u64,
    /// Admissions released (`admitted − admissions_in_flight`).
    pub released: u64,
    /// Refusals, all reasons.
    pub rejected: u64,
    /// Refusals by reason.
    pub rejected_by_reason: RejectCounts,
    /// Token statistics, when a budget is configured.
    pub token_budget: Option<TokenStats>,
    /// Borrowed slots returned early by `abandon_borrowed_concurrency`, all causes.
    pub borrowed_concurrency_abandoned: u64,
    /// The same, split by cause.
    pub borrowed_concurrency_abandoned_by_cause: AbandonCauses,
    /// Class statistics, when classes are configured.
    pub classes: Option<ClassesStats>,
    /// Event subscribers that panicked (each panic caught and counted; see
    /// `crate::record::events`).
    pub subscriber_panics: u64,
}

/// Abandoned borrowed slots by cause: `manual` (the application called
/// `abandon_borrowed_concurrency`) or `deadline` (a borrowed-concurrency deadline set by
/// `LlmBulkhead::run` expired).
///
/// ```
/// use llm_bulkhead::AbandonCauses;
/// assert_eq!(AbandonCauses::default().manual, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct AbandonCauses {
    /// Abandoned by the application.
    pub manual: u64,
    /// Abandoned when a borrowed-concurrency deadline expired.
    pub deadline: u64,
}

/// Statistics of the class table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassesStats {
    /// The default class.
    pub default_class: String,
    /// The shared remainder.
    pub shared: SharedStats,
    /// Per class, in construction order.
    pub classes: Vec<ClassStats>,
}

/// The shared remainder (`max_concurrent − Σ floors`; tokens: `B − Σ token floors`, raw budget
/// as in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SharedStats {
    /// Shared slots.
    pub max_concurrent: u64,
    /// Borrowed slots in use.
    pub in_flight: u64,
    /// `max(0, max_concurrent − in_flight)`.
    pub available_concurrent: u64,
    /// Shared tokens, with a budget.
    pub token_budget: Option<SharedTokenStats>,
}

/// Shared tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct SharedTokenStats {
    /// `max(0, B − Σ token floors)`.
    pub budget: u64,
    /// Borrowed tokens held.
    pub in_flight_tokens: u64,
    /// `max(0, budget − in_flight_tokens)`.
    pub available: u64,
}

/// One class's statistics (reference §10.3).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassStats {
    /// The class.
    pub name: String,
    /// Its current limits.
    pub limits: crate::ClassLimits,
    /// Admissions holding a slot of this class.
    pub in_flight: u64,
    /// `min(in_flight, floor)`.
    pub protected_concurrent_in_use: u64,
    /// `in_flight − protected in use`.
    pub borrowed_concurrent: u64,
    /// Tokens held by the class.
    pub in_flight_tokens: u64,
    /// `min(tokens, token floor)`.
    pub protected_tokens_in_use: u64,
    /// `tokens − protected in use`.
    pub borrowed_in_flight_tokens: u64,
    /// Admissions.
    pub admitted: u64,
    /// Releases.
    pub released: u64,
    /// Borrowed slots abandoned.
    pub borrowed_concurrency_abandoned: u64,
    /// Refusals.
    pub rejected: u64,
    /// Refusals by reason.
    pub rejected_by_reason: RejectCounts,
    /// Σ reservations at admission (0 without a budget).
    pub total_reserved: u64,
    /// Σ consumption at release.
    pub total_consumed: u64,
    /// Tokens refunded (reports and releases).
    pub total_refunded: u64,
    /// Hold growth from reports.
    pub total_overrun: u64,
    /// Admissions whose slot was borrowed.
    pub total_borrowed_admissions: u64,
    /// Σ borrowed tokens at admission.
    pub total_borrowed_tokens_reserved: u64,
}

/// Queue wait figures (see [`Stats::queue_waits`]).
///
/// ```
/// assert_eq!(llm_bulkhead::Bulkhead::new(1).unwrap().stats().queue_waits.ended, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct QueueWaits {
    /// Waits that ended.
    pub ended: u64,
    /// Their total duration, in nanoseconds.
    pub total_ns: u64,
    /// The longest one, in nanoseconds.
    pub max_ns: u64,
}

/// Per-class event totals, summed over threads (or kept by the model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClassTotals {
    pub(crate) admitted: u64,
    pub(crate) released: u64,
    pub(crate) rejected: RejectCounts,
    pub(crate) reserved: u64,
    pub(crate) consumed: u64,
    pub(crate) refunded: u64,
    pub(crate) overrun: u64,
    pub(crate) borrowed_admissions: u64,
    pub(crate) borrowed_tokens: u64,
    pub(crate) abandoned: u64,
    /// Engine only: releases of abandoned admissions (the engine derives `released`).
    pub(crate) abandoned_settled: u64,
}

/// Builds the class block from state (`(in flight, tokens)` per class, global slots and tokens)
/// and totals.
pub(crate) fn classes_stats(
    limits: &crate::LimitsSnapshot,
    names: &[String],
    default_class: usize,
    state: &[(u64, u64)],
    g: u64,
    t: u64,
    totals: &[ClassTotals],
) -> Option<ClassesStats> {
    if names.is_empty() {
        return None;
    }
    let (sum_pc, sum_pt) = limits.classes.floor_sums();
    let mut prot_c = 0;
    let mut prot_t = 0;
    let classes = limits
        .classes
        .iter()
        .zip(names)
        .zip(state.iter().zip(totals))
        .map(|((l, name), (&(i, tok), tt))| {
            let pc = i.min(u64::from(l.protected_concurrent));
            let pt = tok.min(l.protected_tokens);
            prot_c += pc;
            prot_t += pt;
            ClassStats {
                name: name.clone(),
                limits: *l,
                in_flight: i,
                protected_concurrent_in_use: pc,
                borrowed_concurrent: i - pc,
                in_flight_tokens: tok,
                protected_tokens_in_use: pt,
                borrowed_in_flight_tokens: tok - pt,
                admitted: tt.admitted,
                released: tt.released,
                borrowed_concurrency_abandoned: tt.abandoned,
                rejected: tt.rejected.total(),
                rejected_by_reason: tt.rejected,
                total_reserved: tt.reserved,
                total_consumed: tt.consumed,
                total_refunded: tt.refunded,
                total_overrun: tt.overrun,
                total_borrowed_admissions: tt.borrowed_admissions,
                total_borrowed_tokens_reserved: tt.borrowed_tokens,
            }
        })
        .collect();
    let sc = u64::from(limits.max_concurrent).saturating_sub(sum_pc);
    let su = g.saturating_sub(prot_c);
    Some(ClassesStats {
        default_class: names[default_class].clone(),
        shared: SharedStats {
            max_concurrent: sc,
            in_flight: su,
            available_concurrent: sc.saturating_sub(su),
            token_budget: limits.token_budget.map(|b| {
                let budget = b.budget.saturating_sub(sum_pt);
                let used = t.saturating_sub(prot_t);
                SharedTokenStats {
                    budget,
                    in_flight_tokens: used,
                    available: budget.saturating_sub(used),
                }
            }),
        },
        classes,
    })
}

/// Sums of every thread's counters.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) abandoned: u64,
    pub(crate) abandoned_deadline: u64,
    pub(crate) abandoned_settled: u64,
    pub(crate) waits: QueueWaits,
    pub(crate) classes: [ClassTotals; crate::vocab::class::MAX_CLASSES],
    pub(crate) admitted: u64,
    pub(crate) rejected: RejectCounts,
    pub(crate) total_reserved: u64,
    pub(crate) total_consumed: u64,
    pub(crate) total_refunded: u64,
    pub(crate) total_overrun: u64,
}

impl Totals {
    /// Adds one thread's counters; only the first `classes` class blocks are read.
    pub(crate) fn add(&mut self, c: &Counters, classes: usize) {
        fn acc(sum: &mut u64, s: &Stripe) {
            // Saturating, as each thread's counter is.
            *sum = sum.saturating_add(s.get());
        }
        acc(&mut self.admitted, &c.admitted);
        for r in RejectReason::COUNTED {
            acc(self.rejected.slot(r), &c.rejected[r.index()]);
        }
        acc(&mut self.total_reserved, &c.total_reserved);
        acc(&mut self.total_consumed, &c.total_consumed);
        acc(&mut self.total_refunded, &c.total_refunded);
        acc(&mut self.total_overrun, &c.total_overrun);
        acc(&mut self.abandoned, &c.abandoned);
        acc(&mut self.abandoned_deadline, &c.abandoned_deadline);
        acc(&mut self.abandoned_settled, &c.abandoned_settled);
        acc(&mut self.waits.ended, &c.waits);
        acc(&mut self.waits.total_ns, &c.wait_ns);
        self.waits.max_ns = self.waits.max_ns.max(c.wait_max_ns.get());
        for (t, cc) in self.classes.iter_mut().zip(&c.classes).take(classes) {
            acc(&mut t.admitted, &cc.admitted);
            acc(&mut t.abandoned_settled, &cc.abandoned_settled);
            for r in RejectReason::COUNTED {
                acc(t.rejected.slot(r), &cc.rejected[r.index()]);
            }
            acc(&mut t.reserved, &cc.reserved);
            acc(&mut t.consumed, &cc.consumed);
            acc(&mut t.refunded, &cc.refunded);
            acc(&mut t.overrun, &cc.overrun);
            acc(&mut t.borrowed_admissions, &cc.borrowed_admissions);
            acc(&mut t.borrowed_tokens, &cc.borrowed_tokens);
            acc(&mut t.abandoned, &cc.abandoned);
        }
    }
}
