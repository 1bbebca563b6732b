//! The protocol of a bulkhead **without admission classes**: one packed 64-bit word, whose
//! layout (tokens held `T`, slots in use `G`, the limits tag and the `DETACHED`, `WAITERS` and
//! `CLOSED` flags), memory ordering and per-operation progress are written down in
//! `src/words/state.rs` (`crate::words::state`). A bulkhead with classes never runs any of this
//! (`crate::protocol::classed`); the choice is made once, at construction.
//!
//! # The steps
//!
//! * **Enter** ([`try_admit`] for `try_acquire`, [`try_decide`] for the waiting paths): enter
//!   the grace period's decision marker (`crate::grace`), load the word, read the limits of
//!   its tag from the ring (`crate::words::limits`), check rows 0, 1 and 6 of CONTRACT.md §2
//!   ([`decide`]: closed, then `T + r > eff(priority)`, then no free slot or waiters queued,
//!   the no-barging rule), and take one slot and `r` tokens with one `AcqRel` CAS that expects
//!   the word it decided on (so a close, a tag bump or any other change in between makes it
//!   decide again). Counted in the thread's statistics entry the marker lives in ([`count`]).
//! * **Refusal**: after the decision's read of the slot, re-read the word; if the tag moved,
//!   the limits it read may be torn and the decision is made again. Otherwise count the refusal
//!   and keep the raw numbers that explain it ([`packed_rejection`], [`rejection`]; the
//!   explanation is built only when asked: [`Rejection::detail`]). `try_acquire`'s refusal
//!   ([`refuse`]) does this inline, inside the decision's operation, unless decisions are
//!   timed (`try_acquire` then calls the reject hook after it, if anyone subscribed); with
//!   timing ([`try_admit_observed`]) and on the waiting paths ([`refusal`]) it is done after
//!   the operation. Either way the reject hook never runs inside one. A waiter's
//!   refusal ([`waiter_refusal`]) is explained by the word as it is when the waiter is answered.
//! * **Returns**: a release returns its slot and hold with one CAS of the word, or hands the
//!   slot to the head waiter while waiters are queued (`SlotRef::return_slot`,
//!   `crate::protocol::handoff`, which also holds the pump and `close`'s queue side); a usage
//!   report that shrinks a hold is one `fetch_sub` ([`return_tokens`]), one that grows it a CAS
//!   loop bounded only by the field ([`grow_tokens`]).
//! * **Drain-time admission** ([`admit_if_nobody_waits`]): `WAITERS` up with a slot free
//!   ([`Decision::Waiters`]) means the flag may be up only for drainers; the decision reads the
//!   queue-length mirror (written by the wait layer under the queue mutex) and admits with a
//!   CAS, without a lock, inside the decision's operation ([`waiters_up`]).
//! * **Queueing** ([`decide_queued`]): the decision under the queue mutex, for a demand the
//!   fast decision could not admit with a queue possible: take a slot freed meanwhile, refuse,
//!   or raise `WAITERS` (the length mirror first) for a newcomer. The wait layer
//!   (`crate::wait::waiting`) holds the mutex and links the node; it decides nothing itself.
//!
//! Every function here takes the shared block of a bulkhead its caller keeps alive (a handle,
//! or an admission's slot) for the whole call.

use crate::protocol::{ClassCode, Granted};
use crate::record::stats::Counters;
use crate::shared::Shared;
use crate::sync::Ordering;
use crate::vocab::demand::Priority;
use crate::vocab::rejection::{Counts, RejectReason, Rejection};
use crate::words::limits::{Hot, Packed};
use crate::words::state::{Word, MAX_TOKENS};

/// What a decision does with the word it read.
enum Decision {
    /// Replace the word with this one.
    Admit(Word),
    Refuse(RejectReason),
    /// A slot is free but `WAITERS` is up: refused for `concurrency_limit` (the no-barging
    /// rule), unless the flag is up only for drainers ([`admit_if_nobody_waits`]).
    Waiters,
}

/// Rows 0, 1 and 6 of CONTRACT.md §2 on word `w` under limits `lim`, for `r` tokens at
/// `priority`; first failure wins.
#[inline]
fn decide(w: Word, lim: &Hot, r: u64, priority: Priority) -> Decision {
    if w.closed() {
        return Decision::Refuse(RejectReason::Shutdown);
    }
    if let Some(eff) = lim.effective(priority) {
        if w.tokens().saturating_add(r) > eff {
            return Decision::Refuse(RejectReason::BudgetLimit);
        }
    }
    // Row 6 (and, for fail-fast callers, the no-barging rule while waiters are queued).
    if w.slots() >= lim.max_concurrent {
        return Decision::Refuse(RejectReason::ConcurrencyLimit);
    }
    if w.waiters() {
        return Decision::Waiters;
    }
    Decision::Admit(w.plus(r))
}

/// What a refused decision hands back: the word and the limits that refused (the ring slot's
/// words as read, [`Packed`]: three words, not the six of the decoded [`Hot`], so that the
/// refusal reaches [`refuse_later`] in registers), the reason, and the thread's counters entry the
/// decision looked up (the refusal is counted there, without a second lookup).
pub(crate) struct Refusal<'a> {
    pub(crate) w: Word,
    packed: Packed,
    pub(crate) reason: RejectReason,
    c: &'a Counters,
}

impl Refusal<'_> {
    /// The limits that refused.
    #[inline(always)]
    pub(crate) fn lim(&self) -> Hot {
        self.packed.hot()
    }
}

/// The fast decision: rows 0, 1 and 6 in one CAS (module docs, "Enter"). `Err` carries the
/// word and the limits that refused, for [`refusal`] (which re-checks the tag). The waiting
/// paths' decision; `try_acquire`'s is [`try_admit`].
#[inline(always)]
pub(crate) fn try_decide(
    shared: &Shared,
    r: u64,
    priority: Priority,
) -> Result<Granted, Refusal<'_>> {
    decide_loop(shared, r, priority, |c, w, packed, reason, _| {
        Some(Err(Refusal {
            w,
            packed,
            reason,
            c,
        }))
    })
}

/// The fast decision of `Bulkhead::try_acquire` when its read of the interests found nobody
/// timing decisions: [`try_decide`]'s, with a refusal counted and explained before the
/// decision leaves its grace-period operation ([`refuse`], inlined; with a slot free but
/// `WAITERS` up, [`waiters_up`], out of line). With subscribers who do not time decisions,
/// `try_acquire` calls it too and publishes the refusal after it returns; with decision timing
/// it calls [`try_admit_observed`] instead.
#[inline(always)]
pub(crate) fn try_admit(shared: &Shared, r: u64, priority: Priority) -> Result<Granted, NoAdmit> {
    let out = decide_loop(shared, r, priority, |c, w, p, reason, waiters| {
        if waiters {
            return match waiters_up(shared, c, w, r, priority) {
                Answer::Refused(f) => Some(Err(Some(f))),
                Answer::Granted(g) => Some(Ok(g)),
                Answer::Again => None,
                Answer::Observed => Some(Err(None)),
            };
        }
        let refused = match priority {
            Priority::Normal => refuse::<false>(shared, c, w, p, reason),
            Priority::High => refuse::<true>(shared, c, w, p, reason),
        };
        refused.map(|f| Err(Some(f)))
    });
    match out {
        Ok(g) => Ok(g),
        Err(Some(f)) => Err(NoAdmit::Refused(f)),
        Err(None) => try_admit_observed(shared, r, priority).map_err(NoAdmit::Rejected),
    }
}

/// Why [`try_admit`] did not admit.
pub(crate) enum NoAdmit {
    /// Refused and counted: the caller builds the [`Rejection`] ([`Refused::rejection`]).
    Refused(Refused),
    /// Refused, counted, explained (and observed): [`try_admit_observed`]'s answer.
    Rejected(Rejection),
}

/// A counted no-class refusal as scalars: the word and the ring slot's words that explain it
/// (the budget word already with the demand's effective budget), the reason. A few words that
/// stay in registers until the caller builds the [`Rejection`] in its own place, once: a
/// `Rejection` built by the decision and moved out through its callers was copied from
/// temporary to temporary with wide loads over the narrow stores just made (store forwarding
/// stalls).
#[derive(Clone, Copy)]
pub(crate) struct Refused {
    w: Word,
    p: Packed,
    reason: RejectReason,
}

impl Refused {
    /// The refusal of a demand of `r` tokens.
    #[inline(always)]
    pub(crate) fn rejection(self, r: u64) -> Rejection {
        packed_rejection(self.w, self.p, self.reason, r, Priority::Normal)
    }
}

/// [`try_admit`] with decision timing: the same decision, with a refusal counted and
/// explained after the operation ([`refusal`]: the tag re-check, then the reject hook, so that
/// a subscriber never runs while the marker holds off a reconfiguration). With `WAITERS` up, a
/// `concurrency_limit` with a slot free may be the flag up only for drainers: admitted if
/// nobody is queued ([`admit_if_nobody_waits`], inside the operation, as in [`waiters_up`]).
#[cold]
#[inline(never)]
pub(crate) fn try_admit_observed(
    shared: &Shared,
    r: u64,
    priority: Priority,
) -> Result<Granted, Rejection> {
    loop {
        let f = decide_loop(shared, r, priority, |c, w, packed, reason, waiters| {
            if waiters {
                if let Some(g) = admit_if_nobody_waits(shared, r, priority) {
                    return Some(Ok(g));
                }
            }
            Some(Err(Refusal {
                w,
                packed,
                reason,
                c,
            }))
        });
        match f {
            Ok(g) => return Ok(g),
            Err(f) => {
                if let Some(rejection) = refusal(shared, &f, r, priority) {
                    return Err(rejection);
                }
            }
        }
    }
}

/// The loop of [`try_decide`] and [`try_admit`]. Before the first read of the tag it enters
/// the grace period's decision marker (`crate::grace`): no install can bring the tag back to
/// `w`'s, or rewrite the ring slot `w`'s tag names, while the decision is in progress. The
/// marker is in this thread's counters entry, which the admission is counted in anyway (one
/// lookup for both); the caller's handle keeps it alive for the whole decision. A refusal is
/// handed to `refused` (the thread's entry, the word and the ring slot's words that refused,
/// the reason) inside the operation: `Some` is the answer, `None` decides again on the word as
/// it is now.
#[inline(always)]
fn decide_loop<'a, E>(
    shared: &'a Shared,
    r: u64,
    priority: Priority,
    mut refused: impl FnMut(
        &'a Counters,
        Word,
        Packed,
        RejectReason,
        bool,
    ) -> Option<Result<Granted, E>>,
) -> Result<Granted, E> {
    let word = &*shared.word;
    let c = shared.counters.local(Counters::new);
    #[cfg(not(loom))]
    let _op = crate::grace::enter_decision(c.reader(), shared.asymmetric);
    // Under loom an `Option`, so that the broken variant below can leave the operation early.
    #[cfg(loom)]
    let mut op = Some(crate::grace::enter_decision(c.reader(), shared.asymmetric));
    let mut w = Word(word.load(Ordering::Acquire));
    let retry = crate::protocol::backoff::Retry::new();
    loop {
        let packed = shared.ring.read_packed(w.tag());
        let lim = packed.hot();
        match decide(w, &lim, r, priority) {
            Decision::Admit(next) => {
                crate::sync::pause(crate::sync::PausePoint::DecisionCas);
                match word.compare_exchange_weak(w.0, next.0, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok(count_in(shared, c, lim.revision, r)),
                    Err(actual) => {
                        retry.wait();
                        w = Word(actual);
                    }
                }
            }
            Decision::Refuse(reason) => match refused(c, w, packed, reason, false) {
                Some(answer) => return answer,
                None => w = Word(word.load(Ordering::Acquire)),
            },
            Decision::Waiters => {
                #[cfg(loom)]
                if drain_admission_outside_op_for_loom() {
                    drop(op.take());
                }
                match refused(c, w, packed, RejectReason::ConcurrencyLimit, true) {
                    Some(answer) => return answer,
                    None => w = Word(word.load(Ordering::Acquire)),
                }
            }
        }
    }
}

/// Under loom, `LLM_BULKHEAD_LOOM_DRAIN_ADMISSION_OUTSIDE_OP=1` leaves the decision's
/// grace-period operation before [`waiters_up`] (so [`admit_if_nobody_waits`] reads the word
/// and its limits and CASes outside it, as before the fix recorded in the CHANGELOG): the
/// deliberately broken variant `loom-tests/tests/tag_wrap.rs`
/// (`a_drain_time_admission_never_lands_on_a_wrapped_tag`) is shown to fail on.
#[cfg(loom)]
fn drain_admission_outside_op_for_loom() -> bool {
    crate::sync::broken_variant("LLM_BULKHEAD_LOOM_DRAIN_ADMISSION_OUTSIDE_OP")
}

/// What [`waiters_up`] answers.
enum Answer {
    /// Counted.
    Refused(Refused),
    /// `WAITERS` was up only for drainers: admitted after all ([`admit_if_nobody_waits`]).
    Granted(Granted),
    /// The tag moved since the decision's read: decide again.
    Again,
    /// Refused, with event subscribers: nothing counted ([`try_admit_observed`] answers).
    Observed,
}

/// A refusal of [`try_admit`], made inside its grace-period operation (the marker is odd), for
/// reason `reason` on word `w` under the ring slot's words `p` as the decision read them, of a
/// demand of `r` tokens (at high priority if `HIGH`). `None`: decide again.
///
/// It re-checks, after the decision's read of the slot, that the tag has not moved (`None` if
/// it has: the limits may be torn, `crate::words::limits`), counts the refusal in this thread's
/// entry `c` (the one the decision found) and keeps the numbers that explain it ([`Refused`],
/// from which the caller builds the [`Rejection`]; [`Rejection::detail`] computes the
/// explanation only when asked). The marker already keeps
/// that slot from being rewritten until the decision leaves (`crate::grace`), so the words the
/// decision read are the limits of `w`'s tag; the re-check is the ring's own guard, which
/// stands without that argument. Inlined: the refusal is a compare and an increment, with no
/// call and nothing passed through memory. Not with decision timing ([`try_admit_observed`]
/// is that path).
#[inline(always)]
fn refuse<const HIGH: bool>(
    shared: &Shared,
    c: &Counters,
    w: Word,
    p: Packed,
    reason: RejectReason,
) -> Option<Refused> {
    if !Word(shared.word.load(Ordering::Acquire)).same_tag(w) {
        return None;
    }
    c.rejected[reason.index()].incr();
    let p = if HIGH {
        Packed {
            budget: high_budget(p.budget),
            ..p
        }
    } else {
        p
    };
    Some(Refused { w, p, reason })
}

/// [`try_admit`]'s answer to a demand of `r` tokens at `priority` that found a slot free on
/// word `w` but `WAITERS` up ([`Decision::Waiters`]), inside the decision's operation: the flag
/// may be up only for drainers, so it is admitted if nobody is queued
/// ([`admit_if_nobody_waits`], inside the operation too, so its CAS is covered by the marker
/// like the decision's); otherwise refused for `concurrency_limit` as by [`refuse`].
#[cold]
#[inline(never)]
fn waiters_up(shared: &Shared, c: &Counters, w: Word, r: u64, priority: Priority) -> Answer {
    if let Some(g) = admit_if_nobody_waits(shared, r, priority) {
        return Answer::Granted(g);
    }
    if shared.events.on() {
        return Answer::Observed;
    }
    // A fresh read of the slot: the decision's words stay with the caller (this call passes
    // every argument in a register); the re-check in `refuse` follows this read.
    let p = shared.ring.read_packed(w.tag());
    let reason = RejectReason::ConcurrencyLimit;
    let refused = match priority {
        Priority::Normal => refuse::<false>(shared, c, w, p, reason),
        Priority::High => refuse::<true>(shared, c, w, p, reason),
    };
    refused.map_or(Answer::Again, Answer::Refused)
}

/// A fail-fast decision found `WAITERS` set with a free slot: the flag may be up only for
/// drainers. Without the mutex: admit if the queue-length mirror says nobody is queued
/// (`None`: someone is, or the state changed; the caller refuses). Lock-free, so a drain does
/// not turn the decision path into a locked one (`crate::wait::waiting`, "Drain"). The mirror
/// is written by the wait layer under the queue mutex, before the enqueuer's CAS that raises
/// `WAITERS` for it.
#[cold]
#[inline(never)]
pub(crate) fn admit_if_nobody_waits(
    shared: &Shared,
    r: u64,
    priority: Priority,
) -> Option<Granted> {
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::SeqCst));
    loop {
        // After the word load: if `w` is from after an enqueuer's queueing CAS, its mirror
        // store (sequenced before that CAS) is visible here.
        crate::sync::loom_sc_fence();
        if shared.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let lim = shared.ring.read(w.tag());
        if w.closed()
            || w.slots() >= lim.max_concurrent
            || lim
                .effective(priority)
                .is_some_and(|e| w.tokens().saturating_add(r) > e)
        {
            return None;
        }
        match word.compare_exchange(w.0, w.plus(r).0, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return Some(count(shared, lim.revision, r)),
            Err(actual) => w = Word(actual),
        }
    }
}

/// Counts an admission of `r` tokens decided under `revision` (one decided outside
/// [`try_decide`]: under the queue mutex, or handed over) in this thread's entry.
#[inline(always)]
pub(crate) fn count(shared: &Shared, revision: u64, r: u64) -> Granted {
    count_in(shared, shared.counters.local(Counters::new), revision, r)
}

/// [`count`] into this thread's entry `c`.
#[inline(always)]
pub(crate) fn count_in(shared: &Shared, c: &Counters, revision: u64, r: u64) -> Granted {
    let n = c.admitted.incr();
    if shared.has_budget {
        c.total_reserved.add(r);
    }
    Granted {
        revision,
        key: c.key,
        n,
        class: ClassCode::default(),
    }
}

/// Counts and explains the refusal `f` of a demand of `r` tokens at `priority`; `None` if the
/// tag moved since (the limits may have been torn: decide again).
#[inline(always)]
pub(crate) fn refusal(
    shared: &Shared,
    f: &Refusal<'_>,
    r: u64,
    priority: Priority,
) -> Option<Rejection> {
    let p = f.packed;
    refuse_later(
        shared, f.c, f.w, p.shape, p.budget, p.revision, r, f.reason, priority,
    )
}

/// [`refusal`] of a decision made outside [`try_decide`] (under the queue mutex), which looks
/// up this thread's counters entry.
#[cold]
pub(crate) fn refusal_of(
    shared: &Shared,
    w: Word,
    lim: &Hot,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Option<Rejection> {
    let c = shared.counters.local(Counters::new);
    if Word(shared.word.load(Ordering::Acquire)).tag() != w.tag() {
        return None;
    }
    c.rejected[reason.index()].incr();
    let rej = rejection(w.slots(), w.tokens(), lim, reason, r, priority);
    crate::protocol::hooks::rejected(shared, None, &rej);
    Some(rej)
}

/// The refusal path of [`try_decide`] (after its operation), out of line so that the inlined
/// fast path stays small: re-checks that the limits were untorn (the tag has not moved since
/// `w`; see `crate::words::limits`), counts the refusal in this thread's entry `c` (the one the decision found) and keeps the numbers that
/// explain it (the explanation is computed only when asked: [`Rejection::detail`]); `None` if
/// the tag moved (decide again). The limits come as the ring slot's words (`shape`, `budget`,
/// `revision`: [`Packed`]), by value: passing the decoded [`Hot`] by reference made the caller
/// store all six of its words first.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn refuse_later(
    shared: &Shared,
    c: &Counters,
    w: Word,
    shape: u64,
    budget: u64,
    revision: u64,
    r: u64,
    reason: RejectReason,
    priority: Priority,
) -> Option<Rejection> {
    if Word(shared.word.load(Ordering::Acquire)).tag() != w.tag() {
        return None;
    }
    c.rejected[reason.index()].incr();
    let packed = Packed {
        shape,
        budget,
        revision,
    };
    let rej = packed_rejection(w, packed, reason, r, priority);
    if shared.events.on() {
        crate::protocol::hooks::rejected(shared, None, &rej);
    }
    Some(rej)
}

/// Counts and explains the refusal of a waiter (or of a request refused before it could wait:
/// `aborted`) of `r` tokens at `priority`, with the word as it is now.
#[cold]
pub(crate) fn waiter_refusal(
    shared: &Shared,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Rejection {
    let w = Word(shared.word.load(Ordering::Acquire));
    let lim = shared.ring.read(w.tag());
    let c = shared.counters.local(Counters::new);
    c.rejected[reason.index()].incr();
    let mut rej = rejection(w.slots(), w.tokens(), &lim, reason, r, priority);
    rej.set_pending(crate::protocol::handoff::pending(shared) as u64);
    crate::protocol::hooks::rejected(shared, None, &rej);
    rej
}

/// The refusal of a demand of `r` tokens at `priority`, explained by `slots` and `tokens` in
/// use under `lim` (no class numbers; the queue length 0 until the caller sets it). The class
/// protocol's refusals start from it too.
#[inline(always)]
pub(crate) fn rejection(
    slots: u64,
    tokens: u64,
    lim: &Hot,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Rejection {
    let packed = Packed::pack(
        lim.max_concurrent,
        lim.max_queue,
        lim.budget
            .map(|budget| (budget, lim.effective(priority).unwrap_or(budget))),
    );
    Rejection::counted(
        reason,
        None,
        lim.revision,
        Counts {
            requested: r,
            used: Counts::used(tokens, slots),
            shape: packed.shape,
            budget: packed.budget,
        },
    )
}

/// [`rejection`] on word `w` under the ring slot's words `p` as the decision read them: the
/// limits are kept packed, with the demand's effective budget in `eff(normal)`'s place (the
/// budget itself for `High`), and decoded only by [`Rejection::detail`].
#[inline(always)]
pub(crate) fn packed_rejection(
    w: Word,
    p: Packed,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Rejection {
    let budget = match priority {
        Priority::High => high_budget(p.budget),
        Priority::Normal => p.budget,
    };
    Rejection::counted(
        reason,
        None,
        p.revision,
        Counts {
            requested: r,
            // The word as it is: tokens in the low 32 bits, the 15-bit slot field from bit 32,
            // as `Counts::used` keeps them (`crate::words::state`); the bits above are not read.
            used: w.0,
            shape: p.shape,
            budget,
        },
    )
}

/// The ring slot's budget word with a high-priority demand's effective budget (the budget
/// itself) in `eff(normal)`'s place.
#[inline(always)]
fn high_budget(budget: u64) -> u64 {
    (budget & 0xffff_ffff) | (budget << 32)
}

/// What the decision under the queue mutex ([`decide_queued`]) did with a demand whose fast
/// decision found no free slot (or, under token waiting, too few tokens) with a queue possible.
pub(crate) enum QueueStep {
    /// A slot freed meanwhile (or `WAITERS` was up only for drainers) and nobody is queued:
    /// taken with one CAS, and counted.
    Granted(Granted),
    /// Refused for `reason`, on word `w` under its limits `lim` (explain it with
    /// [`refusal_of`]; `pending` is the queue length under the mutex).
    Refused {
        w: Word,
        lim: Hot,
        reason: RejectReason,
        pending: usize,
    },
    /// `WAITERS` is up and the queue-length mirror counts the newcomer: the caller links its
    /// node at the tail before it unlocks.
    Queue,
}

/// The no-class decision under the queue mutex held by `q` (the wait layer's enqueue): rows
/// 0, 1 and 6 of CONTRACT.md §2 and the queue bound, on the word read under the mutex. It takes
/// a slot freed meanwhile when nobody is queued, refuses, or raises `WAITERS` for a newcomer the
/// caller then links.
///
/// The queueing CAS expects the word it decided on, so it proves, with the tag, that no slot
/// is free (or that others wait) under the limits it read. The length mirror counts the
/// newcomer first (stored before that CAS): a decider or a release that reads the word after
/// the CAS then sees it in the mirror ([`admit_if_nobody_waits`]; `crate::wait::waiting`,
/// "Drain"). Under token waiting, a demand short of tokens that can fit once capacity returns
/// queues too, as long as a queue is possible (`crate::protocol::token_wait`).
// Inlined into the enqueue (its one caller), which is already out of line.
#[inline(always)]
pub(crate) fn decide_queued(
    q: &crate::shared::QueueGuard<'_>,
    r: u64,
    priority: Priority,
) -> QueueStep {
    let shared = q.shared();
    let word = &*shared.word;
    let queued = q.len();
    let mut w = Word(word.load(Ordering::Acquire));
    loop {
        let lim = shared.ring.read(w.tag());
        let short = lim
            .effective(priority)
            .is_some_and(|e| w.tokens().saturating_add(r) > e);
        let waits_for_tokens = short
            && shared.wait_for_tokens
            && crate::protocol::token_wait::fits_when_idle(&lim, r, priority)
            && lim.max_concurrent > 0
            && lim.max_queue > 0;
        let reason = if w.closed() {
            Some(RejectReason::Shutdown)
        } else if short && !waits_for_tokens {
            Some(RejectReason::BudgetLimit)
        } else if !short && queued == 0 && w.slots() < lim.max_concurrent {
            match word.compare_exchange(w.0, w.plus(r).0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return QueueStep::Granted(count(shared, lim.revision, r)),
                Err(actual) => {
                    w = Word(actual);
                    continue;
                }
            }
        } else if lim.max_concurrent == 0 || lim.max_queue == 0 {
            Some(RejectReason::ConcurrencyLimit)
        } else if queued as u64 >= lim.max_queue {
            Some(RejectReason::QueueLimit)
        } else {
            None
        };
        if let Some(reason) = reason {
            return QueueStep::Refused {
                w,
                lim,
                reason,
                pending: queued,
            };
        }
        shared.queued.store(queued + 1, Ordering::SeqCst);
        crate::sync::loom_sc_fence();
        match word.compare_exchange(
            w.0,
            w.0 | crate::words::state::WAITERS,
            Ordering::SeqCst,
            Ordering::Acquire,
        ) {
            Ok(_) => return QueueStep::Queue,
            Err(actual) => {
                shared.queued.store(queued, Ordering::SeqCst);
                w = Word(actual);
            }
        }
    }
}

/// A usage report shrank an admission's hold by `amount`: one `fetch_sub` of the word (the
/// return of capacity, `Release`); with token waiting, the refunded tokens go to the queued
/// head first (`crate::protocol::token_wait::after_refund`). The caller holds the admission's
/// slot, whose hold contains `amount`.
#[inline]
pub(crate) fn return_tokens(shared: &Shared, amount: u64) {
    let prev = Word(shared.word.fetch_sub(amount, Ordering::Release));
    // This admission's hold is in T, so T ≥ amount: no borrow from the slots.
    debug_assert!(prev.tokens() >= amount, "token field underflow");
    crate::protocol::token_wait::after_refund(shared, prev);
}

/// A usage report grew an admission's hold by `amount`: added to `T` with no admission check
/// (the work is already running), refused (`Err`, nothing changed) only if `T` would leave its
/// field ([`MAX_TOKENS`]). A CAS loop: lock-free.
pub(crate) fn grow_tokens(shared: &Shared, amount: u64) -> Result<(), ()> {
    let mut w = Word(shared.word.load(Ordering::Relaxed));
    loop {
        if w.tokens()
            .checked_add(amount)
            .is_none_or(|t| t > MAX_TOKENS)
        {
            return Err(());
        }
        match shared.word.compare_exchange_weak(
            w.0,
            w.0 + amount,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => return Ok(()),
            Err(actual) => w = Word(actual),
        }
    }
}
