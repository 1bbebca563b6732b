//! The tower layer without I/O: one request per iteration through `clone` (hyper clones the
//! service per request), `poll_ready`, `call`, the response future and the body polled to its
//! end, all on the caller's thread with a no-op waker. Variants, in one group so one run
//! compares them:
//!
//! * `no_limit`: the inner service alone (a `service_fn` answering a 5-byte `Full` body);
//! * `tower_concurrency_limit`: tower's `ConcurrencyLimit` (a permit taken in `poll_ready`,
//!   released when the response is produced, before the body);
//! * `bulkhead_slots`: our layer with [`SlotPerRequest`] (one slot, held until the body ends);
//! * `no_limit_classified_request` and `bulkhead_classified`: the same request with a class
//!   header and a [`TokenEstimate`] extension, without and with our layer, a
//!   [`HeaderClassifier`] and a bulkhead with a token budget and two classes (classifier +
//!   decision + body wrapper: the target is at most 1 µs over the baseline).

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use llm_bulkhead::tower::{BulkheadLayer, HeaderClassifier, TokenEstimate};
use llm_bulkhead::{Bulkhead, ClassLimits, Reservation};
use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use tower::Service;
use tower_layer::Layer;

type Answer = std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>;

fn inner(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future = Answer>
       + Clone {
    tower::service_fn(|_: Request<()>| {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
    })
}

/// One request, the way hyper drives a service: clone, ready, call, poll, body to the end.
#[inline(always)]
fn drive<S, B>(svc: &S, req: Request<()>)
where
    S: Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: Body,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut s = svc.clone();
    assert!(matches!(s.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let fut = pin!(s.call(req));
    let Poll::Ready(Ok(resp)) = fut.poll(&mut cx) else {
        panic!("the benchmarked services answer at once")
    };
    let mut body = pin!(resp.into_body());
    while let Poll::Ready(Some(frame)) = body.as_mut().poll_frame(&mut cx) {
        black_box(frame.is_ok());
    }
}

fn classified_request() -> Request<()> {
    let mut r = Request::get("/v1/chat/completions")
        .header("x-traffic-class", "interactive")
        .body(())
        .unwrap();
    r.extensions_mut()
        .insert(TokenEstimate(Reservation::new(1_200, 800).unwrap()));
    r
}

fn layer(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer");
    let none = inner();
    g.bench_function("no_limit", |b| b.iter(|| drive(&none, Request::new(()))));
    let tower_limit = tower::limit::ConcurrencyLimitLayer::new(1_024).layer(inner());
    // ConcurrencyLimit's permit is taken with a tokio semaphore; no runtime is needed to poll it.
    g.bench_function("tower_concurrency_limit", |b| {
        b.iter(|| drive(&tower_limit, Request::new(())))
    });
    let slots = BulkheadLayer::slots(Bulkhead::new(1_024).unwrap()).layer(inner());
    g.bench_function("bulkhead_slots", |b| {
        b.iter(|| drive(&slots, Request::new(())))
    });
    g.bench_function("no_limit_classified_request", |b| {
        b.iter(|| drive(&none, classified_request()))
    });
    let bulkhead = Bulkhead::builder()
        .max_concurrent(1_024)
        .token_budget(1 << 29)
        .class(
            "interactive",
            ClassLimits {
                protected_concurrent: 256,
                ..Default::default()
            },
        )
        .class(
            "batch",
            ClassLimits {
                max_concurrent: Some(64),
                ..Default::default()
            },
        )
        .default_class("interactive")
        .build()
        .unwrap();
    let classify = HeaderClassifier::new(&bulkhead)
        .class_header("x-traffic-class")
        .priority_header("x-priority");
    let classified = BulkheadLayer::new(bulkhead.clone(), classify).layer(inner());
    g.bench_function("bulkhead_classified", |b| {
        b.iter(|| drive(&classified, classified_request()))
    });
    g.finish();
    assert_eq!(bulkhead.stats().in_flight, 0);
}

criterion_group!(benches, layer);
criterion_main!(benches);
