//! Models of the shared state's lifetime on the slow paths (`src/shared.rs`, "Slow paths";
//! `src/wait/waiting.rs`), with the deallocation that loom does not model made visible: under
//! `cfg(loom)` the crate gives each shared state a liveness cell that every touch reads and
//! the free writes (`src/sync.rs`, `lifetime`), so a touch that is not ordered before the free
//! fails the model (loom's causality check), and one after it finds the cell set.
//!
//! (a) the granted waiter drops the last handle and then its admission while the releaser is
//!     still in the hand-off (after its grant, before its queue unlock);
//! (b) a fast release frees a detached state while a hand-off that returned its slot still
//!     holds the queue;
//! (c) both on the class path (a borrowed class release pumping the queue);
//! (d) a `CancelToken` cancelling a queued waiter against its grant, on a detached state;
//! (e) `close` and a drain against the last release of a state whose last handle is going.
//!
//! Every model ends with the state freed exactly once (a second free fails the liveness cell)
//! and nothing left queued or held.
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::{Bulkhead, CancelToken, ClassLimits, Demand, QueueTimeout, WaitOptions};
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

fn queued(max_concurrent: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(2)
        .build()
        .unwrap()
}

fn one_class(max_concurrent: u32, floor: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(2)
        .class(
            "x",
            ClassLimits {
                protected_concurrent: floor,
                ..ClassLimits::default()
            },
        )
        .default_class("x")
        .build()
        .unwrap()
}

/// Polls `f` with a no-op waker until it is ready, yielding to loom between polls.
fn poll_until_ready<F: Future>(mut f: std::pin::Pin<&mut F>) -> F::Output {
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            return v;
        }
        thread::yield_now();
    }
}

/// (a) on `b`: the main thread queues an async waiter, a releaser thread hands it the slot,
/// and the main thread, as soon as it sees the grant, drops its future, the last handle and
/// then the admission, while the releaser may still be between its grant and its unlock.
fn granted_waiter_frees_during_hand_off(b: Bulkhead, held: Demand, wait: Demand) {
    let held = b.try_acquire(held).unwrap();
    let (a, releaser) = {
        let mut f = pin!(b.acquire(wait, WaitOptions::default()));
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let releaser = thread::spawn(move || drop(held));
        let a = poll_until_ready(f.as_mut()).expect("the slot is handed over");
        (a, releaser)
    };
    drop(b); // the last handle: the state is detached, the admission keeps it
    drop(a); // the last slot: frees the state (the releaser may be in its hand-off)
    releaser.join().unwrap();
}

#[test]
fn a_granted_waiter_frees_the_state_during_the_hand_off() {
    model(|| granted_waiter_frees_during_hand_off(queued(1), Demand::slot(), Demand::slot()));
}

/// (b) on `b` (two slots): the main thread queues a waiter and gives it up; a releaser that
/// saw the flag hands off, finds the queue empty and returns its slot; the main thread drops
/// the last handle and releases the other slot on the fast path, which may free the state
/// while the hand-off still holds the queue.
fn fast_release_frees_during_returning_hand_off(b: Bulkhead) {
    let first = b.try_acquire(Demand::slot()).unwrap();
    let second = b.try_acquire(Demand::slot()).unwrap();
    let releaser;
    {
        let mut f = pin!(b.acquire(Demand::slot(), WaitOptions::default()));
        assert!(f
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        releaser = thread::spawn(move || drop(first));
        // Dropped queued (it leaves and clears the flag) or granted (the slot passes on).
    }
    drop(b);
    drop(second);
    releaser.join().unwrap();
}

#[test]
fn a_fast_release_frees_the_state_during_a_returning_hand_off() {
    model(|| fast_release_frees_during_returning_hand_off(queued(2)));
}

#[test]
fn class_path_a_granted_waiter_frees_the_state_during_the_pump() {
    // No floor: the release is borrowed (its shared decrease sees `WAITERS`).
    model(|| granted_waiter_frees_during_hand_off(one_class(1, 0), Demand::slot(), Demand::slot()));
}

#[test]
fn class_path_a_fast_release_frees_the_state_during_a_pump() {
    model(|| fast_release_frees_during_returning_hand_off(one_class(2, 0)));
}

/// (d) a blocked waiter with a cancel token: one thread cancels it while another releases the
/// slot it waits for; the waiter drops the last handle and its result (an admission or
/// `aborted`) at once.
fn cancel_against_grant(b: Bulkhead) {
    let held = b.try_acquire(Demand::slot()).unwrap();
    let token = CancelToken::new();
    let t2 = token.clone();
    let canceller = thread::spawn(move || t2.cancel());
    let releaser;
    {
        let mut f = pin!(b.acquire(
            Demand::slot(),
            WaitOptions {
                timeout: QueueTimeout::Default,
                cancel: Some(token),
            },
        ));
        let first = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        releaser = thread::spawn(move || drop(held));
        let got = match first {
            Poll::Ready(r) => r,
            Poll::Pending => poll_until_ready(f.as_mut()),
        };
        drop(got.map(|a| (a.revision(), a)));
    }
    drop(b);
    canceller.join().unwrap();
    releaser.join().unwrap();
}

#[test]
fn a_cancel_token_against_the_grant() {
    model(|| cancel_against_grant(queued(1)));
}

#[test]
fn class_path_a_cancel_token_against_the_grant() {
    model(|| cancel_against_grant(one_class(1, 0)));
}

/// (e) `close` by one handle that is then dropped, the last release on another thread, and a
/// drain snapshot by the last handle, which is dropped right after: whichever of the three
/// ends last frees the state, while the others may still be in `close`'s queue pass or the
/// release's slow path. (A registered drainer is model `a_drainer_against_the_last_release`;
/// a blocked drainer polled with a no-op waker here would multiply the schedules by its
/// polling loop for no new interleaving of the lifetime steps.)
fn close_and_drain(b: Bulkhead) {
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let closer = thread::spawn(move || {
        b2.close();
        drop(b2);
    });
    let releaser = thread::spawn(move || drop(held));
    let r = b.drain_blocking(Some(std::time::Duration::ZERO));
    assert_eq!(r.pending, 0, "{r:?}");
    drop(b);
    closer.join().unwrap();
    releaser.join().unwrap();
}

#[test]
fn close_and_drain_against_the_last_release() {
    model(|| close_and_drain(queued(1)));
}

#[test]
fn class_path_close_and_drain_against_the_last_release() {
    model(|| close_and_drain(one_class(1, 0)));
}

/// (e) a blocked drainer (its own handle) against the last release and the drop of the other
/// handle: the drainer is woken, reports drained, and drops the last handle.
fn drainer_against_the_last_release(b: Bulkhead) {
    let held = b.try_acquire(Demand::slot()).unwrap();
    let b2 = b.clone();
    let drainer = thread::spawn(move || {
        let r = b2.drain_blocking(None);
        assert!(r.drained, "{r:?}");
    });
    drop(b);
    drop(held);
    drainer.join().unwrap();
}

#[test]
fn a_drainer_against_the_last_release() {
    model(|| drainer_against_the_last_release(queued(1)));
}

#[test]
fn class_path_a_drainer_against_the_last_release() {
    model(|| drainer_against_the_last_release(one_class(1, 0)));
}

/// (f) drain-time releases without the mutex (`src/wait/waiting.rs`, "Drain"): with a drainer
/// registered (`WAITERS` up, nobody queued), a release that does not leave the bulkhead idle
/// (no lock: the length mirror reads 0) against a waiter that queues behind it. Once the
/// release is done, a queued waiter must not be left with a free slot (work conservation);
/// then the last release, and the drain ends.
#[test]
fn a_drain_time_release_against_an_enqueue_strands_nobody() {
    model(|| {
        let b = queued(2);
        let first = b.try_acquire(Demand::slot()).unwrap();
        let second = b.try_acquire(Demand::slot()).unwrap();
        let mut drain = pin!(b.drain(None));
        assert!(drain
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let b2 = b.clone();
        let waiter = thread::spawn(move || {
            b2.acquire_blocking(Demand::slot(), WaitOptions::default())
                .map(drop)
                .expect("a slot comes to it");
        });
        let releaser = thread::spawn(move || drop(first));
        releaser.join().unwrap();
        let s = b.stats();
        assert!(
            s.pending == 0 || s.in_flight == 2,
            "a waiter queued beside a free slot: {s:?}"
        );
        drop(second);
        waiter.join().unwrap();
        let r = poll_until_ready(drain.as_mut());
        assert!(r.drained, "{r:?}");
    });
}

/// (f) a decider admitted without the mutex while a drainer is registered, against a waiter
/// that queues: every demand ends admitted, nothing is left held or queued.
#[test]
fn a_drain_time_decision_against_an_enqueue() {
    model(|| {
        let b = queued(1);
        let mut drain = pin!(b.drain(None));
        let held = b.try_acquire(Demand::slot()).unwrap();
        assert!(drain
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let b2 = b.clone();
        let waiter = thread::spawn(move || {
            b2.acquire_blocking(Demand::slot(), WaitOptions::default())
                .map(drop)
                .expect("a slot comes to it");
        });
        drop(held);
        // A newcomer on the fast path: admitted (a free slot, nobody queued) or refused.
        if let Ok(a) = b.try_acquire(Demand::slot()) {
            drop(a);
        }
        waiter.join().unwrap();
        let r = poll_until_ready(drain.as_mut());
        assert!(r.drained, "{r:?}");
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    });
}
