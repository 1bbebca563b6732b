//! What a caller asks the core for: a [`Demand`] (a slot, an optional token [`Reservation`], a
//! [`Priority`]), and what it reports afterwards: [`Usage`] and [`Reconcile`].
//!
//! The core knows nothing of LLM requests; the LLM layer turns a request into a `Demand`.

use crate::vocab::error::UsageError;

/// Request priority. It changes only the effective token budget:
/// `eff(High) = budget`, `eff(Normal) = max(0, budget − high_priority_reserve)`. It has no effect
/// on queue order.
///
/// ```
/// use llm_bulkhead::Priority;
/// assert_eq!(Priority::default(), Priority::Normal);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Priority {
    /// Normal priority: may not use the high-priority reserve.
    #[default]
    Normal,
    /// High priority: may use the whole budget.
    High,
}

/// A token reservation, `input + max_output`, fixed before admission.
///
/// Its total is checked when it is made, so an admission never sees an overflowing reservation.
///
/// ```
/// use llm_bulkhead::Reservation;
/// let r = Reservation::new(1_000, 500).unwrap();
/// assert_eq!(r.total(), 1_500);
/// assert!(Reservation::new(u64::MAX, 1).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Reservation {
    input: u64,
    max_output: u64,
}

impl Reservation {
    /// The empty reservation: what a slot-only demand reserves on a bulkhead with a budget.
    pub const ZERO: Reservation = Reservation {
        input: 0,
        max_output: 0,
    };

    /// A reservation of `input` estimated input tokens and `max_output` output tokens.
    ///
    /// # Errors
    /// [`UsageError::Overflow`] when `input + max_output` does not fit in a `u64`.
    pub fn new(input: u64, max_output: u64) -> Result<Self, UsageError> {
        input.checked_add(max_output).ok_or(UsageError::Overflow {
            field: "reservation",
        })?;
        Ok(Reservation { input, max_output })
    }

    /// Estimated input tokens.
    ///
    /// ```
    /// # use llm_bulkhead::Reservation;
    /// assert_eq!(Reservation::new(3, 4).unwrap().input(), 3);
    /// ```
    #[must_use]
    pub fn input(&self) -> u64 {
        self.input
    }

    /// Maximum output tokens (the output cap).
    ///
    /// ```
    /// # use llm_bulkhead::Reservation;
    /// assert_eq!(Reservation::new(3, 4).unwrap().max_output(), 4);
    /// ```
    #[must_use]
    pub fn max_output(&self) -> u64 {
        self.max_output
    }

    /// `input + max_output`: the tokens an admission holds when it starts.
    ///
    /// ```
    /// # use llm_bulkhead::Reservation;
    /// assert_eq!(Reservation::new(3, 4).unwrap().total(), 7);
    /// ```
    #[must_use]
    pub fn total(&self) -> u64 {
        // Cannot overflow: checked in `new`.
        self.input + self.max_output
    }
}

/// One admission request to the core.
///
/// ```
/// use llm_bulkhead::{Demand, Priority, Reservation};
/// let d = Demand::tokens(Reservation::new(800, 200).unwrap()).with_priority(Priority::High);
/// assert_eq!(d.reservation().unwrap().total(), 1_000);
/// assert_eq!(Demand::slot().reservation(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Demand {
    reservation: Option<Reservation>,
    priority: Priority,
    class: Option<crate::ClassId>,
}

impl Demand {
    /// A slot only, no tokens (normal priority).
    ///
    /// ```
    /// # use llm_bulkhead::Demand;
    /// assert_eq!(Demand::slot(), Demand::default());
    /// ```
    #[must_use]
    pub fn slot() -> Self {
        Demand::default()
    }

    /// A slot and a token reservation (normal priority). On a bulkhead without a token budget
    /// the reservation is ignored: the admission then reserves nothing and reports `None`.
    ///
    /// ```
    /// # use llm_bulkhead::{Demand, Reservation};
    /// let d = Demand::tokens(Reservation::new(1, 2).unwrap());
    /// assert_eq!(d.reservation().unwrap().total(), 3);
    /// ```
    #[must_use]
    pub fn tokens(reservation: Reservation) -> Self {
        Demand {
            reservation: Some(reservation),
            ..Demand::default()
        }
    }

    /// The same demand with another priority.
    ///
    /// ```
    /// # use llm_bulkhead::{Demand, Priority};
    /// assert_eq!(Demand::slot().with_priority(Priority::High).priority(), Priority::High);
    /// ```
    #[must_use = "with_priority returns the changed demand; the original is moved"]
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The reservation, if any.
    ///
    /// ```
    /// # use llm_bulkhead::Demand;
    /// assert!(Demand::slot().reservation().is_none());
    /// ```
    #[must_use]
    pub fn reservation(&self) -> Option<Reservation> {
        self.reservation
    }

    /// The priority.
    ///
    /// ```
    /// # use llm_bulkhead::{Demand, Priority};
    /// assert_eq!(Demand::slot().priority(), Priority::Normal);
    /// ```
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The same demand in an admission class (otherwise the default class). A
    /// [`ClassId`](crate::ClassId) belongs to the bulkhead that resolved it; on a bulkhead whose
    /// table has no such position the demand is decided in that bulkhead's default class.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    /// let b = Bulkhead::builder().max_concurrent(2)
    ///     .class("batch", ClassLimits { max_concurrent: Some(1), ..Default::default() })
    ///     .class("interactive", ClassLimits::default()).default_class("interactive").build().unwrap();
    /// let batch = Demand::slot().in_class(b.class_id("batch").unwrap());
    /// let a = b.try_acquire(batch).unwrap();
    /// assert!(b.try_acquire(batch).is_err()); // the batch ceiling
    /// assert!(b.try_acquire(Demand::slot()).is_ok()); // the default class still fits
    /// # drop(a);
    /// ```
    #[must_use = "in_class returns the changed demand; the original is moved"]
    pub fn in_class(mut self, class: crate::ClassId) -> Self {
        self.class = Some(class);
        self
    }

    /// The class, if one was chosen.
    ///
    /// ```
    /// # use llm_bulkhead::Demand;
    /// assert_eq!(Demand::slot().class(), None);
    /// ```
    #[must_use]
    pub fn class(&self) -> Option<crate::ClassId> {
        self.class
    }
}

/// Cumulative token usage of one call, as reported by the provider.
///
/// ```
/// use llm_bulkhead::Usage;
/// let u = Usage::new(120, 80);
/// assert_eq!(u.total(), Some(200));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Usage {
    /// Input (prompt) tokens processed so far.
    pub input: u64,
    /// Output (completion) tokens generated so far.
    pub output: u64,
}

impl Usage {
    /// Usage of `input` input tokens and `output` output tokens.
    ///
    /// ```
    /// # use llm_bulkhead::Usage;
    /// assert_eq!(Usage::new(1, 2), Usage { input: 1, output: 2 });
    /// ```
    #[must_use]
    pub fn new(input: u64, output: u64) -> Self {
        Usage { input, output }
    }

    /// `input + output`, or `None` when it overflows.
    ///
    /// ```
    /// # use llm_bulkhead::Usage;
    /// assert_eq!(Usage::new(u64::MAX, 1).total(), None);
    /// ```
    #[must_use]
    pub fn total(&self) -> Option<u64> {
        self.input.checked_add(self.output)
    }

    /// The field-wise maximum: cumulative usage never decreases (CONTRACT.md §5).
    pub(crate) fn clamp_after(self, prev: Option<Usage>) -> Usage {
        match prev {
            None => self,
            Some(p) => Usage {
                input: p.input.max(self.input),
                output: p.output.max(self.output),
            },
        }
    }
}

/// Progressive reconciliation for [`report_usage`](crate::Admission::report_usage): the hold
/// becomes `remaining_output + safety_margin + max(0, output − max_output)`, so processed input
/// and generated output are no longer held.
///
/// ```
/// use llm_bulkhead::Reconcile;
/// let r = Reconcile { remaining_output: 900, safety_margin: 50 };
/// assert_eq!(r.remaining_output, 900);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Reconcile {
    /// Output tokens that may still be generated. Must not exceed the reservation's
    /// `max_output` when a budget is configured.
    pub remaining_output: u64,
    /// Extra tokens kept held as a margin.
    pub safety_margin: u64,
}
