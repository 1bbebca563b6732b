//! The LLM layer and the tower layer over a cluster-managed bulkhead, on an injected clock (no
//! timing): built with `clustered` over the agent's handle, they admit nothing once the
//! installed share's window has ended, even when the agent has not stepped (its thread late)
//! and the core alone would still admit; the LLM layer's runs carry the admission deadline and
//! are cut there (`run` drops the work, a stream included; `run_blocking` is told and answers
//! `Cut`), with exact token accounting and overdue releases counted. The tower layer is tested
//! over HTTP on loopback with axum: a lapsed share is a 503 whose body says so, and a response
//! body that ends past its admission deadline is counted as overdue.
//!
//! Run with `LLM_BULKHEAD_CLUSTER_NO_WINDOW=1` (the handle without its window), the refusal
//! tests here must fail; with `LLM_BULKHEAD_CLUSTER_NO_CUT=1` (no cut reaches a run), the cut
//! tests (`.ci/run` runs both).

#[path = "support/cluster_leased.rs"]
mod cluster_leased;
mod support;

use cluster_leased::{counting_handler, leased, poll_across_deadline, DropFlag, RENEWED};
use llm_bulkhead::cluster::{ClusterRejection, ClusterRunError};
use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunError, RunOptions, StopCause};
use llm_bulkhead::tower::BulkheadLayer;
use llm_bulkhead::{Bulkhead, CancelToken, Demand, Reservation, Usage, WaitOptions};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;

/// 8 slots and 10 000 tokens; every request reserves 100 + 400.
fn budgeted() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(8)
        .token_budget(10_000)
        .build()
        .unwrap()
}

fn fixed(_: &LlmRequest) -> Result<Reservation, llm_bulkhead::llm::EstimateError> {
    Ok(Reservation::new(100, 400).unwrap())
}

fn lapsed<T: std::fmt::Debug>(r: Result<T, RunError<()>>) -> bool {
    matches!(
        r,
        Err(RunError::Cluster(ClusterRunError::Refused(
            ClusterRejection::ShareLapsed
        )))
    )
}

/// `run_blocking` and `run` refuse once the window ended, without running the work, while
/// the agent has not stepped and the core alone still admits; the admission is given back.
#[test]
fn llm_runs_refuse_a_lapsed_share() {
    let b = budgeted();
    let (clock, _store, mut agent, _) = leased(&b);
    let llm = LlmBulkhead::clustered(&agent.handle(), fixed);
    assert!(llm.is_clustered());
    let request = LlmRequest::default();
    clock.set(RENEWED + 939);
    let deadline = llm
        .run_blocking(&request, RunOptions::default(), |ctx| {
            Ok::<_, ()>(ctx.cluster_deadline_ms())
        })
        .unwrap();
    assert_eq!(deadline, Some(RENEWED + 939 + 1_000));
    clock.set(RENEWED + 940);
    let ran = AtomicBool::new(false);
    let r = llm.run_blocking(&request, RunOptions::default(), |_| {
        ran.store(true, Ordering::SeqCst);
        Ok::<_, ()>(())
    });
    assert!(lapsed(r), "run_blocking past the window");
    let r = futures_lite::future::block_on(llm.run(&request, RunOptions::default(), async |_| {
        ran.store(true, Ordering::SeqCst);
        Ok::<_, ()>(())
    }));
    assert!(lapsed(r), "run past the window");
    // With a token the fast decision declines: the waiting acquire admits, then the window.
    let waiting = || RunOptions {
        wait: WaitOptions {
            cancel: Some(CancelToken::new()),
            ..WaitOptions::default()
        },
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&request, waiting(), |_| Ok::<_, ()>(()));
    assert!(lapsed(r), "a waiting run_blocking past the window");
    let r = futures_lite::future::block_on(llm.run(&request, waiting(), async |_| Ok::<_, ()>(())));
    assert!(lapsed(r), "a waiting run past the window");
    let timed = llm.run_blocking_timed(&request, RunOptions::default(), |_| Ok::<_, ()>(()));
    assert!(lapsed(timed.value), "run_blocking_timed past the window");
    assert!(!ran.load(Ordering::SeqCst), "no work ran");
    let s = b.stats();
    assert_eq!(s.in_flight, 0, "given back at once");
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
    // The core alone would have admitted: the whole grant is still installed.
    assert_eq!(b.limits().max_concurrent, 8);
    let plain = LlmBulkhead::new(b.clone(), fixed);
    plain
        .run_blocking(&request, RunOptions::default(), |_| Ok::<_, ()>(()))
        .unwrap();
    // What a clustered bulkhead cannot carry the deadline through refuses as invalid.
    assert!(matches!(
        llm.try_acquire(&request, &RunOptions::default()),
        Err(llm_bulkhead::llm::AcquireError::Invalid(_))
    ));
    let shared = llm.run_shared(&request, RunOptions::default(), |_| {
        Box::pin(async { Ok::<_, ()>(1) })
    });
    assert!(matches!(
        futures_lite::future::block_on(shared),
        Err(RunError::Invalid(_))
    ));
    // The agent steps (and reports the refusals): the floor's share, with its window; a run
    // fits again.
    agent.tick();
    assert_eq!(agent.status().lapsed_refusals, 5);
    llm.run_blocking(&request, RunOptions::default(), |_| Ok::<_, ()>(()))
        .unwrap();
}

/// A streaming `run` (usage reported chunk by chunk) still going at its admission deadline is
/// woken by the agent's step, its future dropped, and answered `Cut`: the tokens are settled
/// with the last report, the capacity held until then, the release counted as overdue.
#[test]
fn a_streaming_run_is_cut_at_its_admission_deadline() {
    let b = budgeted();
    let (clock, _store, mut agent, _) = leased(&b);
    let llm = LlmBulkhead::clustered(&agent.handle(), fixed);
    let request = LlmRequest::default();
    clock.set(RENEWED + 10);
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let mut fut = pin!(llm.run(&request, RunOptions::default(), async |ctx| {
        let _flag = flag;
        assert_eq!(ctx.cluster_deadline_ms(), Some(RENEWED + 1_010));
        ctx.report_usage(Usage::new(100, 30)).unwrap(); // the first chunks
        std::future::pending::<()>().await; // a provider that stalls
        Ok::<_, ()>(())
    }));
    assert!(matches!(
        poll_across_deadline(fut.as_mut(), &clock, &mut agent, &b, RENEWED + 1_010),
        Poll::Ready(Err(RunError::Cluster(ClusterRunError::Cut)))
    ));
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
    let s = b.stats();
    let t = s.token_budget.unwrap();
    assert_eq!((s.in_flight, t.in_flight_tokens), (0, 0));
    assert_eq!(t.total_consumed, 130, "settled with the last report");
    assert_eq!(t.total_refunded, 370);
    agent.tick();
    let st = agent.status();
    assert_eq!((st.cut, st.overdue), (1, 1));
    // A run that ends in time answers its output, and is not overdue.
    clock.set(RENEWED + 1_100);
    let out =
        futures_lite::future::block_on(
            llm.run(&request, RunOptions::default(), async |_| Ok::<_, ()>(7)),
        );
    assert_eq!(out.unwrap(), 7);
    agent.tick();
    assert_eq!(agent.status().overdue, 1);
}

/// `run_blocking`: the deadline fires the run's stop signal (cause `Cut`) while the work runs
/// on the caller's thread; the answer is `Cut` when it returns, its tokens settled with the
/// usage of its result.
#[test]
fn run_blocking_is_told_at_its_admission_deadline() {
    let b = budgeted();
    let (clock, _store, mut agent, _) = leased(&b);
    let llm = LlmBulkhead::clustered(&agent.handle(), fixed);
    clock.set(RENEWED + 10);
    let options = RunOptions::default().with_usage(|u: &Usage| Some(*u));
    let r = llm.run_blocking(&LlmRequest::default(), options, |ctx| {
        let signal = ctx.stop_signal();
        assert!(!ctx.stop_requested());
        clock.set(RENEWED + 1_010);
        agent.tick(); // the agent's step, at the deadline
        assert!(ctx.stop_requested());
        assert_eq!(signal.cause(), Some(StopCause::Cut));
        Ok::<_, ()>(Usage::new(100, 50))
    });
    assert!(matches!(r, Err(RunError::Cluster(ClusterRunError::Cut))));
    let t = b.stats().token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.total_consumed), (0, 150));
    agent.tick();
    assert_eq!((agent.status().cut, agent.status().overdue), (1, 1));
    // A work that only asks (no signal registered, so none fired) is told all the same.
    let r = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
        let deadline = ctx.cluster_deadline_ms().unwrap();
        assert!(!ctx.stop_requested());
        clock.set(deadline);
        agent.tick();
        assert!(ctx.stop_requested(), "the agent's step passed the deadline");
        Ok::<_, ()>(())
    });
    assert!(matches!(r, Err(RunError::Cluster(ClusterRunError::Cut))));
    assert_eq!(b.stats().in_flight, 0);
    agent.tick();
    assert_eq!((agent.status().cut, agent.status().overdue), (1, 2));
}

/// The tower layer over HTTP on loopback: inside the window a request passes; once the window
/// ended (the agent not stepped) it is a 503 whose body says the share lapsed, fail-fast and
/// queued alike, and the inner service never sees it.
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_refuses_a_lapsed_share_over_http() {
    let b = Bulkhead::builder()
        .max_concurrent(8)
        .max_queue(4)
        .build()
        .unwrap();
    let (clock, _store, mut agent, _) = leased(&b);
    let (calls, handler) = counting_handler();
    let fail_fast = BulkheadLayer::clustered(&agent.handle()).build();
    let queued = BulkheadLayer::clustered(&agent.handle())
        .wait_in_queue(None)
        .build();
    let router = axum::Router::new()
        .route(
            "/fast",
            axum::routing::get(handler.clone()).layer(fail_fast),
        )
        .route("/queued", axum::routing::get(handler).layer(queued));
    let server = support::Server::start(router).await;
    clock.set(RENEWED + 939);
    for path in ["/fast", "/queued"] {
        let call = support::call(server.addr, support::get(path)).await;
        assert_eq!(call.response.status(), 200, "{path} inside the window");
        assert_eq!(support::text(call.response).await, "ok");
    }
    clock.set(RENEWED + 940);
    for path in ["/fast", "/queued"] {
        let call = support::call(server.addr, support::get(path)).await;
        assert_eq!(call.response.status(), 503, "{path} past the window");
        let body: serde_json::Value =
            serde_json::from_str(&support::text(call.response).await).unwrap();
        assert_eq!(body["error"]["code"], "share_lapsed", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("share lapsed"),
            "{body}"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "refused requests never reached it"
    );
    assert_eq!(b.stats().in_flight, 0);
    agent.tick();
    assert_eq!(agent.status().lapsed_refusals, 2);
    // The core alone would still admit.
    drop(b.try_acquire(Demand::slot()).unwrap());
}

/// The cut registered after the agent's step passed the deadline (the work first waits only
/// then): that step fired nothing for it, so the run must see the step itself and answer `Cut`
/// in that same poll, not one step later.
#[test]
fn a_cut_registered_after_the_step_is_not_missed() {
    let b = budgeted();
    let (clock, _store, mut agent, _) = leased(&b);
    let llm = LlmBulkhead::clustered(&agent.handle(), fixed);
    clock.set(RENEWED + 10);
    let mut fut = pin!(
        llm.run(&LlmRequest::default(), RunOptions::default(), async |_| {
            clock.set(RENEWED + 1_010);
            agent.tick(); // the step at the deadline, before the work first waits
            std::future::pending::<()>().await;
            Ok::<_, ()>(())
        })
    );
    let waker = std::task::Waker::noop();
    assert!(matches!(
        fut.as_mut()
            .poll(&mut std::task::Context::from_waker(waker)),
        Poll::Ready(Err(RunError::Cluster(ClusterRunError::Cut)))
    ));
    assert_eq!(b.stats().in_flight, 0);
}

/// The tower layer's admissions carry the deadline too: a streamed response whose body ends
/// after the agent's step passed the deadline is counted as overdue (the slot held until the
/// body's end, never handed back under it).
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_counts_a_body_past_its_deadline_as_overdue() {
    let b = Bulkhead::new(8).unwrap();
    let (clock, _store, mut agent, _) = leased(&b);
    let (tx, body) = support::ChannelBody::new();
    let body = Arc::new(std::sync::Mutex::new(Some(body)));
    let handler = move || {
        let body = body.lock().unwrap().take().expect("one request");
        async move { axum::body::Body::new(body) }
    };
    let layer = BulkheadLayer::clustered(&agent.handle()).build();
    let router = axum::Router::new().route("/stream", axum::routing::get(handler).layer(layer));
    let server = support::Server::start(router).await;
    clock.set(RENEWED + 100);
    let call = support::call(server.addr, support::get("/stream")).await;
    assert_eq!(call.response.status(), 200);
    assert_eq!(b.stats().in_flight, 1, "held while the body streams");
    clock.set(RENEWED + 1_100); // the admission's deadline
    agent.tick();
    assert_eq!(b.stats().in_flight, 1, "not handed back under the stream");
    tx.send(Ok(bytes::Bytes::from_static(b"late"))).unwrap();
    drop(tx);
    assert_eq!(support::text(call.response).await, "late");
    assert_eq!(b.stats().in_flight, 0);
    agent.tick();
    assert_eq!(agent.status().overdue, 1);
}
