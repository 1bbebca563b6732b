//! A de-duplication follower observes its own cancellation token (issue 15): it answers
//! `RunError::Shared(DedupError::Cancelled)` as soon as its token fires (the token wakes it),
//! counted in `DedupStats::cancelled` and seen as a `dedup` event with outcome `cancelled`,
//! and neither the leader nor the other followers are cancelled. Futures are polled by hand
//! with counting wakers; the shared call is held open by a oneshot channel. Nothing sleeps.
#![cfg(feature = "serde")]

use llm_bulkhead::llm::{
    BoxWork, Dedup, DedupError, DedupKey, DedupSettings, FollowerOptions, LlmBulkhead, LlmRequest,
    NaiveEstimator, RunContext, RunError, RunOptions,
};
use llm_bulkhead::llm::{DedupOutcome, LlmEvent};
use llm_bulkhead::{Bulkhead, CancelToken, Event, WaitOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio::sync::oneshot;

type Out = Result<String, RunError<String>>;
type Run = Pin<Box<dyn Future<Output = Out> + Send>>;

/// A waker that counts its wakes.
#[derive(Default)]
struct Counting(AtomicU32);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Task {
    fut: Run,
    wakes: Arc<Counting>,
}

impl Task {
    fn new(fut: impl Future<Output = Out> + Send + 'static) -> Task {
        Task {
            fut: Box::pin(fut),
            wakes: Arc::default(),
        }
    }
    fn poll(&mut self) -> Poll<Out> {
        let w = Waker::from(self.wakes.clone());
        self.fut.as_mut().poll(&mut Context::from_waker(&w))
    }
    fn woken(&self) -> u32 {
        self.wakes.0.load(Ordering::SeqCst)
    }
}

fn work(
    gate: Option<oneshot::Receiver<()>>,
    calls: &Arc<AtomicU32>,
) -> impl for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, String, String> + Send + 'static {
    let calls = calls.clone();
    move |_ctx: &mut RunContext| -> BoxWork<'_, String, String> {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if let Some(g) = gate {
                g.await.map_err(|e| e.to_string())?;
            }
            Ok("shared".to_owned())
        })
    }
}

fn with_token(t: &CancelToken) -> RunOptions {
    RunOptions {
        wait: WaitOptions {
            timeout: llm_bulkhead::QueueTimeout::Default,
            cancel: Some(t.clone()),
        },
        ..RunOptions::default()
    }
}

fn setup() -> (
    LlmBulkhead,
    Arc<Mutex<Vec<Event>>>,
    llm_bulkhead::Subscription,
) {
    let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
        .with_dedup(DedupSettings::default())
        .unwrap();
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let l = log.clone();
    let sub = llm
        .bulkhead()
        .subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    (llm, log, sub)
}

fn dedup_outcomes(log: &Mutex<Vec<Event>>) -> Vec<DedupOutcome> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match LlmEvent::of(e) {
            Some(LlmEvent::Dedup(d)) => Some(d.outcome),
            _ => None,
        })
        .collect()
}

fn request() -> LlmRequest {
    LlmRequest::new("gpt-4o", &["What is a bulkhead?"])
}

#[test]
fn a_cancelled_follower_answers_at_once_and_the_call_goes_on() {
    let (llm, log, _sub) = setup();
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let leader_token = CancelToken::new();
    let mut leader = Task::new(llm.run_shared(
        &request(),
        with_token(&leader_token),
        work(Some(rx), &calls),
    ));
    assert!(leader.poll().is_pending());
    let token = CancelToken::new();
    let mut cancelled =
        Task::new(llm.run_shared(&request(), with_token(&token), work(None, &calls)));
    let mut other =
        Task::new(llm.run_shared(&request(), RunOptions::default(), work(None, &calls)));
    assert!(cancelled.poll().is_pending());
    assert!(other.poll().is_pending());
    let before = cancelled.woken();
    token.cancel();
    // The token woke the follower's task: it does not wait for the leader to be polled.
    assert!(cancelled.woken() > before);
    assert!(matches!(
        cancelled.poll(),
        Poll::Ready(Err(RunError::Shared(DedupError::Cancelled)))
    ));
    // The leader's token is untouched, the call and the other follower go on.
    assert!(!leader_token.is_cancelled());
    assert!(leader.poll().is_pending());
    assert!(other.poll().is_pending());
    assert_eq!(llm.bulkhead().stats().in_flight, 1);
    tx.send(()).unwrap();
    assert!(matches!(leader.poll(), Poll::Ready(Ok(ref s)) if s == "shared"));
    assert!(matches!(other.poll(), Poll::Ready(Ok(ref s)) if s == "shared"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = llm.stats();
    let d = s.dedup.unwrap();
    assert_eq!((d.hits, d.cancelled, d.timeouts, d.active), (2, 1, 0, 0));
    // A refusal of that caller (`aborted`, as the reference counts its dedup-wait
    // rejections: issue 32 item 2), though no admission was refused.
    assert_eq!(
        (
            s.bulkhead.admitted,
            s.bulkhead.rejected,
            s.bulkhead.rejected_by_reason.aborted,
            s.bulkhead.in_flight
        ),
        (1, 1, 1, 0)
    );
    assert_eq!(
        dedup_outcomes(&log),
        [
            DedupOutcome::Joined,
            DedupOutcome::Joined,
            DedupOutcome::Cancelled
        ]
    );
}

#[test]
fn a_follower_cancelled_before_its_first_poll_answers_without_waiting() {
    let (llm, log, _sub) = setup();
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let mut leader =
        Task::new(llm.run_shared(&request(), RunOptions::default(), work(Some(rx), &calls)));
    assert!(leader.poll().is_pending());
    let token = CancelToken::new();
    token.cancel();
    let mut follower =
        Task::new(llm.run_shared(&request(), with_token(&token), work(None, &calls)));
    assert!(matches!(
        follower.poll(),
        Poll::Ready(Err(RunError::Shared(DedupError::Cancelled)))
    ));
    tx.send(()).unwrap();
    assert!(matches!(leader.poll(), Poll::Ready(Ok(_))));
    assert_eq!(llm.stats().dedup.unwrap().cancelled, 1);
    assert_eq!(
        dedup_outcomes(&log),
        [DedupOutcome::Joined, DedupOutcome::Cancelled]
    );
}

#[test]
fn a_cancelled_follower_that_drove_the_call_hands_it_to_the_next() {
    let (llm, _log, _sub) = setup();
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let mut leader =
        Task::new(llm.run_shared(&request(), RunOptions::default(), work(Some(rx), &calls)));
    assert!(leader.poll().is_pending());
    let token = CancelToken::new();
    let mut driver = Task::new(llm.run_shared(&request(), with_token(&token), work(None, &calls)));
    let mut next = Task::new(llm.run_shared(&request(), RunOptions::default(), work(None, &calls)));
    drop(leader); // the followers drive the call now
    assert!(driver.poll().is_pending()); // it polls the shared call
    assert!(next.poll().is_pending());
    let woken = next.woken();
    token.cancel();
    assert!(matches!(
        driver.poll(),
        Poll::Ready(Err(RunError::Shared(DedupError::Cancelled)))
    ));
    // Leaving, it woke the other participant, which takes the call over.
    assert!(next.woken() > woken);
    assert_eq!(llm.bulkhead().stats().in_flight, 1);
    tx.send(()).unwrap();
    assert!(matches!(next.poll(), Poll::Ready(Ok(ref s)) if s == "shared"));
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn the_last_participant_cancelled_drops_the_call_and_releases_its_admission() {
    let (llm, _log, _sub) = setup();
    let calls = Arc::new(AtomicU32::new(0));
    let (_tx, rx) = oneshot::channel::<()>();
    let mut leader =
        Task::new(llm.run_shared(&request(), RunOptions::default(), work(Some(rx), &calls)));
    assert!(leader.poll().is_pending());
    let token = CancelToken::new();
    let mut follower =
        Task::new(llm.run_shared(&request(), with_token(&token), work(None, &calls)));
    assert!(follower.poll().is_pending());
    drop(leader);
    token.cancel();
    assert!(matches!(
        follower.poll(),
        Poll::Ready(Err(RunError::Shared(DedupError::Cancelled)))
    ));
    let s = llm.stats();
    assert_eq!((s.bulkhead.in_flight, s.dedup.unwrap().active), (0, 0));
    // The key is free: an identical call leads a new flight.
    let mut again =
        Task::new(llm.run_shared(&request(), RunOptions::default(), work(None, &calls)));
    assert!(matches!(again.poll(), Poll::Ready(Ok(_))));
    assert_eq!(llm.stats().dedup.unwrap().leaders, 2);
}

#[test]
fn the_composable_dedup_follower_observes_its_token() {
    let d: Dedup<u32> = Dedup::new(8);
    let key = DedupKey::of_bytes(b"k");
    let (tx, rx) = oneshot::channel::<()>();
    let mut leader = Box::pin(d.run(key, FollowerOptions::default(), || async move {
        rx.await.unwrap();
        7
    }));
    let token = CancelToken::new();
    let follower_options = FollowerOptions {
        cancel: Some(token.clone()),
        ..FollowerOptions::default()
    };
    let mut follower = Box::pin(d.run(key, follower_options, || async { 0 }));
    let wakes = Arc::new(Counting::default());
    let w = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&w);
    assert!(leader.as_mut().poll(&mut cx).is_pending());
    assert!(follower.as_mut().poll(&mut cx).is_pending());
    let before = wakes.0.load(Ordering::SeqCst);
    token.cancel();
    assert!(wakes.0.load(Ordering::SeqCst) > before);
    assert_eq!(
        follower.as_mut().poll(&mut cx),
        Poll::Ready(Err(DedupError::Cancelled))
    );
    tx.send(()).unwrap();
    assert_eq!(leader.as_mut().poll(&mut cx), Poll::Ready(Ok(7)));
    assert_eq!(
        (d.stats().cancelled, d.stats().hits, d.stats().active),
        (1, 1, 0)
    );
}
