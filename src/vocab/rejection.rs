//! Refusals: why a demand was not admitted, with the capacity that explains it.

use std::fmt;

/// Why a demand was refused (CONTRACT.md §2).
///
/// ```
/// use llm_bulkhead::RejectReason;
/// assert_eq!(RejectReason::BudgetLimit.as_str(), "budget_limit");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RejectReason {
    /// No free slot (or `max_concurrent` is 0, or queueing is not possible).
    ConcurrencyLimit,
    /// No free slot and the wait queue is full.
    QueueLimit,
    /// The reservation does not fit in the (effective) token budget.
    BudgetLimit,
    /// A waiter's deadline passed.
    Timeout,
    /// The request was cancelled.
    Aborted,
    /// The bulkhead is closed.
    Shutdown,
    /// The demand named a class this bulkhead does not have: a [`ClassId`](crate::ClassId) of
    /// another bulkhead, or any class on a bulkhead without classes. The caller's error, not a
    /// capacity refusal: decided before anything changed, it is not counted in
    /// [`Stats`](crate::Stats), publishes no event, is never bypassed by observe mode, and its
    /// [`Rejection`] carries revision 0 and an empty capacity.
    UnknownClass,
}

impl RejectReason {
    /// Every reason statistics count, in their order: all but
    /// [`UnknownClass`](RejectReason::UnknownClass) (a caller's error, never counted).
    ///
    /// ```
    /// use llm_bulkhead::RejectReason;
    /// assert!(!RejectReason::COUNTED.contains(&RejectReason::UnknownClass));
    /// ```
    pub const COUNTED: [RejectReason; 6] = [
        RejectReason::ConcurrencyLimit,
        RejectReason::QueueLimit,
        RejectReason::BudgetLimit,
        RejectReason::Timeout,
        RejectReason::Aborted,
        RejectReason::Shutdown,
    ];

    /// The wire name (`snake_case`), as the reference library spells it.
    ///
    /// ```
    /// # use llm_bulkhead::RejectReason;
    /// assert_eq!(RejectReason::ConcurrencyLimit.as_str(), "concurrency_limit");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::ConcurrencyLimit => "concurrency_limit",
            RejectReason::QueueLimit => "queue_limit",
            RejectReason::BudgetLimit => "budget_limit",
            RejectReason::Timeout => "timeout",
            RejectReason::Aborted => "aborted",
            RejectReason::Shutdown => "shutdown",
            RejectReason::UnknownClass => "unknown_class",
        }
    }

    /// The position in [`COUNTED`](Self::COUNTED) (statistics arrays). Never called for
    /// `UnknownClass`, which is not counted.
    pub(crate) fn index(self) -> usize {
        debug_assert!(self != RejectReason::UnknownClass);
        self as usize
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which limit bound a refusal. Present only on bulkheads with admission classes.
///
/// ```
/// use llm_bulkhead::Constraint;
/// assert_eq!(Constraint::AdmissionClassProtection.as_str(), "admission_class_protection");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Constraint {
    /// A global limit (slots, queue, budget).
    Global,
    /// A class ceiling.
    AdmissionClass,
    /// Another class's protected floor.
    AdmissionClassProtection,
}

impl Constraint {
    /// The wire name.
    ///
    /// ```
    /// # use llm_bulkhead::Constraint;
    /// assert_eq!(Constraint::Global.as_str(), "global");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Constraint::Global => "global",
            Constraint::AdmissionClass => "admission_class",
            Constraint::AdmissionClassProtection => "admission_class_protection",
        }
    }
}

/// The token budget as a refusal saw it.
///
/// ```
/// use llm_bulkhead::TokenCapacity;
/// let t = TokenCapacity { budget: 2_400, in_flight_tokens: 1_100, effective_budget: 2_000, available: 900, requested: 1_100 };
/// assert_eq!(t.available, t.effective_budget - t.in_flight_tokens);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TokenCapacity {
    /// The budget `B`.
    pub budget: u64,
    /// Tokens held in flight `T`.
    pub in_flight_tokens: u64,
    /// `eff(priority)` for the refused demand.
    pub effective_budget: u64,
    /// `max(0, eff − T)`.
    pub available: u64,
    /// The demand's reservation `r` (0 when it had none).
    pub requested: u64,
}

/// The capacity a decision saw: the state that explains it.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand};
/// let b = Bulkhead::builder().max_concurrent(0).build().unwrap();
/// let d = b.try_acquire(Demand::slot()).unwrap_err().detail;
/// assert_eq!((d.in_flight, d.max_concurrent), (0, 0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CapacityDetail {
    /// Slots in use.
    pub in_flight: u64,
    /// Waiters queued.
    pub pending: u64,
    /// The global concurrency limit.
    pub max_concurrent: u64,
    /// The queue bound.
    pub max_queue: u64,
    /// The budget numbers, when a budget is configured.
    pub token_budget: Option<TokenCapacity>,
    /// The shared remainder and the class's own numbers, when classes are configured.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub classes: Option<Box<ClassDetail>>,
}

/// Capacity a class decision saw: the shared remainder and the class's own numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassDetail {
    /// The shared remainder (`max_concurrent − Σ floors`, and for tokens `eff − Σ token floors`).
    pub shared: SharedCapacity,
    /// The class's own numbers.
    pub class: ClassCapacity,
}

/// The shared remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SharedCapacity {
    /// Shared slots.
    pub concurrency: SharedAmount,
    /// Shared tokens (with a budget; capacity uses the demand's effective budget).
    pub token_budget: Option<SharedAmount>,
}

/// One resource of the shared remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SharedAmount {
    /// Capacity of the remainder.
    pub capacity: u64,
    /// Borrowed by all classes.
    pub in_use: u64,
    /// `max(0, capacity − in_use)`.
    pub available: u64,
    /// What this demand would borrow.
    pub requested_borrowed: u64,
}

/// A class's own numbers in a refusal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassCapacity {
    /// The class.
    pub id: String,
    /// Admissions of the class holding a slot.
    pub in_flight: u64,
    /// Its concurrency floor.
    pub protected_concurrent: u64,
    /// `min(in_flight, floor)`.
    pub protected_concurrent_in_use: u64,
    /// `in_flight − protected in use`.
    pub borrowed_concurrent: u64,
    /// `max(0, floor − in_flight)`.
    pub available_protected_concurrent: u64,
    /// Its concurrency ceiling.
    pub max_concurrent: Option<u64>,
    /// `max(0, ceiling − in_flight)`.
    pub available_concurrent: Option<u64>,
    /// Token numbers, with a budget.
    pub token_budget: Option<ClassTokenCapacity>,
}

/// A class's token numbers in a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassTokenCapacity {
    /// Tokens the class holds.
    pub in_flight_tokens: u64,
    /// Its token floor.
    pub protected_tokens: u64,
    /// `min(tokens, floor)`.
    pub protected_tokens_in_use: u64,
    /// `tokens − protected in use`.
    pub borrowed_tokens: u64,
    /// `max(0, floor − tokens)`.
    pub available_protected_tokens: u64,
    /// Its token ceiling.
    pub max_tokens: Option<u64>,
    /// `max(0, ceiling − tokens)`.
    pub available: Option<u64>,
    /// The demand's reservation.
    pub requested: u64,
}

/// A refused demand. Implements [`std::error::Error`] and, with the default `serde` feature,
/// serialises to a body a gateway can send with a 429 or 503. No retry-after is invented.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, RejectReason, Reservation};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap();
/// let r = b.try_acquire(Demand::tokens(Reservation::new(900, 200).unwrap())).unwrap_err();
/// assert_eq!(r.reason, RejectReason::BudgetLimit);
/// assert_eq!(r.detail.token_budget.unwrap().requested, 1_100);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Which limit (only with admission classes).
    pub constraint: Option<Constraint>,
    /// The revision of the limits the decision used.
    pub revision: u64,
    /// The capacity the decision saw.
    pub detail: CapacityDetail,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "admission refused: {} (limits revision {})",
            self.reason, self.revision
        )?;
        if let Some(c) = self.constraint {
            write!(f, " [{}]", c.as_str())?;
        }
        let d = &self.detail;
        // A class limit is explained with the class's numbers (or the shared remainder's), not
        // the global ones.
        if let Some(cd) = d.classes.as_deref() {
            let (c, s) = (&cd.class, &cd.shared);
            match (self.reason, self.constraint) {
                (RejectReason::BudgetLimit, Some(Constraint::AdmissionClass)) => {
                    if let Some(t) = c.token_budget {
                        return write!(
                            f,
                            ": class {}: {} tokens requested, {} of its ceiling of {} available",
                            c.id,
                            t.requested,
                            t.available.unwrap_or(0),
                            t.max_tokens.unwrap_or(0)
                        );
                    }
                }
                (RejectReason::ConcurrencyLimit, Some(Constraint::AdmissionClass)) => {
                    return write!(
                        f,
                        ": class {}: {} of its ceiling of {} slots in use",
                        c.id,
                        c.in_flight,
                        c.max_concurrent.unwrap_or(0)
                    );
                }
                (RejectReason::ConcurrencyLimit, Some(Constraint::AdmissionClassProtection)) => {
                    return write!(
                        f,
                        ": class {} would borrow a slot; {} of the {} shared slots (outside \
                         other classes' floors) in use",
                        c.id, s.concurrency.in_use, s.concurrency.capacity
                    );
                }
                (RejectReason::BudgetLimit, Some(Constraint::AdmissionClassProtection)) => {
                    if let Some(t) = s.token_budget {
                        return write!(
                            f,
                            ": class {} would borrow {} tokens; {} of the {} shared tokens \
                             available",
                            c.id, t.requested_borrowed, t.available, t.capacity
                        );
                    }
                }
                _ => {}
            }
        }
        match (self.reason, d.token_budget) {
            (RejectReason::BudgetLimit, Some(t)) => write!(
                f,
                ": {} tokens requested, {} of {} available",
                t.requested, t.available, t.effective_budget
            ),
            (RejectReason::Shutdown | RejectReason::Aborted, _) => Ok(()),
            (RejectReason::UnknownClass, _) => {
                f.write_str(": the demand's class is not a class of this bulkhead")
            }
            _ => write!(
                f,
                ": {} of {} slots in use, {} of {} queued",
                d.in_flight, d.max_concurrent, d.pending, d.max_queue
            ),
        }
    }
}

impl std::error::Error for Rejection {}

impl Rejection {
    /// The refusal of a demand in a class the bulkhead does not have
    /// ([`RejectReason::UnknownClass`]): no revision, no capacity.
    pub(crate) fn unknown_class() -> Rejection {
        Rejection {
            reason: RejectReason::UnknownClass,
            constraint: None,
            revision: 0,
            detail: CapacityDetail {
                in_flight: 0,
                pending: 0,
                max_concurrent: 0,
                max_queue: 0,
                token_budget: None,
                classes: None,
            },
        }
    }
}
