//! A drain keeps the decision path lock-free (issue 12, item 8): while a drainer is
//! registered and nobody is queued, `try_acquire` with a free slot and a release that does not
//! leave the bulkhead idle take no lock; only the release that leaves it idle locks the queue
//! (to wake the drainer). Proved by counting the calling thread's queue-lock acquisitions
//! (`testing::queue_locks`).
#![cfg(feature = "testing")]

use llm_bulkhead::testing::queue_locks;
use llm_bulkhead::{Bulkhead, Demand};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[test]
fn a_registered_drainer_leaves_decisions_and_releases_lock_free() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .max_queue(4)
        .build()
        .unwrap();
    let keep = b.try_acquire(Demand::slot()).unwrap();
    // A registered drainer (the async one, polled here: it registers at its first poll).
    let mut drain = pin!(b.drain(Some(Duration::MAX)));
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(drain.as_mut().poll(cx).is_pending());
    let before = queue_locks();
    for _ in 0..100 {
        let a = b
            .try_acquire(Demand::slot())
            .expect("a free slot, nobody queued");
        drop(a); // `keep` is still held: not idle
    }
    assert_eq!(
        queue_locks(),
        before,
        "the decision path took the queue lock during a drain"
    );
    // The release that leaves the bulkhead idle wakes the drainer: that one locks.
    drop(keep);
    assert!(queue_locks() > before);
    match drain.as_mut().poll(cx) {
        Poll::Ready(r) => assert!(r.drained, "{r:?}"),
        Poll::Pending => panic!("idle, yet the drain still waits"),
    }
}

#[test]
fn a_drainer_still_sees_waiters_served_in_order() {
    // The flag is up for the drainer; a waiter that queues behind a full bulkhead is still
    // handed the slot (the release sees it in the mirror), and the drain ends once idle.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .build()
        .unwrap();
    let keep = b.try_acquire(Demand::slot()).unwrap();
    let mut drain = pin!(b.drain(None));
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(drain.as_mut().poll(cx).is_pending());
    let mut waiter = pin!(b.acquire(Demand::slot(), Default::default()));
    assert!(waiter.as_mut().poll(cx).is_pending());
    drop(keep); // handed to the waiter
    let a = match waiter.as_mut().poll(cx) {
        Poll::Ready(Ok(a)) => a,
        other => panic!("the waiter was not served: {other:?}"),
    };
    assert!(
        drain.as_mut().poll(cx).is_pending(),
        "not idle: the waiter holds the slot"
    );
    drop(a);
    match drain.as_mut().poll(cx) {
        Poll::Ready(r) => assert!(r.drained, "{r:?}"),
        Poll::Pending => panic!("idle, yet the drain still waits"),
    }
    drop(b.try_acquire(Demand::slot()).expect("the flag is down"));
}
