//! The class protocol's fast attempt (`first_try`): every state read once, one CAS per word;
//! the class ceilings checked first, so that a refusal at one (the hot path under overload,
//! `refusal::own_word_refusal`) stops before anything else is read, and a borrower that the
//! shared word refuses stops before any step (`refusal::own_word_refusal` decides that
//! refusal when the class's own borrowing explains it, `refusal::shared_refusal` from one
//! collect otherwise). The retries, out of line, are of a CAS that another decider's step or
//! a return beat: a borrower's shared CAS (`borrow_moved`; with two threads borrowing in one
//! class that was two attempts in five, each sent through a second attempt and often the full
//! protocol) and a protected step's class CAS (`protected_moved`). Each waits a little
//! before it tries again (`super::backoff`), which is what makes two threads in one class
//! fast: the thread that won finishes its pair on the lines it holds.

use super::*;
use crate::protocol::backoff::Retry;

/// The common case in a few instructions: every state read once, one CAS per word (a
/// borrower's shared CAS tried again on the word it found, [`borrow_moved`]). `None` hands the decision to the full protocol ([`acquire_contended`]), which starts again
/// from fresh reads; anything this did was undone.
#[inline(always)]
pub(super) fn first_try(shared: &Shared, k: usize, r: u64, priority: Priority) -> Option<Admitted> {
    first_try_or_ceiling(shared, k, r, priority).ok()
}

/// [`first_try`], which says where it stopped when it may be a refusal: at a class ceiling,
/// with the words it read and the row that failed (`Err(Some(_))` at a [`StopAt`] ceiling,
/// [`own_word_refusal`] decides the refusal from them), or before any step, for a demand that
/// row 1 or the stored shared word refuses ([`StopAt::Shared`]: [`own_word_refusal`] decides
/// it when the class's own borrowing explains it, [`shared_refusal`] from a collect
/// otherwise). `Err(None)`: the full protocol decides. Rows 2 and 3 (the class ceilings)
/// are checked first, on the class word read under the shared word's tag at the class's
/// version under that tag, before the slot's other words are read or anything else is
/// decoded: a refusal at a ceiling, the hot path under overload, stops there.
#[inline(always)]
pub(super) fn first_try_or_ceiling(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
) -> Result<Admitted, Option<Stopped>> {
    let word = &*shared.word;
    let cw = &*shared.class_words[k];
    let g = GWord(word.load(SeqCst));
    let tag = g.tag();
    // Read as stored: a refusal keeps these words (`Stopped`).
    let cl = shared.ring.read_class_words(tag, k);
    let c = CWord(cw.load(SeqCst));
    if g.closed() || c.ctag() != cl.version() {
        return Err(None);
    }
    // The token ceiling before the concurrency ceiling, as the model orders rows 2 and 3 (row
    // 1, which the model puts before them, is `own_word_refusal`'s to check). `t + r` wraps
    // only for an `r` above any budget (without a budget `r` is 0), which row 1 refuses: the
    // ceiling is then not claimed, and `r > eff` below (or row 1 in `own_word_refusal`) hands
    // the decision on.
    if let Some(at) = ceiling_stop(cl, c, r) {
        return Err(Some(Stopped { g, c, cl, at }));
    }
    let p = shared.ring.read_packed(tag);
    let (lim, l) = (p.hot(), cl.hot());
    // Without a budget `eff` is 0, and `r`, `V` and `dv` are 0 too (no tokens without a
    // budget): every budget row below passes, as it should.
    let eff = p.eff_or_zero(priority);
    debug_assert!(lim.budget.is_some() || (r == 0 && g.v() == 0));
    let mc = lim.max_concurrent;
    if g.waiters() || g.u() > mc {
        return Err(None);
    }
    // Row 1 refuses any demand above the effective budget, whatever the state.
    if r > eff {
        return Err(Some(Stopped {
            g,
            c,
            cl,
            at: StopAt::Shared,
        }));
    }
    let (n, t) = (c.in_flight(), c.tokens());
    let borrow_c = n >= l.pc;
    let next = c.0 + C_ONE + r;
    // Protected: neither a slot nor tokens borrowed (`dv = 0`, which is `r = 0` or
    // `t + r ≤ pt`), tested directly; `dv` is computed for the borrower only.
    if inside_floors(l, n, t, r) {
        if g.v() > eff {
            return Err(None);
        }
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        if let Err(a) = cw.compare_exchange(c.0, next, SeqCst, SeqCst) {
            protected_moved(shared, k, r, tag, CWord(a)).ok_or(None)?;
        }
        crate::sync::pause(crate::sync::PausePoint::ProtectedStepTaken);
        crate::sync::loom_sc_fence();
        let g2 = GWord(word.load(SeqCst));
        if g2.tag() == tag && !g2.closed() && !g2.waiters() && g2.u() <= mc && g2.v() <= eff {
            return Ok(Admitted {
                revision: lim.revision,
                resources: Resources::default(),
            });
        }
        // Taken back, or kept and decided again if the tag moved (`moved`).
        return protected_step_missed(shared, k, r, priority, tag, g2);
    }
    let dv = (t + r).max(l.pt) - t.max(l.pt);
    // Borrowing: rows 4 and 5 on the shared word, then the class word.
    let du = u64::from(borrow_c);
    if stored_refuses_borrower(g, borrow_c, dv, mc, eff) {
        // Refused by the stored amounts, which may count other deciders' steps in progress:
        // nothing was done, and the class's own word (`own_word_refusal`) or a collect
        // (`shared_refusal`) decides.
        return Err(Some(Stopped {
            g,
            c,
            cl,
            at: StopAt::Shared,
        }));
    }
    let step = du * G_ONE + dv;
    // `c` becomes the word the class CAS replaced (`class_step_after_reserve`).
    let mut c = c;
    let resources = match word.compare_exchange(g.0, g.0 + step, SeqCst, SeqCst) {
        Ok(_) => class_step_after_reserve(shared, k, r, false, &mut c, du, dv),
        Err(a) => borrow_moved(shared, k, r, priority, GWord(a), tag, &mut c, step),
    }
    .ok_or(None)?;
    // The step stands if it was reserved whole; otherwise only if no install came between
    // the reservation and it, and if the part of its tokens inside the class's floor,
    // reserved by no one, passes a protected step's check (`super::borrow_overtaken`): a
    // load after the class CAS in the `SeqCst` order (`super::borrow_unsettled`).
    crate::sync::pause(crate::sync::PausePoint::BorrowStepped);
    crate::sync::loom_sc_fence();
    if borrow_unsettled(shared, tag, eff, resources, r, reserved_whole(du, dv, r)) {
        let revision = lim.revision;
        return borrow_overtaken(shared, k, r, priority, false, tag, c, revision, resources)
            .ok_or(None);
    }
    Ok(Admitted {
        revision: lim.revision,
        resources,
    })
}

/// Rows 2 and 3 on the class word `c` under the class limits `cl` for `r` tokens: the ceiling
/// it is past, if any, the token ceiling first (the model's order; the caller says why a
/// wrapped `t + r` is harmless). Shared by the fast attempt and the re-read of a
/// stopped one (`refusal::read_stopped`).
#[inline(always)]
pub(super) fn ceiling_stop(
    cl: crate::words::limits::ClassLimitWords,
    c: CWord,
    r: u64,
) -> Option<StopAt> {
    if cl.ceilings() & 2 != 0 && c.tokens().wrapping_add(r) > cl.mt_or_zero() {
        Some(StopAt::TokenCeiling)
    } else if cl.ceilings() & 1 != 0 && c.in_flight() >= cl.mc_or_zero() {
        Some(StopAt::ConcurrencyCeiling)
    } else {
        None
    }
}

/// Whether a step of one slot and `r` tokens on a class word holding `n` slots and `t` tokens
/// is protected under the class limits `l`: neither its slot nor any of its tokens borrowed
/// (`du = 0` and `dv = 0`, tested directly). The fast attempt's test and the one its retry
/// makes on the word a lost CAS found ([`protected_moved`]), so that both are the same.
#[inline(always)]
fn inside_floors(l: HotClass, n: u64, t: u64, r: u64) -> bool {
    // Written as the attempt's `borrow_c` test negated: `n < l.pc` compiled the inlined
    // attempt 3 to 6 instructions longer (`benches/instructions.rs`).
    let borrows_slot = n >= l.pc;
    !borrows_slot && (r == 0 || t + r <= l.pt)
}

/// Rows 4 and 5 on the stored shared word `g` for a borrower (a slot if `borrow_c`, `dv`
/// tokens past its floor): whether the stored `U`, `V` leave it no room (then the class word
/// decides, `refusal::own_word_refusal`, or a collect, `refusal::shared_refusal`). Shared by
/// the fast attempt and `refusal::read_stopped`.
#[inline(always)]
pub(super) fn stored_refuses_borrower(
    g: GWord,
    borrow_c: bool,
    dv: u64,
    mc: u64,
    eff: u64,
) -> bool {
    (borrow_c && g.u() + 1 > mc) || g.v() + dv > eff
}

/// A protected step's class CAS in [`first_try_or_ceiling`] found the class word at `a`:
/// another decision or a return in this class wrote it since the attempt read it (two threads
/// in one class, inside its floors). After a wait ([`Retry`]), the step is tried again on the
/// word found, as long as it is still at the class's version under the attempt's tag and the
/// step on it is still protected (its slot and tokens inside the floors) and within both
/// ceilings: the checks the attempt made on the word it read. The caller's load of the shared
/// word after the CAS then decides, as after a first CAS that succeeded (`super`, "Protected
/// path": the argument holds for whichever class state the CAS replaced, once it passed
/// these checks). Giving up at the first failed CAS sent every such attempt through a
/// second attempt, and some through the full protocol (two threads in one class,
/// `classes/two_threads_protected_same_class` in `benches/core.rs`: about 80 ns a pair in
/// the README's table, 52 with the retries and their waits, one run). `None`: nothing was done, and the full
/// protocol decides. Bounded: each failed CAS is another decision's progress.
///
/// The class's limits are read again from the tag's slot, as the attempt read them, so that
/// the inlined attempt keeps nothing more live across this call (a slot rewritten meanwhile
/// harms nobody: the caller's load then finds another tag, `crate::grace`, "The rule").
/// Under loom, `LLM_BULKHEAD_LOOM_PROTECTED_RETRY_UNCHECKED=1` tries the CAS again without
/// checking the word it found: the broken variant on which the model
/// `protected_admissions_race_for_the_last_floor_slot` (`loom-tests/tests/classes.rs`)
/// fails (the loser steps past the floor as protected, and both are admitted on one slot).
#[cold]
#[inline(never)]
fn protected_moved(shared: &Shared, k: usize, r: u64, tag: usize, mut a: CWord) -> Option<()> {
    let cl = shared.ring.read_class_words(tag, k);
    let l = cl.hot();
    let cw = &*shared.class_words[k];
    let retry = Retry::new();
    for _ in 0..RESERVE_TRIES {
        retry.wait();
        let protected = a.ctag() == cl.version()
            && ceiling_stop(cl, a, r).is_none()
            && inside_floors(l, a.in_flight(), a.tokens(), r);
        if !protected && !protected_unchecked_for_loom() {
            return None;
        }
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        match cw.compare_exchange(a.0, a.0 + C_ONE + r, SeqCst, SeqCst) {
            Ok(_) => return Some(()),
            Err(x) => a = CWord(x),
        }
    }
    None
}

/// How many times the fast attempt tries a CAS that lost again: a borrower's shared CAS
/// ([`borrow_moved`]) and a protected step's class CAS ([`protected_moved`]).
const RESERVE_TRIES: u32 = 4;

/// The borrower's shared CAS in [`first_try_or_ceiling`] found the word at `a`: a return or
/// another decider's step landed since the attempt read it (two threads borrowing in one
/// class met this on about two attempts in five). The classification (`step`, the attempt's
/// `du` and `dv` as one addend) comes from the class word `c` alone, and the limits from the
/// tag, so while the tag and the flags are as the attempt read them, rows 4 and 5 are checked
/// again on `a` and the CAS is tried again after a wait (`super::backoff`), as the full
/// protocol's loop does, and then the class step is taken as on the first try. Giving up at the first failed CAS sent every
/// such attempt through a second attempt and often the full protocol. `None`: nothing was
/// done (or the reservation was taken back), and the full protocol decides, also a refusal.
/// Bounded: each failed CAS is another decider's progress.
///
/// A small result and the limits read again from the tag's slot, so that the pairs' inlined
/// attempt keeps nothing more live across this call (`benches/instructions.rs`).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn borrow_moved(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    mut a: GWord,
    tag: usize,
    c: &mut CWord,
    step: u64,
) -> Option<Resources> {
    let p = shared.ring.read_packed(tag);
    let (mc, eff) = (p.hot().max_concurrent, p.eff_or_zero(priority));
    let (du, dv) = (step >> U_SHIFT, step & V_MASK);
    let retry = Retry::new();
    for _ in 0..RESERVE_TRIES {
        retry.wait();
        if a.tag() != tag || a.closed() || a.waiters() || a.u() > mc {
            return None;
        }
        if ((du == 1 && a.u() + 1 > mc) || a.v() + dv > eff) && !unchecked_for_loom() {
            return None;
        }
        match shared
            .word
            .compare_exchange(a.0, a.0 + step, SeqCst, SeqCst)
        {
            Ok(_) => return class_step_after_reserve(shared, k, r, false, c, du, dv),
            Err(x) => a = GWord(x),
        }
    }
    None
}

/// Under loom, `LLM_BULKHEAD_LOOM_PROTECTED_RETRY_UNCHECKED=1`: [`protected_moved`]'s broken
/// variant.
#[inline(always)]
fn protected_unchecked_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_PROTECTED_RETRY_UNCHECKED")
}

/// Under loom, `LLM_BULKHEAD_LOOM_RESERVE_UNCHECKED=1` makes [`borrow_moved`] try its CAS
/// again without checking rows 4 and 5 on the word it found: the broken variant the model
/// `two_classes_race_for_the_last_shared_slot` (`loom-tests/tests/classes.rs`) is shown to
/// fail on (both racers take the one shared slot).
#[inline(always)]
fn unchecked_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_RESERVE_UNCHECKED")
}
