//! The no-class protocol's queue side: a release's slot return, the hand-off of a returned
//! slot to the head waiter, the pump, a draining release and close (`crate::wait::waiting`,
//! "Protocol", explains the waiters flag and the FIFO order; the waits that enqueue are there).

use crate::protocol::class_pump::sync_class_flags;
use crate::shared::{QueueGuard, Shared, SlotRef, SlowPathRef};
use crate::sync::Ordering;
use crate::vocab::rejection::RejectReason;
use crate::wait::list::{Outcome, Queue, WakeList};
use crate::words::state::{Word, ONE_SLOT, WAITERS};

impl SlotRef {
    /// Returns the slot and `tokens` held tokens (no classes) with one CAS, or hands the slot
    /// to the queue while waiters are queued; if this was the last owner, drops the owners'
    /// lifetime reference. Nothing may touch the state after this.
    #[inline(always)]
    pub(crate) fn return_slot(self, tokens: u64) {
        // A CAS, not a `fetch_sub`: while waiters are queued the slot must not go back to the
        // word but to the head waiter (`crate::protocol::handoff::hand_off`), and the word this CAS
        // replaces is what says whether they are. One try inline; the rest out of line.
        let word = &self.get().word;
        let prev = Word(word.load(Ordering::Relaxed));
        // This admission's slot and hold are in the word: no field can borrow.
        debug_assert!(
            prev.slots() >= 1 && prev.tokens() >= tokens,
            "slot or token underflow"
        );
        if !prev.waiters()
            && word
                .compare_exchange(
                    prev.0,
                    prev.0 - ONE_SLOT - tokens,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            if prev.detached() && prev.slots() == 1 {
                // SAFETY: our CAS returned the last slot of a detached state.
                unsafe { self.free_last() }
            }
            return;
        }
        self.return_slot_contended(tokens);
    }

    /// [`SlotRef::return_slot`] after its first try failed: retries, or hands the slot to the
    /// queue.
    #[cold]
    #[inline(never)]
    fn return_slot_contended(self, tokens: u64) {
        let word = &self.get().word;
        let mut prev = Word(word.load(Ordering::Relaxed));
        loop {
            if prev.waiters() {
                // Read while the slot is still ours. Nobody queued: the flag is up for
                // drainers only, and the slot goes back to the word without the mutex
                // (`crate::protocol::handoff::release_while_draining`).
                if self.get().queued.load(Ordering::SeqCst) == 0 {
                    return crate::protocol::handoff::release_while_draining(
                        self.into_slow_path(),
                        tokens,
                    );
                }
                return crate::protocol::handoff::hand_off(self, tokens);
            }
            match word.compare_exchange_weak(
                prev.0,
                prev.0 - ONE_SLOT - tokens,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => prev = Word(actual),
            }
        }
        if prev.detached() && prev.slots() == 1 {
            // SAFETY: no handle is left (DETACHED is set only once the handle count reached
            // zero, and it never climbs back) and ours was the last slot. We are the unique
            // freer (module docs).
            unsafe { self.free_last() }
        }
    }
}

/// Clears `WAITERS` unless waiters or drainers still need it (caller holds the mutex, `q`
/// proves it).
pub(crate) fn clear_waiters(shared: &Shared, q: &Queue) {
    if !q.flag_needed() {
        shared.word.fetch_and(!WAITERS, Ordering::AcqRel);
    }
}

/// Wakes the drainers if the state `w` (no-class word) is idle and nobody is queued.
pub(crate) fn wake_drainers_if_idle(w: Word, q: &Queue, wake: &mut WakeList) {
    if q.has_drainers() && q.len() == 0 && w.slots() == 0 && w.tokens() == 0 {
        for n in q.drainers() {
            wake.push(n);
        }
    }
}

/// A release that found `WAITERS` set: hand the slot (with `held` tokens to give back) to the
/// head waiter whose checks pass, or return it if none does or the limit shrank below the
/// slots in use. The slot keeps the shared state alive until the final step.
#[cold]
#[inline(never)]
pub(crate) fn hand_off(slot: SlotRef, held: u64) {
    // Counted while the slot is still ours: the grant below gives the slot away, and the
    // granted waiter may then free everything the words count before we unlock.
    let guard = slot.into_slow_path();
    let shared = &*guard;
    let mut wake = WakeList::new();
    let mut q = guard.lock_queue();
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::Acquire));
    let last = loop {
        let lim = shared.ring.read(w.tag());
        let head = q.front().map(|h| (h.r, h.priority));
        match head {
            Some((r, priority)) if !w.closed() && w.slots() <= lim.max_concurrent => {
                let t = w.tokens() - held;
                let short = lim
                    .effective(priority)
                    .is_some_and(|e| t.saturating_add(r) > e);
                if short
                    && shared.wait_for_tokens
                    && crate::protocol::token_wait::fits_when_idle(&lim, r, priority)
                {
                    // Token waiting: the head keeps waiting for tokens; the slot and the
                    // tokens go back to the word below, with `WAITERS` still up, so no
                    // newcomer can take them before the head (`crate::protocol::token_wait`).
                    match return_to_word(word, &q, w, held, &mut wake) {
                        Ok(()) => break Some(w),
                        Err(actual) => {
                            w = actual;
                            continue;
                        }
                    }
                }
                if short {
                    // The head no longer fits: answered, not re-queued; next waiter.
                    // (With the queue now empty, the next turn returns the slot and clears
                    // the flag in one CAS.)
                    wake.push(q.answer_front(Outcome::Refused(RejectReason::BudgetLimit)));
                    if wake.is_full() {
                        // A batch: wake it outside the lock (the slot is still ours), then
                        // look again.
                        drop(q);
                        wake.wake_batch();
                        q = guard.lock_queue();
                        w = Word(word.load(Ordering::Acquire));
                    }
                    continue;
                }
                // The slot passes on: its tokens become the waiter's reservation.
                match grant_head(word, &mut q, w, w.0 - held + r, lim.revision, &mut wake) {
                    Ok(_) => break None,
                    Err(actual) => w = actual,
                }
            }
            _ => {
                // Nobody to hand to (or shrunk, or closed): return the slot; clear the flag if
                // the queue is empty.
                match return_to_word(word, &q, w, held, &mut wake) {
                    Ok(()) => break Some(w),
                    Err(actual) => w = actual,
                }
            }
        }
    };
    // The slot is gone (to a waiter, or back to the word): from here only `guard` keeps the
    // state alive, while we still hold its queue.
    crate::sync::pause(crate::sync::PausePoint::HandOffGiven);
    if let Some(prev) = last {
        if prev.detached() && prev.slots() == 1 {
            // SAFETY: our CAS returned the last slot of a detached state (no handle, hence no
            // waiter, is left): we are the unique thread that saw the last owner leave. The
            // guard frees the state when it goes, after the unlock.
            unsafe { guard.owners_gone() }
        }
    }
    // Token waiting: slots may be free while waiters wait, so after a grant the next head may
    // fit too (`crate::protocol::token_wait`): pumped under the same lock. `guard` keeps the
    // state alive, as in `release_while_draining`.
    if shared.wait_for_tokens && last.is_none() && q.len() > 0 {
        q = pump_locked(&guard, q, &mut wake);
    }
    drop(q);
    wake.wake_all();
    // `guard` goes last: the free, if this was the last reference.
}

/// A hand-off's return of its slot and `held` tokens to the word with the CAS from `w`,
/// clearing `WAITERS` if nobody needs it; wakes the drainers if that left the bulkhead idle.
/// `Err`: the word moved.
fn return_to_word(
    word: &crate::sync::AtomicU64,
    q: &Queue,
    w: Word,
    held: u64,
    wake: &mut WakeList,
) -> Result<(), Word> {
    let mut next = w.0 - ONE_SLOT - held;
    if !q.flag_needed() {
        next &= !WAITERS;
    }
    match word.compare_exchange(w.0, next, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            wake_drainers_if_idle(Word(next), q, wake);
            Ok(())
        }
        Err(actual) => Err(Word(actual)),
    }
}

/// Grants the head waiter with the CAS `w → next` under the limits of `revision`, clearing
/// `WAITERS` if it was the last waiter and no drainer needs the flag. `Err`: the word moved.
#[inline(always)]
pub(crate) fn grant_head(
    word: &crate::sync::AtomicU64,
    q: &mut Queue,
    w: Word,
    mut next: u64,
    revision: u64,
    wake: &mut WakeList,
) -> Result<u64, Word> {
    if q.len() == 1 && !q.has_drainers() {
        next &= !WAITERS;
    }
    match word.compare_exchange(w.0, next, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            wake.push(q.answer_front(Outcome::Granted {
                revision,
                resources: Default::default(),
            }));
            Ok(next)
        }
        Err(actual) => Err(Word(actual)),
    }
}

/// Pumps: free slots for head waiters while `slots < max_concurrent`, then wakes the drainers
/// if the bulkhead is idle. Called after `apply_limits` raised the limit (the caller holds a
/// handle), by a drain-time release that returned its slot to the word
/// ([`release_while_draining`], which holds a counted guard), and with token waiting by a usage
/// refund (its admission holds a slot), a waiter that left (it holds a handle) and a hand-off
/// that granted (its counted guard).
pub(crate) fn pump(shared: &Shared) {
    let mut wake = WakeList::new();
    // SAFETY: every caller is an owner for the whole call (a handle, a counted guard, or the
    // slot of the admission that refunds).
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let q = pump_locked(&guard, guard.lock_queue(), &mut wake);
    drop(q);
    wake.wake_all();
}

/// [`pump`]'s work for a caller that already holds the queue lock `q` of `guard`'s state
/// (token waiting: a hand-off that granted, a waiter that left), so the pump costs no second
/// visit of the mutex. It may unlock and lock again to deliver a full batch of wake-ups;
/// returns the lock, with the waiters flag cleared if nobody needs it and the drainers'
/// wake-ups in `wake` if the bulkhead is idle.
pub(crate) fn pump_locked<'g>(
    guard: &'g SlowPathRef<'_>,
    mut q: QueueGuard<'g>,
    wake: &mut WakeList,
) -> QueueGuard<'g> {
    let shared = &**guard;
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::Acquire));
    while let Some((r, priority)) = q.front().map(|h| (h.r, h.priority)) {
        if wake.is_full() {
            // A batch: wake it outside the lock, then look again.
            drop(q);
            wake.wake_batch();
            q = guard.lock_queue();
            w = Word(word.load(Ordering::Acquire));
            continue;
        }
        let lim = shared.ring.read(w.tag());
        if w.closed() || w.slots() >= lim.max_concurrent {
            break;
        }
        if lim
            .effective(priority)
            .is_some_and(|e| w.tokens().saturating_add(r) > e)
        {
            if shared.wait_for_tokens
                && crate::protocol::token_wait::fits_when_idle(&lim, r, priority)
            {
                // Token waiting: the head keeps waiting; nobody behind it is considered.
                break;
            }
            wake.push(q.answer_front(Outcome::Refused(RejectReason::BudgetLimit)));
            continue;
        }
        match grant_head(word, &mut q, w, w.plus(r).0, lim.revision, wake) {
            Ok(next) => w = Word(next),
            Err(actual) => w = actual,
        }
    }
    clear_waiters(shared, &q);
    wake_drainers_if_idle(Word(word.load(Ordering::Acquire)), &q, wake);
    q
}

/// `close()`'s part: answers every waiter with `shutdown` and clears `WAITERS`.
pub(crate) fn close_queue(shared: &Shared) {
    let mut wake = WakeList::new();
    // SAFETY: the caller (`close`) holds a handle for the whole call.
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let shared = &*guard;
    let mut q = guard.lock_queue();
    while q.front().is_some() {
        if wake.is_full() {
            // A batch: wake it outside the lock (no newcomer queues: the word is closed).
            drop(q);
            wake.wake_batch();
            q = guard.lock_queue();
            continue;
        }
        wake.push(q.answer_front(Outcome::Refused(RejectReason::Shutdown)));
    }
    if shared.classed {
        sync_class_flags(shared, &mut q);
    } else {
        clear_waiters(shared, &q);
    }
    drop(q);
    wake.wake_all();
}

/// A release that found `WAITERS` set while the queue-length mirror said nobody is queued (the
/// flag is up for drainers): returns the slot to the word with a CAS, without the mutex, then
/// looks at the mirror again. Only if a waiter queued meanwhile, or this release left the
/// bulkhead idle (the drainers must be woken), does it lock the queue: it pumps (grants the
/// free slot to the head, wakes idle drainers). `guard` keeps the state alive throughout.
#[cold]
#[inline(never)]
pub(crate) fn release_while_draining(guard: SlowPathRef<'static>, held: u64) {
    let word = &*guard.word;
    let mut wake = WakeList::new();
    let mut prev = Word(word.load(Ordering::SeqCst));
    loop {
        let next = prev.0 - ONE_SLOT - held;
        match word.compare_exchange(prev.0, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => {
                crate::sync::loom_sc_fence();
                let queued = guard.queued.load(Ordering::SeqCst);
                let idle = Word(next).slots() == 0 && Word(next).tokens() == 0;
                if prev.waiters() && (queued != 0 || idle) {
                    drop(pump_locked(&guard, guard.lock_queue(), &mut wake));
                }
                break;
            }
            Err(actual) => prev = Word(actual),
        }
    }
    if prev.detached() && prev.slots() == 1 {
        // SAFETY: our CAS returned the last slot of a detached state: we are the unique thread
        // that saw the last owner leave. `guard` frees the state when it goes.
        unsafe { guard.owners_gone() }
    }
    // Woken last: a waker that panics finds the release complete.
    wake.wake_all();
}

/// Waiters ever queued (for statistics).
pub(crate) fn queued_total(shared: &Shared) -> u64 {
    shared.queued_total()
}

/// Live waiters (for statistics and refusal details), read under the queue mutex: exact.
/// (The queue-length mirror is not: an enqueuer counts itself in it before its queueing CAS,
/// which may fail and leave it taking the freed slot instead.)
pub(crate) fn pending(shared: &Shared) -> usize {
    shared.queue_len()
}
