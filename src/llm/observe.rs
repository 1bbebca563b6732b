//! Observe (shadow) mode of `run` (reference §9.4): admission is attempted as usual, and work
//! refused for one of the configured *shadow reasons* runs anyway, without an admission. The
//! details are on [`Mode`].
//!
//! A gateway rolling out limits first runs them in observe mode: every decision is made and
//! counted as it would be, the work that enforce mode would have refused is marked *bypassed*
//! (its own events, [`LlmEvent`](super::LlmEvent), and counters, [`ObserveStats`](super::ObserveStats) in
//! `stats().observe`), and the capacity accounting sees only the work that was really
//! admitted. Then it switches partitions to enforce one at a time.
//!
//! Everything of observe mode lives in this layer: its events ([`events`]), its counters
//! ([`stats`], one set per bulkhead in the bulkhead's extension slot) and its shadow ids
//! ([`id`], in the core's reserved id space). The core knows none of it.
//!
//! ```
//! use llm_bulkhead::llm::{AdmissionKind, LlmBulkhead, LlmRequest, Mode, RunOptions};
//! use llm_bulkhead::{Bulkhead, RejectReason, Reservation};
//! let llm = LlmBulkhead::new(
//!     Bulkhead::builder().max_concurrent(1).token_budget(0).build().unwrap(),
//!     |_: &LlmRequest| Ok(Reservation::new(5, 5).unwrap()),
//! );
//! let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
//! let out = llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
//!     assert_eq!(ctx.admission_kind(), AdmissionKind::Bypassed);
//!     assert_eq!(ctx.bypass_reason(), Some(RejectReason::BudgetLimit));
//!     Ok::<_, ()>("proxied")
//! });
//! assert_eq!(out.unwrap(), "proxied");
//! let s = llm.stats();
//! assert_eq!((s.bulkhead.admitted, s.bulkhead.token_budget.unwrap().in_flight_tokens), (0, 0));
//! assert_eq!(s.observe.unwrap().bypassed, 1);
//! ```

use crate::shared::Shared;
use crate::{
    Bulkhead, CancelToken, ClassId, Demand, Priority, Reconcile, RejectReason, Rejection,
    Reservation, Usage, UsageError, UsageReport, WaitOptions,
};
use events::{BypassEvent, BypassReleaseEvent, BypassUsageEvent};
use id::RunId;
use stats::ObserveCounters;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub(crate) mod events;
pub(crate) mod id;
pub(crate) mod stats;

/// How `run` treats a refusal: enforce it (the default), or observe it.
///
/// The mode is per call ([`RunOptions::mode`](super::RunOptions::mode)), so a gateway can
/// observe one partition (a class, a tenant, a route) while it enforces another, and switch
/// without rebuilding anything.
///
/// The order of one observe-mode `run`:
///
/// 1. Validation and estimation, as in enforce mode (errors are [`RunError::Invalid`]).
/// 2. The fast decision of enforce mode (a free slot, nobody queued, no class, no cancel
///    token): if it admits, the run is admitted and nothing else happens. (The reference asks
///    the advisory check first; an admission this fast decision grants is one the advisory
///    check would have approved, so the outcomes are the same and observe mode costs what
///    enforce mode costs when it admits.)
/// 3. The advisory [`Bulkhead::would_admit`]: a refusal for a shadow reason bypasses
///    (`raced = false`; nothing counted as rejected, as in the reference).
/// 4. The real acquire (waiting in the queue when the advisory check said it would queue). A
///    refusal for a shadow reason, already counted and reported as a `reject` event, bypasses
///    with `raced` = whether the advisory check said "admit" (typically a queue timeout).
///    Any other refusal is returned as [`RunError::Rejected`].
/// 5. Before bypassing, a hard check: a cancelled [`CancelToken`] is
///    refused with `aborted` and a closed bulkhead with `shutdown` (counted, with a `reject`
///    event). These are never bypassed.
///
/// Bypassed work holds no slot and no tokens: `admitted`, `released`, `in_flight` and the
/// token figures do not change. Its [`RunContext`](super::RunContext) says
/// [`AdmissionKind::Bypassed`], has a shadow id ([`RunId::is_shadow`]), validates and
/// clamps usage reports like an admission but holds 0, and cannot abandon anything. A
/// borrowed-concurrency deadline does not apply to it (there is no slot to abandon).
///
/// Differences from the reference: `shutdown` is decided before capacity (CONTRACT §9.1), so a
/// closed bulkhead with an exhausted budget counts one `shutdown` refusal, not `budget_limit`
/// and `shutdown` (its B2); invalid mode or shadow-reason names are parse errors
/// ([`ModeError`]) rather than run-time rejections.
///
/// [`RunError::Invalid`]: super::RunError::Invalid
/// [`RunError::Rejected`]: super::RunError::Rejected
///
/// ```
/// use llm_bulkhead::llm::{Mode, ShadowReasons};
/// assert_eq!(Mode::default(), Mode::Enforce);
/// assert_eq!(Mode::observe(), Mode::Observe(ShadowReasons::ALL));
/// assert_eq!("observe".parse::<Mode>().unwrap(), Mode::observe());
/// assert_eq!(Mode::observe().as_str(), "observe");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A refusal is the answer ([`RunError::Rejected`](super::RunError::Rejected)).
    #[default]
    Enforce,
    /// A refusal for one of these reasons runs the work anyway, without an admission; other
    /// refusals are answered.
    Observe(ShadowReasons),
}

impl Mode {
    /// Observe mode with every shadow reason (the reference's default).
    ///
    /// ```
    /// use llm_bulkhead::llm::Mode;
    /// assert!(matches!(Mode::observe(), Mode::Observe(r) if r.len() == 4));
    /// ```
    #[must_use]
    pub const fn observe() -> Mode {
        Mode::Observe(ShadowReasons::ALL)
    }

    /// The wire name: `enforce` or `observe`.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::llm::Mode::Enforce.as_str(), "enforce");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Observe(_) => "observe",
        }
    }
}

impl FromStr for Mode {
    type Err = ModeError;

    /// `enforce`, or `observe` (with every shadow reason).
    fn from_str(s: &str) -> Result<Mode, ModeError> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "observe" => Ok(Mode::observe()),
            _ => Err(ModeError::UnknownMode(s.to_owned())),
        }
    }
}

/// The refusal reasons observe mode bypasses: a subset of `budget_limit`,
/// `concurrency_limit`, `queue_limit` and `timeout`. `shutdown` and `aborted` can never be in
/// it.
///
/// ```
/// use llm_bulkhead::llm::ShadowReasons;
/// use llm_bulkhead::RejectReason;
/// let only = ShadowReasons::new([RejectReason::ConcurrencyLimit]).unwrap();
/// assert!(only.contains(RejectReason::ConcurrencyLimit));
/// assert!(!only.contains(RejectReason::BudgetLimit));
/// assert!(ShadowReasons::new([RejectReason::Shutdown]).is_err());
/// assert_eq!("budget_limit, timeout".parse::<ShadowReasons>().unwrap().len(), 2);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShadowReasons(u8);

impl ShadowReasons {
    /// `budget_limit`, `concurrency_limit`, `queue_limit` and `timeout` (the default).
    pub const ALL: ShadowReasons = ShadowReasons(
        1 << RejectReason::BudgetLimit as u8
            | 1 << RejectReason::ConcurrencyLimit as u8
            | 1 << RejectReason::QueueLimit as u8
            | 1 << RejectReason::Timeout as u8,
    );

    /// No reason: observe mode that bypasses nothing (every refusal is answered).
    pub const NONE: ShadowReasons = ShadowReasons(0);

    /// The set of `reasons`.
    ///
    /// # Errors
    /// [`ModeError::NotShadowable`] for `shutdown` or `aborted`.
    ///
    /// ```
    /// use llm_bulkhead::llm::ShadowReasons;
    /// use llm_bulkhead::RejectReason;
    /// let r = ShadowReasons::new([RejectReason::Timeout, RejectReason::QueueLimit]).unwrap();
    /// assert_eq!(r.iter().collect::<Vec<_>>(), [RejectReason::QueueLimit, RejectReason::Timeout]);
    /// ```
    pub fn new(
        reasons: impl IntoIterator<Item = RejectReason>,
    ) -> Result<ShadowReasons, ModeError> {
        reasons
            .into_iter()
            .try_fold(ShadowReasons::NONE, ShadowReasons::with)
    }

    /// This set and `reason`.
    ///
    /// # Errors
    /// [`ModeError::NotShadowable`] for `shutdown` or `aborted`.
    ///
    /// ```
    /// use llm_bulkhead::llm::ShadowReasons;
    /// use llm_bulkhead::RejectReason;
    /// let r = ShadowReasons::NONE.with(RejectReason::BudgetLimit).unwrap();
    /// assert_eq!(r.len(), 1);
    /// assert!(r.with(RejectReason::Aborted).is_err());
    /// ```
    pub fn with(self, reason: RejectReason) -> Result<ShadowReasons, ModeError> {
        let bit = 1 << reason as u8;
        if ShadowReasons::ALL.0 & bit == 0 {
            return Err(ModeError::NotShadowable(reason.as_str().to_owned()));
        }
        Ok(ShadowReasons(self.0 | bit))
    }

    /// Whether `reason` is in the set.
    ///
    /// ```
    /// use llm_bulkhead::llm::ShadowReasons;
    /// use llm_bulkhead::RejectReason;
    /// assert!(ShadowReasons::ALL.contains(RejectReason::QueueLimit));
    /// assert!(!ShadowReasons::ALL.contains(RejectReason::Shutdown));
    /// ```
    #[inline]
    #[must_use]
    pub fn contains(self, reason: RejectReason) -> bool {
        self.0 & (1 << reason as u8) != 0
    }

    /// The reasons in the set, in the order of [`RejectReason::COUNTED`].
    ///
    /// ```
    /// use llm_bulkhead::llm::ShadowReasons;
    /// assert_eq!(ShadowReasons::ALL.iter().count(), 4);
    /// ```
    pub fn iter(self) -> impl Iterator<Item = RejectReason> {
        RejectReason::COUNTED
            .into_iter()
            .filter(move |r| self.contains(*r))
    }

    /// How many reasons.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::llm::ShadowReasons::NONE.len(), 0);
    /// ```
    #[must_use]
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    ///
    /// ```
    /// assert!(llm_bulkhead::llm::ShadowReasons::NONE.is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl Default for ShadowReasons {
    /// [`ShadowReasons::ALL`].
    fn default() -> Self {
        ShadowReasons::ALL
    }
}

impl fmt::Debug for ShadowReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(RejectReason::as_str))
            .finish()
    }
}

impl FromStr for ShadowReasons {
    type Err = ModeError;

    /// A comma-separated list of reason names (spaces around names are ignored; an empty
    /// string is the empty set).
    fn from_str(s: &str) -> Result<ShadowReasons, ModeError> {
        let mut set = ShadowReasons::NONE;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let reason = RejectReason::COUNTED
                .into_iter()
                .find(|r| r.as_str() == name)
                .ok_or_else(|| ModeError::NotShadowable(name.to_owned()))?;
            set = set.with(reason)?;
        }
        Ok(set)
    }
}

/// An invalid observe-mode setting (the reference's "mode must be …" and "shadowReasons may
/// contain only …").
///
/// ```
/// use llm_bulkhead::llm::{Mode, ModeError, ShadowReasons};
/// let e = "invalid".parse::<Mode>().unwrap_err();
/// assert!(e.to_string().starts_with("mode must be"));
/// let e = "shutdown".parse::<ShadowReasons>().unwrap_err();
/// assert_eq!(e, ModeError::NotShadowable("shutdown".into()));
/// assert!(e.to_string().starts_with("shadow_reasons may contain only"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModeError {
    /// A mode name other than `enforce` or `observe`.
    UnknownMode(String),
    /// A shadow reason other than `budget_limit`, `concurrency_limit`, `queue_limit`,
    /// `timeout`.
    NotShadowable(String),
}

impl fmt::Display for ModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModeError::UnknownMode(s) => {
                write!(f, "mode must be \"enforce\" or \"observe\" (got {s:?})")
            }
            ModeError::NotShadowable(s) => write!(
                f,
                "shadow_reasons may contain only budget_limit, concurrency_limit, queue_limit \
                 and timeout (got {s:?})"
            ),
        }
    }
}

impl std::error::Error for ModeError {}

/// Whether a run's work was admitted or bypassed (observe mode).
///
/// ```
/// use llm_bulkhead::llm::AdmissionKind;
/// assert_eq!(AdmissionKind::Bypassed.as_str(), "bypassed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum AdmissionKind {
    /// It holds an admission.
    Admitted,
    /// Observe mode ran it without one.
    Bypassed,
}

impl AdmissionKind {
    /// The wire name: `admitted` or `bypassed`.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::llm::AdmissionKind::Admitted.as_str(), "admitted");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionKind::Admitted => "admitted",
            AdmissionKind::Bypassed => "bypassed",
        }
    }
}

/// The hard check before a bypass: a cancelled token is refused with `aborted`, a closed
/// bulkhead with `shutdown`, both counted and reported (reference §9.4).
pub(crate) fn hard_refusal(b: &Bulkhead, demand: &Demand, wait: &WaitOptions) -> Option<Rejection> {
    if wait.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
        return Some(b.waiter_refusal(RejectReason::Aborted, demand));
    }
    if b.is_closed() {
        return Some(b.waiter_refusal(RejectReason::Shutdown, demand));
    }
    None
}

/// Bypassed work: what its context answers, its usage, and its settlement (once, at the end
/// or when dropped).
pub(crate) struct Bypassed {
    bulkhead: Bulkhead,
    counters: Arc<ObserveCounters>,
    pub(crate) id: RunId,
    pub(super) priority: Priority,
    pub(crate) class: Option<ClassId>,
    pub(super) reservation: Option<Reservation>,
    pub(super) rejection: Rejection,
    pub(super) raced: bool,
    reported: Option<Usage>,
    sequence: u64,
    settled: bool,
}

impl Bypassed {
    /// Counts the bypass of `demand` (refused with `rejection`) in `counters` (those of
    /// `b`: [`ObserveCounters::of`]) and reports it.
    pub(crate) fn begin(
        b: &Bulkhead,
        counters: &Arc<ObserveCounters>,
        demand: &Demand,
        rejection: Rejection,
        raced: bool,
    ) -> Bypassed {
        let shared = &*b.shared;
        let n = counters.bypass(rejection.reason, raced);
        let id = RunId::shadow(shared.id_prefix, n);
        let class = shared.classed.then(|| {
            // A class index is below `MAX_CLASSES`, which fits a `u8`.
            let k = b
                .class_index(demand.class())
                .unwrap_or(shared.default_class);
            ClassId::new(shared.class_owner, k)
        });
        let bypassed = Bypassed {
            bulkhead: b.clone(),
            counters: Arc::clone(counters),
            id,
            priority: demand.priority(),
            class,
            reservation: shared
                .has_budget
                .then(|| demand.reservation().unwrap_or(Reservation::ZERO)),
            rejection,
            raced,
            reported: None,
            sequence: 0,
            settled: false,
        };
        super::events::emit(b, || {
            let r = &bypassed.rejection;
            BypassEvent {
                admission_id: bypassed.id,
                revision: r.revision,
                priority: bypassed.priority,
                class: bypassed.class_name(shared),
                reason: r.reason,
                constraint: r.constraint,
                detail: r.detail(),
                reservation: bypassed.reservation,
                raced,
            }
        });
        bypassed
    }

    fn class_name(&self, shared: &Shared) -> Option<String> {
        crate::handle::events::class_name(shared, self.class.map(ClassId::index))
    }

    /// The revision of the bypassed refusal.
    pub(super) fn revision(&self) -> u64 {
        self.rejection.revision
    }

    /// Validates and clamps like [`Admission::report_usage`](crate::Admission::report_usage),
    /// but holds nothing; the sequence moves only when the clamped usage changes.
    pub(crate) fn report_usage_reconciled(
        &mut self,
        usage: Usage,
        reconcile: Option<Reconcile>,
    ) -> Result<UsageReport, UsageError> {
        let (clamped, consumed) = crate::handle::admission::checked_report(
            usage,
            self.reported,
            self.reservation,
            reconcile,
        )?;
        let bumped = !self.settled && self.reported != Some(clamped);
        if bumped {
            self.sequence += 1;
            self.reported = Some(clamped);
        }
        let reserved = self.reservation.map_or(0, |r| r.total());
        let report = UsageReport {
            admission_id: self.id.into(),
            revision: self.revision(),
            class: self.class,
            sequence: self.sequence,
            reserved,
            held: 0,
            consumed,
            output_cap: self.reservation.map(|r| r.max_output()),
            output_remaining: self
                .reservation
                .map(|r| r.max_output().saturating_sub(clamped.output)),
            over_reservation: self.reservation.is_some() && consumed > reserved,
        };
        if bumped {
            let shared = &*self.bulkhead.shared;
            super::events::emit(&self.bulkhead, || BypassUsageEvent {
                admission_id: self.id,
                revision: self.revision(),
                priority: self.priority,
                class: self.class_name(shared),
                reason: self.rejection.reason,
                sequence: report.sequence,
                reservation: self.reservation,
                usage: clamped,
                output_cap: report.output_cap,
                output_remaining: report.output_remaining,
                over_reservation: report.over_reservation,
                progressive: reconcile,
            });
        }
        Ok(report)
    }

    /// Settles once: counts the final usage (`usage` if it is valid, else the last report)
    /// and reports the end.
    pub(crate) fn finish(&mut self, usage: Option<Usage>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let usage = usage.filter(|u| u.total().is_some()).or(self.reported);
        self.counters.settle(usage);
        let shared = &*self.bulkhead.shared;
        super::events::emit(&self.bulkhead, || BypassReleaseEvent {
            admission_id: self.id,
            revision: self.revision(),
            priority: self.priority,
            class: self.class_name(shared),
            reason: self.rejection.reason,
            reservation: self.reservation,
            usage_sequence: self.sequence,
            usage,
        });
    }
}

impl Drop for Bypassed {
    /// The work panicked or its future was dropped: settle with the last report.
    fn drop(&mut self) {
        self.finish(None);
    }
}
