//! Waiting for tokens: the opt-in under which a demand refused only for tokens waits in the
//! FIFO queue ([`BulkheadBuilder::wait_for_tokens`](crate::BulkheadBuilder::wait_for_tokens)).
//!
//! Fail-fast stays the default: without the option a demand that does not fit the token budget
//! (or its class's token ceiling, or the other classes' token floors, or the high-priority
//! reserve) is refused at once, even by `acquire_blocking` and `acquire`. With it, such a demand
//! joins the same bounded FIFO queue that slot waiters use, with the same timeout, cancellation,
//! `close` and `drain` semantics, and is admitted once its tokens (and a slot) fit.
//!
//! # Strict FIFO: the head blocks newcomers
//!
//! As with tokio's `Semaphore::acquire_many`, a large demand at the head is never overtaken:
//! while anyone waits, the state word carries `WAITERS` (with classes also `C_QUEUE` on every
//! class word), and every newcomer's fast path refuses (`try_acquire`) or joins the tail
//! (`acquire_blocking`, `acquire`), even when its own smaller demand would fit. Only the head
//! is ever decided; the waiters behind it wait for it to be admitted or to leave.
//!
//! One exception, with classes: a newcomer inside its class's floors, of a class with no
//! waiter queued, is admitted ahead of the queue while `U ≤ max_concurrent` and `V ≤ B − H`
//! (`crate::protocol::classed`, "Bypass"). It takes nothing any queued waiter's decision
//! depends on, so a batch demand waiting for tokens no longer holds back an interactive
//! request that fits its floors, and the head is still never starved.
//!
//! # The hand-off of tokens
//!
//! Nothing here adds a new atomic protocol; it reuses the slot hand-off's (`crate::protocol::handoff`,
//! `crate::protocol::class_pump`; the enqueue side is in `crate::wait::waiting`):
//!
//! * a **release** that sees `WAITERS` hands its slot to the head under the queue mutex
//!   (`hand_off`), deciding the head with the leaver's tokens already counted as free, in the
//!   same CAS that moves them. A head whose tokens still do not fit keeps waiting; the slot and
//!   the tokens go back to the word with `WAITERS` still up, so no newcomer can take them. A
//!   head that was granted may leave tokens (and slots) the next head fits: the hand-off then
//!   pumps under the same lock (`pump_locked`), one visit of the mutex per release;
//! * a **usage refund** (a `report_usage` that shrinks a hold) is one RMW on the word; if the
//!   word it replaced carried `WAITERS`, it pumps the queue (no classes: [`after_refund`];
//!   with classes, every decrease already visits a flagged queue);
//! * a **reconfiguration** (`apply_limits`, `set_budget`) first answers every queued waiter
//!   whose demand can no longer fit at all ([`sweep_never_fit`]) with the typed `budget_limit`
//!   refusal, then pumps as it does for slots;
//! * a waiter that **leaves** (timeout, cancellation, a dropped future) pumps under the lock it
//!   unlinked itself with (`pump_locked`, `pump_classed_locked`): the waiter behind it may fit
//!   where it did not.
//!
//! Mutex visits (`tests/token_wait.rs` counts them): one per enqueue, one per release or
//! refund that finds waiters, one per waiter that leaves; none on the fast paths.
//!
//! No lost wake-up: an enqueuer raises `WAITERS` with a CAS that validates the exact word it
//! decided on (tokens included) under the queue mutex. A release or refund ordered before that
//! CAS in the word's modification order makes it fail (the enqueuer decides again and sees the
//! freed tokens); one ordered after it reads the flag and pumps once the enqueuer has unlocked.
//!
//! # Never-fitting demands are refused at once
//!
//! A demand that could not fit even with nothing else held (more than the effective budget for
//! its priority, more than its class's token ceiling, or more than the budget left after the
//! other classes' token floors) is refused with `budget_limit` at once, never queued
//! ([`fits_when_idle`], [`classed_idle_refusal`]). The check that decides is made under the
//! queue mutex, with the limits read there (no classes: in `enter`'s locked loop; with
//! classes: before a newcomer joins the tail, `enter_classed`), so a reconfiguration that
//! lands between a newcomer's fast decision and its lock cannot leave a never-fitting demand
//! queued: its sweep ([`sweep_never_fit`]) takes the same mutex after installing, so either
//! the sweep finds the newcomer queued or the newcomer reads the new limits.
//!
//! # Why per bulkhead
//!
//! The option is a builder setting (and the config field `wait_for_tokens`), not a per-call
//! one: the head-blocks-newcomers rule is a property of the whole queue (one waiting caller
//! holds back every newcomer, fail-fast callers included), so it belongs to whoever configures
//! the bulkhead; and the release and refund paths test one flag fixed at construction, so a
//! bulkhead without the option pays nothing for it. The per-call choice between waiting and
//! failing fast already exists: `try_acquire` never waits.

use crate::protocol::class_pump::sync_class_flags;
use crate::protocol::classed::Refused;
use crate::protocol::handoff::{clear_waiters, pump};
use crate::shared::{Shared, SlowPathRef};
use crate::sync::Ordering;
use crate::vocab::class::MAX_CLASSES;
use crate::vocab::demand::Priority;
use crate::vocab::rejection::{Constraint, RejectReason};
use crate::wait::list::{Outcome, WakeList};
use crate::words::classes::{ShareSums, Summary};
use crate::words::limits::{Hot, HotClass};
use crate::words::state::Word;

/// No classes: whether `r` tokens at `priority` fit the limits `lim` once nothing else is held.
#[inline]
pub(crate) fn fits_when_idle(lim: &Hot, r: u64, priority: Priority) -> bool {
    lim.effective(priority).is_none_or(|e| r <= e)
}

/// With classes: the token refusal (`budget_limit` and its constraint) a demand of `r` tokens
/// in class `k` would get with nothing held, or `None` if its tokens fit then. `limits` are the
/// class limits of one snapshot, `max_concurrent` and `eff` its global limit and the demand's
/// effective budget. The same formulas as every class decision (`Summary::decide`), on an idle
/// state; shared with the model (`src/model/token_wait.rs`).
pub(crate) fn classed_idle_refusal(
    limits: &[HotClass],
    k: usize,
    r: u64,
    max_concurrent: u64,
    eff: Option<u64>,
) -> Option<Constraint> {
    let mut sums = ShareSums::default();
    for l in limits {
        sums.add((0, 0), l);
    }
    let idle = Summary {
        g: 0,
        t: 0,
        sums,
        own: (0, 0),
        limits: limits[k],
        max_concurrent,
        eff,
    };
    match idle.decide(r) {
        Some((RejectReason::BudgetLimit, c)) => Some(c),
        _ => None,
    }
}

/// [`classed_idle_refusal`] under the limits of the ring slot for `tag`.
pub(crate) fn classed_never_fits(
    shared: &Shared,
    tag: usize,
    k: usize,
    r: u64,
    priority: Priority,
) -> Option<Constraint> {
    let n = shared.class_words.len().min(MAX_CLASSES);
    let mut limits = [HotClass {
        pc: 0,
        mc: None,
        pt: 0,
        mt: None,
    }; MAX_CLASSES];
    for (j, l) in limits.iter_mut().enumerate().take(n) {
        *l = shared.ring.read_class(tag, j);
    }
    let lim = shared.ring.read(tag);
    classed_idle_refusal(
        &limits[..n],
        k,
        r,
        lim.max_concurrent,
        lim.effective(priority),
    )
}

/// With classes: whether the option lets a demand refused with `f` wait, i.e. it was refused
/// for tokens (`budget_limit`, any constraint) and its tokens fit once nothing else is held.
pub(crate) fn classed_waits_for_tokens(
    shared: &Shared,
    f: &Refused,
    k: usize,
    r: u64,
    priority: Priority,
) -> bool {
    if !shared.wait_for_tokens || f.reason != RejectReason::BudgetLimit {
        return false;
    }
    let tag = Word(shared.word.load(Ordering::Acquire)).tag();
    classed_never_fits(shared, tag, k, r, priority).is_none()
}

/// No classes: a usage refund's `fetch_sub` replaced `prev`. With waiters flagged (and the
/// option on, the only case in which a waiter can be waiting for tokens) the queue is pumped,
/// so the refunded tokens go to the head before any newcomer can see them (newcomers are held
/// back by `WAITERS`). The caller holds its admission's slot for the whole call.
#[inline]
pub(crate) fn after_refund(shared: &Shared, prev: Word) {
    if shared.wait_for_tokens && prev.waiters() && !broken_for_loom() {
        pump(shared);
    }
}

/// Under loom, `LLM_BULKHEAD_LOOM_NO_TOKEN_PUMP=1` skips the refund's pump (no classes,
/// [`after_refund`]) and a class token return's visit of the queue
/// (`crate::protocol::classed::return_tokens`): the deliberately broken variant the
/// token-waiting models (`loom-tests/tests/token_wait.rs`) are shown to fail on (a waiter short
/// of tokens is never woken by a refund: loom reports the deadlock).
#[inline]
pub(crate) fn broken_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_NO_TOKEN_PUMP")
}

/// A reconfiguration was installed: answers, in FIFO order, every queued waiter whose demand
/// can no longer fit at all with `budget_limit` (the option only; without it a waiter is
/// answered when it reaches the head). The caller (`apply_limits`) holds a handle.
pub(crate) fn sweep_never_fit(shared: &Shared) {
    if !shared.wait_for_tokens {
        return;
    }
    // SAFETY: the caller holds a handle for the whole call.
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let shared = &*guard;
    let mut wake = WakeList::new();
    loop {
        let mut q = guard.lock_queue();
        let tag = Word(shared.word.load(Ordering::Acquire)).tag();
        let lim = shared.ring.read(tag);
        let classed = shared.classed;
        let more = q.answer_matching(&mut wake, |w| {
            if classed {
                classed_never_fits(shared, tag, w.k, w.r, w.priority)
                    .map(|c| Outcome::RefusedAs(RejectReason::BudgetLimit, Some(c)))
            } else {
                (!fits_when_idle(&lim, w.r, w.priority))
                    .then_some(Outcome::Refused(RejectReason::BudgetLimit))
            }
        });
        if classed {
            sync_class_flags(shared, &mut q);
        } else {
            clear_waiters(shared, &q);
        }
        drop(q);
        wake.wake_batch();
        if !more {
            break;
        }
    }
    wake.wake_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(pc: u64, pt: u64, mt: Option<u64>) -> HotClass {
        HotClass {
            pc,
            mc: None,
            pt,
            mt,
        }
    }

    #[test]
    fn idle_refusals_name_the_rule_that_can_never_pass() {
        let t = [class(0, 0, Some(500)), class(0, 400, None)];
        // Within everything.
        assert_eq!(classed_idle_refusal(&t, 0, 500, 4, Some(1_000)), None);
        // Above the class's token ceiling.
        assert_eq!(
            classed_idle_refusal(&t, 0, 501, 4, Some(1_000)),
            Some(Constraint::AdmissionClass)
        );
        // Above the budget left after the other class's token floor (1000 - 400).
        let u = [class(0, 0, None), class(0, 400, None)];
        assert_eq!(classed_idle_refusal(&u, 0, 600, 4, Some(1_000)), None);
        assert_eq!(
            classed_idle_refusal(&u, 0, 601, 4, Some(1_000)),
            Some(Constraint::AdmissionClassProtection)
        );
        // Class 1 may use its own floor and the unreserved rest.
        assert_eq!(classed_idle_refusal(&u, 1, 1_000, 4, Some(1_000)), None);
        // Above the effective budget.
        assert_eq!(
            classed_idle_refusal(&u, 1, 1_001, 4, Some(1_000)),
            Some(Constraint::Global)
        );
    }
}
