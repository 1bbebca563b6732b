//! Cancelled async deadlines leave nothing in the timer (issue 13: a million cancelled 30 s
//! waits used to keep their heap entries until the deadline, RSS 2 MB -> 25 MB).
//!
//! Deterministic: the futures are polled by hand with a no-op waker, and the check is the
//! timer's entry count (`testing::timer_entries`), not a duration or the process's RSS. The one
//! test in this binary owns the process-wide timer.
#![cfg(feature = "testing")]

use llm_bulkhead::{testing, Bulkhead, Demand, QueueTimeout, RejectReason, WaitOptions};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[test]
fn cancelled_waits_leave_the_timer_empty() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let wait = || WaitOptions {
        timeout: QueueTimeout::After(Duration::from_secs(30)),
        cancel: None,
    };
    assert_eq!(testing::timer_entries(), 0);
    let mut peak = 0;
    for round in 0..200_000u32 {
        // Two waits at a time: each registers a 30 s deadline when it first returns Pending,
        // and is dropped (cancelled) well before it.
        let mut a = Box::pin(b.acquire(Demand::slot(), wait()));
        let mut c = Box::pin(b.acquire(Demand::slot(), wait()));
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(c.as_mut().poll(&mut cx).is_pending());
        peak = peak.max(testing::timer_entries());
        drop(a);
        drop(c);
        assert_eq!(
            testing::timer_entries(),
            0,
            "round {round}: a cancelled wait stayed in the timer"
        );
    }
    assert_eq!(peak, 2, "every pending wait had its deadline registered");
    // A waiter answered by a hand-off also takes its deadline out.
    let mut w = pin!(b.acquire(Demand::slot(), wait()));
    assert!(w.as_mut().poll(&mut cx).is_pending());
    assert_eq!(testing::timer_entries(), 1);
    drop(held);
    match w.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(admission)) => drop(admission),
        other => panic!("the queued wait was not served: {other:?}"),
    }
    assert_eq!(testing::timer_entries(), 0);
    // And a refused one (close answers the queue).
    let _held = b.try_acquire(Demand::slot()).unwrap();
    let mut w = pin!(b.acquire(Demand::slot(), wait()));
    assert!(w.as_mut().poll(&mut cx).is_pending());
    b.close();
    match w.as_mut().poll(&mut cx) {
        Poll::Ready(Err(r)) => assert_eq!(r.reason, RejectReason::Shutdown),
        other => panic!("close did not answer the wait: {other:?}"),
    }
    assert_eq!(testing::timer_entries(), 0);
}
