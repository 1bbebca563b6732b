//! The caller's cancellation reaches the work (issue 15 §3): `CancelToken::cancelled()`, and
//! the run's `stopped()` futures, are woken by `cancel`, not only seen at their next poll.
//! Synchronised by channels and a counting waker; nothing sleeps.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions, StopCause};
use llm_bulkhead::{Bulkhead, CancelToken, WaitOptions};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

#[test]
fn cancel_wakes_a_pending_cancelled_future_and_a_dropped_one_leaves_nothing() {
    let t = CancelToken::new();
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(t.cancelled());
    assert!(f.as_mut().poll(&mut cx).is_pending());
    assert!(
        f.as_mut().poll(&mut cx).is_pending(),
        "re-polling refreshes, not duplicates"
    );
    // A second future, dropped while pending: its registration goes with it.
    {
        let mut g = pin!(t.cancelled());
        assert!(g.as_mut().poll(&mut cx).is_pending());
    }
    t.cancel();
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        1,
        "one wake for the one live future"
    );
    assert_eq!(f.as_mut().poll(&mut cx), Poll::Ready(()));
}

/// The run future is polled by hand with a counting waker: the work waits on `ctx.stopped()`
/// (then on its stop signal's future), the token is cancelled, and the waker must have been
/// called by that cancel before the next poll completes the run.
fn cancel_wakes(use_signal: bool) {
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    let token = CancelToken::new();
    let options = RunOptions {
        wait: WaitOptions {
            cancel: Some(token.clone()),
            ..WaitOptions::default()
        },
        ..RunOptions::default()
    };
    let request = LlmRequest::default();
    let mut run = pin!(llm.run(&request, options, async move |ctx| {
        if use_signal {
            let signal = ctx.stop_signal();
            Ok::<_, ()>(signal.stopped().await)
        } else {
            ctx.stopped().await;
            Ok(ctx.stop_signal().cause().expect("fired"))
        }
    }));
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert!(run.as_mut().poll(&mut cx).is_pending(), "the work waits");
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    token.cancel();
    assert!(
        count.0.load(Ordering::SeqCst) >= 1,
        "the cancel woke the work"
    );
    match run.as_mut().poll(&mut cx) {
        Poll::Ready(r) => assert_eq!(r.unwrap(), StopCause::Cancelled),
        Poll::Pending => panic!("the run did not complete after the wake"),
    }
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
}

#[test]
fn the_callers_cancellation_wakes_ctx_stopped() {
    cancel_wakes(false);
}

#[test]
fn the_callers_cancellation_wakes_the_stop_signals_future() {
    cancel_wakes(true);
}
