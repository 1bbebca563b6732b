//! The class protocol's refusals: the collect over every class word, the explanation of a
//! refusal from a fresh collect (`super`, "Precision"), the advisory precheck.

#![allow(clippy::result_large_err)]

use super::*;

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
