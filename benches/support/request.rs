//! The de-duplication benchmarks' chat request, shared by `benches/dedup.rs`,
//! `benches/llm_instructions.rs` and `tests/dedup_allocations.rs` (each includes this file by
//! `#[path]`), so that the allocation test counts the very request the figures are measured on.

use llm_bulkhead::llm::LlmRequest;

/// A chat request of about `bytes` bytes of JSON: a system prompt, four turns, a few fields.
pub fn request(bytes: usize) -> LlmRequest {
    let turn = "The quick brown fox jumps over the lazy dog while the bulkhead keeps count. ";
    let per = bytes / 5;
    let text: String = turn.repeat(per / turn.len() + 1)[..per].to_string();
    serde_json::from_value(serde_json::json!({
        "model": "gpt-4o-2024-08-06",
        "temperature": 0.2,
        "max_tokens": 512,
        "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": text},
            {"role": "assistant", "content": text},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ],
        "metadata": {"tenant": "acme", "trace": "0af7651916cd43dd8448eb211c80319c"},
    }))
    .expect("a valid request")
}
