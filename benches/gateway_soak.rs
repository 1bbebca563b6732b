//! A bounded soak of the gateway example on loopback: the gateway (`examples/gateway`, served
//! by its own server with its timeouts) in front of its fake provider with real latencies
//! (20-200 ms), hammered by keep-alive HTTP/1 clients for a fixed time with a mix of JSON
//! calls, streams read to the end, streams dropped mid-way, requests that can never fit, and
//! limit changes through the admin endpoint. Then a shutdown as SIGTERM would do it.
//!
//! ```text
//! cargo bench --bench gateway_soak --features tower,metrics,tracing [-- --seconds 20 --connections 128]
//! ```
//!
//! It prints what an operator would check, and fails (exit 1) if any of it is wrong: no 5xx
//! and no connection error; the gateway's `/stats` equal to the clients' own counts (200s
//! admitted, 429s and 413s refused); nothing in flight at the end; the shutdown drained. The
//! resident memory and open descriptors of the process (clients and gateway together) are
//! sampled every second after a 2 s warm-up. Bounded: `--seconds` (at most 120) plus the
//! shutdown's drain deadline.
#![allow(missing_docs, dead_code)]

#[path = "../examples/gateway/app.rs"]
mod app;
#[path = "support/args.rs"]
mod args;
#[path = "../examples/gateway/provider.rs"]
mod provider;
#[path = "../examples/gateway/serve.rs"]
mod serve;

use args::arg;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use llm_bulkhead::config::BulkheadConfig;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Opts {
    seconds: u64,
    connections: usize,
}

fn opts() -> Opts {
    Opts {
        seconds: arg("--seconds").unwrap_or(20).clamp(3, 120),
        connections: arg("--connections").unwrap_or(128).clamp(1, 512),
    }
}

/// The clients' own counts.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    dropped_streams: AtomicU64,
    too_many: AtomicU64,
    never_fits: AtomicU64,
    server_errors: AtomicU64,
    other: AtomicU64,
    connection_errors: AtomicU64,
}

const NEVER_FITS: &str =
    r#"{"model":"gpt-4o","max_tokens":1000000,"messages":[{"role":"user","content":"hi"}]}"#;

fn body(stream: bool) -> String {
    format!(
        r#"{{"model":"gpt-4o","stream":{stream},"max_tokens":128,"messages":[{{"role":"user","content":"Say hello to the soak."}}]}}"#
    )
}

fn request(path: &str, body: String, class: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("x-traffic-class", class)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Option<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(sender)
}

/// One client: requests one after another on a keep-alive connection until `until`; a new
/// connection after each dropped stream (dropping the body mid-way closes the connection).
async fn client(addr: SocketAddr, id: usize, until: Instant, tally: Arc<Tally>) {
    let mut sender = None;
    let mut i = id;
    while Instant::now() < until {
        i += 1;
        if sender.is_none() {
            sender = connect(addr).await;
            if sender.is_none() {
                tally.connection_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        let s: &mut Sender = sender.as_mut().unwrap();
        if s.ready().await.is_err() {
            sender = None;
            continue;
        }
        let class = if i % 3 == 0 { "batch" } else { "interactive" };
        let (req, drop_mid_way) = match i % 20 {
            0 => (
                request("/v1/chat/completions", NEVER_FITS.into(), class),
                false,
            ),
            1..=3 => (request("/v1/chat/completions", body(true), class), false),
            4 | 5 => (request("/v1/chat/completions", body(true), class), true),
            _ => (request("/v1/chat/completions", body(false), class), false),
        };
        let resp = match s.send_request(req).await {
            Ok(r) => r,
            Err(_) => {
                tally.connection_errors.fetch_add(1, Ordering::Relaxed);
                sender = None;
                continue;
            }
        };
        let status = resp.status().as_u16();
        let counter = match status {
            200 if drop_mid_way => &tally.dropped_streams,
            200 => &tally.ok,
            429 => &tally.too_many,
            413 => &tally.never_fits,
            500..=599 => &tally.server_errors,
            _ => &tally.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut body = resp.into_body();
        if status == 200 && drop_mid_way {
            let _ = body.frame().await;
            drop(body);
            sender = None;
            continue;
        }
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                tally.connection_errors.fetch_add(1, Ordering::Relaxed);
                sender = None;
                break;
            }
        }
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

async fn admin(addr: SocketAddr, json: String) -> u16 {
    let Some(mut s) = connect(addr).await else {
        return 0;
    };
    let req = http::Request::post("/admin/limits")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)))
        .unwrap();
    match s.send_request(req).await {
        Ok(r) => {
            let status = r.status().as_u16();
            let _ = r.into_body().collect().await;
            status
        }
        Err(_) => 0,
    }
}

/// The default configuration's limits at `revision` with `max_concurrent`.
fn limits(revision: u64, max_concurrent: u32) -> String {
    format!(
        r#"{{"revision":{revision},"max_concurrent":{max_concurrent},"max_queue":0,
        "token_budget":{{"budget":60000,"high_priority_reserve":4000}},
        "admission_classes":{{"interactive":{{"protected_concurrent":4,"protected_tokens":20000}},
        "batch":{{"max_concurrent":2,"max_tokens":20000}}}}}}"#
    )
}

fn main() {
    let o = opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let ok = rt.block_on(soak(o));
    std::process::exit(if ok { 0 } else { 1 });
}

async fn soak(o: Opts) -> bool {
    let control = provider::ProviderControl::new(7, true);
    let provider_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = provider_listener.local_addr().unwrap();
    let provider_router = provider::router(control.clone());
    tokio::spawn(async move { axum::serve(provider_listener, provider_router).await });
    let config = BulkheadConfig::from_json(app::DEFAULT_CONFIG).unwrap();
    let (router, gw) =
        app::gateway_with(&config, upstream, "soak", app::BODY_READ_TIMEOUT).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve::serve(
        listener,
        router,
        gw.bulkhead.clone(),
        serve::Timeouts::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let started = Instant::now();
    let until = started + Duration::from_secs(o.seconds);
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..o.connections)
        .map(|id| tokio::spawn(client(addr, id, until, tally.clone())))
        .collect();
    // Limit changes under load (max_concurrent 8 -> 6 -> 8 ...) and memory samples.
    let mut revision = 0;
    let mut samples = Vec::new();
    let mut changes = 0;
    let mut fd_samples = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if started.elapsed() >= Duration::from_secs(2) {
            samples.push(rss_kib());
            fd_samples.push(fds());
        }
        if started.elapsed().as_secs() % 3 == 0 {
            revision += 1;
            let max = if revision % 2 == 1 { 6 } else { 8 };
            if admin(addr, limits(revision, max)).await == 200 {
                changes += 1;
            }
        }
    }
    for c in clients {
        let _ = c.await;
    }
    let elapsed = started.elapsed();
    let stats = gw.bulkhead.stats();
    let _ = stop.send(());
    let stopped = server.await.unwrap();
    let t = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let (ok, dropped, too_many, never, errors5, other, conn_errors) = (
        t(&tally.ok),
        t(&tally.dropped_streams),
        t(&tally.too_many),
        t(&tally.never_fits),
        t(&tally.server_errors),
        t(&tally.other),
        t(&tally.connection_errors),
    );
    let total = ok + dropped + too_many + never + errors5 + other;
    let (rss_first, rss_max, rss_last) = (
        samples.first().copied().unwrap_or(0),
        samples.iter().copied().max().unwrap_or(0),
        samples.last().copied().unwrap_or(0),
    );
    println!(
        "gateway soak: {:.1} s, {} connections, {} responses ({:.0}/s), {} limit changes",
        elapsed.as_secs_f64(),
        o.connections,
        total,
        total as f64 / elapsed.as_secs_f64(),
        changes
    );
    println!(
        "  client counts: 200 {ok} (+{dropped} streams dropped mid-way), 429 {too_many}, 413 {never}, 5xx {errors5}, other {other}, connection errors {conn_errors}"
    );
    println!(
        "  /stats: admitted {}, rejected {}, in flight {} (tokens {}), refunded {}",
        stats.admitted,
        stats.rejected,
        stats.in_flight,
        stats.token_budget.map_or(0, |b| b.in_flight_tokens),
        stats.token_budget.map_or(0, |b| b.total_refunded),
    );
    println!(
        "  RSS (clients and gateway, one process): {} MiB after warm-up, max {} MiB, last sample {} MiB; open fds: at most {} under load, {} after the shutdown",
        rss_first / 1024,
        rss_max / 1024,
        rss_last / 1024,
        fd_samples.iter().copied().max().unwrap_or(0),
        fds(),
    );
    println!(
        "  shutdown: drained {}, connections cut {}, in flight {}",
        stopped.drained, stopped.cut, stopped.in_flight
    );
    let mut fine = true;
    let mut check = |ok: bool, what: &str| {
        if !ok {
            println!("  FAILED: {what}");
            fine = false;
        }
    };
    check(
        errors5 == 0 && other == 0,
        "no 5xx and no unexpected status",
    );
    check(conn_errors == 0, "no connection error");
    check(
        stats.admitted == ok + dropped,
        "/stats admitted == the clients' 200s",
    );
    check(
        stats.rejected == too_many + never,
        "/stats rejected == the clients' 429s and 413s",
    );
    check(stats.in_flight == 0, "nothing in flight after the run");
    check(
        stopped.drained && stopped.in_flight == 0,
        "the shutdown drained",
    );
    check(changes > 0, "limit changes applied");
    if fine {
        println!("  all checks passed");
    }
    fine
}
