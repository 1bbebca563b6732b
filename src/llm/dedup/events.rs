//! The de-duplication event (`dedup`): a payload of
//! [`Event::Extension`](crate::Event::Extension), delivered in the bulkhead's one event stream
//! and read with [`LlmEvent::of`](crate::llm::LlmEvent::of).

/// What happened to a de-duplicated `run` (the LLM layer's `LlmBulkhead::run_shared`).
///
/// ```
/// use llm_bulkhead::llm::DedupOutcome;
/// assert_eq!(DedupOutcome::Joined.as_str(), "joined");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum DedupOutcome {
    /// The call joined an identical call in flight (a follower): it runs nothing and takes no
    /// admission of its own (the reference's `dedup` event).
    Joined,
    /// A follower got no result: the leader's could not be shared with it.
    Unshareable,
    /// A follower gave up at its own timeout; the shared call goes on.
    Timeout,
    /// A follower's own cancellation token fired while it waited; the shared call goes on.
    Cancelled,
}

impl DedupOutcome {
    /// The snake_case name.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::llm::DedupOutcome::Unshareable.as_str(), "unshareable");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DedupOutcome::Joined => "joined",
            DedupOutcome::Unshareable => "unshareable",
            DedupOutcome::Timeout => "timeout",
            DedupOutcome::Cancelled => "cancelled",
        }
    }
}

/// A de-duplication event: a follower joined a call in flight, or got no result from it.
/// Carries no request and no key (correlate by class and time).
///
/// ```
/// use llm_bulkhead::llm::{DedupEvent, DedupOutcome};
/// fn joined_in(e: &DedupEvent) -> Option<&str> {
///     (e.outcome == DedupOutcome::Joined).then_some(e.class.as_deref()).flatten()
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct DedupEvent {
    /// The class of the follower's partition (with classes).
    pub class: Option<String>,
    /// What happened.
    pub outcome: DedupOutcome,
}

crate::llm::events::payload!(DedupEvent, "dedup");
