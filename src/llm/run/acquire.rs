//! Request-level acquires on [`LlmBulkhead`]: `try_acquire`, `acquire` (async) and
//! `acquire_blocking` estimate the request, apply the class, priority and reservation of
//! [`RunOptions`] (the same options as `run`), and return the [`Admission`], whose release is
//! the caller's (the seed's `acquire()`). They never de-duplicate and have no observe mode.
//! They take `RunOptions` without a usage function (the type says so: an acquire has no
//! result to read usage from; report it on the admission instead).

use super::*;

/// Why a request-level acquire returned no admission.
///
/// ```
/// use llm_bulkhead::llm::{AcquireError, LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, RejectReason};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// match llm.try_acquire(&LlmRequest::default(), &RunOptions::default()) {
///     Err(AcquireError::Rejected(r)) => assert_eq!(r.reason, RejectReason::ConcurrencyLimit),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AcquireError {
    /// Refused (the rejection carries the reason and the capacity detail).
    Rejected(Rejection),
    /// The request or an option is invalid (the error names the field); nothing changed.
    Invalid(EstimateError),
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::Rejected(r) => write!(f, "LLM bulkhead rejected: {r}"),
            AcquireError::Invalid(e) => write!(f, "invalid acquire: {e}"),
        }
    }
}

impl std::error::Error for AcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AcquireError::Rejected(r) => Some(r),
            AcquireError::Invalid(e) => Some(e),
        }
    }
}

impl LlmBulkhead {
    /// The demand of a request-level acquire, after refusing the options an acquire cannot
    /// honour (it has no work to stop, detach or bypass): a borrowed-concurrency deadline,
    /// `detach_at_deadline` and observe mode are [`EstimateError::InvalidSetting`], so that
    /// none is silently ignored. `dedup` and `dedup_scope` are not read: an acquire never
    /// de-duplicates (the seed's `acquire()`). On a cluster-managed bulkhead an acquire
    /// refuses (field `cluster`): its admission could not carry the deadline.
    fn acquire_demand(
        &self,
        request: &LlmRequest,
        options: &RunOptions,
    ) -> Result<Demand, EstimateError> {
        let refuse = |field, expected| Err(EstimateError::InvalidSetting { field, expected });
        self.check_unclustered()?;
        if options.borrowed_concurrency_deadline.is_some() {
            return refuse(
                "borrowed_concurrency_deadline",
                "none on an acquire: abandon the slot with Admission::abandon_borrowed_concurrency",
            );
        }
        if options.detach_at_deadline.is_some() {
            return refuse("detach_at_deadline", "none on an acquire: it runs no work");
        }
        if let Mode::Observe(_) = options.mode {
            return refuse(
                "mode",
                "enforce on an acquire: only run has an observe mode",
            );
        }
        self.demand(request, options)
    }

    /// Admits `request` now or refuses it, without waiting: [`Bulkhead::try_acquire`] of the
    /// demand [`estimate`](Self::estimate) previews, with the class and priority of
    /// `options`. The admission is the caller's to release (dropping it releases it with its
    /// last usage report).
    ///
    /// # Errors
    /// [`AcquireError::Invalid`] before anything changes: the request or the reservation
    /// override (as [`estimate`](Self::estimate)), a class of another bulkhead, an option an
    /// acquire cannot honour (`borrowed_concurrency_deadline`, `detach_at_deadline`, observe
    /// `mode`), or `wait` options (a `try_acquire` never waits: use
    /// [`acquire`](Self::acquire)). [`AcquireError::Rejected`] with the refusal otherwise.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    /// use llm_bulkhead::{Bulkhead, Priority, Reservation, Usage};
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap(),
    ///     |_: &LlmRequest| Ok(Reservation::new(100, 200).unwrap()));
    /// let options = RunOptions { priority: Priority::High, ..RunOptions::default() };
    /// let admission = llm.try_acquire(&LlmRequest::default(), &options).unwrap();
    /// assert_eq!((admission.reservation().unwrap().total(), admission.priority()), (300, Priority::High));
    /// admission.release(Some(Usage::new(100, 20))).unwrap();
    /// assert_eq!(llm.bulkhead().stats().token_budget.unwrap().in_flight_tokens, 0);
    /// ```
    pub fn try_acquire(
        &self,
        request: &LlmRequest,
        options: &RunOptions,
    ) -> Result<Admission, AcquireError> {
        let demand = self
            .acquire_demand(request, options)
            .map_err(AcquireError::Invalid)?;
        if options.wait.cancel.is_some() || options.wait.timeout != crate::QueueTimeout::Default {
            return Err(AcquireError::Invalid(EstimateError::InvalidSetting {
                field: "wait",
                expected: "the default on try_acquire, which never waits (acquire waits)",
            }));
        }
        self.bulkhead
            .try_acquire(demand)
            .map_err(AcquireError::Rejected)
    }

    /// Admits `request`, waiting in the queue when the bulkhead queues, with the timeout and
    /// cancellation of `options.wait` ([`Bulkhead::acquire`]). The request is validated and
    /// estimated when `acquire` is called, so the future does not borrow it.
    ///
    /// # Cancel safety
    /// As [`Bulkhead::acquire`]: dropping the future while it waits leaves the queue and
    /// leaks nothing.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), but `wait` applies; a queue timeout or a
    /// cancelled token is [`AcquireError::Rejected`] with `timeout` or `aborted`.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::builder().max_concurrent(1).max_queue(4).build().unwrap(), NaiveEstimator);
    /// let a = futures_lite::future::block_on(llm.acquire(&LlmRequest::default(), RunOptions::default())).unwrap();
    /// assert_eq!(llm.bulkhead().stats().in_flight, 1);
    /// drop(a);
    /// ```
    pub fn acquire<'a>(
        &'a self,
        request: &LlmRequest,
        options: RunOptions,
    ) -> impl Future<Output = Result<Admission, AcquireError>> + 'a {
        let demand = self.acquire_demand(request, &options);
        async move {
            let demand = demand.map_err(AcquireError::Invalid)?;
            self.bulkhead
                .acquire(demand, options.wait)
                .await
                .map_err(AcquireError::Rejected)
        }
    }

    /// The blocking [`acquire`](Self::acquire): waits on this thread
    /// ([`Bulkhead::acquire_blocking`]).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let a = llm.acquire_blocking(&LlmRequest::default(), RunOptions::default()).unwrap();
    /// assert!(llm.acquire_blocking(&LlmRequest::default(), RunOptions::default()).is_err());
    /// drop(a);
    /// ```
    pub fn acquire_blocking(
        &self,
        request: &LlmRequest,
        options: RunOptions,
    ) -> Result<Admission, AcquireError> {
        let demand = self
            .acquire_demand(request, &options)
            .map_err(AcquireError::Invalid)?;
        self.bulkhead
            .acquire_blocking(demand, options.wait)
            .map_err(AcquireError::Rejected)
    }
}
