//! Three replica processes on loopback share one global budget (6 slots, 600 tokens) through
//! Redis; replica 0 is killed with SIGKILL halfway, and the others take over its share once its
//! quarantine (`ttl + quarantine` after its last renewal) has passed.
//!
//! ```sh
//! cargo run --release --features cluster,tower --example cluster
//! ```
//!
//! It uses the server named by `LLM_BULKHEAD_REDIS_URL`, or starts a private `redis-server`
//! (on a Unix socket in a temporary directory, no persistence) if one is on PATH. Each replica
//! is a small HTTP gateway on loopback, wired as an operator would: the tower layer built over
//! the agent's handle (`BulkheadLayer::clustered`), so that its requests admit through the
//! share's window (a lapsed share answers 503 `share_lapsed`) and a request the share cannot
//! hold yet, while the global budget can, is a retryable 503 `share_too_small` (not a 413),
//! in front of a handler that
//! stands in for the provider call; four clients keep it busy. Each replica prints, every
//! 250 ms, the share its agent installed, its work in flight and its answers so far; the parent
//! prints them side by side.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use llm_bulkhead::cluster::{Amounts, ClusterAgent, ClusterConfig, RedisStore};
use llm_bulkhead::tower::{BulkheadLayer, ClassifyError};
use llm_bulkhead::{Bulkhead, Demand, Reservation};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const GLOBAL: Amounts = Amounts::new(6, 600);
const RUN: Duration = Duration::from_secs(6);

fn config(ns: &str) -> ClusterConfig {
    ClusterConfig::new(ns, "provider")
        .ttl(Duration::from_millis(600))
        .max_admission(Duration::from_millis(300))
        .floor(Amounts::new(1, 50))
        .floor_hold(Duration::from_millis(200))
        .quarantine(Duration::from_millis(600))
}

/// One replica: a bulkhead built with the global limits, its agent, an HTTP gateway whose
/// tower layer admits through the agent's handle, and four busy clients.
fn replica(url: &str, ns: &str) {
    let b = Bulkhead::builder()
        .max_concurrent(GLOBAL.slots as u32)
        .token_budget(GLOBAL.tokens)
        .build()
        .unwrap();
    let store = RedisStore::open(url, &config(ns)).unwrap();
    let agent = ClusterAgent::new(b.clone(), Box::new(store), config(ns))
        .unwrap()
        .spawn()
        .unwrap();
    // The wiring: the layer over the handle, not over the bare bulkhead. Every request
    // reserves 60 + 40 tokens (a real gateway estimates them from the body).
    let layer = BulkheadLayer::clustered(&agent.handle())
        .classifier(|_: &http::request::Parts| {
            Ok::<_, ClassifyError>(Demand::tokens(Reservation::new(60, 40).unwrap()))
        })
        .build();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            axum::routing::post(|| async {
                tokio::time::sleep(Duration::from_millis(5)).await; // the provider call
                "ok"
            }),
        )
        .layer(layer);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Answers: 200; 429, the share is full; 413, the request is above the global budget
    // (never here); 503 `share_too_small`, the installed share cannot hold the request yet
    // (share zero: learning, or the agent degraded to zero), retry; 503 `share_lapsed`.
    let answers: Arc<[AtomicU64; 5]> = Arc::new(Default::default());
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let clients: Vec<_> = (0..4)
            .map(|_| tokio::spawn(client(addr, answers.clone())))
            .collect();
        let start = Instant::now();
        while start.elapsed() < RUN {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let (s, st) = (b.stats(), agent.status());
            let phase = if st.learning {
                "learning".to_string()
            } else {
                format!("{:?}", st.phase)
            };
            let [ok, full, large, small, lapsed] =
                [0, 1, 2, 3, 4].map(|i| answers[i].load(Ordering::Relaxed));
            println!(
                "{} {} {} {phase} {ok} {full} {large} {small} {lapsed}",
                st.installed.slots, s.in_flight, st.installed.tokens
            );
        }
        for c in clients {
            c.abort();
        }
    });
    drop(rt);
    agent.stop().unwrap();
}

/// One keep-alive client posting requests back to back, counting the answers.
async fn client(addr: SocketAddr, answers: Arc<[AtomicU64; 5]>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    loop {
        let request = http::Request::post("/v1/chat/completions")
            .header("host", "127.0.0.1")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let Ok(response) = sender.send_request(request).await else {
            return;
        };
        let status = response.status().as_u16();
        let Ok(body) = response.into_body().collect().await else {
            return;
        };
        let i = match status {
            200 => 0,
            429 => 1,
            413 => 2,
            503 if body.to_bytes().windows(15).any(|w| w == b"share_too_small") => 3,
            503 => 4,
            other => panic!("unexpected status {other}"),
        };
        answers[i].fetch_add(1, Ordering::Relaxed);
        if i != 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--replica" {
        return replica(&args[2], &args[3]);
    }
    let Some(server) = redis_server::Server::get("example") else {
        eprintln!("no Redis: set LLM_BULKHEAD_REDIS_URL or install redis-server");
        std::process::exit(2);
    };
    let ns = redis_server::namespace("example");
    let c = config(&ns);
    println!(
        "global {GLOBAL:?}; ttl {:?}, quarantine {:?}: a dead replica's share is reusable \
         {} ms after its last renewal",
        c.ttl,
        c.quarantine,
        c.store_params(GLOBAL).hold_ms()
    );
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<_> = (0..3)
        .map(|n| {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--replica", &server.url, &ns])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((n, line));
                }
            });
            child
        })
        .collect();
    drop(tx);
    println!("  t(s)  replica 0 share/in flight   replica 1           replica 2");
    let mut last = [[0u64; 5]; 3];
    let start = Instant::now();
    let mut row = [String::from("-"), String::from("-"), String::from("-")];
    let mut killed = false;
    for (n, line) in rx {
        let f: Vec<&str> = line.split_whitespace().collect();
        row[n] = format!("{}/{} {}", f[0], f[1], f[3]);
        for (i, v) in f[4..9].iter().enumerate() {
            last[n][i] = v.parse().unwrap_or(0);
        }
        if n == 2 {
            println!(
                "{:6.2}  {:26}  {:18}  {}",
                start.elapsed().as_secs_f64(),
                row[0],
                row[1],
                row[2]
            );
        }
        if !killed && start.elapsed() > RUN / 2 {
            killed = true;
            let _ = children[0].kill(); // SIGKILL: no goodbye to the store
            let _ = children[0].wait();
            row[0] = "killed".into();
            println!("------  replica 0 killed with SIGKILL; its share stays reserved for the quarantine");
        }
    }
    for c in children.iter_mut().skip(1) {
        let _ = c.wait();
    }
    for (n, [ok, full, large, small, lapsed]) in last.iter().enumerate() {
        println!(
            "replica {n}: HTTP 200 {ok}, 429 {full} (share full), 503 {small} (share too small, \
             retry), 413 {large} (above the global budget), 503 {lapsed} (share lapsed)"
        );
    }
}
