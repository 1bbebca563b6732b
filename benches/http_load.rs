//! A bounded HTTP load run on loopback: requests per second and p50/p99 latency of one axum
//! server answering `GET /hello` through our layer, through tower's `ConcurrencyLimit`, and
//! with no limit, side by side in one run (interleaved rounds, so drift on a shared machine
//! hits every variant alike).
//!
//! ```text
//! cargo bench --bench http_load --features tower [-- --connections 16 --requests 2000 --rounds 3]
//! ```
//!
//! Each variant runs on its own server (127.0.0.1, ephemeral port) with the limit wrapped around
//! the whole router (so tower's limit is not defeated by per-route clones, axum#2582), and a
//! limit (1024) that the run never reaches: the numbers are the cost of the limit itself.
//! `connections` keep-alive HTTP/1 clients send `requests` requests each, one after another,
//! per round. Bounded: at most `rounds × variants × connections × requests` requests, and a
//! round stops early after 20 s.
#![allow(missing_docs)]

#[path = "support/args.rs"]
mod args;

use args::arg;
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use llm_bulkhead::tower::BulkheadLayer;
use llm_bulkhead::Bulkhead;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use tower_layer::Layer;

struct Opts {
    connections: usize,
    requests: usize,
    rounds: usize,
}

fn opts() -> Opts {
    Opts {
        connections: arg("--connections").unwrap_or(16).clamp(1, 256),
        requests: arg("--requests").unwrap_or(1_000).clamp(1, 100_000),
        rounds: arg("--rounds").unwrap_or(3).clamp(1, 20),
    }
}

fn app() -> Router {
    Router::new().route("/hello", get(|| async { "hello" }))
}

async fn serve<S>(service: S) -> SocketAddr
where
    S: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, tower::make::Shared::new(service))
            .await
            .unwrap();
    });
    addr
}

/// One client connection sending `n` requests in a row; the latency of each, in ns.
async fn client(addr: SocketAddr, n: usize, stop: Instant) -> Vec<u64> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        if Instant::now() > stop {
            break;
        }
        let req = http::Request::get("/hello")
            .header("host", "127.0.0.1")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let t = Instant::now();
        sender.ready().await.unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat
}

#[derive(Default)]
struct Tally {
    latencies: Vec<u64>,
    wall: Duration,
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let bulkhead = Bulkhead::new(1_024).unwrap();
        type Req = axum::extract::Request;
        let ours = ServiceExt::<Req>::map_response(
            BulkheadLayer::slots(bulkhead.clone()).layer(app()),
            |r: http::Response<_>| r.map(Body::new),
        );
        let theirs = ServiceExt::<Req>::map_response(
            tower::limit::ConcurrencyLimitLayer::new(1_024).layer(app()),
            |r: http::Response<Body>| r,
        );
        let none = ServiceExt::<Req>::map_response(app(), |r: http::Response<Body>| r);
        let variants = [
            ("no limit", serve(none).await),
            ("tower ConcurrencyLimit", serve(theirs).await),
            ("llm-bulkhead layer", serve(ours).await),
        ];
        let mut tallies: Vec<Tally> = variants.iter().map(|_| Tally::default()).collect();
        // Warm-up: one short pass per variant.
        for (_, addr) in &variants {
            client(*addr, 200, Instant::now() + Duration::from_secs(5)).await;
        }
        for _ in 0..o.rounds {
            for (i, (_, addr)) in variants.iter().enumerate() {
                let stop = Instant::now() + Duration::from_secs(20);
                let t = Instant::now();
                let tasks: Vec<_> = (0..o.connections)
                    .map(|_| tokio::spawn(client(*addr, o.requests, stop)))
                    .collect();
                for task in tasks {
                    tallies[i].latencies.extend(task.await.unwrap());
                }
                tallies[i].wall += t.elapsed();
            }
        }
        assert_eq!(bulkhead.stats().in_flight, 0);
        println!(
            "HTTP/1 on loopback: {} connections x {} requests x {} rounds per variant (2 runtime threads, client and server in one process)",
            o.connections, o.requests, o.rounds
        );
        println!(
            "{:<24} {:>9} {:>11} {:>9} {:>9} {:>10}",
            "variant", "requests", "req/s", "p50 µs", "p99 µs", "vs none"
        );
        let base = tallies[0].latencies.len() as f64 / tallies[0].wall.as_secs_f64();
        for ((name, _), t) in variants.iter().zip(&mut tallies) {
            t.latencies.sort_unstable();
            let q = |p: f64| {
                let i = ((t.latencies.len() as f64 - 1.0) * p).round() as usize;
                t.latencies[i] as f64 / 1_000.0
            };
            let rps = t.latencies.len() as f64 / t.wall.as_secs_f64();
            println!(
                "{:<24} {:>9} {:>11.0} {:>9.1} {:>9.1} {:>+9.1}%",
                name,
                t.latencies.len(),
                rps,
                q(0.50),
                q(0.99),
                (rps / base - 1.0) * 100.0
            );
        }
    });
}
