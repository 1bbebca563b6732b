//! A class step whose tag moved before it was decided: a protected step between its class
//! CAS and its validating load (`super`, "Protected path, step by step", step 4), the
//! collect-checked path's step between its class CAS and the load after its collect
//! (`super::slow`), or a borrower's step whose class CAS came after an install that followed
//! its reservation ("A borrower's step" below). The step is kept and decided again under the
//! current tag, instead of being taken back (or, for a borrower, admitted unchecked).
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
//! The collect-checked path's step is kept for the same reason. A thread preempted between
//! that step and its collect's last load stays stopped for a scheduler quantum, during which
//! hundreds of installs move the tag; taken back then, its step had refused others for the
//! whole quantum. `tests/spurious_refusals.rs` found bursts of thousands of such refusals in
//! one run (3,600 in the run examined, all while one such step stood for about 4 ms and was
//! then taken back).
//!
//! # A borrower's step
//!
//! A borrower reserves its amounts on the shared word, under the tag it read (the CAS
//! compares the whole word), and then takes its step on its class word. An install can come
//! in between: the reservation was checked under the old limits, and a decider under the new
//! tag that decides from a collect (the collect-checked path, or the exact check below) does
//! not see the step, which is not in its class word yet. Both were admitted:
//! `tests/borrow_overtaken.rs` held three admissions under `max_concurrent` 2, after an
//! install raised a floor (the stored `U` then passes `max_concurrent`, so a protected demand
//! of that class goes to the collect-checked path, whose collect missed the borrower's step;
//! with the borrower's revision from before the install that had returned).
//!
//! So a borrower reads the tag again after its class CAS. The same tag means no install came
//! between its reservation and its step (no tag comes back during an operation): its
//! admission stands as decided at the reservation, and every decider under a later tag
//! collects after the step. Another tag: the step is kept and decided again under the current
//! tag ([`borrow_overtaken`]), exactly as a protected step overtaken by an install, and a
//! decider that collected before the step is seen by this decision's collect (its class CAS
//! came before this step's). One load on the borrowing path: of the tag the latest install
//! announced (`Shared::announced`, stored before that install's CAS of the tag, on a line
//! only installs write), not of the state word, which the other borrowers of a contended
//! class write on every pair. Its reservation's tag there means that no install's CAS came
//! before the load, and so none between the reservation and the step ([`borrow_unsettled`]).
//! With the state word's tag, two threads borrowing in one class measured 186 ns a pair
//! against 150 without the load; with the announced tag, 153 (`benches/core.rs`, alternated
//! runs). The loom models `a_borrower_overtaken_by_a_floor_raise` and
//! `a_borrower_overtaken_while_the_install_is_in_progress` fail with
//! `LLM_BULKHEAD_LOOM_NO_ANNOUNCE=1`, whose install does not announce.
//!
//! A borrower **reserved whole** (its slot and all of its tokens borrowed, [`fully_reserved`])
//! needs no such load: every decider counts it from its reservation on. A decider on the
//! fast paths checks the stored `U`, `V`, which hold the reservation (an install carries
//! them over); an exact check adds to its collect what the stored word holds beyond it
//! ("Steps in flight" below), which holds the reservation until the class step lands, and
//! the class word holds it after. What an install overtaking it could break is only what
//! the reservation does not hold: a slot inside the class's floor (the over-admission of
//! `tests/borrow_overtaken.rs` above) or tokens inside its token floor. So its admission
//! stands from its reservation, decided under the tag it was made at, before the install's
//! CAS of the tag. Its class step is taken on whatever state the class word moved to, as
//! long as the class's ceilings allow it (`super::reserve`), also a state an install
//! migrated meanwhile, classified under the new version's floors and ceilings (what those
//! leave it not borrowing goes back to the shared word after its step; it stands from its
//! reservation all the same, which its caller tells from the amounts it reserved,
//! [`reserved_whole`]). Decided again, such a borrower preempted between its two steps was
//! taken back a scheduler quantum later, when the installs in between made the limits in
//! force refuse it, and every refusal that had counted it meanwhile was spurious (issue 26
//! §5). The broken variant
//! `LLM_BULKHEAD_RESERVED_DECIDED_AGAIN=1` (feature `testing`) decides it again:
//! `moved::a_reserved_borrower_overtaken_refuses_no_one` (`tests/spurious_refusals.rs`) fails.
//! The slot borrower's regression of `tests/borrow_overtaken.rs` now fails with
//! `LLM_BULKHEAD_EXACT_IGNORES_STORED=1` alone: the excess is what counts that borrower.
//!
//! Another tag does not always mean the install came before the step: a borrower preempted
//! between its class CAS and that load finds the install there, although its step came
//! first. Decided again under limits that then refuse it, it was taken back after standing
//! for a scheduler quantum, and every refusal that had counted it meanwhile was spurious
//! (issue 26 §5; `tests/spurious_refusals.rs` attributed bursts of thousands to such
//! borrowers, 4 to 8 ms between their class CAS and their take-back). For a borrower not
//! reserved whole (its slot inside its floor), the words carry the
//! install's mark: every install sets each class word's `EPOCH` to its new tag's parity after
//! announcing the tag and before its CAS of it (`crate::protocol::install::set_epochs`). A
//! borrower whose class CAS replaced a word with its reservation tag's parity, and which then
//! loads the next tag as the announced one, stepped before that install wrote its class word,
//! so before the CAS of the tag, and no later install had written an `EPOCH` yet
//! ([`stepped_before_the_install`]). That is the case above, of the same tag: its admission
//! stands under its reservation's revision, decided before the install's CAS of the tag, as
//! the CAS of a decision without classes that returns after `apply_limits` does. A borrower
//! whose class CAS meets the install's write fails once, and its retry (`super::reserve`)
//! steps on the marked word and reports it as the word its CAS replaced, so the step is
//! decided again. (Taking the reservation back there instead would make every install take
//! back the reservation of each borrower in flight, a tentative amount that other refusals
//! may have counted.) A borrower with
//! tokens inside its floor is decided again as before: that part needs `V ≤ eff` at a load
//! under its tag. The broken variants: `LLM_BULKHEAD_NO_EPOCH_FLIP=1` (feature `testing`) and, under loom,
//! `LLM_BULKHEAD_LOOM_NO_EPOCH_FLIP=1` (the install leaves the words alone: an overtaken
//! borrower reads the old parity and is admitted unchecked), and
//! `LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH=1` (the retry reports the word it classified, not
//! the marked one it replaced):
//! `tests/borrow_overtaken.rs` and both overtaken-borrower models fail on them. The
//! regression, `moved::a_borrower_stepped_before_an_install_refuses_no_one`
//! (`tests/spurious_refusals.rs`), fails with `LLM_BULKHEAD_BORROW_IGNORES_EPOCH=1`, which
//! decides every such borrower again, as before.
//!
//! A borrower with tokens inside its class's token floor ("Steps in flight" below) loads the
//! state word instead, which also shows `V`: that part was reserved by no one, so it is a
//! protected step's tokens, and it stands, as they do, only if the stored `V` is within the
//! budget at that load. Otherwise the step is kept and decided again ([`borrow_overtaken`]), whose
//! exact check sees every step that a collect-checked decider before it took: the slot
//! borrower with its tokens inside its floor is decided by that collect, the borrower that
//! straddles its floor is taken back (its borrowed part, on a stored `V` past the budget,
//! refuses it). A borrower with no tokens inside its floor does not check `V` there: its
//! reservation decided all of its tokens. The broken variants
//! `LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED=1` and, under loom,
//! `LLM_BULKHEAD_LOOM_BORROW_FLOOR_UNVALIDATED=1` skip that check
//! (`a_borrower_inside_its_token_floor_while_usage_grows`).
//!
//! The regressions of the install between the two steps fail with
//! `LLM_BULKHEAD_BORROW_UNVALIDATED=1`, which admits the step without deciding it again, and
//! the loom model `a_borrower_overtaken_by_a_floor_raise` (`loom-tests/tests/classes.rs`)
//! with `LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1` (under loom the load needs its `SeqCst`
//! fence, `crate::sync::loom_sc_fence`: without it the model found three admissions).
//!
//! # Decided exactly
//!
//! The stored `U`, `V` may not admit a kept step that the current limits admit: an install
//! that raised a floor adds its advance to `U` until the class migrates, and the
//! collect-checked path is taken precisely when `U > max_concurrent` or `V > eff`. So a kind
//! (slot, tokens) that the stored word does not admit is decided as the collect-checked path
//! decides its own step ([`exact_fits`]), when the step borrows nothing of that kind under the
//! current floors: a collect of every class word after the step's `SeqCst` CAS must show
//! `G ≤ max_concurrent` (row 6) or `T ≤ eff` (row 1), each raised by what the stored word
//! holds beyond the collect ("Steps in flight" below), with the shared word still at the tag,
//! open. Rows 4 and 5 do not apply to a kind the step does not borrow. A kind it borrows is
//! decided by the stored word alone, as before (so rows 4 and 5 hold by it).
//!
//! Sound for the collect-checked path's reason (`super`, "Rare paths"): of two deciders that
//! check a collect after their own step, the one whose CAS is later in the `SeqCst` order
//! sees the other's step; a decider on the fast paths checks the stored amounts, which count
//! the kept step (it is in its class word, and the stored values bound the truth with every
//! class-word increment in it).
//!
//! # Steps in flight
//!
//! A collect does not show a borrower between its reservation and its class step, whose
//! admission counts from the reservation on. Decided on the collect alone, the exact check
//! (here and in `super::slow`) admitted past the budget: `tests/borrow_overtaken.rs`,
//! `a_token_borrower_in_flight_while_usage_grows_is_counted` (a usage report grew the tokens
//! held past the budget while a borrower of 20 tokens was in flight; a demand inside its
//! floors was admitted on the collect, and the borrower's step landed: 40 tokens past the
//! budget). So [`exact_totals`] adds to `G` and `T` what the stored word holds beyond the
//! collect's own accounting (`U − Σ max(n_j, pc_j)`, `V − Σ max(t_j, pt_j)`, each word under
//! the floors of its own version), read after the collect: every reservation whose step the
//! collect missed is in it (with the decreases still owed and the advance of an install still
//! migrating, which make the check stricter, never looser). The loom model
//! `a_borrower_in_flight_while_usage_grows` fails without it
//! (`LLM_BULKHEAD_LOOM_EXACT_IGNORES_STORED=1`).
//!
//! A change between the collect and that load keeps the bound: a release there is still
//! counted by the collect and lowers the excess by at most what it returned; a reservation
//! there raises the excess.
//!
//! The part of a borrower's tokens that falls inside its class's token floor is reserved
//! nowhere (the floor already counts it in `V`), so the excess does not show it, and a
//! collect that misses the step undercounts `T` by that part. `tests/borrow_overtaken.rs`
//! reproduced it for a borrower straddling its floor (20 of its 25 tokens inside it) and for
//! a slot borrower whose tokens were all inside it: a usage report grew another hold past the
//! budget meanwhile, a demand inside another class's floor was admitted on the collect, and
//! the borrower's step landed, 110 and 105 tokens held under a budget of 100. That part is
//! now checked as a protected step's tokens are: on the borrower's load after its class CAS
//! ("A borrower's step" above).
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
//!   hold with the step in, as for a protected step validated under its own tag (or, for a
//!   kind the step does not borrow, the exact check of "Decided exactly" above holds);
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
//! * `tests/spurious_refusals.rs` (`moved::a_step_kept_across_an_install_refuses_no_one`,
//!   and `moved::a_slow_step_kept_across_an_install_refuses_no_one` for the collect-checked
//!   path's step) are the regressions: an install lands between a step and its decision,
//!   another demand meets the step, and the step must become an admission. Their broken
//!   variant `LLM_BULKHEAD_UNDO_MOVED_STEP=1` (feature `testing`) takes the step back as
//!   before.
//! * `moved::a_kept_step_the_collect_refuses_is_taken_back` (same file) checks the exact
//!   check: its broken variant `LLM_BULKHEAD_KEEP_EXACT_UNCHECKED=1` skips it, and a kept
//!   step is admitted past a budget an install lowered.
//! * The loom model `protected_admission_against_the_kill_switch` (`loom-tests/tests/
//!   classes.rs`) reaches this path whenever the install lands inside the step's window, and
//!   the kill switch admits nothing: its broken variant `LLM_BULKHEAD_LOOM_KEEP_UNCHECKED=1`
//!   keeps the step without deciding it, an admission under the kill switch's revision.
//!
//! `.ci/run` requires each to fail on its broken variant.

use super::*;

/// How often a kept step follows a tag move or a migration before it is taken back.
const KEEP_TRIES: u32 = 4;

/// A step of one slot and `r` tokens in class `k` (protected, or the collect-checked path's),
/// taken under a tag that moved before it was decided: an admission under the current tag
/// when its limits admit the step as it stands, `None` after taking it back otherwise (module
/// docs). Out of line and cold: it runs only when an install lands inside a step's window.
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
        let mc = lim.max_concurrent;
        let g2 = GWord(word.load(SeqCst));
        if g2.tag() != g.tag() {
            continue;
        }
        if !within_ceilings || g2.closed() || (g2.waiters() && !in_queue) {
            break;
        }
        let borrowed_tokens = t.max(l.pt) - (t - r).max(l.pt);
        let admitted = Some(Admitted {
            revision: lim.revision,
            resources: Resources {
                borrowed_concurrency: n > l.pc,
                borrowed_tokens,
            },
        });
        // Each kind (slot, tokens) holds by the stored word, which bounds the truth, or,
        // for a kind the step does not borrow under these floors, by an exact collect.
        let slot_stored = g2.u() <= mc;
        let tokens_stored = eff.is_none_or(|e| g2.v() <= e);
        if slot_stored && tokens_stored {
            return admitted;
        }
        let slot_protected = n <= l.pc;
        let tokens_protected = borrowed_tokens == 0;
        if (slot_stored || slot_protected)
            && (tokens_stored || tokens_protected)
            && exact_fits(
                shared,
                g.tag(),
                mc,
                eff,
                slot_stored,
                tokens_stored,
                in_queue,
            )
        {
            return admitted;
        }
        break;
    }
    undo(shared, k, r, in_queue);
    None
}

/// Rows 6 and 1 for a kept step that its stored word does not admit and that borrows
/// nothing of the kind it fails (module docs, "Decided exactly"): a collect of every class
/// word, after the step's own `SeqCst` CAS, raised by the stored word's excess over it
/// ([`exact_totals`]), must show `G ≤ max_concurrent` (unless `slot_stored`: the stored `U`
/// already bounds it) and `T ≤ eff` (unless `tokens_stored`),
/// and the shared word must still be at `tag`, open, and without waiters unless `in_queue`.
/// The collect-checked path's own check (`super::slow`), for a step already taken.
#[inline(never)]
fn exact_fits(
    shared: &Shared,
    tag: usize,
    mc: u64,
    eff: Option<u64>,
    slot_stored: bool,
    tokens_stored: bool,
    in_queue: bool,
) -> bool {
    crate::sync::loom_sc_fence();
    let (g3, g_all, t_all) = exact_totals(shared);
    if g3.tag() != tag || g3.closed() || (g3.waiters() && !in_queue) {
        return false;
    }
    if skips_exact_check_for_tests() {
        return true;
    }
    (slot_stored || g_all <= mc) && (tokens_stored || eff.is_none_or(|e| t_all <= e))
}

/// What an exact check decides on (module docs, "Steps in flight"): a collect of every class
/// word, then the shared word `g3` (returned), and `G`, `T` of the collect each raised by what
/// the stored word holds beyond the collect's own accounting (`U − Σ max(n_j, pc_j)`,
/// `V − Σ max(t_j, pt_j)`, under each word's own floors): a borrower's reservation whose
/// class step the collect does not show yet is there.
pub(super) fn exact_totals(shared: &Shared) -> (GWord, u64, u64) {
    let (mut g, mut t, mut acc_u, mut acc_v) = (0, 0, 0, 0);
    for (k, w) in shared.class_words.iter().enumerate() {
        let c = CWord(w.load(SeqCst));
        let l = floors_of(shared, c, k);
        let (n, tk) = (c.in_flight(), c.tokens());
        g += n;
        t += tk;
        acc_u += n.max(l.pc);
        acc_v += tk.max(l.pt);
    }
    let g3 = GWord(shared.word.load(SeqCst));
    // Under loom, `LLM_BULKHEAD_LOOM_EXACT_IGNORES_STORED=1` is the same broken variant: the
    // model `a_borrower_in_flight_while_usage_grows` (`loom-tests/tests/classes.rs`) fails.
    #[cfg(loom)]
    let ignores = crate::sync::broken_variant("LLM_BULKHEAD_LOOM_EXACT_IGNORES_STORED");
    #[cfg(not(loom))]
    let ignores = false;
    if ignores || ignores_stored_excess_for_tests() {
        return (g3, g, t);
    }
    (
        g3,
        g + g3.u().saturating_sub(acc_u),
        t + g3.v().saturating_sub(acc_v),
    )
}

/// The broken variant of the pending borrower's regression (`tests/borrow_overtaken.rs`,
/// `a_token_borrower_in_flight_while_usage_grows_is_counted`):
/// `LLM_BULKHEAD_EXACT_IGNORES_STORED=1` (feature `testing`) decides an exact check on the
/// collect alone, as the protocol did before.
#[inline]
fn ignores_stored_excess_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_EXACT_IGNORES_STORED")
}

/// The broken variant of the exact check's regression (`tests/spurious_refusals.rs`,
/// `moved::a_kept_step_the_collect_refuses_is_taken_back`): `LLM_BULKHEAD_KEEP_EXACT_UNCHECKED=1`
/// (feature `testing`) keeps a step the stored word does not admit without the collect's
/// check, an admission past the budget.
#[inline]
fn skips_exact_check_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_KEEP_EXACT_UNCHECKED")
}

/// A borrower's step (with the `resources` it borrowed), whose load after its class CAS found
/// another tag than the one its reservation on the shared word was made under (an install
/// came in between), or, for a step with tokens inside its class's token floor, a stored `V`
/// past the budget. Its admission stands under its reservation's `revision` when its class
/// CAS came before the install's CAS of the tag ([`stepped_before_the_install`]); otherwise
/// it is kept and decided again under the current tag ([`keep_after_tag_moved`]), taken back
/// if that refuses it. See "A borrower's step" in the module docs. Out of line and cold.
///
/// `k`, `r`, `priority`, `in_queue`: the demand; `tag`: its reservation's tag; `c`: the class
/// word its class CAS replaced (`super::reserve::class_step_after_reserve`). Plain
/// arguments: a structure or a tuple built on the pairs' inlined path cost them 10
/// instructions (`benches/instructions.rs`).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn borrow_overtaken(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    in_queue: bool,
    tag: usize,
    c: CWord,
    revision: u64,
    resources: Resources,
) -> Option<Admitted> {
    // Under loom, `LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1` is the same broken variant: the
    // model `a_borrower_overtaken_by_a_floor_raise` (`loom-tests/tests/classes.rs`) fails on it.
    #[cfg(loom)]
    let unvalidated = crate::sync::broken_variant("LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED");
    #[cfg(not(loom))]
    let unvalidated = false;
    if unvalidated
        || admits_overtaken_borrows_for_tests()
        || (!floor_part_checked(resources, r) && stepped_before_the_install(shared, tag, c))
    {
        return Some(Admitted {
            revision,
            resources,
        });
    }
    keep_after_tag_moved(shared, k, r, priority, in_queue)
}

/// Whether a borrower's class step, which found an install announced, came before that
/// install's CAS of the tag (module docs, "A borrower's step"): its class CAS replaced a
/// word with its reservation tag's `EPOCH`, and, loaded now, after that CAS, the announced
/// tag is the next one. The install sets every class word's `EPOCH` to the next tag's parity
/// after announcing it and before its CAS of the tag (`crate::protocol::install`), so the
/// step's CAS came before that write, and so before the CAS of the tag; and no later install
/// had announced, so none had written an `EPOCH` before the step. The broken variant
/// `LLM_BULKHEAD_BORROW_IGNORES_EPOCH=1` (feature `testing`) answers `false`, as the protocol
/// did before: `tests/spurious_refusals.rs`, `moved::a_borrower_stepped_before_an_install_refuses_no_one`.
#[inline(never)]
fn stepped_before_the_install(shared: &Shared, tag: usize, c: CWord) -> bool {
    if test_switch!("LLM_BULKHEAD_BORROW_IGNORES_EPOCH") {
        return false;
    }
    if c.epoch() != epoch_of(tag) {
        return false;
    }
    crate::sync::loom_sc_fence();
    let next = crate::words::state::tag_of(tag.wrapping_add(1));
    shared.announced.load(SeqCst) == next
}

/// Whether a borrower's step under `tag`, admitted with `resources` for a demand of `r`
/// tokens at the effective budget `eff`, must be decided again ([`borrow_overtaken`]): one
/// `SeqCst` load after its class CAS (module docs, "A borrower's step"). A step with tokens
/// inside its class's token floor ([`floor_part_checked`]) loads the state word, whose tag
/// and `V` it checks. Any other loads the tag the latest install announced
/// (`Shared::announced`, stored before that install's CAS of the tag), on a line only
/// installs write: the state word, which the other borrowers of a contended class write on
/// every pair, would cost a line transfer here. Its reservation's tag there means that no
/// install's CAS of the tag came before this load, so none came between the reservation and
/// the step; another means one may have, and the step is decided again. A step reserved
/// whole (`whole`, [`fully_reserved`]) loads nothing: it stands.
#[inline(always)]
pub(super) fn borrow_unsettled(
    shared: &Shared,
    tag: usize,
    eff: u64,
    resources: Resources,
    r: u64,
    whole: bool,
) -> bool {
    if fully_reserved(whole) {
        false
    } else if floor_part_checked(resources, r) {
        let g2 = GWord(shared.word.load(SeqCst));
        g2.tag() != tag || g2.v() > eff
    } else {
        shared.announced.load(SeqCst) != tag
    }
}

/// Whether a borrower's step was reserved whole on the shared word (`whole`: its reservation
/// was a slot and all of its tokens, module docs, "A borrower's step"). Its admission then
/// stands from the reservation on, whatever install came before its class step, and also
/// when its class step, on a class word that moved or migrated meanwhile, borrows less and
/// gave the rest back (`super::reserve`): the reservation counted all of it until then. The
/// broken variant `LLM_BULKHEAD_RESERVED_DECIDED_AGAIN=1` (feature `testing`) decides it again as any
/// other borrower, as the protocol did before: `tests/spurious_refusals.rs`,
/// `moved::a_reserved_borrower_overtaken_refuses_no_one`.
#[inline(always)]
pub(super) fn fully_reserved(whole: bool) -> bool {
    whole && !test_switch!("LLM_BULKHEAD_RESERVED_DECIDED_AGAIN")
}

/// Whether a reservation of `du` slots and `dv` tokens for a demand of `r` tokens holds the
/// whole demand: a slot and all of its tokens ([`fully_reserved`]).
#[inline(always)]
pub(super) fn reserved_whole(du: u64, dv: u64, r: u64) -> bool {
    du == 1 && dv == r
}

/// Whether a borrower's step, admitted with `resources` for a demand of `r` tokens, holds
/// tokens inside its class's token floor (it borrowed fewer than `r`, and there is a budget): that part is in the
/// stored `V` only as the floor, reserved by no one, so a collect that misses the step misses
/// it, and it is checked as a protected step's tokens are, on the load after the class CAS
/// (module docs, "A borrower's step"). The broken variant `LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED=1`
/// (feature `testing`) skips that check, as the protocol did before: `tests/
/// borrow_overtaken.rs` then admits past the budget.
#[inline(always)]
fn floor_part_checked(resources: Resources, r: u64) -> bool {
    #[cfg(loom)]
    if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_BORROW_FLOOR_UNVALIDATED") {
        return false;
    }
    resources.borrowed_tokens != r && !test_switch!("LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED")
}

/// The broken variant of the overtaken borrower's regression (`tests/borrow_overtaken.rs`):
/// `LLM_BULKHEAD_BORROW_UNVALIDATED=1` (feature `testing`) admits a borrower's step whatever
/// install came between its reservation and its class CAS, as the protocol did before.
#[inline]
fn admits_overtaken_borrows_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_BORROW_UNVALIDATED")
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
