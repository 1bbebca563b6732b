//! A share too small is not "never fits": on a cluster-managed bulkhead whose installed share
//! is zero (the table learning) or below a request's reservation, a request that fits the
//! **global** limits gets a retryable refusal (`ClusterRejection::ShareTooSmall`; over HTTP a
//! 503 `share_too_small` with `Retry-After`), and only a request above the global limits (the
//! global budget, or its class's global ceiling) gets the "never fits" refusal (a 413
//! `request_too_large`). The refused reservation is reported, so the agent's next renewal
//! asks for room for it and the share grows. Through the handle, the LLM layer and the tower
//! layer over HTTP on loopback (axum), on an injected clock (no timing); and a model test
//! (proptest): "share too small" exactly when an idle bulkhead with the global limits admits
//! the demand (the core's own judgement), over priorities, reserves, class floors and ceilings.
//!
//! Run with `LLM_BULKHEAD_CLUSTER_NO_SHARE_FIT=1` (every refusal judged against the share
//! alone), every test here must fail (`.ci/run` checks it).

#[path = "support/cluster_leased.rs"]
#[allow(dead_code)] // the cut tests' helpers
mod cluster_leased;
mod support;

use cluster_leased::{agent_config, counting_handler, Manual};
use llm_bulkhead::cluster::{ClusterAgent, ClusterRejection, ClusterRunError, MemoryStore};
use llm_bulkhead::llm::{EstimateError, LlmBulkhead, LlmRequest, RunError, RunOptions};
use llm_bulkhead::tower::{BulkheadLayer, ClassifyError};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, FitLimit, Priority, Reservation};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// 8 slots and 10 000 tokens; class `batch` has a global token ceiling of 2 000.
fn bulkhead() -> Bulkhead {
    classed(0, 0, 2_000)
}

/// As [`bulkhead`], with `reserve` tokens for high priority, a token floor of `floor` for
/// `interactive` and a token ceiling of `ceiling` for `batch`.
fn classed(reserve: u64, floor: u64, ceiling: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(8)
        .token_budget(10_000)
        .high_priority_reserve(reserve)
        .class(
            "interactive",
            ClassLimits {
                protected_tokens: floor,
                ..ClassLimits::default()
            },
        )
        .class(
            "batch",
            ClassLimits {
                max_tokens: Some(ceiling),
                ..ClassLimits::default()
            },
        )
        .default_class("interactive")
        .build()
        .unwrap()
}

/// An agent over `b` alone on a new table, stepped once at 0: the table learns until 3 000
/// (`agent_config`), so the installed share is zero.
fn learning(b: &Bulkhead) -> (Manual, MemoryStore, ClusterAgent) {
    let clock = Manual::default();
    let c2 = clock.clone();
    let store = MemoryStore::with_clock(move || {
        use llm_bulkhead::cluster::Clock;
        c2.now_ms()
    });
    let mut agent = ClusterAgent::with_clock(
        b.clone(),
        Box::new(store.clone()),
        agent_config("fit"),
        Arc::new(clock.clone()),
    )
    .unwrap();
    agent.tick();
    assert!(agent.status().learning);
    assert_eq!(b.limits().token_budget.unwrap().budget, 0, "share zero");
    (clock, store, agent)
}

/// What the replica's last renewal asked for (tokens).
fn asked(store: &MemoryStore) -> u64 {
    let table = store.table();
    let (_, record) = table.records.iter().next().expect("one replica");
    record.wants.tokens
}

fn too_small<T: std::fmt::Debug>(
    r: Result<T, RunError<()>>,
) -> Box<llm_bulkhead::cluster::ShareTooSmall> {
    match r {
        Err(RunError::Cluster(ClusterRunError::Refused(ClusterRejection::ShareTooSmall(s)))) => s,
        other => panic!("expected a share too small, got {other:?}"),
    }
}

fn reservation(tokens: u64) -> impl Fn(&LlmRequest) -> Result<Reservation, EstimateError> {
    move |_| Ok(Reservation::new(tokens, 0).unwrap())
}

/// The handle and the LLM layer: 500 tokens on share zero are retryable, with the share, the
/// global limit and the renewal period; 20 000 (above the global budget) and 3 000 in `batch`
/// (above its global ceiling) never fit. The agent's next renewal asks for the 500, and once
/// the table has learned the same request runs.
#[test]
fn a_share_too_small_is_retryable_and_asked_for() {
    let b = bulkhead();
    let (clock, store, mut agent) = learning(&b);
    let handle = agent.handle();
    let batch = b.class_id("batch").unwrap();

    let r = handle
        .try_acquire(Demand::tokens(Reservation::new(300, 200).unwrap()))
        .unwrap_err();
    let ClusterRejection::ShareTooSmall(s) = r else {
        panic!("the handle: {r:?}")
    };
    assert_eq!(
        (s.limit, s.requested, s.share, s.global, s.retry_after_ms),
        (FitLimit::EffectiveBudget, 500, 0, 10_000, 333)
    );
    assert!(s.rejection.never_fits().is_some(), "the core's own view");
    assert!(s.to_string().contains("share is too small"), "{s}");

    let small = LlmBulkhead::clustered(&handle, reservation(500));
    let s = too_small(
        small.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| {
            Ok::<_, ()>(())
        }),
    );
    assert_eq!((s.requested, s.share, s.global), (500, 0, 10_000));
    let s = too_small(futures_lite::future::block_on(small.run(
        &LlmRequest::default(),
        RunOptions::default(),
        async |_| Ok::<_, ()>(()),
    )));
    assert_eq!(s.requested, 500);

    // Above the global budget: never fits, as on a bulkhead that is not cluster-managed.
    let huge = LlmBulkhead::clustered(&handle, reservation(20_000));
    match huge.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| {
        Ok::<_, ()>(())
    }) {
        Err(RunError::Rejected(r)) => {
            let n = r.never_fits().unwrap();
            assert_eq!((n.limit, n.requested), (FitLimit::EffectiveBudget, 20_000));
        }
        other => panic!("above the global budget: {other:?}"),
    }
    // Above the class's global ceiling (2 000), though within the global budget.
    match handle.try_acquire(Demand::tokens(Reservation::new(3_000, 0).unwrap()).in_class(batch)) {
        Err(ClusterRejection::Refused(r)) => assert!(r.never_fits().is_some()),
        other => panic!("above the class's global ceiling: {other:?}"),
    }
    // Within it: the share is too small.
    match handle.try_acquire(Demand::tokens(Reservation::new(1_500, 0).unwrap()).in_class(batch)) {
        Err(ClusterRejection::ShareTooSmall(s)) => assert_eq!(s.global, 2_000),
        other => panic!("within the class's global ceiling: {other:?}"),
    }

    // The next renewal (early: refused work, at most every ttl / 10) asks for the largest
    // reservation refused as too large for the share, not one token.
    clock.set(100);
    agent.tick();
    assert_eq!(agent.status().renewals, 2);
    assert!(asked(&store) >= 1_500, "asked for {}", asked(&store));
    // Past learning the share grows and the same request runs.
    clock.set(3_001);
    agent.tick();
    assert!(!agent.status().learning);
    assert!(b.limits().token_budget.unwrap().budget >= 500);
    small
        .run_blocking(&LlmRequest::default(), RunOptions::default(), |_| {
            Ok::<_, ()>(())
        })
        .unwrap();
}

/// The tower layer over HTTP: on share zero a request of 500 tokens is a 503
/// `share_too_small` with `Retry-After: 1` (the renewal period, 333 ms, in whole seconds) and
/// a body naming the share and the global limit, fail-fast and queued alike; one of 20 000 is a
/// 413 `request_too_large`. The inner service sees none of them, and once the share has grown
/// the small request passes.
#[tokio::test(flavor = "current_thread")]
async fn the_tower_layer_answers_a_share_too_small_with_a_retryable_503() {
    let b = bulkhead();
    let (clock, store, mut agent) = learning(&b);
    let (calls, handler) = counting_handler();
    // The reservation from a header (a real gateway estimates it from the body).
    let classify = |parts: &http::request::Parts| {
        let tokens = parts.headers["x-tokens"].to_str().unwrap().parse().unwrap();
        Ok::<_, ClassifyError>(Demand::tokens(Reservation::new(tokens, 0).unwrap()))
    };
    let fast = BulkheadLayer::clustered(&agent.handle())
        .classifier(classify)
        .build();
    let queued = BulkheadLayer::clustered(&agent.handle())
        .classifier(classify)
        .wait_in_queue(None)
        .build();
    let router = axum::Router::new()
        .route("/fast", axum::routing::get(handler.clone()).layer(fast))
        .route("/queued", axum::routing::get(handler).layer(queued));
    let server = support::Server::start(router).await;
    let get = |path: &str, tokens: &str| {
        let mut r = support::get(path);
        r.headers_mut().insert("x-tokens", tokens.parse().unwrap());
        r
    };
    for path in ["/fast", "/queued"] {
        let call = support::call(server.addr, get(path, "500")).await;
        assert_eq!(call.response.status(), 503, "{path}: retryable");
        assert_eq!(call.response.headers()["retry-after"], "1", "{path}");
        let body: serde_json::Value =
            serde_json::from_str(&support::text(call.response).await).unwrap();
        let e = &body["error"];
        assert_eq!(e["code"], "share_too_small", "{body}");
        assert_eq!(e["limit"]["requested"], 500, "{body}");
        assert_eq!(e["limit"]["most"], 0, "the share: {body}");
        assert_eq!(e["limit"]["global"], 10_000, "the global limit: {body}");
        assert!(e["message"].as_str().unwrap().contains("retry"), "{body}");

        let call = support::call(server.addr, get(path, "20000")).await;
        assert_eq!(
            call.response.status(),
            413,
            "{path}: above the global budget"
        );
        assert!(call.response.headers().get("retry-after").is_none());
        let body: serde_json::Value =
            serde_json::from_str(&support::text(call.response).await).unwrap();
        assert_eq!(body["error"]["code"], "request_too_large", "{body}");
        assert!(body["error"]["limit"].get("global").is_none(), "{body}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "refused requests never reached it"
    );
    // The demand is reported: the next renewal asks for room for the 500 tokens.
    clock.set(100);
    agent.tick();
    assert!(asked(&store) >= 500, "asked for {}", asked(&store));
    clock.set(3_001);
    agent.tick();
    let call = support::call(server.addr, get("/fast", "500")).await;
    assert_eq!(call.response.status(), 200, "the share grew");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// With metrics on, the layer counts the cluster refusals by status and code, registered with
/// the layer: 503 `share_too_small` apart from 413 `request_too_large`.
#[cfg(feature = "metrics")]
#[test]
fn the_tower_layer_counts_a_share_too_small_apart() {
    use metrics_util::debugging::DebuggingRecorder;
    use tower::ServiceExt;
    use tower_layer::Layer;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let b = bulkhead();
    let (_clock, _store, agent) = learning(&b);
    metrics::with_local_recorder(&recorder, || {
        let svc = BulkheadLayer::clustered(&agent.handle())
            .classifier(|parts: &http::request::Parts| {
                let tokens = parts.headers["x-tokens"].to_str().unwrap().parse().unwrap();
                Ok::<_, ClassifyError>(Demand::tokens(Reservation::new(tokens, 0).unwrap()))
            })
            .record_metrics_named("gw")
            .build()
            .layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                    bytes::Bytes,
                >::new()))
            }));
        let call = |tokens: &str| {
            let r = http::Request::get("/")
                .header("x-tokens", tokens)
                .body(())
                .unwrap();
            futures_lite::future::block_on(svc.clone().oneshot(r))
                .unwrap()
                .status()
        };
        assert_eq!(call("500"), 503);
        assert_eq!(call("600"), 503);
        assert_eq!(call("20000"), 413);
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |status: &str, code: &str| support::http_refusals(&snapshot, status, code, None);
    assert_eq!(count("503", "share_too_small"), Some(2));
    assert_eq!(count("413", "request_too_large"), Some(1));
    assert_eq!(count("503", "share_lapsed"), Some(0));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// The model: on share zero every token demand is refused by the core as never fitting
    /// the share; the cluster answer is "share too small" exactly when the same demand fits an
    /// idle bulkhead built with the global limits (the core's own never-fits judgement there),
    /// whatever the priority, the high-priority reserve, the class, its floor and ceiling.
    #[test]
    fn too_small_exactly_when_the_global_limits_admit_it(
        reserve in 0u64..4_000,
        floor in 0u64..6_000,
        ceiling in 1_000u64..10_000,
        demands in proptest::collection::vec((1u64..12_000, proptest::bool::ANY, 0usize..3), 1..16),
    ) {
        let b = classed(reserve, floor, ceiling);
        let global = classed(reserve, floor, ceiling);
        let (_clock, _store, agent) = learning(&b);
        let handle = agent.handle();
        for (tokens, high, class) in demands {
            let priority = if high { Priority::High } else { Priority::Normal };
            let demand = |on: &Bulkhead| {
                let d = Demand::tokens(Reservation::new(tokens, 0).unwrap()).with_priority(priority);
                match ["", "interactive", "batch"][class] {
                    "" => d,
                    name => d.in_class(on.class_id(name).unwrap()),
                }
            };
            let fits_globally = match global.try_acquire(demand(&global)) {
                Ok(_) => true,
                Err(r) => {
                    proptest::prop_assert!(r.never_fits().is_some(), "idle: {r:?}");
                    false
                }
            };
            match handle.try_acquire(demand(&b)) {
                Err(ClusterRejection::ShareTooSmall(s)) => {
                    proptest::prop_assert!(fits_globally, "{tokens} {priority:?} {class}: {s}");
                    proptest::prop_assert!(s.global >= tokens);
                }
                Err(ClusterRejection::Refused(r)) => {
                    proptest::prop_assert!(!fits_globally, "{tokens} {priority:?} {class}: {r:?}");
                    proptest::prop_assert!(r.never_fits().is_some());
                }
                other => proptest::prop_assert!(false, "share zero: {other:?}"),
            }
        }
    }
}
