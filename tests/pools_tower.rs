//! The tower `PoolsLayer` without a network: the permit is held until the last frame of a
//! streamed body, a fallback tells the inner service the fallback's provider, and a refused
//! request never reaches the inner service.

mod support;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use llm_bulkhead::pools::*;
use llm_bulkhead::tower::{HeaderPoolClassifier, PoolAssignment, PoolsLayer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use support::{BodySender, ChannelBody};
use tower::{Service, ServiceExt};
use tower_layer::Layer;

fn request(provider: &str) -> Request<()> {
    Request::builder()
        .header("x-provider", provider)
        .header("x-traffic-class", "interactive")
        .body(())
        .unwrap()
}

#[test]
fn the_permit_lasts_to_the_last_frame_and_a_fallback_names_its_provider() {
    let mut c = PoolsConfig::single("primary", "interactive", 1);
    c.extend_with("secondary", "interactive", 1);
    c.classes.get_mut("interactive").unwrap().overflow = Overflow::Fallback;
    c.partitions
        .get_mut("primary-interactive")
        .unwrap()
        .fallback = vec!["secondary-interactive".into()];
    let pools = Arc::new(Pools::new(&c).unwrap());
    let senders: Arc<Mutex<Vec<(String, BodySender)>>> = Arc::default();
    let calls = Arc::new(AtomicU64::new(0));
    let (s, n) = (senders.clone(), calls.clone());
    let inner = tower::service_fn(move |req: Request<()>| {
        let to = req.extensions().get::<PoolAssignment>().unwrap().clone();
        let (tx, body) = ChannelBody::new();
        s.lock().unwrap().push((to.provider, tx));
        n.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    let mut svc = PoolsLayer::new(pools.clone(), HeaderPoolClassifier::new()).layer(inner);
    let mut call =
        |req| futures_lite::future::block_on(async { svc.ready().await?.call(req).await });

    let first = call(request("primary")).unwrap();
    let second = call(request("primary")).unwrap();
    assert_eq!(
        second.headers()["x-pool-route"],
        "primary-interactive:fallback:active_limit_reached,\
         secondary-interactive:dispatch:capacity_available"
    );
    let providers: Vec<String> = senders
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.0.clone())
        .collect();
    assert_eq!(providers, ["primary", "secondary"]);
    // Both full: refused without reaching the inner service.
    let third = call(request("primary")).unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The first body streams: the permit stays until its last frame.
    let mut body = first.into_body();
    let tx = senders.lock().unwrap().remove(0).1;
    tx.send(Ok(Bytes::from_static(b"data: 1\n\n"))).unwrap();
    let frame = futures_lite::future::block_on(body.frame())
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "data: 1\n\n");
    assert_eq!(
        pools.stats().partitions[0].active,
        1,
        "held while the body streams"
    );
    drop(tx);
    assert!(futures_lite::future::block_on(body.frame()).is_none());
    assert_eq!(
        pools.stats().partitions[0].active,
        0,
        "released at the body's end"
    );
    // The second's body is dropped unread (a client that went away): released too.
    drop(second);
    let s = pools.stats();
    assert_eq!((s.partitions[1].active, s.global.held), (0, 0));
    assert_eq!(s.partitions[0].admitted, s.partitions[0].completed);
}

#[test]
fn a_degrading_class_serves_the_gateways_result_or_the_default_503() {
    let mut c = PoolsConfig::single("primary", "interactive", 1);
    c.classes.get_mut("interactive").unwrap().overflow = Overflow::Degrade;
    let pools = Arc::new(Pools::new(&c).unwrap());
    let calls = Arc::new(AtomicU64::new(0));
    let senders: Arc<Mutex<Vec<BodySender>>> = Arc::default();
    let (n, tx) = (calls.clone(), senders.clone());
    // A streamed body that stays open: the first request holds the partition's one unit.
    let inner = tower::service_fn(move |_: Request<()>| {
        n.fetch_add(1, Ordering::SeqCst);
        let (sender, body) = ChannelBody::new();
        tx.lock().unwrap().push(sender);
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let layer = PoolsLayer::new(pools.clone(), HeaderPoolClassifier::new());
    let mut plain = layer.clone().layer(inner.clone());
    let mut own = layer
        .degrade_with(
            move |p: &Pools, parts: &http::request::Parts, route: &Route| {
                let last = *route.decisions().last().unwrap();
                s.lock().unwrap().push(format!(
                    "{} {} {}",
                    parts.headers["x-provider"].to_str().unwrap(),
                    p.name(last.partition),
                    last.decision.as_str()
                ));
                Response::builder()
                    .status(200)
                    .header("x-degraded", "1")
                    .body(Bytes::from_static(b"a cached answer"))
                    .unwrap()
            },
        )
        .layer(inner);

    let held = call(&mut plain);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Full: the default is a 503 with the JSON body.
    let r = call(&mut plain);
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.headers()["x-pool-route"],
        "primary-interactive:degrade:active_limit_reached"
    );
    assert!(std::str::from_utf8(&body_of(r))
        .unwrap()
        .contains("\"degraded\""));
    // With the gateway's own result: its status, headers and body, and the route header.
    let r = call(&mut own);
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-degraded"], "1");
    assert_eq!(
        r.headers()["x-pool-route"],
        "primary-interactive:degrade:active_limit_reached"
    );
    assert_eq!(body_of(r), "a cached answer");
    assert_eq!(
        *seen.lock().unwrap(),
        ["primary primary-interactive degrade"]
    );
    // Neither reached the provider, and neither holds capacity.
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    drop((held, senders));
    let s = pools.stats();
    assert_eq!((s.partitions[0].active, s.global.held), (0, 0));
}

/// One request to `primary` through `svc`, answered.
fn call<S, B>(svc: &mut S) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    futures_lite::future::block_on(async { svc.ready().await?.call(request("primary")).await })
        .unwrap()
}

fn body_of<B: http_body::Body>(r: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    futures_lite::future::block_on(r.into_body().collect())
        .unwrap()
        .to_bytes()
}
