//! The class protocol's fast attempt (`first_try`): every state read once, one CAS per word,
//! no retry; the class ceilings checked first, so that a refusal at one (the hot path under
//! overload, `refusal::ceiling_refusal`) stops before anything else is read, and a borrower
//! that the shared word refuses stops before any step (`refusal::shared_refusal` decides that
//! refusal from one collect).

use super::*;

/// The common case in a few instructions: every state read once, one CAS per word, no retry.
/// `None` hands the decision to the full protocol ([`acquire_contended`]), which starts again
/// from fresh reads; anything this did was undone.
#[inline(always)]
pub(super) fn first_try(shared: &Shared, k: usize, r: u64, priority: Priority) -> Option<Admitted> {
    first_try_or_ceiling(shared, k, r, priority).ok()
}

/// [`first_try`], which says where it stopped when it may be a refusal: at a class ceiling,
/// with the words it read and the row that failed (`Err(Some(_))` at a [`StopAt`] ceiling,
/// [`ceiling_refusal`] decides the refusal from them), or before any step, for a demand that
/// row 1 or the stored shared word refuses ([`StopAt::Shared`], [`shared_refusal`] decides it
/// from a collect). `Err(None)`: the full protocol decides. Rows 2 and 3 (the class ceilings)
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
    // 1, which the model puts before them, is `ceiling_refusal`'s to check). `t + r` wraps
    // only for an `r` above any budget (without a budget `r` is 0), which row 1 refuses: the
    // ceiling is then not claimed, and `r > eff` below (or row 1 in `ceiling_refusal`) hands
    // the decision on.
    let at_ceiling = if cl.ceilings() & 2 != 0 && c.tokens().wrapping_add(r) > cl.mt_or_zero() {
        Some(StopAt::TokenCeiling)
    } else if cl.ceilings() & 1 != 0 && c.in_flight() >= cl.mc_or_zero() {
        Some(StopAt::ConcurrencyCeiling)
    } else {
        None
    };
    if let Some(at) = at_ceiling {
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
    if !borrow_c && (r == 0 || t + r <= l.pt) {
        if g.v() > eff {
            return Err(None);
        }
        crate::sync::pause(crate::sync::PausePoint::ClassCas);
        cw.compare_exchange(c.0, next, SeqCst, SeqCst)
            .map_err(|_| None)?;
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
    if (borrow_c && g.u() + 1 > mc) || g.v() + dv > eff {
        // Refused by the stored amounts, which may count other deciders' steps in progress:
        // nothing was done, and a collect decides (`shared_refusal`).
        return Err(Some(Stopped {
            g,
            c,
            cl,
            at: StopAt::Shared,
        }));
    }
    word.compare_exchange(g.0, g.0 + du * G_ONE + dv, SeqCst, SeqCst)
        .map_err(|_| None)?;
    let resources = class_step_after_reserve(shared, k, r, false, c, du, dv).ok_or(None)?;
    Ok(Admitted {
        revision: lim.revision,
        resources,
    })
}
