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
//! let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
//! let h = m.try_acquire(Demand::slot()).unwrap();
//! assert_eq!(m.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
//! m.release(h, None).unwrap();
//! assert_eq!(m.stats().in_flight, 0);
//! ```

use crate::record::stats::{ClassTotals, RejectCounts, Stats, TokenStats};
use crate::vocab::class::Resources;
use crate::vocab::demand::{Reconcile, Reservation, Usage};
use crate::vocab::error::{ConfigError, ConfigProblem, UsageError};
use crate::vocab::id::AdmissionId;
use crate::vocab::rejection::{CapacityDetail, Constraint, RejectReason, Rejection, TokenCapacity};
use crate::words::classes::ClassView;
use crate::words::limits::ApplyLimitsError;
use crate::words::limits::HotClass;
use crate::{
    ClassId, Demand, LimitsChange, LimitsSnapshot, Priority, ReleaseReport, UsageReport, MAX_TOKENS,
};
use std::collections::{BTreeMap, VecDeque};

mod queue;
mod token_wait;

/// A handle to an admission held by the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(pub u64);

/// Why the model refused a usage report or a release.
///
/// ```
/// use llm_bulkhead::model::{Handle, Model, ModelError};
/// use llm_bulkhead::LimitsSnapshot;
/// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
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
    /// Class index and attribution (classes only).
    class: Option<(usize, Resources)>,
    abandoned: bool,
}

/// One class's state in the model.
#[derive(Clone, Copy, Debug, Default)]
struct ClassState {
    in_flight: u64,
    tokens: u64,
    totals: ClassTotals,
}

/// The sequential model of one bulkhead.
///
/// Token totals (`total_reserved`, `total_consumed`, `total_refunded`, `total_overrun`) wrap
/// modulo 2^64, as the engine's per-thread counters do: a single usage report may carry up to
/// `u64::MAX` tokens, so a sum of them can exceed any fixed width.
#[derive(Clone, Debug)]
pub struct Model {
    /// The identity its [`ClassId`]s carry (the harness gives it the engine's, so that reports
    /// compare equal).
    pub(crate) class_owner: crate::vocab::class::ClassOwner,
    limits: LimitsSnapshot,
    has_budget: bool,
    names: Vec<String>,
    default_class: usize,
    classes: Vec<ClassState>,
    closed: bool,
    in_flight: u64,
    tokens: u64,
    live: BTreeMap<Handle, Held>,
    next: u64,
    admitted: u64,
    released: u64,
    abandoned: u64,
    rejected: RejectCounts,
    reserved: u64,
    consumed: u64,
    refunded: u64,
    overrun: u64,
    /// Queued waiters, oldest first (one FIFO for every class).
    queue: VecDeque<Queued>,
    /// Answers not yet taken by their waiters.
    answers: BTreeMap<u64, Answer>,
    next_wait: u64,
    /// Token waiting (`BulkheadBuilder::wait_for_tokens`): a demand short only of tokens waits.
    wait_for_tokens: bool,
    /// Admissions that bypassed queued waiters ([`Model::bypassed`]).
    bypassed: u64,
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    id: u64,
    k: usize,
    r: u64,
    priority: Priority,
    reservation: Option<Reservation>,
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Admitted(Handle),
    /// Refused: reason, constraint, class, tokens, priority.
    Refused(RejectReason, Option<Constraint>, usize, u64, Priority),
}

/// A queued waiter of the model (see [`Model::acquire_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaitId(pub u64);

/// What [`Model::acquire_wait`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// Admitted at once.
    Admitted(Handle),
    /// Queued; its answer comes from [`Model::take_answer`].
    Queued(WaitId),
}

impl Model {
    /// A model without classes whose initial limits are `first` (validated as the builder
    /// validates).
    ///
    /// # Errors
    /// The same [`ConfigError`] the builder would give.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// assert!(Model::new(LimitsSnapshot { revision: 0, max_concurrent: 70_000, max_queue: 0, token_budget: None, classes: Default::default() }).is_err());
    /// ```
    pub fn new(first: LimitsSnapshot) -> Result<Model, ConfigError> {
        Model::with_classes(first, &[], 0)
    }

    /// A model with the class table `names` (limits in `first.classes`, same order) and the
    /// default class `names[default_class]`.
    ///
    /// # Errors
    /// The same [`ConfigError`] the builder would give for these limits.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, ClassLimits, Bulkhead};
    /// let b = Bulkhead::builder().max_concurrent(2).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// let m = Model::with_classes(b.limits(), &["a"], 0).unwrap();
    /// assert_eq!(m.stats().classes.unwrap().default_class, "a");
    /// ```
    pub fn with_classes(
        first: LimitsSnapshot,
        names: &[&str],
        default_class: usize,
    ) -> Result<Model, ConfigError> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        first.validate(first.token_budget.is_some(), &names)?;
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
            class_owner: crate::vocab::class::next_owner()?,
            limits: first,
            has_budget: first.token_budget.is_some(),
            classes: vec![ClassState::default(); names.len()],
            names,
            default_class,
            closed: false,
            in_flight: 0,
            tokens: 0,
            live: BTreeMap::new(),
            next: 0,
            admitted: 0,
            released: 0,
            abandoned: 0,
            rejected: RejectCounts::default(),
            reserved: 0,
            consumed: 0,
            refunded: 0,
            overrun: 0,
            queue: VecDeque::new(),
            answers: BTreeMap::new(),
            next_wait: 0,
            wait_for_tokens: false,
            bypassed: 0,
        })
    }

    fn eff(&self, p: Priority) -> Option<u64> {
        self.limits.token_budget.map(|b| b.effective(p))
    }

    fn class_limits(&self) -> Vec<HotClass> {
        self.limits
            .classes
            .iter()
            .map(|l| HotClass::from(*l))
            .collect()
    }

    /// One fail-fast decision (CONTRACT.md §2, rows 0–6), with the reference's formulas for
    /// floor protection (behaviour §4.3).
    ///
    /// # Errors
    /// The [`Rejection`] the engine must give in the same state.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 3, max_concurrent: 0, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// assert_eq!(m.try_acquire(Demand::slot()).unwrap_err().revision, 3);
    /// ```
    pub fn try_acquire(&mut self, d: Demand) -> Result<Handle, Rejection> {
        let reservation = self
            .has_budget
            .then(|| d.reservation().unwrap_or(Reservation::ZERO));
        let r = reservation.map_or(0, |x| x.total());
        let k = self.class_of(&d);
        let p = d.priority();
        match self.check(k, r, p, true) {
            Ok(borrow) => {
                // Admitted while waiters are queued: only an in-floor bypass can be.
                self.bypassed += u64::from(!self.queue.is_empty());
                Ok(self.admit(k, r, reservation, borrow))
            }
            Err((reason, constraint)) => Err(self.refuse(k, reason, constraint, r, p, 0)),
        }
    }

    /// The class index `d` is decided in (the default class when it names none).
    fn class_of(&self, d: &Demand) -> usize {
        match d.class() {
            Some(c) if c.index() < self.names.len() => c.index(),
            _ => self.default_class,
        }
    }

    /// Rows 0–5 of CONTRACT.md §2 for class `k` (ignored without classes) and `r` tokens, then,
    /// with `slot`, row 6 and the no-barging rule, with its one exception: an in-floor newcomer
    /// bypasses the queue ([`Model::bypasses`]). `Ok`: the attribution
    /// `(borrowed slot, borrowed tokens)` the admission would get.
    #[allow(clippy::type_complexity)]
    fn check(
        &self,
        k: usize,
        r: u64,
        p: Priority,
        slot: bool,
    ) -> Result<(bool, u64), (RejectReason, Option<Constraint>)> {
        let eff = self.eff(p);
        let classed = !self.names.is_empty();
        let constraint = |c: Constraint| classed.then_some(c);
        let mut borrow = (false, 0);
        if self.closed {
            return Err((RejectReason::Shutdown, None));
        }
        if eff.is_some_and(|e| self.tokens.saturating_add(r) > e) {
            return Err((RejectReason::BudgetLimit, constraint(Constraint::Global)));
        }
        if classed {
            let lims = self.class_limits();
            let c = self.classes[k];
            let l = lims[k];
            if l.mt.is_some_and(|mt| c.tokens.saturating_add(r) > mt) {
                return Err((RejectReason::BudgetLimit, Some(Constraint::AdmissionClass)));
            }
            if l.mc.is_some_and(|mc| c.in_flight >= mc) {
                return Err((
                    RejectReason::ConcurrencyLimit,
                    Some(Constraint::AdmissionClass),
                ));
            }
            let sum_pc: u64 = lims.iter().map(|l| l.pc).sum();
            let sum_pt: u64 = lims.iter().map(|l| l.pt).sum();
            let borrow_c = c.in_flight >= l.pc;
            let borrow_t = if r == 0 {
                0
            } else {
                r.saturating_sub(l.pt.saturating_sub(c.tokens))
            };
            borrow = (borrow_c, borrow_t);
            // Behaviour §4.3, rule 4.
            let sc = u64::from(self.limits.max_concurrent).saturating_sub(sum_pc);
            let prot: u64 = self
                .classes
                .iter()
                .zip(&lims)
                .map(|(s, l)| s.in_flight.min(l.pc))
                .sum();
            let shared_before = self.in_flight.saturating_sub(prot);
            if sum_pc > 0 && borrow_c && shared_before + 1 > sc {
                return Err((
                    RejectReason::ConcurrencyLimit,
                    Some(Constraint::AdmissionClassProtection),
                ));
            }
            // Rule 5.
            if let Some(e) = eff {
                let st = e.saturating_sub(sum_pt);
                let prot_t: u64 = self
                    .classes
                    .iter()
                    .zip(&lims)
                    .map(|(s, l)| s.tokens.min(l.pt))
                    .sum();
                let stu = self.tokens.saturating_sub(prot_t);
                if sum_pt > 0 && borrow_t > 0 && stu.saturating_add(borrow_t) > st {
                    return Err((
                        RejectReason::BudgetLimit,
                        Some(Constraint::AdmissionClassProtection),
                    ));
                }
            }
        }
        // Row 6, and no barging while waiters are queued (unless the demand bypasses them).
        if slot
            && (self.in_flight >= u64::from(self.limits.max_concurrent)
                || (!self.queue.is_empty() && !self.bypasses(k, r)))
        {
            return Err((
                RejectReason::ConcurrencyLimit,
                constraint(Constraint::Global),
            ));
        }
        Ok(borrow)
    }

    /// Counts and explains a refusal of `r` tokens in class `k` in the current state.
    fn refuse(
        &mut self,
        k: usize,
        reason: RejectReason,
        constraint: Option<Constraint>,
        r: u64,
        p: Priority,
        pending: u64,
    ) -> Rejection {
        let classed = !self.names.is_empty();
        self.rejected = add_reason(self.rejected, reason);
        if classed {
            let t = &mut self.classes[k].totals;
            t.rejected = add_reason(t.rejected, reason);
        }
        let classes = (classed && reason != RejectReason::Shutdown).then(|| {
            let state: Vec<(u64, u64)> = self
                .classes
                .iter()
                .map(|c| (c.in_flight, c.tokens))
                .collect();
            let lims = self.class_limits();
            let view = ClassView {
                g: self.in_flight,
                t: self.tokens,
                classes: &state,
                limits: &lims,
                max_concurrent: self.limits.max_concurrent.into(),
                eff: self.eff(p),
            };
            Box::new(view.detail(k, &self.names[k], r))
        });
        Rejection::with_detail(
            reason,
            constraint,
            self.limits.revision,
            CapacityDetail {
                in_flight: self.in_flight,
                pending,
                max_concurrent: self.limits.max_concurrent.into(),
                max_queue: self.limits.max_queue.into(),
                token_budget: self.token_capacity(p, r),
                classes,
            },
        )
    }

    /// Admits `r` tokens in class `k` with attribution `borrow`.
    fn admit(
        &mut self,
        k: usize,
        r: u64,
        reservation: Option<Reservation>,
        borrow: (bool, u64),
    ) -> Handle {
        let classed = !self.names.is_empty();
        self.in_flight += 1;
        self.tokens += r;
        self.admitted += 1;
        if self.has_budget {
            self.reserved = self.reserved.saturating_add(r);
        }
        let class = classed.then(|| {
            let c = &mut self.classes[k];
            c.in_flight += 1;
            c.tokens += r;
            c.totals.admitted += 1;
            c.totals.borrowed_admissions += u64::from(borrow.0);
            if self.has_budget {
                c.totals.reserved = c.totals.reserved.saturating_add(r);
                c.totals.borrowed_tokens = c.totals.borrowed_tokens.saturating_add(borrow.1);
            }
            (
                k,
                Resources {
                    borrowed_concurrency: borrow.0,
                    borrowed_tokens: borrow.1,
                },
            )
        });
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
                class,
                abandoned: false,
            },
        );
        h
    }

    /// The revision and reservation of a live admission.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 3, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// let h = m.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(m.admission(h), Some((3, None)));
    /// ```
    pub fn admission(&self, h: Handle) -> Option<(u64, Option<Reservation>)> {
        self.live.get(&h).map(|a| (a.revision, a.reservation))
    }

    /// The class and attribution of a live admission (`None` class without classes).
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand, Resources};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// let h = m.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(m.resources(h), Some((None, Resources::default())));
    /// ```
    pub fn resources(&self, h: Handle) -> Option<(Option<ClassId>, Resources)> {
        self.live.get(&h).map(|a| match a.class {
            Some((k, res)) => (Some(ClassId::new(self.class_owner, k)), res),
            None => (None, Resources::default()),
        })
    }

    /// Handles of the live admissions, oldest first.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// assert!(m.live().is_empty());
    /// ```
    pub fn live(&self) -> Vec<Handle> {
        self.live.keys().copied().collect()
    }

    /// `abandon_borrowed_concurrency` on a live admission.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot, Demand, Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// let mut m = Model::with_classes(b.limits(), &["a"], 0).unwrap();
    /// let h = m.try_acquire(Demand::slot()).unwrap();
    /// assert!(m.abandon(h));
    /// assert!(!m.abandon(h));
    /// ```
    pub fn abandon(&mut self, h: Handle) -> bool {
        let Some(a) = self.live.get_mut(&h) else {
            return false;
        };
        let Some((k, res)) = a.class else {
            return false;
        };
        if a.abandoned || !res.borrowed_concurrency {
            return false;
        }
        a.abandoned = true;
        self.in_flight -= 1;
        self.abandoned += 1;
        let c = &mut self.classes[k];
        c.in_flight -= 1;
        c.totals.abandoned += 1;
        self.pump();
        true
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
    ///     token_budget: Some(BudgetLimits { budget: 2_400, high_priority_reserve: 0 }), classes: Default::default() }).unwrap();
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
        let class = a.class.map(|(k, _)| k);
        if hold > a.held {
            let delta = hold - a.held;
            // With classes the bound is on V = Σ max(tokens_k, protected_tokens_k), as the
            // engine stores it (`crate::words::class_word::MAX_CLASSED_HOLD`).
            let (used, max) = match class {
                None => (self.tokens, MAX_TOKENS),
                Some(_) => {
                    let v: u64 = self
                        .classes
                        .iter()
                        .zip(self.limits.classes.iter())
                        .map(|(c, l)| c.tokens.max(l.protected_tokens))
                        .sum();
                    (v, crate::words::class_word::MAX_CLASSED_HOLD)
                }
            };
            if used as u128 + delta as u128 > max as u128 {
                return Err(UsageError::HoldTooLarge { hold, max }.into());
            }
            self.overrun = self.overrun.saturating_add(delta);
            self.tokens += delta;
            if let Some(k) = class {
                self.classes[k].tokens += delta;
                self.classes[k].totals.overrun =
                    self.classes[k].totals.overrun.saturating_add(delta);
            }
        } else {
            let delta = a.held - hold;
            self.refunded = self.refunded.saturating_add(delta);
            self.tokens -= delta;
            if let Some(k) = class {
                self.classes[k].tokens -= delta;
                self.classes[k].totals.refunded =
                    self.classes[k].totals.refunded.saturating_add(delta);
            }
        }
        // Refunded tokens go to the queued head first (token waiting).
        let pump = self.wait_for_tokens && hold < a.held;
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
        if pump {
            self.pump();
        }
        let reserved = a.reservation.map_or(0, |r| r.total());
        Ok(UsageReport {
            admission_id: AdmissionId::from_u128(h.0.into()),
            revision: a.revision,
            class: a.class.map(|(k, _)| ClassId::new(self.class_owner, k)),
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
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
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
        if !a.abandoned {
            self.in_flight -= 1;
        }
        self.tokens -= a.held;
        self.released += 1;
        let refunded = match (a.reservation, consumed) {
            (Some(_), Some(c)) if c < a.held => a.held - c,
            _ => 0,
        };
        self.consumed = self.consumed.saturating_add(consumed.unwrap_or(0));
        self.refunded = self.refunded.saturating_add(refunded);
        if let Some((k, _)) = a.class {
            let c = &mut self.classes[k];
            if !a.abandoned {
                c.in_flight -= 1;
            }
            c.tokens -= a.held;
            c.totals.released += 1;
            c.totals.consumed = c.totals.consumed.saturating_add(consumed.unwrap_or(0));
            c.totals.refunded = c.totals.refunded.saturating_add(refunded);
        }
        self.pump();
        Ok(ReleaseReport {
            admission_id: AdmissionId::from_u128(h.0.into()),
            revision: a.revision,
            class: a.class.map(|(k, _)| ClassId::new(self.class_owner, k)),
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
    /// let s = LimitsSnapshot { revision: 1, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() };
    /// let mut m = Model::new(s).unwrap();
    /// assert!(m.apply_limits(s).is_err()); // stale
    /// assert!(m.apply_limits(s.with_revision(2)).is_ok());
    /// ```
    pub fn apply_limits(&mut self, next: LimitsSnapshot) -> Result<LimitsChange, ApplyLimitsError> {
        if next.revision <= self.limits.revision {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: next.revision,
                current: Box::new(self.limits),
            });
        }
        next.validate(self.has_budget, &self.names)?;
        let previous = std::mem::replace(&mut self.limits, next);
        self.sweep_never_fit();
        self.pump();
        Ok(LimitsChange {
            previous,
            current: next,
        })
    }

    /// Closes the model.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// m.close();
    /// assert!(m.stats().closed);
    /// ```
    pub fn close(&mut self) {
        self.closed = true;
        while let Some(w) = self.queue.pop_front() {
            self.answers.insert(
                w.id,
                Answer::Refused(RejectReason::Shutdown, None, w.k, w.r, w.priority),
            );
        }
    }

    /// Statistics, field for field what [`Bulkhead::stats`](crate::Bulkhead::stats) must show.
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 2, max_queue: 0, token_budget: None, classes: Default::default() }).unwrap();
    /// assert_eq!(m.stats().available_slots, 2);
    /// ```
    pub fn stats(&self) -> Stats {
        let state: Vec<(u64, u64)> = self
            .classes
            .iter()
            .map(|c| (c.in_flight, c.tokens))
            .collect();
        let totals: Vec<ClassTotals> = self.classes.iter().map(|c| c.totals).collect();
        Stats {
            limits: self.limits,
            closed: self.closed,
            in_flight: self.in_flight,
            admissions_in_flight: self.live.len() as u64,
            pending: self.queue.len() as u64,
            queued_total: self.next_wait,
            // Durations are not modelled; the conformance driver compares the rest.
            queue_waits: Default::default(),
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
            borrowed_concurrency_abandoned: self.abandoned,
            borrowed_concurrency_abandoned_by_cause: crate::record::stats::AbandonCauses {
                manual: self.abandoned,
                deadline: 0,
            },
            // Events are not modelled.
            subscriber_panics: 0,
            // Observe mode is an `LlmBulkhead::run` feature the model does not drive.
            classes: crate::record::stats::classes_stats(
                &self.limits,
                &self.names,
                self.default_class,
                &state,
                self.in_flight,
                self.tokens,
                &totals,
            ),
        }
    }
}

fn add_reason(mut c: RejectCounts, reason: RejectReason) -> RejectCounts {
    *c.slot(reason) += 1;
    c
}
