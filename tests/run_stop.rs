//! The stop signal of a run reaching the work (issue 15 item 3, as far as `CancelToken`'s
//! public API allows): it fires on the borrowed-concurrency deadline and when the run future is
//! dropped, wakes a helper waiting on it in another thread, and reads the caller's token.
//! Deadlines are driven by a manual trigger and threads synchronised with channels.
#![cfg(feature = "serde")]

#[path = "support/llm.rs"]
mod llm_support;

use futures_lite::future;
use llm_bulkhead::llm::{
    Deadline, DeadlineTrigger, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions,
    StopCause, StopSignal,
};
use llm_bulkhead::{CancelToken, QueueTimeout, WaitOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

/// A classed bulkhead whose default class has no floor: every slot is borrowed.
fn borrowing() -> LlmBulkhead {
    LlmBulkhead::new(
        llm_support::borrowing_builder().build().unwrap(),
        NaiveEstimator,
    )
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
    assert!(llm_support::poll(run.as_mut()).is_pending());
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
            timeout: QueueTimeout::Default,
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

/// The seed's answer at the deadline (issue 15 item 4): `run_shared` with `detach_at_deadline`
/// answers `Deadline` at expiry, to its leader and its followers, and the work goes on where the
/// application runs it, holding its tokens until it settles.
#[test]
fn run_shared_answers_at_the_deadline_and_detaches_the_work() {
    use llm_bulkhead::llm::{BoxWork, DedupSettings, Detach, DetachedWork, RunContext};
    use llm_bulkhead::Usage;
    use std::sync::{Arc, Mutex};
    let llm = llm_support::borrowing_budgeted()
        .with_dedup(DedupSettings::default())
        .unwrap();
    let parked: Arc<Mutex<Vec<DetachedWork>>> = Arc::default();
    let p = parked.clone();
    let detach: Detach = Arc::new(move |w: DetachedWork| p.lock().unwrap().push(w));
    let trigger = DeadlineTrigger::new();
    let options = || RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        detach_at_deadline: Some(detach.clone()),
        ..RunOptions::default()
    };
    let (gate_tx, gate_rx) = async_channel();
    fn gated(
        gate: Pending,
    ) -> impl for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, u32, ()> + Send + 'static {
        move |ctx: &mut RunContext| -> BoxWork<'_, u32, ()> {
            Box::pin(async move {
                gate.await; // the provider call, which ignores the stop signal
                ctx.report_usage(Usage::new(100, 10)).unwrap();
                Ok(1)
            })
        }
    }
    let work = gated(gate_rx);
    let cx = &mut Context::from_waker(Waker::noop());
    let mut leader = Box::pin(llm.run_shared(&LlmRequest::default(), options(), work));
    assert!(leader.as_mut().poll(cx).is_pending());
    let mut follower = Box::pin(llm.run_shared(
        &LlmRequest::default(),
        options(),
        |_: &mut RunContext| -> BoxWork<'_, u32, ()> { Box::pin(async { Ok(2) }) },
    ));
    assert!(follower.as_mut().poll(cx).is_pending());
    trigger.fire();
    // Both answered at expiry, while the work still waits on its provider.
    assert!(matches!(
        leader.as_mut().poll(cx),
        Poll::Ready(Err(RunError::Deadline(_)))
    ));
    assert!(matches!(
        follower.as_mut().poll(cx),
        Poll::Ready(Err(RunError::Deadline(_)))
    ));
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (0, 1));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 300);
    assert_eq!(
        llm.bulkhead()
            .drain_blocking(Some(std::time::Duration::ZERO))
            .in_flight,
        1
    );
    // The detached work ends later and settles its tokens.
    let mut w = parked.lock().unwrap().pop().expect("the work was detached");
    assert!(w.as_mut().poll(cx).is_pending());
    gate_tx.send(()).unwrap();
    assert!(w.as_mut().poll(cx).is_ready());
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (0, 0));
    let t = s.token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.total_consumed), (0, 110));
    // `run` and `run_blocking` cannot detach: refused before anything changes.
    let r = llm.run_blocking(&LlmRequest::default(), options(), |_| Ok::<_, ()>(()));
    assert!(matches!(r, Err(RunError::Invalid(_))));
    assert_eq!(llm.bulkhead().stats().admitted, 1);
}
