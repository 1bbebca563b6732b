//! Installing a limits snapshot (`Bulkhead::apply_limits` and the calls built on it): the
//! protocol step of a reconfiguration, for both protocols. The handle validates the snapshot
//! and holds the reconfiguration lock; this module changes the words:
//!
//! 0. wait out the grace period (`crate::grace`): no operation of this bulkhead that may hold
//!    a count a whole tag period older than the next tag is still in progress, so no tag value
//!    or ring slot is reused under anyone;
//! 1. write the snapshot into the ring slot of the next tag (`crate::words::limits`), after the
//!    new limits of each class whose limits change into that class's floors table, under its
//!    next version (a class whose limits stay keeps its version and its class word);
//! 2. announce the next tag (`Shared::announced`, a `SeqCst` store), with classes set every
//!    class word's `EPOCH` to the next tag's parity ([`set_epochs`]), then bump the state
//!    word's tag with one `SeqCst` CAS, which, with classes, also advances `U` and `V` by
//!    every raise of a floor (`crate::words::class_word::floor_advance`);
//! 3. migrate every class word whose limits changed to its new version and floors
//!    (`crate::protocol::classed`, "Reconfiguration").
//!
//! After the lock is released, [`after_install`] answers waiters that can no longer fit
//! (token waiting) and pumps the queue, since a raised limit admits queued waiters at once
//! (CONTRACT.md §6).

use crate::shared::{Canonical, Shared};
use crate::sync::Ordering;
use crate::words::limits::LimitsSnapshot;
use crate::words::state::Word;

/// Steps 0–3 of the module docs for `next` (validated, with this bulkhead's class table), under
/// the reconfiguration lock whose content is `canon`. Returns whether a class migration asks
/// for a visit of the queue (pass it to [`after_install`]). `canon.current` is left as it was:
/// the caller replaces it (and keeps the previous snapshot for its report).
///
/// # Panics
/// As `crate::grace::before_install` (a kernel barrier failing after registration); no input
/// reaches it.
pub(crate) fn install(shared: &Shared, canon: &mut Canonical, next: &LimitsSnapshot) -> bool {
    let tag = canon.tag.wrapping_add(1);
    // The classes whose limits change move to their next version; the others keep theirs
    // (and their class words are left alone).
    let (old, new) = (canon.current.classes, next.classes);
    let changed = |k: usize| match (old.iter().nth(k), new.iter().nth(k)) {
        (Some(a), Some(b)) if floors_only_for_loom() => {
            (a.protected_concurrent, a.protected_tokens)
                != (b.protected_concurrent, b.protected_tokens)
        }
        (Some(a), Some(b)) => a != b,
        _ => false,
    };
    let versions = canon.periods.next_versions(changed);
    before_install(shared, canon, tag);
    // Readers of the published limits see the ring, the tag and the class words change
    // together with the copy they read (and wait for nothing else).
    let mut published = crate::sync::lock(&shared.published);
    for (k, c) in next.classes.iter().enumerate() {
        if changed(k) {
            shared.ring.write_floors(k, versions[k], c);
        }
    }
    shared.ring.write(tag, next, &versions);
    let advance = if shared.classed {
        crate::words::class_word::floor_advance(&canon.current, next)
    } else {
        0
    };
    let word = &*shared.word;
    // Announced before the tag moves, in the `SeqCst` order: a borrower that loads this
    // after its class step and finds its reservation's tag knows the tag had not moved by
    // then (`crate::protocol::classed`, `moved`, "A borrower's step").
    if !skips_announce_for_loom() {
        shared
            .announced
            .store(crate::words::state::tag_of(tag), Ordering::SeqCst);
        crate::sync::loom_sc_fence();
    }
    if shared.classed {
        set_epochs(shared, tag);
    }
    let mut w = Word(word.load(Ordering::Acquire));
    loop {
        debug_assert_eq!(w.tag(), crate::words::state::tag_of(canon.tag));
        match word.compare_exchange_weak(
            w.0,
            w.with_next_tag().0 + advance,
            Ordering::SeqCst,
            Ordering::Acquire,
        ) {
            Ok(_) => break,
            Err(actual) => w = Word(actual),
        }
    }
    canon.tag = tag;
    canon.periods.commit_versions(changed);
    crate::sync::pause(crate::sync::PausePoint::InstallMigrating);
    let mut visit = false;
    for k in 0..shared.class_words.len() {
        visit |= crate::protocol::classed::migrate(shared, k, tag);
    }
    *published = *next;
    visit
}

/// Step 2's middle: sets every class word's `EPOCH` to the parity of `tag`, after the
/// announcement and before the CAS of the tag, one `SeqCst` read-modify-write each. A
/// borrower whose class CAS replaced a word of the old parity then knows its step came before
/// this install's CAS of the tag (`crate::protocol::classed`, `moved`, "A borrower's step").
/// The deciders whose class CAS meets it fail once and read the word again.
///
/// `LLM_BULKHEAD_NO_EPOCH_FLIP=1` (feature `testing`) and, under loom,
/// `LLM_BULKHEAD_LOOM_NO_EPOCH_FLIP=1` leave the words alone: the deliberately broken
/// variant on which a borrower overtaken before its class step reads the old parity and is
/// admitted unchecked (`tests/borrow_overtaken.rs`, and the overtaken-borrower models of
/// `loom-tests/tests/classes.rs`).
fn set_epochs(shared: &Shared, tag: usize) {
    use crate::words::class_word::{epoch_of, C_EPOCH};
    if crate::sync::test_switch!("LLM_BULKHEAD_NO_EPOCH_FLIP")
        || crate::sync::loom_broken("LLM_BULKHEAD_LOOM_NO_EPOCH_FLIP")
    {
        return;
    }
    for cw in shared.class_words.iter() {
        let before = if epoch_of(tag) == C_EPOCH {
            cw.fetch_or(C_EPOCH, Ordering::SeqCst)
        } else {
            cw.fetch_and(!C_EPOCH, Ordering::SeqCst)
        };
        // Every other writer keeps the mark: each word still carries the previous install's.
        debug_assert_eq!(
            before & C_EPOCH,
            epoch_of(tag.wrapping_sub(1)),
            "a class word lost its install mark"
        );
    }
}

/// Under loom, `LLM_BULKHEAD_LOOM_NO_ANNOUNCE=1` moves the tag without announcing it: the
/// deliberately broken variant the models `a_borrower_overtaken_by_a_floor_raise` and
/// `a_borrower_overtaken_while_the_install_is_in_progress` (`loom-tests/tests/classes.rs`) are
/// shown to fail on (a borrower whose reservation the install overtook finds its own tag
/// announced and is admitted unchecked).
#[inline]
fn skips_announce_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_NO_ANNOUNCE")
}

/// Under loom, `LLM_BULKHEAD_LOOM_CLASS_VERSION_FLOORS_ONLY=1` gives a class a new version only
/// when its floors change, not its ceilings: the deliberately broken variant the tag-wrap model
/// `a_borrower_never_lands_past_a_lowered_class_ceiling` is shown to fail on (a borrower that
/// reserved before the install lands its class step on the unchanged word after it).
#[inline]
fn floors_only_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_CLASS_VERSION_FLOORS_ONLY")
}

/// The grace period of install `tag` (`crate::grace`): before the ring slot of `tag` is written
/// and the tag bumped, waits for every operation of this bulkhead that may still hold a count a
/// whole tag period older, whether it is marked in the process-wide cells or in this
/// bulkhead's counters entries (`crate::grace::enter_decision`).
fn before_install(shared: &Shared, canon: &mut Canonical, tag: usize) {
    use crate::grace::Kind;
    let counters = &shared.counters;
    let own_decisions = counters.local(crate::record::stats::Counters::new).reader();
    let own = crate::grace::reader();
    crate::grace::before_install(
        &mut canon.periods,
        shared.grace_id,
        tag as u64,
        1 << crate::words::state::TAG_BITS,
        &[own, own_decisions],
        |f| {
            crate::sync::per_thread::for_each(&mut |r| f(r, Kind::Cell));
            if !crate::grace::skip_decision_markers_for_loom() {
                counters.for_each(|c| c.for_each_reader(&mut |r| f(r, Kind::Decision)));
            }
        },
    );
}

/// The queue's side of an install, after the reconfiguration lock is released: with token
/// waiting, a waiter whose demand can no longer fit at all is answered
/// (`crate::protocol::token_wait::sweep_never_fit`); then queued waiters that the new limits
/// admit are admitted (the pump), or, with classes, the queue is visited when a migration asked
/// for it (`visit`, from [`install`]).
pub(crate) fn after_install(shared: &Shared, visit: bool) {
    if Word(shared.word.load(Ordering::Acquire)).waiters() {
        crate::protocol::token_wait::sweep_never_fit(shared);
    }
    let waiters = Word(shared.word.load(Ordering::Acquire)).waiters();
    if shared.classed {
        if waiters || visit {
            crate::protocol::class_pump::pump_classed_now(shared);
        }
    } else if waiters {
        crate::protocol::handoff::pump(shared);
    }
}
