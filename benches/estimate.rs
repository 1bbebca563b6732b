//! Token estimation cost: the naive and the model-aware estimator on a 200-character message
//! with a text block and an image block (the reference's ≈5.4 µs acquire+release-with-estimator
//! case), per KB of prompt, and a plain 200-character string message. Then request shapes as
//! JSON bodies (`shape/...`): estimated while parsing (`estimate_body`), estimated from a parsed
//! request (`estimate_parsed`), and, as the anchor, parsing the body into an `LlmRequest`
//! (`parse`: what a gateway did before estimating).

use criterion::{black_box, criterion_main, Criterion, Throughput};
use llm_bulkhead::llm::{
    Content, ContentBlock, LlmRequest, Message, ModelAwareEstimator, NaiveEstimator, TokenEstimator,
};
use std::time::Duration;

fn request(chars: usize) -> LlmRequest {
    let mut r = LlmRequest::new("claude-sonnet-4-5-20260101", &[]);
    r.system = Some(Content::from("You are a helpful assistant."));
    r.messages.push(Message {
        role: "user".into(),
        content: Content::Blocks(vec![
            ContentBlock::from_text("é".repeat(chars)),
            ContentBlock::of_type("image"),
        ]),
        extra: Default::default(),
    });
    r.max_tokens = Some(1_024);
    r
}

fn estimate(c: &mut Criterion) {
    let aware = ModelAwareEstimator::builder()
        .opaque_block_tokens(1_500)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("estimate");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for chars in [200usize, 1_024, 16_384] {
        let r = request(chars);
        g.throughput(Throughput::Bytes(chars as u64 * 2)); // 'é' is two bytes of UTF-8
        g.bench_function(format!("naive/{chars}_chars"), |b| {
            b.iter(|| NaiveEstimator.estimate(black_box(&r)).unwrap())
        });
        g.bench_function(format!("model_aware/{chars}_chars"), |b| {
            b.iter(|| aware.estimate(black_box(&r)).unwrap())
        });
    }
    // A plain string message (no content blocks), ASCII and not.
    for (name, text) in [("ascii", "a".repeat(200)), ("accented", "é".repeat(200))] {
        let r = LlmRequest::new("gpt-4o", &[&text]);
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(format!("model_aware/200_chars_string_{name}"), |b| {
            b.iter(|| aware.estimate(black_box(&r)).unwrap())
        });
    }
    // The model-ratio lookup: a 200-character ASCII message for real model names across the
    // built-in table (first entries, last entries, the longest prefixes, a dated suffix) and an
    // unknown model, beside the naive estimator of the same request (the anchor: no lookup).
    let text = "a".repeat(200);
    let anchor = LlmRequest::new("gpt-4o", &[&text]);
    g.throughput(Throughput::Bytes(200));
    g.bench_function("lookup/naive_anchor", |b| {
        b.iter(|| NaiveEstimator.estimate(black_box(&anchor)).unwrap())
    });
    for model in [
        "gpt-4o",
        "claude-3-5-haiku-20241022",
        "claude-sonnet-4-20250514",
        "claude-sonnet-4-5-20250929",
        "claude-haiku-4-5",
        "gpt-4.1-mini",
        "gpt-3.5-turbo",
        "o4-mini-2025-04-16",
        "gemini-1.5-pro",
        "Gemini-2.5-Flash",
        "unknown-model",
    ] {
        let r = LlmRequest::new(model, &[&text]);
        g.bench_function(format!("lookup/{model}"), |b| {
            b.iter(|| aware.estimate(black_box(&r)).unwrap())
        });
    }
    shapes(&mut g, &aware);
    g.finish();
}

/// The shapes' bodies.
fn bodies() -> Vec<(&'static str, String)> {
    let english = "The gateway admits a request when its reservation fits the budget, and refuses it otherwise. ";
    let prose = |n: usize| english.repeat(n.div_ceil(english.len()))[..n].to_owned();
    let tool = |i: usize| {
        serde_json::json!({"type": "function", "function": {"name": format!("tool_{i}"),
            "description": prose(200), "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": prose(60)}, "limit": {"type": "integer"}},
            "required": ["query"]}}})
    };
    let mut transcript = vec![serde_json::json!({"role": "system", "content": prose(800)})];
    for i in 0..12 {
        transcript.push(serde_json::json!({"role": "user", "content": prose(200)}));
        transcript.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"),
            "type": "function", "function": {"name": "grep", "arguments": format!("{{\"pattern\": \"budget_{i}\", \"path\": \"src/\"}}")}}]}));
        transcript.push(serde_json::json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": prose(900)}));
    }
    let png = "iVBORw0KGgoAAAANSUhEUgAABAAAAAQACAYAAAB/".to_owned() + &"A".repeat(200);
    let images: Vec<_> = (0..20)
        .map(|_| serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}))
        .collect();
    vec![
        ("chat_1kb", serde_json::json!({"model": "gpt-4o", "max_tokens": 256, "messages": [
            {"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": prose(1_000)}]}).to_string()),
        ("cjk_1kb", serde_json::json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "预算允许请求进入网关否则拒绝".repeat(24)}]}).to_string()),
        ("tools_4kb", serde_json::json!({"model": "gpt-4o", "tools": (0..12).map(tool).collect::<Vec<_>>(),
            "messages": [{"role": "user", "content": "hi"}]}).to_string()),
        ("agent_16kb", serde_json::json!({"model": "gpt-4o", "max_tokens": 2_000, "messages": transcript}).to_string()),
        ("images_20", serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [
            {"role": "user", "content": images}]}).to_string()),
    ]
}

/// Request shapes as JSON bodies.
fn shapes(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    aware: &ModelAwareEstimator,
) {
    for (name, body) in bodies() {
        let body = body.into_bytes();
        let parsed: LlmRequest = serde_json::from_slice(&body).unwrap();
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("shape/{name}/estimate_body"), |b| {
            b.iter(|| aware.estimate_body(black_box(&body)).unwrap())
        });
        g.bench_function(format!("shape/{name}/estimate_parsed"), |b| {
            b.iter(|| aware.estimate(black_box(&parsed)).unwrap())
        });
        g.bench_function(format!("shape/{name}/parse"), |b| {
            b.iter(|| serde_json::from_slice::<LlmRequest>(black_box(&body)).unwrap())
        });
    }
}

/// The criterion group of this target (in a module: the macro's function has no doc comment).
mod group {
    criterion::criterion_group!(benches, super::estimate);
}
criterion_main!(group::benches);
