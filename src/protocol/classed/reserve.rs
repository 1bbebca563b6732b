//! A borrower's step on its class word, after its reservation on the shared word
//! (`super::moved`, "A borrower's step"): the CAS expecting the class state the borrower
//! classified, and, when the class word moved meanwhile, the step on the state it moved to,
//! or the reservation taken back.

use super::*;

/// A borrower's class step, after it reserved `du` (0 or 1) and `dv` in the shared word for
/// class state `c`. If the class word moved meanwhile, the step is taken on the new state as
/// long as its own amounts are no larger than the reservation (the excess is given back after
/// the class step, a decrease), so a reservation is taken back only when the class now needs
/// more than was reserved, hit a ceiling, or migrated. `None`: the reservation was taken back.
/// (Reserving the difference instead was measured: no better on `tests/stress_classes.rs`.)
///
/// `k`, `r`: the class and tokens of the step; `in_queue` as in `Req`; `c`: the class word the
/// borrower classified, whose floors (those of its `ctag`) it classified with, and, on
/// return, the word its class CAS replaced, whose `EPOCH` tells whether the step came before
/// an install's CAS of the tag (`moved`, "A borrower's step").
#[inline]
pub(super) fn class_step_after_reserve(
    shared: &Shared,
    k: usize,
    r: u64,
    in_queue: bool,
    c: &mut CWord,
    du: u64,
    dv: u64,
) -> Option<Resources> {
    let cw = &*shared.class_words[k];
    crate::sync::pause(crate::sync::PausePoint::BorrowReserved);
    match cw.compare_exchange_weak(c.0, c.0 + C_ONE + r, SeqCst, SeqCst) {
        // The amounts are those reserved: nothing to give back, and `c` is the word replaced.
        Ok(_) => Some(Resources {
            borrowed_concurrency: du == 1,
            borrowed_tokens: dv,
        }),
        Err(actual) => class_step_moved(shared, k, r, in_queue, c, CWord(actual), du, dv),
    }
}

/// [`class_step_after_reserve`] after its CAS expecting `c` found `a`: classifies `a`, and takes
/// the step on it (and on every later state its CAS finds), leaving in `c` the word it
/// replaced, or takes the reservation back.
///
/// The floors are read again here, from `c`'s `ctag` (the slot the borrower read them from:
/// the caller checked `c`'s `ctag` against the shared word's tag, and the grace-period
/// operation keeps that slot unchanged), so that the common path, whose CAS succeeds, does
/// not keep them or pass them through memory.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn class_step_moved(
    shared: &Shared,
    k: usize,
    r: u64,
    in_queue: bool,
    c: &mut CWord,
    mut a: CWord,
    du: u64,
    dv: u64,
) -> Option<Resources> {
    let l = &floors_of(shared, *c, k);
    let classified = *c;
    let cw = &*shared.class_words[k];
    loop {
        let (n, t) = (a.in_flight(), a.tokens());
        let du2 = u64::from(n >= l.pc);
        let dv2 = (t + r).max(l.pt) - t.max(l.pt);
        let ok = a.ctag() == classified.ctag()
            && l.mt.is_none_or(|mt| t + r <= mt)
            && l.mc.is_none_or(|m| n < m)
            && du2 <= du
            && dv2 <= dv;
        if !ok {
            // No class step happened: take the whole reservation back.
            let visit = shared_decrease(shared, -(du as i64), -(dv as i64));
            visit_queue(shared, visit, in_queue);
            return None;
        }
        match cw.compare_exchange_weak(a.0, a.0 + C_ONE + r, SeqCst, SeqCst) {
            Ok(_) => {
                // The word replaced, whose `EPOCH` an install may have set since the borrower
                // classified: the step must not pass for one taken before that install.
                if !moved_ignores_epoch_for_loom() {
                    *c = a;
                }
                let visit = shared_decrease(shared, du2 as i64 - du as i64, dv2 as i64 - dv as i64);
                visit_queue(shared, visit, in_queue);
                return Some(Resources {
                    borrowed_concurrency: du2 == 1,
                    borrowed_tokens: dv2,
                });
            }
            Err(actual) => a = CWord(actual),
        }
    }
}

/// Under loom, `LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH=1` makes [`class_step_moved`] leave the
/// classified word in `c` instead of the word its CAS replaced: the deliberately broken
/// variant on which a borrower that stepped on a word an install had marked since it
/// classified passes for one that stepped before the install.
#[inline(always)]
fn moved_ignores_epoch_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH")
}
