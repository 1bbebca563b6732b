//! The class protocol's queue side: the class slot return, the queue flags on the class words
//! and the shared word, and the class pump (`crate::wait::waiting`, "With admission classes").

use crate::protocol::classed::Refused;
use crate::shared::{QueueGuard, Shared, SlotRef, SlowPathRef};
use crate::sync::Ordering;
use crate::vocab::rejection::{Constraint, RejectReason};
/// Delivers the wake-ups the calling thread kept inside operations (`crate::wait::list`,
/// "Where wake-ups run"): the layers above call it here, after a class decision or return of
/// capacity left its operation.
pub(crate) use crate::wait::list::deliver_deferred;
use crate::wait::list::{Outcome, Queue, WakeList};
use crate::words::state::{Word, WAITERS};

impl SlotRef {
    /// Returns a class slot of class `k` and `tokens` held tokens (class mode); if this was the
    /// last owner, drops the owners' lifetime reference (which frees the state unless a slow
    /// path still holds it). Nothing may touch the state after this. `borrowed`: whether the
    /// admission borrowed a slot or tokens (the release's hint, `crate::protocol::classed::release`).
    #[inline(always)]
    pub(crate) fn return_class_slot(self, k: usize, tokens: u64, borrowed: bool) {
        // SAFETY: we hold the class slot being returned (this `SlotRef` stands for it) and touch
        // the state afterwards only to count down when the release says so.
        if unsafe { crate::protocol::classed::release(&self, k, tokens, borrowed) }
            && crate::shared::count_down(&self.get().alive)
        {
            // SAFETY: this release emptied a detached class word, and `alive` reached zero:
            // every other class word is empty and the last handle is gone. We are the unique
            // thread that saw it (`crate::protocol::classed`, "Lifetime").
            unsafe { self.owners_gone() }
        }
        // The waiters its pump answered, woken only now: outside the release's operation and
        // after its last step, so a waker that blocks holds off no install and one that panics
        // leaves nothing undone (`crate::wait::list`, "Where wake-ups run").
        deliver_deferred();
    }
}

/// Raises or lowers `C_QUEUE` on every class word (`queue_flag`) and `WAITERS` on the shared
/// word (`waiters`). Caller holds the mutex (`q`); `C_QUEUE` goes up before `WAITERS`.
pub(crate) fn set_class_flags(shared: &Shared, q: &mut Queue, queue_flag: bool, waiters: bool) {
    use crate::words::class_word::C_QUEUE;
    if queue_flag && !q.class_flags {
        for cw in shared.class_words.iter() {
            cw.fetch_or(C_QUEUE, Ordering::SeqCst);
        }
        q.class_flags = true;
    }
    let up = Word(shared.word.load(Ordering::SeqCst)).waiters();
    if waiters && !up {
        shared.word.fetch_or(WAITERS, Ordering::SeqCst);
    } else if !waiters && up {
        shared.word.fetch_and(!WAITERS, Ordering::SeqCst);
    }
    if !queue_flag && q.class_flags {
        for cw in shared.class_words.iter() {
            cw.fetch_and(!C_QUEUE, Ordering::SeqCst);
        }
        q.class_flags = false;
    }
}

/// An enqueuer of class `k` holds the mutex (`q`) and is about to decide under it or join the
/// tail: raises `k`'s bit in `Shared::queued_classes` first, so that an in-floor newcomer of
/// class `k` whose class-word CAS comes later in the `SeqCst` order sees it and does not
/// bypass, and one whose CAS came earlier is seen by the enqueuer's decision
/// (`crate::protocol::classed`, "Bypass"). The unlock puts the exact mask back.
pub(crate) fn raise_queued_class(shared: &Shared, q: &mut Queue, k: usize) {
    let bit = 1u64 << k;
    if q.published_classes & bit == 0 {
        shared.queued_classes.fetch_or(bit, Ordering::SeqCst);
        crate::sync::loom_sc_fence();
        q.published_classes |= bit;
    }
}

/// The flags the queue needs now: both while waiters are queued, `C_QUEUE` alone while only
/// drainers wait, neither otherwise.
pub(crate) fn sync_class_flags(shared: &Shared, q: &mut Queue) {
    let waiters = q.len() > 0;
    set_class_flags(shared, q, waiters || q.has_drainers(), waiters);
}

/// Wakes the drainers if nobody is queued and the class words hold nothing.
pub(crate) fn wake_class_drainers_if_idle(shared: &Shared, q: &Queue, wake: &mut WakeList) {
    if q.has_drainers() && q.len() == 0 {
        let (_, g, t) = crate::protocol::classed::collect(shared);
        if g == 0 && t == 0 {
            for n in q.drainers() {
                wake.push(n);
            }
        }
    }
}

/// Class mode's hand-off: a decrease found the queue flagged. Decides head waiters under the
/// mutex until one has to keep waiting (module docs, "With admission classes"), then wakes
/// drainers if the bulkhead is idle. The caller keeps the shared state alive (a handle, or a
/// release's grace-period operation, which a class-mode free waits for).
///
/// Called inside the decrease's grace-period operation, so it wakes nobody: the wake-ups go to
/// the calling thread, which delivers them after the operation
/// (`crate::wait::list::deliver_deferred`; `crate::wait::list`, "Where wake-ups run").
#[cold]
#[inline(never)]
pub(crate) fn pump_classed(shared: &Shared) {
    pump_classed_into(shared, WakeList::in_operation());
}

/// [`pump_classed`] for a caller outside every operation (`apply_limits`, after its install):
/// wakes the waiters it answered itself, after the unlock.
#[cold]
#[inline(never)]
pub(crate) fn pump_classed_now(shared: &Shared) {
    pump_classed_into(shared, WakeList::new());
}

fn pump_classed_into(shared: &Shared, mut wake: WakeList) {
    // SAFETY: every caller is an owner for the whole call: a handle (`apply_limits`, a
    // decider's undo, an abandonment's pin) or a release's grace-period operation, which it
    // leaves only after this returns and which a class-mode free waits for (`crate::shared`).
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let q = pump_classed_locked(&guard, guard.lock_queue(), &mut wake);
    drop(q);
    wake.wake_all();
}

/// [`pump_classed`]'s work for a caller that already holds the queue lock `q` of `guard`'s
/// state (token waiting: a waiter that left), so the pump costs no second visit of the
/// mutex. It may unlock and lock again to deliver a full batch of wake-ups; returns the lock,
/// with the flags synchronised and the drainers' wake-ups in `wake` if nothing is held.
pub(crate) fn pump_classed_locked<'g>(
    guard: &'g SlowPathRef<'_>,
    mut q: QueueGuard<'g>,
    wake: &mut WakeList,
) -> QueueGuard<'g> {
    let shared = &**guard;
    while let Some((k, r, priority)) = q.front().map(|h| (h.k, h.r, h.priority)) {
        if wake.is_full() {
            // A batch: wake it outside the lock, then decide the head again.
            drop(q);
            wake.wake_batch();
            q = guard.lock_queue();
            continue;
        }
        match crate::protocol::classed::acquire_in_queue(shared, k, r, priority) {
            Ok(a) => wake.push(q.answer_front(Outcome::Granted {
                revision: a.revision,
                resources: a.resources,
            })),
            Err(f) => {
                // Token waiting: a head short only of tokens that fits once nothing else is
                // held stays too (`crate::protocol::token_wait`).
                let stays = f.reason != RejectReason::Shutdown
                    && (may_wait(&f)
                        || f.summary.g >= f.lim.max_concurrent
                        || crate::protocol::token_wait::classed_waits_for_tokens(
                            shared, &f, k, r, priority,
                        ));
                if stays {
                    break;
                }
                wake.push(q.answer_front(Outcome::RefusedAs(f.reason, f.constraint)));
            }
        }
    }
    sync_class_flags(shared, &mut q);
    wake_class_drainers_if_idle(shared, &q, wake);
    q
}

/// Whether a class refusal lets the demand wait: no free global slot, or a refusal no collect
/// confirmed (another decider's step was in flight; it visits the queue when it lands or is
/// taken back).
pub(crate) fn may_wait(f: &Refused) -> bool {
    waits_for_slot(f) || f.stored_shared.is_some()
}

/// Whether a class refusal means "no free global slot" (row 6), the one refusal that waits.
pub(crate) fn waits_for_slot(f: &Refused) -> bool {
    f.reason == RejectReason::ConcurrencyLimit
        && f.constraint == Some(crate::vocab::rejection::Constraint::Global)
}

/// The class enqueue's decision for a newcomer joining the tail, under the queue mutex held by
/// `q` (after the would-be head's own decision, if it was the head): the refusal it gets, with
/// its constraint, or `None` to queue. The order is: closed, a demand that can never fit
/// (token waiting only, and only if `fit_checked` is false: the head's decision already made
/// that check under this lock), no queue possible under the limits read here, the queue full.
///
/// Token waiting: the fast decision's "never fits" check ran before the lock, and a
/// reconfiguration may have landed since; its sweep (`crate::protocol::token_wait::sweep_never_fit`)
/// takes this mutex after installing, so either it sees this waiter queued or this read sees
/// its limits.
pub(crate) fn tail_refusal(
    q: &QueueGuard<'_>,
    k: usize,
    r: u64,
    priority: crate::vocab::demand::Priority,
    fit_checked: bool,
) -> Option<(RejectReason, Option<Constraint>)> {
    let shared = q.shared();
    let w = Word(shared.word.load(Ordering::SeqCst));
    let lim = shared.ring.read(w.tag());
    let never_fits = if shared.wait_for_tokens && !fit_checked {
        crate::protocol::token_wait::classed_never_fits(shared, w.tag(), k, r, priority)
    } else {
        None
    };
    if w.closed() {
        Some((RejectReason::Shutdown, None))
    } else if let Some(c) = never_fits {
        Some((RejectReason::BudgetLimit, Some(c)))
    } else if lim.max_concurrent == 0 || lim.max_queue == 0 {
        Some((RejectReason::ConcurrencyLimit, Some(Constraint::Global)))
    } else if q.len() as u64 >= lim.max_queue {
        Some((RejectReason::QueueLimit, Some(Constraint::Global)))
    } else {
        None
    }
}
