//! Decision and completion events of the pools, and the observers that receive them.
//!
//! One [`DecisionEvent`] per decision (a dispatch, a fallback, a rejection, a degraded answer,
//! a retry charge) and one [`CompletionEvent`] per admitted request. Their fields are the
//! seed's sanitized record: ids, configured names, numbers, enums. Nothing from a request's
//! content reaches the pools, so nothing of it can reach an event.

use crate::Priority;
use std::time::Duration;

/// What a decision did with a request.
///
/// ```
/// assert_eq!(llm_bulkhead::pools::Decision::Dispatch.as_str(), "dispatch");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// Admitted: the request may call its provider.
    Dispatch,
    /// Refused here; the request goes on to the named fallback partition.
    Fallback,
    /// Refused: the caller answers with an overload error.
    Reject,
    /// Refused: the caller serves its documented degraded result.
    Degrade,
    /// A retry was charged to the partition's retry budget.
    Retry,
    /// Not now: the request waits in the partition's pending queue (its next decision is a
    /// dispatch or a rejection).
    Queue,
}

/// Why a decision was made. Refusal reasons name the limit that refused.
///
/// ```
/// assert_eq!(llm_bulkhead::pools::Reason::ConnectionLimitReached.as_str(), "connection_limit_reached");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reason {
    /// Every limit had room.
    CapacityAvailable,
    /// Admitted in observe mode although a partition limit would have refused it.
    ObservedOverLimit,
    /// The partition's active limit.
    ActiveLimitReached,
    /// The partition's remaining units are its high-priority reserve.
    HighPriorityReserve,
    /// The partition's token budget.
    TokenBudgetReached,
    /// The provider's connection limit.
    ConnectionLimitReached,
    /// The global guard.
    GlobalLimitReached,
    /// The partition's retry budget.
    RetryBudgetReached,
    /// The request allows no fallback, or every approved fallback already refused it.
    NoEligibleFallback,
    /// The request's attempt budget is spent.
    AttemptBudgetSpent,
    /// The partition's pending queue is full.
    PendingLimitReached,
    /// The request waited its partition's `queue_max_age_ms` without starting.
    QueueAgeExceeded,
    /// Refused at entry: the caller's deadline has passed, or is nearer than the age of the
    /// partition's oldest waiter (a queue that old is not drained in time), or the request
    /// asks more tokens than the partition's whole budget.
    DeadlineUnmeetable,
    /// The caller's deadline passed while the request waited.
    DeadlineExceeded,
}

impl Decision {
    /// The snake_case name used in events and metrics.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::pools::Decision::Degrade.as_str(), "degrade");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Dispatch => "dispatch",
            Decision::Fallback => "fallback",
            Decision::Reject => "reject",
            Decision::Degrade => "degrade",
            Decision::Retry => "retry",
            Decision::Queue => "queue",
        }
    }
}

impl Reason {
    /// The snake_case name used in events and metrics.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::pools::Reason::CapacityAvailable.as_str(), "capacity_available");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::CapacityAvailable => "capacity_available",
            Reason::ObservedOverLimit => "observed_over_limit",
            Reason::ActiveLimitReached => "active_limit_reached",
            Reason::HighPriorityReserve => "high_priority_reserve",
            Reason::TokenBudgetReached => "token_budget_reached",
            Reason::ConnectionLimitReached => "connection_limit_reached",
            Reason::GlobalLimitReached => "global_limit_reached",
            Reason::RetryBudgetReached => "retry_budget_reached",
            Reason::NoEligibleFallback => "no_eligible_fallback",
            Reason::AttemptBudgetSpent => "attempt_budget_spent",
            Reason::PendingLimitReached => "pending_limit_reached",
            Reason::QueueAgeExceeded => "queue_age_exceeded",
            Reason::DeadlineUnmeetable => "deadline_unmeetable",
            Reason::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

/// How an admitted request ended, for its completion event.
///
/// ```
/// assert_eq!(llm_bulkhead::pools::FailureClass::UpstreamOverload.as_str(), "upstream_overload");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureClass {
    /// The provider answered that it is overloaded (429, 503, 529).
    UpstreamOverload,
    /// Another provider error (5xx, a reset connection).
    UpstreamError,
    /// The attempt timed out.
    Timeout,
    /// The caller cancelled the request.
    Cancelled,
    /// The permit was dropped without [`complete`](super::PoolPermit::complete).
    Dropped,
}

impl FailureClass {
    /// The snake_case name used in events and metrics.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::pools::FailureClass::Dropped.as_str(), "dropped");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::UpstreamOverload => "upstream_overload",
            FailureClass::UpstreamError => "upstream_error",
            FailureClass::Timeout => "timeout",
            FailureClass::Cancelled => "cancelled",
            FailureClass::Dropped => "dropped",
        }
    }
}

/// One decision, with the seed's sanitized fields (`bulkhead_decision`).
///
/// ```
/// use llm_bulkhead::pools::*;
/// let e = DecisionEvent {
///     request_id: 42, provider: "primary", partition: "primary-interactive",
///     traffic_class: "interactive", priority: llm_bulkhead::Priority::High,
///     active: 24, active_limit: 24, pending: 0, pending_limit: 0,
///     retry_count: 0, retry_limit: 3, decision: Decision::Fallback,
///     reason: Reason::ActiveLimitReached, fallback_partition: Some("secondary-interactive"),
///     limit_version: 1, attempt: 1,
/// };
/// assert_eq!(e.decision.as_str(), "fallback");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DecisionEvent<'a> {
    /// The caller's request id.
    pub request_id: u64,
    /// The partition's provider.
    pub provider: &'a str,
    /// The partition deciding.
    pub partition: &'a str,
    /// The partition's traffic class.
    pub traffic_class: &'a str,
    /// The request's priority.
    pub priority: Priority,
    /// Active requests of the partition after the decision (tentative ones included).
    pub active: u64,
    /// The partition's active limit.
    pub active_limit: u64,
    /// Waiting requests of the partition (no pending queue yet: always 0).
    pub pending: u64,
    /// The partition's pending limit (no pending queue yet: always 0).
    pub pending_limit: u64,
    /// Retries in flight in the partition.
    pub retry_count: u64,
    /// The retry budget's current limit, `max(percent × active / 100, min)`.
    pub retry_limit: u64,
    /// What was decided.
    pub decision: Decision,
    /// Why.
    pub reason: Reason,
    /// The partition the request goes to next ([`Decision::Fallback`] only).
    pub fallback_partition: Option<&'a str>,
    /// The partition's limit version the decision read.
    pub limit_version: u64,
    /// The attempt number of the request (1 for its first partition).
    pub attempt: u32,
}

/// The end of an admitted request (`bulkhead_completion`).
///
/// ```
/// use llm_bulkhead::pools::*;
/// let e = CompletionEvent {
///     request_id: 42, provider: "primary", partition: "primary-interactive",
///     traffic_class: "interactive", priority: llm_bulkhead::Priority::Normal,
///     latency: std::time::Duration::from_millis(5), failure_class: None,
///     limit_version: 1, retry: false,
/// };
/// assert!(e.failure_class.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CompletionEvent<'a> {
    /// The caller's request id.
    pub request_id: u64,
    /// The partition's provider.
    pub provider: &'a str,
    /// The partition that admitted the request.
    pub partition: &'a str,
    /// The partition's traffic class.
    pub traffic_class: &'a str,
    /// The request's priority.
    pub priority: Priority,
    /// From the admission to the completion.
    pub latency: Duration,
    /// How it failed (`None`: it succeeded).
    pub failure_class: Option<FailureClass>,
    /// The limit version of the admission.
    pub limit_version: u64,
    /// Whether the request was a retry (it held a retry-budget unit).
    pub retry: bool,
}

/// Receives every decision and completion of a [`Pools`](super::Pools). Called on the
/// deciding thread, after the decision: keep it cheap.
///
/// ```
/// use llm_bulkhead::pools::*;
/// struct Count(std::sync::atomic::AtomicU64);
/// impl PoolsObserver for Count {
///     fn on_decision(&self, _: &DecisionEvent<'_>) {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     }
///     fn on_completion(&self, _: &CompletionEvent<'_>) {}
/// }
/// ```
pub trait PoolsObserver: Send + Sync {
    /// One decision.
    fn on_decision(&self, event: &DecisionEvent<'_>);
    /// One completion.
    fn on_completion(&self, event: &CompletionEvent<'_>);
}

impl<A: PoolsObserver, B: PoolsObserver> PoolsObserver for (A, B) {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        self.0.on_decision(e);
        self.1.on_decision(e);
    }
    fn on_completion(&self, e: &CompletionEvent<'_>) {
        self.0.on_completion(e);
        self.1.on_completion(e);
    }
}

/// Emits each event as a `tracing` event, target `llm_bulkhead::pools` (feature `tracing`):
/// dispatches and completions at `DEBUG`, every other decision at `INFO`.
///
/// ```
/// use llm_bulkhead::pools::{PoolsObserver, TracingObserver};
/// fn takes(_: impl PoolsObserver) {}
/// takes(TracingObserver);
/// ```
#[cfg(feature = "tracing")]
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingObserver;

#[cfg(feature = "tracing")]
impl PoolsObserver for TracingObserver {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        macro_rules! emit {
            ($level:expr) => {
                tracing::event!(target: "llm_bulkhead::pools", $level,
                    event = "bulkhead_decision", request_id = e.request_id,
                    provider = e.provider, partition = e.partition,
                    traffic_class = e.traffic_class, priority = ?e.priority,
                    active = e.active, active_limit = e.active_limit,
                    pending = e.pending, pending_limit = e.pending_limit,
                    retry_count = e.retry_count, retry_limit = e.retry_limit,
                    decision = e.decision.as_str(), reason = e.reason.as_str(),
                    fallback_partition = e.fallback_partition,
                    limit_version = e.limit_version, attempt = e.attempt)
            };
        }
        if e.decision == Decision::Dispatch {
            emit!(tracing::Level::DEBUG)
        } else {
            emit!(tracing::Level::INFO)
        }
    }

    fn on_completion(&self, e: &CompletionEvent<'_>) {
        tracing::debug!(target: "llm_bulkhead::pools", event = "bulkhead_completion",
            request_id = e.request_id, provider = e.provider, partition = e.partition,
            traffic_class = e.traffic_class, priority = ?e.priority,
            latency_ms = e.latency.as_secs_f64() * 1e3,
            failure_class = e.failure_class.map(FailureClass::as_str),
            limit_version = e.limit_version, retry = e.retry);
    }
}

/// Counts decisions and completions through the `metrics` facade (feature `metrics`):
/// `llm_bulkhead_pool_decisions_total{partition, provider, traffic_class, decision, reason}`,
/// `llm_bulkhead_pool_completions_total{partition, provider, traffic_class, failure_class}`
/// and the histogram `llm_bulkhead_pool_latency_seconds{partition}`. Gauges come from
/// [`Pools::record_gauges`](super::Pools::record_gauges).
///
/// ```
/// use llm_bulkhead::pools::{PoolsObserver, MetricsObserver};
/// fn takes(_: impl PoolsObserver) {}
/// takes(MetricsObserver);
/// ```
#[cfg(feature = "metrics")]
#[derive(Clone, Copy, Debug, Default)]
pub struct MetricsObserver;

#[cfg(feature = "metrics")]
impl PoolsObserver for MetricsObserver {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        metrics::counter!("llm_bulkhead_pool_decisions_total",
            "partition" => e.partition.to_owned(), "provider" => e.provider.to_owned(),
            "traffic_class" => e.traffic_class.to_owned(),
            "decision" => e.decision.as_str(), "reason" => e.reason.as_str())
        .increment(1);
    }

    fn on_completion(&self, e: &CompletionEvent<'_>) {
        let failure = e.failure_class.map_or("none", FailureClass::as_str);
        metrics::counter!("llm_bulkhead_pool_completions_total",
            "partition" => e.partition.to_owned(), "provider" => e.provider.to_owned(),
            "traffic_class" => e.traffic_class.to_owned(), "failure_class" => failure)
        .increment(1);
        metrics::histogram!("llm_bulkhead_pool_latency_seconds",
            "partition" => e.partition.to_owned())
        .record(e.latency.as_secs_f64());
    }
}
