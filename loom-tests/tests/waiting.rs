//! Models of the wait queue (`src/waiting.rs`, `src/queue.rs`; CONTRACT.md §3, §7).
//!
//! 1. enqueue against release: a waiter that queues while the only slot is released is never
//!    left waiting with a free slot (a lost wake-up would leave loom with a deadlock);
//! 2. a zero-deadline waiter (it leaves by `timeout` at its first look) against the hand-off:
//!    it ends with the slot or with `timeout`, never both, and nothing leaks;
//! 3. a queued async waiter dropped against the hand-off: if the slot reached it, the slot
//!    passes to the next waiter; nothing leaks;
//! 4. close against enqueue: the waiter ends with `shutdown` (or never queues), no hang;
//! 5. `apply_limits` raising the limit with a waiter queued: it is admitted, no hang;
//! 6. the last release against a drain waiter: the drainer is woken and reports drained.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model};
use llm_bulkhead::{Bulkhead, Demand, RejectReason, WaitOptions};
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

fn queued(max_concurrent: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(2)
        .build()
        .unwrap()
}

#[test]
fn enqueue_against_release_loses_no_wake_up() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let a = b2
                .acquire_blocking(Demand::slot(), WaitOptions::default())
                .expect("the slot comes back");
            drop(a);
        });
        drop(held);
        t.join().unwrap();
        assert_quiescent(&b, 2, 0);
        assert_eq!(b.stats().pending, 0);
    });
}

#[test]
fn a_timing_out_waiter_against_the_hand_off() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let zero = WaitOptions {
                timeout: Some(Duration::ZERO),
                ..WaitOptions::default()
            };
            match b2.acquire_blocking(Demand::slot(), zero) {
                Ok(a) => {
                    drop(a);
                    true
                }
                Err(r) => {
                    assert_eq!(r.reason, RejectReason::Timeout, "{r:?}");
                    false
                }
            }
        });
        drop(held);
        let admitted = t.join().unwrap();
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
        assert_quiescent(&b, 1 + u64::from(admitted), u64::from(!admitted));
        // The flag is gone: the fast path admits.
        drop(b.try_acquire(Demand::slot()).expect("free"));
    });
}

#[test]
fn a_dropped_async_waiter_against_the_hand_off_passes_the_slot_on() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        // A second waiter (polled on the main thread) queues behind the first.
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let mut f = pin!(b2.acquire(Demand::slot(), WaitOptions::default()));
            let _ = f
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .map(|r| r.map(drop));
            // Dropped here, queued or already granted.
        });
        drop(held);
        t.join().unwrap();
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
        drop(b.try_acquire(Demand::slot()).expect("free"));
    });
}

#[test]
fn close_against_enqueue() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            b2.acquire_blocking(Demand::slot(), WaitOptions::default())
                .map(drop)
                .map_err(|r| r.reason)
        });
        b.close();
        assert_eq!(t.join().unwrap(), Err(RejectReason::Shutdown));
        drop(held);
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    });
}

#[test]
fn raising_the_limit_admits_a_queued_waiter() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            b2.acquire_blocking(Demand::slot(), WaitOptions::default())
                .map(|a| a.revision())
                .map_err(|r| r.reason)
        });
        b.apply_limits(b.limits().with_revision(1).with_max_concurrent(2))
            .unwrap();
        let got = t.join().unwrap();
        assert!(matches!(got, Ok(0) | Ok(1)), "{got:?}");
        drop(held);
        assert_quiescent(&b, 2, 0);
    });
}

#[test]
fn the_last_release_against_a_drain_waiter() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || b2.drain_blocking(None));
        drop(held);
        let r = t.join().unwrap();
        assert!(r.drained, "{r:?}");
        assert_quiescent(&b, 1, 0);
        // The drainer's flag is gone: the fast path admits.
        drop(b.try_acquire(Demand::slot()).expect("free"));
    });
}

/// Keeps `Poll` in use for readers of the model above.
#[allow(dead_code)]
fn _uses(p: Poll<()>) -> bool {
    p.is_ready()
}
