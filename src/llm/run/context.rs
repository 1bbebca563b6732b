//! [`RunContext`]: what the work of one run holds (its admission, owned, leased to a
//! deadline or bypassed by observe mode) and [`Stopped`].

use super::*;

/// What the work of a `run` gets: the admission's identity and figures, usage reports,
/// abandonment, and the stop signal of the borrowed-concurrency deadline.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(5_000).build().unwrap(), NaiveEstimator);
/// llm.run_blocking(&LlmRequest::new("m", &["abcd"]), RunOptions::default(), |ctx| {
///     assert_eq!((ctx.revision(), ctx.held()), (0, 9 + 2_048)); // 2 for the text, 7 per message
///     let r = ctx.report_usage(Usage::new(9, 10)).unwrap();
///     assert_eq!(r.held, 9 + 2_048);
///     assert!(!ctx.stop_requested());
///     Ok::<_, ()>(())
/// }).unwrap();
/// ```
///
/// # Memory ordering
/// With a deadline the admission sits behind a mutex shared with the deadline, so a usage
/// report and the expiry are ordered by that mutex; the stop flag is stored with `Release`
/// after the abandonment and read with `Acquire`.
pub struct RunContext {
    pub(in crate::llm) inner: Inner,
    pub(in crate::llm) stop: StopGuard,
    /// The admission's timing, on a timed run only (boxed: untimed runs carry one word).
    pub(in crate::llm) times: Option<Box<AdmittedTimes>>,
    /// A cluster admission's deadline and cut (feature `cluster`). Declared after `inner`:
    /// the admission is released before the ticket counts an overdue release.
    #[cfg(feature = "cluster")]
    pub(in crate::llm) cluster: Option<super::cluster::ClusterHold>,
}

/// The admission: owned, or (with an armed deadline) shared with the deadline.
pub(in crate::llm) enum Inner {
    Owned(Admission),
    Leased(LeaseGuard),
    /// Observe mode ran the work without an admission (boxed: rare, and large).
    Bypassed(Box<Bypassed>),
}

impl RunContext {
    /// The context of `admission`, leased to `deadline` if its slot was borrowed. Inlined:
    /// without a deadline it is the owned admission alone, built in place.
    #[inline(always)]
    pub(in crate::llm) fn new(admission: Admission, deadline: Option<Deadline>) -> RunContext {
        match deadline {
            Some(d) if admission.resources().borrowed_concurrency => {
                RunContext::leased(admission, d)
            }
            _ => RunContext {
                inner: Inner::Owned(admission),
                stop: StopGuard::default(),
                times: None,
                #[cfg(feature = "cluster")]
                cluster: None,
            },
        }
    }

    /// A borrowed slot with a deadline: the admission shared with the armed deadline.
    #[inline(never)]
    fn leased(admission: Admission, deadline: Deadline) -> RunContext {
        let after = match &deadline {
            Deadline::After(d) => Some(*d),
            Deadline::Manual(_) => None,
        };
        let about = About {
            deadline: after,
            id: admission.id(),
            revision: admission.revision(),
            priority: admission.priority(),
            class: admission.class(),
            reservation: admission.reservation(),
            resources: admission.resources(),
        };
        let stop = Arc::new(StopState::default());
        let lease = Arc::new(Lease {
            admission: Mutex::new(Some(admission)),
            expired: AtomicBool::new(false),
            waker: Mutex::new(None),
            about,
            stop: stop.clone(),
        });
        let mut guard = LeaseGuard {
            lease: Arc::clone(&lease),
            timer: None,
        };
        match deadline {
            Deadline::After(d) => {
                // Validated before admission: the sum does not overflow.
                let at = Instant::now().checked_add(d).unwrap_or_else(Instant::now);
                guard.timer = Some(crate::wait::timer::register(at, Waker::from(lease)));
            }
            Deadline::Manual(trigger) => trigger.arm(&lease),
        }
        RunContext {
            inner: Inner::Leased(guard),
            stop: StopGuard {
                state: Some(stop),
                caller: None,
            },
            times: None,
            #[cfg(feature = "cluster")]
            cluster: None,
        }
    }

    pub(in crate::llm) fn bypassed(b: Bypassed) -> RunContext {
        RunContext {
            inner: Inner::Bypassed(Box::new(b)),
            stop: StopGuard::default(),
            times: None,
            #[cfg(feature = "cluster")]
            cluster: None,
        }
    }

    /// Makes the stop signal also read the caller's token.
    #[inline(always)]
    pub(in crate::llm) fn set_caller(&mut self, caller: Option<crate::CancelToken>) {
        if caller.is_some() {
            self.stop.caller = caller;
        }
    }

    /// The run's stop signal as an owned handle, for a task or thread the work starts: it
    /// fires on the borrowed-concurrency deadline, when the run is over for its caller (it
    /// returned, or its future was dropped), and reads the caller's token (see
    /// [`StopSignal`]).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions, StopCause};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let helper = std::thread::spawn(move || {
    ///     let s: llm_bulkhead::llm::StopSignal = rx.recv().unwrap();
    ///     futures_lite::future::block_on(s.stopped()) // woken when the run ends
    /// });
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     tx.send(ctx.stop_signal()).unwrap();
    ///     Ok::<_, ()>(())
    /// }).unwrap();
    /// assert_eq!(helper.join().unwrap(), StopCause::Ended);
    /// ```
    pub fn stop_signal(&mut self) -> StopSignal {
        let state = self.stop.state.get_or_insert_with(Default::default).clone();
        #[cfg(feature = "cluster")]
        self.arm_cut(&state);
        StopSignal {
            state,
            caller: self.stop.caller.clone(),
        }
    }

    /// Whether the admission is leased to an armed deadline (its slot was borrowed).
    #[inline(always)]
    pub(in crate::llm) fn is_leased(&self) -> bool {
        matches!(self.inner, Inner::Leased(_))
    }

    /// With an armed deadline: the stop signal and the error the run answers on expiry.
    pub(in crate::llm) fn deadline_watch(&mut self) -> Option<(StopSignal, DeadlineExpired)> {
        let Inner::Leased(g) = &self.inner else {
            return None;
        };
        let x = &g.lease.about;
        let expired = DeadlineExpired {
            deadline: x.deadline,
            admission_id: x.id,
            revision: x.revision,
            class: x.class,
            resources: x.resources,
        };
        Some((self.stop_signal(), expired))
    }

    /// Whether the caller's token was cancelled.
    pub(in crate::llm) fn caller_cancelled(&self) -> bool {
        self.stop
            .caller
            .as_ref()
            .is_some_and(crate::CancelToken::is_cancelled)
    }

    /// Reads the owned admission, the leased one's description, or the bypass.
    pub(in crate::llm) fn read<T>(
        &self,
        owned: impl FnOnce(&Admission) -> T,
        leased: impl FnOnce(&About) -> T,
        bypassed: impl FnOnce(&Bypassed) -> T,
    ) -> T {
        match &self.inner {
            Inner::Owned(a) => owned(a),
            Inner::Leased(g) => leased(&g.lease.about),
            Inner::Bypassed(b) => bypassed(b),
        }
    }

    /// Runs `f` on the admission (under the lease's lock when leased); `None` once settled
    /// or when bypassed.
    pub(in crate::llm) fn with<T>(&mut self, f: impl FnOnce(&mut Admission) -> T) -> Option<T> {
        match &mut self.inner {
            Inner::Owned(a) => Some(f(a)),
            Inner::Leased(g) => lock(&g.lease.admission).as_mut().map(f),
            Inner::Bypassed(_) => None,
        }
    }

    /// Whether the work holds an admission or was bypassed (observe mode, see [`Mode`]).
    ///
    /// ```
    /// use llm_bulkhead::llm::{AdmissionKind, LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.admission_kind(), AdmissionKind::Admitted); // a slot was free
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn admission_kind(&self) -> AdmissionKind {
        match &self.inner {
            Inner::Bypassed(_) => AdmissionKind::Bypassed,
            _ => AdmissionKind::Admitted,
        }
    }

    /// The reason of the refusal observe mode bypassed (`None` when admitted).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::{Bulkhead, RejectReason};
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_reason(), Some(RejectReason::ConcurrencyLimit));
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn bypass_reason(&self) -> Option<crate::RejectReason> {
        self.bypass_detail().map(|r| r.reason)
    }

    /// The refusal observe mode bypassed, with its constraint, revision and capacity detail
    /// (`None` when admitted).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_detail().unwrap().detail().max_concurrent, 0);
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn bypass_detail(&self) -> Option<&crate::Rejection> {
        match &self.inner {
            Inner::Bypassed(b) => Some(&b.rejection),
            _ => None,
        }
    }

    /// Whether the bypass raced: the advisory check said "admit" and the real decision
    /// refused (a queue timeout, typically). `None` when admitted.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
    /// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
    /// llm.run_blocking(&LlmRequest::default(), observe, |ctx| {
    ///     assert_eq!(ctx.bypass_raced(), Some(false)); // the advisory check refused
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn bypass_raced(&self) -> Option<bool> {
        match &self.inner {
            Inner::Bypassed(b) => Some(b.raced),
            _ => None,
        }
    }

    /// How long the decision that admitted this run took, and how long of it was spent
    /// queued (the figures an admit event carries with `Interest::DECISION_TIMING`, here read
    /// on the bulkhead's clock at the run's own steps: see `src/llm/run/timed.rs`). `None` unless the run is timed ([`LlmBulkhead::run_timed`],
    /// [`run_blocking_timed`](LlmBulkhead::run_blocking_timed),
    /// [`run_shared_timed`](LlmBulkhead::run_shared_timed)): untimed runs read no clock.
    /// In observe mode it times the decision that ended in the bypass.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.timing(), None); Ok::<_, ()>(()) }).unwrap(); // untimed
    /// let t = llm.run_blocking_timed(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.timing().unwrap().queue_wait_ns, 0); Ok::<_, ()>(()) }); // never queued
    /// assert!(t.value.is_ok());
    /// ```
    #[must_use]
    pub fn timing(&self) -> Option<crate::Timing> {
        self.times.as_ref().map(|t| t.timing)
    }

    /// When the run was admitted (or bypassed), as an instant of the bulkhead's clock
    /// ([`LlmBulkhead::with_clock`]): the work's time so far is that clock's `now()` minus
    /// this. `None` unless the run is timed (see [`timing`](Self::timing)).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// clock.advance(Duration::from_secs(1));
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    /// let t = llm.run_blocking_timed(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     Ok::<_, ()>(ctx.admitted_at()) });
    /// assert_eq!(t.value.unwrap(), Some(clock.origin() + Duration::from_secs(1)));
    /// ```
    #[must_use]
    pub fn admitted_at(&self) -> Option<Instant> {
        self.times.as_ref().map(|t| t.admitted_at)
    }

    /// The admission's id, or a bypass's shadow id ([`RunId::is_shadow`]).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.admission_id().to_string().len(), 36); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn admission_id(&self) -> RunId {
        self.read(|a| RunId::from(a.id()), |x| RunId::from(x.id), |b| b.id)
    }

    /// The revision of the limits that authorised the admission.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).initial_revision(7).build().unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.revision(), 7); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn revision(&self) -> u64 {
        self.read(Admission::revision, |x| x.revision, Bypassed::revision)
    }

    /// The priority.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::{Bulkhead, Priority};
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.priority(), Priority::Normal); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn priority(&self) -> Priority {
        self.read(Admission::priority, |x| x.priority, |b| b.priority)
    }

    /// The admission class (`None` without classes).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.class(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn class(&self) -> Option<ClassId> {
        self.read(Admission::class, |x| x.class, |b| b.class)
    }

    /// The reservation taken (`None` without a budget): what `estimate` previewed.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.reservation(), None); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn reservation(&self) -> Option<Reservation> {
        self.read(Admission::reservation, |x| x.reservation, |b| b.reservation)
    }

    /// What the admission borrowed from the shared remainder.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.resources().borrowed_concurrency); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn resources(&self) -> Resources {
        self.read(
            Admission::resources,
            |x| x.resources,
            |_| Resources::default(),
        )
    }

    /// Tokens currently held (0 for bypassed work).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.held(), 0); Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn held(&mut self) -> u64 {
        self.with(|a| a.held()).unwrap_or(0)
    }

    /// Reports cumulative usage ([`Admission::report_usage`]). Bypassed work (observe mode)
    /// is validated and clamped the same way but holds nothing (`held` is 0, no overrun or
    /// refund is booked); its sequence moves only when the clamped usage changes.
    ///
    /// # Errors
    /// As [`Admission::report_usage`]; nothing changes.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::{Bulkhead, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(1_200).build().unwrap(),
    ///     |_: &LlmRequest| Ok(llm_bulkhead::Reservation::new(100, 1_000).unwrap()));
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert_eq!(ctx.report_usage(Usage::new(20, 5)).unwrap().held, 1_020);
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn report_usage(&mut self, usage: Usage) -> Result<UsageReport, UsageError> {
        self.report_usage_reconciled(usage, None)
    }

    /// [`report_usage`](Self::report_usage) with progressive reconciliation
    /// ([`Admission::report_usage_reconciled`]).
    ///
    /// # Errors
    /// As [`Admission::report_usage_reconciled`]; nothing changes.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::{Bulkhead, Reconcile, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(1_200).build().unwrap(),
    ///     |_: &LlmRequest| Ok(llm_bulkhead::Reservation::new(100, 1_000).unwrap()));
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     let rc = Reconcile { remaining_output: 900, safety_margin: 0 };
    ///     assert_eq!(ctx.report_usage_reconciled(Usage::new(20, 100), rc).unwrap().held, 900);
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn report_usage_reconciled(
        &mut self,
        usage: Usage,
        reconcile: impl Into<Option<Reconcile>>,
    ) -> Result<UsageReport, UsageError> {
        let reconcile = reconcile.into();
        if let Inner::Bypassed(b) = &mut self.inner {
            return b.report_usage_reconciled(usage, reconcile);
        }
        match self.with(|a| a.report_usage_reconciled(usage, reconcile)) {
            Some(r) => r,
            // Unreachable while the work runs: the admission is settled only after it.
            None => Err(UsageError::Overflow { field: "admission" }),
        }
    }

    /// Returns a borrowed slot early ([`Admission::abandon_borrowed_concurrency`], cause
    /// `manual`). A deadline that fires later then does nothing (reference §6.2). Bypassed
    /// work holds no slot: `false`. The tokens stay held until the work ends. Returning the
    /// slot is an in-process bound, not proof that the provider stopped generating (see
    /// [`Admission::abandon_borrowed_concurrency`] for what it guarantees).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.abandon_borrowed_concurrency()); // no classes: never borrowed
    ///     Ok::<_, ()>(()) }).unwrap();
    /// ```
    pub fn abandon_borrowed_concurrency(&mut self) -> bool {
        self.with(Admission::abandon_borrowed_concurrency)
            .unwrap_or(false)
    }

    /// Whether the work should stop: the borrowed-concurrency deadline expired (the slot is
    /// gone; its tokens are settled when it returns), the caller's token
    /// (`options.wait.cancel`) was cancelled, or (a cluster-managed bulkhead) the admission
    /// deadline passed.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
    ///     assert!(!ctx.stop_requested()); Ok::<_, ()>(()) }).unwrap();
    /// ```
    #[must_use]
    pub fn stop_requested(&self) -> bool {
        let expired = match &self.inner {
            Inner::Owned(_) | Inner::Bypassed(_) => false,
            Inner::Leased(g) => g.lease.expired.load(Ordering::Acquire),
        };
        expired || self.caller_cancelled() || self.was_cut()
    }

    /// A future that completes when the deadline expires (never, without an armed deadline),
    /// or when the caller's token (`options.wait.cancel`) is cancelled; both wake it: race it
    /// against the provider call. A cluster admission's cut does not complete it: the async
    /// `run` drops the work there by itself; elsewhere read
    /// [`stop_requested`](Self::stop_requested) or wait on a [`stop_signal`](Self::stop_signal).
    ///
    /// # Cancel safety
    /// Dropping it changes nothing.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// use futures_lite::future;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let out = future::block_on(llm.run(&LlmRequest::default(), RunOptions::default(), async |ctx| {
    ///     // No deadline: the work's own branch wins.
    ///     Ok::<_, ()>(future::or(async { 1 }, async { ctx.stopped().await; 2 }).await)
    /// }));
    /// assert_eq!(out.unwrap(), 1);
    /// ```
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped {
            ctx: self,
            cancel: self
                .stop
                .caller
                .clone()
                .map(crate::wait::cancel::CancelWake::new),
        }
    }

    /// Settles the admission with `usage` (invalid usage falls back to the last report) and
    /// says whether the deadline expired. In place (moving the context, or the admission out
    /// of it, copied them): the caller drops the context right after, which fires the stop
    /// signal's `ended` once the admission is settled; nothing reads it in between (a second
    /// call would find the admission settled and do nothing).
    #[inline(always)]
    pub(in crate::llm) fn finish(&mut self, usage: Option<Usage>) -> Option<DeadlineExpired> {
        match &mut self.inner {
            Inner::Owned(a) => {
                a.settle_final(usage);
                None
            }
            other => finish_shared(other, usage),
        }
    }
}

/// The cluster admission's deadline (feature `cluster`, `run/cluster.rs`); without the
/// feature these are constants.
impl RunContext {
    /// Whether the cluster admission deadline cut this run.
    #[inline(always)]
    pub(in crate::llm) fn was_cut(&self) -> bool {
        #[cfg(feature = "cluster")]
        return self.cluster.as_ref().is_some_and(|c| c.ticket.passed());
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// Whether this run holds a cluster admission (its work is raced against the cut).
    #[inline(always)]
    pub(in crate::llm) fn is_clustered(&self) -> bool {
        #[cfg(feature = "cluster")]
        return self.cluster.is_some();
        #[cfg(not(feature = "cluster"))]
        false
    }

    /// A cut run answers `ClusterRunError::Cut`, whatever its work returned (its tokens
    /// were settled already).
    #[inline(always)]
    pub(in crate::llm) fn cut_answer<R, E>(
        &self,
        answer: Result<R, RunError<E>>,
    ) -> Result<R, RunError<E>> {
        #[cfg(feature = "cluster")]
        if self.was_cut() {
            return Err(RunError::Cluster(crate::cluster::ClusterRunError::Cut));
        }
        answer
    }
}

/// [`RunContext::finish`] of a leased or bypassed admission (out of line: rare).
#[inline(never)]
fn finish_shared(inner: &mut Inner, usage: Option<Usage>) -> Option<DeadlineExpired> {
    match inner {
        Inner::Owned(a) => {
            a.settle_final(usage);
            None
        }
        Inner::Bypassed(b) => {
            b.finish(usage);
            None
        }
        Inner::Leased(g) => {
            if let Some(mut a) = g.take() {
                a.settle_final(usage);
            }
            let x = &g.lease.about;
            g.lease
                .expired
                .load(Ordering::Acquire)
                .then_some(DeadlineExpired {
                    deadline: x.deadline,
                    admission_id: x.id,
                    revision: x.revision,
                    class: x.class,
                    resources: x.resources,
                })
        }
    }
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("admission", &self.admission_kind())
            .field("admission_id", &self.admission_id())
            .field("revision", &self.revision())
            .field("reservation", &self.reservation())
            .field("resources", &self.resources())
            .field("stop_requested", &self.stop_requested())
            .field("timing", &self.timing())
            .finish_non_exhaustive()
    }
}

/// The future of [`RunContext::stopped`].
///
/// # Cancel safety
/// Dropping it changes nothing.
///
/// ```
/// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
///     let _pending: Stopped<'_> = ctx.stopped(); Ok::<_, ()>(()) }).unwrap();
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Stopped<'a> {
    pub(in crate::llm) ctx: &'a RunContext,
    /// The caller's token, woken on `cancel` (`None` without a token).
    pub(in crate::llm) cancel: Option<crate::wait::cancel::CancelWake>,
}

impl Future for Stopped<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // The caller's cancellation (registered with the token, so `cancel` wakes it).
        if let Some(w) = self.cancel.as_mut() {
            if w.poll_cancelled(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        let Inner::Leased(g) = &self.ctx.inner else {
            return Poll::Pending;
        };
        if g.lease.expired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        *lock(&g.lease.waker) = Some(cx.waker().clone());
        // Re-check after registering: `expire` sets the flag before taking the waker.
        if g.lease.expired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl fmt::Debug for Stopped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Stopped(..)")
    }
}
