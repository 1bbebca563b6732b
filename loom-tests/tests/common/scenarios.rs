//! Wait-queue scenarios shared by the models with and without admission classes
//! (`waiting.rs`, `waiting_classes.rs`): each takes the bulkhead to run against, with one slot
//! and room in the queue, and is run inside `model` by its caller.

use super::assert_quiescent;
use llm_bulkhead::{Bulkhead, Demand, RejectReason, WaitOptions};
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

/// A waiter that queues while the only slot is released is never left waiting with a free
/// slot (a lost wake-up leaves loom with a deadlock).
pub fn enqueue_against_release(b: Bulkhead) {
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
}

/// A queued async waiter dropped against the hand-off: if the slot reached it, it passes on
/// (here: back); nothing leaks and the flags come down.
pub fn dropped_waiter_against_hand_off(b: Bulkhead) {
    let held = b.try_acquire(Demand::slot()).unwrap();
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
    // The flags are down: the fast path admits.
    drop(b.try_acquire(Demand::slot()).expect("free"));
}

/// Close against an enqueue: the waiter ends with `shutdown` (or never queues), no hang.
pub fn close_against_enqueue(b: Bulkhead) {
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
}

/// The last release against a drain waiter: the drainer is woken and reports drained.
pub fn drain_against_last_release(b: Bulkhead) {
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let t = thread::spawn(move || b2.drain_blocking(None));
    drop(held);
    let r = t.join().unwrap();
    assert!(r.drained, "{r:?}");
    assert_quiescent(&b, 1, 0);
    // The drainer's flag is gone: the fast path admits.
    drop(b.try_acquire(Demand::slot()).expect("free"));
}
