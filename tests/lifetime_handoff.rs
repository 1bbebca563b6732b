//! The hand-off's use after free, deterministically on real threads (issue 12, item 1): the
//! releaser is held at `PausePoint::HandOffGiven` (its slot granted to the waiter, the queue
//! still locked) while the granted waiter drops the last handle and then its admission. The
//! shared state must stay allocated until the releaser has unlocked and left (its
//! `SlowPathRef`), and be freed exactly then. Before the guard, the admission's drop freed the
//! state here and the releaser then unlocked a mutex inside the freed block (Miri: use after
//! free).
//!
//! One test per binary: it reads the process-wide `testing::live_states` count.
#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, live_states, set_pause_hook, PausePoint};
use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
use std::future::Future;
use std::pin::pin;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

#[test]
fn the_granted_waiter_frees_nothing_while_the_releaser_is_in_the_hand_off() {
    let base = live_states();
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(2)
        .build()
        .unwrap();
    assert_eq!(live_states(), base + 1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let (at_point, reached) = mpsc::channel();
    let (go, resume) = mpsc::channel::<()>();
    let admission = {
        let mut f = pin!(b.acquire(Demand::slot(), WaitOptions::default()));
        let cx = &mut Context::from_waker(Waker::noop());
        assert!(f.as_mut().poll(cx).is_pending());
        let releaser = std::thread::spawn(move || {
            set_pause_hook(move |p| {
                if p == PausePoint::HandOffGiven {
                    at_point.send(()).unwrap();
                    resume.recv().unwrap();
                }
            });
            drop(held); // hands the slot to the waiter, then pauses before the unlock
            clear_pause_hook();
        });
        reached.recv().unwrap();
        // The slot is ours now (the node says done), though the releaser still holds the queue.
        let a = match f.as_mut().poll(cx) {
            Poll::Ready(Ok(a)) => a,
            other => panic!("the slot was handed over, got {other:?}"),
        };
        (a, releaser)
    };
    let (a, releaser) = admission;
    drop(b); // the last handle
    drop(a); // the last slot: the owners are gone
    assert_eq!(
        live_states(),
        base + 1,
        "freed while the hand-off still holds the queue"
    );
    go.send(()).unwrap();
    releaser.join().unwrap();
    assert_eq!(live_states(), base, "freed once the hand-off is done");
}
