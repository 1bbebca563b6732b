//! Refusals: why a demand was not admitted, with the capacity that explains it.

use crate::vocab::never_fits::{FitLimit, NeverFits};

mod class_counts;
pub(crate) use class_counts::{Ceilings, ClassCounts, ClassNumbers, ClassWords};
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
#[non_exhaustive]
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
    /// A caller that joined a call already in flight for an identical request could not be
    /// given its own share of that call's result (the reference's `unshareable_result`): the
    /// LLM layer's `run_shared_with`, whose share function declined or panicked. Never a
    /// capacity decision: its [`Rejection`] carries the capacity as it was when the caller
    /// was answered.
    UnshareableResult,
    /// The demand named a class this bulkhead does not have: a [`ClassId`](crate::ClassId) of
    /// another bulkhead, or any class on a bulkhead without classes. The caller's error, not a
    /// capacity refusal: decided before anything changed, it is not counted in
    /// [`Stats`](crate::Stats), publishes no event, and its [`Rejection`] carries revision 0
    /// and an empty capacity.
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
    pub const COUNTED: [RejectReason; 7] = [
        RejectReason::ConcurrencyLimit,
        RejectReason::QueueLimit,
        RejectReason::BudgetLimit,
        RejectReason::Timeout,
        RejectReason::Aborted,
        RejectReason::Shutdown,
        RejectReason::UnshareableResult,
    ];

    /// The wire name (`snake_case`), as the reference library spells it.
    ///
    /// ```
    /// # use llm_bulkhead::RejectReason;
    /// assert_eq!(RejectReason::ConcurrencyLimit.as_str(), "concurrency_limit");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::ConcurrencyLimit => "concurrency_limit",
            RejectReason::QueueLimit => "queue_limit",
            RejectReason::BudgetLimit => "budget_limit",
            RejectReason::Timeout => "timeout",
            RejectReason::Aborted => "aborted",
            RejectReason::Shutdown => "shutdown",
            RejectReason::UnshareableResult => "unshareable_result",
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
#[non_exhaustive]
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
    #[must_use]
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
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, TokenCapacity};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap();
/// let held = b.try_acquire(Demand::tokens(Reservation::new(600, 100).unwrap())).unwrap();
/// let r = b.try_acquire(Demand::tokens(Reservation::new(300, 100).unwrap())).unwrap_err();
/// let t: TokenCapacity = r.detail().token_budget.unwrap();
/// assert_eq!((t.budget, t.in_flight_tokens, t.available, t.requested), (1_000, 700, 300, 400));
/// # drop(held);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
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
/// let d = b.try_acquire(Demand::slot()).unwrap_err().detail();
/// assert_eq!((d.in_flight, d.max_concurrent), (0, 0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
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
#[non_exhaustive]
pub struct ClassDetail {
    /// The shared remainder (`max_concurrent − Σ floors`, and for tokens `eff − Σ token floors`).
    pub shared: SharedCapacity,
    /// The class's own numbers.
    pub class: ClassCapacity,
}

/// The shared remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SharedCapacity {
    /// Shared slots.
    pub concurrency: SharedAmount,
    /// Shared tokens (with a budget; capacity uses the demand's effective budget).
    pub token_budget: Option<SharedAmount>,
}

/// One resource of the shared remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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
/// A refusal keeps the numbers its decision saw in a small record, inline (no refusal of a
/// decision allocates: a class refusal packs its class numbers into a few words and names its
/// class with a pointer to its name, interned when the bulkhead is built), and
/// [`detail`](Rejection::detail), `Display` and serialisation compute the explanation from
/// them when asked: refusing, the hot path under overload, builds no explanation nobody reads.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, RejectReason, Reservation};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap();
/// let r = b.try_acquire(Demand::tokens(Reservation::new(900, 200).unwrap())).unwrap_err();
/// assert_eq!(r.reason, RejectReason::BudgetLimit);
/// assert_eq!(r.detail().token_budget.unwrap().requested, 1_100);
/// ```
#[derive(Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(into = "RejectionBody", from = "RejectionBody")
)]
pub struct Rejection {
    /// Why.
    pub reason: RejectReason,
    /// Which limit (only with admission classes).
    pub constraint: Option<Constraint>,
    /// Waiters queued (`detail().pending`): beside the two bytes above, in the padding the
    /// revision would leave anyway.
    pending: u32,
    /// The revision of the limits the decision used.
    pub revision: u64,
    counts: Counts,
    /// A class refusal's numbers, or (deserialised, or from the model) a whole detail, which
    /// then explains the refusal instead of the counts.
    more: More,
}

/// The wire form of a [`Rejection`] (its fields and its computed detail).
#[cfg(feature = "serde")]
#[derive(serde::Serialize, serde::Deserialize)]
struct RejectionBody {
    reason: RejectReason,
    constraint: Option<Constraint>,
    revision: u64,
    detail: CapacityDetail,
}

#[cfg(feature = "serde")]
impl From<Rejection> for RejectionBody {
    fn from(r: Rejection) -> RejectionBody {
        RejectionBody {
            detail: r.detail(),
            reason: r.reason,
            constraint: r.constraint,
            revision: r.revision,
        }
    }
}

#[cfg(feature = "serde")]
impl From<RejectionBody> for Rejection {
    fn from(b: RejectionBody) -> Rejection {
        Rejection::with_detail(b.reason, b.constraint, b.revision, b.detail)
    }
}

/// What a refusal saw beyond its [`Counts`]: nothing (a no-class refusal), a class refusal's
/// numbers (inline: refusing allocates nothing), or a whole detail (deserialised, or the
/// model's; boxed, as no decision makes one). One word wider than [`ClassCounts`]: its
/// `ceilings` byte tells the variants apart.
#[derive(Clone, Debug)]
enum More {
    None,
    Class(ClassCounts),
    Given(Box<CapacityDetail>),
}

/// The numbers a decision saw, as the engine had them; [`Rejection::detail`] derives the rest.
/// Narrow fields hold values the state words bound (slots in 16 bits, budgets and tokens in
/// 32). The limits are kept packed as the limits ring stores them
/// (`crate::words::limits::Packed`), and the slots and tokens in use as the no-class state
/// word holds them, so that a no-class refusal copies the words it read and decodes nothing
/// until asked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counts {
    /// The demand's reservation.
    pub(crate) requested: u64,
    /// Tokens held, all classes (low 32 bits) | slots in use, all classes (bits 32..47); the
    /// bits above are not read: a no-class refusal keeps its state word here as it is
    /// (`crate::words::state`: the same two fields in the same places).
    pub(crate) used: u64,
    /// `max_concurrent` (16 bits) | has-budget flag (bit 16) | `max_queue` (bits 32..64): the
    /// ring slot's `shape` word.
    pub(crate) shape: u64,
    /// The budget (low 32 bits) and the demand's effective budget (high 32 bits), read only
    /// when `shape` has the has-budget flag.
    pub(crate) budget: u64,
}

/// The widest slot count [`Counts::used`] holds: 15 bits, the no-class state word's field
/// (`crate::words::state` checks that its field is this one).
pub(crate) const USED_SLOTS: u64 = (1 << 15) - 1;

/// The has-budget flag of [`Counts::shape`] (the limits ring's layout, `crate::words::limits`,
/// which checks that its own flag is this one).
pub(crate) const SHAPE_HAS_BUDGET: u64 = 1 << 16;

/// `x` in 32 bits (the callers' values are bounded by the state words; saturates otherwise).
#[inline(always)]
pub(crate) fn n32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

impl Counts {
    /// [`used`](Counts::used) of `tokens` and `slots` in use (saturating at 32 and 15 bits; the
    /// engine's values fit).
    #[inline(always)]
    pub(crate) fn used(tokens: u64, slots: u64) -> u64 {
        u64::from(n32(tokens)) | (slots.min(USED_SLOTS) << 32)
    }

    fn detail(&self, pending: u32, class: Option<&ClassCounts>) -> CapacityDetail {
        let r = self.requested;
        let has_budget = self.shape & SHAPE_HAS_BUDGET != 0;
        let tokens = self.used & 0xffff_ffff;
        CapacityDetail {
            in_flight: (self.used >> 32) & USED_SLOTS,
            pending: pending.into(),
            max_concurrent: self.shape & 0xffff,
            max_queue: self.shape >> 32,
            token_budget: has_budget.then(|| {
                let eff = self.budget >> 32;
                TokenCapacity {
                    budget: self.budget & 0xffff_ffff,
                    in_flight_tokens: tokens,
                    effective_budget: eff,
                    available: eff.saturating_sub(tokens),
                    requested: r,
                }
            }),
            classes: class.map(|c| {
                Box::new(c.detail(
                    self.shape & 0xffff,
                    has_budget.then_some(self.budget >> 32),
                    r,
                ))
            }),
        }
    }
}

impl Rejection {
    /// A refusal explained by the counts its decision saw (no class numbers, no waiters
    /// queued until the caller sets them).
    #[inline(always)]
    pub(crate) fn counted(
        reason: RejectReason,
        constraint: Option<Constraint>,
        revision: u64,
        counts: Counts,
    ) -> Rejection {
        Rejection {
            reason,
            constraint,
            pending: 0,
            revision,
            counts,
            more: More::None,
        }
    }

    /// A refusal with a whole detail (deserialised, or the model's).
    pub(crate) fn with_detail(
        reason: RejectReason,
        constraint: Option<Constraint>,
        revision: u64,
        detail: CapacityDetail,
    ) -> Rejection {
        Rejection {
            reason,
            constraint,
            pending: n32(detail.pending),
            revision,
            counts: Counts {
                requested: 0,
                used: 0,
                shape: 0,
                budget: 0,
            },
            more: More::Given(Box::new(detail)),
        }
    }

    /// Adds a class refusal's numbers.
    #[inline(always)]
    pub(crate) fn set_class(&mut self, class: ClassCounts) {
        if matches!(self.more, More::None) {
            self.more = More::Class(class);
        }
    }

    /// Sets the queue length the refusal reports (`detail().pending`).
    pub(crate) fn set_pending(&mut self, pending: u64) {
        self.pending = n32(pending);
        if let More::Given(d) = &mut self.more {
            d.pending = pending;
        }
    }

    /// The capacity the decision saw: the state that explains it (computed from the numbers
    /// the refusal kept; this allocates only for a class refusal's `classes` entry).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// let b = Bulkhead::builder().max_concurrent(0).build().unwrap();
    /// let d = b.try_acquire(Demand::slot()).unwrap_err().detail();
    /// assert_eq!((d.in_flight, d.max_concurrent, d.token_budget), (0, 0, None));
    /// ```
    #[must_use]
    pub fn detail(&self) -> CapacityDetail {
        match &self.more {
            More::None => self.counts.detail(self.pending, None),
            More::Class(c) => self.counts.detail(self.pending, Some(c)),
            More::Given(d) => (**d).clone(),
        }
    }
}

impl Rejection {
    /// Whether this `budget_limit` refusal is for a reservation the limits it saw could never
    /// admit, and which bound says so: above the effective budget, above the class's token
    /// ceiling, or above the class's floor plus the shared remainder. `None` for every other
    /// reason and for a reservation that fits an idle bulkhead (retrying it later may
    /// succeed). The reason stays [`RejectReason::BudgetLimit`] (contract §2); this is its
    /// explanation, computed when asked from the numbers the decision read, so refusing costs
    /// nothing more. A later limits change can make the demand fit.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, Demand, FitLimit, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(4).token_budget(10_000)
    ///     .class("batch", ClassLimits { max_tokens: Some(2_000), ..Default::default() })
    ///     .default_class("batch").build().unwrap();
    /// let big = b.try_acquire(Demand::tokens(Reservation::new(2_500, 0).unwrap())).unwrap_err();
    /// assert_eq!(big.never_fits().unwrap().limit, FitLimit::ClassMaxTokens);
    /// let held = b.try_acquire(Demand::tokens(Reservation::new(1_500, 0).unwrap())).unwrap();
    /// let later = b.try_acquire(Demand::tokens(Reservation::new(1_000, 0).unwrap())).unwrap_err();
    /// assert_eq!(later.never_fits(), None); // it fits once `held` is released
    /// # drop(held);
    /// ```
    #[must_use]
    pub fn never_fits(&self) -> Option<NeverFits> {
        if self.reason != RejectReason::BudgetLimit {
            return None;
        }
        match &self.more {
            More::Given(d) => {
                let t = d.token_budget?;
                let class = d.classes.as_deref();
                let ceiling = class.and_then(|c| c.class.token_budget?.max_tokens);
                let reach = class.and_then(|c| {
                    let floor = c.class.token_budget?.protected_tokens;
                    Some(floor.saturating_add(c.shared.token_budget?.capacity))
                });
                FitLimit::tightest(
                    t.requested,
                    [
                        (FitLimit::EffectiveBudget, Some(t.effective_budget)),
                        (FitLimit::ClassMaxTokens, ceiling),
                        (FitLimit::ClassReach, reach),
                    ],
                )
            }
            more => {
                let k = &self.counts;
                if k.shape & SHAPE_HAS_BUDGET == 0 {
                    return None;
                }
                let class = match more {
                    More::Class(c) => Some(c),
                    _ => None,
                };
                FitLimit::tightest(
                    k.requested,
                    [
                        (FitLimit::EffectiveBudget, Some(k.budget >> 32)),
                        (
                            FitLimit::ClassMaxTokens,
                            class.and_then(ClassCounts::max_tokens),
                        ),
                        (
                            FitLimit::ClassReach,
                            class.map(|c| {
                                c.protected_tokens() + c.shared_token_capacity(k.budget >> 32)
                            }),
                        ),
                    ],
                )
            }
        }
    }
}

impl PartialEq for Rejection {
    fn eq(&self, other: &Rejection) -> bool {
        (self.reason, self.constraint, self.revision)
            == (other.reason, other.constraint, other.revision)
            && self.detail() == other.detail()
    }
}

impl Eq for Rejection {}

impl std::hash::Hash for Rejection {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.reason, self.constraint, self.revision).hash(state);
        self.detail().hash(state);
    }
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("reason", &self.reason)
            .field("constraint", &self.constraint)
            .field("revision", &self.revision)
            .field("detail", &self.detail())
            .finish()
    }
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
        let d = &self.detail();
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
            (RejectReason::UnshareableResult, _) => {
                f.write_str(": the shared call's result could not be shared with this caller")
            }
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
        Rejection::counted(
            RejectReason::UnknownClass,
            None,
            0,
            Counts {
                requested: 0,
                used: 0,
                shape: 0,
                budget: 0,
            },
        )
    }
}
