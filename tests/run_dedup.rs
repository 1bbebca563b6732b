//! De-duplication as an option of `run` (issue 15 items 1 and 2): `LlmBulkhead::with_dedup`,
//! `run_shared` / `run_shared_with`, the per-call `dedup` and `dedup_scope`, the class as an
//! automatic partition, unshareable results, the `dedup` event and `LlmBulkhead::stats`. The
//! shared call is held open by a oneshot channel the test completes; futures are polled by hand
//! with a no-op waker, so nothing sleeps.
#![cfg(feature = "serde")]

#[path = "support/llm.rs"]
mod llm_support;

use llm_bulkhead::llm::{
    BoxWork, DedupError, DedupKey, DedupOutcome, DedupSettings, EstimateError, LlmBulkhead,
    LlmEvent, LlmRequest, NaiveEstimator, RunContext, RunError, RunOptions,
};
use llm_bulkhead::{Bulkhead, ClassId, ClassLimits, Event, QueueTimeout, RejectReason};
use llm_support::{dedup_llm, poll_unpin as poll, record, request};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::sync::oneshot;

type Out = Result<String, RunError<String>>;

fn ready<F: Future + Unpin>(f: &mut F) -> F::Output {
    match poll(f) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("expected the future to be ready"),
    }
}

/// A call that counts itself, waits for `gate` (if any), and answers `answer`.
fn call(
    calls: &Arc<AtomicU32>,
    gate: Option<oneshot::Receiver<()>>,
    answer: &str,
) -> impl for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, String, String> + Send + 'static {
    let calls = calls.clone();
    let answer = answer.to_owned();
    move |_ctx: &mut RunContext| -> BoxWork<'_, String, String> {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if let Some(g) = gate {
                g.await.map_err(|e| e.to_string())?;
            }
            Ok(answer)
        })
    }
}

fn boxed<F: Future<Output = Out> + Send + 'static>(
    f: F,
) -> Pin<Box<dyn Future<Output = Out> + Send>> {
    Box::pin(f)
}

#[test]
fn identical_calls_in_flight_share_one_admission() {
    let llm = dedup_llm(Bulkhead::new(1).unwrap());
    let (log, _sub) = record(llm.bulkhead());
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let mut leader = boxed(llm.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "shared"),
    ));
    assert!(poll(&mut leader).is_pending()); // admitted, waiting on the gate
                                             // One slot: without de-duplication the follower would be refused.
    let mut follower = boxed(llm.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, None, "other"),
    ));
    assert!(poll(&mut follower).is_pending());
    tx.send(()).unwrap();
    assert_eq!(ready(&mut follower).unwrap(), "shared");
    assert_eq!(ready(&mut leader).unwrap(), "shared");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let s = llm.stats();
    assert_eq!(
        (
            s.bulkhead.admitted,
            s.bulkhead.rejected,
            s.bulkhead.in_flight
        ),
        (1, 0, 0)
    );
    let d = s.dedup.unwrap();
    assert_eq!((d.leaders, d.hits, d.active), (1, 1, 0));
    let names: Vec<_> = log.lock().unwrap().iter().map(Event::name).collect();
    assert_eq!(names, ["admit", "dedup", "release"]);
    match LlmEvent::of(&log.lock().unwrap()[1]) {
        Some(LlmEvent::Dedup(e)) => assert_eq!(
            (e.class.as_deref(), e.outcome),
            (None, DedupOutcome::Joined)
        ),
        other => panic!("{other:?}"),
    }
    // Settled: the next identical call is new.
    let mut again =
        boxed(llm.run_shared(&request(), RunOptions::default(), call(&calls, None, "new")));
    assert_eq!(ready(&mut again).unwrap(), "new");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn opting_out_scopes_settings_and_key_functions() {
    let llm = dedup_llm(Bulkhead::new(8).unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let (_tx, rx) = oneshot::channel::<()>();
    let mut leader = boxed(llm.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "a"),
    ));
    assert!(poll(&mut leader).is_pending());
    // `dedup: false` opts out; another scope is another partition; another request another key.
    let opt_out = RunOptions {
        dedup: false,
        ..RunOptions::default()
    };
    let scoped = RunOptions {
        dedup_scope: Some("tenant-b".into()),
        ..RunOptions::default()
    };
    let mut other = LlmRequest::new("gpt-4o", &["What is a bulkhead?"]);
    other.max_tokens = Some(256);
    for (options, r) in [
        (opt_out, request()),
        (scoped, request()),
        (RunOptions::default(), other),
    ] {
        let mut f = boxed(llm.run_shared(&r, options, call(&calls, None, "own")));
        assert_eq!(ready(&mut f).unwrap(), "own");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(llm.stats().dedup.unwrap().hits, 0);
    drop(leader); // the only participant: the call is dropped and its admission released
    assert_eq!(llm.bulkhead().stats().in_flight, 0);

    // A bulkhead whose setting is off shares nothing; `dedup: true` cannot switch it on.
    let off = LlmBulkhead::new(Bulkhead::new(8).unwrap(), NaiveEstimator)
        .with_dedup(DedupSettings {
            enabled: false,
            ..DedupSettings::default()
        })
        .unwrap();
    let (_tx, rx) = oneshot::channel::<()>();
    let mut held = boxed(off.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "x"),
    ));
    assert!(poll(&mut held).is_pending());
    let mut f = boxed(off.run_shared(
        &request(),
        RunOptions {
            dedup: true,
            ..RunOptions::default()
        },
        call(&calls, None, "y"),
    ));
    assert_eq!(ready(&mut f).unwrap(), "y");
    assert_eq!(off.stats().dedup.unwrap().hits, 0);
    // Without any setting: no de-duplication and no dedup block in the stats.
    let plain = LlmBulkhead::new(Bulkhead::new(8).unwrap(), NaiveEstimator);
    let mut f = boxed(plain.run_shared(&request(), RunOptions::default(), call(&calls, None, "z")));
    assert_eq!(ready(&mut f).unwrap(), "z");
    assert!(plain.stats().dedup.is_none());

    // A custom key function: a constant key shares across requests, but not across scopes;
    // `None` opts out.
    let keyed = LlmBulkhead::new(Bulkhead::new(8).unwrap(), NaiveEstimator)
        .with_dedup(DedupSettings {
            key: Some(Arc::new(|r: &LlmRequest| {
                if r.max_tokens == Some(1) {
                    None
                } else {
                    DedupKey::of_bytes(b"constant")
                }
            })),
            ..DedupSettings::default()
        })
        .unwrap();
    let (tx, rx) = oneshot::channel();
    let mut lead = boxed(keyed.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "k"),
    ));
    assert!(poll(&mut lead).is_pending());
    let mut same_key = boxed(keyed.run_shared(
        &LlmRequest::new("m", &["different"]),
        RunOptions::default(),
        call(&calls, None, "-"),
    ));
    assert!(poll(&mut same_key).is_pending());
    let mut scope_b = boxed(keyed.run_shared(
        &request(),
        RunOptions {
            dedup_scope: Some("b".into()),
            ..RunOptions::default()
        },
        call(&calls, None, "b"),
    ));
    assert_eq!(ready(&mut scope_b).unwrap(), "b");
    let mut no_key = request();
    no_key.max_tokens = Some(1);
    let mut opted =
        boxed(keyed.run_shared(&no_key, RunOptions::default(), call(&calls, None, "n")));
    assert_eq!(ready(&mut opted).unwrap(), "n");
    tx.send(()).unwrap();
    assert_eq!(ready(&mut same_key).unwrap(), "k");
    assert_eq!(ready(&mut lead).unwrap(), "k");
    assert_eq!(keyed.stats().dedup.unwrap().hits, 1);
}

fn classed() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(10_000)
        .class(
            "premium",
            ClassLimits {
                max_concurrent: Some(2),
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                max_concurrent: Some(2),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap()
}

#[test]
fn the_class_is_an_automatic_partition_and_an_unknown_class_is_refused_before_joining() {
    let llm = dedup_llm(classed());
    let (log, _sub) = record(llm.bulkhead());
    let premium = llm.bulkhead().class_id("premium").unwrap();
    let standard = llm.bulkhead().class_id("standard").unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let in_class = |c: Option<ClassId>| RunOptions {
        class: c,
        dedup_scope: Some("tenant-a".into()),
        ..RunOptions::default()
    };
    let (tx_p, rx_p) = oneshot::channel();
    let (tx_s, rx_s) = oneshot::channel();
    let mut p1 = boxed(llm.run_shared(
        &request(),
        in_class(Some(premium)),
        call(&calls, Some(rx_p), "premium-result"),
    ));
    assert!(poll(&mut p1).is_pending());
    // The same request in standard runs on its own (another partition).
    let mut s1 = boxed(llm.run_shared(
        &request(),
        in_class(Some(standard)),
        call(&calls, Some(rx_s), "standard-result"),
    ));
    assert!(poll(&mut s1).is_pending());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // No class is the default class: it joins standard's call.
    let mut s2 = boxed(llm.run_shared(&request(), in_class(None), call(&calls, None, "-")));
    assert!(poll(&mut s2).is_pending());
    let mut p2 =
        boxed(llm.run_shared(&request(), in_class(Some(premium)), call(&calls, None, "-")));
    assert!(poll(&mut p2).is_pending());
    // A class id this bulkhead does not have (another bulkhead's): refused before joining
    // anything.
    let unknown: ClassId = classed().class_id("premium").unwrap();
    let mut bad =
        boxed(llm.run_shared(&request(), in_class(Some(unknown)), call(&calls, None, "-")));
    match ready(&mut bad) {
        Err(RunError::Invalid(EstimateError::InvalidSetting { field: "class", .. })) => {}
        other => panic!("{other:?}"),
    }
    tx_p.send(()).unwrap();
    tx_s.send(()).unwrap();
    assert_eq!(ready(&mut p2).unwrap(), "premium-result");
    assert_eq!(ready(&mut s2).unwrap(), "standard-result");
    assert_eq!(ready(&mut p1).unwrap(), "premium-result");
    assert_eq!(ready(&mut s1).unwrap(), "standard-result");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let s = llm.stats();
    assert_eq!((s.bulkhead.admitted, s.dedup.unwrap().hits), (2, 2));
    let dedups: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match LlmEvent::of(e) {
            Some(LlmEvent::Dedup(d)) => Some((d.class.clone(), d.outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(
        dedups,
        [
            (Some("standard".to_owned()), DedupOutcome::Joined),
            (Some("premium".to_owned()), DedupOutcome::Joined)
        ]
    );
    // A class on a bulkhead without classes is refused too.
    let plain = dedup_llm(Bulkhead::new(1).unwrap());
    let mut f =
        boxed(plain.run_shared(&request(), in_class(Some(premium)), call(&calls, None, "-")));
    assert!(matches!(ready(&mut f), Err(RunError::Invalid(_))));
    assert_eq!(plain.bulkhead().stats().admitted, 0);
}

#[test]
fn followers_share_the_leaders_rejection() {
    let llm = dedup_llm(Bulkhead::new(0).unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let mut a = boxed(llm.run_shared(&request(), RunOptions::default(), call(&calls, None, "-")));
    let mut b = boxed(llm.run_shared(&request(), RunOptions::default(), call(&calls, None, "-")));
    for f in [&mut b, &mut a] {
        match ready(f) {
            Err(RunError::Rejected(r)) => assert_eq!(r.reason, RejectReason::ConcurrencyLimit),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // One refusal: the follower took no decision of its own.
    assert_eq!(llm.bulkhead().stats().rejected, 1);
}

#[test]
fn a_dropped_leader_does_not_cancel_the_followers_call() {
    let llm = dedup_llm(Bulkhead::new(1).unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let mut leader = boxed(llm.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "kept"),
    ));
    assert!(poll(&mut leader).is_pending());
    let mut follower =
        boxed(llm.run_shared(&request(), RunOptions::default(), call(&calls, None, "-")));
    assert!(poll(&mut follower).is_pending());
    drop(leader);
    assert_eq!(llm.bulkhead().stats().in_flight, 1); // the call and its admission go on
    tx.send(()).unwrap();
    assert_eq!(ready(&mut follower).unwrap(), "kept");
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
}

#[test]
fn unshareable_results_and_follower_timeouts_are_counted_and_seen() {
    struct Stream(String); // not Clone: one consumer only
    let llm = dedup_llm(Bulkhead::new(4).unwrap());
    let (log, _sub) = record(llm.bulkhead());
    let (tx, rx) = oneshot::channel::<()>();
    fn stream_call(
        gate: Option<oneshot::Receiver<()>>,
    ) -> impl for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, Stream, String> + Send + 'static
    {
        move |_ctx: &mut RunContext| -> BoxWork<'_, Stream, String> {
            Box::pin(async move {
                if let Some(g) = gate {
                    g.await.map_err(|e| e.to_string())?;
                }
                Ok(Stream("s".into()))
            })
        }
    }
    let share = |s: &Stream| {
        if s.0 == "s" {
            None
        } else {
            Some(Stream(s.0.clone()))
        }
    };
    let mut leader = Box::pin(llm.run_shared_with(
        &request(),
        RunOptions::default(),
        share,
        stream_call(Some(rx)),
    ));
    assert!(poll(&mut leader).is_pending());
    let mut follower =
        Box::pin(llm.run_shared_with(&request(), RunOptions::default(), share, stream_call(None)));
    assert!(poll(&mut follower).is_pending());
    // A follower with a zero timeout gives up at its first poll; the call goes on.
    let impatient = RunOptions {
        wait: llm_bulkhead::WaitOptions {
            timeout: QueueTimeout::After(Duration::ZERO),
            cancel: None,
        },
        ..RunOptions::default()
    };
    let mut gone = Box::pin(llm.run_shared_with(&request(), impatient, share, stream_call(None)));
    assert!(matches!(
        ready(&mut gone),
        Err(RunError::Shared(DedupError::Timeout))
    ));
    tx.send(()).unwrap();
    assert!(matches!(
        ready(&mut follower),
        Err(RunError::Shared(DedupError::Unshareable))
    ));
    assert_eq!(ready(&mut leader).unwrap().0, "s"); // the leader keeps the original
    let d = llm.stats().dedup.unwrap();
    assert_eq!((d.hits, d.unshareable, d.timeouts, d.active), (2, 1, 1, 0));
    let outcomes: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match LlmEvent::of(e) {
            Some(LlmEvent::Dedup(d)) => Some(d.outcome),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            DedupOutcome::Joined,
            DedupOutcome::Joined,
            DedupOutcome::Timeout,
            DedupOutcome::Unshareable
        ]
    );
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
}

#[test]
fn results_of_different_types_never_share() {
    let llm = dedup_llm(Bulkhead::new(4).unwrap());
    let calls = Arc::new(AtomicU32::new(0));
    let (tx, rx) = oneshot::channel();
    let mut text = boxed(llm.run_shared(
        &request(),
        RunOptions::default(),
        call(&calls, Some(rx), "t"),
    ));
    assert!(poll(&mut text).is_pending());
    let mut number = Box::pin(llm.run_shared(
        &request(),
        RunOptions::default(),
        |_ctx: &mut RunContext| -> BoxWork<'_, u64, ()> { Box::pin(async { Ok(5) }) },
    ));
    assert_eq!(ready(&mut number).unwrap(), 5);
    tx.send(()).unwrap();
    assert_eq!(ready(&mut text).unwrap(), "t");
    assert_eq!(llm.stats().dedup.unwrap().hits, 0);
}

#[test]
fn a_shared_run_is_send_and_static_and_reports_usage_from_the_context() {
    let llm = dedup_llm(
        Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(10_000)
            .build()
            .unwrap(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let out = rt.block_on(async {
        let f = llm.run_shared(
            &request(),
            RunOptions::default(),
            |ctx: &mut RunContext| -> BoxWork<'_, u64, ()> {
                Box::pin(async move {
                    ctx.report_usage(llm_bulkhead::Usage::new(5, 7)).unwrap();
                    Ok(ctx.held())
                })
            },
        );
        tokio::spawn(f).await.unwrap()
    });
    assert!(out.unwrap() > 0);
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.total_consumed), (0, 12));
}

#[test]
fn the_composable_dedup_counts_its_unshareable_followers_and_timeouts() {
    use llm_bulkhead::llm::{Dedup, FollowerOptions};
    let d: Dedup<u32> = Dedup::with_share(8, |_: &u32| panic!("cannot share"));
    let k = DedupKey::of_bytes(b"k");
    let (tx, rx) = oneshot::channel::<()>();
    let mut leader = d.run(k, FollowerOptions::default(), || async move {
        rx.await.unwrap();
        1
    });
    assert!(poll(&mut leader).is_pending());
    let mut follower = d.run(k, FollowerOptions::default(), || async { 2 });
    let mut impatient = d.run(
        k,
        FollowerOptions {
            timeout: Some(Duration::ZERO),
            ..FollowerOptions::default()
        },
        || async { 3 },
    );
    assert_eq!(ready(&mut impatient), Err(DedupError::Timeout));
    assert!(poll(&mut follower).is_pending());
    tx.send(()).unwrap();
    assert_eq!(ready(&mut leader), Ok(1));
    assert_eq!(ready(&mut follower), Err(DedupError::Unshareable));
    let s = d.stats();
    assert_eq!((s.hits, s.unshareable, s.timeouts), (2, 1, 1));
}
