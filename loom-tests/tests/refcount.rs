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
//! installs the checking global allocator of `common::checked_alloc` (poisoned, quarantined
//! frees; double or foreign frees recorded as errors).
//!
//! Asserted in every interleaving: exactly one shared block is allocated and it is freed
//! exactly once, by whichever owner is last, after every other owner is done (no leak, no
//! double free, no use after free); stats read through a surviving handle while the admission
//! settles on another thread show a real state (never more in flight than admitted), and
//! settlement on the other thread returns the slot and the tokens.
#![cfg(loom)]

mod common;

use common::checked_alloc::Checking;
use common::{model, token_stats, tokens};
use llm_bulkhead::{Bulkhead, Usage};
use loom::thread;

#[global_allocator]
static ALLOC: Checking = Checking;

/// Runs one model iteration under the shared checking allocator (`common::checked_alloc`):
/// exactly one shared block is allocated, and it is freed exactly once.
fn checked(f: impl FnOnce()) {
    common::checked_alloc::checked(1, f);
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
                assert_eq!(a.report_usage(Usage::new(1, 1)).unwrap().held, 3);
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
                assert_eq!(y.report_usage(Usage::new(1, 3)).unwrap().held, 4);
                y.release(None).unwrap();
            });
            drop(b);
            tx.join().unwrap();
            ty.join().unwrap();
        });
    });
}
