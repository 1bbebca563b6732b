//! A borrower's step on its class word, after its reservation on the shared word
//! (`super::moved`, "A borrower's step"): the CAS expecting the class state the borrower
//! classified, and, when the class word moved meanwhile, the step on the state it moved to,
//! or the reservation taken back.

use super::*;
use crate::protocol::backoff::Retry;

/// A borrower's class step, after it reserved `du` (0 or 1) and `dv` in the shared word for
/// class state `c`. If the class word moved meanwhile, the step is taken on the new state as
/// long as its own amounts are no larger than the reservation (the excess is given back after
/// the class step, a decrease), so a reservation is taken back only when the class now needs
/// more than was reserved or hit a ceiling, or migrated under a borrower not reserved whole
/// ([`class_step_moved`]). `None`: the reservation was taken back.
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
/// the step on it (and on every later state its CAS finds, each after a wait,
/// `super::backoff`), leaving in `c` the word it replaced, or takes the reservation back.
///
/// Each state is classified under the floors and ceilings of its own version (`ctag`), as
/// every class amount is (`super`, "The invariant"). A state on a later version than `c`'s
/// is a class an install migrated after the reservation: the migration accounted the class
/// under the new floors without this step, so the step's own amounts under those floors are
/// what it adds. A borrower reserved whole (its slot and all of its tokens,
/// [`super::moved::reserved_whole`]) steps on that state, and gives back after its step what
/// the new floors leave it not borrowing: its admission stands from its reservation (`moved`,
/// "A borrower's step"; the caller tells it from what it reserved, not from what the step
/// borrows), and the new version's ceilings hold for the class word it writes. Any other
/// borrower takes its reservation back there, as every borrower did before: stepped, it
/// would be decided again under the current tag, later, and taken back then if that refused
/// it (one set of alternated runs of `tests/spurious_refusals.rs` flagged more spurious
/// refusals so; that count is too noisy to settle it either way). Taking back the
/// reservation of a borrower reserved whole made every install that changed a class's
/// limits take back the reservation of each such borrower in flight: a tentative amount that
/// other refusals had counted (issue 26 §5; the take-backs of reservations held for more
/// than 20 µs in that test were mostly on migrations, half of them reserved whole). The
/// broken variant
/// `LLM_BULKHEAD_MIGRATED_RESERVATION_TAKEN_BACK=1` (feature `testing`) takes it back as
/// before: `moved::a_borrower_whose_class_migrated_refuses_no_one` fails. Under loom,
/// `LLM_BULKHEAD_LOOM_MIGRATED_OLD_FLOORS=1` classifies the migrated state under the floors the
/// borrower classified with, on which a raised floor leaves the step borrowing its slot and
/// nothing goes back: the shared word counts the slot twice,
/// `a_borrower_whose_class_migrates_between_its_two_steps` (`loom-tests/tests/classes.rs`)
/// fails.
///
/// The floors are read again here, from `c`'s `ctag` (the slot the borrower read them from:
/// the caller checked `c`'s `ctag` against the shared word's tag, and the grace-period
/// operation keeps that slot unchanged), so that the common path, whose CAS succeeds, does
/// not keep them or pass them through memory. A later version's entry was written before the
/// migration that this state shows, and is not rewritten while this operation is in progress
/// (`crate::grace`, "Class versions").
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
    let classified = *c;
    let own = floors_of(shared, classified, k);
    let cw = &*shared.class_words[k];
    let retry = Retry::new();
    loop {
        retry.wait();
        let migrated = a.ctag() != classified.ctag();
        let l = &if migrated && !old_floors_for_loom() {
            floors_of(shared, a, k)
        } else {
            own
        };
        let (n, t) = (a.in_flight(), a.tokens());
        let du2 = u64::from(n >= l.pc);
        let dv2 = (t + r).max(l.pt) - t.max(l.pt);
        // On a migrated word only a borrower reserved whole steps (its admission stands from
        // its reservation, whatever the new floors leave it borrowing); any other takes its
        // reservation back at once, as before.
        let stands = reserved_whole(du, dv, r);
        let ok = !(migrated && (!stands || takes_migrated_back_for_tests()))
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

/// The broken variant of the migrated borrower's regression (`tests/spurious_refusals.rs`,
/// `moved::a_borrower_whose_class_migrated_refuses_no_one`):
/// `LLM_BULKHEAD_MIGRATED_RESERVATION_TAKEN_BACK=1` (feature `testing`) takes the reservation
/// back whenever the class word migrated, as the protocol did before.
#[inline]
fn takes_migrated_back_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_MIGRATED_RESERVATION_TAKEN_BACK")
}

/// Under loom, `LLM_BULKHEAD_LOOM_MIGRATED_OLD_FLOORS=1` makes [`class_step_moved`] classify a
/// migrated class word under the floors the borrower classified with: the broken variant on
/// which the shared word keeps a raised floor's slot twice after the step
/// (`a_borrower_whose_class_migrates_between_its_two_steps`, `loom-tests/tests/classes.rs`).
#[inline(always)]
fn old_floors_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_MIGRATED_OLD_FLOORS")
}

/// Under loom, `LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH=1` makes [`class_step_moved`] leave the
/// classified word in `c` instead of the word its CAS replaced: the deliberately broken
/// variant on which a borrower that stepped on a word an install had marked since it
/// classified passes for one that stepped before the install.
#[inline(always)]
fn moved_ignores_epoch_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH")
}
