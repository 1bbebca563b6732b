//! The lock-free protocol of a bulkhead **with admission classes**: its word layouts, the
//! decision, the returns of capacity, reconfiguration and the lifetime of the shared state.
//!
//! A bulkhead without classes never runs any of this (it uses the single word of
//! `crate::words::state`); the choice is made once, at construction.
//!
//! # The words
//!
//! * One **class word** per class, each on its own cache line:
//!   `[tokens t_k:32][in flight n_k:14 @32][ctag:14 @46][EPOCH @60][DETACHED @62]`.
//!   `t_k` and `n_k` are the class's held tokens and slots; `ctag` is the class's **version**
//!   (mod the limits tag's period, `2^14`) whose floors the class is accounted under: the
//!   number of installs that changed this class's limits, which names the entry of the class's
//!   floors table (`crate::words::floors`); `EPOCH` is the parity of the limits tag whose
//!   install last passed the word (`moved`, "A borrower's step"); `DETACHED` belongs to the
//!   lifetime protocol (below).
//! * The **shared word**, the bulkhead's state word in class mode:
//!   `[V:32][U:16 @32][tag:14 @48][WAITERS @62][CLOSED @63]`, with
//!   `U = Σ_k max(n_k, protected_concurrent_k)` and `V = Σ_k max(t_k, protected_tokens_k)`
//!   (CONTRACT.md §4), the limits tag and the flags of the no-class word at the same places.
//!
//! The global totals `G = Σ n_k` and `T = Σ t_k` are not stored anywhere: a decision that stays
//! inside its class's floors never needs them (below), and statistics add up the class words.
//! Field widths bound the limits of a classed bulkhead: `max_concurrent ≤ 16,383` and a token
//! budget `≤ 2^30 − 1`; validation names both bounds.
//!
//! # Why `U` and `V` are enough
//!
//! For class `k` with floors `pc`, `pt`, a demand of `r` tokens changes `U` by
//! `du = [n_k ≥ pc]` (the slot is borrowed) and `V` by `dv = max(t_k + r, pt) − max(t_k, pt)`
//! (the borrowed tokens). Since `G ≤ U` and `T ≤ V` at all times:
//!
//! * a **protected** demand (`du = 0`, `dv = 0`) needs only its class word, provided `U ≤ MC`
//!   and `V ≤ eff(priority)`: then `G + 1 ≤ U ≤ MC` (row 6) and `T + r ≤ V ≤ eff` (row 1) hold
//!   with it admitted, because its slot and tokens sit inside its class's idle floors, which `U`
//!   and `V` already count;
//! * a **borrowing** demand needs `U + du ≤ MC` (row 4; it implies row 6) and `V + dv ≤ eff`
//!   (row 5; it implies row 1), which are checks on the shared word alone.
//!
//! So the protected path is a CAS on the class word plus two plain loads of the shared word,
//! and the borrowing path one CAS on each word; neither reads another class's word, and two
//! classes within their floors never write a common cache line.
//!
//! # The invariant: stored `U`, `V` never below the truth
//!
//! Every change of a class word changes the true `U`/`V` by an amount computed from the class
//! word it replaced (and the floors of that word's `ctag`). The shared word receives that
//! amount in a separate step, ordered so that the stored values are never below the true ones
//! (with tentative class increments counted as true):
//!
//! * **increases go to the shared word first**: a borrower adds `du`, `dv` by a CAS that checks
//!   rows 4 and 5, then CASes its class word against the class state it classified (if
//!   that changed, it steps on the new state when what that needs, under the floors of the
//!   state's own version, is no more than it reserved, and gives the excess back after; it
//!   takes its increase back and decides again otherwise, and on a migrated state unless it
//!   reserved its whole demand: `reserve`), then reads the tag
//!   again: a step that an install overtook is decided again under the current tag (`moved`,
//!   "A borrower's step");
//! * **decreases go to the class word first**: a release (or abandonment, or undo) changes the
//!   class word (a CAS, or for the release of an admission that borrowed a `fetch_add`) and
//!   then subtracts the amount it computed from the state it replaced;
//! * usage growth adds its whole growth to `V` first and corrects after the class word moved.
//!
//! Quantities add up per class (the amounts telescope along the class word's modification
//! order), so once every step has landed the stored values are exact; in between, they can only
//! be too high. Too high is safe: a check that passes against the stored values passes against
//! the true ones, so no admission ever takes `U` past `max_concurrent` or `V` past the budget,
//! at any instant. Sequentially the stored values are exact, and the decisions are those of the
//! sequential model (`src/model.rs`), which the property tests check.
//!
//! # No field underflows
//!
//! Every subtraction from a packed word is checked by a debug assertion on the value it replaced,
//! and none can borrow from the neighbouring field, because each takes away only what is provably
//! there:
//!
//! * a class word loses one slot and `held` tokens only in the release (or undo) of an admission
//!   whose slot and hold it contains;
//! * the shared word loses `|du|`, `|dv|` computed from the very class word the preceding CAS
//!   replaced and from the floors of *that word's* tag. The stored `U`/`V` are never below the true
//!   ones (the invariant above), and the true ones are sums of per-class terms of which this
//!   decrease removes at most the part its class word held, so the stored values stay `≥ 0`.
//!
//! The second argument needs the floors the decrease reads to be the floors the class word is
//! accounted under. A `ctag` alone could not promise that: a release stopped between its read
//! and its CAS while the class's version went round once would find a bit-identical word and
//! subtract an amount computed from floors that were no longer current (`U` then drifted below
//! the truth and could underflow into the tag, a livelock). The grace period of `crate::grace`
//! rules this out: no class version comes back, and no floors entry is rewritten, while an
//! operation that read it is in progress. The class version is as wide as the limits tag and
//! the floors table keeps a whole period of versions, so the limits tag's grace period covers
//! both ("Class versions" there): an install waits for a class operation no more often than
//! for any other.
//!
//! # Protected path, step by step
//!
//! 1. load the shared word `g` (tag, flags, `U`, `V`), the limits of its tag, and the class word;
//! 2. rows 2 and 3 (the class ceilings) on the class word; classify (`du`, `dv`);
//! 3. CAS the class word, taking one slot and `r` tokens (expected value includes its `ctag`,
//!    which must equal `g`'s tag);
//! 4. load the shared word again: if its tag is unchanged, it is not closed, `U ≤ MC` and
//!    `V ≤ eff`, the admission stands, decided at that load, where every condition above held
//!    with its slot and tokens already in its class word. If only the tag moved, the step is
//!    kept and decided again under the current tag, and taken back only if that refuses it
//!    (`moved`: a step taken back after others counted it refuses them spuriously).
//!    Otherwise the class step is undone (a decrease, so class word first) and the decision
//!    starts again.
//!
//! A newcomer never needs another class's word, so nothing here can be refused because of
//! another class's tentative step. A same-class decider can see this tentative step (it is in
//! the class word) and may be refused or classified as borrowing because of it; the step is
//! undone only when the limits changed under it and the new ones refuse it (`moved`), when
//! the bulkhead closed, or on the rare paths below, so such refusals are rare (measured in
//! `tests/stress_classes.rs` and `tests/spurious_refusals.rs`).
//!
//! # Bypass
//!
//! While waiters are queued (`WAITERS`), a newcomer is refused (no barging) unless it
//! **bypasses**: its demand is protected (the branch above), no waiter of its class is queued,
//! and the shared word shows `U ≤ max_concurrent` and `V ≤ B − H` (the lowest effective
//! budget). Such a newcomer changes nothing any queued waiter decides on, so it delays none.
//! The rule, the argument and the race with enqueuers of the same class (a mask of queued
//! classes read after the class CAS) are in `bypass`. Borrowers and the collect-checked path
//! never bypass; `first_try` (the no-waiter fast path) hands the decision on when it sees
//! `WAITERS`, so it pays nothing for the rule.
//!
//! # Rare paths, checked with a collect
//!
//! Two conditions are not implied by the shared word: row 6 for a protected slot when `U > MC`
//! (after a floor was raised, or `max_concurrent` lowered, while capacity was in use), and
//! row 1 for tokens inside the floors when `V > eff` (the high-priority reserve is in use, or
//! the budget was lowered). Then the demand reads every class word first and stops if they
//! already refuse it (a step taken only to be taken back would refuse others spuriously:
//! `tests/spurious_refusals.rs`, `slow_path`, fails on the broken variant
//! `LLM_BULKHEAD_SLOW_NO_PRECHECK=1`); otherwise it takes its class step tentatively, reads
//! every class word again (`SeqCst`, after its own `SeqCst` CAS) and checks `G` and `T`
//! exactly, each raised by what the stored word holds beyond that collect's own accounting
//! (a borrower's reservation whose class step the collect does not show yet is there: `moved`,
//! "Steps in flight"). Of two such deciders, the later CAS in the `SeqCst` order sees the
//! earlier one's step, so they cannot both overshoot; fast-path deciders never overshoot
//! because `G ≤ U`, `T ≤ V`. A step whose tag moved before its collect's last load is kept and decided again
//! under the current tag, as a protected step is (`moved`). These paths can refuse because of
//! another tentative step that is later undone.
//!
//! A refusal is always decided by one collect of every word, never by the stored shared word
//! alone: the reason, constraint and capacity detail come from that collect; if the collect
//! says the demand fits (a transient step of another decider caused the refusal) the decision
//! is retried, a bounded number of times (`retries::FITS_RETRIES`), waiting outside any
//! grace-period operation for the stopped decider to finish.
//!
//! # Short refusals
//!
//! Under overload the refusal is the hot path, so the two refusals an overloaded class meets
//! most are decided without the full protocol, inside the fast attempt's operation, from the
//! words it read and one read of the other class words, with nothing allocated and the detail
//! built only when asked (`refusal::own_word_refusal`, `refusal::shared_refusal`):
//!
//! * **at a class ceiling** (rows 2 and 3): the class word decides, read under the shared
//!   word's tag at the class's version under that tag; the other words give the totals;
//! * **at the shared remainder** (row 1, or rows 4 and 5 for a borrower): the stored `U`, `V`
//!   only stop the attempt, before any step. When what the class alone borrows already
//!   passes the shared remainder, the class word decides, as at a ceiling (its own borrowing
//!   is a lower bound of every class's: `refusal::own_protection`); otherwise the sequential
//!   rule on a collect decides, out of line. So a stored amount that counts another
//!   decider's step in progress refuses no one here (the full protocol then decides).
//!   `tests/class_refusals.rs` has the regressions, with an install stopped between its tag
//!   bump and its migrations (`conservative`) and with the rows' order (`own_word`), and
//!   their broken variants.
//!
//! Either refusal takes effect at a re-read of the shared word at the same tag, still open.
//!
//! # Reconfiguration
//!
//! `apply_limits` (serialised by its mutex) gives every class whose limits change its next
//! version and writes that version's limits into the class's floors table, writes the new
//! limits (with every class's version) into the global ring and, in one CAS, bumps the shared
//! word's tag **and adds to `U`/`V` every raise of a floor** (`Σ max(0, pc' − pc)`, the most a
//! raise can add). It then migrates each class whose limits changed: a CAS that sets the class
//! word's `ctag` to the new version (so the class's `n_k`, `t_k` are fixed at that instant),
//! after which the exact change `max(n, pc') − max(n, pc)` replaces the advance (a decrease).
//! A class whose limits did not change keeps its version and its word: its accounting and
//! ceilings are the same under the new tag. A decider that finds its class word on the version
//! before the one its tag gives the class helps by migrating it first, so no one waits for the
//! reconfigurer. What a decider reads from the global ring slot of its tag counts only while
//! that tag is current: the protected path re-reads it, a borrower's shared CAS expects it, the
//! collect-checked path re-reads it, a helper's migration checks it (`returns::migrate`). A lowered floor takes effect at the tag bump; a raised floor
//! revokes nothing (`U` may exceed `max_concurrent`, and borrowing pauses until completions
//! bring it back). Class amounts always use the floors of the class word's own `ctag`, so
//! the per-class sums still telescope across a migration. Every class CAS compares the `ctag`,
//! so a decision classified under the old floors cannot land after its class migrated; a
//! protected admission's final load sees any tag bump and decides the step again under the
//! current tag (`moved`). A borrower's admission is decided at its reservation, a CAS of the
//! shared word that compares the tag: it stands under the older revision only when that
//! reservation holds its whole demand (its slot and all of its tokens borrowed), or when its class step came before the install's CAS of
//! the tag (`moved`, "A borrower's step"); otherwise it too is decided again. So a demand that
//! starts after `apply_limits` returns is never admitted under an older revision, and one
//! admitted under it made the CAS that counts it before the install's CAS of the tag, as a
//! decision without classes does.
//!
//! # Lifetime
//!
//! Class slots are the admissions' references to the shared state (as the global slot is
//! without classes, see `src/shared.rs`). A release returns its slot on its class word first,
//! then makes the shared-word decrease that step computed and visits the queue: after its class
//! step it is no longer counted, and what keeps the state allocated is its grace-period
//! operation (on the thread's process-wide cell, `crate::grace`): a class-mode free first waits
//! for every other thread's operation on the bulkhead (`crate::grace::wait_for_operations`;
//! `src/shared.rs`, "Class mode: a release's operation keeps the state alive"). When the last
//! handle goes, it sets `alive = classes + 1`, sets `DETACHED` on every class word (counting
//! down `alive` for each word that held no slot), and counts itself down; a release whose class
//! step leaves a detached class word with no slot counts down `alive` after it left its
//! operation. Whoever reaches zero frees. After the last handle no admission can start and no
//! abandonment can pin, so each class word empties at most once after being detached.
//!
//! The functions that take such a last step (the release, the last handle's detach, the
//! count-down) take the slot, the pointer or the counter, never a `&Shared` argument: a
//! reference argument must stay valid until its function returns, and the state may be freed
//! by another thread as soon as the last step lands. They reach the state through a local
//! reference last used before that step (Miri's Stacked Borrows checks it; loom does not model
//! reference validity). `tests/lifetime_class_release.rs` (feature `testing`, run under Miri in
//! CI) is the check: it frees the state on another thread while a release is held right after
//! it left its operation (`PausePoint::ClassReleaseGiven`, borrowed and protected) and while a
//! count-down that gave its count away is held before returning (`PausePoint::CountedDown`, in
//! the last handle's detach and in a release); with a `&Shared` argument in any of these
//! functions Miri reports the free as a deallocation while that protected reference is alive.
//!
//! # Memory ordering
//!
//! Class-word and shared-word operations of the decision are `SeqCst` (on x86-64 this costs
//! nothing over `AcqRel` for RMWs and nothing for loads), which the collect argument needs; the
//! lifetime RMWs are at least `AcqRel`, so the freeing thread synchronises with every other
//! owner's last access.

// A refusal carries the collect that explains it by value (a `Summary`, about 200 bytes), so
// that refusing, the hot path under overload, allocates nothing; the results that carry it are
// larger than clippy's default by design. The admission fast path returns `Option<Admitted>`
// (`try_fast`) and never builds one.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

use crate::shared::Shared;
use crate::sync::Ordering::SeqCst;
use crate::vocab::class::Resources;
use crate::vocab::rejection::{Constraint, RejectReason};
use crate::words::class_word::*;

use crate::sync::test_switch;

mod bypass;
mod fast;
mod moved;
mod refusal;
mod reserve;
mod retries;
mod returns;
use crate::words::classes::{ClassView, ShareSums, Summary};
use crate::words::limits::{Hot, HotClass};
use crate::Priority;
pub(crate) use bypass::may_bypass;
use fast::*;
use moved::{
    borrow_overtaken, borrow_unsettled, keep_after_tag_moved, protected_step_missed, reserved_whole,
};
use refusal::*;
pub(crate) use refusal::{collect, describe, precheck, Precheck, Refused};
pub(crate) use refusal::{own_word_refusal, read_stopped, shared_refusal, try_fast_in};
pub(crate) use refusal::{ShortRefusal, StopAt, Stopped};
use reserve::class_step_after_reserve;
use retries::{acquire_contended, acquire_contended_with};
use returns::*;
pub(crate) use returns::{grow_tokens, migrate, release, return_slot_only, return_tokens};

/// `(U, V)` change of class `k` going from `(n, t)` to `(n2, t2)` under floors `l`, as
/// `(increase?, |du|, increase?, |dv|)` is awkward; signed values are used instead.
#[inline]
fn delta(l: &HotClass, n: u64, t: u64, n2: u64, t2: u64) -> (i64, i64) {
    (
        n2.max(l.pc) as i64 - n.max(l.pc) as i64,
        t2.max(l.pt) as i64 - t.max(l.pt) as i64,
    )
}

/// Applies a decrease `(du, dv)` (both ≤ 0) to the shared word. Returns whether the word it
/// replaced had `WAITERS` set (the caller must then visit the queue: the decrease may be what
/// a waiter's decision, refused meanwhile, was missing).
#[inline]
#[must_use]
fn shared_decrease(shared: &Shared, du: i64, dv: i64) -> bool {
    debug_assert!(du <= 0 && dv <= 0);
    let (du, dv) = (du.unsigned_abs(), dv.unsigned_abs());
    let amount = (du << U_SHIFT) + dv;
    if amount == 0 {
        return false;
    }
    let prev = GWord(shared.word.fetch_sub(amount, SeqCst));
    // No borrow across a field (module docs, "No field underflows"): the stored U and V are
    // never below the truth, and a decrease takes away exactly an amount the truth contains.
    debug_assert!(
        prev.u() >= du && prev.v() >= dv,
        "shared word underflow: {prev:?} - (U {du}, V {dv})"
    );
    prev.waiters()
}

/// After a decrease that found the queue flagged (`visit`): pumps the queue, unless the
/// decrease was made by the pump itself (`in_queue`: the caller holds the queue mutex and
/// decides the head again afterwards).
#[inline]
fn visit_queue(shared: &Shared, visit: bool, in_queue: bool) {
    if visit && !in_queue {
        crate::protocol::class_pump::pump_classed(shared);
    }
}

/// The class limits a class word is accounted under (its `ctag`, the class's version, names
/// the entry of the class's floors table, `crate::words::floors`).
#[inline]
fn floors_of(shared: &Shared, c: CWord, k: usize) -> HotClass {
    shared.ring.floors(k, c.ctag())
}

/// What a classed decision produced.
pub(crate) struct Admitted {
    pub(crate) revision: u64,
    pub(crate) resources: Resources,
}

/// One request, as the protocol sees it.
#[derive(Clone, Copy)]
struct Req {
    k: usize,
    r: u64,
    priority: Priority,
    /// Decided under the queue mutex for a queued head (or a newcomer to an empty queue):
    /// `WAITERS` does not refuse it, and its own undos do not visit the queue.
    in_queue: bool,
}

/// How one attempt ended.
enum Attempt {
    Admitted(Admitted),
    /// Refused (reason found by the attempt; the collect decides the final one).
    Refused(RejectReason),
    /// Needs the collect-checked path.
    Slow,
    /// The limits or the class's accounting changed: start again.
    Retry,
}

/// The common case of the classed `try_acquire` (see `first_try`), inside its own grace-period
/// operation; `None`: decide with [`acquire`] (anything this did was undone). Kept apart so that
/// the success path returns a small value, not the full refusal.
///
/// `c` is the calling thread's counters entry of this bulkhead, which the caller counts the
/// admission in: the operation's marker lives there (`crate::grace::enter_decision`, one
/// lookup for both). Only for a caller that holds a handle for the whole call.
#[cfg(feature = "llm")]
#[inline(always)]
pub(crate) fn try_fast(
    shared: &Shared,
    c: &crate::record::stats::Counters,
    k: usize,
    r: u64,
    priority: Priority,
) -> Option<Admitted> {
    let _op = crate::grace::enter_decision(c.reader(), shared.asymmetric);
    first_try(shared, k, r, priority)
}

/// The classed `try_acquire`: rows 0–6 for class `k` and a demand of `r` tokens.
#[inline]
pub(crate) fn acquire(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
) -> Result<Admitted, Refused> {
    // Every class operation runs inside a grace-period `Op` (`crate::grace`): no install can
    // bring a tag it read back to the same value while it is in progress. The full protocol
    // enters one per attempt (`acquire_contended_with`).
    {
        let _op = crate::grace::op(shared.grace_id);
        if let Some(a) = first_try(shared, k, r, priority) {
            return Ok(a);
        }
    }
    contended(shared, k, r, priority, false)
}

/// [`acquire`] after [`try_fast`] returned `None`: the full protocol only. A refusal is handed
/// to `refused` where it was explained, by reference (a [`Refused`] is about 200 bytes; moved
/// out through each return it was copied four times), and its answer returned.
#[inline(always)]
pub(crate) fn acquire_after_fast<T>(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    refused: impl Fn(&Refused) -> T,
) -> Result<Admitted, T> {
    acquire_contended_with(
        shared,
        Req {
            k,
            r,
            priority,
            in_queue: false,
        },
        refused,
    )
}

/// The decision for a queued head (or a newcomer to an empty queue), made under the queue
/// mutex: as [`acquire`], except that `WAITERS` (raised for this very queue) does not refuse
/// it. A refusal whose collects never confirmed it comes back with `stored_shared` set.
pub(crate) fn acquire_in_queue(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
) -> Result<Admitted, Refused> {
    contended(shared, k, r, priority, true)
}

/// The full protocol for one request (each attempt in its own grace-period operation).
fn contended(
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
    in_queue: bool,
) -> Result<Admitted, Refused> {
    acquire_contended(
        shared,
        Req {
            k,
            r,
            priority,
            in_queue,
        },
    )
}

/// What a decision reads first: the shared word and the limits its tag names.
struct Read {
    g: GWord,
    lim: Hot,
    /// Class `k`'s version under `g`'s tag (the `ctag` its word carries once migrated).
    ver: usize,
    l: HotClass,
    eff: Option<u64>,
}

/// Reads the shared word and its limits; refuses at once when closed, when `r` alone
/// exceeds the effective budget (row 1 fails whatever the state, and `r` is then small enough
/// for the word arithmetic), or when waiters are queued and the caller may not bypass them
/// (`may_bypass`: only the fast paths' protected branch can, `bypass`).
#[inline]
fn read(shared: &Shared, req: Req, may_bypass: bool) -> Result<Read, Attempt> {
    let g = GWord(shared.word.load(SeqCst));
    if g.closed() {
        return Err(Attempt::Refused(RejectReason::Shutdown));
    }
    if g.waiters() && !req.in_queue && !may_bypass {
        // No barging (the bypass is decided in `attempt`): the collect in `explain` says
        // whether rows 1–5 refuse first.
        return Err(Attempt::Refused(RejectReason::ConcurrencyLimit));
    }
    let lim = shared.ring.read(g.tag());
    let (ver, l) = shared.ring.read_class_versioned(g.tag(), req.k);
    let eff = lim.effective(req.priority);
    if eff.is_some_and(|e| req.r > e) {
        return Err(Attempt::Refused(RejectReason::BudgetLimit));
    }
    Ok(Read {
        g,
        lim,
        ver,
        l,
        eff,
    })
}

/// Rows 2 and 3 on class word `c`, and the classification `(borrowed slot?, borrowed
/// tokens)`. A class word still on the class's previous version (`ver` is the one the
/// decision's tag gives it) is migrated first (helping), and the decision starts again. Row 1 is not decidable here (`T` is not stored): when a ceiling
/// fails, the collect in `explain` puts row 1 first.
#[inline]
fn classify(
    shared: &Shared,
    req: Req,
    ver: usize,
    l: &HotClass,
    c: CWord,
) -> Result<(bool, u64), Attempt> {
    if c.ctag() != ver {
        help_migrate(shared, req.k, c, req.in_queue);
        return Err(Attempt::Retry);
    }
    let (n, t) = (c.in_flight(), c.tokens());
    if l.mt.is_some_and(|mt| t.saturating_add(req.r) > mt) {
        return Err(Attempt::Refused(RejectReason::BudgetLimit));
    }
    if l.mc.is_some_and(|m| n >= m) {
        return Err(Attempt::Refused(RejectReason::ConcurrencyLimit));
    }
    let (_, dv) = delta(l, n, t, n, t.saturating_add(req.r));
    Ok((n >= l.pc, dv as u64))
}

/// One attempt on the fast paths.
#[inline]
fn attempt(shared: &Shared, req: Req) -> Attempt {
    let Req { k, r, .. } = req;
    let word = &*shared.word;
    let cw = &*shared.class_words[k];
    let Read {
        g,
        lim,
        ver,
        l,
        eff,
    } = match read(shared, req, true) {
        Ok(x) => x,
        Err(a) => return a,
    };
    // Waiters are queued: only the bypass of an in-floor demand can admit (`bypass`).
    let bypassing = g.waiters() && !req.in_queue;
    let mc = lim.max_concurrent;
    let mut c = CWord(cw.load(SeqCst));
    loop {
        let (borrow_c, dv) = match classify(shared, req, ver, &l, c) {
            Ok(x) => x,
            Err(a) => return a,
        };
        let next = CWord(c.0 + C_ONE + r);
        if !borrow_c && dv == 0 {
            // Protected: class word only, then validate on the shared word.
            if g.u() > mc || eff.is_some_and(|e| g.v() > e) {
                return Attempt::Slow;
            }
            if bypassing && !(bypass::room(g, &lim) && bypass::class_not_queued(shared, k)) {
                return Attempt::Refused(RejectReason::ConcurrencyLimit);
            }
            match cw.compare_exchange_weak(c.0, next.0, SeqCst, SeqCst) {
                Ok(_) => {}
                Err(actual) => {
                    c = CWord(actual);
                    continue;
                }
            }
            crate::sync::loom_sc_fence();
            let g2 = GWord(word.load(SeqCst));
            if g2.tag() == g.tag()
                && !g2.closed()
                && g2.u() <= mc
                && eff.is_none_or(|e| g2.v() <= e)
                && (req.in_queue
                    || !g2.waiters()
                    || (bypass::room(g2, &lim) && bypass::recheck(shared, k)))
            {
                return Attempt::Admitted(Admitted {
                    revision: lim.revision,
                    resources: Resources::default(),
                });
            }
            if !g2.closed() && g2.tag() != g.tag() {
                // Kept and decided again under the current tag (`moved`).
                return match keep_after_tag_moved(shared, k, r, req.priority, req.in_queue) {
                    Some(a) => Attempt::Admitted(a),
                    None => Attempt::Retry,
                };
            }
            undo(shared, k, r, req.in_queue);
            return if g2.closed() {
                Attempt::Refused(RejectReason::Shutdown)
            } else {
                Attempt::Slow
            };
        }
        // Borrowing: the shared word first (rows 4 and 5), then the class word. A borrower
        // never bypasses the queue.
        if bypassing {
            return Attempt::Refused(RejectReason::ConcurrencyLimit);
        }
        let du = u64::from(borrow_c);
        let mut s = g;
        loop {
            if s.tag() != g.tag() {
                return Attempt::Retry;
            }
            if s.closed() {
                return Attempt::Refused(RejectReason::Shutdown);
            }
            if s.waiters() && !req.in_queue {
                return Attempt::Refused(RejectReason::ConcurrencyLimit);
            }
            if borrow_c {
                if s.u() + 1 > mc {
                    return Attempt::Refused(RejectReason::ConcurrencyLimit);
                }
            } else if s.u() > mc {
                return Attempt::Slow;
            }
            if let Some(e) = eff {
                if dv > 0 {
                    if s.v() + dv > e {
                        return Attempt::Refused(RejectReason::BudgetLimit);
                    }
                } else if s.v() > e {
                    return Attempt::Slow;
                }
            }
            match word.compare_exchange_weak(s.0, s.0 + du * G_ONE + dv, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(actual) => s = GWord(actual),
            }
        }
        // Then the class word, and the tag once more (`borrow_overtaken`).
        let Some(resources) = class_step_after_reserve(shared, k, r, req.in_queue, &mut c, du, dv)
        else {
            return Attempt::Retry;
        };
        crate::sync::pause(crate::sync::PausePoint::BorrowStepped);
        crate::sync::loom_sc_fence();
        let whole = reserved_whole(du, dv, r);
        if borrow_unsettled(
            shared,
            g.tag(),
            eff.unwrap_or(u64::MAX),
            resources,
            r,
            whole,
        ) {
            let revision = lim.revision;
            return match borrow_overtaken(
                shared,
                k,
                r,
                req.priority,
                req.in_queue,
                g.tag(),
                c,
                revision,
                resources,
            ) {
                Some(a) => Attempt::Admitted(a),
                None => Attempt::Retry,
            };
        }
        return Attempt::Admitted(Admitted {
            revision: lim.revision,
            resources,
        });
    }
}

/// The collect-checked path (module docs, "Rare paths").
fn slow(shared: &Shared, req: Req) -> Attempt {
    let Req { k, r, .. } = req;
    let word = &*shared.word;
    let cw = &*shared.class_words[k];
    // Never a bypass here: this path serves `U > MC` or `V > eff`, which condition (3) of the
    // bypass excludes.
    let Read {
        g,
        lim,
        ver,
        l,
        eff,
    } = match read(shared, req, false) {
        Ok(x) => x,
        Err(a) => return a,
    };
    let mc = lim.max_concurrent;
    let c = CWord(cw.load(SeqCst));
    let (borrow_c, dv) = match classify(shared, req, ver, &l, c) {
        Ok(x) => x,
        Err(a) => return a,
    };
    // Rows 6 and 1 on a collect before any step: a step that this collect already refuses
    // would be taken back after the collect below, and meanwhile other deciders count it
    // (a tentative step that refuses them spuriously, issue 26 §5).
    if !skips_slow_precheck_for_tests() {
        let (g_before, t_before) = totals(shared);
        if g_before + 1 > mc {
            return Attempt::Refused(RejectReason::ConcurrencyLimit);
        }
        if eff.is_some_and(|e| t_before + r > e) {
            return Attempt::Refused(RejectReason::BudgetLimit);
        }
    }
    let du = u64::from(borrow_c);
    if du + dv > 0 {
        let mut s = g;
        loop {
            if s.tag() != g.tag() {
                return Attempt::Retry;
            }
            if s.closed() {
                return Attempt::Refused(RejectReason::Shutdown);
            }
            if borrow_c && s.u() + 1 > mc {
                return Attempt::Refused(RejectReason::ConcurrencyLimit);
            }
            if dv > 0 && eff.is_some_and(|e| s.v() + dv > e) {
                return Attempt::Refused(RejectReason::BudgetLimit);
            }
            match word.compare_exchange_weak(s.0, s.0 + du * G_ONE + dv, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(actual) => s = GWord(actual),
            }
        }
    }
    crate::sync::pause(crate::sync::PausePoint::ClassCas);
    // An install's mark (`EPOCH`) alone changes nothing this step was classified on: the CAS
    // is tried again on the marked word, rather than the reservation taken back.
    let stepped = match cw.compare_exchange(c.0, c.0 + C_ONE + r, SeqCst, SeqCst) {
        Err(a) if a ^ c.0 == C_EPOCH => cw.compare_exchange(a, a + C_ONE + r, SeqCst, SeqCst),
        other => other,
    };
    if stepped.is_err() {
        let visit = shared_decrease(shared, -(du as i64), -(dv as i64));
        visit_queue(shared, visit, req.in_queue);
        return Attempt::Retry;
    }
    crate::sync::pause(crate::sync::PausePoint::SlowStepTaken);
    // Every class word, after our own SeqCst CAS, and what the stored word holds beyond them
    // (`moved`, "Steps in flight").
    crate::sync::loom_sc_fence();
    let (g3, g_all, t_all) = moved::exact_totals(shared);
    let fits_tokens = eff.is_none_or(|e| t_all <= e);
    if g3.tag() == g.tag()
        && !g3.closed()
        && (req.in_queue || !g3.waiters())
        && fits_tokens
        && g_all <= mc
    {
        return Attempt::Admitted(Admitted {
            revision: lim.revision,
            resources: Resources {
                borrowed_concurrency: borrow_c,
                borrowed_tokens: dv,
            },
        });
    }
    if !g3.closed() && g3.tag() != g.tag() {
        // An install overtook the step: kept and decided again under the current tag, as a
        // protected step is (`moved`); taken back there if that refuses it.
        return match keep_after_tag_moved(shared, k, r, req.priority, req.in_queue) {
            Some(a) => Attempt::Admitted(a),
            None => Attempt::Retry,
        };
    }
    undo(shared, k, r, req.in_queue);
    if g3.closed() {
        Attempt::Refused(RejectReason::Shutdown)
    } else if !fits_tokens {
        Attempt::Refused(RejectReason::BudgetLimit)
    } else {
        Attempt::Refused(RejectReason::ConcurrencyLimit)
    }
}

/// `(G, T)`: the slots and tokens every class word holds, each word read once (`SeqCst`).
#[inline]
fn totals(shared: &Shared) -> (u64, u64) {
    shared.class_words.iter().fold((0, 0), |(a, b), w| {
        let w = CWord(w.load(SeqCst));
        (a + w.in_flight(), b + w.tokens())
    })
}

/// The broken variant of [`slow`]'s regression: `LLM_BULKHEAD_SLOW_NO_PRECHECK=1` (feature
/// `testing`) skips the collect before its step, which then happens even where it refuses.
#[inline]
fn skips_slow_precheck_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_SLOW_NO_PRECHECK")
}
