//! Models the lifetime protocol of the shared state (`src/shared.rs`): `Bulkhead` handles are
//! counted off the hot line, and an admission's held slot is its reference. The last handle
//! sets `DETACHED` with a `fetch_or` and frees if no slot is held; an admission returning the
//! last slot of a detached state frees it. Admissions move to other threads and are settled
//! (released or dropped) there while the last `Bulkhead` handle is dropped on the main
//! thread, two admissions outlive every handle and settle concurrently, and handles are
//! cloned and dropped concurrently.
//!
//! loom's atomics keep their values outside the allocation, so a use after free or a double
//! free of the shared block would not by itself fail a loom model. This binary therefore
//! installs a checking global allocator for the one allocation that is aligned like the
//! `CachePadded` shared block: while a model iteration runs, a free of that block is recorded,
//! the block is poisoned and quarantined instead of being returned (a later access through a
//! dangling pointer reads garbage loom object ids and panics), and a second free of the same
//! block, or a free of a block not allocated in this iteration, is recorded as an error.
//!
//! Asserted in every interleaving: exactly one shared block is allocated and it is freed
//! exactly once, by whichever owner is last, after every other owner is done (no leak, no
//! double free, no use after free); stats read through a surviving handle while the admission
//! settles on another thread show a real state (never more in flight than admitted), and
//! settlement on the other thread returns the slot and the tokens.
#![cfg(loom)]

mod common;

use common::{model, token_stats, tokens};
use llm_bulkhead::{Bulkhead, Usage};
use loom::thread;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Allocations at least this aligned are tracked: the shared block is `CachePadded`
/// (128-byte aligned on x86_64 and aarch64); nothing else in a model iteration is.
const TRACKED_ALIGN: usize = 128;
const SLOTS: usize = 8;
const POISON: u8 = 0xA5;

/// Error bits.
const UNKNOWN_OR_DOUBLE_FREE: u32 = 1;
const TABLE_FULL: u32 = 2;

/// Per-OS-thread tracking state. loom runs every thread of a model as a coroutine on the test's
/// own OS thread, so one thread-local table sees all of a model's allocations, and tests running
/// in parallel (on other OS threads) do not disturb each other.
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

struct Checking;

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

#[global_allocator]
static ALLOC: Checking = Checking;

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

/// Runs one model iteration under the checking allocator and asserts that exactly one shared
/// block was allocated and freed exactly once.
fn checked(f: impl FnOnce()) {
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
        allocs, 1,
        "expected exactly one tracked (shared-state) allocation"
    );
    assert_eq!(frees, 1, "the shared state was leaked");
}

#[test]
fn admission_dropped_on_another_thread_while_the_last_handle_drops() {
    model(|| {
        checked(|| {
            let b = Bulkhead::builder()
                .max_concurrent(1)
                .token_budget(10)
                .build()
                .unwrap();
            let a = b.try_acquire(tokens(2, 2)).unwrap();
            assert_eq!(b.stats().in_flight, 1);
            let t = thread::spawn(move || drop(a));
            drop(b); // the last handle; the admission may still be alive on the other thread
            t.join().unwrap();
        });
    });
}

#[test]
fn admission_released_on_another_thread_while_two_handles_drop() {
    model(|| {
        checked(|| {
            let b = Bulkhead::builder()
                .max_concurrent(1)
                .token_budget(10)
                .build()
                .unwrap();
            let b2 = b.clone();
            let mut a = b.try_acquire(tokens(2, 2)).unwrap();
            let worker = thread::spawn(move || {
                // Usage (1, 1): hold 1 + max(2, 1) = 3, then release.
                assert_eq!(a.report_usage(Usage::new(1, 1), None).unwrap().held, 3);
                let rel = a.release(None).unwrap();
                assert_eq!((rel.held, rel.consumed, rel.refunded), (3, Some(2), 1));
            });
            let observer = thread::spawn(move || {
                // A second handle watches the admission settle elsewhere.
                let s = b2.stats();
                let t = token_stats(&s);
                assert_eq!(s.admitted, 1, "{s:?}");
                assert!(
                    matches!((s.in_flight, t.in_flight_tokens), (1, 4) | (1, 3) | (0, 0)),
                    "not a real state: {s:?}"
                );
                drop(b2);
            });
            drop(b);
            worker.join().unwrap();
            observer.join().unwrap();
        });
    });
}

#[test]
fn admission_outlives_every_handle_across_threads() {
    model(|| {
        checked(|| {
            let b = Bulkhead::builder().max_concurrent(2).build().unwrap();
            let b2 = b.clone();
            let t = thread::spawn(move || {
                let b3 = b2.clone();
                drop(b2);
                let a = b3.try_acquire(llm_bulkhead::Demand::slot()).unwrap();
                let s = b3.stats();
                assert_eq!((s.in_flight, s.admitted), (1, 1), "{s:?}");
                drop(b3);
                a // the admission alone keeps the state alive now
            });
            drop(b);
            let a = t.join().unwrap();
            assert_eq!(a.revision(), 0);
            drop(a); // frees the shared state
        });
    });
}

#[test]
fn two_admissions_outlive_every_handle_and_settle_concurrently() {
    // The free must wait for the *last* slot: freeing when one of two admissions returns its
    // slot would leave the other with a dangling pointer.
    model(|| {
        checked(|| {
            let b = Bulkhead::builder()
                .max_concurrent(2)
                .token_budget(10)
                .build()
                .unwrap();
            let x = b.try_acquire(tokens(1, 1)).unwrap();
            let mut y = b.try_acquire(tokens(2, 2)).unwrap();
            let tx = thread::spawn(move || drop(x));
            let ty = thread::spawn(move || {
                assert_eq!(y.report_usage(Usage::new(1, 3), None).unwrap().held, 4);
                y.release(None).unwrap();
            });
            drop(b);
            tx.join().unwrap();
            ty.join().unwrap();
        });
    });
}
