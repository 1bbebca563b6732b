//! In-floor newcomers bypass the queue (`super`, "Bypass").
//!
//! # The rule
//!
//! While waiters are queued (`WAITERS` on the shared word) a newcomer of class `k` is
//! admitted ahead of them iff, at its decision:
//!
//! 1. its demand is **protected**: inside class `k`'s floors, borrowing neither a slot
//!    (`n_k < protected_concurrent_k`) nor tokens (`dv = 0`: `t_k + r ≤ protected_tokens_k`,
//!    or `r = 0`), which is exactly the protected fast path of `super::attempt`;
//! 2. no waiter of class `k` is queued (per-class FIFO: a class's own newcomers never pass
//!    its waiters);
//! 3. `U ≤ max_concurrent` and `V ≤ B − H`, the **lowest** effective budget (normal
//!    priority), read on the shared word (the protected path alone asks `V ≤ eff` of the
//!    newcomer's own priority; the bypass needs the lowest one, below).
//!
//! Rows 0–5 pass as for any admission, and row 6 follows from (1) and (3).
//!
//! # Why no queued waiter is delayed by it
//!
//! Under (3), every queued waiter `W` of another class `j` decides on `U`, `V` and its own
//! class word only: a borrowing `W` needs `U + du ≤ MC` (row 4, which implies row 6 because
//! `G ≤ U`) and `V + dv ≤ eff(W)` (row 5, implying row 1 because `T ≤ V`); a protected `W`
//! needs rows 1 and 6, which `U ≤ MC` and `V ≤ B − H ≤ eff(W)` imply whatever `G` and `T`
//! are. A protected newcomer changes neither `U` nor `V` (its slot and tokens sit inside its
//! class's floors, which `U` and `V` already count) nor `W`'s class word. So while (3) holds
//! it changes no queued waiter's admission decision, now or later; when (3) fails nobody
//! bypasses. With `V > B − H` (the high-priority reserve in use) a protected normal-priority
//! waiter is decided on the exact `T` (`super`, "Rare paths"), which a newcomer's tokens
//! would change: hence the lowest effective budget in (3), not the newcomer's own.
//!
//! Two effects remain, and are intended. A bypasser holds its slot and tokens until it is
//! released like any admission: a later reconfiguration that takes `U` above
//! `max_concurrent` or `V` above `B − H` (a raised floor, a lowered budget) makes waiters
//! decide on `G` and `T` exactly, where the bypasser counts. And a head that is refused by a
//! class rule (rows 2–5) while a global slot is free is answered at once, but kept queued when
//! no global slot is free (`crate::protocol::class_pump`): a bypasser that takes the last
//! free slot (then `G = U = MC`) turns that answer into "keep waiting".
//!
//! Without token waiting the rule never fires at rest: waiters are queued only while no global
//! slot is free (`G = MC`), and a protected newcomer needs `G + 1 ≤ U ≤ MC`. It can fire in the
//! instant between a release's class-word step and its visit of the queue, with the argument
//! above unchanged. It is therefore unconditional: one rule, which the sequential model
//! (`crate::model`) states the same way.
//!
//! # The race on (2)
//!
//! `Shared::queued_classes` has one bit per class with a waiter queued. It is written only
//! under the queue mutex: an enqueuer of class `k` raises bit `k` (`fetch_or`, `SeqCst`)
//! before it decides under the mutex or joins the tail
//! (`crate::protocol::class_pump::raise_queued_class`), and every unlock stores the queue's
//! exact mask (`crate::shared::QueueGuard`), which lowers a bit once no waiter of that class
//! is queued (admitted, refused, timed out, cancelled, closed, swept). A bypasser reads it
//! `SeqCst` **after** its `SeqCst` class-word CAS (Dekker): if its read comes before the
//! enqueuer's raise in the `SeqCst` order, its class step comes before the enqueuer's decision,
//! which sees it; otherwise it sees the bit, takes its class step back (a decrease on a
//! flagged class word, which visits the queue, so an enqueuer refused because of the tentative
//! step is decided again) and does not bypass. The mask is read only when the shared word shows
//! `WAITERS`, so the no-waiter fast path pays nothing. A bit raised for an enqueuer that is then
//! admitted or refused stays up until that enqueuer unlocks: a same-class newcomer meanwhile
//! is refused as if the enqueuer were queued (transient, never unsafe).

use super::*;

/// Condition (3) on shared word `g` under limits `lim`.
#[inline]
pub(super) fn room(g: GWord, lim: &Hot) -> bool {
    g.u() <= lim.max_concurrent && lim.effective(Priority::Normal).is_none_or(|e| g.v() <= e)
}

/// Condition (2): no waiter of class `k` is queued (or being enqueued under the mutex).
#[inline]
pub(super) fn class_not_queued(shared: &Shared, k: usize) -> bool {
    shared.queued_classes.load(SeqCst) & (1 << k) == 0
}

/// Condition (2) read after the class-word CAS. Under loom,
/// `LLM_BULKHEAD_LOOM_NO_CLASS_COUNT_RECHECK=1` skips this read, leaving only the read before
/// the CAS: the deliberately broken variant `loom-tests/tests/bypass.rs` is shown to fail on.
#[inline]
pub(super) fn recheck(shared: &Shared, k: usize) -> bool {
    #[cfg(loom)]
    if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_NO_CLASS_COUNT_RECHECK") {
        return true;
    }
    class_not_queued(shared, k)
}

/// Whether class state `(n, t)` under floors `l` takes `r` more tokens and a slot inside its
/// floors: condition (1).
#[inline]
pub(super) fn protected(l: &HotClass, n: u64, t: u64, r: u64) -> bool {
    n < l.pc && t.saturating_add(r).max(l.pt) == t.max(l.pt)
}

/// The waiting path's advisory check (`crate::wait::waiting`, class mode): whether a demand of
/// `r` tokens in class `k` would bypass the queued waiters now, so that it makes the decision
/// (which admits it) instead of joining the tail. Reads only; the decision checks again.
pub(crate) fn may_bypass(shared: &Shared, k: usize, r: u64) -> bool {
    let _op = crate::grace::op(shared.grace_id);
    let g = GWord(shared.word.load(SeqCst));
    let lim = shared.ring.read(g.tag());
    let (ver, l) = shared.ring.read_class_versioned(g.tag(), k);
    let c = CWord(shared.class_words[k].load(SeqCst));
    c.ctag() == ver
        && protected(&l, c.in_flight(), c.tokens(), r)
        && room(g, &lim)
        && class_not_queued(shared, k)
}
