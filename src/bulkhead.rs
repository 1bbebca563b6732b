//! The [`Bulkhead`]: construction, the lock-free decision, reconfiguration, close and stats.

use crate::admission::Admission;
use crate::demand::{Demand, Reservation};
use crate::error::{ApplyLimitsError, ConfigError, ConfigProblem};
use crate::id::AdmissionId;
use crate::limits::{BudgetLimits, Hot, LimitsSnapshot, Ring};
use crate::rejection::{CapacityDetail, RejectReason, Rejection, TokenCapacity};
use crate::shared::{Canonical, Handle, Shared};
use crate::state::{Word, CLOSED};
use crate::stats::{Counters, Stats, TokenStats, Totals};
use crate::sync::{lock, Ordering};
use crate::Priority;
use std::fmt;

/// Builds a [`Bulkhead`] from validated settings.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::builder()
///     .max_concurrent(20)
///     .token_budget(50_000)
///     .high_priority_reserve(5_000)
///     .initial_revision(1)
///     .build()
///     .unwrap();
/// assert_eq!(b.limits().revision, 1);
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct BulkheadBuilder {
    max_concurrent: u32,
    max_queue: u32,
    budget: Option<u64>,
    reserve: Option<u64>,
    initial_revision: u64,
}

impl BulkheadBuilder {
    /// Global concurrency limit (default 0: a fail-closed start that admits nothing until a
    /// snapshot raises it). At most [`MAX_SLOTS`](crate::MAX_SLOTS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_concurrent(3).build().unwrap().limits().max_concurrent, 3);
    /// ```
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = n;
        self
    }

    /// Wait queue bound (default 0: fail-fast). Stored for the waiting layer.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_queue(8).build().unwrap().limits().max_queue, 8);
    /// ```
    pub fn max_queue(mut self, n: u32) -> Self {
        self.max_queue = n;
        self
    }

    /// Enables the in-flight token budget `B` (0 is legal: only 0-token demands fit).
    /// At most [`MAX_TOKENS`](crate::MAX_TOKENS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().token_budget(1_000).build().unwrap();
    /// assert_eq!(b.limits().token_budget.unwrap().budget, 1_000);
    /// ```
    pub fn token_budget(mut self, budget: u64) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Tokens reserved for high-priority demands (`H ≤ B` at construction; needs a budget).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::builder().high_priority_reserve(5).build().is_err());
    /// ```
    pub fn high_priority_reserve(mut self, reserve: u64) -> Self {
        self.reserve = Some(reserve);
        self
    }

    /// The revision of the initial limits (default 0).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().initial_revision(7).build().unwrap().limits().revision, 7);
    /// ```
    pub fn initial_revision(mut self, revision: u64) -> Self {
        self.initial_revision = revision;
        self
    }

    /// Validates every field and builds the bulkhead.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first invalid field and the bound it broke. Nothing is
    /// built.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let err = Bulkhead::builder().token_budget(1 << 40).build().unwrap_err();
    /// assert_eq!(err.field, "token_budget.budget");
    /// ```
    pub fn build(self) -> Result<Bulkhead, ConfigError> {
        let token_budget = match (self.budget, self.reserve) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(ConfigError {
                    field: "token_budget.high_priority_reserve",
                    problem: ConfigProblem::NeedsTokenBudget,
                })
            }
            (Some(budget), reserve) => Some(BudgetLimits {
                budget,
                high_priority_reserve: reserve.unwrap_or(0),
            }),
        };
        let first = LimitsSnapshot {
            revision: self.initial_revision,
            max_concurrent: self.max_concurrent,
            max_queue: self.max_queue,
            token_budget,
        };
        first.validate_ranges()?;
        if let Some(b) = token_budget {
            if b.high_priority_reserve > b.budget {
                return Err(ConfigError {
                    field: "token_budget.high_priority_reserve",
                    problem: ConfigProblem::ReserveExceedsBudget {
                        reserve: b.high_priority_reserve,
                        budget: b.budget,
                    },
                });
            }
        }
        let shared = Handle::new(
            Ring::new(&first),
            Canonical {
                current: first,
                tag: 0,
            },
            token_budget.is_some(),
        );
        Ok(Bulkhead { shared })
    }
}

/// What `apply_limits` replaced.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::new(2).unwrap();
/// let change = b.apply_limits(b.limits().with_revision(1).with_max_concurrent(5)).unwrap();
/// assert_eq!((change.previous.max_concurrent, change.current.max_concurrent), (2, 5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LimitsChange {
    /// The snapshot that was current before.
    pub previous: LimitsSnapshot,
    /// The snapshot now current.
    pub current: LimitsSnapshot,
}

/// A lock-free admission controller: global concurrency slots and an in-flight token budget.
///
/// Cloning a `Bulkhead` gives another handle to the same state. Every decision is one CAS on
/// one packed word (see [`crate::state`]); limits are read from a ring of snapshots named by a
/// tag in that word (see [`crate::limits`]).
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, RejectReason, Usage};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(2_400).high_priority_reserve(400)
///     .build().unwrap();
/// let d = Demand::tokens(Reservation::new(100, 1_000).unwrap());
/// let first = b.try_acquire(d).unwrap();                       // 1100 ≤ 2000
/// let refused = b.try_acquire(d).unwrap_err();                 // 2200 > 2000
/// assert_eq!(refused.reason, RejectReason::BudgetLimit);
/// let high = b.try_acquire(d.with_priority(llm_bulkhead::Priority::High)).unwrap(); // 2200 ≤ 2400
/// first.release(Some(Usage::new(90, 300))).unwrap();
/// drop(high);
/// assert_eq!(b.stats().in_flight, 0);
/// ```
///
/// # Memory ordering
///
/// A successful admission synchronises with the release whose capacity it reuses and with the
/// `apply_limits` that installed the limits it was decided under (the admission CAS is
/// `AcqRel`, releases are `AcqRel` `fetch_sub`s). `close` is `AcqRel`: once it returns, no admission can
/// succeed. Statistics are `Relaxed` bookkeeping (see [`crate::stats`]).
#[derive(Clone)]
pub struct Bulkhead {
    shared: Handle,
}

enum Decision {
    Admit(Word),
    Refuse(RejectReason),
}

#[inline]
fn decide(w: Word, lim: &Hot, r: u64, priority: Priority) -> Decision {
    if w.closed() {
        return Decision::Refuse(RejectReason::Shutdown);
    }
    if let Some(eff) = lim.effective(priority) {
        if w.tokens().saturating_add(r) > eff {
            return Decision::Refuse(RejectReason::BudgetLimit);
        }
    }
    // Row 6 (and, for fail-fast callers, the no-barging rule while waiters are queued).
    if w.slots() >= lim.max_concurrent || w.waiters() {
        return Decision::Refuse(RejectReason::ConcurrencyLimit);
    }
    Decision::Admit(w.plus(r))
}

impl Bulkhead {
    /// A builder with every setting at its default.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// assert_eq!(b.limits().max_concurrent, 1);
    /// ```
    pub fn builder() -> BulkheadBuilder {
        BulkheadBuilder::default()
    }

    /// A bulkhead with `max_concurrent` slots, no queue and no token budget.
    ///
    /// # Errors
    /// [`ConfigError`] when `max_concurrent` exceeds [`MAX_SLOTS`](crate::MAX_SLOTS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::new(70_000).is_err());
    /// ```
    pub fn new(max_concurrent: u32) -> Result<Bulkhead, ConfigError> {
        Bulkhead::builder().max_concurrent(max_concurrent).build()
    }

    /// Admits `demand` now or refuses it; never waits, never takes a lock.
    ///
    /// Checks, first failure wins (CONTRACT.md §2): closed → `shutdown`; budget configured and
    /// `T + r > eff(priority)` → `budget_limit`; no free slot (or waiters queued) →
    /// `concurrency_limit`. On success the slot and the reservation are taken in the same CAS.
    ///
    /// # Errors
    /// A [`Rejection`] explained by the state the decision saw.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(1).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
    /// drop(a);
    /// assert!(b.try_acquire(Demand::slot()).is_ok());
    /// ```
    // Always inlined: callers then keep the admission in registers instead of writing the
    // whole `Result` to memory, which measured 15.5 → ~11 ns per pair. The refusal path is
    // out of line (`refuse`), so the inlined code is the decision, one CAS and the guard.
    #[inline(always)]
    pub fn try_acquire(&self, demand: Demand) -> Result<Admission, Rejection> {
        let shared = &*self.shared;
        let reservation = if shared.has_budget {
            Some(demand.reservation().unwrap_or(Reservation::ZERO))
        } else {
            None
        };
        let r = reservation.map_or(0, |x| x.total());
        let priority = demand.priority();
        let word = &*shared.word;
        let mut w = Word(word.load(Ordering::Acquire));
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            let lim = shared.ring.read(w.tag());
            match decide(w, &lim, r, priority) {
                Decision::Admit(next) => {
                    match word.compare_exchange_weak(
                        w.0,
                        next.0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            let c = shared.counters.local(Counters::new);
                            let n = c.admitted.add(1);
                            if shared.has_budget {
                                c.total_reserved.add(r);
                            }
                            return Ok(Admission::new(
                                self.shared.slot_ref(),
                                AdmissionId::new(shared.id_prefix, c.key, n),
                                lim.revision,
                                priority,
                                reservation,
                            ));
                        }
                        Err(actual) => {
                            backoff.spin();
                            w = Word(actual);
                        }
                    }
                }
                Decision::Refuse(reason) => match refuse(shared, w, &lim, reason, r, priority) {
                    Ok(rejection) => return Err(rejection),
                    Err(now) => w = now,
                },
            }
        }
    }

    /// Installs a newer limits snapshot atomically (CONTRACT.md §6).
    ///
    /// Order: a revision not newer than the current one is refused first, whatever else the
    /// snapshot holds; then every field is validated; then the snapshot is installed with one
    /// tag bump of the state word. Lower limits shrink by attrition (nothing in flight is
    /// revoked); `max_concurrent = 0` is a kill switch. Once this returns, no decision made
    /// against an older snapshot can succeed. It works after `close()` as well.
    ///
    /// # Errors
    /// [`ApplyLimitsError::StaleRevision`] or [`ApplyLimitsError::Invalid`]; nothing changed.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(2).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0)).unwrap(); // kill switch
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
    /// assert_eq!(a.revision(), 0); // admitted work keeps its revision
    /// ```
    pub fn apply_limits(&self, next: LimitsSnapshot) -> Result<LimitsChange, ApplyLimitsError> {
        let shared = &*self.shared;
        let mut canon = lock(&shared.reconfig);
        if next.revision <= canon.current.revision {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: next.revision,
                current: canon.current,
            });
        }
        next.validate_ranges()?;
        match (shared.has_budget, next.token_budget.is_some()) {
            (true, false) => {
                return Err(ConfigError {
                    field: "token_budget",
                    problem: ConfigProblem::Required,
                }
                .into())
            }
            (false, true) => {
                return Err(ConfigError {
                    field: "token_budget",
                    problem: ConfigProblem::MustBeOmitted,
                }
                .into())
            }
            _ => {}
        }
        let tag = canon.tag.wrapping_add(1);
        shared.ring.write(tag, &next);
        let word = &*shared.word;
        let mut w = Word(word.load(Ordering::Acquire));
        loop {
            debug_assert_eq!(w.tag(), canon.tag % (1 << crate::state::TAG_BITS));
            match word.compare_exchange_weak(
                w.0,
                w.with_next_tag().0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => w = Word(actual),
            }
        }
        canon.tag = tag;
        let previous = std::mem::replace(&mut canon.current, next);
        Ok(LimitsChange {
            previous,
            current: next,
        })
    }

    /// Replaces the token budget, keeping every other limit (a new snapshot with revision + 1).
    ///
    /// # Errors
    /// [`ConfigProblem::MustBeOmitted`] without a budget; a range error above
    /// [`MAX_TOKENS`](crate::MAX_TOKENS); `StaleRevision` if the revision is already `u64::MAX`.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().token_budget(100).initial_revision(7).build().unwrap();
    /// b.set_budget(50).unwrap();
    /// assert_eq!((b.limits().revision, b.limits().token_budget.unwrap().budget), (8, 50));
    /// ```
    pub fn set_budget(&self, budget: u64) -> Result<LimitsChange, ApplyLimitsError> {
        // Holding no lock between the read and the apply is fine: a concurrent apply makes this
        // one stale, which is reported, not lost.
        let cur = self.limits();
        let Some(b) = cur.token_budget else {
            return Err(ConfigError {
                field: "token_budget",
                problem: ConfigProblem::MustBeOmitted,
            }
            .into());
        };
        let Some(rev) = cur.revision.checked_add(1) else {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: cur.revision,
                current: cur,
            });
        };
        self.apply_limits(cur.with_revision(rev).with_token_budget(Some(BudgetLimits {
            budget,
            high_priority_reserve: b.high_priority_reserve,
        })))
    }

    /// Closes the bulkhead: idempotent and irreversible. Every later demand is refused with
    /// `shutdown`; admitted work may still report usage and release.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(1).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// b.close();
    /// b.close();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::Shutdown);
    /// drop(a);
    /// assert!(b.stats().closed);
    /// ```
    pub fn close(&self) {
        self.shared.word.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Whether `close()` was called.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::new(1).unwrap();
    /// assert!(!b.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        Word(self.shared.word.load(Ordering::Acquire)).closed()
    }

    /// The current limits snapshot.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::new(3).unwrap().limits().max_concurrent, 3);
    /// ```
    pub fn limits(&self) -> LimitsSnapshot {
        lock(&self.shared.reconfig).current
    }

    /// A snapshot of state and counters. State fields come from one read of the state word;
    /// counters are summed over threads (see [`crate::stats`] for what is exact when).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(4).token_budget(1_200).build().unwrap();
    /// let a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// let s = b.stats();
    /// assert_eq!((s.in_flight, s.token_budget.unwrap().available), (1, 100));
    /// # drop(a);
    /// ```
    pub fn stats(&self) -> Stats {
        let shared = &*self.shared;
        let limits = self.limits();
        let w = Word(shared.word.load(Ordering::Acquire));
        let mut t = Totals::default();
        shared.counters.for_each(|c| t.add(c));
        let rejected = t.rejected.total();
        Stats {
            limits,
            closed: w.closed(),
            in_flight: w.slots(),
            admissions_in_flight: w.slots(),
            pending: 0,
            available_slots: u64::from(limits.max_concurrent).saturating_sub(w.slots()),
            admitted: t.admitted,
            released: t.admitted.saturating_sub(w.slots()),
            rejected,
            rejected_by_reason: t.rejected,
            token_budget: limits.token_budget.map(|b| TokenStats {
                budget: b.budget,
                high_priority_reserve: b.high_priority_reserve,
                in_flight_tokens: w.tokens(),
                available: b.budget.saturating_sub(w.tokens()),
                total_reserved: t.total_reserved,
                total_consumed: t.total_consumed,
                total_refunded: t.total_refunded,
                total_overrun: t.total_overrun,
            }),
        }
    }
}

/// The refusal path, out of line so that the inlined fast path stays small: re-checks that the
/// limits were untorn (the tag has not moved since `w`; see `crate::limits`), counts the
/// refusal and builds the rejection, or returns the new word to retry with.
#[cold]
#[inline(never)]
fn refuse(
    shared: &Shared,
    w: Word,
    lim: &Hot,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Result<Rejection, Word> {
    let now = Word(shared.word.load(Ordering::Acquire));
    if now.tag() != w.tag() {
        return Err(now);
    }
    shared.counters.local(Counters::new).rejected[reason.index()].add(1);
    Ok(rejection(w, lim, reason, r, priority))
}

fn rejection(w: Word, lim: &Hot, reason: RejectReason, r: u64, priority: Priority) -> Rejection {
    Rejection {
        reason,
        constraint: None,
        revision: lim.revision,
        detail: CapacityDetail {
            in_flight: w.slots(),
            pending: 0,
            max_concurrent: lim.max_concurrent,
            max_queue: lim.max_queue,
            token_budget: lim.budget.map(|budget| {
                let eff = lim.effective(priority).unwrap_or(budget);
                TokenCapacity {
                    budget,
                    in_flight_tokens: w.tokens(),
                    effective_budget: eff,
                    available: eff.saturating_sub(w.tokens()),
                    requested: r,
                }
            }),
        },
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = Word(self.shared.word.load(Ordering::Relaxed));
        f.debug_struct("Bulkhead")
            .field("in_flight", &w.slots())
            .field("tokens_in_flight", &w.tokens())
            .field("closed", &w.closed())
            .finish_non_exhaustive()
    }
}
