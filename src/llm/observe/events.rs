//! The events of observe mode (reference §10.2 `bypass`, `bypassUsage`, `bypassRelease`):
//! payloads of [`Event::Extension`](crate::Event::Extension), delivered in the bulkhead's one
//! event stream and read with [`LlmEvent::of`](crate::llm::LlmEvent::of). Their names
//! ([`Event::name`](crate::Event::name)) are `bypass`, `bypass_usage` and `bypass_release`.

use super::id::RunId;
use crate::{CapacityDetail, Constraint, Priority, Reconcile, RejectReason, Reservation, Usage};

/// Observe-mode work that runs without an admission: `LlmBulkhead::run` was refused for one of
/// its shadow reasons and ran the work anyway, holding nothing (reference §9.4, `bypass`).
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::llm::LlmEvent;
/// use llm_bulkhead::{Bulkhead, Event, RejectReason};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Some(LlmEvent::Bypass(b)) = LlmEvent::of(e) {
///     assert_eq!((b.reason, b.raced), (RejectReason::ConcurrencyLimit, false));
///     assert!(b.admission_id.is_shadow());
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(())).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassEvent {
    /// The bypass's shadow id ([`RunId::is_shadow`]).
    pub admission_id: RunId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The refusal's reason.
    pub reason: RejectReason,
    /// The refusal's constraint (with classes).
    pub constraint: Option<Constraint>,
    /// The capacity the refusal saw.
    pub detail: CapacityDetail,
    /// The reservation it would have taken (`None` without a budget); nothing is held.
    pub reservation: Option<Reservation>,
    /// The advisory check said "admit" and the real decision refused (a queue timeout, or
    /// capacity taken in between).
    pub raced: bool,
}

/// A usage report of bypassed work that changed its usage (reference `bypassUsage`). Nothing
/// is held, so there is no hold or delta.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::llm::LlmEvent;
/// use llm_bulkhead::{Bulkhead, Event, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Some(LlmEvent::BypassUsage(u)) = LlmEvent::of(e) {
///     assert_eq!((u.sequence, u.usage), (1, Usage::new(3, 2)));
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// llm.run_blocking(&LlmRequest::default(), observe, |ctx| ctx.report_usage(Usage::new(3, 2))).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassUsageEvent {
    /// The bypass's shadow id.
    pub admission_id: RunId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The bypassed refusal's reason.
    pub reason: RejectReason,
    /// The new sequence number.
    pub sequence: u64,
    /// The reservation it would have taken (`None` without a budget).
    pub reservation: Option<Reservation>,
    /// The clamped cumulative usage.
    pub usage: Usage,
    /// The reservation's `max_output` (`None` without a budget).
    pub output_cap: Option<u64>,
    /// `max(0, max_output − output)` (`None` without a budget).
    pub output_remaining: Option<u64>,
    /// `consumed > reserved` (false without a budget).
    pub over_reservation: bool,
    /// The progressive reconciliation, when the report had one (validated, not applied).
    pub progressive: Option<Reconcile>,
}

/// Bypassed work finished (reference `bypassRelease`); nothing was held, nothing goes back.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::llm::LlmEvent;
/// use llm_bulkhead::{Bulkhead, Event, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let sub = llm.bulkhead().subscribe(|e: &Event| if let Some(LlmEvent::BypassRelease(r)) = LlmEvent::of(e) {
///     assert_eq!((r.usage_sequence, r.usage), (0, Some(Usage::new(3, 2))));
/// });
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() }
///     .with_usage(|u: &Usage| Some(*u));
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(Usage::new(3, 2))).unwrap();
/// # drop(sub);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BypassReleaseEvent {
    /// The bypass's shadow id.
    pub admission_id: RunId,
    /// The revision of the refusal it bypassed.
    pub revision: u64,
    /// Its priority.
    pub priority: Priority,
    /// Its class name (with classes).
    pub class: Option<String>,
    /// The bypassed refusal's reason.
    pub reason: RejectReason,
    /// The reservation it would have taken (`None` without a budget).
    pub reservation: Option<Reservation>,
    /// The usage sequence at the end.
    pub usage_sequence: u64,
    /// The final usage (from the result, else the last report).
    pub usage: Option<Usage>,
}

crate::llm::events::payload!(BypassEvent, "bypass");
crate::llm::events::payload!(BypassUsageEvent, "bypass_usage");
crate::llm::events::payload!(BypassReleaseEvent, "bypass_release");
