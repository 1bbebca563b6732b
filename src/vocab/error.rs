//! Typed errors for bad input. Every one of them is returned before any state changes.

use std::fmt;

/// What is wrong with one configuration or snapshot field.
///
/// ```
/// use llm_bulkhead::{Bulkhead, ConfigProblem};
/// let err = Bulkhead::builder().max_concurrent(1 << 20).build().unwrap_err();
/// assert_eq!(err.field, "max_concurrent");
/// assert!(matches!(err.problem, ConfigProblem::TooLarge { max: 32_767, .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// The value is larger than the packed atomic words can hold.
    TooLarge {
        /// The value given.
        value: u64,
        /// The largest value supported.
        max: u64,
    },
    /// `high_priority_reserve` exceeds `budget` at construction.
    ReserveExceedsBudget {
        /// The reserve given.
        reserve: u64,
        /// The budget given.
        budget: u64,
    },
    /// A snapshot omits the token budget although the bulkhead was built with one.
    Required,
    /// A required setting was not given ([`BulkheadBuilder::max_concurrent`](crate::BulkheadBuilder::max_concurrent)).
    Missing,
    /// A snapshot sets a token budget although the bulkhead was built without one.
    MustBeOmitted,
    /// The field needs a token budget, and none is configured.
    NeedsTokenBudget,
    /// A floor above its own class's ceiling.
    FloorAboveCeiling {
        /// The floor.
        floor: u64,
        /// The ceiling.
        ceiling: u64,
    },
    /// The floors of all classes add up to more than the global limit.
    FloorsExceedLimit {
        /// Σ floors.
        sum: u64,
        /// The global limit (`max_concurrent` or the token budget).
        limit: u64,
    },
    /// A snapshot's class table does not have the construction-time classes.
    ClassCount {
        /// Classes at construction.
        expected: usize,
        /// Classes in the snapshot.
        got: usize,
    },
    /// A problem with one class's limits.
    Class {
        /// The class's name.
        class: String,
        /// What is wrong.
        problem: Box<ConfigProblem>,
    },
    /// The class table itself is malformed (a name, the default class, the number of classes).
    ClassTable(&'static str),
    /// [`LimitsSnapshot::with_class`](crate::LimitsSnapshot::with_class) was given a
    /// [`ClassId`](crate::ClassId) the snapshot's table does not have: a class of another
    /// bulkhead, or a position the table lacks.
    UnknownClassId(crate::ClassId),
    /// The snapshot's class table was read from a bulkhead with other class names (or given
    /// the ids of another bulkhead): its entries would land on the wrong classes.
    ForeignClassTable,
}

/// An invalid configuration or limits snapshot. Nothing was built or installed.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let err = Bulkhead::builder().max_concurrent(1).token_budget(100).high_priority_reserve(200).build().unwrap_err();
/// assert_eq!(err.field, "token_budget.high_priority_reserve");
/// assert!(err.to_string().contains("exceeds"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The offending field, as a dotted path.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: ConfigProblem,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.describe(f, &self.problem)
    }
}

impl ConfigError {
    fn describe(&self, f: &mut fmt::Formatter<'_>, problem: &ConfigProblem) -> fmt::Result {
        match problem {
            ConfigProblem::Class { class, problem } => {
                write!(f, "admission class {class:?}: ")?;
                self.describe(f, problem)
            }
            ConfigProblem::FloorAboveCeiling { floor, ceiling } => write!(
                f,
                "{} = {floor} must be <= the class's ceiling {ceiling}",
                self.field
            ),
            ConfigProblem::FloorsExceedLimit { sum, limit } => write!(
                f,
                "{} sum {sum} exceeds the global limit {limit}",
                self.field
            ),
            ConfigProblem::ClassCount { expected, got } => write!(
                f,
                "{} must contain exactly the construction-time class keys ({expected}, got {got})",
                self.field
            ),
            ConfigProblem::ClassTable(why) => write!(f, "{}: {why}", self.field),
            ConfigProblem::UnknownClassId(id) => write!(
                f,
                "{}: class id {} (of bulkhead #{}) is not a class of this snapshot's table; \
                 name the class with `class_id` on the bulkhead the snapshot is for",
                self.field,
                id.index(),
                id.owner_serial()
            ),
            ConfigProblem::ForeignClassTable => write!(
                f,
                "{}: the snapshot's class table belongs to a bulkhead with other admission \
                 classes",
                self.field
            ),
            ConfigProblem::TooLarge { value, max } => write!(
                f,
                "{} = {value} exceeds the largest supported value {max}",
                self.field
            ),
            ConfigProblem::ReserveExceedsBudget { reserve, budget } => write!(
                f,
                "{} = {reserve} exceeds token_budget.budget = {budget}",
                self.field
            ),
            ConfigProblem::Missing => write!(f, "{} is required", self.field),
            ConfigProblem::Required => write!(
                f,
                "{} is required because the bulkhead was built with a token budget",
                self.field
            ),
            ConfigProblem::NeedsTokenBudget => {
                write!(f, "{} requires a token budget to be configured", self.field)
            }
            ConfigProblem::MustBeOmitted => write!(
                f,
                "{} must be omitted because the bulkhead was built without a token budget",
                self.field
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Invalid token usage or reservation input. Nothing changed.
///
/// ```
/// use llm_bulkhead::{Usage, UsageError, Bulkhead, Demand, Reservation, Reconcile};
/// let b = Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap();
/// let mut a = b.try_acquire(Demand::tokens(Reservation::new(100, 100).unwrap())).unwrap();
/// let err = a.report_usage_reconciled(Usage::new(10, 0), Reconcile { remaining_output: 500, safety_margin: 0 });
/// assert!(matches!(err, Err(UsageError::RemainingExceedsCap { remaining: 500, cap: 100 })));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageError {
    /// A sum of token counts does not fit in a `u64`.
    Overflow {
        /// What overflowed.
        field: &'static str,
    },
    /// `remaining_output` is larger than the reserved output cap.
    RemainingExceedsCap {
        /// The remaining output given.
        remaining: u64,
        /// The reservation's `max_output`.
        cap: u64,
    },
    /// The new hold would push the tokens held in flight past [`MAX_TOKENS`](crate::MAX_TOKENS).
    HoldTooLarge {
        /// The hold the report asked for.
        hold: u64,
        /// The largest number of tokens that can be held at once.
        max: u64,
    },
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageError::Overflow { field } => write!(f, "{field} overflows a 64-bit token count"),
            UsageError::RemainingExceedsCap { remaining, cap } => write!(
                f,
                "remaining_output = {remaining} must not exceed the reserved output cap {cap}"
            ),
            UsageError::HoldTooLarge { hold, max } => write!(
                f,
                "a hold of {hold} tokens would exceed the {max} tokens that can be held in flight"
            ),
        }
    }
}

impl std::error::Error for UsageError {}
