//! Helpers shared by the loom models: the model runner and small constructors.
//!
//! Not a model itself; every `tests/*.rs` file includes it with `mod common;`.
#![allow(dead_code)]

pub mod scenarios;

use llm_bulkhead::{Bulkhead, Demand, Reservation, Stats, TokenStats};

/// The preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set.
pub const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with a preemption bound (`LOOM_MAX_PREEMPTIONS`, else
/// [`DEFAULT_PREEMPTIONS`]). Every other knob comes from loom's own environment variables
/// (`LOOM_LOG`, `LOOM_LOCATION`, `LOOM_MAX_BRANCHES`, ...).
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    // `stats()` reads every counter of every stripe (an atomic load each, a branch point for
    // loom), and the statistics grew with events and observe mode: a model that checks its
    // end state with `stats()` needs more than loom's default of 1,000 branches per execution.
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = 10_000;
    }
    builder.check(f);
}

/// A token demand of `input + max_output` tokens, normal priority.
pub fn tokens(input: u64, max_output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, max_output).unwrap())
}

/// The token part of the stats (the bulkheads of these models all have a budget).
pub fn token_stats(s: &Stats) -> TokenStats {
    s.token_budget.expect("the bulkhead has a token budget")
}

/// What must hold once every thread is joined and every admission is settled: nothing in
/// flight, no tokens held, and the event counters exact.
pub fn assert_quiescent(b: &Bulkhead, admitted: u64, rejected: u64) {
    let s = b.stats();
    assert_eq!(s.in_flight, 0, "slots leaked: {s:?}");
    assert_eq!(s.admissions_in_flight, 0, "admissions leaked: {s:?}");
    assert_eq!(s.admitted, admitted, "admitted count: {s:?}");
    assert_eq!(s.released, admitted, "released count: {s:?}");
    assert_eq!(s.rejected, rejected, "rejected count: {s:?}");
    assert_eq!(s.rejected_by_reason.total(), rejected, "{s:?}");
    assert_eq!(
        s.available_slots,
        u64::from(s.limits.max_concurrent),
        "{s:?}"
    );
    if let Some(t) = s.token_budget {
        assert_eq!(t.in_flight_tokens, 0, "tokens leaked: {s:?}");
        assert_eq!(t.available, t.budget, "{s:?}");
    }
}

/// A checking global allocator for lifetime models (`refcount.rs`, `classes.rs`).
///
/// loom's atomics keep their values outside the allocation, so a use after free or a double
/// free of the shared block would not by itself fail a loom model. A binary that wants these
/// checks installs the allocator itself (a crate can have only one):
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: common::checked_alloc::Checking = common::checked_alloc::Checking;
/// ```
///
/// and runs each model iteration inside [`checked`](checked_alloc::checked). While an iteration
/// runs, a free of a tracked (128-byte aligned) block is recorded, the block is poisoned and
/// quarantined instead of being returned (a later access through a dangling pointer reads
/// garbage loom object ids and panics), and a second free of the same block, or a free of a
/// block not allocated in this iteration, is recorded as an error. Without the allocator
/// installed, `checked` sees no allocation and fails, so a forgotten installation is caught.
pub mod checked_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Allocations at least this aligned are tracked: the shared block is `CachePadded`
    /// (128-byte aligned on x86_64 and aarch64), and so is the class-word slice of a bulkhead with
    /// admission classes; nothing else in a model iteration is.
    const TRACKED_ALIGN: usize = 128;
    const SLOTS: usize = 8;
    const POISON: u8 = 0xA5;

    /// Error bits.
    const UNKNOWN_OR_DOUBLE_FREE: u32 = 1;
    const TABLE_FULL: u32 = 2;

    /// Per-OS-thread tracking state. loom runs every thread of a model as a coroutine on the
    /// test's own OS thread, so one thread-local table sees all of a model's allocations, and
    /// tests running in parallel (on other OS threads) do not disturb each other.
    struct Track {
        armed: Cell<bool>,
        live: Cell<[usize; SLOTS]>,
        quarantine: Cell<[(usize, usize, usize); SLOTS]>,
        allocs: Cell<usize>,
        frees: Cell<usize>,
        errors: Cell<u32>,
    }

    thread_local! {
        static TRACK: Track = const {
            Track {
                armed: Cell::new(false),
                live: Cell::new([0; SLOTS]),
                quarantine: Cell::new([(0, 0, 0); SLOTS]),
                allocs: Cell::new(0),
                frees: Cell::new(0),
                errors: Cell::new(0),
            }
        };
    }

    pub struct Checking;

    // SAFETY: every request is served by `System`; tracked blocks are handed back to `System` with
    // their original layout, exactly once (from quarantine, in `disarm`), and never while in use.
    unsafe impl GlobalAlloc for Checking {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded with the caller's layout.
            let p = unsafe { System.alloc(layout) };
            if layout.align() >= TRACKED_ALIGN && !p.is_null() {
                let _ = TRACK.try_with(|t| {
                    if !t.armed.get() {
                        return;
                    }
                    let mut live = t.live.get();
                    match live.iter_mut().find(|s| **s == 0) {
                        Some(s) => *s = p as usize,
                        None => t.errors.set(t.errors.get() | TABLE_FULL),
                    }
                    t.live.set(live);
                    t.allocs.set(t.allocs.get() + 1);
                });
            }
            p
        }

        unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
            if layout.align() >= TRACKED_ALIGN {
                let kept = TRACK
                    .try_with(|t| {
                        if !t.armed.get() {
                            return false;
                        }
                        let mut live = t.live.get();
                        let Some(s) = live.iter_mut().find(|s| **s == p as usize) else {
                            // Freed twice, or never allocated in this iteration: keep it away from
                            // the real allocator and report it.
                            t.errors.set(t.errors.get() | UNKNOWN_OR_DOUBLE_FREE);
                            return true;
                        };
                        *s = 0;
                        t.live.set(live);
                        let mut q = t.quarantine.get();
                        match q.iter_mut().find(|e| e.0 == 0) {
                            Some(e) => *e = (p as usize, layout.size(), layout.align()),
                            None => {
                                t.errors.set(t.errors.get() | TABLE_FULL);
                                return false;
                            }
                        }
                        t.quarantine.set(q);
                        // SAFETY: the block is `layout.size()` bytes, owned by the freeing caller.
                        unsafe { std::ptr::write_bytes(p, POISON, layout.size()) };
                        t.frees.set(t.frees.get() + 1);
                        true
                    })
                    .unwrap_or(false);
                if kept {
                    return;
                }
            }
            // SAFETY: forwarded with the caller's pointer and layout.
            unsafe { System.dealloc(p, layout) }
        }
    }

    fn arm() {
        TRACK.with(|t| {
            t.live.set([0; SLOTS]);
            t.allocs.set(0);
            t.frees.set(0);
            t.errors.set(0);
            t.armed.set(true);
        });
    }

    /// Stops tracking, returns quarantined blocks to the system, and reports
    /// `(allocations, frees, errors)` of the iteration.
    fn disarm() -> (usize, usize, u32) {
        TRACK.with(|t| {
            t.armed.set(false);
            for (p, size, align) in t.quarantine.replace([(0, 0, 0); SLOTS]) {
                if p != 0 {
                    // SAFETY: quarantined blocks came from `System.alloc` with this layout and were
                    // freed by their owner exactly once; nothing can reach them any more (every
                    // thread of the iteration has been joined).
                    unsafe {
                        System.dealloc(p as *mut u8, Layout::from_size_align_unchecked(size, align))
                    };
                }
            }
            (t.allocs.get(), t.frees.get(), t.errors.get())
        })
    }

    /// Runs one model iteration under the checking allocator and asserts that exactly
    /// `expected_allocs` tracked blocks were allocated (1 for the shared state; 2 with admission
    /// classes, whose class words are a separate `CachePadded` slice) and that each was freed
    /// exactly once.
    pub fn checked(expected_allocs: usize, f: impl FnOnce()) {
        arm();
        f();
        let (allocs, frees, errors) = disarm();
        assert_eq!(
            errors & UNKNOWN_OR_DOUBLE_FREE,
            0,
            "double free (or free of a foreign block)"
        );
        assert_eq!(errors & TABLE_FULL, 0, "tracking table overflow");
        assert_eq!(
            allocs, expected_allocs,
            "unexpected number of tracked (shared-state) allocations"
        );
        assert_eq!(frees, allocs, "the shared state was leaked");
    }
}
