//! The stop signal of a run reaching the work (issue 15 item 3, as far as `CancelToken`'s
//! public API allows): it fires on the borrowed-concurrency deadline and when the run future is
//! dropped, wakes a helper waiting on it in another thread, and reads the caller's token.
//! Deadlines are driven by a manual trigger and threads synchronised with channels.
#![cfg(feature = "serde")]

use futures_lite::future;
use llm_bulkhead::llm::{
    Deadline, DeadlineTrigger, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions,
    StopCause, StopSignal,
};
use llm_bulkhead::{Bulkhead, CancelToken, ClassLimits, WaitOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

/// A classed bulkhead whose default class has no floor: every slot is borrowed.
fn borrowing() -> LlmBulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .class("batch", ClassLimits::default())
        .default_class("batch")
        .build()
        .unwrap();
    LlmBulkhead::new(b, NaiveEstimator)
}

/// A thread that waits on the signal it is sent and reports the cause it woke with.
fn helper() -> (mpsc::Sender<StopSignal>, std::thread::JoinHandle<StopCause>) {
    let (tx, rx) = mpsc::channel::<StopSignal>();
    let h = std::thread::spawn(move || future::block_on(rx.recv().unwrap().stopped()));
    (tx, h)
}

#[test]
fn the_deadline_fires_the_signal_and_wakes_a_helper() {
    let llm = borrowing();
    let trigger = DeadlineTrigger::new();
    let (tx, helper) = helper();
    let (woke_tx, woke_rx) = mpsc::channel();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&LlmRequest::default(), options, |ctx| {
        let s = ctx.stop_signal();
        tx.send(s.clone()).unwrap();
        assert_eq!(s.cause(), None);
        trigger.fire();
        assert_eq!(s.cause(), Some(StopCause::Deadline));
        assert!(ctx.stop_requested());
        // The helper wakes while the work is still running, with the deadline as the cause.
        woke_tx.send(()).unwrap();
        Ok::<_, ()>(())
    });
    woke_rx.recv().unwrap();
    assert_eq!(helper.join().unwrap(), StopCause::Deadline);
    assert!(matches!(r, Err(RunError::Deadline(_))));
}

#[test]
fn dropping_the_run_future_fires_the_signal() {
    let llm = borrowing();
    let (tx, helper) = helper();
    let (gate_tx, gate_rx) = async_channel();
    let mut run = Box::pin(
        llm.run(&LlmRequest::default(), RunOptions::default(), async |ctx| {
            tx.send(ctx.stop_signal()).unwrap();
            gate_rx.await;
            Ok::<_, ()>(())
        }),
    );
    assert!(run
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    assert_eq!(llm.bulkhead().stats().in_flight, 1);
    drop(run); // the caller gave up
    assert_eq!(helper.join().unwrap(), StopCause::Ended);
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
    drop(gate_tx);
}

/// A future that never completes until its sender is dropped (no runtime needed).
fn async_channel() -> (mpsc::Sender<()>, Pending) {
    let (tx, rx) = mpsc::channel();
    (tx, Pending(rx))
}

struct Pending(mpsc::Receiver<()>);

impl Future for Pending {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        match self.0.try_recv() {
            Err(mpsc::TryRecvError::Empty) => Poll::Pending,
            _ => Poll::Ready(()),
        }
    }
}

#[test]
fn the_callers_token_is_read_by_the_signal() {
    let llm = borrowing();
    let token = CancelToken::new();
    let options = RunOptions {
        wait: WaitOptions {
            timeout: None,
            cancel: Some(token.clone()),
        },
        ..RunOptions::default()
    };
    let s = llm
        .run_blocking(&LlmRequest::default(), options, |ctx| {
            let s = ctx.stop_signal();
            assert!(!ctx.stop_requested());
            token.cancel(); // the caller gave up while the work runs
            assert!(ctx.stop_requested());
            assert_eq!(s.cause(), Some(StopCause::Cancelled));
            // A polled `stopped()` sees it.
            assert!(future::block_on(future::poll_once(ctx.stopped())).is_some());
            Ok::<_, ()>(s)
        })
        .unwrap();
    // The token is read, not stored: once the run ended, the stored cause `ended` answers.
    assert_eq!(s.cause(), Some(StopCause::Ended));
}

#[test]
fn a_run_that_returns_ends_its_signal() {
    let llm = borrowing();
    let s = llm
        .run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
            assert!(!ctx.stop_requested());
            Ok::<_, ()>(ctx.stop_signal())
        })
        .unwrap();
    assert_eq!(s.cause(), Some(StopCause::Ended));
    assert_eq!(future::block_on(s.stopped()), StopCause::Ended);
}
