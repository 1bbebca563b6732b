//! The queue path allocates nothing: a waiter's node lives on its stack (or in its future),
//! the queue links nodes by pointer, and wake-ups are collected in a fixed array. A counting
//! global allocator (per thread) checks it for a blocking waiter that is queued and handed a
//! slot, for the release that hands it over, and for an async waiter polled to completion.

use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocs;

#[test]
fn a_blocking_waiter_and_its_hand_off_allocate_nothing() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        // Made once per thread, before measuring: the thread handle, and this thread's
        // statistics entry (a refused try_acquire creates it).
        let _ = std::thread::current();
        assert!(b2.try_acquire(Demand::slot()).is_err());
        let before = allocs();
        let a = b2
            .acquire_blocking(Demand::slot(), WaitOptions::default())
            .unwrap();
        let during = allocs() - before;
        drop(a);
        during
    });
    while b.stats().pending == 0 {
        std::thread::yield_now();
    }
    let before = allocs();
    drop(held); // the hand-off
    let release = allocs() - before;
    assert_eq!(waiter.join().unwrap(), 0, "the waiting thread allocated");
    assert_eq!(release, 0, "the hand-off allocated");
}

#[test]
fn an_async_waiter_allocates_nothing_of_its_own() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let waker = Waker::noop();
    let before = allocs();
    let mut f = pin!(b.acquire(Demand::slot(), WaitOptions::default()));
    assert!(f
        .as_mut()
        .poll(&mut Context::from_waker(waker))
        .is_pending());
    drop(held);
    let got = match f.as_mut().poll(&mut Context::from_waker(waker)) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("the slot was handed over"),
    };
    let used = allocs() - before;
    drop(got.unwrap());
    assert_eq!(used, 0, "queueing, hand-off and completion allocated");
}

/// No refusal allocates: a class refusal keeps its class numbers packed inline and names its
/// class by an interned pointer (before: one box each, recycled through a per-thread spare;
/// before that, two allocations, the detail's box and the name's `String`); the explanation
/// is computed only when asked, and still gives the whole detail.
#[test]
fn refusals_allocate_nothing_until_explained() {
    use llm_bulkhead::{ClassLimits, Constraint, RejectReason};
    let plain = Bulkhead::builder()
        .max_concurrent(0)
        .token_budget(100)
        .build()
        .unwrap();
    let classed = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "capped",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .class(
            "floored",
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        )
        .default_class("capped")
        .build()
        .unwrap();
    let capped = Demand::slot().in_class(classed.class_id("capped").unwrap());
    let held = classed.try_acquire(capped).unwrap();
    // This thread's statistics entries, made once.
    assert!(plain.try_acquire(Demand::slot()).is_err());
    assert!(classed.try_acquire(capped).is_err());
    let before = allocs();
    let mut slots = None;
    for _ in 0..100 {
        slots = plain.try_acquire(Demand::slot()).err();
    }
    assert_eq!(allocs() - before, 0, "a no-class refusal allocated");
    let before = allocs();
    for _ in 0..100 {
        drop(classed.try_acquire(capped).err());
    }
    assert_eq!(
        allocs() - before,
        0,
        "a class refusal allocated (its numbers are inline)"
    );
    let mut alive = Vec::with_capacity(10);
    let before = allocs();
    for _ in 0..10 {
        alive.push(classed.try_acquire(capped).unwrap_err());
    }
    assert_eq!(
        allocs() - before,
        0,
        "class refusals alive at once allocated (their numbers are inline)"
    );
    let (slots, class) = (slots.unwrap(), alive.pop().unwrap());
    assert_eq!(slots.reason, RejectReason::ConcurrencyLimit);
    let d = slots.detail();
    assert_eq!((d.in_flight, d.max_concurrent), (0, 0));
    assert_eq!(d.token_budget.unwrap().available, 100);
    assert_eq!(class.constraint, Some(Constraint::AdmissionClass));
    let d = class.detail();
    let c = &d.classes.as_ref().expect("the class numbers").class;
    assert_eq!(
        (c.id.as_str(), c.in_flight, c.max_concurrent),
        ("capped", 1, Some(1))
    );
    assert!(class
        .to_string()
        .contains("class capped: 1 of its ceiling of 1 slots in use"));
    drop(held);
}
