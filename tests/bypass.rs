//! In-floor newcomers bypass the queue (`src/protocol/classed/bypass.rs`): with classes and
//! token waiting, a batch demand queued for tokens no longer holds back an interactive
//! request inside its floors; a borrowing one, or one whose class already has a waiter, still
//! waits its turn; and nobody bypasses while the high-priority reserve is in use (`V > B − H`).
//! Deterministic: async futures polled by hand with a no-op waker, no sleeps, no timing.

use llm_bulkhead::{
    Admission, Bulkhead, ClassLimits, Constraint, Demand, Priority, RejectReason, Rejection,
    Reservation, WaitOptions,
};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

type Fut<'a> = Pin<Box<llm_bulkhead::Acquire<'a>>>;

fn poll(f: &mut Fut<'_>) -> Poll<Result<Admission, Rejection>> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// `interactive` with floors of 2 slots and `floor` tokens, `batch` without floors (the
/// default class); token waiting on.
fn bulkhead(budget: u64, reserve: u64, floor: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(4)
        .max_queue(4)
        .token_budget(budget)
        .high_priority_reserve(reserve)
        .wait_for_tokens(true)
        .class(
            "interactive",
            ClassLimits {
                protected_concurrent: 2,
                protected_tokens: floor,
                ..ClassLimits::default()
            },
        )
        .class("batch", ClassLimits::default())
        .default_class("batch")
        .build()
        .unwrap()
}

fn demand(b: &Bulkhead, class: &str, tokens: u64, priority: Priority) -> Demand {
    Demand::tokens(Reservation::new(0, tokens).unwrap())
        .with_priority(priority)
        .in_class(b.class_id(class).unwrap())
}

fn no_barging(e: &Rejection) {
    assert_eq!(
        (e.reason, e.constraint),
        (RejectReason::ConcurrencyLimit, Some(Constraint::Global)),
        "{e:?}"
    );
}

#[test]
fn an_in_floor_newcomer_passes_a_token_waiter_of_another_class_and_nobody_else_does() {
    let b = bulkhead(1_000, 0, 400);
    let n = Priority::Normal;
    // Batch holds 500 (V = 400 + 500 = 900); a batch demand of 300 would borrow past the
    // interactive token floor (V + 300 > 1000): it waits for tokens.
    let held = b.try_acquire(demand(&b, "batch", 500, n)).unwrap();
    let mut batch = Box::pin(b.acquire(demand(&b, "batch", 300, n), WaitOptions::default()));
    assert!(poll(&mut batch).is_pending());
    assert_eq!(b.stats().pending, 1);

    // Interactive inside its floors: admitted ahead of the batch waiter (try_acquire and the
    // waiting acquire alike), borrowing nothing.
    let inside = b.try_acquire(demand(&b, "interactive", 300, n)).unwrap();
    assert!(!inside.resources().borrowed_concurrency);
    assert_eq!(inside.resources().borrowed_tokens, 0);
    let mut zero = Box::pin(b.acquire(demand(&b, "interactive", 0, n), WaitOptions::default()));
    let Poll::Ready(Ok(zero)) = poll(&mut zero) else {
        panic!("an in-floor waiting acquire must bypass, not queue");
    };
    assert_eq!(b.stats().pending, 1);
    // The interactive class's floor is full now (2 slots): a third interactive demand borrows
    // a slot, and so does not bypass.
    no_barging(&b.try_acquire(demand(&b, "interactive", 0, n)).unwrap_err());
    drop(zero);

    // Interactive borrowing tokens (300 + 200 > 400): no bypass; it queues behind the batch one.
    no_barging(
        &b.try_acquire(demand(&b, "interactive", 200, n))
            .unwrap_err(),
    );
    let mut borrowing =
        Box::pin(b.acquire(demand(&b, "interactive", 200, n), WaitOptions::default()));
    assert!(poll(&mut borrowing).is_pending());
    assert_eq!(b.stats().pending, 2);

    // An interactive waiter is queued now: an interactive demand inside the floors (300 + 50)
    // is not admitted ahead of it (per-class FIFO), neither by try_acquire nor by acquire.
    no_barging(&b.try_acquire(demand(&b, "interactive", 50, n)).unwrap_err());
    let mut behind = Box::pin(b.acquire(demand(&b, "interactive", 50, n), WaitOptions::default()));
    assert!(poll(&mut behind).is_pending());
    assert_eq!(b.stats().pending, 3);

    // The batch tokens come back: the waiters are admitted in arrival order.
    drop(held);
    let Poll::Ready(Ok(batch)) = poll(&mut batch) else {
        panic!("the batch waiter is admitted first");
    };
    let Poll::Ready(Ok(borrowing)) = poll(&mut borrowing) else {
        panic!("then the borrowing interactive one");
    };
    assert_eq!(borrowing.resources().borrowed_tokens, 100);
    let Poll::Ready(Ok(behind)) = poll(&mut behind) else {
        panic!("then the one behind it");
    };
    assert_eq!(b.stats().pending, 0);
    drop((batch, borrowing, behind, inside));
    assert_eq!(b.stats().in_flight, 0);
}

#[test]
fn nobody_bypasses_while_the_high_priority_reserve_is_in_use() {
    // B = 1000, H = 200: the lowest effective budget is 800.
    let b = bulkhead(1_000, 200, 300);
    let (n, h) = (Priority::Normal, Priority::High);
    // A high-priority batch admission takes V to 300 + 550 = 850 > 800.
    let reserve = b.try_acquire(demand(&b, "batch", 550, h)).unwrap();
    let mut batch = Box::pin(b.acquire(demand(&b, "batch", 100, n), WaitOptions::default()));
    assert!(poll(&mut batch).is_pending());
    // Inside the interactive floors, but V > B − H: a queued waiter may be deciding on the
    // exact token total, which the newcomer would change. Refused at either priority.
    no_barging(
        &b.try_acquire(demand(&b, "interactive", 100, n))
            .unwrap_err(),
    );
    no_barging(
        &b.try_acquire(demand(&b, "interactive", 100, h))
            .unwrap_err(),
    );
    // The reserve comes back: the waiter first, then the in-floor newcomer passes again.
    drop(reserve);
    let Poll::Ready(Ok(batch)) = poll(&mut batch) else {
        panic!("the batch waiter is admitted");
    };
    let again = b.try_acquire(demand(&b, "interactive", 100, n)).unwrap();
    drop((batch, again));
}

#[test]
fn without_classes_nobody_bypasses() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .max_queue(4)
        .token_budget(1_000)
        .wait_for_tokens(true)
        .build()
        .unwrap();
    let t = |n| Demand::tokens(Reservation::new(0, n).unwrap());
    let held = b.try_acquire(t(900)).unwrap();
    let mut big = Box::pin(b.acquire(t(500), WaitOptions::default()));
    assert!(poll(&mut big).is_pending());
    // 50 tokens would fit, but the head blocks newcomers (strict FIFO).
    assert_eq!(
        b.try_acquire(t(50)).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    drop(held);
    assert!(matches!(poll(&mut big), Poll::Ready(Ok(_))));
}
