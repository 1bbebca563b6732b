//! Grace periods: why no limits tag can come back to a value an operation still holds.
//!
//! # The problem
//!
//! Every decision reads a state word, the limits its tag names (a slot of the ring in
//! `crate::words::limits`), and then commits with a CAS that expects the word it read. The tag
//! is what makes a decision read before a reconfiguration fail its CAS after it (CONTRACT.md
//! §6). But tags are narrow: 14 bits in the shared word, 2 bits (mod the ring of 4) in a class
//! word. An operation preempted between its read and its CAS while a whole tag period of
//! snapshots was installed would find the word bit-identical again and commit with limits (or
//! class floors) that are no longer current: an over-admission, or a `U`/`V` decrease computed
//! from the wrong floors, which leaves the stored totals below the truth for good (issue 11
//! reproduced both; `tests/tag_wrap.rs` keeps them).
//!
//! # The rule
//!
//! **`apply_limits` does not return until every operation that may hold the previous tag has
//! finished.** So at any instant the operations in flight hold the current tag or the one
//! before it, never an older one: a tag value, a ring slot or a class tag is reused only after
//! everybody who read its old meaning is gone, whatever the install rate and however long a
//! thread is preempted. Two ring slots and one tag bit would be enough; the wider fields are
//! margin. ABA is excluded by construction, not by a probability.
//!
//! # How an operation is seen: per-thread markers
//!
//! Every operation that reads a tag (or a class word's tag) and then commits on it runs inside
//! an [`Op`]: it makes a **reader marker** of the calling thread odd before its first read, and
//! even again after its last step. A marker is written only by its thread, on a cache line no
//! other thread writes; entering costs a plain store and a compiler fence, leaving one plain
//! store. Operations on the process-wide cell nest (a release that pumps the queue decides for
//! a waiter): only the outermost one moves the marker. A decision's marker in its counters
//! entry is never entered twice, so it skips the nesting arithmetic (`enter_outermost`, with
//! a debug assertion). Markers live in two places:
//!
//! * a no-class decision (`crate::protocol::plain::try_admit` and `try_decide`) and the class
//!   protocol's fast attempt (`crate::protocol::classed::try_fast`) use the thread's counters
//!   entry of that bulkhead, which the decision looks up anyway to count the admission (or,
//!   without classes, the refusal): one lookup for both. Their callers hold a handle, so the
//!   entry outlives the operation; no subscriber's hook runs inside a no-class decision;
//! * every other operation uses the thread's process-wide cell (`crate::sync::per_thread`): a
//!   class release may leave its operation after it gave away the last reference to the
//!   bulkhead, so its marker must not live in the bulkhead.
//!
//! The grace period scans both: the process-wide cells (operations on any bulkhead: they are
//! all short) and this bulkhead's counters entries.
//!
//! The reconfigurer, after installing (the tag bump and every class migration), issues a heavy
//! barrier and then waits until each marker that was odd has moved. The argument is the
//! classic store→load (Dekker) pattern: the operation stores its marker and then loads the
//! word; the reconfigurer modifies the word and then loads the marker. With a full barrier
//! between each pair, either the operation's load sees the new tag (it never held the old
//! one), or the reconfigurer sees the odd marker and waits for it.
//!
//! # The barriers: asymmetric where the OS offers it
//!
//! A full fence on every decision costs a locked instruction (about as much as the CAS
//! itself). On Linux the operation instead issues only a compiler fence, and the reconfigurer
//! calls `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which makes every running thread of
//! the process execute a full barrier before it returns (threads not running get one at their
//! context switch): the fence is paid by the rare side. The process registers for it when the
//! first bulkhead is built; if registration fails (an old kernel, a seccomp filter, another
//! OS), under Miri and under loom, both sides use `fence(SeqCst)` instead: the same argument
//! with the fence paid on every operation.
//!
//! # Progress
//!
//! Deciders never wait for anything here. `apply_limits` may wait for a thread that was
//! preempted inside an operation, until it runs again (a few hundred nanoseconds of work once
//! scheduled); it waits only for operations that started before its install. It never waits
//! for its own thread (an event subscriber that reconfigures from inside an operation would
//! otherwise wait for itself); such a nested install relies on the outer operation's CAS
//! failing on the tag that moved by one.

use crate::sync::{fence, AtomicU64, Ordering};

/// One thread's reader marker: even when the thread is in no operation. Written only by its
/// thread; read by reconfigurers.
pub(crate) type Reader = AtomicU64;

/// An operation in progress (module docs). Leaving it (dropping it, on unwinding too) makes the
/// marker even again, if this is the outermost operation of the thread.
pub(crate) struct Op<'a> {
    reader: &'a Reader,
    /// The value to store when leaving: the next even value for the outermost operation, the
    /// (odd) value the marker already holds for a nested one (a store that changes nothing).
    leave: u64,
}

/// Enters an operation on `reader`, the calling thread's marker.
#[inline(always)]
pub(crate) fn enter(reader: &Reader) -> Op<'_> {
    enter_with(reader, asymmetric())
}

/// [`enter`] with the barrier mode already known (`asymmetric`: [`asymmetric`]'s answer, which
/// never changes once a bulkhead exists; a bulkhead keeps a copy next to the flags its fast
/// path reads, so the decision does not load the process-wide mode).
///
/// Branch-free: the marker `s` becomes `s | 1`, and leaving stores `s + 2` if `s` was even
/// (the outermost operation) or `s` itself if it was odd (a nested one, which must leave the
/// marker odd for its outer operation: storing the value the marker already holds is no
/// change a reconfigurer can see).
#[inline(always)]
pub(crate) fn enter_with(reader: &Reader, asymmetric: bool) -> Op<'_> {
    // Single writer: a plain load and store (no locked instruction).
    let s = reader.load(Ordering::Relaxed);
    let odd = s | 1;
    reader.store(odd, Ordering::Relaxed);
    light_barrier(asymmetric);
    Op {
        reader,
        leave: odd + 1 - (s & 1),
    }
}

impl Drop for Op<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Release: everything the operation did happens-before a reconfigurer that sees the
        // marker move.
        self.reader.store(self.leave, Ordering::Release);
    }
}

/// Waits until every reader marker that `for_each` visits (except `own`, the caller's) has left
/// the operation it was in, if any, when this was called. Call after the install is complete
/// (tag bump and class migrations).
pub(crate) fn wait_for_readers(own: &[&Reader], for_each: impl FnOnce(&mut dyn FnMut(&Reader))) {
    crate::sync::pause(crate::sync::PausePoint::GracePeriod);
    heavy_barrier();
    for_each(&mut |r: &Reader| {
        if own.iter().any(|o| std::ptr::eq(r, *o)) {
            return;
        }
        let s = r.load(Ordering::Acquire);
        if s & 1 == 0 || wait_skipped() {
            return;
        }
        let backoff = crossbeam_utils::Backoff::new();
        while r.load(Ordering::Acquire) == s {
            // Under loom, hand the turn to loom at once (crossbeam's backoff spins on std
            // primitives loom cannot see, and every spin would be a branch of the model).
            if cfg!(loom) || backoff.is_completed() {
                crate::sync::thread::yield_now();
            } else {
                backoff.snooze();
            }
        }
    });
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
fn skip_decision_markers_for_loom() -> bool {
    #[cfg(loom)]
    {
        crate::sync::broken_variant("LLM_BULKHEAD_LOOM_SKIP_DECISION_MARKERS")
    }
    #[cfg(not(loom))]
    {
        false
    }
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
/// ([`crate::sync::per_thread`]). Markers must outlive every bulkhead, because a release leaves
/// its operation after it may have given away the last reference to the state
/// (`crate::protocol::classed::release`). A reconfigurer therefore waits for operations on any bulkhead;
/// they are all short.
#[inline(always)]
pub(crate) fn reader() -> &'static Reader {
    crate::sync::per_thread::local()
}

/// Enters an operation that reads a tag (module docs).
#[inline(always)]
pub(crate) fn op() -> Op<'static> {
    enter(reader())
}

/// Enters a decision of the bulkhead whose counters entry `c` is (the calling thread's): a
/// no-class decision, or the class fast attempt. The marker lives in that entry, which the
/// decision looks up anyway. Only for a caller that keeps the bulkhead alive until it leaves
/// (a handle). `asymmetric` is the bulkhead's copy of [`asymmetric`] (`Shared::asymmetric`).
/// Under loom, where one counters entry is shared by every thread, the entry keeps a marker
/// per loom thread (`Counters::reader`), so the models check these markers as they run natively.
#[inline(always)]
pub(crate) fn enter_decision(c: &crate::record::stats::Counters, asymmetric: bool) -> Op<'_> {
    enter_outermost(c.reader(), asymmetric)
}

/// [`enter_with`] for a marker that is never entered twice: a decision's marker in its
/// counters entry ([`enter_decision`]). Nothing a decision does between entering and leaving
/// enters another decision (its undo and queue visits use the process-wide cell, [`op`], and
/// no hook runs inside one), so the marker is even at entry: it becomes `s + 1` and leaving
/// stores `s + 2`, without the nesting arithmetic. A debug assertion checks the premise on
/// every decision of the test suite.
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

/// The grace period of `apply_limits` on the bulkhead whose counters entries are `counters`: returns once no operation of another thread
/// that started before the call is still in progress, whether it is marked in the process-wide
/// cells or in this bulkhead's counters entries ([`enter_decision`]).
pub(crate) fn grace_period(counters: &crate::sync::Stripes<crate::record::stats::Counters>) {
    let own_decisions: &Reader = counters.local(crate::record::stats::Counters::new).reader();
    let own = reader();
    wait_for_readers(&[own, own_decisions], |f| {
        crate::sync::per_thread::for_each(f);
        if !skip_decision_markers_for_loom() {
            counters.for_each(|c| c.for_each_reader(f));
        }
    });
}
