//! Models of token waiting (`src/protocol/token_wait.rs`, issue 15 item 8): a demand short only of
//! tokens waits in the FIFO queue, and freed tokens go to the head atomically.
//!
//! 1. a release handing tokens to a queued head races a newcomer's fast path: the newcomer
//!    (50 tokens), which would fit the freed tokens but never beside the head (60 of 100), is
//!    never admitted (no window in which it could take tokens freed for the head), and the
//!    head is admitted;
//! 2. a usage refund against a waiter entering the queue for tokens: the waiter is admitted
//!    while the refunding admission still holds its slot (a lost wake-up would leave loom with
//!    a deadlock). With `LLM_BULKHEAD_LOOM_NO_TOKEN_PUMP=1` (the refund does not pump: the
//!    deliberately broken variant) loom finds that deadlock;
//! 3. a reconfiguration shrinking the budget below a queued waiter's demand against the
//!    release that would have fed it: the waiter ends admitted or with `budget_limit`, never
//!    hangs, nothing leaks;
//! 4. with classes: a refund inside a class token ceiling against a waiter queueing for that
//!    ceiling (the classed decrease visits the queue). The same variable breaks the class
//!    refund (its token return does not visit the queue), and loom finds the deadlock here too.
//! 5. a release feeding two waiters (the second pumped under the hand-off's lock) against a
//!    newcomer.
//!
//! Run the broken variant one model at a time (a deadlock panic inside loom aborts the run):
//! `LLM_BULKHEAD_LOOM_NO_TOKEN_PUMP=1 ... --test token_wait a_refund_wakes` and
//! `... --test token_wait with_classes`.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, tokens};
use llm_bulkhead::{Bulkhead, ClassLimits, Reconcile, RejectReason, Usage, WaitOptions};
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

fn token_waiting(budget: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(3)
        .max_queue(2)
        .token_budget(budget)
        .wait_for_tokens(true)
        .build()
        .unwrap()
}

/// Shrinks `a`'s hold to nothing (a refund of all it holds) while it keeps its slot.
fn refund_all(a: &mut llm_bulkhead::Admission) {
    let none = Reconcile {
        remaining_output: 0,
        safety_margin: 0,
    };
    let r = a.report_usage_reconciled(Usage::new(0, 0), none).unwrap();
    assert_eq!(r.held, 0);
}

#[test]
fn a_release_hands_tokens_to_the_head_before_a_newcomer_can_take_them() {
    model(|| {
        let b = token_waiting(100);
        let held = b.try_acquire(tokens(0, 60)).unwrap();
        // The head: queued (deterministically) for 60 tokens beside the 60 held.
        let mut head = pin!(b.acquire(tokens(0, 60), WaitOptions::default()));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let b2 = b.clone();
        let newcomer = thread::spawn(move || {
            // 50: fits the freed tokens (0 + 50) but never beside the head (60 + 50 > 100).
            b2.try_acquire(tokens(0, 50))
                .map(drop)
                .map_err(|r| r.reason)
        });
        drop(held);
        let n = newcomer.join().unwrap();
        assert!(
            matches!(
                n,
                Err(RejectReason::ConcurrencyLimit) | Err(RejectReason::BudgetLimit)
            ),
            "a newcomer took tokens freed for the head: {n:?}"
        );
        let Poll::Ready(Ok(a)) = head.as_mut().poll(&mut cx) else {
            panic!("the head was not handed its tokens")
        };
        assert_eq!(a.held(), 60);
        drop(a);
        assert_quiescent(&b, 2, 1);
    });
}

#[test]
fn a_refund_wakes_a_waiter_short_of_tokens() {
    model(|| {
        let b = token_waiting(100);
        let mut held = b.try_acquire(tokens(0, 60)).unwrap();
        let b2 = b.clone();
        let waiter = thread::spawn(move || {
            let a = b2
                .acquire_blocking(tokens(0, 60), WaitOptions::default())
                .expect("the refund feeds the waiter");
            a.held()
        });
        refund_all(&mut held);
        // `held` keeps its slot until the waiter is in: only the refund can feed it.
        assert_eq!(waiter.join().unwrap(), 60);
        drop(held);
        assert_quiescent(&b, 2, 0);
    });
}

#[test]
fn a_shrinking_budget_answers_a_waiter_that_can_no_longer_fit() {
    model(|| {
        let b = token_waiting(100);
        let held = b.try_acquire(tokens(0, 60)).unwrap();
        let mut w = pin!(b.acquire(tokens(0, 60), WaitOptions::default()));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(w.as_mut().poll(&mut cx).is_pending());
        let b2 = b.clone();
        let shrink = thread::spawn(move || {
            b2.set_budget(50).unwrap();
        });
        drop(held);
        shrink.join().unwrap();
        let admitted = match w.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(a)) => {
                drop(a);
                true
            }
            Poll::Ready(Err(r)) => {
                assert_eq!(r.reason, RejectReason::BudgetLimit, "{r:?}");
                false
            }
            Poll::Pending => panic!("a waiter that can never fit is still queued"),
        };
        assert_quiescent(&b, 1 + u64::from(admitted), u64::from(!admitted));
    });
}

#[test]
fn with_classes_a_refund_wakes_a_waiter_at_its_class_ceiling() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(3)
            .max_queue(2)
            .token_budget(1_000)
            .class(
                "a",
                ClassLimits {
                    max_tokens: Some(100),
                    ..ClassLimits::default()
                },
            )
            .default_class("a")
            .wait_for_tokens(true)
            .build()
            .unwrap();
        let mut held = b.try_acquire(tokens(0, 60)).unwrap();
        let b2 = b.clone();
        let waiter = thread::spawn(move || {
            let a = b2
                .acquire_blocking(tokens(0, 60), WaitOptions::default())
                .expect("the refund feeds the waiter");
            a.held()
        });
        refund_all(&mut held);
        assert_eq!(waiter.join().unwrap(), 60);
        drop(held);
        let s = b.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    });
}

/// 5. A release that feeds two waiters (the head, then the one behind it, pumped under the
///    hand-off's lock) against a newcomer: both waiters are admitted, the newcomer never is
///    (nothing is free that the queue does not take first), nothing leaks.
#[test]
fn a_release_feeds_two_waiters_under_one_lock_against_a_newcomer() {
    model(|| {
        let b = token_waiting(100);
        let held = b.try_acquire(tokens(0, 100)).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut w1 = pin!(b.acquire(tokens(0, 50), WaitOptions::default()));
        let mut w2 = pin!(b.acquire(tokens(0, 50), WaitOptions::default()));
        assert!(w1.as_mut().poll(&mut cx).is_pending());
        assert!(w2.as_mut().poll(&mut cx).is_pending());
        let b2 = b.clone();
        let newcomer = thread::spawn(move || b2.try_acquire(tokens(0, 50)).map(drop).is_ok());
        drop(held);
        assert!(
            !newcomer.join().unwrap(),
            "a newcomer took tokens freed for the queue"
        );
        let (Poll::Ready(Ok(a1)), Poll::Ready(Ok(a2))) =
            (w1.as_mut().poll(&mut cx), w2.as_mut().poll(&mut cx))
        else {
            panic!("the release did not feed both waiters")
        };
        drop((a1, a2));
        assert_quiescent(&b, 3, 1);
    });
}
