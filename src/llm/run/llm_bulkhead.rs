//! [`LlmBulkhead`]: `estimate`, `would_admit`, `run_blocking` and async `run` (`super`).

use super::*;

/// A bulkhead with a token estimator: turns requests into demands, previews them, and runs
/// work under an admission (reference §9).
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ModelAwareEstimator, RunOptions};
/// use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(
///     Bulkhead::builder().max_concurrent(4).token_budget(10_000).build().unwrap(),
///     ModelAwareEstimator::default(),
/// );
/// let request = LlmRequest::new("gpt-4o", &[&" ".repeat(37)]); // 37 / 3.7, and 7 per message
/// assert_eq!(llm.estimate(&request, &RunOptions::default()).unwrap().unwrap().input(), 17);
/// ```
#[derive(Clone)]
pub struct LlmBulkhead {
    pub(in crate::llm) bulkhead: Bulkhead,
    pub(in crate::llm) estimator: Arc<dyn TokenEstimator>,
    /// The bulkhead-level de-duplication (`None`: off), see [`LlmBulkhead::with_dedup`].
    pub(in crate::llm) dedup: Option<Arc<crate::llm::shared_run::SharedDedup>>,
    /// The bulkhead's observe-mode counters (one set per bulkhead, looked up once here).
    pub(in crate::llm) observe: Arc<ObserveCounters>,
    /// The clock of timed runs (`None`: the system clock), see [`LlmBulkhead::with_clock`].
    pub(in crate::llm) clock: Option<Arc<dyn crate::llm::clock::Clock>>,
    /// The cluster share's window and deadline (`None`: not cluster-managed), see
    /// [`LlmBulkhead::clustered`].
    #[cfg(feature = "cluster")]
    pub(in crate::llm) cluster: Option<crate::cluster::ClusterWindow>,
}

impl fmt::Debug for LlmBulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmBulkhead")
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl LlmBulkhead {
    /// A front end for `bulkhead` that estimates with `estimator`.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// # let _ = llm;
    /// ```
    pub fn new(bulkhead: Bulkhead, estimator: impl TokenEstimator + 'static) -> LlmBulkhead {
        LlmBulkhead::with_shared_estimator(bulkhead, Arc::new(estimator))
    }

    /// A front end sharing `estimator` (an adaptive estimator the application also feeds,
    /// for example).
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead; use std::sync::Arc;
    /// let shared: Arc<dyn TokenEstimator> = Arc::new(NaiveEstimator);
    /// let llm = LlmBulkhead::with_shared_estimator(Bulkhead::new(1).unwrap(), shared.clone());
    /// # let _ = llm;
    /// ```
    pub fn with_shared_estimator(
        bulkhead: Bulkhead,
        estimator: Arc<dyn TokenEstimator>,
    ) -> LlmBulkhead {
        LlmBulkhead {
            observe: ObserveCounters::of(&bulkhead),
            bulkhead,
            estimator,
            dedup: None,
            clock: None,
            #[cfg(feature = "cluster")]
            cluster: None,
        }
    }

    /// The bulkhead.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(3).unwrap(), NaiveEstimator);
    /// assert_eq!(llm.bulkhead().limits().max_concurrent, 3);
    /// ```
    #[must_use]
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// Exactly what admission will reserve for `request` with `options`: `None` without a
    /// token budget; with one, the per-call override (checked for consistency) or else the
    /// estimator's answer. Changes nothing.
    ///
    /// # Errors
    /// [`EstimateError`] from the estimator or the override, naming the field;
    /// [`EstimateError::InvalidSetting`] with field `class` for a class of another bulkhead
    /// (or any class on a bulkhead without classes), checked first.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ReservationOverride, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Reservation};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(5, 5).unwrap()));
    /// let r = LlmRequest::default();
    /// assert_eq!(llm.estimate(&r, &RunOptions::default()).unwrap().unwrap().total(), 10);
    /// let o = RunOptions { reservation: Some(ReservationOverride { input: 300, max_output: 400, reserved: None }), ..Default::default() };
    /// assert_eq!(llm.estimate(&r, &o).unwrap().unwrap().total(), 700);
    /// ```
    pub fn estimate<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Option<Reservation>, EstimateError> {
        if !self.bulkhead.class_is_valid(options.class) {
            return Err(EstimateError::InvalidSetting {
                field: "class",
                expected: "a class of this bulkhead (none on a bulkhead without classes)",
            });
        }
        if !self.bulkhead.shared.has_budget {
            return Ok(None);
        }
        match options.reservation {
            Some(o) => o.resolve().map(Some),
            None => self.estimator.estimate(request).map(Some),
        }
    }

    /// The demand `run` would make for `request` with `options`.
    pub(in crate::llm) fn demand<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Demand, EstimateError> {
        let mut d = match self.estimate(request, options)? {
            Some(r) => Demand::tokens(r),
            None => Demand::slot(),
        };
        d = d.with_priority(options.priority);
        if let Some(c) = options.class {
            d = d.in_class(c);
        }
        Ok(d)
    }

    /// Would `run` admit `request` now? Advisory: it takes nothing, counts nothing and emits
    /// no event ([`Bulkhead::would_admit`], including its note on precision).
    ///
    /// # Errors
    /// As [`estimate`](Self::estimate): validation comes first, before the closed check.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    /// use llm_bulkhead::{Bulkhead, RejectReason, Reservation};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(100).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(90, 20).unwrap()));
    /// let advice = llm.would_admit(&LlmRequest::default(), &RunOptions::default()).unwrap();
    /// assert_eq!(advice.reason(), Some(RejectReason::BudgetLimit));
    /// assert_eq!(advice.detail().token_budget.unwrap().requested, 110);
    /// ```
    pub fn would_admit<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Advice, EstimateError> {
        Ok(self.bulkhead.would_admit(&self.demand(request, options)?))
    }

    /// On a cluster-managed bulkhead ([`clustered`](Self::clustered)), the share's window,
    /// right after the commit: `Err` with the answer when it had lapsed (the caller drops the
    /// context, which gives the admission back). Nothing without the feature.
    #[inline(always)]
    fn enter_window<E>(&self, _ctx: &mut RunContext) -> Result<(), RunError<E>> {
        #[cfg(feature = "cluster")]
        if let Some(window) = &self.cluster {
            _ctx.enter_cluster(window)
                .map_err(|e| RunError::Cluster(crate::cluster::ClusterRunError::Refused(e)))?;
        }
        Ok(())
    }

    /// The answer to the core's refusal of `demand`: on a cluster-managed bulkhead, a token
    /// reservation the installed share can never hold but the global limits can is
    /// [`RunError::Cluster`] with `ClusterRejection::ShareTooSmall` (retryable), not the
    /// core's never-fits refusal. Cold: refusals only.
    #[cold]
    fn rejected<E>(&self, _demand: &Demand, rejection: Rejection) -> RunError<E> {
        #[cfg(feature = "cluster")]
        if let Some(window) = &self.cluster {
            use crate::cluster::{ClusterRejection, ClusterRunError};
            return match window.judge(_demand, rejection) {
                Ok(s) => {
                    RunError::Cluster(ClusterRunError::Refused(ClusterRejection::ShareTooSmall(s)))
                }
                Err(r) => RunError::Rejected(r),
            };
        }
        RunError::Rejected(rejection)
    }

    /// `run_shared` and the request-level acquires cannot carry the cluster admission
    /// deadline to their work: on a cluster-managed bulkhead they refuse, before anything
    /// changes.
    #[inline(always)]
    pub(in crate::llm) fn check_unclustered(&self) -> Result<(), EstimateError> {
        #[cfg(feature = "cluster")]
        if self.cluster.is_some() {
            return Err(EstimateError::InvalidSetting {
                field: "cluster",
                expected: "a bulkhead that is not cluster-managed: on one, admit with run or \
                           run_blocking, or with ClusterBulkhead::try_acquire",
            });
        }
        Ok(())
    }

    /// `run` and `run_blocking` cannot detach their work.
    fn check_no_detach<U>(options: &RunOptions<U>) -> Result<(), EstimateError> {
        match options.detach_at_deadline {
            None => Ok(()),
            Some(_) => Err(EstimateError::InvalidSetting {
                field: "detach_at_deadline",
                expected: "none: only run_shared can detach its work",
            }),
        }
    }

    /// What `run` and `run_blocking` check before anything changes: the deadline option, that
    /// nothing asks to detach, that nothing asks for de-duplication they cannot give, and the
    /// demand (estimation and class), in that order. The option checks are out of line and
    /// skipped when no option is set and the bulkhead does not de-duplicate (the common call).
    #[inline(always)]
    fn prepare<U>(
        &self,
        request: &LlmRequest,
        options: &RunOptions<U>,
    ) -> Result<Demand, EstimateError> {
        // Bitwise: three tests and one branch.
        if options.borrowed_concurrency_deadline.is_some()
            | options.detach_at_deadline.is_some()
            | self.dedup.is_some()
        {
            self.check_options(options)?;
        }
        self.demand(request, options)
    }

    /// The deadline, detach and de-duplication checks of [`prepare`](Self::prepare), in that
    /// order.
    #[cold]
    #[inline(never)]
    fn check_options<U>(&self, options: &RunOptions<U>) -> Result<(), EstimateError> {
        Self::check_deadline(&options.borrowed_concurrency_deadline)?;
        Self::check_no_detach(options)?;
        self.check_no_dedup(options)
    }

    /// `run` and `run_blocking` cannot de-duplicate (their work is neither `Send` nor
    /// `'static`, and a shared call is driven by whichever participant polls it): on a
    /// bulkhead that de-duplicates, a call that does not opt out (`options.dedup`) is refused
    /// rather than run alone as if the setting did not exist.
    pub(in crate::llm) fn check_no_dedup<U>(
        &self,
        options: &RunOptions<U>,
    ) -> Result<(), EstimateError> {
        match &self.dedup {
            Some(d) if d.enabled() && options.dedup => Err(EstimateError::InvalidSetting {
                field: "dedup",
                expected: "false on run and run_blocking of a de-duplicating bulkhead \
                           (run_shared de-duplicates)",
            }),
            _ => Ok(()),
        }
    }

    /// A clock deadline must be above zero and representable as an instant.
    pub(in crate::llm) fn check_deadline(d: &Option<Deadline>) -> Result<(), EstimateError> {
        if let Some(Deadline::After(d)) = d {
            if d.is_zero() || Instant::now().checked_add(*d).is_none() {
                return Err(EstimateError::InvalidSetting {
                    field: "borrowed_concurrency_deadline",
                    expected: "above zero and representable as an instant",
                });
            }
        }
        Ok(())
    }

    /// Admits `request` (waiting in the queue if the bulkhead queues), runs `work` on this
    /// thread with a [`RunContext`], and releases: on success with the usage
    /// `options.usage` takes from the result (else the last report), on error and on panic
    /// with the last report. Nothing leaks, whatever `work` does.
    ///
    /// With a borrowed-concurrency deadline (applies only when the admission's slot was
    /// borrowed), expiry abandons the slot (cause `deadline`) and sets
    /// [`RunContext::stop_requested`]; when `work` returns, its tokens are settled and the
    /// answer is [`RunError::Deadline`] (the result is dropped). A deadline that finds the slot
    /// already abandoned does nothing.
    ///
    /// # When the caller hears of the deadline
    /// `run_blocking` runs `work` **on the caller's thread**, so it answers only when `work`
    /// returns: nothing can answer the caller before then, and a blocking closure cannot be
    /// detached from the thread that runs it. At expiry the slot is abandoned at once (it is
    /// free for others) and [`RunContext::stop_requested`] turns true; the answer is
    /// [`RunError::Deadline`] when `work` returns, its result dropped and its tokens settled.
    /// This differs from the seed, where the caller is rejected at expiry and the callback
    /// goes on in the background. Work that must answer at expiry polls
    /// [`RunContext::stop_requested`] (or waits on a [`StopSignal`] in a helper) and returns;
    /// the async [`run`](Self::run) answers at expiry by itself, and
    /// [`run_shared`](Self::run_shared) with [`RunOptions::detach_at_deadline`] does the
    /// seed's detach (contract §12 lists each entry point).
    ///
    /// It reads no clock: [`run_blocking_timed`](Self::run_blocking_timed) is the same call
    /// with its decision, queue and work time ([`RunTiming`](crate::llm::RunTiming)).
    ///
    /// In observe mode (`options.mode`, see [`Mode`]) a refusal for one of the shadow reasons
    /// runs `work` anyway, bypassed: without an admission, holding nothing, reported by its
    /// own events ([`LlmEvent`](crate::llm::LlmEvent)) and `stats().observe`. `shutdown` and
    /// `aborted` are still answered.
    ///
    /// # Errors
    /// [`RunError::Invalid`] (before anything changes; also `options.dedup` left `true` on a
    /// bulkhead whose de-duplication is enabled, see [`RunOptions::dedup`]),
    /// [`RunError::Rejected`], [`RunError::Deadline`], or the work's own error as
    /// [`RunError::Work`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Reservation, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).token_budget(500).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(250, 250).unwrap()));
    /// let options = RunOptions::default().with_usage(|u: &Usage| Some(*u));
    /// let u = llm.run_blocking(&LlmRequest::default(), options, |_| Ok::<_, ()>(Usage::new(80, 40))).unwrap();
    /// let t = llm.bulkhead().stats().token_budget.unwrap();
    /// assert_eq!((t.in_flight_tokens, t.total_consumed, t.total_refunded), (0, 120, 380));
    /// # let _ = u;
    /// ```
    pub fn run_blocking<R, E, U, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> Result<R, RunError<E>>
    where
        U: UsageFrom<R>,
        F: FnOnce(&mut RunContext) -> Result<R, E>,
    {
        self.run_blocking_in(request, options, work, NoWatch)
    }

    /// The body of `run_blocking` and `run_blocking_timed`: `w` takes the readings (none,
    /// untimed).
    pub(in crate::llm) fn run_blocking_in<R, E, U, F, W>(
        &self,
        request: &LlmRequest,
        mut options: RunOptions<U>,
        work: F,
        mut w: W,
    ) -> W::Out<Result<R, RunError<E>>>
    where
        U: UsageFrom<R>,
        F: FnOnce(&mut RunContext) -> Result<R, E>,
        W: Stopwatch,
    {
        let demand = match self.prepare(request, &options) {
            Ok(d) => d,
            Err(e) => return w.wrap(Err(RunError::Invalid(e))),
        };
        // The fields are read in place: moving them out of `options` copied them, and the
        // caller's token is needed only when the fast decision declines (it declines when
        // there is one).
        let deadline = options.borrowed_concurrency_deadline.take();
        w.start();
        let mut ctx = match admit_now(&self.bulkhead, &demand, &options.wait) {
            Some(a) => RunContext::new(a, deadline),
            None => {
                w.waiting();
                let admitted = self.admit_blocking(
                    demand,
                    std::mem::take(&mut options.wait),
                    options.mode,
                    deadline,
                    w.queued(),
                );
                match admitted {
                    Ok(ctx) => ctx,
                    Err(rej) => return w.refused_with(self.rejected(&demand, rej)),
                }
            }
        };
        if let Err(e) = self.enter_window(&mut ctx) {
            drop(ctx);
            return w.refused_with(e);
        }
        w.admitted(&mut ctx);
        let out = work(&mut ctx);
        w.answer(|| {
            let answer = settle(&mut ctx, out, &options.usage);
            ctx.cut_answer(answer)
        })
    }

    /// `run_blocking` after the fast decision declined: the waiting acquire (enforce) or the
    /// observe-mode decision, and the caller's token for the stop signal. Out of line: the
    /// common call does not carry it.
    #[inline(never)]
    fn admit_blocking(
        &self,
        demand: Demand,
        wait: WaitOptions,
        mode: Mode,
        deadline: Option<Deadline>,
        queued: Option<&mut bool>,
    ) -> Result<RunContext, Rejection> {
        let caller = wait.cancel.clone();
        let mut ctx = match mode {
            Mode::Enforce => RunContext::new(
                self.bulkhead
                    .acquire_blocking_noting(demand, wait, queued)?,
                deadline,
            ),
            Mode::Observe(shadow) => {
                self.observe_blocking(demand, wait, shadow, deadline, queued)?
            }
        };
        ctx.set_caller(caller);
        Ok(ctx)
    }

    /// The observe-mode decision of `run_blocking` after the fast decision declined (see
    /// [`Mode`]): the advisory check, the real acquire, and the bypass.
    #[inline(never)]
    pub(in crate::llm) fn observe_blocking(
        &self,
        demand: Demand,
        wait: WaitOptions,
        shadow: ShadowReasons,
        deadline: Option<Deadline>,
        queued: Option<&mut bool>,
    ) -> Result<RunContext, Rejection> {
        let advised = match self.advise(&demand, shadow) {
            Ok(admits) => admits,
            Err(rej) => return self.bypass(&demand, &wait, rej, false),
        };
        match self
            .bulkhead
            .acquire_blocking_noting(demand, wait.clone(), queued)
        {
            Ok(a) => Ok(RunContext::new(a, deadline)),
            Err(rej) if shadow.contains(rej.reason) => self.bypass(&demand, &wait, rej, advised),
            Err(rej) => Err(rej),
        }
    }

    /// The async [`observe_blocking`](Self::observe_blocking).
    pub(in crate::llm) async fn observe_async(
        &self,
        demand: Demand,
        wait: WaitOptions,
        shadow: ShadowReasons,
        deadline: Option<Deadline>,
        queued: Option<&mut bool>,
    ) -> Result<RunContext, Rejection> {
        let advised = match self.advise(&demand, shadow) {
            Ok(admits) => admits,
            Err(rej) => return self.bypass(&demand, &wait, rej, false),
        };
        match acquire_noting(&self.bulkhead, demand, wait.clone(), queued).await {
            Ok(a) => Ok(RunContext::new(a, deadline)),
            Err(rej) if shadow.contains(rej.reason) => self.bypass(&demand, &wait, rej, advised),
            Err(rej) => Err(rej),
        }
    }

    /// The advisory step of observe mode: `Err` with the refusal when it refuses for a shadow
    /// reason (bypass at once), else whether it said "admit".
    pub(in crate::llm) fn advise(
        &self,
        demand: &Demand,
        shadow: ShadowReasons,
    ) -> Result<bool, Rejection> {
        match self.bulkhead.would_admit(demand) {
            Advice::Refuse(rej) if shadow.contains(rej.reason) => Err(rej),
            advice => Ok(advice.admits()),
        }
    }

    /// Runs the work of `demand`, refused with `rejection`, as bypassed: after the hard check
    /// (`aborted`, `shutdown`), which is never bypassed.
    #[cold]
    pub(in crate::llm) fn bypass(
        &self,
        demand: &Demand,
        wait: &WaitOptions,
        rejection: Rejection,
        raced: bool,
    ) -> Result<RunContext, Rejection> {
        if let Some(hard) = hard_refusal(&self.bulkhead, demand, wait) {
            return Err(hard);
        }
        Ok(RunContext::bypassed(Bypassed::begin(
            &self.bulkhead,
            &self.observe,
            demand,
            rejection,
            raced,
        )))
    }

    /// The async [`run_blocking`](Self::run_blocking): waits for a slot with the async
    /// [`acquire`](Bulkhead::acquire), then awaits `work(&mut ctx)`. Works on any executor
    /// (deadlines run on the crate's timer thread). The request is validated and estimated
    /// when `run` is called, so the future does not borrow it.
    ///
    /// # When the caller hears of the deadline
    /// **At expiry.** When the deadline fires while `work` is pending, `run` answers
    /// [`RunError::Deadline`] at once: the slot is abandoned (cause `deadline`), the work's
    /// future is dropped, and its tokens are settled with its last usage report. The work
    /// needs no cooperation; a work that ignores its stop signal is dropped all the same:
    ///
    /// ```
    /// use futures_lite::future;
    /// use llm_bulkhead::llm::{Deadline, DeadlineTrigger, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions};
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default())
    ///     .default_class("batch").build().unwrap(); // every slot borrowed
    /// let llm = LlmBulkhead::new(b, NaiveEstimator);
    /// let trigger = DeadlineTrigger::new();
    /// let options = RunOptions { borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())), ..RunOptions::default() };
    /// let r = future::block_on(llm.run(&LlmRequest::default(), options, async |_ctx| {
    ///     trigger.fire(); // (a clock deadline fires on the timer thread)
    ///     future::pending::<Result<&str, ()>>().await // a provider call that never answers
    /// }));
    /// assert!(matches!(r, Err(RunError::Deadline(_))));
    /// assert_eq!(llm.bulkhead().stats().admissions_in_flight, 0); // settled at expiry
    /// ```
    ///
    /// The provider call is dropped, not detached: the work's future borrows its context and
    /// is not `'static`, so it cannot outlive the run. Dropping it is how Rust cancels it
    /// (an HTTP client closes its request); whether the provider stops generating is the
    /// provider's affair (see [`Deadline`]). The seed's detached callback, which goes on and
    /// keeps its tokens until it settles with its real usage, needs work that owns its
    /// context and an executor to go on running on: [`run_shared`](Self::run_shared) with
    /// [`RunOptions::detach_at_deadline`] offers it (the caller is answered at expiry and the
    /// work is handed to the application's spawner); `run` refuses that option. A work that
    /// completes in the same poll in which the deadline fired is settled with its usage and
    /// answered `Deadline`. Without a deadline, or on a slot that is not borrowed, nothing of
    /// this runs (the common call takes one branch more).
    ///
    /// It reads no clock: [`run_timed`](Self::run_timed) is the same call with its decision,
    /// queue and work time ([`RunTiming`](crate::llm::RunTiming)).
    ///
    /// # Cancel safety
    /// Dropping the future at any point leaks nothing: while it waits for a slot its waiter
    /// leaves the queue (a slot handed to it passes on); once admitted, dropping it drops
    /// the work's future and the context, which releases the admission with the last usage
    /// report, disarms the deadline and fires the run's [`StopSignal`] with
    /// [`StopCause::Ended`] (observe mode: a bypassed run is settled with its last report, and
    /// a `bypass_release` event says so).
    ///
    /// # Errors
    /// As [`run_blocking`](Self::run_blocking).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(2).token_budget(10_000).build().unwrap(), NaiveEstimator);
    /// let fut = llm.run(&LlmRequest::new("m", &["abcd"]), RunOptions::default(), async |ctx| {
    ///     ctx.report_usage(Usage::new(1, 5)).unwrap();
    ///     Ok::<_, ()>("done")
    /// });
    /// assert_eq!(futures_lite::future::block_on(fut).unwrap(), "done");
    /// let t = llm.bulkhead().stats().token_budget.unwrap();
    /// assert_eq!((t.in_flight_tokens, t.total_consumed), (0, 6));
    /// ```
    pub fn run<'a, R, E, U, F>(
        &'a self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> impl Future<Output = Result<R, RunError<E>>> + 'a
    where
        R: 'a,
        E: 'a,
        U: UsageFrom<R> + 'a,
        F: AsyncFnOnce(&mut RunContext) -> Result<R, E> + 'a,
    {
        self.run_in(request, options, work, NoWatch)
    }

    /// The body of `run` and `run_timed`: `w` takes the readings (none, untimed).
    #[inline(always)]
    pub(in crate::llm) fn run_in<'a, R, E, U, F, W>(
        &'a self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
        mut w: W,
    ) -> impl Future<Output = W::Out<Result<R, RunError<E>>>> + 'a
    where
        R: 'a,
        E: 'a,
        U: UsageFrom<R> + 'a,
        F: AsyncFnOnce(&mut RunContext) -> Result<R, E> + 'a,
        W: Stopwatch + 'a,
    {
        // Validation and estimation happen now, so the future does not borrow the request.
        let prepared = self.prepare(request, &options);
        let mut options = options;
        async move {
            let demand = match prepared {
                Ok(d) => d,
                Err(e) => return w.wrap(Err(RunError::Invalid(e))),
            };
            // As `run_blocking`: the fields are read in place, and the caller's token is
            // cloned only when the fast decision declines (it declines when there is one).
            let deadline = options.borrowed_concurrency_deadline.take();
            w.start();
            let mut ctx = match admit_now(&self.bulkhead, &demand, &options.wait) {
                Some(a) => RunContext::new(a, deadline),
                None => {
                    w.waiting();
                    // Boxed: the queue node is large, and the future of every run would carry it.
                    let admitted = Box::pin(self.admit_async(
                        demand,
                        std::mem::take(&mut options.wait),
                        options.mode,
                        deadline,
                        w.queued(),
                    ))
                    .await;
                    match admitted {
                        Ok(ctx) => ctx,
                        Err(rej) => return w.refused_with(self.rejected(&demand, rej)),
                    }
                }
            };
            if let Err(e) = self.enter_window(&mut ctx) {
                drop(ctx);
                return w.refused_with(e);
            }
            w.admitted(&mut ctx);
            if ctx.is_leased() | ctx.is_clustered() {
                // Boxed: rare, and the future of every run would carry its state.
                let out = Box::pin(until_deadline(&mut ctx, work, &options.usage)).await;
                w.ended();
                return w.wrap(out);
            }
            let out = work(&mut ctx).await;
            w.answer(|| settle(&mut ctx, out, &options.usage))
        }
    }

    /// `run` after the fast decision declined: the waiting acquire (enforce) or the
    /// observe-mode decision, and the caller's token for the stop signal (the async
    /// `admit_blocking`).
    async fn admit_async(
        &self,
        demand: Demand,
        wait: WaitOptions,
        mode: Mode,
        deadline: Option<Deadline>,
        queued: Option<&mut bool>,
    ) -> Result<RunContext, Rejection> {
        let caller = wait.cancel.clone();
        let mut ctx = match mode {
            Mode::Enforce => RunContext::new(
                acquire_noting(&self.bulkhead, demand, wait, queued).await?,
                deadline,
            ),
            Mode::Observe(shadow) => {
                self.observe_async(demand, wait, shadow, deadline, queued)
                    .await?
            }
        };
        ctx.set_caller(caller);
        Ok(ctx)
    }
}

/// The fast decision alone (no cancellation token): the admission if a slot is free and
/// nobody waits, else `None`, having changed and counted nothing, so that the waiting acquire
/// decides again (and counts its refusal) exactly as without this step. It saves building a
/// queue node when none is needed.
///
/// With classes it is the fast attempt of the class protocol (`classed::try_fast`, which
/// declines whenever anyone waits and undoes anything it did when it declines), counted as
/// [`Bulkhead::try_acquire`] counts its success; the full protocol is left to the waiting
/// acquire. Not [`Bulkhead::try_acquire`] itself: its refusal is counted and reported, and the
/// waiting acquire would then count the same demand's refusal a second time.
#[inline(always)]
pub(in crate::llm) fn admit_now(
    b: &Bulkhead,
    demand: &Demand,
    wait: &WaitOptions,
) -> Option<Admission> {
    let shared = &*b.shared;
    if wait.cancel.is_some() {
        return None;
    }
    // Decision timing for the admit event, when a subscriber asked (`Interest::DECISION_TIMING`).
    let _timing = shared.events.time_decision();
    let reservation = shared
        .has_budget
        .then(|| demand.reservation().unwrap_or(Reservation::ZERO));
    let r = reservation.map_or(0, |r| r.total());
    let priority = demand.priority();
    let g = if shared.classed {
        let k = b.class_index(demand.class())?;
        let c = shared.counters.local(crate::record::stats::Counters::new);
        let fast = crate::protocol::classed::try_fast(shared, c, k, r, priority);
        // Wake-ups of a pump the attempt ran, after its operation (`crate::wait::list`).
        crate::protocol::class_pump::deliver_deferred();
        let a = fast?;
        b.count_class_in(c, k, r, a.revision, a.resources)
    } else if demand.class().is_some() {
        return None;
    } else {
        b.try_decide(r, priority).ok()?
    };
    Some(b.admission_from(g, priority, reservation))
}

/// [`Bulkhead::acquire`], also telling `queued` (when given) whether the demand waited in the
/// queue (a timed run's reading).
pub(in crate::llm) async fn acquire_noting(
    b: &Bulkhead,
    demand: Demand,
    wait: WaitOptions,
    queued: Option<&mut bool>,
) -> Result<Admission, Rejection> {
    let Some(queued) = queued else {
        return b.acquire(demand, wait).await;
    };
    let mut acquire = std::pin::pin!(b.acquire(demand, wait));
    let out = acquire.as_mut().await;
    *queued = acquire.was_queued();
    out
}

/// Runs `work` on a context whose borrowed slot has an armed deadline, or that holds a
/// cluster admission, and answers at expiry or at the cut ([`race_deadline`], then
/// [`settle_raced`]). Out of line: only a borrowed slot with a deadline, or a cluster-managed
/// bulkhead, comes here.
#[inline(never)]
async fn until_deadline<R, E, U, F>(
    ctx: &mut RunContext,
    work: F,
    usage: &U,
) -> Result<R, RunError<E>>
where
    U: UsageFrom<R>,
    F: AsyncFnOnce(&mut RunContext) -> Result<R, E>,
{
    let Some((signal, expired)) = ctx.deadline_watch() else {
        // A cluster admission without a borrowed-slot deadline: raced against its cut.
        #[cfg(feature = "cluster")]
        return super::cluster::until_cut(ctx, work, usage).await;
        #[cfg(not(feature = "cluster"))]
        {
            let out = work(ctx).await;
            return settle(ctx, out, usage);
        }
    };
    let out = race_deadline(work(ctx), &signal).await;
    let answer = settle_raced(ctx, out, usage, expired);
    ctx.cut_answer(answer)
}

/// Polls `running` until it completes (`Some`) or the deadline of `signal` fires while it is
/// pending (`None`; `running` is dropped on return, and with it the provider call).
pub(in crate::llm) async fn race_deadline<T>(
    running: impl Future<Output = T>,
    signal: &StopSignal,
) -> Option<T> {
    let mut running = std::pin::pin!(running);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = running.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        signal.register(cx.waker());
        // `fire` stores the cause before it wakes: registering first misses no expiry.
        match signal.deadline_fired() {
            true => Poll::Ready(None),
            false => Poll::Pending,
        }
    })
    .await
}

/// The answer after [`race_deadline`]: a work that completed is settled as [`settle`] does
/// (the deadline still wins if it fired in the work's last poll); a work dropped at expiry
/// has its tokens settled with its last usage report, and the answer is
/// [`RunError::Deadline`].
pub(in crate::llm) fn settle_raced<R, E, U: UsageFrom<R>>(
    ctx: &mut RunContext,
    out: Option<Result<R, E>>,
    usage: &U,
    expired: DeadlineExpired,
) -> Result<R, RunError<E>> {
    match out {
        Some(out) => settle(ctx, out, usage),
        None => {
            ctx.finish(None);
            Err(RunError::Deadline(expired))
        }
    }
}

/// Releases the admission of a finished work and builds the answer. The caller drops `ctx`
/// right after (see [`RunContext::finish`]).
#[inline(always)]
pub(in crate::llm) fn settle<R, E, U: UsageFrom<R>>(
    ctx: &mut RunContext,
    out: Result<R, E>,
    usage: &U,
) -> Result<R, RunError<E>> {
    match out {
        Ok(r) => match ctx.finish(usage.usage_from(&r)) {
            Some(d) => Err(RunError::Deadline(d)),
            None => Ok(r),
        },
        Err(e) => Err(match ctx.finish(None) {
            Some(d) => RunError::Deadline(d),
            None => RunError::Work(e),
        }),
    }
}
