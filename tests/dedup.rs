//! In-flight de-duplication (reference §9.2, llm_bulkhead #86–#96, default dedup key #1–#5,
//! streaming_dedup #6, #10, #11). Futures are polled by hand with a no-op waker, and the
//! shared call is held open by a channel the test completes, so nothing sleeps or times.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    Dedup, DedupError, DedupKey, FollowerOptions, LlmBulkhead, LlmRequest, NaiveEstimator,
    RunError, RunOptions,
};
use llm_bulkhead::{Bulkhead, ClassLimits};
use proptest::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::oneshot;

fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

fn req(json: &str) -> LlmRequest {
    serde_json::from_str(json).unwrap()
}

fn key(r: &LlmRequest) -> Option<DedupKey> {
    Some(DedupKey::of_request(r).partition("", None))
}

/// A call that counts itself and finishes when the test sends its result (the default value
/// if the sender is dropped).
fn gated<T: Default + Send + 'static>(
    calls: &Arc<AtomicU32>,
) -> (
    oneshot::Sender<T>,
    impl FnOnce() -> Pin<Box<dyn Future<Output = T> + Send>>,
) {
    let (tx, rx) = oneshot::channel::<T>();
    let calls = calls.clone();
    (tx, move || {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            rx.await.unwrap_or_default()
        })
    })
}

fn not_called() -> impl FnOnce() -> std::future::Ready<String> {
    || panic!("a follower's work is never called")
}

/// #86, #87: identical in-flight requests share one call; the hit is counted.
#[test]
fn identical_in_flight_requests_share_one_call() {
    let d: Dedup<String> = Dedup::new(100);
    let calls = Arc::new(AtomicU32::new(0));
    let r = LlmRequest::new("gpt-4o", &["hello"]);
    let (tx, work) = gated::<String>(&calls);
    let mut leader = d.run(key(&r), FollowerOptions::default(), work);
    let mut follower = d.run(key(&r), FollowerOptions::default(), not_called());
    assert!(leader.is_leader() && follower.is_follower());
    assert!(poll(&mut leader).is_pending());
    assert!(poll(&mut follower).is_pending());
    assert_eq!(d.stats().active, 1);
    tx.send("result".into()).unwrap();
    // The follower drives the call too: it can finish first.
    assert_eq!(poll(&mut follower), Poll::Ready(Ok("result".into())));
    assert_eq!(poll(&mut leader), Poll::Ready(Ok("result".into())));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = d.stats();
    assert_eq!((s.hits, s.leaders, s.active), (1, 1, 0));
}

/// #88, #91, #92, default key #1, #2, #5 (extraInputTokens): every field counts, field order
/// does not.
#[test]
fn the_default_key_covers_every_field_and_ignores_order() {
    let base = r#"{"model":"m","max_tokens":256,"temperature":0,"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{"a":1,"b":2}}]}]}"#;
    let shuffled = r#"{"messages":[{"content":[{"text":"hi","type":"text"},{"source":{"b":2,"a":1},"type":"image"}],"role":"user"}],"temperature":0,"max_tokens":256,"model":"m"}"#;
    let k = |s: &str| DedupKey::of_request(&req(s));
    assert_eq!(k(base), k(shuffled));
    for other in [
        base.replace("\"temperature\":0", "\"temperature\":1"),
        base.replace("256", "1024"),
        base.replace("\"hi\"", "\"ho\""),
        base.replace("\"user\"", "\"assistant\""),
        base.replace("\"a\":1", "\"a\":2"),
        base.replace("\"model\":\"m\"", "\"model\":\"n\""),
        base.replace(
            "\"temperature\":0",
            "\"temperature\":0,\"extra_input_tokens\":100",
        ),
    ] {
        assert_ne!(k(base), k(&other), "{other}");
    }
    let e100 = r#"{"messages":[{"role":"user","content":"x"}],"extraInputTokens":100}"#;
    let e200 = r#"{"messages":[{"role":"user","content":"x"}],"extraInputTokens":200}"#;
    assert_ne!(k(e100), k(e200));
}

/// #89: after a call settles, the same request starts a new call.
#[test]
fn a_settled_call_frees_its_key() {
    let d: Dedup<u32> = Dedup::new(100);
    let k = DedupKey::of_bytes(b"k");
    for expected in [1, 2] {
        let got = futures_lite::future::block_on(d.run(
            k,
            FollowerOptions::default(),
            move || async move { expected },
        ));
        assert_eq!(got, Ok(expected));
    }
    assert_eq!(d.stats().leaders, 2);
    assert_eq!(d.stats().hits, 0);
}

/// Default key #3, #4, #5, #94, and #7 of gateway_coordination (partition by class): scopes
/// and classes isolate callers; an empty custom key opts out.
#[test]
fn scopes_classes_and_empty_keys_isolate_calls() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class("premium", ClassLimits::default())
        .class("standard", ClassLimits::default())
        .default_class("standard")
        .build()
        .unwrap();
    let (p, s) = (
        b.class_id("premium").unwrap(),
        b.class_id("standard").unwrap(),
    );
    let raw = DedupKey::of_request(&LlmRequest::new("m", &["same"]));
    assert_ne!(raw.partition("a", Some(p)), raw.partition("a", Some(s)));
    assert_ne!(raw.partition("a", Some(p)), raw.partition("b", Some(p)));
    let d: Dedup<&'static str> = Dedup::new(100);
    let calls = Arc::new(AtomicU32::new(0));
    let counted = |v: &'static str| {
        let calls = calls.clone();
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            v
        }
    };
    let mut a1 = d.run(
        Some(raw.partition("tenant-a", Some(p))),
        FollowerOptions::default(),
        counted("premium"),
    );
    let mut b1 = d.run(
        Some(raw.partition("tenant-a", Some(s))),
        FollowerOptions::default(),
        counted("standard"),
    );
    let mut a2 = d.run(
        Some(raw.partition("tenant-a", Some(p))),
        FollowerOptions::default(),
        not_called_str(),
    );
    let mut none1 = d.run(
        DedupKey::of_bytes(b""),
        FollowerOptions::default(),
        counted("x"),
    );
    let mut none2 = d.run(
        DedupKey::of_bytes(b""),
        FollowerOptions::default(),
        counted("x"),
    );
    assert!(a2.is_follower() && !none2.is_follower());
    assert_eq!(poll(&mut a1), Poll::Ready(Ok("premium")));
    assert_eq!(poll(&mut a2), Poll::Ready(Ok("premium")));
    assert_eq!(poll(&mut b1), Poll::Ready(Ok("standard")));
    assert!(poll(&mut none1).is_ready() && poll(&mut none2).is_ready());
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!((d.stats().hits, d.stats().active), (1, 0));
}

fn not_called_str() -> impl FnOnce() -> std::future::Ready<&'static str> {
    || panic!("a follower's work is never called")
}

/// #95, #96, default key #7: a follower's own cancellation or timeout ends its wait only; the
/// shared call goes on for the leader.
#[test]
fn a_follower_leaves_by_drop_or_timeout_without_cancelling_the_call() {
    let d: Dedup<String> = Dedup::new(100);
    let calls = Arc::new(AtomicU32::new(0));
    let k = DedupKey::of_bytes(b"k");
    let (tx, work) = gated::<String>(&calls);
    let mut leader = d.run(k, FollowerOptions::default(), work);
    assert!(poll(&mut leader).is_pending());
    let dropped = d.run(k, FollowerOptions::default(), not_called());
    drop(dropped);
    let zero = FollowerOptions {
        timeout: Some(Duration::ZERO),
        ..FollowerOptions::default()
    };
    let mut timed = d.run(k, zero, not_called());
    assert_eq!(poll(&mut timed), Poll::Ready(Err(DedupError::Timeout)));
    tx.send("shared".into()).unwrap();
    assert_eq!(poll(&mut leader), Poll::Ready(Ok("shared".into())));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!((d.stats().hits, d.stats().active), (2, 0));
}

/// Cancelling the leader's caller does not cancel the call its followers wait on; when every
/// participant is gone the call is dropped and the key freed.
#[test]
fn the_leaders_cancellation_leaves_the_call_to_its_followers() {
    let d: Dedup<String> = Dedup::new(100);
    let calls = Arc::new(AtomicU32::new(0));
    let k = DedupKey::of_bytes(b"k");
    let (tx, work) = gated::<String>(&calls);
    let mut leader = d.run(k, FollowerOptions::default(), work);
    let mut follower = d.run(k, FollowerOptions::default(), not_called());
    assert!(poll(&mut leader).is_pending());
    drop(leader);
    assert_eq!(d.stats().active, 1, "the call is still in flight");
    tx.send("for the follower".into()).unwrap();
    assert_eq!(
        poll(&mut follower),
        Poll::Ready(Ok("for the follower".into()))
    );
    assert_eq!(d.stats().active, 0);
    // Everyone gone before completion: the work is dropped, the key freed.
    let (tx2, work2) = gated::<String>(&calls);
    let mut l2 = d.run(k, FollowerOptions::default(), work2);
    let f2 = d.run(k, FollowerOptions::default(), not_called());
    assert!(poll(&mut l2).is_pending());
    drop((l2, f2));
    assert_eq!(d.stats().active, 0);
    assert!(tx2.send("nobody".into()).is_err(), "the call was dropped");
}

/// Streaming #6: with a share function the leader gets its own result untouched and each
/// follower a share of its own; a panicking share answers that follower `Unshareable`.
#[test]
fn a_share_function_gives_each_follower_its_own_result() {
    #[derive(Debug, PartialEq)]
    struct Stream(&'static str, u32); // not Clone: a single-consumer stream
    let next = Arc::new(AtomicU32::new(1));
    let n = next.clone();
    let d: Dedup<Stream> = Dedup::with_share(100, move |s: &Stream| {
        Stream(s.0, n.fetch_add(1, Ordering::SeqCst))
    });
    let k = DedupKey::of_bytes(b"k");
    let mut leader = d.run(k, FollowerOptions::default(), || async {
        Stream("body", 0)
    });
    let mut f1 = d.run(k, FollowerOptions::default(), || async { Stream("x", 9) });
    let mut f2 = d.run(k, FollowerOptions::default(), || async { Stream("x", 9) });
    assert_eq!(d.stats().hits, 2);
    assert_eq!(poll(&mut leader), Poll::Ready(Ok(Stream("body", 0))));
    let a = poll(&mut f1);
    let b = poll(&mut f2);
    let mut ids = [a, b].map(|p| match p {
        Poll::Ready(Ok(Stream("body", id))) => id,
        other => panic!("{other:?}"),
    });
    ids.sort();
    assert_eq!(ids, [1, 2]);

    let d: Dedup<u8> = Dedup::with_share(100, |_: &u8| panic!("cannot share"));
    let mut leader = d.run(k, FollowerOptions::default(), || async { 5 });
    let mut f = d.run(k, FollowerOptions::default(), || async { 0 });
    assert_eq!(poll(&mut leader), Poll::Ready(Ok(5)));
    assert_eq!(poll(&mut f), Poll::Ready(Err(DedupError::Unshareable)));
}

/// The map is bounded: a call that finds it full runs on its own, counted.
#[test]
fn a_full_map_runs_calls_on_their_own() {
    let d: Dedup<u8> = Dedup::new(1);
    let calls = Arc::new(AtomicU32::new(0));
    let (_tx, work) = gated::<u8>(&calls);
    let mut first = d.run(DedupKey::of_bytes(b"a"), FollowerOptions::default(), work);
    assert!(poll(&mut first).is_pending());
    let mut second = d.run(
        DedupKey::of_bytes(b"b"),
        FollowerOptions::default(),
        || async { 2 },
    );
    assert!(!second.is_leader() && !second.is_follower());
    assert_eq!(poll(&mut second), Poll::Ready(Ok(2)));
    let s = d.stats();
    assert_eq!((s.active, s.full), (1, 1));
}

/// Composed with `LlmBulkhead::run`: the group holds one admission, makes one upstream call;
/// a leader's failure (here a capacity refusal) reaches its followers.
#[test]
fn with_llm_bulkhead_run_a_group_takes_one_slot() {
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    let d: Dedup<Result<String, RunError<()>>> = Dedup::new(100);
    let calls = Arc::new(AtomicU32::new(0));
    let r = LlmRequest::new("gpt-4o", &["summarise this"]);
    let call = |gate: Option<oneshot::Receiver<()>>| {
        let (llm, r, calls) = (llm.clone(), r.clone(), calls.clone());
        move || async move {
            llm.run(&r, RunOptions::default(), async |_ctx| {
                calls.fetch_add(1, Ordering::SeqCst);
                if let Some(g) = gate {
                    let _ = g.await;
                }
                Ok::<_, ()>("answer".to_string())
            })
            .await
        }
    };
    let (tx, rx) = oneshot::channel();
    let mut leader = d.run(key(&r), FollowerOptions::default(), call(Some(rx)));
    let mut follower = d.run(key(&r), FollowerOptions::default(), call(None));
    assert!(poll(&mut leader).is_pending());
    assert_eq!(llm.bulkhead().stats().in_flight, 1);
    // The only slot is held by the shared call: a different request is refused.
    let other = LlmRequest::new("gpt-4o", &["something else"]);
    let mut refused = d.run(key(&other), FollowerOptions::default(), call(None));
    let mut refused_follower = d.run(key(&other), FollowerOptions::default(), call(None));
    let e = poll(&mut refused);
    assert!(
        matches!(e, Poll::Ready(Ok(Err(RunError::Rejected(_))))),
        "{e:?}"
    );
    let e = poll(&mut refused_follower);
    assert!(
        matches!(e, Poll::Ready(Ok(Err(RunError::Rejected(_))))),
        "{e:?}"
    );
    tx.send(()).unwrap();
    assert!(matches!(poll(&mut follower), Poll::Ready(Ok(Ok(ref s))) if s == "answer"));
    assert!(matches!(poll(&mut leader), Poll::Ready(Ok(Ok(ref s))) if s == "answer"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admitted, s.rejected), (0, 1, 1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A de-duplicated group makes exactly one upstream call and every caller gets an answer,
    /// whatever the order of polls and drops (the leader included).
    #[test]
    fn a_group_makes_one_call_and_every_remaining_caller_gets_the_answer(
        followers in 0usize..6,
        drops in prop::collection::vec(any::<bool>(), 7),
        order in prop::collection::vec(any::<u8>(), 7),
    ) {
        let d: Dedup<u32> = Dedup::new(16);
        let calls = Arc::new(AtomicU32::new(0));
        let k = DedupKey::of_bytes(b"group");
        let (tx, work) = gated::<u32>(&calls);
        let mut all = vec![d.run(k, FollowerOptions::default(), work)];
        for _ in 0..followers {
            all.push(d.run(k, FollowerOptions::default(), || async { 0 }));
        }
        for f in &mut all {
            prop_assert!(poll(f).is_pending());
        }
        // Some participants leave before the call completes (the leader possibly among them).
        let mut kept: Vec<_> = all.into_iter().zip(&drops).filter(|(_, d)| !**d).map(|(f, _)| f).collect();
        let alive = !kept.is_empty();
        let sent = tx.send(42).is_ok();
        prop_assert_eq!(sent, alive, "the call lives exactly while a participant does");
        let n = kept.len();
        for &o in &order[..n] {
            let j = usize::from(o) % kept.len();
            let mut f = kept.swap_remove(j);
            prop_assert_eq!(poll(&mut f), Poll::Ready(Ok(42)));
        }
        prop_assert_eq!(calls.load(Ordering::SeqCst), 1);
        prop_assert_eq!(d.stats().active, 0);
    }
}

/// A waker that counts its wakes.
struct CountWakes(AtomicU32);

impl std::task::Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_work_that_wakes_itself_while_polled_is_polled_again() {
    // The work asks to be polled again during its poll (as a yield does); the participant that
    // polled it must be woken although its own waker was not registered before the poll.
    let d: Dedup<u32> = Dedup::new(8);
    let mut yielded = false;
    let work = move || {
        std::future::poll_fn(move |cx| {
            if yielded {
                return Poll::Ready(5);
            }
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    };
    let mut leader = d.run(
        DedupKey::of_bytes(b"yield"),
        FollowerOptions::default(),
        work,
    );
    let counter = Arc::new(CountWakes(AtomicU32::new(0)));
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut leader).poll(&mut cx).is_pending());
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "woken during its own poll"
    );
    assert_eq!(Pin::new(&mut leader).poll(&mut cx), Poll::Ready(Ok(5)));
}

#[test]
fn a_waiting_follower_is_woken_when_the_leader_completes() {
    let d: Dedup<u32> = Dedup::new(8);
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, work) = gated::<u32>(&calls);
    let k = DedupKey::of_bytes(b"wake");
    let mut leader = d.run(k, FollowerOptions::default(), work);
    let mut follower = d.run(k, FollowerOptions::default(), || async { 0 });
    let counter = Arc::new(CountWakes(AtomicU32::new(0)));
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    // The follower drives the call first (its waker is then registered after its poll), then
    // the leader.
    assert!(Pin::new(&mut follower).poll(&mut cx).is_pending());
    assert!(poll(&mut leader).is_pending());
    assert_eq!(counter.0.load(Ordering::SeqCst), 0);
    tx.send(9).unwrap();
    assert!(
        counter.0.load(Ordering::SeqCst) >= 1,
        "the call's wake reaches the follower"
    );
    assert_eq!(poll(&mut leader), Poll::Ready(Ok(9)));
    assert_eq!(Pin::new(&mut follower).poll(&mut cx), Poll::Ready(Ok(9)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_work_that_panics_is_dropped_and_frees_its_key() {
    struct Guard(Arc<AtomicU32>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let d: Dedup<u32> = Dedup::new(8);
    let dropped = Arc::new(AtomicU32::new(0));
    let guard = Guard(dropped.clone());
    let work = move || async move {
        let _g = guard;
        if std::hint::black_box(true) {
            panic!("the upstream call panicked");
        }
        1
    };
    let mut leader = d.run(
        DedupKey::of_bytes(b"boom"),
        FollowerOptions::default(),
        work,
    );
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poll(&mut leader)));
    assert!(
        out.is_err(),
        "the panic reaches the participant that polled"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the work was dropped");
    assert_eq!(d.stats().active, 0);
    drop(leader);
    // The key is free: the next call leads a new flight.
    let again = d.run(
        DedupKey::of_bytes(b"boom"),
        FollowerOptions::default(),
        || async { 2 },
    );
    assert!(again.is_leader());
    assert_eq!(futures_lite::future::block_on(again), Ok(2));
}

#[test]
fn a_leader_that_completes_at_once_still_shares_with_those_who_joined() {
    // Followers joined before the leader's first poll (one of them left again): the leader's
    // completion makes the shares although its call never waited.
    let d: Dedup<String> = Dedup::new(8);
    let k = DedupKey::of_bytes(b"at once");
    let mut leader = d.run(k, FollowerOptions::default(), || async {
        "now".to_string()
    });
    let mut stays = d.run(k, FollowerOptions::default(), not_called());
    let leaves = d.run(k, FollowerOptions::default(), not_called());
    drop(leaves);
    assert_eq!(poll(&mut leader), Poll::Ready(Ok("now".to_string())));
    assert_eq!(poll(&mut stays), Poll::Ready(Ok("now".to_string())));
    assert_eq!(d.stats().active, 0);
    // A leader alone completes the same way and frees its key.
    let mut alone = d.run(k, FollowerOptions::default(), || async {
        "again".to_string()
    });
    assert!(alone.is_leader());
    assert_eq!(poll(&mut alone), Poll::Ready(Ok("again".to_string())));
    assert_eq!(
        (d.stats().active, d.stats().leaders, d.stats().hits),
        (0, 2, 2)
    );
}
