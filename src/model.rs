//! The sequential reference model: the admission semantics of CONTRACT.md written as plain,
//! single-threaded code with no atomics.
//!
//! It is the executable specification the lock-free engine is tested against: property tests
//! and the fuzz target drive the same random operation sequences through [`Model`] and
//! [`Bulkhead`](crate::Bulkhead) and demand identical decisions, reports and statistics.
//! Front-end authors can use it the same way for their own layers.
//!
//! ```
//! use llm_bulkhead::model::Model;
//! use llm_bulkhead::{Demand, LimitsSnapshot, RejectReason, Reservation};
//! let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
//! let h = m.try_acquire(Demand::slot()).unwrap();
//! assert_eq!(m.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
//! m.release(h, None).unwrap();
//! assert_eq!(m.stats().in_flight, 0);
//! ```

use crate::demand::{Reconcile, Reservation, Usage};
use crate::error::{ApplyLimitsError, ConfigError, ConfigProblem, UsageError};
use crate::id::AdmissionId;
use crate::rejection::{CapacityDetail, RejectReason, Rejection, TokenCapacity};
use crate::stats::{RejectCounts, Stats, TokenStats};
use crate::{
    Demand, LimitsChange, LimitsSnapshot, Priority, ReleaseReport, UsageReport, MAX_SLOTS,
    MAX_TOKENS,
};
use std::collections::BTreeMap;

/// A handle to an admission held by the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(pub u64);

/// Why the model refused a usage report or a release.
///
/// ```
/// use llm_bulkhead::model::{Handle, Model, ModelError};
/// use llm_bulkhead::LimitsSnapshot;
/// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
/// assert_eq!(m.release(Handle(7), None), Err(ModelError::UnknownHandle(Handle(7))));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelError {
    /// The handle names no live admission (never admitted, or already released).
    UnknownHandle(Handle),
    /// The usage was invalid, exactly as the engine would say.
    Usage(UsageError),
}

impl From<UsageError> for ModelError {
    fn from(e: UsageError) -> Self {
        ModelError::Usage(e)
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::UnknownHandle(h) => write!(f, "no live admission with handle {}", h.0),
            ModelError::Usage(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ModelError {}

#[derive(Clone, Debug)]
struct Held {
    revision: u64,
    reservation: Option<Reservation>,
    held: u64,
    reported: Option<Usage>,
    sequence: u64,
}

/// The sequential model of one bulkhead.
///
/// Token totals (`total_reserved`, `total_consumed`, `total_refunded`, `total_overrun`) wrap
/// modulo 2^64, as the engine's per-thread counters do: a single usage report may carry up to
/// `u64::MAX` tokens, so a sum of them can exceed any fixed width.
#[derive(Clone, Debug)]
pub struct Model {
    limits: LimitsSnapshot,
    has_budget: bool,
    closed: bool,
    in_flight: u64,
    tokens: u64,
    live: BTreeMap<Handle, Held>,
    next: u64,
    admitted: u64,
    released: u64,
    rejected: RejectCounts,
    reserved: u64,
    consumed: u64,
    refunded: u64,
    overrun: u64,
}

fn too_large(field: &'static str, value: u64, max: u64) -> ConfigError {
    ConfigError {
        field,
        problem: ConfigProblem::TooLarge { value, max },
    }
}

fn check_ranges(s: &LimitsSnapshot) -> Result<(), ConfigError> {
    if s.max_concurrent > MAX_SLOTS {
        return Err(too_large(
            "max_concurrent",
            s.max_concurrent.into(),
            MAX_SLOTS.into(),
        ));
    }
    if let Some(b) = s.token_budget {
        if b.budget > MAX_TOKENS {
            return Err(too_large("token_budget.budget", b.budget, MAX_TOKENS));
        }
        if b.high_priority_reserve > MAX_TOKENS {
            return Err(too_large(
                "token_budget.high_priority_reserve",
                b.high_priority_reserve,
                MAX_TOKENS,
            ));
        }
    }
    Ok(())
}

impl Model {
    /// A model whose initial limits are `first` (validated as the builder validates).
    ///
    /// # Errors
    /// The same [`ConfigError`] the builder would give.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// assert!(Model::new(LimitsSnapshot { revision: 0, max_concurrent: 70_000, max_queue: 0, token_budget: None }).is_err());
    /// ```
    pub fn new(first: LimitsSnapshot) -> Result<Model, ConfigError> {
        check_ranges(&first)?;
        if let Some(b) = first.token_budget {
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
        Ok(Model {
            limits: first,
            has_budget: first.token_budget.is_some(),
            closed: false,
            in_flight: 0,
            tokens: 0,
            live: BTreeMap::new(),
            next: 0,
            admitted: 0,
            released: 0,
            rejected: RejectCounts::default(),
            reserved: 0,
            consumed: 0,
            refunded: 0,
            overrun: 0,
        })
    }

    fn eff(&self, p: Priority) -> Option<u64> {
        self.limits.token_budget.map(|b| b.effective(p))
    }

    /// One fail-fast decision (CONTRACT.md §2 rows 0, 1, 6).
    ///
    /// # Errors
    /// The [`Rejection`] the engine must give in the same state.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 3, max_concurrent: 0, max_queue: 0, token_budget: None }).unwrap();
    /// assert_eq!(m.try_acquire(Demand::slot()).unwrap_err().revision, 3);
    /// ```
    pub fn try_acquire(&mut self, d: Demand) -> Result<Handle, Rejection> {
        let reservation = self
            .has_budget
            .then(|| d.reservation().unwrap_or(Reservation::ZERO));
        let r = reservation.map_or(0, |x| x.total());
        let reason = if self.closed {
            Some(RejectReason::Shutdown)
        } else if self
            .eff(d.priority())
            .is_some_and(|eff| self.tokens.saturating_add(r) > eff)
        {
            Some(RejectReason::BudgetLimit)
        } else if self.in_flight >= u64::from(self.limits.max_concurrent) {
            Some(RejectReason::ConcurrencyLimit)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.rejected = add_reason(self.rejected, reason);
            return Err(Rejection {
                reason,
                constraint: None,
                revision: self.limits.revision,
                detail: CapacityDetail {
                    in_flight: self.in_flight,
                    pending: 0,
                    max_concurrent: self.limits.max_concurrent.into(),
                    max_queue: self.limits.max_queue.into(),
                    token_budget: self.limits.token_budget.map(|b| {
                        let eff = b.effective(d.priority());
                        TokenCapacity {
                            budget: b.budget,
                            in_flight_tokens: self.tokens,
                            effective_budget: eff,
                            available: eff.saturating_sub(self.tokens),
                            requested: r,
                        }
                    }),
                },
            });
        }
        self.in_flight += 1;
        self.tokens += r;
        self.admitted += 1;
        if self.has_budget {
            self.reserved = self.reserved.wrapping_add(r);
        }
        let h = Handle(self.next);
        self.next += 1;
        self.live.insert(
            h,
            Held {
                revision: self.limits.revision,
                reservation,
                held: r,
                reported: None,
                sequence: 0,
            },
        );
        Ok(h)
    }

    /// The revision and reservation of a live admission.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 3, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
    /// let h = m.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(m.admission(h), Some((3, None)));
    /// ```
    pub fn admission(&self, h: Handle) -> Option<(u64, Option<Reservation>)> {
        self.live.get(&h).map(|a| (a.revision, a.reservation))
    }

    /// Handles of the live admissions, oldest first.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
    /// assert!(m.live().is_empty());
    /// ```
    pub fn live(&self) -> Vec<Handle> {
        self.live.keys().copied().collect()
    }

    /// A usage report on a live admission (CONTRACT.md §5). The report's `admission_id` is
    /// the handle number.
    ///
    /// # Errors
    /// As [`Admission::report_usage`](crate::Admission::report_usage), or
    /// [`ModelError::UnknownHandle`].
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, BudgetLimits, Demand, Reservation, Usage};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0,
    ///     token_budget: Some(BudgetLimits { budget: 2_400, high_priority_reserve: 0 }) }).unwrap();
    /// let h = m.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// assert_eq!(m.report_usage(h, Usage::new(100, 1_400), None).unwrap().held, 1_500);
    /// ```
    pub fn report_usage(
        &mut self,
        h: Handle,
        usage: Usage,
        reconcile: Option<Reconcile>,
    ) -> Result<UsageReport, ModelError> {
        let a = self
            .live
            .get(&h)
            .ok_or(ModelError::UnknownHandle(h))?
            .clone();
        let overflow = |field| UsageError::Overflow { field };
        usage.total().ok_or(overflow("usage"))?;
        let clamped = match a.reported {
            Some(p) => Usage::new(p.input.max(usage.input), p.output.max(usage.output)),
            None => usage,
        };
        let consumed = clamped.total().ok_or(overflow("usage"))?;
        let mut hold = a.held;
        if let Some(res) = a.reservation {
            let cap = res.max_output();
            hold = match reconcile {
                Some(rc) if rc.remaining_output > cap => {
                    return Err(UsageError::RemainingExceedsCap {
                        remaining: rc.remaining_output,
                        cap,
                    }
                    .into())
                }
                Some(rc) => (rc.remaining_output as u128
                    + rc.safety_margin as u128
                    + clamped.output.saturating_sub(cap) as u128)
                    .try_into()
                    .map_err(|_| overflow("hold"))?,
                None => (clamped.input as u128 + cap.max(clamped.output) as u128)
                    .try_into()
                    .map_err(|_| overflow("hold"))?,
            };
        }
        if hold > a.held {
            let grown = self.tokens as u128 + (hold - a.held) as u128;
            if grown > MAX_TOKENS as u128 {
                return Err(UsageError::HoldTooLarge {
                    hold,
                    max: MAX_TOKENS,
                }
                .into());
            }
            self.overrun = self.overrun.wrapping_add(hold - a.held);
            self.tokens = grown as u64;
        } else {
            self.refunded = self.refunded.wrapping_add(a.held - hold);
            self.tokens -= a.held - hold;
        }
        let changed = a.reported != Some(clamped) || hold != a.held;
        let sequence = a.sequence + u64::from(changed);
        self.live.insert(
            h,
            Held {
                sequence,
                held: hold,
                reported: Some(clamped),
                ..a.clone()
            },
        );
        let reserved = a.reservation.map_or(0, |r| r.total());
        Ok(UsageReport {
            admission_id: AdmissionId::from_u128(h.0.into()),
            revision: a.revision,
            sequence,
            reserved,
            held: hold,
            consumed,
            output_cap: a.reservation.map(|r| r.max_output()),
            output_remaining: a
                .reservation
                .map(|r| r.max_output().saturating_sub(clamped.output)),
            over_reservation: a.reservation.is_some() && consumed > reserved,
        })
    }

    /// Releases a live admission.
    ///
    /// # Errors
    /// [`UsageError::Overflow`] when `usage` overflows (the admission stays live), or
    /// [`ModelError::UnknownHandle`].
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand, Usage};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
    /// let h = m.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(m.release(h, Some(Usage::new(3, 4))).unwrap().consumed, Some(7));
    /// ```
    pub fn release(
        &mut self,
        h: Handle,
        usage: Option<Usage>,
    ) -> Result<ReleaseReport, ModelError> {
        if !self.live.contains_key(&h) {
            return Err(ModelError::UnknownHandle(h));
        }
        if usage.is_some_and(|u| u.total().is_none()) {
            return Err(UsageError::Overflow { field: "usage" }.into());
        }
        let Some(a) = self.live.remove(&h) else {
            return Err(ModelError::UnknownHandle(h));
        };
        let effective = usage.or(a.reported);
        let consumed = effective.and_then(|u| u.total());
        self.in_flight -= 1;
        self.tokens -= a.held;
        self.released += 1;
        let refunded = match (a.reservation, consumed) {
            (Some(_), Some(c)) if c < a.held => a.held - c,
            _ => 0,
        };
        self.consumed = self.consumed.wrapping_add(consumed.unwrap_or(0));
        self.refunded = self.refunded.wrapping_add(refunded);
        Ok(ReleaseReport {
            admission_id: AdmissionId::from_u128(h.0.into()),
            revision: a.revision,
            reserved: a.reservation.map_or(0, |r| r.total()),
            held: a.held,
            refunded,
            consumed,
            usage: effective,
            usage_sequence: a.sequence,
        })
    }

    /// Installs a snapshot (CONTRACT.md §6).
    ///
    /// # Errors
    /// As [`Bulkhead::apply_limits`](crate::Bulkhead::apply_limits).
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let s = LimitsSnapshot { revision: 1, max_concurrent: 1, max_queue: 0, token_budget: None };
    /// let mut m = Model::new(s).unwrap();
    /// assert!(m.apply_limits(s).is_err()); // stale
    /// assert!(m.apply_limits(s.with_revision(2)).is_ok());
    /// ```
    pub fn apply_limits(&mut self, next: LimitsSnapshot) -> Result<LimitsChange, ApplyLimitsError> {
        if next.revision <= self.limits.revision {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: next.revision,
                current: self.limits,
            });
        }
        check_ranges(&next)?;
        let problem = match (self.has_budget, next.token_budget.is_some()) {
            (true, false) => Some(ConfigProblem::Required),
            (false, true) => Some(ConfigProblem::MustBeOmitted),
            _ => None,
        };
        if let Some(problem) = problem {
            return Err(ConfigError {
                field: "token_budget",
                problem,
            }
            .into());
        }
        let previous = std::mem::replace(&mut self.limits, next);
        Ok(LimitsChange {
            previous,
            current: next,
        })
    }

    /// Closes the model.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None }).unwrap();
    /// m.close();
    /// assert!(m.stats().closed);
    /// ```
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Statistics, field for field what [`Bulkhead::stats`](crate::Bulkhead::stats) must show.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 2, max_queue: 0, token_budget: None }).unwrap();
    /// assert_eq!(m.stats().available_slots, 2);
    /// ```
    pub fn stats(&self) -> Stats {
        Stats {
            limits: self.limits,
            closed: self.closed,
            in_flight: self.in_flight,
            admissions_in_flight: self.live.len() as u64,
            pending: 0,
            available_slots: u64::from(self.limits.max_concurrent).saturating_sub(self.in_flight),
            admitted: self.admitted,
            released: self.released,
            rejected: self.rejected.total(),
            rejected_by_reason: self.rejected,
            token_budget: self.limits.token_budget.map(|b| TokenStats {
                budget: b.budget,
                high_priority_reserve: b.high_priority_reserve,
                in_flight_tokens: self.tokens,
                available: b.budget.saturating_sub(self.tokens),
                total_reserved: self.reserved,
                total_consumed: self.consumed,
                total_refunded: self.refunded,
                total_overrun: self.overrun,
            }),
        }
    }
}

fn add_reason(mut c: RejectCounts, reason: RejectReason) -> RejectCounts {
    match reason {
        RejectReason::ConcurrencyLimit => c.concurrency_limit += 1,
        RejectReason::QueueLimit => c.queue_limit += 1,
        RejectReason::BudgetLimit => c.budget_limit += 1,
        RejectReason::Timeout => c.timeout += 1,
        RejectReason::Aborted => c.aborted += 1,
        RejectReason::Shutdown => c.shutdown += 1,
    }
    c
}
