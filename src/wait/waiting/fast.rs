//! The first decision of a waiting acquire (`super`, "Protocol", "Enter"): `try_acquire`'s
//! decision, made before any waiter node exists; only a demand that could queue goes on to
//! build its node and decide again under the queue mutex.

use super::*;

/// A fast admission's parts: what builds it, its priority and its reservation.
pub(crate) type Fast = (Granted, Priority, Option<Reservation>);

impl Bulkhead {
    /// The first decision of a waiting acquire, without a node: `try_acquire`'s decision (the
    /// same checks, the same no-barging rule: while waiters are queued the fast CAS refuses),
    /// answered at once unless the demand could queue (no free slot, or short only of tokens
    /// under token waiting, with a queue possible), which is `None`: the caller builds its node
    /// and enters the queue ([`enter_queue`](Self::enter_queue), which decides again under the
    /// mutex). With classes (or a class this bulkhead does not have) always `None`: the class
    /// enter ([`enter`](Self::enter)) makes its own fast decision.
    #[inline(always)]
    pub(crate) fn decide_or_wait(&self, demand: &Demand) -> Option<Result<Admission, Rejection>> {
        Some(match self.decide_fast(demand)? {
            Ok((g, priority, reservation)) => Ok(self.admission_from(g, priority, reservation)),
            Err(rej) => Err(rej),
        })
    }

    /// [`decide_or_wait`](Self::decide_or_wait) up to the admission: what builds it, with the
    /// priority and reservation it records ([`admission_parts`](Self::admission_parts)), a
    /// refusal, or `None` (wait).
    #[inline(always)]
    pub(crate) fn decide_fast(&self, demand: &Demand) -> Option<Result<Fast, Rejection>> {
        let shared = &*self.shared;
        if shared.classed || demand.class().is_some() {
            return None;
        }
        let (priority, reservation) = self.admission_parts(demand);
        let r = reservation.map_or(0, |x| x.total());
        loop {
            match self.try_decide(r, priority) {
                Ok(g) => return Some(Ok((g, priority, reservation))),
                Err(f) => {
                    if may_queue(shared, &f, r, priority) {
                        return None;
                    }
                    if let Some(rej) = self.refusal(&f, r, priority) {
                        return Some(Err(rej));
                    }
                }
            }
        }
    }

    /// The priority and the reservation an admission of `demand` records (the reservation,
    /// zero for a slot-only demand, only with a budget).
    #[inline(always)]
    pub(crate) fn admission_parts(&self, demand: &Demand) -> (Priority, Option<Reservation>) {
        let reservation = if self.shared.has_budget {
            Some(demand.reservation().unwrap_or(Reservation::ZERO))
        } else {
            None
        };
        (demand.priority(), reservation)
    }

    /// [`enter`](Self::enter) after [`decide_or_wait`](Self::decide_or_wait) said "wait":
    /// without classes straight to the decision under the mutex (the fast one was made).
    pub(super) fn enter_after_fast<'n>(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
        node: impl FnOnce() -> Pin<&'n Waiter>,
    ) -> Enter {
        if self.shared.classed || k == UNKNOWN_CLASS {
            self.enter(k, r, priority, node)
        } else {
            self.enter_queue(r, priority, node)
        }
    }
}

/// Whether a no-class fast refusal `f` of a demand of `r` tokens at `priority` is one to decide
/// again under the queue mutex (and perhaps wait): no free slot, or (token waiting,
/// `crate::protocol::token_wait`) short only of tokens it would have once nothing else is
/// held; and a queue is possible (`max_concurrent > 0`, `max_queue > 0`).
#[inline(always)]
pub(super) fn may_queue(
    shared: &crate::shared::Shared,
    f: &crate::handle::bulkhead::Refusal<'_>,
    r: u64,
    priority: Priority,
) -> bool {
    let lim = f.lim();
    let waits_for_tokens = f.reason == RejectReason::BudgetLimit
        && shared.wait_for_tokens
        && fits_when_idle(&lim, r, priority);
    (f.reason == RejectReason::ConcurrencyLimit || waits_for_tokens)
        && lim.max_concurrent > 0
        && lim.max_queue > 0
}
