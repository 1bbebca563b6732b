//! The tower layer without a network (services called through `tower::ServiceExt`, bodies
//! polled by hand) and, for the axum#2582 shape, through a real axum server on loopback.

mod support;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Empty, Full};
use llm_bulkhead::tower::{
    openai_usage, AdmittedBody, BulkheadLayer, ClassifyError, HeaderClassifier, Refusal, Refused,
    ReleaseAt, TokenEstimate,
};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, RejectReason, Reservation};
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use support::{run, BodySender, ChannelBody};
use tokio::sync::{mpsc, oneshot, Notify};
use tower::{service_fn, Service, ServiceExt};
use tower_layer::Layer;

/// A streaming inner service: every request gets a fresh channel body, whose sender goes to
/// the test; it counts the requests it sees.
fn streaming() -> (
    impl Service<
            Request<()>,
            Response = Response<ChannelBody>,
            Error = Infallible,
            Future = impl Future + Send,
        > + Clone,
    mpsc::UnboundedReceiver<BodySender>,
    Arc<AtomicUsize>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let svc = service_fn(move |_req: Request<()>| {
        s.fetch_add(1, Ordering::SeqCst);
        let (sender, body) = ChannelBody::new();
        tx.send(sender).unwrap();
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    (svc, rx, seen)
}

fn in_flight(b: &Bulkhead) -> u64 {
    b.stats().in_flight
}

async fn json_of<B>(resp: Response<AdmittedBody<B>>) -> serde_json::Value
where
    B: Body + Send,
    B::Data: From<Bytes> + Send,
    B::Error: std::fmt::Debug,
{
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[test]
fn a_refused_request_never_reaches_the_inner_service_and_gets_a_429_with_detail() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(1_000)
            .build()
            .unwrap();
        let (inner, mut bodies, seen) = streaming();
        let mut svc = BulkheadLayer::slots(bulkhead.clone()).layer(inner);
        let first = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        let _sender = bodies.recv().await.unwrap();
        assert_eq!(in_flight(&bulkhead), 1);
        let refused = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()["content-type"], "application/json");
        assert!(refused.headers().get("retry-after").is_none());
        let json = json_of(refused).await;
        let e = &json["error"];
        assert_eq!(e["type"], "admission_rejected");
        assert_eq!(e["reason"], "concurrency_limit");
        assert_eq!(e["revision"], 0);
        assert_eq!(e["capacity"]["in_flight"], 1);
        assert_eq!(e["capacity"]["max_concurrent"], 1);
        assert_eq!(e["capacity"]["tokens"]["budget"], 1_000);
        // No internal nulls: absent parts are absent.
        assert!(!json.to_string().contains("null"), "{json}");
        assert!(e.get("constraint").is_none() && e.get("class").is_none());
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        drop(first);
        assert_eq!(in_flight(&bulkhead), 0);
        // A closed bulkhead answers 503.
        bulkhead.close();
        let closed = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(json_of(closed).await["error"]["reason"], "shutdown");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn error_mode_refuses_with_a_typed_error_and_keeps_inner_errors() {
    run(async {
        let bulkhead = Bulkhead::new(0).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let inner = service_fn(move |_: Request<()>| {
            s.fetch_add(1, Ordering::SeqCst);
            async { Err::<Response<Empty<Bytes>>, _>(std::io::Error::other("provider down")) }
        });
        let layer = BulkheadLayer::slots(bulkhead.clone()).refuse_with_error();
        let err = layer
            .layer(inner.clone())
            .oneshot(Request::new(()))
            .await
            .unwrap_err();
        match &err {
            Refused::Refusal(Refusal::Rejected(r)) => {
                assert_eq!(r.reason, RejectReason::ConcurrencyLimit)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        // Through a BoxError, the refusal downcasts.
        let boxed: tower::BoxError = Box::new(err);
        assert!(boxed.downcast_ref::<Refused<std::io::Error>>().is_some());
        // The inner error comes through as Inner, and releases its admission.
        bulkhead
            .apply_limits(bulkhead.limits().with_revision(1).with_max_concurrent(1))
            .unwrap();
        let err = layer
            .layer(inner)
            .oneshot(Request::new(()))
            .await
            .unwrap_err();
        assert!(matches!(err, Refused::Inner(ref e) if e.to_string() == "provider down"));
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

#[test]
fn a_stream_holds_its_slot_until_its_last_chunk() {
    run(async {
        let bulkhead = Bulkhead::new(1).unwrap();
        let (inner, mut bodies, _) = streaming();
        let svc = BulkheadLayer::slots(bulkhead.clone()).layer(inner);
        let resp = svc.oneshot(Request::new(())).await.unwrap();
        let sender = bodies.recv().await.unwrap();
        let mut body = resp.into_body();
        assert!(body.holds_admission());
        for i in 0..3 {
            sender.send(Ok(Bytes::from(format!("chunk {i}")))).unwrap();
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), format!("chunk {i}"));
            assert_eq!(in_flight(&bulkhead), 1, "released before the end");
        }
        drop(sender);
        assert!(body.frame().await.is_none());
        assert!(!body.holds_admission());
        assert_eq!(in_flight(&bulkhead), 0);
        assert_eq!(bulkhead.stats().released, 1);
    });
}

#[test]
fn dropping_a_body_or_a_body_error_releases() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(100)
            .build()
            .unwrap();
        let (inner, mut bodies, _) = streaming();
        let svc = BulkheadLayer::slots(bulkhead.clone()).layer(inner);
        let mut estimated = Request::new(());
        estimated
            .extensions_mut()
            .insert(TokenEstimate(Reservation::new(30, 20).unwrap()));
        let dropped = svc.clone().oneshot(estimated).await.unwrap();
        let failing = svc.oneshot(Request::new(())).await.unwrap();
        let (_a, b) = (bodies.recv().await.unwrap(), bodies.recv().await.unwrap());
        assert_eq!(in_flight(&bulkhead), 2);
        assert_eq!(bulkhead.stats().token_budget.unwrap().in_flight_tokens, 50);
        // A client that disconnects: the server drops the body.
        drop(dropped);
        assert_eq!(in_flight(&bulkhead), 1);
        assert_eq!(bulkhead.stats().token_budget.unwrap().in_flight_tokens, 0);
        // A body that fails.
        b.send(Err(std::io::Error::other("upstream reset")))
            .unwrap();
        let mut body = failing.into_body();
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

#[test]
fn ended_bodies_and_release_at_headers_release_at_once() {
    run(async {
        let bulkhead = Bulkhead::new(1).unwrap();
        let empty = service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let resp = BulkheadLayer::slots(bulkhead.clone())
            .layer(empty)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        assert!(!resp.body().holds_admission());
        assert_eq!(in_flight(&bulkhead), 0);
        let (inner, mut bodies, _) = streaming();
        let layer = BulkheadLayer::builder(bulkhead.clone())
            .release_at(ReleaseAt::Headers)
            .build();
        let resp = layer.layer(inner).oneshot(Request::new(())).await.unwrap();
        let _sender = bodies.recv().await.unwrap();
        assert!(!resp.body().holds_admission());
        assert_eq!(in_flight(&bulkhead), 0);
        assert_eq!(bulkhead.stats().released, 2);
    });
}

#[test]
fn dropping_the_response_future_releases() {
    run(async {
        let bulkhead = Bulkhead::new(1).unwrap();
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let inner = service_fn(move |_: Request<()>| {
            let (_never_tx, never) = oneshot::channel::<()>();
            entered_tx.send(_never_tx).unwrap();
            async move {
                let _ = never.await;
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        });
        let svc = BulkheadLayer::slots(bulkhead.clone()).layer(inner);
        let task = tokio::spawn(svc.oneshot(Request::new(())));
        let _keep_pending = entered.recv().await.unwrap();
        assert_eq!(in_flight(&bulkhead), 1);
        // A timeout outside the layer, or hyper dropping the connection, drops the future.
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

#[test]
fn poll_ready_never_waits_on_the_bulkhead() {
    let bulkhead = Bulkhead::new(1).unwrap();
    let held = bulkhead.try_acquire(Demand::slot()).unwrap();
    let (inner, _bodies, _) = streaming();
    let mut svc = BulkheadLayer::slots(bulkhead.clone()).layer(inner);
    let mut cx = Context::from_waker(Waker::noop());
    // Full bulkhead: readiness is the inner service's, which is ready.
    assert!(matches!(
        Service::<Request<()>>::poll_ready(&mut svc, &mut cx),
        Poll::Ready(Ok(()))
    ));
    // Readiness took nothing.
    assert_eq!(in_flight(&bulkhead), 1);
    drop(held);
    assert!(matches!(
        Service::<Request<()>>::poll_ready(&mut svc, &mut cx),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(in_flight(&bulkhead), 0);
    // And a refused call answers at once, without a runtime.
    let _full = bulkhead.try_acquire(Demand::slot()).unwrap();
    let mut fut = pin!(svc.call(Request::new(())));
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(resp)) => assert_eq!(resp.status(), 429),
        _ => panic!("a refusal must be ready at once"),
    }
}

#[test]
fn a_usage_chunk_refunds_tokens_before_the_stream_ends() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(10_000)
            .build()
            .unwrap();
        let (inner, mut bodies, _) = streaming();
        let layer = BulkheadLayer::builder(bulkhead.clone())
            .usage_from_frames(openai_usage)
            .build();
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(TokenEstimate(Reservation::new(1_000, 4_000).unwrap()));
        let resp = layer.layer(inner).oneshot(req).await.unwrap();
        let sender = bodies.recv().await.unwrap();
        let tokens = || bulkhead.stats().token_budget.unwrap().in_flight_tokens;
        assert_eq!(tokens(), 5_000);
        let mut body = resp.into_body();
        sender
            .send(Ok(Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
            )))
            .unwrap();
        body.frame().await.unwrap().unwrap();
        assert_eq!(tokens(), 5_000);
        sender
            .send(Ok(Bytes::from_static(
                b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":120}}\n\n",
            )))
            .unwrap();
        body.frame().await.unwrap().unwrap();
        // Refunded at the usage chunk; the slot stays held until the end.
        assert_eq!(tokens(), 0);
        assert_eq!(in_flight(&bulkhead), 1);
        sender
            .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            .unwrap();
        body.frame().await.unwrap().unwrap();
        drop(sender);
        assert!(body.frame().await.is_none());
        let s = bulkhead.stats();
        assert_eq!((s.in_flight, s.released), (0, 1));
        assert_eq!(s.token_budget.unwrap().total_consumed, 1_020);
    });
}

#[test]
fn a_classifier_refusal_is_a_400_that_reaches_nothing() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(4)
            .class("premium", ClassLimits::default())
            .class(
                "standard",
                ClassLimits {
                    max_concurrent: Some(1),
                    ..Default::default()
                },
            )
            .default_class("standard")
            .build()
            .unwrap();
        let (inner, mut bodies, seen) = streaming();
        let classify = HeaderClassifier::new(&bulkhead)
            .class_header("x-traffic-class")
            .priority_header("x-priority");
        let svc = BulkheadLayer::new(bulkhead.clone(), classify).layer(inner);
        let req = |class: &str| {
            Request::get("/")
                .header("x-traffic-class", class)
                .body(())
                .unwrap()
        };
        let bad = svc.clone().oneshot(req("tenant-42")).await.unwrap();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        let json = json_of(bad).await;
        assert_eq!(json["error"]["type"], "invalid_request");
        assert_eq!(json["error"]["reason"], "unknown_admission_class");
        assert!(!json.to_string().contains("tenant-42"));
        let bad = svc
            .clone()
            .oneshot(
                Request::get("/")
                    .header("x-priority", "urgent")
                    .body(())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(json_of(bad).await["error"]["reason"], "invalid_priority");
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        // The class ceiling: the second standard request is refused with the class detail.
        let held = svc.clone().oneshot(req("standard")).await.unwrap();
        let _s = bodies.recv().await.unwrap();
        let refused = svc.clone().oneshot(req("standard")).await.unwrap();
        assert_eq!(refused.status(), 429);
        let json = json_of(refused).await;
        let e = &json["error"];
        assert_eq!(e["constraint"], "admission_class");
        assert_eq!(e["class"], "standard");
        assert_eq!(e["capacity"]["class"]["max_concurrent"], 1);
        assert_eq!(e["capacity"]["shared"]["concurrency"]["capacity"], 4);
        assert!(!json.to_string().contains("null"), "{json}");
        // Premium is not affected.
        let premium = svc.oneshot(req("premium")).await.unwrap();
        assert_eq!(premium.status(), 200);
        drop((held, premium));
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

#[test]
fn a_custom_classifier_sees_the_parts() {
    run(async {
        let bulkhead = Bulkhead::new(4).unwrap();
        let classify = |parts: &http::request::Parts| -> Result<Demand, ClassifyError> {
            if parts.uri.path() == "/forbidden" {
                Err(ClassifyError {
                    status: StatusCode::FORBIDDEN,
                    code: "forbidden_route",
                    message: "not through this gateway".into(),
                })
            } else {
                Ok(Demand::slot())
            }
        };
        let (inner, _bodies, seen) = streaming();
        let svc = BulkheadLayer::new(bulkhead, classify).layer(inner);
        let resp = svc
            .oneshot(Request::get("/forbidden").body(()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn a_classifier_built_for_another_bulkhead_is_a_500_that_reaches_nothing() {
    run(async {
        let build = || {
            Bulkhead::builder()
                .max_concurrent(4)
                .class("premium", ClassLimits::default())
                .default_class("premium")
                .build()
                .unwrap()
        };
        let (bulkhead, other) = (build(), build());
        // Resolved on `other`: before issue 13 it silently became `bulkhead`'s class 0.
        let classify = HeaderClassifier::new(&other).class_header("x-traffic-class");
        let (inner, _bodies, seen) = streaming();
        let svc = BulkheadLayer::new(bulkhead.clone(), classify).layer(inner);
        let resp = svc
            .oneshot(
                Request::get("/")
                    .header("x-traffic-class", "premium")
                    .body(())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(json_of(resp).await["error"]["reason"], "unknown_class");
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        assert_eq!(
            (bulkhead.stats().admitted, bulkhead.stats().rejected),
            (0, 0)
        );
    });
}

#[test]
fn every_layer_call_and_clone_shares_one_limit() {
    run(async {
        let bulkhead = Bulkhead::new(3).unwrap();
        let layer = BulkheadLayer::slots(bulkhead.clone());
        let (inner, mut bodies, _) = streaming();
        let mut held = Vec::new();
        let mut refused = 0;
        for i in 0..10 {
            // A new `layer()` on a clone of the layer each time, as per-route stacks do.
            let svc = layer.clone().layer(inner.clone()).clone();
            let resp = svc.oneshot(Request::new(())).await.unwrap();
            if resp.status() == 200 {
                held.push((resp, bodies.recv().await.unwrap()));
            } else {
                refused += 1;
            }
            assert!(in_flight(&bulkhead) <= 3, "request {i}");
        }
        assert_eq!((held.len(), refused), (3, 7));
        drop(held);
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

#[test]
fn queue_mode_waits_in_fifo_order_and_leaves_when_dropped() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(2)
            .build()
            .unwrap();
        let (inner, mut bodies, seen) = streaming();
        let layer = BulkheadLayer::builder(bulkhead.clone())
            .wait_in_queue(None)
            .build();
        let first = layer
            .layer(inner.clone())
            .oneshot(Request::new(()))
            .await
            .unwrap();
        let _s1 = bodies.recv().await.unwrap();
        let queued = tokio::spawn(layer.layer(inner.clone()).oneshot(Request::new(())));
        let abandoned = tokio::spawn(layer.layer(inner.clone()).oneshot(Request::new(())));
        // Both wait: the queue length says so (the bulkhead's own state, no timing).
        while bulkhead.stats().pending < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        assert_eq!(bulkhead.stats().pending, 1);
        drop(first);
        let second = queued.await.unwrap().unwrap();
        assert_eq!(second.status(), 200);
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        drop(second);
        let s = bulkhead.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0));
    });
}

#[test]
fn queue_mode_times_out_with_a_429() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(1)
            .build()
            .unwrap();
        let (inner, mut bodies, seen) = streaming();
        let layer = BulkheadLayer::builder(bulkhead.clone())
            .wait_in_queue(Some(std::time::Duration::ZERO))
            .build();
        let _first = layer
            .layer(inner.clone())
            .oneshot(Request::new(()))
            .await
            .unwrap();
        let _s1 = bodies.recv().await.unwrap();
        let resp = layer.layer(inner).oneshot(Request::new(())).await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(json_of(resp).await["error"]["reason"], "timeout");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    });
}

/// tokio-rs/axum#2582: a route-level layer. With tower's ConcurrencyLimitLayer every request
/// gets its own semaphore; with ours, 50 concurrent requests over real HTTP see one limit of 5.
#[test]
fn a_route_level_layer_limits_50_concurrent_http_requests_to_5() {
    use axum::routing::get;
    run(async {
        let bulkhead = Bulkhead::new(5).unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let (entered_tx, mut entered) = mpsc::unbounded_channel::<()>();
        let handler = {
            let (inside, most, gate) = (inside.clone(), most.clone(), gate.clone());
            move || {
                let (inside, most, gate, entered_tx) = (
                    inside.clone(),
                    most.clone(),
                    gate.clone(),
                    entered_tx.clone(),
                );
                async move {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let released = gate.notified();
                    entered_tx.send(()).unwrap();
                    released.await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }
        };
        let router = axum::Router::new().route(
            "/slow",
            get(handler).layer(BulkheadLayer::slots(bulkhead.clone())),
        );
        let server = support::Server::start(router).await;
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, mut done) = mpsc::unbounded_channel::<()>();
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (addr, statuses, done_tx) = (server.addr, statuses.clone(), done_tx.clone());
            tasks.push(tokio::spawn(async move {
                let c = support::call(addr, support::get("/slow")).await;
                let status = c.response.status();
                let body = support::text(c.response).await;
                statuses.lock().unwrap().push((status, body));
                done_tx.send(()).unwrap();
            }));
        }
        // Five get in; the 45 others are answered 429 while the five are still inside.
        for _ in 0..5 {
            entered.recv().await.unwrap();
        }
        for _ in 0..45 {
            done.recv().await.unwrap();
        }
        {
            let s = statuses.lock().unwrap();
            assert_eq!(s.len(), 45);
            assert!(s
                .iter()
                .all(|(st, body)| *st == 429 && body.contains("\"reason\":\"concurrency_limit\"")));
        }
        assert_eq!(in_flight(&bulkhead), 5);
        gate.notify_waiters();
        for t in tasks {
            t.await.unwrap();
        }
        let s = statuses.lock().unwrap();
        assert_eq!(s.iter().filter(|(st, _)| *st == 200).count(), 5);
        assert_eq!(most.load(Ordering::SeqCst), 5);
        drop(server);
        // The last release happens when hyper finishes writing each body.
        assert_eq!(bulkhead.stats().released, 5);
        assert_eq!(in_flight(&bulkhead), 0);
        let _ = Full::new(Bytes::new());
    });
}

/// Idle keep-alive connections hold nothing: readiness takes no slot, so with a limit of 1 a
/// request on a third connection is admitted while two earlier connections stay open and idle.
#[test]
fn idle_keep_alive_connections_hold_no_slot() {
    use axum::routing::get;
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;
    run(async {
        let bulkhead = Bulkhead::new(1).unwrap();
        let router = axum::Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(BulkheadLayer::slots(bulkhead.clone()));
        let server = support::Server::start(router).await;
        let mut idle = Vec::new();
        for _ in 0..2 {
            let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            let conn = tokio::spawn(conn);
            let resp = sender.send_request(support::get("/")).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
            // The connection stays open (keep-alive) and ready for its next request.
            sender.ready().await.unwrap();
            idle.push((sender, conn));
        }
        assert_eq!(in_flight(&bulkhead), 0);
        let c = support::call(server.addr, support::get("/")).await;
        assert_eq!(c.response.status(), 200);
        assert_eq!(support::text(c.response).await, "ok");
        // And the idle connections still work, one after the other, within the limit of 1.
        for (sender, _) in &mut idle {
            let resp = sender.send_request(support::get("/")).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
        assert_eq!(bulkhead.stats().admitted, 5);
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

/// Observe mode: refusals for a shadow reason go through without an admission, counted as
/// bypasses (as `LlmBulkhead::run` counts them); a closed bulkhead still refuses.
#[cfg(feature = "llm")]
#[test]
fn observe_mode_lets_refused_requests_through_and_counts_them() {
    use llm_bulkhead::llm::{LlmStats, ShadowReasons};
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(10_000)
            .build()
            .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        let _sub =
            bulkhead.subscribe(move |e: &llm_bulkhead::Event| log.lock().unwrap().push(e.name()));
        let (inner, mut bodies, seen) = streaming();
        let layer = BulkheadLayer::builder(bulkhead.clone())
            .observe(ShadowReasons::ALL)
            .usage_from_frames(openai_usage)
            .build();
        let admitted = layer
            .layer(inner.clone())
            .oneshot(Request::new(()))
            .await
            .unwrap();
        let _s1 = bodies.recv().await.unwrap();
        // Full: this one would be refused; in observe mode it reaches the inner service.
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(TokenEstimate(Reservation::new(100, 100).unwrap()));
        let bypassed = layer.layer(inner.clone()).oneshot(req).await.unwrap();
        assert_eq!(bypassed.status(), 200);
        let s2 = bodies.recv().await.unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let st = bulkhead.stats();
        assert_eq!((st.in_flight, st.admitted, st.rejected), (1, 1, 0));
        assert_eq!(
            st.token_budget.unwrap().in_flight_tokens,
            0,
            "a bypass holds nothing"
        );
        let o = LlmStats::of(&bulkhead).observe.unwrap();
        assert_eq!((o.bypassed, o.in_flight), (1, 1));
        // Usage on a bypassed stream is counted for it; the end settles it.
        s2.send(Ok(Bytes::from_static(
            b"data: {\"usage\":{\"prompt_tokens\":70,\"completion_tokens\":30}}\n\n",
        )))
        .unwrap();
        drop(s2);
        let mut body = bypassed.into_body();
        body.frame().await.unwrap().unwrap();
        assert!(body.frame().await.is_none());
        let o = LlmStats::of(&bulkhead).observe.unwrap();
        assert_eq!(
            (o.in_flight, o.total_input_tokens, o.total_output_tokens),
            (0, 70, 30)
        );
        drop(admitted);
        // Closed: never bypassed.
        bulkhead.close();
        let closed = layer.layer(inner).oneshot(Request::new(())).await.unwrap();
        assert_eq!(closed.status(), 503);
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let names = events.lock().unwrap().clone();
        assert!(
            names.contains(&"bypass") && names.contains(&"bypass_release"),
            "{names:?}"
        );
    });
}

/// A reservation above what the current limits could ever admit is a 413 naming the limit
/// (clients do not retry it), not a 429; a reservation that fits an idle bulkhead is still a
/// 429 when the budget is busy. The core's reason stays `budget_limit`.
#[test]
fn a_reservation_that_can_never_fit_is_a_413_naming_the_limit() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(8)
            .token_budget(60_000)
            .high_priority_reserve(4_000)
            .class(
                "interactive",
                ClassLimits {
                    protected_tokens: 20_000,
                    ..Default::default()
                },
            )
            .class(
                "batch",
                ClassLimits {
                    max_tokens: Some(20_000),
                    ..Default::default()
                },
            )
            .default_class("interactive")
            .build()
            .unwrap();
        let (inner, mut bodies, seen) = streaming();
        let classify = HeaderClassifier::new(&bulkhead).class_header("x-traffic-class");
        let svc = BulkheadLayer::new(bulkhead.clone(), classify).layer(inner);
        let req = |class: &str, tokens: u64| {
            let mut r = Request::get("/")
                .header("x-traffic-class", class)
                .body(())
                .unwrap();
            r.extensions_mut()
                .insert(TokenEstimate(Reservation::new(tokens, 0).unwrap()));
            r
        };
        // Above the effective budget (60,000 - 4,000 for normal priority), any class.
        for (class, tokens, limit, most) in [
            ("interactive", 100_000, "effective_budget", 56_000),
            ("interactive", 56_001, "effective_budget", 56_000),
            ("interactive", u64::MAX / 4, "effective_budget", 56_000),
            ("batch", 20_001, "class_max_tokens", 20_000),
            // batch's reach: no floor, and 56,000 - 20,000 (interactive's floor) shared.
            ("batch", 36_001, "class_max_tokens", 20_000),
        ] {
            let resp = svc.clone().oneshot(req(class, tokens)).await.unwrap();
            assert_eq!(
                resp.status(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "{class} {tokens}"
            );
            let json = json_of(resp).await;
            let e = &json["error"];
            assert_eq!(e["reason"], "budget_limit");
            assert_eq!(e["code"], "request_too_large");
            assert_eq!(e["limit"]["name"], limit, "{json}");
            assert_eq!(e["limit"]["most"], most);
            assert_eq!(e["limit"]["requested"], tokens);
            assert!(
                e["message"].as_str().unwrap().contains("never fit"),
                "{json}"
            );
        }
        // Fits an idle bulkhead: a 429 while the budget is busy.
        let held = svc.clone().oneshot(req("batch", 20_000)).await.unwrap();
        let _stream = bodies.recv().await.unwrap();
        let busy = svc.clone().oneshot(req("batch", 1)).await.unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        let json = json_of(busy).await;
        assert_eq!(json["error"]["code"], "budget_limit");
        assert!(json["error"].get("limit").is_none(), "{json}");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        drop(held);
        assert_eq!(in_flight(&bulkhead), 0);
    });
}

/// A class or priority header given twice is a 400 `duplicate_header`, whichever value comes
/// first: never "first wins".
#[test]
fn a_duplicated_class_or_priority_header_is_a_400() {
    run(async {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(4)
            .class("premium", ClassLimits::default())
            .class("standard", ClassLimits::default())
            .default_class("standard")
            .build()
            .unwrap();
        let (inner, _bodies, seen) = streaming();
        let classify = HeaderClassifier::new(&bulkhead)
            .class_header("x-traffic-class")
            .priority_header("x-priority");
        let svc = BulkheadLayer::new(bulkhead.clone(), classify).layer(inner);
        for (h, a, b) in [
            ("x-traffic-class", "premium", "standard"),
            ("x-traffic-class", "standard", "standard"),
            ("x-priority", "high", "normal"),
        ] {
            let req = Request::get("/")
                .header(h, a)
                .header(h, b)
                .body(())
                .unwrap();
            let resp = svc.clone().oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{h}");
            let json = json_of(resp).await;
            assert_eq!(json["error"]["code"], "duplicate_header");
            assert_eq!(json["error"]["type"], "invalid_request");
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0);
        // A class header spelled with white space still names its class.
        let req = Request::get("/")
            .header("x-traffic-class", " premium")
            .body(())
            .unwrap();
        let resp = svc.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
    });
}

/// With metrics on, every refusal the layer answers is counted by status and code: the
/// classifier's 400s, a 413 for a reservation that can never fit, and the 429s.
#[cfg(feature = "metrics")]
#[test]
fn refusals_are_counted_by_status_and_code() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let bulkhead = Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(100)
            .build()
            .unwrap();
        let svc = BulkheadLayer::builder(bulkhead.clone())
            .classifier(HeaderClassifier::new(&bulkhead).priority_header("x-priority"))
            .record_metrics_named("gw")
            .build()
            .layer(service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }));
        let call = |tokens: u64, priority: &str| {
            let mut r = Request::get("/")
                .header("x-priority", priority)
                .body(())
                .unwrap();
            r.extensions_mut()
                .insert(TokenEstimate(Reservation::new(tokens, 0).unwrap()));
            futures_lite::future::block_on(svc.clone().oneshot(r))
                .unwrap()
                .status()
        };
        assert_eq!(call(10, "urgent"), 400);
        assert_eq!(call(10, "urgent"), 400);
        assert_eq!(call(500, "normal"), 413);
        let held = bulkhead.try_acquire(Demand::slot()).unwrap();
        assert_eq!(call(10, "normal"), 429);
        drop(held);
        assert_eq!(call(10, "normal"), 200);
    });
    // One snapshot: taking one resets the counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let count =
        |status: &str, code: &str| support::http_refusals(&snapshot, status, code, Some("gw"));
    assert_eq!(count("400", "invalid_priority"), Some(2));
    assert_eq!(count("413", "request_too_large"), Some(1));
    assert_eq!(count("429", "concurrency_limit"), Some(1));
    assert_eq!(count("429", "budget_limit"), Some(0));
}
