//! The gateway example over real HTTP: the fake provider and the gateway on ephemeral
//! 127.0.0.1 ports, started and stopped by each test. Nothing sleeps: the tests wait on the
//! provider's hold (a watch channel), on bulkhead events and on responses.

#[path = "../examples/gateway/app.rs"]
mod app;
#[path = "../examples/gateway/provider.rs"]
mod provider;
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
        s.control.paused_at_least(1).await;
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
        assert!(text(c.response).await.contains("\"type\":\"invalid_json\""));
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
        // The layer's histograms counted the holds, rendered as histograms (buckets), not as
        // summaries (quantiles), so that replicas aggregate.
        assert_eq!(
            line("llm_bulkhead_hold_seconds_count{bulkhead=\"metrics\"}"),
            "2"
        );
        assert!(
            m.contains("# TYPE llm_bulkhead_hold_seconds histogram"),
            "{m}"
        );
        assert_eq!(
            line("llm_bulkhead_hold_seconds_bucket{bulkhead=\"metrics\",le=\"+Inf\"}"),
            "2"
        );
        assert!(!m.contains("quantile="), "{m}");
        // Refunds made by the usage report before release are exported as `/stats` counts
        // them (the counter stayed 0 when it was fed by release events only).
        let c = call(addr, get("/stats")).await;
        let stats: serde_json::Value = serde_json::from_str(&text(c.response).await).unwrap();
        let refunded = stats["token_budget"]["total_refunded"].as_u64().unwrap();
        assert!(refunded > 0, "{stats}");
        assert_eq!(
            line("llm_bulkhead_tokens_refunded_total{bulkhead=\"metrics\"}"),
            refunded.to_string()
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
