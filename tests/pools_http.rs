//! The seed's test on loopback HTTP: two fake providers behind the pools gateway
//! (`examples/pools_gateway`), the primary made slow (its gate closed: every request waits at
//! the provider) while normal traffic goes to both. The healthy provider keeps admitting; the
//! slow provider's interactive partition overflows to the secondary within the secondary's own
//! budget; its batch partition queues, then refuses with `pending_limit_reached`; a cancelled
//! waiter gives everything back; at rest every count is zero. Nothing sleeps: the test waits on
//! the providers' arrivals, on responses and on the pools' counts.

#[path = "../examples/pools_gateway/app.rs"]
mod app;
mod support;
#[path = "../examples/pools_gateway/upstream.rs"]
mod upstream;

use llm_bulkhead::pools::{PartitionStats, Pools, PoolsConfig};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use support::{call, post_json, run, text, until, Server};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const CHAT: &str = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;

fn headers<'a>(provider: &'a str, class: &'a str) -> [(&'a str, &'a str); 2] {
    [("x-provider", provider), ("x-traffic-class", class)]
}

fn part(pools: &Pools, name: &str) -> PartitionStats {
    let s = pools.stats();
    s.partitions.into_iter().find(|p| p.name == name).unwrap()
}

/// One request: status, `x-pool-route`, body.
async fn chat(gw: std::net::SocketAddr, provider: &str, class: &str) -> (u16, String, String) {
    let req = post_json("/v1/chat/completions", CHAT, &headers(provider, class));
    let resp = call(gw, req).await.response;
    let route = resp
        .headers()
        .get("x-pool-route")
        .map_or(String::new(), |v| v.to_str().unwrap().to_owned());
    (resp.status().as_u16(), route, text(resp).await)
}

#[test]
fn a_slow_provider_fills_its_own_partitions_while_the_other_keeps_serving() {
    run(async {
        let pools = Arc::new(Pools::new(&PoolsConfig::from_toml(app::CONFIG).unwrap()).unwrap());
        let (primary, mut primary_in) = upstream::Upstream::new("primary", true);
        let (secondary, mut secondary_in) = upstream::Upstream::new("secondary", true);
        let p_srv = Server::start(upstream::router(primary.clone())).await;
        let s_srv = Server::start(upstream::router(secondary.clone())).await;
        let upstreams = HashMap::from([
            ("primary".to_owned(), p_srv.addr),
            ("secondary".to_owned(), s_srv.addr),
        ]);
        let gateway = Server::start(app::router(pools.clone(), upstreams)).await;
        let gw = gateway.addr;

        // The healthy baseline: one request to each provider.
        let t = Instant::now();
        let (status, route, body) = chat(gw, "secondary", "interactive").await;
        let before = t.elapsed();
        assert_eq!(status, 200, "{body}");
        assert_eq!(route, "secondary-interactive:dispatch:capacity_available");
        assert!(body.contains("\"provider\":\"secondary\""), "{body}");
        assert_eq!(chat(gw, "primary", "interactive").await.0, 200);
        let _ = (primary_in.recv().await, secondary_in.recv().await);

        // The primary turns slow: its two interactive units are taken by requests it holds.
        primary.set_open(false);
        let held: Vec<_> = (0..2)
            .map(|_| tokio::spawn(chat(gw, "primary", "interactive")))
            .collect();
        for _ in 0..2 {
            primary_in.recv().await.unwrap();
        }
        assert_eq!(part(&pools, "primary-interactive").active, 2);

        // The healthy provider keeps admitting.
        let t = Instant::now();
        for _ in 0..3 {
            let (status, route, _) = chat(gw, "secondary", "interactive").await;
            assert_eq!(
                (status, route.as_str()),
                (200, "secondary-interactive:dispatch:capacity_available")
            );
            secondary_in.recv().await.unwrap();
        }
        let during = t.elapsed() / 3;
        println!("secondary latency: {before:?} before the primary slowed, {during:?} per request while it was slow");

        // The primary's interactive overflow falls back to the secondary's own partition.
        let (status, route, body) = chat(gw, "primary", "interactive").await;
        secondary_in.recv().await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            route,
            "primary-interactive:fallback:active_limit_reached,\
             secondary-interactive:dispatch:capacity_available"
        );
        assert!(body.contains("\"provider\":\"secondary\""), "{body}");

        // Fallback traffic stays within the secondary's budget: with the secondary holding
        // two, a third is refused there too, with every decision listed.
        secondary.set_open(false);
        let fallen: Vec<_> = (0..2)
            .map(|_| tokio::spawn(chat(gw, "primary", "interactive")))
            .collect();
        for _ in 0..2 {
            secondary_in.recv().await.unwrap();
        }
        let (status, route, body) = chat(gw, "primary", "interactive").await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(
            route,
            "primary-interactive:fallback:active_limit_reached,\
             secondary-interactive:reject:active_limit_reached"
        );
        assert!(
            body.contains("\"reason\":\"no_eligible_fallback\""),
            "{body}"
        );
        secondary.set_open(true);
        for f in fallen {
            assert_eq!(f.await.unwrap().0, 200);
        }

        // The primary's batch partition: one unit (taken and held), then its queue of two.
        let first = tokio::spawn(chat(gw, "primary", "batch"));
        primary_in.recv().await.unwrap();
        let queued = tokio::spawn(chat(gw, "primary", "batch"));
        until(|| part(&pools, "primary-batch").pending == 1).await;
        let mut leaving = raw_batch_request(gw).await;
        until(|| part(&pools, "primary-batch").pending == 2).await;
        let (status, _, body) = chat(gw, "primary", "batch").await;
        assert_eq!(status, 429, "{body}");
        assert!(
            body.contains("\"reason\":\"pending_limit_reached\""),
            "{body}"
        );
        let p = part(&pools, "primary-batch");
        assert!(p.oldest_wait.is_some());
        // The other provider's batch partition is untouched by the primary's queue.
        assert_eq!(chat(gw, "secondary", "batch").await.0, 200);
        secondary_in.recv().await.unwrap();

        // A waiter whose client goes away leaves the queue and holds nothing.
        leaving.shutdown().await.unwrap();
        drop(leaving);
        until(|| part(&pools, "primary-batch").pending == 1).await;

        // The primary recovers: everything it held ends, and the release starts the waiter.
        primary.set_open(true);
        for h in held {
            assert_eq!(h.await.unwrap().0, 200);
        }
        assert_eq!(first.await.unwrap().0, 200);
        let (status, route, body) = queued.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            route,
            "primary-batch:queue:active_limit_reached,primary-batch:dispatch:capacity_available"
        );

        // At rest: every count is zero.
        until(|| {
            let s = pools.stats();
            s.global.held == 0 && s.partitions.iter().all(|p| p.active == 0 && p.pending == 0)
        })
        .await;
        let p = part(&pools, "primary-batch");
        assert_eq!((p.queued, p.queue_refusals, p.timed_out), (2, 1, 0));
        let metrics = text(call(gw, support::get("/metrics")).await.response).await;
        assert!(metrics.contains(
            "llm_bulkhead_pool_queue_refusals_total{partition=\"primary-batch\",provider=\"primary\"} 1"
        ));
    });
}

/// A batch request to the primary on a raw connection the test can close (a client that goes
/// away while its request waits).
async fn raw_batch_request(gw: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(gw).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n\
         content-type: application/json\r\nx-provider: primary\r\nx-traffic-class: batch\r\n\
         content-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}
