//! The coordinator's typed errors: bad input (refused before anything changes) and admission
//! outcomes (a ticket that never started), kept apart from any failure of the work itself.

use std::fmt;

/// Why a ticket ended without starting. None of these is a source attempt: a retry policy
/// sees them as admission outcomes ([`is_admission`](AdmissionError::is_admission) is always
/// true) and never as a failure of the work.
///
/// ```
/// use llm_bulkhead::coordinator::AdmissionError;
/// assert!(AdmissionError::Overflow.is_admission());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
// A whole word: in `Result<Invocation, AdmissionError>` the error then sits over a whole field
// of the invocation, not over one byte of it, so moving an `Ok` (every `wait_blocking`) copies
// whole words instead of byte-shifted pieces that stall the store buffer (about 7% of an
// uncontended admit and release).
#[repr(u64)]
pub enum AdmissionError {
    /// The ticket could not start and the queue was at its cap (AdmissionOverflowError).
    Overflow,
    /// The ticket waited in the queue until its admission timeout.
    Timeout,
    /// The coordinator was closed (before the submit, or while the ticket was queued).
    Closed,
    /// The ticket's owner cancelled it while it was queued.
    Cancelled,
}

impl AdmissionError {
    /// Always true: every variant is an admission outcome, never a source failure (so never
    /// counted as a source attempt nor shown to a retry predicate).
    ///
    /// ```
    /// assert!(llm_bulkhead::coordinator::AdmissionError::Closed.is_admission());
    /// ```
    pub fn is_admission(&self) -> bool {
        true
    }
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AdmissionError::Overflow => "admission queue overflow",
            AdmissionError::Timeout => "admission timeout",
            AdmissionError::Closed => "admission closed",
            AdmissionError::Cancelled => "cancelled while queued for admission",
        })
    }
}

impl std::error::Error for AdmissionError {}

/// A coordinator call refused (nothing changed), or a submit's admission outcome.
///
/// ```
/// use llm_bulkhead::coordinator::{AdmissionError, CoordinatorError};
/// let e = CoordinatorError::Admission(AdmissionError::Overflow);
/// assert_eq!(e.admission(), Some(AdmissionError::Overflow));
/// assert_eq!(CoordinatorError::ZeroClientLimit.admission(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CoordinatorError {
    /// No provider of that name (providers are fixed when the coordinator is built).
    UnknownProvider(String),
    /// The client-wide concurrency limit is zero.
    ZeroClientLimit,
    /// A provider's concurrency limit is zero (use `None` for no limit).
    ZeroProviderLimit(String),
    /// The coordinator was built without providers.
    NoProviders,
    /// Two providers share a name.
    DuplicateProvider(String),
    /// An admission timeout of zero (C4: it is meaningless; give none for no timeout).
    ZeroAdmissionTimeout,
    /// A deadline (now + an admission timeout or a cooldown delay) past the clock's end.
    DeadlineOverflow,
    /// The submit's admission outcome (overflow, closed).
    Admission(AdmissionError),
}

impl CoordinatorError {
    /// The admission outcome, if this is one.
    ///
    /// ```
    /// use llm_bulkhead::coordinator::CoordinatorError;
    /// assert!(CoordinatorError::NoProviders.admission().is_none());
    /// ```
    pub fn admission(&self) -> Option<AdmissionError> {
        match self {
            CoordinatorError::Admission(a) => Some(*a),
            _ => None,
        }
    }
}

impl fmt::Display for CoordinatorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoordinatorError::UnknownProvider(p) => write!(f, "unknown provider `{p}`"),
            CoordinatorError::ZeroClientLimit => f.write_str("the client limit must be at least 1"),
            CoordinatorError::ZeroProviderLimit(p) => {
                write!(f, "provider `{p}`: a limit must be at least 1 (or none)")
            }
            CoordinatorError::NoProviders => f.write_str("a coordinator needs a provider"),
            CoordinatorError::DuplicateProvider(p) => write!(f, "provider `{p}` named twice"),
            CoordinatorError::ZeroAdmissionTimeout => {
                f.write_str("an admission timeout must be at least 1 ms (or none)")
            }
            CoordinatorError::DeadlineOverflow => f.write_str("the deadline overflows the clock"),
            CoordinatorError::Admission(a) => a.fmt(f),
        }
    }
}

impl std::error::Error for CoordinatorError {}
