//! Helpers the LLM-layer tests share (`#[path = "support/llm.rs"] mod llm_support;`): a
//! hand poll with a no-op waker, the request they send, a de-duplicating front end, an event
//! recorder, and the classed bulkhead whose every slot is borrowed.
#![allow(dead_code)]

use llm_bulkhead::llm::{DedupSettings, LlmBulkhead, LlmRequest};
use llm_bulkhead::{Bulkhead, BulkheadBuilder, ClassLimits, Event, Subscription};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Polls `f` once with a no-op waker (nothing sleeps: the test drives every step).
pub fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls an `Unpin` future once with a no-op waker.
pub fn poll_unpin<F: Future + Unpin + ?Sized>(f: &mut F) -> Poll<F::Output> {
    poll(Pin::new(f))
}

/// The request the LLM tests send.
pub fn request() -> LlmRequest {
    LlmRequest::new("gpt-4o", &["What is a bulkhead?"])
}

/// `b` with the naive estimator and the default de-duplication.
pub fn dedup_llm(b: Bulkhead) -> LlmBulkhead {
    LlmBulkhead::new(b, llm_bulkhead::llm::NaiveEstimator)
        .with_dedup(DedupSettings::default())
        .unwrap()
}

/// Records every event of `b` while the subscription lives.
pub fn record(b: &Bulkhead) -> (Arc<Mutex<Vec<Event>>>, Subscription) {
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let l = log.clone();
    (
        log,
        b.subscribe(move |e: &Event| l.lock().unwrap().push(e.clone())),
    )
}

/// Two slots and one class without a floor, the default: every slot is borrowed (so a
/// borrowed-concurrency deadline applies). Add a budget before `build`.
pub fn borrowing_builder() -> BulkheadBuilder {
    Bulkhead::builder()
        .max_concurrent(2)
        .class("batch", ClassLimits::default())
        .default_class("batch")
}

/// The borrowing bulkhead with a 1,000-token budget, each request reserving 100 + 200.
pub fn borrowing_budgeted() -> LlmBulkhead {
    let b = borrowing_builder().token_budget(1_000).build().unwrap();
    LlmBulkhead::new(b, |_: &LlmRequest| {
        Ok(llm_bulkhead::Reservation::new(100, 200).unwrap())
    })
}

/// `b` with two classes: `premium`, one slot protected, and `batch`, the default, at most one
/// slot.
pub fn premium_and_batch(b: BulkheadBuilder) -> BulkheadBuilder {
    b.class(
        "premium",
        ClassLimits {
            protected_concurrent: 1,
            ..ClassLimits::default()
        },
    )
    .class(
        "batch",
        ClassLimits {
            max_concurrent: Some(1),
            ..ClassLimits::default()
        },
    )
    .default_class("batch")
}
