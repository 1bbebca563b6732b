//! The model's wait queue: FIFO waiters, their answers, cancellation and the pump.

use super::*;

impl Model {
    /// A waiting acquire (CONTRACT.md §2 rows 6–7, §3): admitted at once, refused fail-fast
    /// (including `queue_limit`), or queued: a demand that passes rows 0–5 waits when no slot
    /// is free or others wait (one FIFO for every class).
    ///
    /// # Errors
    /// The [`Rejection`] the engine gives in the same state.
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, Waited}, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// let Waited::Admitted(h) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// let Waited::Queued(w) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// m.release(h, None).unwrap();
    /// assert!(m.take_answer(w).unwrap().is_ok());
    /// ```
    pub fn acquire_wait(&mut self, d: Demand) -> Result<Waited, Rejection> {
        let reservation = self
            .has_budget
            .then(|| d.reservation().unwrap_or(Reservation::ZERO));
        let r = reservation.map_or(0, |x| x.total());
        let p = d.priority();
        let k = self.class_of(&d);
        let free = self.in_flight < u64::from(self.limits.max_concurrent);
        let checked = self.check(k, r, p, false);
        // Token waiting: short only of tokens, able to fit later, and a queue is possible.
        let for_tokens = matches!(checked, Err((reason, _)) if self.waits_for_tokens(k, r, p, reason))
            && self.limits.max_concurrent > 0
            && self.limits.max_queue > 0;
        let ahead = self.queue.is_empty() || self.bypasses(k, r);
        if (checked.is_err() && !for_tokens) || (checked.is_ok() && free && ahead) {
            return self.try_acquire(d).map(Waited::Admitted);
        }
        let global = (!self.names.is_empty()).then_some(Constraint::Global);
        if self.limits.max_concurrent == 0 || self.limits.max_queue == 0 {
            return Err(self.refuse(k, RejectReason::ConcurrencyLimit, global, r, p, 0));
        }
        if self.queue.len() as u64 >= u64::from(self.limits.max_queue) {
            let pending = self.queue.len() as u64;
            return Err(self.refuse(k, RejectReason::QueueLimit, global, r, p, pending));
        }
        let id = self.next_wait;
        self.next_wait += 1;
        self.queue.push_back(Queued {
            id,
            k,
            r,
            priority: p,
            reservation,
        });
        Ok(Waited::Queued(WaitId(id)))
    }

    /// The answer to a queued waiter, once it has one (taken once); a refusal is counted and
    /// explained when taken, as the engine does when the waiter wakes.
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, Waited, WaitId}, LimitsSnapshot};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// assert!(m.take_answer(WaitId(7)).is_none());
    /// ```
    pub fn take_answer(&mut self, id: WaitId) -> Option<Result<Handle, Rejection>> {
        match self.answers.remove(&id.0)? {
            Answer::Admitted(h) => Some(Ok(h)),
            Answer::Refused(reason, constraint, k, r, p) => {
                let pending = self.queue.len() as u64;
                Some(Err(self.refuse(k, reason, constraint, r, p, pending)))
            }
        }
    }

    /// Whether queued waiter `id` has an answer waiting to be taken.
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, WaitId}, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// assert!(!m.answered(WaitId(0)));
    /// ```
    pub fn answered(&self, id: WaitId) -> bool {
        self.answers.contains_key(&id.0)
    }

    /// A waiter gives up (its future is dropped): it leaves the queue; if it had already been
    /// admitted, that admission is released at once (which hands its slot on).
    ///
    /// ```
    /// # use llm_bulkhead::{model::{Model, Waited}, LimitsSnapshot, Demand};
    /// let mut m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// let Waited::Admitted(h) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// let Waited::Queued(w) = m.acquire_wait(Demand::slot()).unwrap() else { panic!() };
    /// m.cancel_wait(w);
    /// assert_eq!(m.stats().pending, 0);
    /// # let _ = h;
    /// ```
    pub fn cancel_wait(&mut self, id: WaitId) {
        let before = self.queue.len();
        self.queue.retain(|w| w.id != id.0);
        if let Some(Answer::Admitted(h)) = self.answers.remove(&id.0) {
            let _ = self.release(h, None);
        }
        if self.wait_for_tokens && self.queue.len() < before {
            // The waiter behind may fit where this one did not.
            self.pump();
        }
    }

    /// Hands free slots to head waiters, performing each one's whole decision (rows 1–5): a
    /// head that fails it is answered with its reason and the next is considered, as the
    /// engine's hand-off and pump do.
    ///
    /// Under token waiting a head refused only for tokens that fits once nothing else is held
    /// stays at the head, and nobody behind it is considered (strict FIFO).
    pub(super) fn pump(&mut self) {
        while !self.closed && self.in_flight < u64::from(self.limits.max_concurrent) {
            let Some(&w) = self.queue.front() else {
                break;
            };
            match self.check(w.k, w.r, w.priority, false) {
                Ok(borrow) => {
                    self.queue.pop_front();
                    let h = self.admit(w.k, w.r, w.reservation, borrow);
                    self.answers.insert(w.id, Answer::Admitted(h));
                }
                Err((reason, _)) if self.waits_for_tokens(w.k, w.r, w.priority, reason) => break,
                Err((reason, constraint)) => {
                    self.queue.pop_front();
                    self.answers.insert(
                        w.id,
                        Answer::Refused(reason, constraint, w.k, w.r, w.priority),
                    );
                }
            }
        }
    }

    /// Whether a newcomer of `r` tokens in class `k` may be admitted ahead of the queued
    /// waiters (`crate::protocol::classed`, "Bypass"): classes only; its demand stays inside
    /// its class's floors (no borrowed slot, no borrowed token); no waiter of its class is
    /// queued; and `U = Σ max(n_j, protected_concurrent_j) ≤ max_concurrent` and
    /// `V = Σ max(t_j, protected_tokens_j) ≤` the normal-priority effective budget. Then no
    /// queued waiter's decision depends on it (the argument is in `crate::protocol::classed`).
    pub(super) fn bypasses(&self, k: usize, r: u64) -> bool {
        if self.names.is_empty() {
            return false;
        }
        let lims = self.class_limits();
        let (c, l) = (self.classes[k], lims[k]);
        let inside =
            c.in_flight < l.pc && c.tokens.saturating_add(r).max(l.pt) == c.tokens.max(l.pt);
        if !inside || self.queue.iter().any(|w| w.k == k) {
            return false;
        }
        let u: u64 = self
            .classes
            .iter()
            .zip(&lims)
            .map(|(s, l)| s.in_flight.max(l.pc))
            .sum();
        let v: u64 = self
            .classes
            .iter()
            .zip(&lims)
            .map(|(s, l)| s.tokens.max(l.pt))
            .sum();
        u <= u64::from(self.limits.max_concurrent)
            && self.eff(Priority::Normal).is_none_or(|e| v <= e)
    }

    /// How many admissions bypassed queued waiters so far (in-floor newcomers admitted while
    /// waiters of other classes were queued; see [`Model::try_acquire`]).
    ///
    /// ```
    /// # use llm_bulkhead::{model::Model, LimitsSnapshot};
    /// let m = Model::new(LimitsSnapshot { revision: 0, max_concurrent: 1, max_queue: 1, token_budget: None, classes: Default::default() }).unwrap();
    /// assert_eq!(m.bypassed(), 0);
    /// ```
    pub fn bypassed(&self) -> u64 {
        self.bypassed
    }

    /// The budget part of a rejection's detail in the current state.
    pub(super) fn token_capacity(&self, p: Priority, r: u64) -> Option<TokenCapacity> {
        self.limits.token_budget.map(|b| {
            let eff = b.effective(p);
            TokenCapacity {
                budget: b.budget,
                in_flight_tokens: self.tokens,
                effective_budget: eff,
                available: eff.saturating_sub(self.tokens),
                requested: r,
            }
        })
    }
}
