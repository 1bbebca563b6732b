//! The gateway example over real HTTP: the fake provider and the gateway on ephemeral
//! 127.0.0.1 ports, started and stopped by each test. Nothing sleeps: the tests wait on the
//! provider's hold (a watch channel), on bulkhead events and on responses.

#[path = "../examples/gateway/app.rs"]
mod app;
#[path = "../examples/gateway/provider.rs"]
mod provider;
#[path = "../examples/gateway/serve.rs"]
mod serve;
mod support;

use llm_bulkhead::config::BulkheadConfig;
use llm_bulkhead::llm::LlmStats;
use llm_bulkhead::Event;
use provider::ProviderControl;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use support::{call, get, next_chunk, post_json, run, text, Server};
use tokio::sync::mpsc;

struct Stack {
    gateway: Server,
    _provider: Server,
    control: Arc<ProviderControl>,
    gw: Arc<app::Gateway>,
}

async fn stack(name: &str, config: &str) -> Stack {
    let control = ProviderControl::new(42, false);
    let provider = Server::start(provider::router(control.clone())).await;
    let config = BulkheadConfig::from_json(config).unwrap();
    let (router, gw) = app::gateway(&config, provider.addr, name).unwrap();
    let gateway = Server::start(router).await;
    Stack {
        gateway,
        _provider: provider,
        control,
        gw,
    }
}

const PLAIN: &str = r#"{"max_concurrent": 2, "model": "gpt-4o",
    "token_budget": {"budget": 100000, "output_cap": 256}}"#;

fn chat(stream: bool) -> String {
    format!(
        r#"{{"model": "gpt-4o", "stream": {stream}, "max_tokens": 200,
            "messages": [{{"role": "user", "content": "Say hello to the bulkhead."}}]}}"#
    )
}

/// Release events of `gw`'s bulkhead, as they happen.
fn releases(gw: &app::Gateway) -> (mpsc::UnboundedReceiver<()>, llm_bulkhead::Subscription) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sub = gw.bulkhead.subscribe(move |e: &Event| {
        if matches!(e, Event::Release(_)) {
            let _ = tx.send(());
        }
    });
    (rx, sub)
}

#[test]
fn overload_gets_429_with_detail_and_the_provider_never_sees_it() {
    run(async {
        let s = stack("overload", PLAIN).await;
        let addr = s.gateway.addr;
        s.control.set_hold(true);
        let inside: Vec<_> = (0..2)
            .map(|_| {
                tokio::spawn(async move {
                    call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await
                })
            })
            .collect();
        s.control.paused_at_least(2).await;
        for _ in 0..3 {
            let c = call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await;
            assert_eq!(c.response.status(), 429);
            assert_eq!(c.response.headers()["content-type"], "application/json");
            assert!(c.response.headers().get("retry-after").is_none());
            let body: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
            let e = &body["error"];
            assert_eq!(e["reason"], "concurrency_limit");
            assert_eq!(e["capacity"]["in_flight"], 2);
            assert_eq!(e["capacity"]["max_concurrent"], 2);
            assert!(e["capacity"]["tokens"]["requested"].as_u64().unwrap() > 200);
        }
        assert_eq!(s.control.served.load(Ordering::SeqCst), 2);
        s.control.set_hold(false);
        for t in inside {
            let c = t.await.unwrap();
            assert_eq!(c.response.status(), 200);
            let body: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
            assert_eq!(body["object"], "chat.completion");
        }
        let st = s.gw.bulkhead.stats();
        assert_eq!((st.in_flight, st.admitted, st.rejected), (0, 2, 3));
        // The JSON body's usage was reported through the hook: consumption is the real usage.
        let t = st.token_budget.unwrap();
        assert_eq!(t.in_flight_tokens, 0);
        assert!(t.total_consumed > 0);
    });
}

#[test]
fn a_stream_holds_its_slot_until_the_last_chunk() {
    run(async {
        let s = stack("stream", PLAIN).await;
        s.control.set_hold(true);
        let c = call(
            s.gateway.addr,
            post_json("/v1/chat/completions", &chat(true), &[]),
        )
        .await;
        assert_eq!(c.response.status(), 200);
        assert_eq!(c.response.headers()["content-type"], "text/event-stream");
        let mut body = c.response.into_body();
        let first = next_chunk(&mut body).await.unwrap();
        assert!(first.starts_with(b"data: {"));
        s.control.paused_at_least(1).await;
        // Headers sent, chunks streamed, the provider still generating: the slot and the
        // reservation are held.
        let st = s.gw.bulkhead.stats();
        assert_eq!(st.in_flight, 1);
        assert!(st.token_budget.unwrap().in_flight_tokens > 0);
        s.control.set_hold(false);
        let mut rest = Vec::new();
        while let Some(chunk) = next_chunk(&mut body).await {
            rest.push(String::from_utf8(chunk.to_vec()).unwrap());
        }
        let all = rest.concat();
        assert!(all.ends_with("data: [DONE]\n\n"), "{all}");
        let usage_line = all
            .lines()
            .find(|l| l.contains("\"usage\""))
            .expect("a final usage chunk");
        let usage: serde_json::Value =
            serde_json::from_str(usage_line.strip_prefix("data: ").unwrap()).unwrap();
        let total = usage["usage"]["total_tokens"].as_u64().unwrap();
        // The body ended on the server before the client saw its end: released.
        let st = s.gw.bulkhead.stats();
        assert_eq!((st.in_flight, st.released), (0, 1));
        let t = st.token_budget.unwrap();
        assert_eq!(t.in_flight_tokens, 0);
        assert_eq!(t.total_consumed, total, "the usage chunk was reported");
    });
}

#[test]
fn a_client_that_disconnects_mid_stream_releases_its_slot_and_tokens() {
    run(async {
        let s = stack("disconnect", PLAIN).await;
        let (mut released, _sub) = releases(&s.gw);
        s.control.set_hold(true);
        let c = call(
            s.gateway.addr,
            post_json("/v1/chat/completions", &chat(true), &[]),
        )
        .await;
        let mut body = c.response.into_body();
        next_chunk(&mut body).await.unwrap();
        assert_eq!(s.gw.bulkhead.stats().in_flight, 1);
        // The client goes away mid-stream; the provider is still paused.
        c.connection.abort();
        drop(body);
        released.recv().await.unwrap();
        let st = s.gw.bulkhead.stats();
        assert_eq!(st.in_flight, 0);
        assert_eq!(st.token_budget.unwrap().in_flight_tokens, 0);
        s.control.set_hold(false);
    });
}

#[test]
fn the_kill_switch_refuses_with_429_until_lifted() {
    run(async {
        let s = stack("kill", PLAIN).await;
        let addr = s.gateway.addr;
        let kill = r#"{"revision": 1, "max_concurrent": 0, "max_queue": 0, "token_budget": {"budget": 100000}}"#;
        let c = call(addr, post_json("/admin/limits", kill, &[])).await;
        assert_eq!(c.response.status(), 200);
        let c = call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await;
        assert_eq!(c.response.status(), 429);
        let body: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
        assert_eq!(body["error"]["capacity"]["max_concurrent"], 0);
        assert_eq!(body["error"]["revision"], 1);
        assert_eq!(s.control.served.load(Ordering::SeqCst), 0);
        // A stale snapshot is refused and changes nothing.
        let stale = r#"{"revision": 1, "max_concurrent": 5, "max_queue": 0, "token_budget": {"budget": 100000}}"#;
        let c = call(addr, post_json("/admin/limits", stale, &[])).await;
        assert_eq!(c.response.status(), 409);
        // A typo is refused with the field's name.
        let typo = r#"{"revision": 2, "max_concurent": 5, "max_queue": 0}"#;
        let c = call(addr, post_json("/admin/limits", typo, &[])).await;
        assert_eq!(c.response.status(), 400);
        assert!(text(c.response)
            .await
            .contains("unknown field `max_concurent`"));
        let c = call(addr, get("/v1/chat/completions")).await;
        assert_eq!(c.response.status(), 405);
        // Lifted.
        let lift = r#"{"revision": 2, "maxConcurrent": 2, "maxQueue": 0, "tokenBudget": {"budget": 100000}}"#;
        let c = call(addr, post_json("/admin/limits", lift, &[])).await;
        assert_eq!(c.response.status(), 200);
        let current = text(call(addr, get("/admin/limits")).await.response).await;
        assert!(current.contains("\"revision\":2"), "{current}");
        let c = call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await;
        assert_eq!(c.response.status(), 200);
        text(c.response).await;
        assert_eq!(s.control.served.load(Ordering::SeqCst), 1);
        // Bad bodies never reach the bulkhead.
        let c = call(addr, post_json("/v1/chat/completions", "{not json", &[])).await;
        assert_eq!(c.response.status(), 400);
        let bad = text(c.response).await;
        assert!(bad.contains("\"code\":\"invalid_json\""), "{bad}");
        let st = s.gw.bulkhead.stats();
        assert_eq!((st.admitted, st.rejected, st.in_flight), (1, 1, 0));
    });
}

#[test]
fn the_class_comes_from_a_header() {
    run(async {
        let s = stack("classes", app::DEFAULT_CONFIG).await;
        let addr = s.gateway.addr;
        s.control.set_hold(true);
        let batch = [("x-traffic-class", "batch")];
        let inside: Vec<_> = (0..2)
            .map(|_| {
                tokio::spawn(async move {
                    call(
                        addr,
                        post_json(
                            "/v1/chat/completions",
                            &chat(false),
                            &[("x-traffic-class", "batch")],
                        ),
                    )
                    .await
                })
            })
            .collect();
        s.control.paused_at_least(2).await;
        // Batch's ceiling is 2; interactive still gets in.
        let c = call(
            addr,
            post_json("/v1/chat/completions", &chat(false), &batch),
        )
        .await;
        assert_eq!(c.response.status(), 429);
        let body: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
        assert_eq!(body["error"]["class"], "batch");
        assert_eq!(body["error"]["constraint"], "admission_class");
        let c = call(
            addr,
            post_json(
                "/v1/chat/completions",
                &chat(false),
                &[("x-traffic-class", "tenant-7")],
            ),
        )
        .await;
        assert_eq!(c.response.status(), 400);
        let interactive = tokio::spawn(async move {
            call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await
        });
        s.control.paused_at_least(3).await;
        s.control.set_hold(false);
        for t in inside.into_iter().chain([interactive]) {
            let c = t.await.unwrap();
            assert_eq!(c.response.status(), 200);
            text(c.response).await;
        }
        assert_eq!(s.gw.bulkhead.stats().in_flight, 0);
    });
}

#[test]
fn metrics_report_what_happened() {
    run(async {
        let s = stack("metrics", PLAIN).await;
        let addr = s.gateway.addr;
        for _ in 0..2 {
            let c = call(addr, post_json("/v1/chat/completions", &chat(true), &[])).await;
            assert_eq!(c.response.status(), 200);
            text(c.response).await;
        }
        let kill = r#"{"revision": 1, "max_concurrent": 0, "max_queue": 0, "token_budget": {"budget": 100000}}"#;
        assert_eq!(
            call(addr, post_json("/admin/limits", kill, &[]))
                .await
                .response
                .status(),
            200
        );
        let c = call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await;
        assert_eq!(c.response.status(), 429);
        let c = call(addr, get("/metrics")).await;
        assert_eq!(c.response.status(), 200);
        let m = text(c.response).await;
        let line = |prefix: &str| {
            m.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{m}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!(
            line("llm_bulkhead_admitted_total{bulkhead=\"metrics\"}"),
            "2"
        );
        assert_eq!(
            line("llm_bulkhead_released_total{bulkhead=\"metrics\"}"),
            "2"
        );
        assert_eq!(
            line("llm_bulkhead_rejected_total{bulkhead=\"metrics\",reason=\"concurrency_limit\"}"),
            "1"
        );
        assert_eq!(
            line("llm_bulkhead_reconfigured_total{bulkhead=\"metrics\"}"),
            "1"
        );
        assert_eq!(line("llm_bulkhead_in_flight{bulkhead=\"metrics\"}"), "0");
        assert_eq!(
            line("llm_bulkhead_max_concurrent{bulkhead=\"metrics\"}"),
            "0"
        );
        assert_eq!(
            line("llm_bulkhead_limits_revision{bulkhead=\"metrics\"}"),
            "1"
        );
        assert_eq!(
            line("llm_bulkhead_tokens_in_flight{bulkhead=\"metrics\"}"),
            "0"
        );
        // The layer's histograms (a summary in this exporter) counted the holds.
        assert_eq!(
            line("llm_bulkhead_hold_seconds_count{bulkhead=\"metrics\"}"),
            "2"
        );
    });
}

#[test]
fn observe_mode_from_the_configuration_lets_overload_through() {
    run(async {
        let config = r#"{"max_concurrent": 1, "mode": "observe", "model": "gpt-4o",
            "token_budget": {"budget": 100000, "output_cap": 256}}"#;
        let s = stack("observe", config).await;
        let addr = s.gateway.addr;
        s.control.set_hold(true);
        let first = tokio::spawn(async move {
            call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await
        });
        s.control.paused_at_least(1).await;
        // Over the limit of 1: observed, not refused; the provider sees it.
        let second = tokio::spawn(async move {
            call(addr, post_json("/v1/chat/completions", &chat(false), &[])).await
        });
        s.control.paused_at_least(2).await;
        s.control.set_hold(false);
        for t in [first, second] {
            let c = t.await.unwrap();
            assert_eq!(c.response.status(), 200);
            text(c.response).await;
        }
        let st = s.gw.bulkhead.stats();
        assert_eq!((st.admitted, st.rejected, st.in_flight), (1, 0, 0));
        assert_eq!(LlmStats::of(&s.gw.bulkhead).observe.unwrap().bypassed, 1);
        assert_eq!(s.control.served.load(Ordering::SeqCst), 2);
    });
}

/// The gateway stack served by `serve::serve` (the example's server) with `timeouts`, the
/// body deadline `body_read`, until `stop` fires; the server's task returns its report.
struct Served {
    addr: std::net::SocketAddr,
    control: Arc<ProviderControl>,
    gw: Arc<app::Gateway>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<serve::Stopped>,
    _provider: Server,
}

async fn served(
    name: &str,
    timeouts: serve::Timeouts,
    body_read: std::time::Duration,
    shutdown: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
) -> Served {
    let control = ProviderControl::new(42, false);
    let provider = Server::start(provider::router(control.clone())).await;
    let config = BulkheadConfig::from_json(PLAIN).unwrap();
    let (router, gw) = app::gateway_with(&config, provider.addr, name, body_read).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = shutdown.unwrap_or_else(|| {
        Box::pin(async move {
            let _ = stopped.await;
        })
    });
    let bulkhead = gw.bulkhead.clone();
    let server = tokio::spawn(serve::serve(listener, router, bulkhead, timeouts, shutdown));
    Served {
        addr,
        control,
        gw,
        stop: Some(stop),
        server,
        _provider: provider,
    }
}

const LONG: std::time::Duration = std::time::Duration::from_secs(600);
const SHORT: std::time::Duration = std::time::Duration::from_millis(200);

fn timeouts(
    header_read: std::time::Duration,
    idle: std::time::Duration,
    drain: std::time::Duration,
) -> serve::Timeouts {
    serve::Timeouts {
        header_read,
        idle,
        drain,
    }
}

/// Writes `bytes` on a new connection and reads until the server closes it. The 60 s
/// watchdog of `run` is the failure detector: a server that never closes fails the test.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(bytes).await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

const HEAD: &str =
    "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n";

#[test]
fn a_stalled_body_gets_a_408_and_the_server_closes_the_connection() {
    run(async {
        let s = served("stalled", timeouts(LONG, LONG, LONG), SHORT, None).await;
        let request = format!("{HEAD}content-length: 1000\r\n\r\n{{\"model\": \"gpt-4o\"");
        let answer = raw(s.addr, request.as_bytes()).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"body_timeout\""), "{answer}");
        assert_eq!(s.control.served.load(Ordering::SeqCst), 0);
        assert_eq!(s.gw.bulkhead.stats().admitted, 0);
    });
}

#[test]
fn silent_partial_header_and_idle_connections_are_closed_by_the_server() {
    run(async {
        let s = served("silent", timeouts(SHORT, LONG, LONG), LONG, None).await;
        // Nothing at all, then a head that never ends: both closed, no response.
        assert_eq!(raw(s.addr, b"").await.unwrap(), "");
        let partial = format!("{HEAD}content-length: 10\r\nx-traffic");
        let answer = raw(s.addr, partial.as_bytes()).await.unwrap();
        assert!(!answer.contains("HTTP/1.1 2"), "{answer}");
        // A keep-alive connection idle after its response is closed as well.
        let ok = b"GET /stats HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
        let answer = raw(s.addr, ok).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    });
}

/// The idle timeout: a connection on which no byte moves (here, a request whose provider
/// stalls) is closed, and its admission released.
#[test]
fn a_connection_that_moves_no_byte_is_closed_and_releases_its_admission() {
    run(async {
        let s = served("idle", timeouts(LONG, SHORT, LONG), LONG, None).await;
        let (mut released, _sub) = releases(&s.gw);
        s.control.set_hold(true);
        let body = chat(false);
        let request = format!("{HEAD}content-length: {}\r\n\r\n{body}", body.len());
        let answer = raw(s.addr, request.as_bytes()).await;
        // Closed by the server without an answer (or reset).
        assert!(
            !answer.as_deref().unwrap_or("").contains("HTTP/1.1"),
            "{answer:?}"
        );
        released.recv().await.unwrap();
        assert_eq!(s.gw.bulkhead.stats().in_flight, 0);
        s.control.set_hold(false);
    });
}

/// A malformed chunked body is the client's error (400), not a 413; a declared length over
/// the bound gets its 413 before any body is read, so `Expect: 100-continue` is answered
/// with the 413 (no `100 Continue`, no reset); both are counted by code in the metrics.
#[test]
fn bad_bodies_get_400_or_413_and_are_counted() {
    run(async {
        let s = served("bodies", timeouts(LONG, LONG, LONG), LONG, None).await;
        let chunked =
            format!("{HEAD}transfer-encoding: chunked\r\n\r\nzz-not-hex\r\n{{}}\r\n0\r\n\r\n");
        let answer = raw(s.addr, chunked.as_bytes()).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("\"code\":\"invalid_body\""), "{answer}");
        let expect = format!(
            "{HEAD}content-length: {}\r\nexpect: 100-continue\r\n\r\n",
            2 * app::MAX_BODY
        );
        let answer = raw(s.addr, expect.as_bytes()).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(!answer.contains("100 Continue"), "{answer}");
        assert!(answer.contains("\"code\":\"body_too_large\""), "{answer}");
        // A reservation that can never fit: a 413 in OpenAI's shape, naming the limit.
        let huge = r#"{"model": "gpt-4o", "max_tokens": 1000000, "messages": [{"role": "user", "content": "hi"}]}"#;
        let c = call(s.addr, post_json("/v1/chat/completions", huge, &[])).await;
        assert_eq!(c.response.status(), 413);
        let body: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
        assert_eq!(body["error"]["code"], "request_too_large");
        assert_eq!(body["error"]["reason"], "budget_limit");
        assert_eq!(body["error"]["limit"]["name"], "effective_budget");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("never fit"));
        let metrics = text(call(s.addr, get("/metrics")).await.response).await;
        for (status, code) in [
            ("400", "invalid_body"),
            ("413", "body_too_large"),
            ("413", "request_too_large"),
        ] {
            let line = metrics
                .lines()
                .find(|l| {
                    l.starts_with("llm_bulkhead_http_refusals_total{")
                        && l.contains("bulkhead=\"bodies\"")
                        && l.contains(&format!("status=\"{status}\""))
                        && l.contains(&format!("code=\"{code}\""))
                })
                .unwrap_or_else(|| panic!("no {status} {code} in\n{metrics}"));
            assert!(line.ends_with(" 1"), "{line}");
        }
        assert_eq!(s.control.served.load(Ordering::SeqCst), 0);
    });
}

/// A duplicated `x-traffic-class` header is a 400 over HTTP too.
#[test]
fn a_duplicated_class_header_is_a_400() {
    run(async {
        let s = stack("dup", app::DEFAULT_CONFIG).await;
        let c = call(
            s.gateway.addr,
            post_json(
                "/v1/chat/completions",
                &chat(false),
                &[
                    ("x-traffic-class", "interactive"),
                    ("x-traffic-class", "batch"),
                ],
            ),
        )
        .await;
        assert_eq!(c.response.status(), 400);
        assert!(text(c.response)
            .await
            .contains("\"code\":\"duplicate_header\""));
        assert_eq!(s.control.served.load(Ordering::SeqCst), 0);
    });
}

/// Shutdown closes the bulkhead and lets a stream in flight finish: it reaches `[DONE]`.
#[test]
fn shutdown_drains_a_stream_in_flight() {
    run(async {
        let mut s = served("drain", timeouts(LONG, LONG, LONG), LONG, None).await;
        let body = held_stream(&s).await;
        s.stop.take().unwrap().send(()).unwrap();
        finish_stream(&s, body).await;
        let stopped = s.server.await.unwrap();
        assert!(stopped.drained && stopped.cut == 0, "{stopped:?}");
        assert_eq!(stopped.in_flight, 0);
    });
}

/// A stream whose provider holds it before its last chunk, its first chunk read.
async fn held_stream(s: &Served) -> hyper::body::Incoming {
    s.control.set_hold(true);
    let c = call(s.addr, post_json("/v1/chat/completions", &chat(true), &[])).await;
    assert_eq!(c.response.status(), 200);
    let mut body = c.response.into_body();
    next_chunk(&mut body).await.unwrap();
    s.control.paused_at_least(1).await;
    body
}

/// The rest of a held stream once the provider lets go: it ends with `[DONE]`.
async fn finish_stream(s: &Served, mut body: hyper::body::Incoming) {
    // The bulkhead is closed before the provider lets go: new requests are refused.
    while !s.gw.bulkhead.is_closed() {
        tokio::task::yield_now().await;
    }
    s.control.set_hold(false);
    let mut rest = String::new();
    while let Some(chunk) = next_chunk(&mut body).await {
        rest.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
}

/// Shutdown ends at its deadline whatever clients do: a stalled upload and a stream whose
/// provider never finishes are cut, and their admissions released.
#[test]
fn shutdown_is_bounded_whatever_clients_do() {
    run(async {
        let mut s = served("bounded", timeouts(LONG, LONG, SHORT), LONG, None).await;
        let mut body = held_stream(&s).await;
        let stalled = {
            let request = format!("{HEAD}content-length: 1000\r\n\r\n{{");
            let addr = s.addr;
            tokio::spawn(async move { raw(addr, request.as_bytes()).await })
        };
        assert_eq!(s.gw.bulkhead.stats().in_flight, 1);
        s.stop.take().unwrap().send(()).unwrap();
        let stopped = s.server.await.unwrap();
        assert!(!stopped.drained && stopped.cut >= 1, "{stopped:?}");
        assert_eq!(stopped.in_flight, 0);
        assert_eq!(s.gw.bulkhead.stats().in_flight, 0);
        // Both clients see their connection closed.
        let _ = stalled.await.unwrap();
        while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
        s.control.set_hold(false);
    });
}

/// SIGTERM (what systemd and Kubernetes send) shuts the gateway down as SIGINT does: the
/// bulkhead closes and the stream in flight still reaches `[DONE]`.
#[test]
fn sigterm_closes_the_bulkhead_and_drains() {
    run(async {
        let signals = serve::signals().unwrap();
        let shutdown = Box::pin(async move {
            assert_eq!(signals.await, "SIGTERM");
        });
        let s = served("sigterm", timeouts(LONG, LONG, LONG), LONG, Some(shutdown)).await;
        let body = held_stream(&s).await;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        finish_stream(&s, body).await;
        let stopped = s.server.await.unwrap();
        assert!(stopped.drained && stopped.cut == 0, "{stopped:?}");
    });
}
