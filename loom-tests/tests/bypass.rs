//! Model of the bypass's race (`src/protocol/classed/bypass.rs`, "The race on (2)"): an
//! enqueuer of class `interactive` against an in-floor newcomer of the same class.
//!
//! The enqueuer `A` (40 tokens) is short of tokens only by row 5 (its tokens would eat the
//! `batch` token floor), so under token waiting it queues, as the head, unless its decision
//! sees the newcomer's slot: `interactive` has a slot ceiling of 1, and row 3 comes before
//! row 5, so a decision that sees the newcomer refuses `A` (`concurrency_limit`) instead of
//! queueing it. The newcomer `N` (0 tokens, inside the interactive slot floor) is protected.
//! So `A` queued (its first poll pending) and `N` admitted can only both happen if `N` was
//! admitted after `A` joined the queue without seeing `A`: a newcomer of class `interactive`
//! ahead of a queued waiter of class `interactive`. The model asserts it never happens.
//!
//! With `LLM_BULKHEAD_LOOM_NO_CLASS_COUNT_RECHECK=1` the newcomer reads the mask of queued
//! classes only before its class-word CAS (the deliberately broken variant): loom finds the
//! interleaving in which it passes `A`.
#![cfg(loom)]

mod common;

use common::{model, tokens};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, WaitOptions};
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

#[test]
fn an_in_floor_newcomer_never_passes_a_queued_waiter_of_its_own_class() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(3)
            .max_queue(2)
            .token_budget(120)
            .wait_for_tokens(true)
            .class(
                "interactive",
                ClassLimits {
                    protected_concurrent: 1,
                    max_concurrent: Some(1),
                    ..ClassLimits::default()
                },
            )
            .class(
                "batch",
                ClassLimits {
                    protected_tokens: 50,
                    ..ClassLimits::default()
                },
            )
            .class("other", ClassLimits::default())
            .default_class("other")
            .build()
            .unwrap();
        // `other` borrows 40 tokens: T = 40, V = 50 + 40 = 90. A's 40 pass row 1 (80 ≤ 120)
        // and fail row 5 (90 + 40 > 120), and fit once nothing is held (50 + 40 ≤ 120).
        let held = b.try_acquire(tokens(0, 40)).unwrap();
        let interactive = b.class_id("interactive").unwrap();
        let b2 = b.clone();
        let decided = Arc::new(AtomicBool::new(false));
        let decided2 = decided.clone();
        let enqueuer = thread::spawn(move || {
            let mut f =
                pin!(b2.acquire(tokens(0, 40).in_class(interactive), WaitOptions::default()));
            let first = f.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            // Stay queued (if queued) until the newcomer has decided; the future leaves the
            // queue when it is dropped, after that.
            while !decided2.load(SeqCst) {
                thread::yield_now();
            }
            first.is_pending()
        });
        // Held until the end: while it is held, a decision of A that sees it refuses A.
        let newcomer = b.try_acquire(Demand::slot().in_class(interactive));
        decided.store(true, SeqCst);
        let queued = enqueuer.join().unwrap();
        assert!(
            !(queued && newcomer.is_ok()),
            "a newcomer of class interactive was admitted ahead of a queued waiter of its class"
        );
        drop((newcomer, held));
    });
}
