//! Class mode of the waits' enqueue (`super`, "With admission classes").

use super::*;
use crate::protocol::class_pump::raise_queued_class;
use crate::protocol::token_wait::classed_waits_for_tokens;

// ---- class mode (module docs, "With admission classes") ----

impl Bulkhead {
    /// Class mode of `enter`: the fast class decision, then under the mutex (raising the flags
    /// first when the queue is empty) a decision for the would-be head, or a place at the tail.
    #[inline(never)]
    pub(super) fn enter_classed<'n>(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
        node: impl FnOnce() -> Pin<&'n Waiter>,
    ) -> Enter {
        let shared = &*self.shared;
        // Rows 1–5 pass and there is no free slot, or waiters are queued and the demand may
        // not bypass them (`crate::protocol::classed`, "Bypass"): straight to the queue (a
        // decision of our own would only be refused, and explained at a cost).
        let w = Word(shared.word.load(Ordering::SeqCst));
        let lim = shared.ring.read(w.tag());
        let pre = crate::protocol::classed::precheck(shared, k, r, priority);
        let to_queue = lim.max_concurrent > 0
            && lim.max_queue > 0
            && (pre == Precheck::NoSlot
                || (pre == Precheck::Fits
                    && w.waiters()
                    && !crate::protocol::classed::may_bypass(shared, k, r)));
        if !to_queue {
            let decided = crate::protocol::classed::acquire(shared, k, r, priority);
            // Wake-ups of a pump the decision ran, after its operation (`crate::wait::list`).
            crate::wait::list::deliver_deferred();
            match decided {
                Ok(a) => {
                    return Enter::Granted(self.count_class_admission(
                        k,
                        r,
                        a.revision,
                        a.resources,
                    ))
                }
                // No free slot, or a refusal no collect confirmed (another decider's step was
                // in flight): decide again under the mutex, and wait if need be.
                Err(f)
                    if (may_wait(&f) || classed_waits_for_tokens(shared, &f, k, r, priority))
                        && f.lim.max_concurrent > 0
                        && f.lim.max_queue > 0 => {}
                Err(f) => return Enter::Refused(self.class_refusal(k, &f, r, priority)),
            }
        }
        crate::sync::pause(crate::sync::PausePoint::EnterQueue);
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        // Class `k` counts as queued from here (before the decision below and before joining
        // the tail), so that no newcomer of class `k` bypasses the queue ahead of this waiter.
        raise_queued_class(shared, &mut q, k);
        // Whether the "never fits" check below was made under this lock already.
        let mut fit_checked = false;
        if q.len() == 0 {
            // Become the head: flags up first, then decide (no lost wake-up). A collect after
            // the flags that finds no free slot is that decision: any release it missed comes
            // later in its word's order, sees the flags and pumps.
            set_class_flags(shared, &mut q, true, true);
            if crate::protocol::classed::precheck(shared, k, r, priority) != Precheck::NoSlot {
                match crate::protocol::classed::acquire_in_queue(shared, k, r, priority) {
                    Ok(a) => {
                        sync_class_flags(shared, &mut q);
                        drop(q);
                        return Enter::Granted(self.count_class_admission(
                            k,
                            r,
                            a.revision,
                            a.resources,
                        ));
                    }
                    // An unconfirmed refusal waits too: the step that caused it visits the
                    // queue when it lands or is taken back, and the flags are already up.
                    Err(f) if may_wait(&f) => {}
                    // Short of tokens under the option: the check below is made already
                    // (under this lock).
                    Err(f) if classed_waits_for_tokens(shared, &f, k, r, priority) => {
                        fit_checked = true;
                    }
                    Err(f) => {
                        sync_class_flags(shared, &mut q);
                        drop(q);
                        return Enter::Refused(self.class_refusal(k, &f, r, priority));
                    }
                }
            }
        }
        let refuse = crate::protocol::class_pump::tail_refusal(&q, k, r, priority, fit_checked);
        if let Some((reason, constraint)) = refuse {
            let pending = q.len() as u64;
            sync_class_flags(shared, &mut q);
            drop(q);
            let mut rej = self.class_answer_refusal(k, reason, constraint, r, priority);
            rej.set_pending(pending);
            return Enter::Refused(rej);
        }
        let node = node();
        // SAFETY: `node` is pinned by the caller and unlinks (or is answered) before it is
        // dropped; we hold the mutex.
        unsafe { q.push_back(&node) };
        sync_class_flags(shared, &mut q);
        Enter::Queued
    }
}
