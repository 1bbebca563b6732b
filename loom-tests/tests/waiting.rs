//! Models of the wait queue (`src/wait/waiting.rs`, `src/wait/list.rs`; CONTRACT.md §3, §7).
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

use common::{assert_quiescent, model, scenarios};
use llm_bulkhead::{Bulkhead, Demand, QueueTimeout, RejectReason, WaitOptions};
use loom::thread;
use std::task::Poll;
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
    model(|| scenarios::enqueue_against_release(queued(1)));
}

#[test]
fn a_timing_out_waiter_against_the_hand_off() {
    model(|| {
        let b = queued(1);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let zero = WaitOptions {
                timeout: QueueTimeout::After(Duration::ZERO),
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
    model(|| scenarios::dropped_waiter_against_hand_off(queued(1)));
}

#[test]
fn close_against_enqueue() {
    model(|| scenarios::close_against_enqueue(queued(1)));
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
    model(|| scenarios::drain_against_last_release(queued(1)));
}

/// Keeps `Poll` in use for readers of the model above.
#[allow(dead_code)]
fn _uses(p: Poll<()>) -> bool {
    p.is_ready()
}
