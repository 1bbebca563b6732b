//! Request bodies as an attacker would send them: errors name the field and what it must be and
//! never quote the value (nor a slice of it), whatever the value's size; estimating a body costs
//! memory within its nesting depth, not its number of parts, and parts beyond the limit are a
//! typed error. Peak heap is measured with a counting allocator (this binary's only).
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    EstimateError, LlmRequest, ModelAwareEstimator, NaiveEstimator, TokenEstimator,
};
use llm_bulkhead::Reservation;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// One test at a time: the count is process-wide, and tests run on several threads.
static ONE: Mutex<()> = Mutex::new(());

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(live, Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The peak heap above the start while `f` runs (the caller holds [`ONE`]).
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Relaxed);
    PEAK.store(start, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(start))
}

const MARKER: &str = "my password is hunter2";

fn bodies() -> Vec<String> {
    let huge = format!("{MARKER}{}", "x".repeat(9_990_000));
    vec![
        format!(r#"{{"max_tokens": "{MARKER}", "messages": []}}"#),
        format!(r#"{{"max_tokens": "{huge}", "messages": []}}"#),
        format!(r#"{{"max_completion_tokens": ["{MARKER}"], "messages": []}}"#),
        format!(r#"{{"n": {{"{MARKER}": 1}}, "messages": []}}"#),
        format!(
            r#"{{"thinking": {{"type": "enabled", "budget_tokens": "{MARKER}"}}, "messages": []}}"#
        ),
        format!(r#"{{"extraInputTokens": "{MARKER}"}}"#),
        format!(r#"{{"model": ["{MARKER}"], "messages": []}}"#),
        format!(r#"{{"messages": "{MARKER}"}}"#),
        format!(r#"{{"messages": ["{MARKER}"]}}"#),
        format!(r#"{{"messages": [{{"role": ["{MARKER}"], "content": "hi"}}]}}"#),
        format!(
            r#"{{"messages": [{{"role": "{MARKER}", "content": 5}}], "system": 7, "model": 5}}"#
        ),
        format!(r#"["{MARKER}"]"#),
        format!(r#""{huge}""#),
        format!(r#"{{"messages": [{{"role": "user", "content": "{MARKER}"#),
        format!(r#"{{"messages": [], "{MARKER}": 1, "{MARKER}": }}"#),
        format!(
            r#"{{"messages": [], "max_tokens": 1, "max_completion_tokens": 2, "x": "{MARKER}"}}"#
        ),
    ]
}

fn check(what: &str, body: &str, message: &str) {
    assert!(
        !message.contains("hunter2") && !message.contains("password") && message.len() < 300,
        "{what} echoes the body ({} bytes): {}",
        message.len(),
        &message[..message.len().min(300)]
    );
    let _ = body;
}

#[test]
fn errors_name_the_field_and_never_quote_the_value() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let custom =
        |r: &LlmRequest| Reservation::new(r.messages.len() as u64, 1).map_err(|_| unreachable!());
    let aware = ModelAwareEstimator::default();
    for body in bodies() {
        let b = body.as_bytes();
        // Parsing refuses every one of them. The streaming estimators may count a body the
        // parser refuses (a string where a message object belongs costs its size); where they
        // refuse, the same rule holds.
        let from_json = LlmRequest::from_json(b, 1_000).unwrap_err().to_string();
        check("from_json", &body, &from_json);
        let errors = [
            ("naive", NaiveEstimator.estimate_body(b).err()),
            ("model-aware", aware.estimate_body(b).err()),
            ("custom", custom.estimate_body(b).err()),
        ];
        for (what, e) in errors {
            if let Some(e) = e {
                check(what, &body, &e.to_string());
            }
        }
        #[cfg(feature = "tower")]
        if let Err(e) = llm_bulkhead::tower::estimate_json(b, &aware) {
            check("tower::estimate_json", &body, &e.message);
        }
    }
    // The field is named, with what it must be.
    let e = aware
        .estimate_body(format!(r#"{{"max_tokens": "{MARKER}"}}"#).as_bytes())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "field `max_tokens` must be a non-negative integer"
    );
    let e =
        LlmRequest::from_json(format!(r#"{{"messages": "{MARKER}"}}"#).as_bytes(), 10).unwrap_err();
    assert!(
        e.to_string()
            .contains("messages: invalid type: string, expected a sequence"),
        "{e}"
    );
    let e = LlmRequest::from_json(br#"{"messages": [{"role": 5}]}"#, 10).unwrap_err();
    assert!(
        e.to_string()
            .contains("messages[0].role: invalid type: integer, expected a string"),
        "{e}"
    );
    let both = br#"{"max_tokens": 1, "max_completion_tokens": 2}"#;
    assert_eq!(
        aware.estimate_body(both).unwrap_err(),
        EstimateError::ConflictingFields {
            fields: ["max_tokens", "max_completion_tokens"]
        }
    );
}

/// Issue 31's case: an 850 KB body of 50,000 `{"type":"image"}` blocks.
fn images_body(n: usize) -> Vec<u8> {
    let blocks = vec![r#"{"type":"image"}"#; n].join(",");
    format!(r#"{{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{{"role":"user","content":[{blocks}]}}]}}"#)
        .into_bytes()
}

#[test]
fn estimating_a_body_does_not_materialise_its_parts() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let body = images_body(50_000);
    assert!((800_000..900_000).contains(&body.len()));
    let aware = ModelAwareEstimator::default();
    let (r, streamed) = peak_during(|| aware.estimate_body(&body));
    // Every image counted (Anthropic's largest, no dimensions), in a few KB of heap.
    assert_eq!(r.unwrap().input(), 50_000 * 1_600 + 7);
    let (parsed, materialised) =
        peak_during(|| serde_json::from_slice::<LlmRequest>(&body).unwrap());
    drop(parsed);
    println!("peak heap for the 850 KB body: estimate_body {streamed} B, parsing to LlmRequest {materialised} B");
    assert!(
        streamed < 64 * 1024,
        "estimate_body peaked at {streamed} bytes"
    );
    assert!(materialised > 100 * streamed);
    // The parts limit: a typed error before anything is materialised.
    let small = ModelAwareEstimator::builder()
        .max_parts(10_000)
        .build()
        .unwrap();
    assert_eq!(
        small.estimate_body(&body).unwrap_err(),
        EstimateError::TooManyParts { limit: 10_000 }
    );
    let (e, from_json) = peak_during(|| LlmRequest::from_json(&body, 10_000).unwrap_err());
    assert_eq!(e, EstimateError::TooManyParts { limit: 10_000 });
    assert!(
        from_json < 64 * 1024,
        "from_json peaked at {from_json} bytes before refusing"
    );
}
