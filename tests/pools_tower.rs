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
