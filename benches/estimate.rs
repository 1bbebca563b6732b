//! Token estimation cost: the naive and the model-aware estimator on a 200-character message
//! with a text block and an image block (the reference's ≈5.4 µs acquire+release-with-estimator
//! case), per KB of prompt, and a plain 200-character string message.

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
    g.finish();
}

/// The criterion group of this target (in a module: the macro's function has no doc comment).
mod group {
    criterion::criterion_group!(benches, super::estimate);
}
criterion_main!(group::benches);
