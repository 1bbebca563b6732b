//! The class protocol's refusals: the collect over every class word, the explanation of a
//! refusal from a fresh collect (`super`, "Precision"), the advisory precheck.

#![allow(clippy::result_large_err)]

use super::*;
use crate::vocab::rejection::{
    Ceilings, ClassCounts, ClassWords, Counts, Rejection, SHAPE_HAS_BUDGET,
};

/// A classed refusal, with the collect that explains it (a few words: no allocation).
#[derive(Clone, Copy)]
pub(crate) struct Refused {
    pub(crate) reason: RejectReason,
    pub(crate) constraint: Option<Constraint>,
    pub(crate) lim: Hot,
    /// The collect: global totals, sums over every class, the refused class's own numbers.
    pub(crate) summary: Summary,
    /// Shared capacity in use (slots, tokens) as the shared word stores it, when that, not the
    /// collect, explains the refusal (steps of other deciders were in progress).
    pub(crate) stored_shared: Option<(u64, u64)>,
}

/// One pass over every class word: the [`Summary`] of class `k` under the limits of tag `tag`
/// (`lim`) for a demand of priority `priority`. Allocates nothing.
pub(super) fn summarize(
    shared: &Shared,
    tag: usize,
    lim: &Hot,
    k: usize,
    priority: Priority,
) -> Summary {
    let mut sums = ShareSums::default();
    let (mut g, mut t) = (0, 0);
    // Filled in by the loop: class `k` is in the table (no read of its limits beforehand).
    let mut own = (
        (0, 0),
        HotClass {
            pc: 0,
            mc: None,
            pt: 0,
            mt: None,
        },
    );
    debug_assert!(k < shared.class_words.len());
    for (j, w) in shared.class_words.iter().enumerate() {
        let w = CWord(w.load(SeqCst));
        let c = (w.in_flight(), w.tokens());
        let l = shared.ring.read_class(tag, j);
        g += c.0;
        t += c.1;
        sums.add(c, &l);
        if j == k {
            own = (c, l);
        }
    }
    Summary {
        g,
        t,
        sums,
        own: own.0,
        limits: own.1,
        max_concurrent: lim.max_concurrent,
        eff: lim.effective(priority),
    }
}

/// Every class word's `(in flight, tokens)`, and `(G, T)`.
pub(crate) fn collect(shared: &Shared) -> (Vec<(u64, u64)>, u64, u64) {
    let v: Vec<(u64, u64)> = shared
        .class_words
        .iter()
        .map(|w| {
            let w = CWord(w.load(SeqCst));
            (w.in_flight(), w.tokens())
        })
        .collect();
    let g = v.iter().map(|x| x.0).sum();
    let t = v.iter().map(|x| x.1).sum();
    (v, g, t)
}

pub(super) enum Explained<T> {
    /// Refused: what the caller's `refused` made of the [`Refused`].
    Refused(T),
    /// The collect says the demand fits: a transient step of another decider refused it.
    Fits,
    TagMoved,
}

/// Explains a refusal from one collect of every word, the way the sequential model decides
/// (`src/model.rs`): shutdown, row 1, rows 2–3, rows 4–5, row 6. A refusal is handed to
/// `refused` by reference where it is built (it is about 200 bytes: moved out in the result,
/// it was copied on each return).
#[inline]
pub(super) fn explain<T>(
    shared: &Shared,
    req: Req,
    hint: RejectReason,
    refused: &impl Fn(&Refused) -> T,
) -> Explained<T> {
    let g = GWord(shared.word.load(SeqCst));
    // A reconfiguration in progress keeps the stored U/V conservative until every class has
    // migrated: finish it (helping) before refusing because of it.
    let mut helped = false;
    for (k, w) in shared.class_words.iter().enumerate() {
        let c = CWord(w.load(SeqCst));
        if c.ctag() != shared.ring.version(g.tag(), k) {
            help_migrate(shared, k, c, req.in_queue);
            helped = true;
        }
    }
    if helped {
        return Explained::TagMoved;
    }
    let lim = shared.ring.read(g.tag());
    let summary = summarize(shared, g.tag(), &lim, req.k, req.priority);
    if GWord(shared.word.load(SeqCst)).tag() != g.tag() {
        return Explained::TagMoved;
    }
    let refused = |reason, constraint| {
        Explained::Refused(refused(&Refused {
            reason,
            constraint,
            lim,
            summary,
            stored_shared: None,
        }))
    };
    if g.closed() || hint == RejectReason::Shutdown {
        return refused(RejectReason::Shutdown, None);
    }
    match summary.decide(req.r) {
        Some((reason, constraint)) => refused(reason, Some(constraint)),
        // Waiters are queued: refused (no barging) unless the demand may bypass them
        // (`super::bypass`), in which case it is decided again.
        None if g.waiters() && !req.in_queue => {
            let (n, t) = summary.own;
            if bypass::protected(&summary.limits, n, t, req.r)
                && bypass::room(g, &lim)
                && bypass::class_not_queued(shared, req.k)
            {
                Explained::Fits
            } else {
                refused(RejectReason::ConcurrencyLimit, Some(Constraint::Global))
            }
        }
        None => Explained::Fits,
    }
}

/// Where the fast attempt stopped, having taken no step, when what it read may refuse the
/// demand: the shared word, the class word and the class's limits under the shared word's tag
/// (the ring slot's words for the class, as stored; the class word at the class's version
/// under that tag, the bulkhead open), and the row that stopped it: what [`own_word_refusal`]
/// (or, for a shared stop it leaves, [`shared_refusal`]) decides from. One struct with a
/// one-byte `at`, not an enum of two: the attempt's result stays as small as it was with the
/// ceiling alone (an enum of two cost the pairs 7 to 11 instructions and the ceiling refusal
/// 40).
#[derive(Clone, Copy)]
pub(crate) struct Stopped {
    pub(super) g: GWord,
    pub(super) c: CWord,
    pub(super) cl: crate::words::limits::ClassLimitWords,
    pub(crate) at: StopAt,
}

/// The row a [`Stopped`] attempt stopped at.
#[derive(Clone, Copy)]
pub(crate) enum StopAt {
    /// The class's token ceiling (row 2), which refuses: [`own_word_refusal`].
    TokenCeiling,
    /// The class's concurrency ceiling (row 3), which refuses: [`own_word_refusal`].
    ConcurrencyCeiling,
    /// Within both ceilings (and nobody queued), but row 1 (`r` above the effective budget)
    /// or the stored shared word (rows 4 and 5 on the stored `U`, `V`, for a borrower)
    /// refuses: [`own_word_refusal`] decides when the class's own borrowing explains it,
    /// [`shared_refusal`] with a collect otherwise.
    Shared,
}

/// [`super::try_fast`] inside the caller's decision operation `_op` (entered on `c`'s marker, as
/// `super::try_fast` does): when the attempt stopped at what may be a refusal, where it stopped
/// comes back (`Err(Some(_))`) for [`own_word_refusal`], which the caller runs in the same
/// operation. Under overload most class refusals are at a ceiling or at the shared remainder;
/// those the class's word decides enter no second operation and read the class word once
/// (the shared word again only to confirm its tag).
#[inline(always)]
pub(crate) fn try_fast_in(
    _op: &crate::grace::Op<'_>,
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
) -> Result<Admitted, Option<Stopped>> {
    first_try_or_ceiling(shared, k, r, priority)
}

/// The refusal of a demand of `r` tokens at `priority` in class `k` that the class's own word
/// decides: at one of its class's ceilings (CONTRACT.md §2 rows 2 and 3), or, for a borrower
/// that the stored shared word refused ([`StopAt::Shared`]), at the shared remainder when what
/// its class alone borrows already leaves it no room (rows 4 and 5, [`own_protection`]).
/// Decided and counted in this thread's entry `c` without allocating: under overload these
/// are the hot paths of `try_acquire` with classes. Runs inside the decision operation `_op`
/// of the fast attempt that stopped (`past`, [`super::try_fast_in`]), so that it enters no
/// operation of its own and reads the class word no second time (the shared word is read
/// once more, to confirm its tag: below). `None` when the class's word does not
/// decide it (a shared stop that its class alone does not explain), when row 1, which the
/// sequential model puts before the others, fails too, or when the tag moved or the bulkhead
/// closed: the caller then takes the full protocol, which decides and explains everything
/// else (a shared stop first through [`shared_refusal`]'s collect).
///
/// The class word decides: read under the shared word's tag (`g`, read before it), at the
/// class's version under that tag, it is past a ceiling of those limits (the fast attempt
/// checked both, and which row fails), or its own borrowing passes the shared remainder of
/// those limits. Only then are the other class words read, for the totals `G` and `T` the
/// refusal reports and for row 1 (`T + r > eff`). A re-read of the shared word with the same
/// tag, still open, shows that the limits read were in force when the class word was read
/// (no tag comes back during an operation, `crate::grace`): the refusal takes effect at that
/// read. A migration changes no class's `(n, t)`, so the totals need no version check of the
/// other words.
///
/// What the refusal keeps is what was read: the totals, the class's word and limits, the floor
/// sums and the shared remainder in use as the shared word stores it (`U − Σ pc`, `V − Σ pt`:
/// exact when no other decision is between its two steps, above the truth by those steps
/// otherwise, never below it); its detail is computed only when asked
/// ([`Rejection::detail`]). Runs no user code. Inlined into its callers (the fast attempt's,
/// and the second attempt's out of line), which build the refusal in their own result
/// ([`ShortRefusal::rejection`]: a `Rejection` moved out of a call is copied word by word).
/// The shared stop's check sits in its own arm, with its own reads of the ring: computed
/// after the totals, beside the ceiling's reason, it cost the ceiling refusal about 20
/// instructions and 3 to 4 ns (`benches/instructions.rs`, `benches/core.rs`). So the slot's
/// words are read twice on that stop: reading them once, before the totals, for both the
/// check and the refusal saved it 3 instructions and cost the ceiling refusal 5; one tail
/// shared by both arms cost each about 25.
#[inline(always)]
pub(crate) fn own_word_refusal(
    shared: &Shared,
    c: &crate::record::stats::Counters,
    k: usize,
    r: u64,
    priority: Priority,
    past: Stopped,
    _op: &crate::grace::Op<'_>,
) -> Option<ShortRefusal> {
    let Stopped {
        g,
        c: own,
        cl: l,
        at,
    } = past;
    let word = &*shared.word;
    let tag = g.tag();
    let (n, t) = (own.in_flight(), own.tokens());
    let (reason, constraint) = match at {
        StopAt::TokenCeiling => (RejectReason::BudgetLimit, Constraint::AdmissionClass),
        StopAt::ConcurrencyCeiling => (RejectReason::ConcurrencyLimit, Constraint::AdmissionClass),
        StopAt::Shared => {
            // The tag's slot, read here for this arm only (see above).
            let p = shared.ring.read_packed(tag);
            let (sum_pc, sum_pt) = shared.ring.read_sums(tag);
            let (mc, eff) = (p.hot().max_concurrent, p.eff_or_zero(priority));
            own_protection(l.pc(), l.pt(), n, t, r, mc, eff, sum_pc, sum_pt)?
        }
    };
    // The totals, with the class's own word as the decision read it: one plain loop over the
    // words before it and one over those after it (a test of the index in one loop cost about
    // 20 instructions more for two classes; one loop skipping the own word by its address, 15).
    let (mut n_sum, mut t_sum) = (n, t);
    let words = &shared.class_words;
    for w in &words[..k] {
        let w = CWord(w.load(SeqCst));
        n_sum += w.in_flight();
        t_sum += w.tokens();
    }
    for w in &words[k + 1..] {
        let w = CWord(w.load(SeqCst));
        n_sum += w.in_flight();
        t_sum += w.tokens();
    }
    // The slot's other words: the re-read of the shared word below, still at `tag`, shows that
    // they are `tag`'s (a slot is rewritten only by the install of a tag `RING` later, and no
    // tag comes back during an operation, `crate::grace`).
    let p = shared.ring.read_packed(tag);
    let (sum_pc, sum_pt) = shared.ring.read_sums(tag);
    let g2 = GWord(word.load(SeqCst));
    if g2.tag() != tag || g2.closed() {
        return None;
    }
    // Row 1, with a budget only (without, `T`, `r` and the effective budget are all 0).
    if p.shape & SHAPE_HAS_BUDGET != 0 && t_sum.saturating_add(r) > p.eff_or_zero(priority) {
        return None;
    }
    c.rejected[reason.index()].incr();
    c.classes[k].rejected[reason.index()].incr();
    // Every field below is within its packed width by the words it comes from (`n`: 14 bits,
    // the ring's class limits: 16 and 32, `U`: 16, `V`: 32); only `Σ pt` can be wider.
    Some(ShortRefusal {
        reason,
        constraint,
        used: Counts::used(t_sum, n_sum),
        p,
        class: ClassCounts::from_words(
            shared.class_ids[k],
            ClassWords {
                own: t | (n << 32) | (l.pc() << 48),
                floors: l.pt() | (l.mc_or_zero() << 32) | (g.u().saturating_sub(sum_pc) << 48),
                max_tokens: l.mt_or_zero() as u32,
                sum_pc: sum_pc as u16,
                ceilings: Ceilings::from_bits(l.ceilings()),
                shared_tokens: sum_pt.min(u64::from(u32::MAX))
                    | (g.v().saturating_sub(sum_pt) << 32),
            },
        ),
    })
}

/// The refusal of a borrower that the stored shared word refused ([`StopAt::Shared`]) when
/// what its class alone borrows already refuses it (rows 4 and 5 of [`Summary::decide`]),
/// as `(reason, constraint)`; `None` when the class alone does not decide it (a collect
/// does, [`shared_refusal`]). From the class word the attempt read (`n` slots and `t` tokens
/// under the class's floors `pc`, `pt`), for a demand of `r` tokens, under the tag's
/// `max_concurrent` `mc`, effective budget `eff` and floor sums.
///
/// The class's own borrowing is a lower bound of every class's: row 4 counts
/// `G − Σ min(n_j, pc_j) ≥ n − pc` slots borrowed when the class borrows its slot
/// (`n ≥ pc`), row 5 `T − Σ min(t_j, pt_j) ≥ t − min(t, pt)` tokens. So when the class's own
/// amounts, read at once in one word, pass the row's limit, the row refuses in the state of
/// that read, whatever the other classes held. Row 4 comes before row 5: when row 4 applies
/// (a slot borrowed, and some class has a floor of slots) and the class alone does not fill
/// the shared slots, the other classes may, and only a collect can tell which row refuses;
/// the token row decides here only when row 4 cannot refuse, whatever the other classes
/// hold. The stored `U` and `V`, which may count steps in progress, decide nothing here.
/// Under `LLM_BULKHEAD_OWN_PROTECTION_ROW_5_FIRST=1` (feature `testing`), the token row is
/// checked where row 4 applies: the broken variant on which a borrower that other classes'
/// slots refuse is reported refused for its tokens
/// (`tests/class_refusals.rs`, `own_word`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn own_protection(
    pc: u64,
    pt: u64,
    n: u64,
    t: u64,
    r: u64,
    mc: u64,
    eff: u64,
    sum_pc: u64,
    sum_pt: u64,
) -> Option<(RejectReason, Constraint)> {
    if trusts_stored_for_tests() {
        return Some((RejectReason::ConcurrencyLimit, Constraint::Global));
    }
    if n >= pc && sum_pc > 0 && !row_5_first_for_tests() {
        return (n - pc + 1 > mc.saturating_sub(sum_pc)).then_some((
            RejectReason::ConcurrencyLimit,
            Constraint::AdmissionClassProtection,
        ));
    }
    let borrow_t = r - r.min(pt.saturating_sub(t));
    (sum_pt > 0 && borrow_t > 0 && (t - t.min(pt)) + borrow_t > eff.saturating_sub(sum_pt))
        .then_some((
            RejectReason::BudgetLimit,
            Constraint::AdmissionClassProtection,
        ))
}

/// The broken variant of [`own_protection`]'s row order (see there).
#[inline(always)]
fn row_5_first_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_OWN_PROTECTION_ROW_5_FIRST")
}

/// The words the fast attempt reads, read again inside the operation `_op`, and where it
/// would stop on them without a step: the shared word, the class's limits under its tag and
/// the class word, as a [`Stopped`] at [`StopAt::Shared`] for [`shared_refusal`] when the
/// bulkhead is open, nobody is queued, the class word is at its version under the tag, within
/// both ceilings (rows 2 and 3), and row 1 or the stored shared word refuses the demand (a
/// borrower's rows 4 and 5 on the stored `U`, `V`): the checks of `first_try_or_ceiling`, in
/// its order, without its steps. `None` otherwise (the caller decides another way): a step
/// would be tried, or the attempt would give up or stop at a ceiling.
#[inline(always)]
pub(crate) fn read_stopped(
    _op: &crate::grace::Op<'_>,
    shared: &Shared,
    k: usize,
    r: u64,
    priority: Priority,
) -> Option<Stopped> {
    let g = GWord(shared.word.load(SeqCst));
    let tag = g.tag();
    let cl = shared.ring.read_class_words(tag, k);
    let c = CWord(shared.class_words[k].load(SeqCst));
    if g.closed() || g.waiters() || c.ctag() != cl.version() {
        return None;
    }
    if ceiling_stop(cl, c, r).is_some() {
        return None;
    }
    let p = shared.ring.read_packed(tag);
    let (eff, mc, l) = (p.eff_or_zero(priority), p.hot().max_concurrent, cl.hot());
    if g.u() > mc {
        return None;
    }
    let (n, t) = (c.in_flight(), c.tokens());
    let borrow_c = n >= l.pc;
    let stops = r > eff || {
        let dv = (t + r).max(l.pt) - t.max(l.pt);
        (borrow_c || dv > 0) && stored_refuses_borrower(g, borrow_c, dv, mc, eff)
    };
    stops.then_some(Stopped {
        g,
        c,
        cl,
        at: StopAt::Shared,
    })
}

/// The refusal of a demand of `r` tokens at `priority` in class `k` that the fast attempt
/// stopped at the shared remainder ([`StopAt::Shared`]) and that its class's own borrowing
/// does not explain ([`own_word_refusal`] left it): row 1 refuses it, or the stored shared
/// word has no room for what it borrows. Decided and counted in `c` inside an attempt's
/// operation `_op` (the second attempt's, or the re-read's, out of line), and kept in the
/// same few words as [`own_word_refusal`]'s (built as its own, not through a helper shared
/// with it: a helper cost the ceiling refusal 3 instructions).
///
/// The stored `U` and `V` may count steps of other deciders in progress (a reservation about
/// to be taken back, a release between its two words), so they do not decide alone: the
/// sequential rule does ([`Summary::decide`], rows 1, 4, 5 and 6; rows 2 and 3 passed on the
/// class word the attempt read), from the collect below, as [`explain`] decides from its
/// collect. The collect: the class word as the attempt read it and one read of every other
/// class word, with each class's floors under the tag, for the totals `G` and `T` and the
/// parts of them inside the floors (`Σ min(n_j, pc_j)`, `Σ min(t_j, pt_j)`). A re-read of the
/// shared word with the same tag, still open, shows that the limits read were in force when
/// the words were read (no tag comes back during an operation, `crate::grace`): the refusal
/// takes effect at that read. A migration in progress changes no class's `(n, t)`, and the
/// rule applies the tag's limits whatever version a class word is on, so the collect needs
/// no version check.
///
/// `None` when the rule admits the demand (the stored amounts counted steps in progress), or
/// the tag moved or the bulkhead closed. The refusal keeps the totals, the class's word and
/// limits, the floor sums and the shared remainder in use from the collect; its detail is
/// computed only when asked ([`Rejection::detail`]). Runs no user code.
#[inline(always)]
pub(crate) fn shared_refusal(
    shared: &Shared,
    c: &crate::record::stats::Counters,
    k: usize,
    r: u64,
    priority: Priority,
    past: Stopped,
    _op: &crate::grace::Op<'_>,
) -> Option<ShortRefusal> {
    let Stopped {
        g, c: own, cl: l, ..
    } = past;
    let word = &*shared.word;
    let tag = g.tag();
    let (n, t) = (own.in_flight(), own.tokens());
    let (pc, pt) = (l.pc(), l.pt());
    // `G`, `T` and the parts of them inside the floors, with the class's own word as the
    // attempt read it: one loop over the words before it and one over those after it.
    let (mut n_sum, mut t_sum) = (n, t);
    let (mut prot_c, mut prot_t) = (n.min(pc), t.min(pt));
    let mut add = |j: usize| {
        let w = CWord(shared.class_words[j].load(SeqCst));
        let lj = shared.ring.read_class_words(tag, j);
        let (nj, tj) = (w.in_flight(), w.tokens());
        n_sum += nj;
        t_sum += tj;
        prot_c += nj.min(lj.pc());
        prot_t += tj.min(lj.pt());
    };
    for j in 0..k {
        add(j);
    }
    for j in k + 1..shared.class_words.len() {
        add(j);
    }
    // The slot's other words: the re-read of the shared word below, still at `tag`, shows that
    // they are `tag`'s (a slot is rewritten only by the install of a tag `RING` later, and no
    // tag comes back during an operation, `crate::grace`).
    let p = shared.ring.read_packed(tag);
    let (sum_pc, sum_pt) = shared.ring.read_sums(tag);
    let g2 = GWord(word.load(SeqCst));
    if g2.tag() != tag || g2.closed() {
        return None;
    }
    // Row 1 needs a budget (without, `T`, `r` and the effective budget are all 0).
    let has_budget = p.shape & SHAPE_HAS_BUDGET != 0;
    let eff = p.eff_or_zero(priority);
    let mc = p.hot().max_concurrent;
    let borrow_t = r - r.min(pt.saturating_sub(t));
    // The rows of `Summary::decide` after the ceilings, in its order.
    let (reason, constraint) = if trusts_stored_for_tests() {
        (RejectReason::ConcurrencyLimit, Constraint::Global)
    } else if has_budget && t_sum.saturating_add(r) > eff {
        (RejectReason::BudgetLimit, Constraint::Global)
    } else if sum_pc > 0 && n >= pc && n_sum - prot_c + 1 > mc.saturating_sub(sum_pc) {
        (
            RejectReason::ConcurrencyLimit,
            Constraint::AdmissionClassProtection,
        )
    } else if has_budget
        && sum_pt > 0
        && borrow_t > 0
        && (t_sum - prot_t).saturating_add(borrow_t) > eff.saturating_sub(sum_pt)
    {
        (
            RejectReason::BudgetLimit,
            Constraint::AdmissionClassProtection,
        )
    } else if n_sum >= mc {
        (RejectReason::ConcurrencyLimit, Constraint::Global)
    } else {
        return None;
    };
    c.rejected[reason.index()].incr();
    c.classes[k].rejected[reason.index()].incr();
    let (shared_c, shared_t) = (n_sum - prot_c, t_sum - prot_t);
    // Every field below is within its packed width: `n` 14 bits, the ring's class limits 16
    // and 32, the shared remainder in use cut to its field (the engine's values fit); only
    // `Σ pt` can be wider.
    Some(ShortRefusal {
        reason,
        constraint,
        used: Counts::used(t_sum, n_sum),
        p,
        class: ClassCounts::from_words(
            shared.class_ids[k],
            ClassWords {
                own: t | (n << 32) | (pc << 48),
                floors: pt | (l.mc_or_zero() << 32) | (shared_c.min(0xffff) << 48),
                max_tokens: l.mt_or_zero() as u32,
                sum_pc: sum_pc as u16,
                ceilings: Ceilings::from_bits(l.ceilings()),
                shared_tokens: sum_pt.min(u64::from(u32::MAX))
                    | (shared_t.min(u64::from(u32::MAX)) << 32),
            },
        ),
    })
}

/// The deliberately broken variant `LLM_BULKHEAD_SHORT_REFUSAL_TRUSTS_STORED=1` (feature
/// `testing`): [`own_protection`] and [`shared_refusal`] refuse on the stored shared word
/// alone, without the rule on the class's word or on a collect. `tests/class_refusals.rs`
/// (`a_conservative_shared_word_refuses_no_one`) fails on it.
#[inline(always)]
fn trusts_stored_for_tests() -> bool {
    test_switch!("LLM_BULKHEAD_SHORT_REFUSAL_TRUSTS_STORED")
}

/// A refusal decided on the short path ([`own_word_refusal`], [`shared_refusal`]) as the words
/// it was decided on: a few words the caller turns into the [`Rejection`] in its own result
/// ([`ShortRefusal::rejection`]).
#[derive(Clone, Copy)]
pub(crate) struct ShortRefusal {
    reason: RejectReason,
    constraint: Constraint,
    /// `T` (low 32 bits) and `G` (from bit 32), as [`Counts::used`] keeps them.
    used: u64,
    p: crate::words::limits::Packed,
    class: ClassCounts,
}

impl ShortRefusal {
    /// The refusal of a demand of `r` tokens at `priority`.
    #[inline(always)]
    pub(crate) fn rejection(self, r: u64, priority: Priority) -> Rejection {
        let used = crate::words::state::Word(self.used);
        let mut rej =
            crate::protocol::plain::packed_rejection(used, self.p, self.reason, r, priority);
        rej.constraint = Some(self.constraint);
        rej.set_class(self.class);
        rej
    }
}

/// What one collect of the words (no allocation) says of a demand: the waiting path uses it
/// to go to the queue without a decision of its own (which would be refused, and explained
/// at the cost of an allocating collect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precheck {
    /// Rows 1–5 refuse it, or the collect was torn by a tag change: take the full path.
    Refused,
    /// Rows 1–5 pass and no global slot is free.
    NoSlot,
    /// It fits.
    Fits,
}

/// [`Precheck`] of a demand of `r` tokens in class `k`.
pub(crate) fn precheck(shared: &Shared, k: usize, r: u64, priority: Priority) -> Precheck {
    const ROOM: usize = 16;
    let n = shared.class_words.len();
    if n > ROOM {
        return Precheck::Refused;
    }
    let _op = crate::grace::op(shared.grace_id);
    let g = GWord(shared.word.load(SeqCst));
    let mut classes = [(0u64, 0u64); ROOM];
    let mut limits = [HotClass {
        pc: 0,
        mc: None,
        pt: 0,
        mt: None,
    }; ROOM];
    let (mut gsum, mut tsum) = (0, 0);
    for j in 0..n {
        let c = CWord(shared.class_words[j].load(SeqCst));
        classes[j] = (c.in_flight(), c.tokens());
        gsum += c.in_flight();
        tsum += c.tokens();
        limits[j] = shared.ring.read_class(g.tag(), j);
    }
    if GWord(shared.word.load(SeqCst)).tag() != g.tag() {
        return Precheck::Refused;
    }
    let lim = shared.ring.read(g.tag());
    let view = ClassView {
        g: gsum,
        t: tsum,
        classes: &classes[..n],
        limits: &limits[..n],
        max_concurrent: lim.max_concurrent,
        eff: lim.effective(priority),
    };
    match view.decide(k, r) {
        None => Precheck::Fits,
        Some((RejectReason::ConcurrencyLimit, Constraint::Global)) => Precheck::NoSlot,
        Some(_) => Precheck::Refused,
    }
}

/// A refusal of a demand in class `k` with `reason` and `constraint` given by the caller (a
/// queued waiter's answer), with the detail of a collect of the state now.
pub(crate) fn describe(
    shared: &Shared,
    k: usize,
    priority: Priority,
    reason: RejectReason,
    constraint: Option<Constraint>,
) -> Refused {
    let _op = crate::grace::op(shared.grace_id);
    let g = GWord(shared.word.load(SeqCst));
    let lim = shared.ring.read(g.tag());
    Refused {
        reason,
        constraint,
        lim,
        summary: summarize(shared, g.tag(), &lim, k, priority),
        stored_shared: None,
    }
}

/// A refusal whose collects kept saying the demand fits: the attempt was refused by the stored
/// shared word, which still counted steps of other deciders in progress. Reported with the
/// reason the attempt found, the detail of a last collect and the stored shared amounts, and the
/// constraint the sequential rule (`ClassView::decide`, CONTRACT.md §2 rows 4–6) gives for the
/// stored amounts: `admission_class_protection` only for a demand that borrows the refused kind
/// (a slot for `concurrency_limit`, tokens for `budget_limit`) while floors exist; a demand
/// inside its class's floors is never refused for protection, so it gets `global`.
#[cold]
pub(super) fn explain_final(shared: &Shared, req: Req, hint: RejectReason) -> Refused {
    crate::sync::pause(crate::sync::PausePoint::RefusedAfterRetries);
    // Its own operation: the retries before it waited outside any (`super::retries::FITS_RETRIES`).
    let _op = crate::grace::op(shared.grace_id);
    let g = GWord(shared.word.load(SeqCst));
    let (sum_pc, sum_pt) = shared.ring.read_sums(g.tag());
    let detail = describe(shared, req.k, req.priority, hint, None);
    let (n, t) = detail.summary.own;
    let own = detail.summary.limits;
    let constraint = match hint {
        RejectReason::Shutdown => None,
        RejectReason::ConcurrencyLimit if sum_pc > 0 && n >= own.pc => {
            Some(Constraint::AdmissionClassProtection)
        }
        RejectReason::BudgetLimit if sum_pt > 0 && (t + req.r).max(own.pt) > t.max(own.pt) => {
            Some(Constraint::AdmissionClassProtection)
        }
        _ => Some(Constraint::Global),
    };
    Refused {
        constraint,
        stored_shared: Some((g.u().saturating_sub(sum_pc), g.v().saturating_sub(sum_pt))),
        ..detail
    }
}
