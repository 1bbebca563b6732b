//! Grace periods: why no limits tag can come back to a value an operation still holds.
//!
//! # The problem
//!
//! Every decision reads a state word, the limits its tag names (a slot of the ring in
//! `crate::words::limits`), and then commits with a CAS that expects the word it read. The tag
//! is what makes a decision read before a reconfiguration fail its CAS after it (CONTRACT.md
//! §6). But tags are narrow: 14 bits in the shared word and in a class word (the class's
//! version mod `2^14`, which names the entry of the class's floors table). An operation
//! preempted between its read and its CAS while a whole tag period of snapshots was installed
//! would find the word bit-identical again and commit with limits (or class floors) that are
//! no longer current: an over-admission, or a `U`/`V` decrease computed from the wrong floors,
//! which leaves the stored totals below the truth for good (issue 11 reproduced both;
//! `tests/tag_wrap.rs` keeps them).
//!
//! # The rule
//!
//! **An install never brings a tag to a value that an operation still in progress on the same
//! bulkhead may hold.** The state word's tag has the period `M = 2^14` installs. An operation
//! that holds a tag read at install count `t` is harmed only by the install that brings the
//! count to some `n ≡ t (mod M)` with `n > t`. A rewrite of the global ring slot `t` names
//! harms nobody: every decision that uses what it read there commits with a CAS that expects
//! the tag, or re-reads the tag before it acts (`crate::words::limits`; with classes too:
//! `crate::protocol::classed`, "Reconfiguration"). So before install `n` bumps the tag, it
//! waits for every operation of *its own bulkhead* that may hold a count `≤ n − M`: an
//! operation still in progress after a whole tag period. ABA is excluded by construction, not
//! by a probability: whatever the install rate and however long a thread is preempted, no
//! operation ever sees its tag value reused.
//!
//! # Class versions
//!
//! A class word's tag is the class's **version** mod `M`: the number of installs that changed
//! that class's own limits (floors or ceilings). An install that leaves a class's limits as
//! they were leaves its class word alone (`crate::protocol::install`); one that changes them
//! writes the new version's floors into the class's floors table (`M` entries, indexed by the
//! version mod `M`, `crate::words::floors`) and migrates the word to it. An operation holds a
//! class word's value and reads the floors entry its tag names, so it is harmed only by the
//! install that brings the class to a version `v` with an older version `u = v − M` that it
//! may hold. That install's count is at least `M − 1` above the count at which version `u + 1`
//! began, since every version is an install; an operation holding `u` has a count below that
//! one (it began before the install of `u + 1` had completed, migrations included: see "The
//! period a marker holds"). So its count is `≤ n − M` for the install `n` of version `v`,
//! which the limits tag's rule above already makes wait for it: no class bound of its own.
//!
//! Nothing waits per install. A preempted operation holds back only the install that would
//! complete a period over it: the 16,384th install after it began, whatever the install
//! changes, global limits or a class's floors and ceilings. A busy data plane (threads
//! preempted inside operations at every instant) therefore costs an install only a barrier
//! and a scan of the markers now and then. An operation on another bulkhead costs an install
//! nothing at all.
//!
//! The class tag used to be 2 bits wide, with a floors ring of 4 entries (CHANGELOG): the
//! fourth change of a class's limits had to wait for any operation preempted across all four,
//! which with a busy data plane meant a scheduler quantum once per four such installs (p99
//! 20-24 ms in `benches/install.rs`'s `classed, floors change`). The 14 bits of the class word
//! that the release without a pending-return mark left unused now hold the whole period.
//!
//! # How an operation is seen: per-thread markers
//!
//! Every operation that reads a tag (or a class word's tag) and then commits on it runs inside
//! an [`Op`]: it makes a **reader marker** of the calling thread odd before its first read, and
//! even again after its last step. A marker is written only by its thread, on a cache line no
//! other thread writes; entering costs a plain store and a compiler fence, leaving one plain
//! store. Markers live in two places:
//!
//! * a no-class decision (`crate::protocol::plain::try_admit` and `try_decide`), the class
//!   protocol's fast attempt (`crate::protocol::classed::try_fast`, and `try_fast_in`, whose
//!   operation also holds the refusals it stops at, `own_word_refusal` and `shared_refusal`) use
//!   the thread's counters entry of that bulkhead, which the decision looks up anyway to count
//!   the admission or the refusal: one lookup for both. Their callers hold a handle, so the
//!   entry outlives the operation. Such a marker belongs to one bulkhead: its sequence number
//!   alone (`s + 1` entering, `s + 2` leaving: never nested, [`enter_outermost`]);
//! * every other operation uses the thread's process-wide cell (`crate::sync::per_thread`): a
//!   class release gives its slot away inside its operation, and the free of the state waits
//!   for its marker ([`wait_for_operations`]), so the marker must not live in the bulkhead
//!   (it is left while the free may be under way). The cell holds `[bulkhead:32]
//!   [sequence:32]`: entering writes the bulkhead's grace id ([`GraceId`]) beside the odd
//!   sequence, so an installer of another bulkhead skips it. Operations on the cell nest (a
//!   release that pumps the queue decides for a waiter of the same bulkhead): only the
//!   outermost one moves the sequence; a nested one on another bulkhead would widen the id to
//!   [`ANY`], which every installer counts as its own.
//!
//! Ids are a process-wide serial cut to 32 bits: two bulkheads may share one (after 2^32
//! bulkheads), which only makes an installer wait for an operation it need not wait for, never
//! the other way round.
//!
//! # The period a marker holds: observed, not published
//!
//! A marker does not say which tag its operation read (publishing it would cost the decision a
//! second load of the word). The installer infers a lower bound instead, from its own scans.
//! A scan, under the reconfiguration lock, issues a heavy barrier and then reads every marker,
//! remembering (in [`Periods`], which the lock owns) each marker's value and, for an odd one,
//! the install count `since` from which its operation may hold tags:
//!
//! * a marker odd with the value the previous scan saw is the same operation: `since` is kept;
//! * any other odd marker (a new value, or a marker the previous scan did not see) began after
//!   the previous scan read it. The previous scan ran after the bump of its install count `p`,
//!   behind a heavy barrier; the operation stores its marker and then loads the word, with its
//!   own barrier between. That is the store→load (Dekker) pattern: since the scan did not see
//!   the store, the operation's load sees the bump, so it holds a count `≥ p`: `since = p`.
//!
//! Install `n` then waits for each odd marker of its bulkhead with `since ≤ n − M` to move,
//! and only then writes the ring slot and the floors entries, bumps the tag and migrates the
//! class words. An
//! operation that starts after the scan reads count `n − 1` or later, which `n` cannot reuse.
//! The wait is for operations that were in progress when the scan's barrier ran and had been
//! for a whole period; never for one that began after the install.
//!
//! A scan is made only every half period (every install under loom, where the period is 2;
//! every 8,192 otherwise), or sooner when an operation the last scan left running could be
//! due: an operation a scan finds new is bounded by the last scan that ran, which is older, so
//! the bound stays a lower bound and leaves it at least half a period. Most installs
//! therefore issue no barrier at all, with or without classes.
//!
//! # The barriers: asymmetric where the OS offers it
//!
//! A full fence on every decision costs a locked instruction (about as much as the CAS
//! itself). On Linux the operation instead issues only a compiler fence, and the installer
//! calls `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every running thread of
//! the process execute a full barrier before it returns (threads not running get one at their
//! context switch): the fence is paid by the rare side. The process registers for it when the
//! first bulkhead is built; if registration fails (an old kernel, a seccomp filter, another
//! OS), under Miri and under loom, both sides use `fence(SeqCst)` instead: the same argument
//! with the fence paid on every operation.
//!
//! # Progress
//!
//! Deciders never wait for anything here. `apply_limits` waits only for an operation of its
//! own bulkhead that was in progress across a whole tag period, never for another bulkhead's,
//! and never for a thread of its own (its markers are skipped). The free of a class-mode state
//! waits for the operations of its own bulkhead then in progress ([`wait_for_operations`]).
//! **No user code runs inside an operation**, so the wait is for the crate's own steps, never
//! for a callback that could block or call back:
//!
//! * a class refusal is built inside its decision's operation and its subscribers are called
//!   after it left, as without classes;
//! * no `Waker` is woken, cloned or dropped inside an operation or under the queue lock (whose
//!   guard is an operation): a class pump that a decrease runs inside its operation (a release,
//!   an undo, an abandonment, a refund) hands its wake-ups to the calling thread, which
//!   delivers them once it has left (a release after its last step, so a waker that panics
//!   finds it complete), and the waits clone and drop wakers outside the lock
//!   (`crate::wait::list`, "Where wake-ups run"; `tests/waker_isolation.rs` has wakers that
//!   block, waiting for installs on the same bulkhead and another, and wakers that panic).
//!
//! With classes, an install waits for a class operation only if it was preempted across a
//! whole tag period, whether the install changes a class's limits or not ("Class versions"
//! above).
//!
//! `limits()`, `stats()` and `would_admit()` read a copy the install publishes with its tag
//! bump (`crate::shared::Shared::published`), so they never wait for a grace period.

use crate::sync::{fence, AtomicU64, Ordering};
use crate::vocab::class::MAX_CLASSES;
use crate::words::class_word::ctag_mod;
use std::collections::HashMap;

/// One thread's reader marker: even when the thread is in no operation. Written only by its
/// thread; read by installers.
pub(crate) type Reader = AtomicU64;

/// A bulkhead's id in process-wide markers (module docs): a process-wide serial cut to 32
/// bits ([`new_id`]).
pub(crate) type GraceId = u32;

/// The id a nested operation on a second bulkhead leaves in its thread's cell: every installer
/// counts it as its own.
pub(crate) const ANY: GraceId = GraceId::MAX;

/// A new bulkhead's id: a process-wide serial cut to 32 bits, never [`ANY`]. After 2^32
/// bulkheads two may share one, which only makes an installer wait for an operation it need
/// not wait for (a bulkhead keeps its one id, which is all soundness needs).
pub(crate) fn new_id() -> GraceId {
    (crate::sync::next_serial() as GraceId) % ANY
}

/// An operation in progress (module docs). Leaving it (dropping it, on unwinding too) makes the
/// marker even again, if this is the outermost operation of the thread.
pub(crate) struct Op<'a> {
    reader: &'a Reader,
    /// The value to store when leaving: the next even value for the outermost operation, the
    /// (odd) value the marker already holds for a nested one (a store that changes nothing).
    leave: u64,
}

/// Enters an operation on bulkhead `id` on `reader`, the calling thread's process-wide cell,
/// with the barrier mode `asymmetric` ([`asymmetric`]'s answer).
///
/// The cell `s` becomes `[id][seq + 1]` if it was even (the outermost operation; leaving
/// stores `[id][seq + 2]`), and stays as it is if it was odd for the same bulkhead (a nested
/// one, which must leave it odd for its outer operation: leaving stores the value it holds).
/// A nested operation on another bulkhead widens the id to [`ANY`] until the outer one leaves.
#[inline(always)]
pub(crate) fn enter_with(reader: &Reader, id: GraceId, asymmetric: bool) -> Op<'_> {
    // Single writer: a plain load and store (no locked instruction).
    let s = reader.load(Ordering::Relaxed);
    let (now, leave) = if s & 1 == 0 {
        let seq = u64::from((s as u32).wrapping_add(1));
        let id = u64::from(id) << 32;
        (id | seq, id | u64::from((seq as u32).wrapping_add(1)))
    } else if (s >> 32) as GraceId == id {
        (s, s)
    } else {
        let wide = s | (u64::from(ANY) << 32);
        (wide, wide)
    };
    reader.store(now, Ordering::Relaxed);
    light_barrier(asymmetric);
    Op { reader, leave }
}

impl Drop for Op<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: everything the operation did happens-before an installer that sees the
        // marker move.
        self.reader.store(self.leave, Ordering::Release);
    }
}

/// What one bulkhead's installer remembers of the markers between installs (module docs, "The
/// period a marker holds"). Owned by the reconfiguration lock.
pub(crate) struct Periods {
    /// Each marker seen (by address): the value the last scan read and, if odd, the install
    /// count from which its operation may hold tags.
    seen: HashMap<usize, (u64, u64)>,
    /// The install count at the last scan (the bulkhead's first count before any).
    last_scan: u64,
    /// The oldest `since` of an odd marker of this bulkhead that the last scan left running
    /// (`u64::MAX`: none).
    oldest: u64,
    /// Per class, its version: how many installs changed its limits.
    version: [u64; MAX_CLASSES],
}

impl Periods {
    /// Before the first install of a bulkhead whose tag starts at count `tag` (every class at
    /// version 0).
    pub(crate) fn new(tag: u64) -> Periods {
        Periods {
            seen: HashMap::new(),
            last_scan: tag,
            oldest: u64::MAX,
            version: [0; MAX_CLASSES],
        }
    }

    /// The class versions of the next install, in which the classes `changed` says get new
    /// limits (each of those moves to its next version): every class's version mod
    /// `ctag_mod()`. No class version asks the grace period for more than the limits tag's
    /// period does (module docs, "Class versions"). Changes nothing:
    /// [`commit_versions`](Self::commit_versions) records them once the install has written
    /// them.
    pub(crate) fn next_versions(&self, changed: impl Fn(usize) -> bool) -> [usize; MAX_CLASSES] {
        let m = ctag_mod() as u64;
        std::array::from_fn(|k| ((self.version[k] + u64::from(changed(k))) % m) as usize)
    }

    /// Records the versions of the install ([`next_versions`](Self::next_versions) with the
    /// same `changed`), after the install wrote them.
    pub(crate) fn commit_versions(&mut self, changed: impl Fn(usize) -> bool) {
        for k in (0..MAX_CLASSES).filter(|&k| changed(k)) {
            self.version[k] += 1;
        }
    }
}

/// Where a marker lives, which says whose operation it marks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A decision marker in a counters entry of the installing bulkhead.
    Decision,
    /// A process-wide cell: the bulkhead is the id it carries.
    Cell,
}

/// Readies install `next` (the count the tag is about to reach) of the bulkhead `id`, whose
/// state word's tag period is `period`: a heavy barrier, a scan of every marker `for_each`
/// visits (except `own`, the caller's), and a wait for each operation of this bulkhead that
/// may hold a count `≤ next − period` (module docs). Call under the reconfiguration lock,
/// before the ring slot of `next` (and the floors of a new class version) is written and the
/// tag bumped.
pub(crate) fn before_install(
    periods: &mut Periods,
    id: GraceId,
    next: u64,
    period: u64,
    own: &[&Reader],
    for_each: impl FnOnce(&mut dyn FnMut(&Reader, Kind)),
) {
    // The lowest count an operation in progress must be known to hold.
    let due = next.saturating_add(1).saturating_sub(period);
    // A scan only every half period: an operation the next scan finds new is bounded by the
    // last scan that ran (older, so still a lower bound), and has half a period of installs
    // before it could hold anything back. An operation the last scan left running may be due
    // sooner: then scan now.
    let half = (period / 2).max(1);
    if next < periods.last_scan.saturating_add(half) && periods.oldest >= due {
        return;
    }
    heavy_barrier();
    let now = next.wrapping_sub(1);
    let last = periods.last_scan;
    let mut oldest = u64::MAX;
    for_each(&mut |r: &Reader, kind: Kind| {
        if own.iter().any(|o| std::ptr::eq(r, *o)) {
            return;
        }
        let v = r.load(Ordering::Acquire);
        let key = r as *const Reader as usize;
        let since = match periods.seen.get(&key) {
            Some(&(seen, since)) if seen == v => since,
            _ if bound_from_this_scan() => now,
            _ => last,
        };
        periods.seen.insert(key, (v, since));
        if v & 1 == 0 {
            return;
        }
        let cell_id = (v >> 32) as GraceId;
        let ours = match kind {
            Kind::Decision => true,
            Kind::Cell => !cells_ignored() && (cell_id == id || cell_id == ANY),
        };
        // Loads after the barrier are as good as the first: waiting here, inside the scan,
        // delays the later loads, which only makes what they see fresher.
        if !ours {
            return;
        }
        if since < due {
            wait_for_move(r, v);
        } else {
            oldest = oldest.min(since);
        }
    });
    periods.last_scan = now;
    periods.oldest = oldest;
}

/// Waits until marker `r` no longer holds `v` (its operation left), unless the grace period is
/// switched off (a deliberately broken variant).
fn wait_for_move(r: &Reader, v: u64) {
    if wait_skipped() {
        return;
    }
    crate::sync::pause(crate::sync::PausePoint::GracePeriod);
    spin_while_at(r, v);
}

/// Spins (then yields) while marker `r` holds `v`.
fn spin_while_at(r: &Reader, v: u64) {
    let backoff = crossbeam_utils::Backoff::new();
    while r.load(Ordering::Acquire) == v {
        // Under loom, hand the turn to loom at once (crossbeam's backoff spins on std
        // primitives loom cannot see, and every spin would be a branch of the model).
        if cfg!(loom) || backoff.is_completed() {
            crate::sync::thread::yield_now();
        } else {
            backoff.snooze();
        }
    }
}

/// Waits until no other thread is in an operation of bulkhead `id` that began before this
/// call: what a class-mode state's free does first (`crate::shared`, "Class mode: a release's
/// operation keeps the state alive"). Scans the process-wide cells only (a decision marker in a
/// counters entry belongs to a caller that holds a handle, and there is none left), skipping
/// the calling thread's own.
///
/// Why an operation that may still touch the state is seen: it entered (its marker odd) before
/// its atomic step on a class word or on `alive`, and the free was decided by a later RMW of
/// the same chain (a release that emptied the word, the last handle's `fetch_or`, the last
/// count-down of `alive`), which synchronises with it. So the marker's store happens-before the
/// loads here, which read it or a later value: odd until the operation left (its leaving store
/// is a release, so all it did happens-before the free). No barrier is needed.
///
/// Never waits for user code (none runs inside an operation) or for another bulkhead's
/// operations, except one nested on two bulkheads ([`ANY`]).
pub(crate) fn wait_for_operations(id: GraceId) {
    if free_unguarded() {
        return;
    }
    let own = reader();
    // The calling thread is in no operation of this bulkhead: such an operation would touch
    // the state after the free.
    debug_assert!({
        let s = own.load(Ordering::Relaxed);
        s & 1 == 0 || (s >> 32) as GraceId != id
    });
    crate::sync::per_thread::for_each(&mut |r: &Reader| {
        if std::ptr::eq(r, own) {
            return;
        }
        let v = r.load(Ordering::Acquire);
        let cell_id = (v >> 32) as GraceId;
        if v & 1 == 0 || (cell_id != id && cell_id != ANY) {
            return;
        }
        crate::sync::pause(crate::sync::PausePoint::FreeWaits);
        spin_while_at(r, v);
    });
}

/// The broken variants of [`wait_for_operations`], which then returns at once: under loom,
/// `LLM_BULKHEAD_LOOM_FREE_UNGUARDED=1` (the model `borrowed_release_while_the_last_handle_drops`
/// of `loom-tests/tests/classes.rs` is shown to fail on it: the free races the release's
/// shared-word update); with feature `testing`, `LLM_BULKHEAD_FREE_UNGUARDED=1` (so is
/// `tests/lifetime_class_release.rs`). Never otherwise.
#[inline]
fn free_unguarded() -> bool {
    crate::sync::test_switch!("LLM_BULKHEAD_FREE_UNGUARDED")
        || crate::sync::loom_broken("LLM_BULKHEAD_LOOM_FREE_UNGUARDED")
}

/// Whether the grace period skips its wait: the deliberately broken variants. Under loom,
/// `LLM_BULKHEAD_LOOM_NO_GRACE=1` (the tag-wrap models are shown to fail on it); with feature
/// `testing`, `testing::skip_grace_period_on_this_thread(true)` on the calling thread (the
/// deterministic regressions of `tests/tag_wrap.rs` are). Otherwise never.
#[inline]
fn wait_skipped() -> bool {
    #[cfg(loom)]
    {
        crate::sync::broken_variant("LLM_BULKHEAD_LOOM_NO_GRACE")
    }
    #[cfg(all(feature = "testing", not(loom)))]
    {
        crate::sync::hooks::grace_skipped()
    }
    #[cfg(not(any(loom, feature = "testing")))]
    {
        false
    }
}

/// Under loom, `LLM_BULKHEAD_LOOM_SKIP_DECISION_MARKERS=1` makes the grace period scan the
/// process-wide cells only, not the decision markers in counters entries ([`enter_decision`]):
/// the deliberately broken variant that shows the tag-wrap models see those markers (without
/// them, a decision's marker is invisible to `apply_limits`, as if it had none).
#[inline]
pub(crate) fn skip_decision_markers_for_loom() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_SKIP_DECISION_MARKERS")
}

/// Under loom, `LLM_BULKHEAD_LOOM_GRACE_BOUND_NOW=1` takes an odd marker the previous scan did
/// not see to hold the current count, not the previous scan's: the deliberately broken
/// variant of the Dekker bound (module docs), shown to fail on the tag-wrap models whose
/// operation reads between the previous scan and its bump.
#[inline]
fn bound_from_this_scan() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_GRACE_BOUND_NOW")
}

/// Under loom, `LLM_BULKHEAD_LOOM_GRACE_IGNORE_CELLS=1` counts no process-wide cell as an
/// operation of the installing bulkhead, whatever id it carries: the deliberately broken
/// variant of the ids, shown to fail on the tag-wrap models of class operations (which mark
/// the process-wide cell).
#[inline]
fn cells_ignored() -> bool {
    crate::sync::loom_broken("LLM_BULKHEAD_LOOM_GRACE_IGNORE_CELLS")
}

/// 0: not yet known; 1: membarrier registered; 2: fences on both sides. A process-wide setting
/// chosen before any bulkhead exists, not part of any protocol: a plain std atomic (under loom
/// the mode is always fences, and this is never read).
#[allow(clippy::disallowed_types)]
static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
const MEMBARRIER: u8 = 1;
const FENCES: u8 = 2;

/// Chooses the barrier mode, once per process; called before the first bulkhead's state is
/// published, so every thread that can reach a bulkhead sees the mode chosen (it never changes
/// afterwards).
pub(crate) fn init() {
    if MODE.load(Ordering::Acquire) != 0 {
        return;
    }
    let mode = if membarrier::register() {
        MEMBARRIER
    } else {
        FENCES
    };
    MODE.store(mode, Ordering::Release);
}

/// Whether the heavy side is a membarrier (never under loom or Miri). Fixed before the first
/// bulkhead exists ([`init`]).
#[inline(always)]
pub(crate) fn asymmetric() -> bool {
    !cfg!(loom) && MODE.load(Ordering::Relaxed) == MEMBARRIER
}

/// The operation side's barrier: a compiler fence when the reconfigurer's heavy barrier is a
/// membarrier (`asymmetric`, [`asymmetric`]'s answer), a full fence otherwise.
#[inline(always)]
fn light_barrier(asymmetric: bool) {
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    if !asymmetric {
        full_fence();
    }
}

/// The full fence of [`light_barrier`] without a membarrier: out of line, so that the common
/// case is one test and a branch not taken.
#[cold]
#[inline(never)]
fn full_fence() {
    fence(Ordering::SeqCst);
}

/// The reconfigurer side's barrier.
fn heavy_barrier() {
    // Our own full barrier first (membarrier implies one on the caller too, but the fallback
    // needs it, and it is free at this rate).
    fence(Ordering::SeqCst);
    if asymmetric() && !membarrier::expedited() {
        // Registered, so this cannot fail; if it ever did, the wait that follows would not be
        // sound for operations that issued only a compiler fence. Refuse to go on.
        panic!("membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration");
    }
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
mod membarrier {
    // From <linux/membarrier.h>.
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    pub(super) fn register() -> bool {
        // SAFETY: `membarrier` takes two integers and a flag and touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
    }

    pub(super) fn expedited() -> bool {
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_membarrier, CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
    }
}

#[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
mod membarrier {
    pub(super) fn register() -> bool {
        false
    }
    pub(super) fn expedited() -> bool {
        false
    }
}

/// The calling thread's reader marker: a process-wide per-thread cell of the facade
/// ([`crate::sync::per_thread`]). Markers must outlive every bulkhead, because a class release
/// leaves its operation while the free it holds off may already be waiting for it
/// (`crate::protocol::classed::release`, [`wait_for_operations`]); the id they carry says
/// whose operation it is.
#[inline(always)]
pub(crate) fn reader() -> &'static Reader {
    crate::sync::per_thread::local()
}

/// Enters an operation on bulkhead `id` that reads a tag (module docs).
#[inline(always)]
pub(crate) fn op(id: GraceId) -> Op<'static> {
    enter_with(reader(), id, asymmetric())
}

/// Enters a decision on `reader`, the calling thread's marker in its counters entry of the
/// bulkhead (`Counters::reader`): a no-class decision, or the class fast attempt. The entry is
/// looked up by the decision anyway. Only for a caller that keeps the bulkhead alive until it
/// leaves (a handle). `asymmetric` is the bulkhead's copy of [`asymmetric`]
/// (`Shared::asymmetric`).
#[inline(always)]
pub(crate) fn enter_decision(reader: &Reader, asymmetric: bool) -> Op<'_> {
    enter_outermost(reader, asymmetric)
}

/// [`enter_with`] for a marker that is never entered twice and belongs to one bulkhead: a
/// decision's marker in its counters entry ([`enter_decision`]). Nothing a decision does
/// between entering and leaving enters another decision (its undo and queue visits use the
/// process-wide cell, [`op`], and no hook runs inside one), so the marker is even at entry: it
/// becomes `s + 1` and leaving stores `s + 2`, without the nesting arithmetic or an id. A debug
/// assertion checks the premise on every decision of the test suite.
#[inline(always)]
fn enter_outermost(reader: &Reader, asymmetric: bool) -> Op<'_> {
    // Single writer: a plain load and store (no locked instruction).
    let s = reader.load(Ordering::Relaxed);
    debug_assert!(
        s & 1 == 0,
        "a decision marker entered while it was odd (nested)"
    );
    reader.store(s.wrapping_add(1), Ordering::Relaxed);
    light_barrier(asymmetric);
    Op {
        reader,
        leave: s.wrapping_add(2),
    }
}
