//! The class protocol's returns of capacity: undoing a step, the class decrease and its
//! migration to the current floors, the release, usage growth (`super`, "Lifetime").

use super::*;
use crate::protocol::backoff::Retry;
use crate::shared::SlotRef;

/// Takes back a class step of one slot and `r` tokens. The step's own amount is already in the
/// shared word (a borrower adds it first; a protected step's amount is zero), so this is an
/// ordinary decrease: class word first, then the amount it computes.
pub(super) fn undo(shared: &Shared, k: usize, r: u64, in_queue: bool) {
    class_decrease(shared, k, 1, r, in_queue);
}

/// A decrease of class `k` by `slots` (0 or 1) and `tokens` that is not a release (the caller
/// keeps the state alive by other means: a handle, or a decision in progress): class word
/// first, then the shared-word amount it computes from the word it replaced; visits the queue
/// if either word was flagged (unless the caller holds the queue mutex, `in_queue`).
pub(super) fn class_decrease(shared: &Shared, k: usize, slots: u64, tokens: u64, in_queue: bool) {
    let _op = crate::grace::op(shared.grace_id);
    let cw = &*shared.class_words[k];
    let mut c = CWord(cw.load(SeqCst));
    loop {
        let l = floors_of(shared, c, k);
        let (n, t) = (c.in_flight(), c.tokens());
        debug_assert!(n >= slots && t >= tokens, "class word underflow: {c:?}");
        let (du, dv) = delta(&l, n, t, n - slots, t - tokens);
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        match cw.compare_exchange_weak(c.0, c.0 - slots * C_ONE - tokens, SeqCst, SeqCst) {
            Ok(_) => {
                let visit = shared_decrease(shared, du, dv) | c.queue();
                return visit_queue(shared, visit, in_queue);
            }
            Err(actual) => c = CWord(actual),
        }
    }
}

/// Migrates class `k` (found at `seen`) to the version the current tag gives it, if it is one
/// behind; otherwise does nothing (the caller starts again with fresh reads).
pub(super) fn help_migrate(shared: &Shared, k: usize, seen: CWord, in_queue: bool) {
    let g = GWord(shared.word.load(SeqCst));
    if seen.ctag() == behind(shared.ring.version(g.tag(), k)) {
        let visit = migrate(shared, k, g.tag());
        visit_queue(shared, visit, in_queue);
    }
}

/// The class version before `ver` (mod `ctag_mod()`).
#[inline]
fn behind(ver: usize) -> usize {
    let m = crate::words::class_word::ctag_mod();
    (ver + m - 1) % m
}

/// Moves class `k`'s accounting to the version (and limits) that `tag` gives it (module docs,
/// "Reconfiguration"): one CAS on the class word, then the exact change replaces the
/// reconfigurer's advance. Does nothing if the class word is not one version behind (already
/// migrated, or the install of `tag` left the class's limits as they were). Returns whether
/// that decrease found `WAITERS` set (the caller visits the queue).
///
/// A helper holds no lock: the slot of `tag` it reads may be rewritten by an install four tags
/// later (the global ring is not protected by the grace period, `crate::grace`), so what it
/// read counts only if the tag is still `tag` afterwards. Then the migration CAS is sound: if
/// the tag moves after that check, the install of `tag` has migrated the class before the
/// next install began, and the CAS (expecting the version before) fails.
#[must_use]
pub(crate) fn migrate(shared: &Shared, k: usize, tag: usize) -> bool {
    let _op = crate::grace::op(shared.grace_id);
    let cw = &*shared.class_words[k];
    let (ver, new) = shared.ring.read_class_versioned(tag, k);
    let mut c = CWord(cw.load(SeqCst));
    if c.ctag() != behind(ver) || !tag_is(shared, tag) {
        return false;
    }
    loop {
        if c.ctag() != behind(ver) {
            return false; // already migrated (or not ours to do)
        }
        let old = floors_of(shared, c, k);
        let (n, t) = (c.in_flight(), c.tokens());
        match cw.compare_exchange_weak(c.0, c.with_ctag(ver).0, SeqCst, SeqCst) {
            Ok(_) => {
                let du = n.max(new.pc) as i64 - n.max(old.pc) as i64;
                let dv = t.max(new.pt) as i64 - t.max(old.pt) as i64;
                let adv_u = new.pc.saturating_sub(old.pc) as i64;
                let adv_v = new.pt.saturating_sub(old.pt) as i64;
                return shared_decrease(shared, du - adv_u, dv - adv_v);
            }
            Err(actual) => c = CWord(actual),
        }
    }
}

/// Whether the shared word's tag is still `tag` (a count, compared in the word's width).
#[inline]
fn tag_is(shared: &Shared, tag: usize) -> bool {
    let now = GWord(shared.word.load(SeqCst)).tag();
    now == crate::words::state::tag_of(tag)
}

/// What a release of one slot and `held` tokens of class `k` reads from the class word `c` it
/// found (or replaced): the floors `c` is accounted under, its slots and its tokens, checked to
/// hold what the release returns (no field underflows, module docs).
#[inline(always)]
fn returned_from(shared: &Shared, c: CWord, k: usize, held: u64) -> (HotClass, u64, u64) {
    let (n, t) = (c.in_flight(), c.tokens());
    debug_assert!(
        n >= 1 && t >= held,
        "class word underflow: {c:?} - (1, {held})"
    );
    (floors_of(shared, c, k), n, t)
}

/// Returns one class slot and `held` tokens of class `k` (a release): the class word first,
/// then the shared-word decrease it computes and the queue visit, all inside one grace-period
/// operation on the thread's process-wide cell. Returns whether it emptied a detached class
/// word (the caller then counts down `alive`, and whoever reaches zero ends the owners'
/// lifetime reference).
///
/// # Safety
/// `slot` stands for the class slot of class `k` being returned. The slot keeps the state
/// alive until the class step; after it, the operation does (a class-mode free waits for
/// every operation of its bulkhead, `crate::shared`, "Class mode: a release's operation keeps
/// the state alive"), until this function leaves it. The caller does not touch the state
/// afterwards except to count down when this returns true (its own count in `alive` then
/// keeps the state alive).
///
/// It takes the slot, not a `&Shared`: a reference argument must stay valid until the function
/// returns, and once the operation is left the last handle may free the state on another
/// thread before this returns (found by Miri in `tests/lifetime_stress.rs`; checked
/// deterministically by `tests/lifetime_class_release.rs`, which frees the state while this is
/// held at `PausePoint::ClassReleaseGiven`, after the operation). The state is reached through
/// local references, last used inside the operation.
///
/// `borrowed` is a hint: the admission borrowed a slot or tokens, so its release most likely
/// returns borrowed capacity (a shared decrease). Such a release takes its class step as one
/// `fetch_sub` that returns the slot and the hold, whatever the word holds, and computes the
/// decrease from the word it replaced (the floors of that word's `ctag`, which the
/// grace-period operation keeps in the ring): no load before it and no failed CAS when another
/// release or admission of the class writes the word meanwhile, which under contention cost a
/// cache-line transfer each. Without the hint the first try is one CAS, inline; a failed one
/// goes on in [`release_contended`] (out of line), so that the common release keeps few
/// registers live.
#[inline(always)]
pub(crate) unsafe fn release(slot: &SlotRef, k: usize, held: u64, borrowed: bool) -> bool {
    // SAFETY: as this function's.
    let last = unsafe { release_in_operation(slot, k, held, borrowed) };
    crate::sync::pause(crate::sync::PausePoint::ClassReleaseGiven);
    last
}

/// [`release`] inside its operation.
///
/// # Safety
/// As [`release`]'s.
#[inline(always)]
unsafe fn release_in_operation(slot: &SlotRef, k: usize, held: u64, borrowed: bool) -> bool {
    let shared = slot.get();
    // The grace-period operation (`crate::grace`): the floors read below are those of the class
    // word's tag until the class step, and the state stays allocated until it is left. Its
    // marker is process-wide, not in `shared`, so leaving it touches nothing of the state.
    let _op = crate::grace::op(shared.grace_id);
    let cw = &*shared.class_words[k];
    if borrowed {
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        let p = CWord(cw.fetch_sub(C_ONE + held, SeqCst));
        crate::sync::pause(crate::sync::PausePoint::ClassReturned);
        // The floors of the replaced word's tag: the operation keeps them in the ring.
        let (l, n, t) = returned_from(shared, p, k, held);
        let (du, dv) = delta(&l, n, t, n - 1, t - held);
        release_rest(shared, du, dv, p.queue());
        return CWord(p.0 - C_ONE - held).emptied_detached();
    }
    let c = CWord(cw.load(SeqCst));
    let (l, n, t) = returned_from(shared, c, k, held);
    crate::sync::pause(crate::sync::PausePoint::ClassCas);
    // One iteration of `release_contended`'s loop.
    if cw
        .compare_exchange_weak(c.0, c.0 - C_ONE - held, SeqCst, SeqCst)
        .is_ok()
    {
        return returned(shared, c, (l, n, t), held);
    }
    // SAFETY: as this function's (the CAS failed: the slot is still ours).
    unsafe { release_contended(slot, k, held) }
}

/// [`release`] after its first try did not return the slot: the whole release, as a CAS loop
/// that waits before each try (`super::backoff`).
///
/// # Safety
/// As [`release`]'s.
#[inline(never)]
unsafe fn release_contended(slot: &SlotRef, k: usize, held: u64) -> bool {
    let shared = slot.get();
    // Nested in `release`'s operation (a no-op marker) when called from there.
    let _op = crate::grace::op(shared.grace_id);
    let cw = &*shared.class_words[k];
    let mut c = CWord(cw.load(SeqCst));
    let retry = Retry::new();
    loop {
        retry.wait();
        let read = returned_from(shared, c, k, held);
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        match cw.compare_exchange_weak(c.0, c.0 - C_ONE - held, SeqCst, SeqCst) {
            Ok(_) => return returned(shared, c, read, held),
            Err(actual) => c = CWord(actual),
        }
    }
}

/// The rest of a release whose CAS replaced `c` (read before it: the floors `l` of its tag,
/// its slots `n` and tokens `t`) with `c` less one slot and `held` tokens: the shared decrease
/// and the queue visit, if any; returns whether it emptied a detached class word. `U` and `V`
/// do not change (`delta` is (0, 0)) exactly when the slot was inside the floor (`n ≤ pc`) and
/// so were the tokens (`t ≤ pt`), or none were returned: tested directly, `delta` only
/// otherwise.
#[inline(always)]
fn returned(shared: &Shared, c: CWord, (l, n, t): (HotClass, u64, u64), held: u64) -> bool {
    if !(n <= l.pc && (held == 0 || t <= l.pt)) || c.queue() {
        let (du, dv) = delta(&l, n, t, n - 1, t - held);
        release_rest(shared, du, dv, c.queue());
    }
    CWord(c.0 - C_ONE - held).emptied_detached()
}

/// The rest of a release after its class step: the shared decrease `(du, dv)` and the queue
/// visit (if either word was flagged), inside the release's operation, which keeps the state
/// alive meanwhile.
#[inline(always)]
fn release_rest(shared: &Shared, du: i64, dv: i64, queue: bool) {
    let visit = shared_decrease(shared, du, dv) | queue;
    visit_queue(shared, visit, false);
}

/// Returns one class slot of class `k` but keeps its tokens (abandonment). The caller holds a
/// handle, so ordering is free of lifetime concerns.
pub(crate) fn return_slot_only(shared: &Shared, k: usize) {
    class_decrease(shared, k, 1, 0, false);
}

/// Returns `amount` tokens of class `k` (usage shrinkage, or the release of an abandoned
/// admission, whose handle keeps the state alive). Like every decrease it visits a flagged
/// queue, which is how a class usage refund feeds a head waiting for tokens
/// (`crate::protocol::token_wait`).
pub(crate) fn return_tokens(shared: &Shared, k: usize, amount: u64) {
    // Under loom, `LLM_BULKHEAD_LOOM_NO_TOKEN_PUMP=1` skips the visit (as if the caller held
    // the queue mutex): the broken variant the classed token-waiting model is shown to fail on.
    let skip_visit = crate::protocol::token_wait::broken_for_loom();
    class_decrease(shared, k, 0, amount, skip_visit);
}

/// Adds `amount` tokens to class `k`'s hold with no admission check (usage growth): `V` first
/// by the whole amount, then the class word, then the exact correction.
///
/// # Errors
/// `Err(())` when the stored `V` would pass its field's room; nothing changed.
pub(crate) fn grow_tokens(shared: &Shared, k: usize, amount: u64) -> Result<(), ()> {
    let _op = crate::grace::op(shared.grace_id);
    let word = &*shared.word;
    let mut s = GWord(word.load(SeqCst));
    loop {
        if s.v().checked_add(amount).is_none_or(|v| v > V_GROWTH_CAP) {
            return Err(());
        }
        match word.compare_exchange_weak(s.0, s.0 + amount, SeqCst, SeqCst) {
            Ok(_) => break,
            Err(actual) => s = GWord(actual),
        }
    }
    let cw = &*shared.class_words[k];
    let mut c = CWord(cw.load(SeqCst));
    loop {
        let l = floors_of(shared, c, k);
        let t = c.tokens();
        let (_, dv) = delta(&l, 0, t, 0, t + amount);
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        match cw.compare_exchange_weak(c.0, c.0 + amount, SeqCst, SeqCst) {
            Ok(_) => {
                let visit = shared_decrease(shared, 0, dv - amount as i64);
                visit_queue(shared, visit, false);
                return Ok(());
            }
            Err(actual) => c = CWord(actual),
        }
    }
}
