//! Nothing a caller passes can unwind through a linked waiter node (issue 12, item 5).
//!
//! * `Duration::MAX` for every waiting call (blocking, async, both drains, the builder's
//!   default timeout): it means "no deadline", the call waits and ends normally, nothing panics.
//! * User code that panics while a node is linked: a waker whose clone panics (the async
//!   re-poll clones it, outside the queue lock), an event subscriber (caught and counted by the
//!   crate), and a token estimator run by the `llm` front end while another waiter is queued.
//!   After each, nothing is left queued or held and the bulkhead still serves waiters.
//!
//! Nothing here sleeps or times anything: a test waits for a waiter to be queued by looking
//! at `stats().pending`, and ends its waits by releasing.

#[path = "support/queue.rs"]
mod queue;

use llm_bulkhead::{Bulkhead, Demand, QueueTimeout, WaitOptions};
use queue::{settled, until_pending};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::Duration;

fn queued(max_concurrent: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(4)
        .build()
        .unwrap()
}

fn forever() -> WaitOptions {
    WaitOptions {
        timeout: QueueTimeout::After(Duration::MAX),
        cancel: None,
    }
}

#[test]
fn a_blocking_wait_with_duration_max_has_no_deadline() {
    let b = queued(1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        b2.acquire_blocking(Demand::slot(), forever())
            .map(|a| a.revision())
    });
    until_pending(&b, 1);
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(0));
    settled(&b);
}

#[test]
fn the_builder_default_timeout_of_duration_max_has_no_deadline() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .queue_timeout(Duration::MAX)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        b2.acquire_blocking(Demand::slot(), WaitOptions::default())
            .map(|a| a.revision())
    });
    until_pending(&b, 1);
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(0));
    // The async path reads the same default.
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut f = pin!(b.acquire(Demand::slot(), WaitOptions::default()));
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(f.as_mut().poll(cx).is_pending());
    drop(held);
    match f.as_mut().poll(cx) {
        Poll::Ready(Ok(a)) => drop(a),
        other => panic!("expected the handed-over slot, got {other:?}"),
    }
    settled(&b);
}

#[test]
fn an_async_wait_with_duration_max_has_no_deadline() {
    let b = queued(1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut f = pin!(b.acquire(Demand::slot(), forever()));
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(f.as_mut().poll(cx).is_pending());
    assert!(f.as_mut().poll(cx).is_pending(), "no deadline passed");
    drop(held);
    match f.as_mut().poll(cx) {
        Poll::Ready(Ok(a)) => drop(a),
        other => panic!("expected the handed-over slot, got {other:?}"),
    }
    settled(&b);
}

#[test]
fn drains_with_duration_max_have_no_deadline() {
    let b = queued(1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let drainer = std::thread::spawn(move || b2.drain_blocking(Some(Duration::MAX)));
    drop(held);
    assert!(drainer.join().unwrap().drained);

    let held = b.try_acquire(Demand::slot()).unwrap();
    let mut d = pin!(b.drain(Some(Duration::MAX)));
    let cx = &mut Context::from_waker(Waker::noop());
    assert!(d.as_mut().poll(cx).is_pending());
    drop(held);
    match d.as_mut().poll(cx) {
        Poll::Ready(r) => assert!(r.drained, "{r:?}"),
        Poll::Pending => panic!("idle, yet the drain still waits"),
    }
    settled(&b);
}

/// A waker whose clone panics once `armed` is set.
fn panicking_waker(armed: Arc<AtomicBool>) -> Waker {
    fn clone(p: *const ()) -> RawWaker {
        // SAFETY: `p` is the `Arc<AtomicBool>` pointer made below, kept alive by the waker.
        let flag = unsafe { &*(p as *const AtomicBool) };
        assert!(
            !flag.load(Ordering::SeqCst),
            "a waker that panics when cloned"
        );
        // SAFETY: as above; one more strong count for the clone.
        unsafe { Arc::increment_strong_count(p as *const AtomicBool) };
        RawWaker::new(p, &VTABLE)
    }
    fn wake(p: *const ()) {
        drop_waker(p)
    }
    fn wake_by_ref(_: *const ()) {}
    fn drop_waker(p: *const ()) {
        // SAFETY: one strong count per waker, made by `into_raw` or `clone`.
        unsafe { Arc::decrement_strong_count(p as *const AtomicBool) };
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);
    let p = Arc::into_raw(armed) as *const ();
    // SAFETY: the vtable's functions follow the `RawWaker` contract for this pointer.
    unsafe { Waker::from_raw(RawWaker::new(p, &VTABLE)) }
}

#[test]
fn a_waker_that_panics_while_its_node_is_linked_leaves_nothing_behind() {
    let b = queued(1);
    let held = b.try_acquire(Demand::slot()).unwrap();
    let w1 = panicking_waker(Arc::new(AtomicBool::new(false)));
    // Another waker (so the re-poll must store a clone of it), armed from the start.
    let w2 = panicking_waker(Arc::new(AtomicBool::new(true)));
    {
        let mut f = Box::pin(b.acquire(Demand::slot(), WaitOptions::default()));
        // First poll: queued, with a clone of w1.
        assert!(f.as_mut().poll(&mut Context::from_waker(&w1)).is_pending());
        assert_eq!(b.stats().pending, 1);
        // Re-poll with the other waker, whose clone (made before the queue lock) panics.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = f.as_mut().poll(&mut Context::from_waker(&w2));
        }));
        assert!(r.is_err(), "the waker's clone panicked");
        // The future is dropped still queued: it leaves the queue.
    }
    assert_eq!(b.stats().pending, 0);
    drop(held);
    settled(&b);
    // The queue still serves a waiter.
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || b2.acquire_blocking(Demand::slot(), forever()).is_ok());
    until_pending(&b, 1);
    drop(held);
    assert!(waiter.join().unwrap());
    settled(&b);
}

#[test]
fn a_subscriber_that_panics_while_a_node_is_linked_leaves_nothing_behind() {
    let b = queued(1);
    let _sub = b.subscribe(|_| panic!("a subscriber that panics on every event"));
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        // Its grant emits an admission event: the subscriber panics there, on this thread.
        b2.acquire_blocking(Demand::slot(), forever()).map(drop)
    });
    until_pending(&b, 1);
    // A refusal while the node is linked: another event, another panic, on this thread.
    assert!(b
        .acquire_blocking(
            Demand::slot(),
            WaitOptions {
                timeout: QueueTimeout::After(Duration::ZERO),
                cancel: None,
            },
        )
        .is_err());
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(()));
    let s = b.stats();
    assert!(s.subscriber_panics >= 3, "{s:?}");
    settled(&b);
}

#[cfg(feature = "serde")]
#[test]
fn an_estimator_that_panics_while_a_node_is_linked_leaves_nothing_behind() {
    use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(4)
        .token_budget(1_000)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || b2.acquire_blocking(Demand::slot(), forever()).is_ok());
    until_pending(&b, 1);
    let llm = LlmBulkhead::new(
        b.clone(),
        |_: &LlmRequest| -> Result<llm_bulkhead::Reservation, llm_bulkhead::llm::EstimateError> {
            panic!("an estimator that panics")
        },
    );
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        llm.run_blocking(
            &LlmRequest::new("m", &["hi"]),
            RunOptions::default(),
            |_| Ok::<(), ()>(()),
        )
    }));
    assert!(r.is_err(), "the estimator panicked");
    assert_eq!(b.stats().pending, 1, "the queued waiter is untouched");
    drop(held);
    assert!(waiter.join().unwrap());
    settled(&b);
}

/// A waker that reads the bulkhead's statistics when woken: that locks the wait queue, so a
/// wake-up delivered under the queue lock would deadlock.
struct StatsWaker(Bulkhead, std::sync::atomic::AtomicUsize);

impl std::task::Wake for StatsWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.0.stats().pending;
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn close_and_a_raise_wake_a_long_queue_outside_the_lock_in_batches() {
    const N: usize = if cfg!(miri) { 40 } else { 100 };
    for close in [true, false] {
        let b = Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(N as u32)
            .build()
            .unwrap();
        let held = b.try_acquire(Demand::slot()).unwrap();
        let w = Arc::new(StatsWaker(b.clone(), Default::default()));
        let waker = Waker::from(w.clone());
        let mut futs: Vec<_> = (0..N)
            .map(|_| Box::pin(b.acquire(Demand::slot(), WaitOptions::default())))
            .collect();
        for f in &mut futs {
            assert!(f
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
        }
        assert_eq!(b.stats().pending, N as u64);
        if close {
            b.close(); // answers all N with `shutdown`, waking them in batches of 32
        } else {
            // Room for everyone: the pump grants all N, in batches of 32.
            b.apply_limits(
                b.limits()
                    .with_revision(1)
                    .with_max_concurrent(N as u32 + 1),
            )
            .unwrap();
        }
        assert_eq!(w.1.load(Ordering::SeqCst), N, "every waiter woken once");
        for f in &mut futs {
            match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(r) => assert_eq!(r.is_ok(), !close),
                Poll::Pending => panic!("woken, yet not answered"),
            }
        }
        drop(futs);
        drop(held);
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    }
}
