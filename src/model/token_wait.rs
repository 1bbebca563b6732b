//! The model's token waiting ([`Model::with_token_waiting`]): which demands wait for tokens,
//! waiters that leave, and the sweep of never-fitting waiters after a reconfiguration.

use super::*;

impl Model {
    /// The same model with token waiting on or off, as
    /// [`BulkheadBuilder::wait_for_tokens`](crate::BulkheadBuilder::wait_for_tokens) sets it
    /// on the engine: a waiting demand refused only for tokens (`budget_limit`, any constraint)
    /// that fits once nothing else is held queues, the head blocks everyone behind it, and
    /// refunds, leaving waiters and reconfigurations pump the queue.
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, Waited}, LimitsSnapshot, BudgetLimits, Demand, Reservation};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 2, max_queue: 2,
    ///     token_budget: Some(BudgetLimits { budget: 1_000, high_priority_reserve: 0 }),
    ///     classes: Default::default() }).unwrap().with_token_waiting(true);
    /// let d = Demand::tokens(Reservation::new(0, 600).unwrap());
    /// let Waited::Admitted(h) = m.acquire_wait(d).unwrap() else { panic!() };
    /// let Waited::Queued(w) = m.acquire_wait(d).unwrap() else { panic!() }; // short of tokens
    /// m.release(h, None).unwrap();
    /// assert!(m.take_answer(w).unwrap().is_ok());
    /// ```
    pub fn with_token_waiting(mut self, on: bool) -> Model {
        self.wait_for_tokens = on;
        self
    }

    /// `Some(constraint)`: a demand of `r` tokens in class `k` at `p` is refused for tokens even
    /// with nothing held (it can never fit); `None`: its tokens fit then.
    pub(super) fn never_fits(&self, k: usize, r: u64, p: Priority) -> Option<Option<Constraint>> {
        let eff = self.eff(p);
        if self.names.is_empty() {
            return eff.is_some_and(|e| r > e).then_some(None);
        }
        crate::protocol::token_wait::classed_idle_refusal(
            &self.class_limits(),
            k,
            r,
            self.limits.max_concurrent.into(),
            eff,
        )
        .map(Some)
    }

    /// Whether a waiting demand refused with `reason` waits for tokens under the option.
    pub(super) fn waits_for_tokens(
        &self,
        k: usize,
        r: u64,
        p: Priority,
        reason: RejectReason,
    ) -> bool {
        self.wait_for_tokens
            && reason == RejectReason::BudgetLimit
            && self.never_fits(k, r, p).is_none()
    }

    /// A waiter leaves the queue with `reason` (`timeout`, or `aborted` by its cancel token),
    /// as the engine's waiter does when it wakes: the answer it already had if it had one,
    /// otherwise it unlinks (pumping under token waiting) and is refused with `reason`.
    /// `None` for an unknown waiter.
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, Waited}, LimitsSnapshot, Demand, RejectReason};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// let Waited::Admitted(_h) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// let Waited::Queued(w) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// let e = m.leave_wait(w, RejectReason::Timeout).unwrap().unwrap_err();
    /// assert_eq!(e.reason, RejectReason::Timeout);
    /// ```
    pub fn leave_wait(
        &mut self,
        id: WaitId,
        reason: RejectReason,
    ) -> Option<Result<Handle, Rejection>> {
        if self.answers.contains_key(&id.0) {
            return self.take_answer(id);
        }
        let at = self.queue.iter().position(|w| w.id == id.0)?;
        let w = self.queue.remove(at)?;
        if self.wait_for_tokens {
            self.pump();
        }
        let constraint = match reason {
            RejectReason::Shutdown | RejectReason::Aborted => None,
            _ => (!self.names.is_empty()).then_some(Constraint::Global),
        };
        let pending = self.queue.len() as u64;
        Some(Err(
            self.refuse(w.k, reason, constraint, w.r, w.priority, pending)
        ))
    }

    /// Token waiting, after a reconfiguration: answers every queued waiter whose demand can
    /// no longer fit at all with `budget_limit`, oldest first.
    pub(super) fn sweep_never_fit(&mut self) {
        if !self.wait_for_tokens {
            return;
        }
        let queue = std::mem::take(&mut self.queue);
        for w in queue {
            match self.never_fits(w.k, w.r, w.priority) {
                Some(constraint) => {
                    self.answers.insert(
                        w.id,
                        Answer::Refused(
                            RejectReason::BudgetLimit,
                            constraint,
                            w.k,
                            w.r,
                            w.priority,
                        ),
                    );
                }
                None => self.queue.push_back(w),
            }
        }
    }

    /// The queued waiters, oldest first (for tests that check the engine's FIFO order).
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// assert!(m.queued().is_empty());
    /// ```
    pub fn queued(&self) -> Vec<WaitId> {
        self.queue.iter().map(|w| WaitId(w.id)).collect()
    }
}
