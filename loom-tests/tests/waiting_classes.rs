//! Models of the wait queue **with admission classes** (`src/wait/waiting.rs`, "With admission
//! classes"; `src/protocol/classed.rs`): the queue flag on the class words and `WAITERS` on the shared
//! word against every kind of class decrease.
//!
//! 1. enqueue against a **borrowed** release (its shared-word decrease sees `WAITERS`): no
//!    lost wake-up (loom reports a deadlock if the waiter is left parked with a free slot);
//! 2. enqueue against a **protected** release (no shared-word change at all; only the class
//!    word's `C_QUEUE` tells it to visit the queue): no lost wake-up;
//! 3. a queued async class waiter dropped against the hand-off: the slot passes on or comes
//!    back, nothing leaks, and the flags come down;
//! 4. a drain against the last class release: the drainer is woken (no polling), drained;
//! 5. close against a class enqueue: `shutdown`, no hang, nothing held.
//!
//! A class release pumps inside its grace-period operation and leaves the wake-ups to its
//! thread, which delivers them after its last step (`src/wait/list.rs`, "Where wake-ups
//! run"): with `LLM_BULKHEAD_LOOM_LOSE_DEFERRED_WAKES=1` (those wake-ups dropped) models 1, 2
//! and 4 deadlock.
#![cfg(loom)]

mod common;

use common::{model, scenarios};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, WaitOptions};
use loom::thread;

/// One class without floors (every release is borrowed), one slot, a queue.
fn one_class() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(2)
        .class("x", ClassLimits::default())
        .default_class("x")
        .build()
        .unwrap()
}

#[test]
fn enqueue_against_a_borrowed_release_loses_no_wake_up() {
    model(|| scenarios::enqueue_against_release(one_class()));
}

#[test]
fn enqueue_against_a_protected_release_loses_no_wake_up() {
    model(|| {
        let floor = ClassLimits {
            protected_concurrent: 1,
            ..ClassLimits::default()
        };
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .max_queue(2)
            .class("a", floor)
            .class("b", ClassLimits::default())
            .class("c", ClassLimits::default())
            .default_class("c")
            .build()
            .unwrap();
        let [a, bb, c] = ["a", "b", "c"].map(|n| b.class_id(n).unwrap());
        let held = b.try_acquire(Demand::slot().in_class(a)).unwrap(); // inside a's floor
        let borrowed = b.try_acquire(Demand::slot().in_class(c)).unwrap();
        // Raise b's floor while both slots are in use: U = 3 > 2, G = 2.
        b.apply_limits(b.limits().with_revision(1).with_class(bb, floor))
            .unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            // Inside b's idle floor: waits for a global slot (or finds `held` gone).
            let w = b2
                .acquire_blocking(Demand::slot().in_class(bb), WaitOptions::default())
                .expect("a's slot comes to it");
            assert!(!w.resources().borrowed_concurrency);
            drop(w);
        });
        // a stays inside its floor: a protected release, with no shared-word change.
        drop(held);
        t.join().unwrap();
        drop(borrowed);
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending, s.admitted), (0, 0, 3), "{s:?}");
    });
}

#[test]
fn a_dropped_class_waiter_against_the_hand_off_passes_the_slot_on() {
    model(|| scenarios::dropped_waiter_against_hand_off(one_class()));
}

#[test]
fn a_drain_against_the_last_class_release_is_woken() {
    model(|| scenarios::drain_against_last_release(one_class()));
}

#[test]
fn close_against_a_class_enqueue() {
    model(|| scenarios::close_against_enqueue(one_class()));
}
