//! A protected step whose tag moved before it was validated (`super`, "Protected path, step
//! by step", step 4): the step is kept and decided again under the current tag, instead of
//! being taken back.
//!
//! # Why keep it
//!
//! Between its class CAS and its validating load, a protected step is in its class word, and
//! every other decider's collect counts it. An install that bumps the tag in that window used
//! to make the step go back and the demand decide again from fresh reads. If another demand
//! took the capacity in between, the demand was refused, and any refusal that had counted its
//! step while it stood (a slot in `G`, tokens in `T`) had been caused by capacity that no
//! admission ever held: a spurious refusal (issue 26 §5). `tests/spurious_refusals.rs`
//! attributed most of the spurious refusals it measured to such steps, taken back after a
//! tag move.
//!
//! Kept, the step becomes the admission whenever the current limits admit it, so what others
//! counted was an admission's. It is taken back only when they do not (a refusal the
//! demand's own collect then explains), or when the bulkhead closed or waiters queued.
//!
//! # Why it is sound
//!
//! The step is decided at a load of the shared word at tag `tag'`, exactly as a step taken
//! under `tag'` would be, with it already in its class word:
//!
//! * the class word is at the class's version under `tag'` (migrated, by helping if need be):
//!   the migration counted the step in the class's `n`, `t`, so the stored `U`, `V` bound the
//!   truth with the step in it (module docs of `super`, "The invariant");
//! * at that load `U ≤ max_concurrent` and `V ≤ eff` under `tag'`'s limits: rows 1 and 4–6
//!   hold with the step in, as for a protected step validated under its own tag;
//! * the class ceilings under `tag'` hold for the class word read before that load with the
//!   step in it; every later class CAS under `tag'` checked its own ceilings with this step
//!   already counted, and decreases only lower them, so they hold at the load too;
//! * the limits are read from the ring slot of `tag'` and count only because the shared word
//!   is still at `tag'` afterwards; the caller's grace-period operation keeps that slot and the
//!   class's floors entry from being rewritten meanwhile (`crate::grace`).
//!
//! The admission carries `tag'`'s revision, so after `apply_limits` returns no decision under
//! an older revision succeeds, as before. The attribution (borrowed slot, borrowed tokens) is
//! the one the class word read shows under `tag'`'s floors.
//!
//! The loop is bounded (`KEEP_TRIES`): each further try follows a tag move or a migration,
//! another operation's progress, so the decision stays lock-free.
//!
//! # Tests
//!
//! * `tests/spurious_refusals.rs` (`moved::a_step_kept_across_an_install_refuses_no_one`) is
//!   the regression: an install lands between a protected step and its validation, another
//!   demand meets the step, and the step must become an admission. Its broken variant
//!   `LLM_BULKHEAD_UNDO_MOVED_STEP=1` (feature `testing`) takes the step back as before.
//! * The loom model `protected_admission_against_the_kill_switch` (`loom-tests/tests/
//!   classes.rs`) reaches this path whenever the install lands inside the step's window, and
//!   the kill switch admits nothing: its broken variant `LLM_BULKHEAD_LOOM_KEEP_UNCHECKED=1`
//!   keeps the step without deciding it, an admission under the kill switch's revision.
//!
//! `.ci/run` requires both to fail on their broken variants.

use super::*;

/// How often a kept step follows a tag move or a migration before it is taken back.
const KEEP_TRIES: u32 = 4;

/// A protected step of one slot and `r` tokens in class `k`, taken under a tag that moved
/// before its validation: an admission under the current tag when its limits admit the step
/// as it stands, `None` after taking it back otherwise (module docs). Out of line and cold:
/// it runs only when an install lands inside a step's window.
#[cold]
#[inline(never)]
pub(super) fn keep_after_tag_moved(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    in_queue: bool,
) -> Option<Admitted> {
    if undoes_moved_steps_for_tests() {
        undo(shared, k, r, in_queue);
        return None;
    }
    let word = &*shared.word;
    let cw = &*shared.class_words[k];
    for _ in 0..KEEP_TRIES {
        let g = GWord(word.load(SeqCst));
        if g.closed() || (g.waiters() && !in_queue) {
            break;
        }
        let lim = shared.ring.read(g.tag());
        let (ver, l) = shared.ring.read_class_versioned(g.tag(), k);
        let c = CWord(cw.load(SeqCst));
        if c.ctag() != ver {
            // Migrating moves the step along with the rest of the class's accounting.
            help_migrate(shared, k, c, in_queue);
            continue;
        }
        // Under loom, `LLM_BULKHEAD_LOOM_KEEP_UNCHECKED=1` keeps every moved step without
        // deciding it: the broken variant the kill-switch model of `loom-tests/tests/
        // classes.rs` is shown to fail on (an admission under the kill switch's revision).
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_KEEP_UNCHECKED") {
            return Some(Admitted {
                revision: lim.revision,
                resources: Resources::default(),
            });
        }
        // The step is in `n`, `t`.
        let (n, t) = (c.in_flight(), c.tokens());
        debug_assert!(n >= 1 && t >= r, "a kept step is in its class word: {c:?}");
        let within_ceilings = l.mc.is_none_or(|m| n <= m) && l.mt.is_none_or(|mt| t <= mt);
        let eff = lim.effective(priority);
        let g2 = GWord(word.load(SeqCst));
        if g2.tag() != g.tag() {
            continue;
        }
        if within_ceilings
            && !g2.closed()
            && (in_queue || !g2.waiters())
            && g2.u() <= lim.max_concurrent
            && eff.is_none_or(|e| g2.v() <= e)
        {
            return Some(Admitted {
                revision: lim.revision,
                resources: Resources {
                    borrowed_concurrency: n > l.pc,
                    borrowed_tokens: t.max(l.pt) - (t - r).max(l.pt),
                },
            });
        }
        break;
    }
    undo(shared, k, r, in_queue);
    None
}

/// The fast attempt's protected step of one slot and `r` tokens in class `k`, taken under
/// `tag`, whose validating load found `g2`, which does not admit it: kept and decided again if
/// only the tag moved ([`keep_after_tag_moved`]), taken back otherwise. `Err(None)`: taken
/// back, the full protocol decides. One out-of-line call on the fast attempt's failure path,
/// where the undo alone was before. In `benches/instructions.rs` the pairs went from 348 and
/// 386 instructions to 351 and 387, the ceiling refusal from 178 to 190 and the refusal at the
/// shared remainder from 466 to 483 (the inlined attempt's frame grew). The variants tried
/// cost more: a check inline on that path cost the pairs 4 to 7; returning the revision in a
/// register instead of this result kept the ceiling refusal at 179 but cost the pairs 19.
#[inline(never)]
pub(super) fn protected_step_missed(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    tag: usize,
    g2: GWord,
) -> Result<Admitted, Option<Stopped>> {
    if g2.tag() != tag && !g2.closed() {
        return keep_after_tag_moved(shared, k, r, priority, false).ok_or(None);
    }
    undo(shared, k, r, false);
    Err(None)
}

/// The broken variant of the regression (module docs): `LLM_BULKHEAD_UNDO_MOVED_STEP=1`
/// (feature `testing` only) takes every moved step back, as the protocol did before.
#[inline]
fn undoes_moved_steps_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_UNDO_MOVED_STEP")
}
