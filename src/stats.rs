//! Statistics: per-thread counters on the hot path, summed on read.
//!
//! No statistic is a shared atomic. Quantities that are state (slots in use, tokens held,
//! available capacity) are derived from the state word; event counts (admissions, releases,
//! refusals by reason, token totals) live in one `Counters` block per thread, each written
//! only by its own thread, and are summed by [`Bulkhead::stats`](crate::Bulkhead::stats).
//!
//! # Memory ordering
//!
//! Counters are `Relaxed`. A `stats()` call racing with admissions sees each counter at some
//! recent value; counters are not a consistent cut of one instant (nor are they needed for any
//! decision). Once all threads are quiescent and synchronised with the reader (for example by
//! joining them), every count is exact.

use crate::limits::LimitsSnapshot;
use crate::rejection::RejectReason;
use crate::sync::Stripe;

/// One thread's event counters.
///
/// Releases are not counted: every admission holds a slot until it is released, so
/// `released = admitted − slots in use`, and the release path writes no counter unless it
/// has usage to book.
#[derive(Default)]
pub(crate) struct Counters {
    /// Distinguishes this entry's admission ids from other threads' (see [`crate::id`]).
    pub(crate) key: u64,
    pub(crate) admitted: Stripe,
    pub(crate) rejected: [Stripe; 6],
    pub(crate) total_reserved: Stripe,
    pub(crate) total_consumed: Stripe,
    pub(crate) total_refunded: Stripe,
    pub(crate) total_overrun: Stripe,
}

impl Counters {
    pub(crate) fn new() -> Counters {
        Counters {
            key: crate::id::next_key(),
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
}

impl RejectCounts {
    /// The count for one reason.
    ///
    /// ```
    /// # use llm_bulkhead::{RejectCounts, RejectReason};
    /// assert_eq!(RejectCounts::default().get(RejectReason::Timeout), 0);
    /// ```
    pub fn get(&self, reason: RejectReason) -> u64 {
        match reason {
            RejectReason::ConcurrencyLimit => self.concurrency_limit,
            RejectReason::QueueLimit => self.queue_limit,
            RejectReason::BudgetLimit => self.budget_limit,
            RejectReason::Timeout => self.timeout,
            RejectReason::Aborted => self.aborted,
            RejectReason::Shutdown => self.shutdown,
        }
    }

    /// The sum over all reasons.
    ///
    /// ```
    /// # use llm_bulkhead::RejectCounts;
    /// assert_eq!(RejectCounts { timeout: 2, shutdown: 1, ..Default::default() }.total(), 3);
    /// ```
    pub fn total(&self) -> u64 {
        RejectReason::ALL.iter().map(|r| self.get(*r)).sum()
    }

    fn slot(&mut self, reason: RejectReason) -> &mut u64 {
        match reason {
            RejectReason::ConcurrencyLimit => &mut self.concurrency_limit,
            RejectReason::QueueLimit => &mut self.queue_limit,
            RejectReason::BudgetLimit => &mut self.budget_limit,
            RejectReason::Timeout => &mut self.timeout,
            RejectReason::Aborted => &mut self.aborted,
            RejectReason::Shutdown => &mut self.shutdown,
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
}

/// Sums of every thread's counters.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) admitted: u64,
    pub(crate) rejected: RejectCounts,
    pub(crate) total_reserved: u64,
    pub(crate) total_consumed: u64,
    pub(crate) total_refunded: u64,
    pub(crate) total_overrun: u64,
}

impl Totals {
    pub(crate) fn add(&mut self, c: &Counters) {
        fn acc(sum: &mut u64, s: &Stripe) {
            *sum = sum.wrapping_add(s.get());
        }
        acc(&mut self.admitted, &c.admitted);
        for r in RejectReason::ALL {
            acc(self.rejected.slot(r), &c.rejected[r.index()]);
        }
        acc(&mut self.total_reserved, &c.total_reserved);
        acc(&mut self.total_consumed, &c.total_consumed);
        acc(&mut self.total_refunded, &c.total_refunded);
        acc(&mut self.total_overrun, &c.total_overrun);
    }
}
