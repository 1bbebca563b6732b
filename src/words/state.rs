//! The atomic state layout: one packed 64-bit word per bulkhead.
//!
//! # The word
//!
//! ```text
//!  63      62       61..48        47       46..32          31..0
//! +------+--------+-----------+--------+--------------+-----------------+
//! |closed|waiters | limits tag|detached| slots in use | tokens held (T) |
//! +------+--------+-----------+--------+--------------+-----------------+
//! ```
//!
//! * **tokens held** `T`: the sum of the holds of every admission not yet released
//!   (CONTRACT.md §1). At most [`MAX_TOKENS`]; budgets above that are refused by validation, and
//!   a usage report that would push `T` past it is refused with a typed error.
//! * **slots in use** `G`: admissions holding a global slot. At most [`MAX_SLOTS`];
//!   `max_concurrent` above that is refused by validation.
//! * **limits tag**: the low 14 bits (`TAG_BITS`) of the install counter of the limits snapshot
//!   that is current. The snapshot itself lives in a small ring (see `crate::words::limits`); the tag
//!   names its slot. Installing a snapshot bumps the tag with a CAS, so any decision that read
//!   the word before the install fails its CAS afterwards (CONTRACT.md §6, last sentence).
//! * **detached**: set once the last `Bulkhead` handle is gone; the admission that returns the
//!   last slot then ends the owners' joint lifetime reference (see `src/shared.rs`: a held slot
//!   is what keeps an admission's view of the bulkhead alive, so admissions need no reference
//!   count).
//! * **waiters**: set while the wait queue is non-empty or a drainer waits (see
//!   `crate::wait::waiting`). While waiters are queued the fast path admits nobody (newcomers cannot
//!   barge) and a release hands its slot to the queue; while only drainers wait, a decider and
//!   a release consult the queue-length mirror instead of the queue's mutex.
//! * **closed**: set once by `close()`, never cleared.
//!
//! Every writer preserves the flag bits: admissions, releases and tag bumps are CASes that copy
//! them; a usage report that shrinks a hold is a `fetch_sub` of a token amount that cannot
//! borrow across a field boundary (it subtracts what its admission still holds).
//!
//! # One decision, operation by operation
//!
//! Written from the code as it stands. "Lock-free" means some thread always completes an
//! operation in a bounded number of its own steps; "blocking" means the operation may wait
//! for a lock held by another thread.
//!
//! | operation | progress | why |
//! |---|---|---|
//! | `try_acquire` | lock-free | a load, three loads of the current ring slot, then one CAS. A failed CAS means another thread changed the word, i.e. made progress; the loop retries with the value the CAS returned, after a short bounded exponential backoff (three steps of `crossbeam_utils::Backoff::spin` per retry, at most 192 spin hints: `crate::protocol::backoff`). It cannot be wait-free without taking a tentative `fetch_add` and undoing it, which would let one request be refused because of another's undone step (forbidden by CONTRACT.md §9.4 and §10 "precision"). With `WAITERS` up and a slot free (the flag is up for drainers only) it reads the queue-length mirror and admits with a CAS: still no lock (`crate::protocol::plain::admit_if_nobody_waits`). |
//! | refusal | lock-free | the refusal re-reads the word after reading the limits; if the tag moved, the limits may be torn and the decision is retried, so every refusal is explained by one real state. Its `pending` detail is read under the queue mutex, held for a few instructions: a refusal is lock-free in its decision and briefly blocking in its report. |
//! | `release`, `drop(Admission)` | lock-free; blocking while waiters are queued | one CAS of the word returning the slot and the hold (a CAS, not a `fetch_sub`, because the word it replaces says whether waiters are queued), retried only when another thread changed the word. While waiters are queued the release takes the queue mutex and hands its slot to the head waiter (`crate::protocol::handoff::hand_off`). While only drainers wait it returns its slot with the CAS and locks only if a waiter queued meanwhile or it left the bulkhead idle (to wake the drainers). The release that frees the shared state does one more `fetch_sub`, on the lifetime count. |
//! | `report_usage` shrinking a hold | wait-free | one `fetch_sub` (no classes); with classes, a class-word CAS loop and one `fetch_sub`, and a visit to the queue (blocking) while the queue is flagged. |
//! | `report_usage` growing a hold | lock-free | a CAS loop whose only check is that `T` stays within the field. |
//! | `try_acquire` with classes | lock-free | a CAS on the class word, a collect of the class words when borrowing, a CAS on the shared word; a failed step is undone with one CAS on the class word and one `fetch_sub`, and retried only when another thread changed a word or the limits. |
//! | `release` with classes | lock-free; blocking while the queue is flagged | inside the class's floors: one CAS on the class word (retried only when another thread changed it). Otherwise (or for an admission that borrowed, whose release is one `fetch_sub` of the class word) then one `fetch_sub` of the shared word, inside the release's grace-period operation, which keeps the state allocated (`crate::protocol::classed`, "Lifetime"). While waiters are queued or drainers wait (`C_QUEUE` on the class word, or `WAITERS` on the shared word) the release visits the queue under its mutex before it leaves the operation. |
//! | `abandon_borrowed_concurrency` | lock-free; blocking while the queue is flagged | a CAS loop on the handle count (the pin), then the class decrease (a class-word CAS and one `fetch_sub`), which visits the queue while it is flagged. |
//! | `close` | blocking, briefly | one `fetch_or`, then the queue mutex: every waiter is answered with `shutdown`, woken outside the lock in batches of 32. |
//! | `stats`, `limits` | blocking, briefly | both copy the canonical snapshot under the reconfiguration lock (held only by `apply_limits`, for microseconds); `stats` also reads `queued_total` under the queue mutex, then reads the word and every thread's counters without locking. Neither is on a decision path. |
//! | `apply_limits` | blocking among reconfigurers only | serialised by a mutex; never blocks a decider. It writes a fresh ring slot, then bumps the tag with a CAS loop (lock-free against deciders); with waiters queued it then pumps under the queue mutex. |
//! | `acquire_blocking`, `acquire`, `drain_blocking`, `drain` | blocking | by design: the queue mutex on entry and exit, and the wait itself. |
//! | slow paths' lifetime | wait-free | a slow path that may give its slot away first counts a `SlowPathRef` (`src/shared.rs`; one `fetch_add`) and drops it after its last touch (one `fetch_sub`). The fast paths never touch the count. |
//!
//! **A thread's first decision.** Statistics live in per-thread entries
//! (`crate::sync::Stripes`, over the `thread_local` crate). A thread's first use of a given
//! bulkhead allocates its entry (a heap allocation and a lock-free insertion), and a thread's
//! first use of *any* bulkhead also registers the thread with the `thread_local` crate, which
//! takes that crate's global thread-id lock once. So the first decision a thread ever makes
//! may block briefly on a process-wide lock; every later decision on that thread is as the
//! table says.
//!
//! # Memory ordering
//!
//! * A successful admission CAS is `AcqRel`: acquire pairs with the release of the previous
//!   release's CAS (or a hand-off's CAS, which passes a slot on in place: work done under an
//!   admission happens-before work done under the admission that reuses its capacity, as with a
//!   semaphore), and with the tag bump of `apply_limits`, so the ring slot named by the tag is
//!   visible.
//! * Ring slot fields are written with `Relaxed` stores after a `Release` fence and read with
//!   `Acquire` loads. A reader that sees a value written for a later install therefore also sees
//!   that install's earlier tag bump, and its CAS (or the re-read of a refusal) fails. See
//!   `crate::words::limits`.
//! * `close` is a `fetch_or` with `SeqCst`; a decision that loaded the word before it fails its
//!   CAS afterwards.
//! * The queue-length mirror and the drain-time release are a store→load pattern across two
//!   atomics (an enqueuer stores the mirror, then CASes the word; a release CASes the word, then
//!   loads the mirror): all four are `SeqCst`, and the loom build adds a `SeqCst` fence
//!   (`crate::sync::loom_sc_fence`).
//!
//! # ABA on the tag: excluded by a grace period
//!
//! The tag has 14 bits, so 2^14 = 16,384 installs bring it back to a value an old decision
//! read. On its own that would let a decider stopped between its load and its CAS commit under
//! a superseded snapshot (reproduced deterministically in `tests/tag_wrap.rs`). It cannot
//! happen: an install does not bump the tag while an operation of its bulkhead that may hold a
//! count a whole tag period old is still in progress (per-thread markers, the installer's own
//! scans and an asymmetric barrier, `src/grace.rs`), so no tag value is ever reused under a
//! stopped decision, whatever the install rate and however long a decider is descheduled. It
//! waits for nothing else: not for other bulkheads, not for operations that began within the
//! period. Under loom the tag is one bit and the models in `loom-tests/tests/tag_wrap.rs` cross
//! a wrap with two installs.
//!
//! # Admission classes
//!
//! A bulkhead with classes does not use this layout: its state word holds `U` and `V`
//! (CONTRACT.md §4) in place of `G` and `T`, beside one word per class, and runs the protocol
//! written down in `crate::protocol::classed`. The tag and the waiters and closed flags sit at the same
//! places in both layouts, so the limits ring, `close` and `apply_limits`' tag bump are shared.
//! The choice is made at construction; the no-class fast path tests one flag and never pays for
//! classes.
//!
//!
//! # Waiting
//!
//! The wait queue, the hand-off and the `WAITERS` flag's protocol (no lost wake-up, no
//! barging) are written down in `crate::wait::waiting`; the lifetime of the shared state on those
//! slow paths in `crate::shared`, "Slow paths".

/// Bits of the token field.
pub(crate) const TOKEN_BITS: u32 = 32;
/// Bits of the slot field.
pub(crate) const SLOT_BITS: u32 = 15;
/// Bits of the limits tag: 14, or one under loom, so that a model with two installs brings the
/// tag back to the value a stopped operation read (the grace period of `crate::grace` is what
/// makes that harmless, and the loom models check it).
pub(crate) const TAG_BITS: u32 = if cfg!(loom) { 1 } else { 14 };

const SLOT_SHIFT: u32 = TOKEN_BITS;
const TAG_SHIFT: u32 = 48;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;
const SLOT_MASK: u64 = ((1 << SLOT_BITS) - 1) << SLOT_SHIFT;
pub(crate) const TAG_MASK: u64 = ((1 << TAG_BITS) - 1) << TAG_SHIFT;
/// The tag the word carries for the install count `n` (the limits tag is that count modulo
/// the field's width, `2^TAG_BITS`).
#[inline(always)]
pub(crate) fn tag_of(n: usize) -> usize {
    n % (1 << TAG_BITS)
}
pub(crate) const DETACHED: u64 = 1 << 47;
pub(crate) const WAITERS: u64 = 1 << 62;
pub(crate) const CLOSED: u64 = 1 << 63;

/// The largest token budget (and the largest number of tokens that can be held at once).
pub const MAX_TOKENS: u64 = TOKEN_MASK;
/// The largest `max_concurrent`.
pub const MAX_SLOTS: u32 = (1 << SLOT_BITS) - 1;
// A refusal keeps the word's low bits as they are and reads the slot field itself
// (`crate::vocab::rejection::Counts::used`).
const _: () = assert!(MAX_SLOTS as u64 == crate::vocab::rejection::USED_SLOTS && SLOT_SHIFT == 32);

/// One slot, as an amount to add to or subtract from the word.
pub(crate) const ONE_SLOT: u64 = 1 << SLOT_SHIFT;

/// A decoded view of the word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

impl Word {
    #[inline]
    pub(crate) fn tokens(self) -> u64 {
        self.0 & TOKEN_MASK
    }
    #[inline]
    pub(crate) fn slots(self) -> u64 {
        (self.0 & SLOT_MASK) >> SLOT_SHIFT
    }
    #[inline]
    pub(crate) fn tag(self) -> usize {
        ((self.0 & TAG_MASK) >> TAG_SHIFT) as usize
    }
    /// Whether `self` and `other` carry the same tag (the `TAG_BITS` bits from bit 48: the
    /// words differ there iff their XOR shifted down and cut to `TAG_BITS` bits is not zero).
    #[inline]
    pub(crate) fn same_tag(self, other: Word) -> bool {
        ((self.0 ^ other.0) >> TAG_SHIFT) & ((1 << TAG_BITS) - 1) == 0
    }
    #[inline]
    pub(crate) fn closed(self) -> bool {
        self.0 & CLOSED != 0
    }
    #[inline]
    pub(crate) fn detached(self) -> bool {
        self.0 & DETACHED != 0
    }
    #[inline]
    pub(crate) fn waiters(self) -> bool {
        self.0 & WAITERS != 0
    }
    /// The same word with the tag advanced by one (wrapping inside the field).
    #[inline]
    pub(crate) fn with_next_tag(self) -> Word {
        let next = ((self.tag() as u64 + 1) << TAG_SHIFT) & TAG_MASK;
        Word((self.0 & !TAG_MASK) | next)
    }
    /// The same word with one more slot and `tokens` more tokens. The caller has checked that
    /// both fields stay in range.
    #[inline]
    pub(crate) fn plus(self, tokens: u64) -> Word {
        debug_assert!(self.slots() < u64::from(MAX_SLOTS));
        debug_assert!(self.tokens() + tokens <= MAX_TOKENS);
        Word(self.0 + ONE_SLOT + tokens)
    }
}

impl std::fmt::Debug for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Word")
            .field("tokens", &self.tokens())
            .field("slots", &self.slots())
            .field("tag", &self.tag())
            .field("detached", &self.detached())
            .field("waiters", &self.waiters())
            .field("closed", &self.closed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_do_not_overlap() {
        assert_eq!(TOKEN_MASK & SLOT_MASK, 0);
        assert_eq!(SLOT_MASK & (TAG_MASK | DETACHED), 0);
        assert_eq!(TAG_MASK & (WAITERS | CLOSED | DETACHED), 0);
        let all = TOKEN_MASK | SLOT_MASK | DETACHED | TAG_MASK | WAITERS | CLOSED;
        assert_eq!(all, u64::MAX);
        assert_eq!(SLOT_SHIFT + SLOT_BITS, 47);
    }

    #[test]
    fn tag_wraps_inside_its_field() {
        let mut w = Word(CLOSED | WAITERS | DETACHED | (5 * ONE_SLOT) | 7);
        for _ in 0..(1 << TAG_BITS) {
            w = w.with_next_tag();
            assert!(w.closed() && w.waiters() && w.detached());
            assert_eq!((w.slots(), w.tokens()), (5, 7));
        }
        assert_eq!(w.tag(), 0);
    }

    #[test]
    fn plus_fills_fields_exactly() {
        let w = Word((u64::from(MAX_SLOTS) - 1) * ONE_SLOT).plus(MAX_TOKENS);
        assert_eq!(w.slots(), u64::from(MAX_SLOTS));
        assert_eq!(w.tokens(), MAX_TOKENS);
        assert_eq!(w.tag(), 0);
    }
}
