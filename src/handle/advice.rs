//! Advisory admission: would a demand be admitted now? (reference §2.5). Read-only.

use crate::sync::{lock, Ordering};
use crate::vocab::demand::{Demand, Reservation};
use crate::vocab::rejection::{CapacityDetail, Constraint, RejectReason, Rejection};
use crate::words::classes::ClassView;
use crate::words::limits::{Hot, HotClass};
use crate::words::state::Word;
use crate::Bulkhead;

/// The answer of [`Bulkhead::would_admit`]: admit (now, or after waiting in the queue), or the
/// rejection the demand would get, with the same capacity detail.
///
/// ```
/// use llm_bulkhead::{Advice, Bulkhead, Demand, RejectReason};
/// let b = Bulkhead::new(1).unwrap();
/// assert!(b.would_admit(&Demand::slot()).admits());
/// let held = b.try_acquire(Demand::slot()).unwrap();
/// assert_eq!(b.would_admit(&Demand::slot()).reason(), Some(RejectReason::ConcurrencyLimit));
/// # drop(held);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Advice {
    /// It would be admitted.
    Admit {
        /// It would wait in the queue first (no free slot, queue room).
        would_queue: bool,
        /// The revision of the limits the answer used.
        revision: u64,
        /// The capacity the answer saw.
        detail: CapacityDetail,
    },
    /// It would be refused, with this rejection.
    Refuse(Rejection),
}

impl Advice {
    /// Whether the demand would be admitted.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// assert!(!Bulkhead::new(0).unwrap().would_admit(&Demand::slot()).admits());
    /// ```
    #[must_use]
    pub fn admits(&self) -> bool {
        matches!(self, Advice::Admit { .. })
    }

    /// The refusal reason, if it would be refused.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(1).unwrap();
    /// b.close();
    /// assert_eq!(b.would_admit(&Demand::slot()).reason(), Some(RejectReason::Shutdown));
    /// ```
    #[must_use]
    pub fn reason(&self) -> Option<RejectReason> {
        match self {
            Advice::Admit { .. } => None,
            Advice::Refuse(r) => Some(r.reason),
        }
    }

    /// The capacity detail (present for both answers, as the reference's `detail: true`),
    /// by value: a refusal computes it from the numbers it kept ([`Rejection::detail`]).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// assert_eq!(Bulkhead::new(3).unwrap().would_admit(&Demand::slot()).detail().max_concurrent, 3);
    /// ```
    #[must_use]
    pub fn detail(&self) -> CapacityDetail {
        match self {
            Advice::Admit { detail, .. } => detail.clone(),
            Advice::Refuse(r) => r.detail(),
        }
    }
}

impl Bulkhead {
    /// Would `demand` be admitted now? Advisory: it takes nothing, counts nothing and emits no
    /// event (reference §2.5). The order is the decision's: closed → `shutdown`; the capacity
    /// checks (budget, and with classes the class ceilings and floors); a free slot with nobody
    /// queued → admit; `max_concurrent` or `max_queue` 0 → `concurrency_limit`; queue room →
    /// admit (it would wait); else `queue_limit`.
    ///
    /// # Precision
    /// The answer is evaluated from one read of the state word under the reconfiguration lock
    /// (so against one limits snapshot) and a read of the queue length just after, but
    /// decisions of other threads are not stopped: by the time it returns, a concurrent
    /// admission or release may have changed the answer. With
    /// classes, the class words are read one after another (as `stats()` does), so under
    /// concurrent traffic the figures are not one atomic cut; at rest the answer is exact.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(3).token_budget(1_200).build().unwrap();
    /// let d = Demand::tokens(Reservation::new(100, 1_000).unwrap());
    /// assert!(b.would_admit(&d).admits());
    /// let a = b.try_acquire(d).unwrap();
    /// let advice = b.would_admit(&d);
    /// assert_eq!(advice.reason(), Some(RejectReason::BudgetLimit));
    /// assert_eq!(advice.detail().token_budget.unwrap().available, 100);
    /// assert_eq!(b.stats().rejected, 0); // nothing counted
    /// # drop(a);
    /// ```
    #[must_use = "would_admit only answers: it admits nothing and holds nothing (use try_acquire)"]
    pub fn would_admit(&self, demand: &Demand) -> Advice {
        let shared = &*self.shared;
        if !self.class_is_valid(demand.class()) {
            return Advice::Refuse(crate::handle::bulkhead::unknown_class());
        }
        let r = if shared.has_budget {
            demand.reservation().unwrap_or(Reservation::ZERO).total()
        } else {
            0
        };
        let priority = demand.priority();
        // The limits and the word are read under the lock of the published limits (so the
        // word's figures belong to that snapshot: an install replaces both under it, and never
        // holds it while it waits out a grace period); the queue lock is taken after, never
        // nested.
        let published = lock(&shared.published);
        let snap = *published;
        let w = Word(shared.word.load(Ordering::Acquire));
        drop(published);
        let pending = crate::protocol::handoff::pending(shared) as u64;
        let hot = Hot {
            revision: snap.revision,
            max_concurrent: u64::from(snap.max_concurrent),
            max_queue: u64::from(snap.max_queue),
            budget: snap.token_budget.map(|b| b.budget),
            eff_normal: snap
                .token_budget
                .map_or(0, |b| b.effective(crate::Priority::Normal)),
        };
        let eff = hot.effective(priority);
        let closed = w.closed();
        if shared.classed {
            let (classes, g, t) = crate::protocol::classed::collect(shared);
            let k = self
                .class_index(demand.class())
                .unwrap_or(shared.default_class);
            let limits: Vec<HotClass> = snap.classes.iter().map(|&l| l.into()).collect();
            let view = ClassView {
                g,
                t,
                classes: &classes,
                limits: &limits,
                max_concurrent: hot.max_concurrent,
                eff,
            };
            // Rows 1–5 fail fast; a demand that passes them but finds no free slot (or
            // waiters queued: nobody barges) waits if the queue has room, as the decision does.
            let global = Some(Constraint::Global);
            let mut would_queue = false;
            let verdict = if closed {
                Some((RejectReason::Shutdown, None))
            } else {
                let no_slot = (RejectReason::ConcurrencyLimit, Constraint::Global);
                match view.decide(k, r) {
                    Some(v) if v != no_slot => Some((v.0, Some(v.1))),
                    d if d.is_some() || w.waiters() || pending > 0 => {
                        if hot.max_concurrent == 0 || hot.max_queue == 0 {
                            Some((RejectReason::ConcurrencyLimit, global))
                        } else if pending < hot.max_queue {
                            would_queue = true;
                            None
                        } else {
                            Some((RejectReason::QueueLimit, global))
                        }
                    }
                    _ => None,
                }
            };
            let mut detail = crate::protocol::plain::rejection(
                g,
                t,
                &hot,
                verdict.map_or(RejectReason::ConcurrencyLimit, |v| v.0),
                r,
                priority,
            )
            .detail();
            detail.pending = pending;
            if verdict.is_none_or(|v| v.0 != RejectReason::Shutdown) {
                detail.classes = Some(Box::new(view.detail(k, &shared.class_names[k], r)));
            }
            return match verdict {
                None => Advice::Admit {
                    would_queue,
                    revision: hot.revision,
                    detail,
                },
                Some((reason, constraint)) => Advice::Refuse(Rejection::with_detail(
                    reason,
                    constraint,
                    hot.revision,
                    detail,
                )),
            };
        }
        let (slots, tokens) = (w.slots(), w.tokens());
        let verdict = if closed {
            Err(RejectReason::Shutdown)
        } else if eff.is_some_and(|e| tokens.saturating_add(r) > e) {
            Err(RejectReason::BudgetLimit)
        } else if slots < hot.max_concurrent && pending == 0 {
            Ok(false)
        } else if hot.max_concurrent == 0 || hot.max_queue == 0 {
            Err(RejectReason::ConcurrencyLimit)
        } else if pending < hot.max_queue {
            Ok(true)
        } else {
            Err(RejectReason::QueueLimit)
        };
        let reason = verdict.err().unwrap_or(RejectReason::ConcurrencyLimit);
        let mut rej = crate::protocol::plain::rejection(slots, tokens, &hot, reason, r, priority);
        rej.set_pending(pending);
        match verdict {
            Ok(would_queue) => Advice::Admit {
                would_queue,
                revision: hot.revision,
                detail: rej.detail(),
            },
            Err(_) => Advice::Refuse(rej),
        }
    }
}
