//! Token waiting (`BulkheadBuilder::wait_for_tokens`, issue 15 item 8): strict FIFO order for
//! demands short of tokens, hand-off on release and refund, never-fitting demands, timeouts,
//! cancellation, close, reconfiguration, and a stress run against an independent tally.
//! Deterministic: async futures polled by hand with a no-op waker, no sleeps, no timing.

use llm_bulkhead::{
    Admission, Bulkhead, CancelToken, ClassLimits, Demand, Priority, Reconcile, RejectReason,
    Reservation, Usage, WaitOptions,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

fn t(n: u64) -> Demand {
    Demand::tokens(Reservation::new(0, n).unwrap())
}

fn waiting(max_concurrent: u32, budget: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(16)
        .token_budget(budget)
        .wait_for_tokens(true)
        .build()
        .unwrap()
}

type Fut<'a> = Pin<Box<llm_bulkhead::Acquire<'a>>>;

fn poll(f: &mut Fut<'_>) -> Poll<Result<Admission, llm_bulkhead::Rejection>> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Queues `f` (its first poll must be pending).
fn queue<'a>(b: &'a Bulkhead, d: Demand, o: WaitOptions) -> Fut<'a> {
    let mut f = Box::pin(b.acquire(d, o));
    assert!(poll(&mut f).is_pending(), "expected to queue");
    f
}

/// Polls every unfinished future; appends the index of each that finished with an admission
/// to `order` (keeping the admission in `held`).
fn collect(futs: &mut [Option<Fut<'_>>], order: &mut Vec<usize>, held: &mut Vec<Admission>) {
    for (i, slot) in futs.iter_mut().enumerate() {
        if let Some(f) = slot {
            if let Poll::Ready(r) = poll(f) {
                held.push(r.expect("admitted"));
                order.push(i);
                *slot = None;
            }
        }
    }
}

fn refund_to(a: &mut Admission, hold: u64) {
    let r = Reconcile {
        remaining_output: hold,
        safety_margin: 0,
    };
    assert_eq!(
        a.report_usage(Usage::new(0, 0), Some(r)).unwrap().held,
        hold
    );
}

#[test]
fn fail_fast_stays_the_default() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .max_queue(4)
        .token_budget(100)
        .build()
        .unwrap();
    let _a = b.try_acquire(t(80)).unwrap();
    let e = b
        .acquire_blocking(t(30), WaitOptions::default())
        .unwrap_err();
    assert_eq!(
        (e.reason, e.detail().pending),
        (RejectReason::BudgetLimit, 0)
    );
}

/// Completion order equals arrival order, whatever the sizes: a large head is not overtaken by
/// small demands that would fit, and they wait behind it.
#[test]
fn completion_order_is_arrival_order() {
    let b = waiting(16, 1_000);
    let mut first = b.try_acquire(t(1_000)).unwrap();
    let sizes = [900u64, 50, 400, 10, 600, 100, 1_000, 1];
    let mut futs: Vec<Option<Fut<'_>>> = sizes
        .iter()
        .map(|&n| Some(queue(&b, t(n), WaitOptions::default())))
        .collect();
    assert_eq!(b.stats().pending, sizes.len() as u64);
    let (mut order, mut held) = (Vec::new(), Vec::new());
    // Free tokens a little at a time; then release whatever was admitted, oldest first.
    for hold in [950, 500, 200, 100, 0] {
        refund_to(&mut first, hold);
        collect(&mut futs, &mut order, &mut held);
        // The head blocks newcomers, even a 1-token one, while anyone waits.
        if futs.iter().any(Option::is_some) {
            let e = b.try_acquire(t(1)).unwrap_err();
            if e.detail().token_budget.unwrap().available >= 1 {
                // It would fit the budget: refused only because others wait.
                assert_eq!(e.reason, RejectReason::ConcurrencyLimit, "{e:?}");
            }
        }
    }
    drop(first);
    while futs.iter().any(Option::is_some) {
        collect(&mut futs, &mut order, &mut held);
        if futs.iter().any(Option::is_some) {
            held.remove(0); // releases hand tokens on
        }
    }
    assert_eq!(order, (0..sizes.len()).collect::<Vec<_>>());
    drop(held);
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending, s.admitted), (0, 0, 9), "{s:?}");
}

#[test]
fn the_same_order_with_classes() {
    let b = Bulkhead::builder()
        .max_concurrent(16)
        .max_queue(16)
        .token_budget(10_000)
        .class(
            "batch",
            ClassLimits {
                max_tokens: Some(1_000),
                ..ClassLimits::default()
            },
        )
        .class(
            "interactive",
            ClassLimits {
                protected_tokens: 8_000,
                ..ClassLimits::default()
            },
        )
        .default_class("batch")
        .wait_for_tokens(true)
        .build()
        .unwrap();
    // The batch class is at its ceiling; interactive keeps its floor.
    let mut first = b.try_acquire(t(1_000)).unwrap();
    let sizes = [1_000u64, 10, 700, 300];
    let mut futs: Vec<Option<Fut<'_>>> = sizes
        .iter()
        .map(|&n| Some(queue(&b, t(n), WaitOptions::default())))
        .collect();
    let (mut order, mut held) = (Vec::new(), Vec::new());
    refund_to(&mut first, 500);
    collect(&mut futs, &mut order, &mut held);
    assert!(order.is_empty(), "nobody passes the 1,000-token head");
    refund_to(&mut first, 0);
    collect(&mut futs, &mut order, &mut held);
    assert_eq!(
        order,
        vec![0],
        "the refund fed the head; the rest is over the ceiling"
    );
    drop(first);
    while futs.iter().any(Option::is_some) {
        collect(&mut futs, &mut order, &mut held);
        if futs.iter().any(Option::is_some) {
            held.remove(0);
        }
    }
    assert_eq!(order, vec![0, 1, 2, 3]);
    // More than the class ceiling, or more than the budget left beside interactive's floor:
    // refused at once, never queued.
    let e = b
        .acquire_blocking(t(1_001), WaitOptions::default())
        .unwrap_err();
    assert_eq!(e.reason, RejectReason::BudgetLimit);
}

#[test]
fn never_fitting_demands_are_refused_at_once() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .max_queue(4)
        .token_budget(1_000)
        .high_priority_reserve(200)
        .wait_for_tokens(true)
        .build()
        .unwrap();
    let _a = b.try_acquire(t(500)).unwrap();
    // Normal priority can never have more than 800.
    let e = b
        .acquire_blocking(t(801), WaitOptions::default())
        .unwrap_err();
    assert_eq!(
        (e.reason, e.detail().pending),
        (RejectReason::BudgetLimit, 0)
    );
    // High priority may wait for up to the whole budget.
    let mut f = queue(
        &b,
        t(1_000).with_priority(Priority::High),
        WaitOptions::default(),
    );
    assert_eq!(b.stats().pending, 1);
    drop(_a);
    assert!(matches!(poll(&mut f), Poll::Ready(Ok(_))));
}

#[test]
fn a_leaving_head_lets_the_next_in() {
    let b = waiting(4, 1_000);
    let _a = b.try_acquire(t(600)).unwrap();
    let cancel = CancelToken::new();
    let mut big = queue(
        &b,
        t(900),
        WaitOptions {
            cancel: Some(cancel.clone()),
            ..WaitOptions::default()
        },
    );
    let mut small = queue(&b, t(300), WaitOptions::default());
    assert!(poll(&mut small).is_pending(), "behind the head");
    cancel.cancel();
    assert_eq!(
        poll(&mut big).map(|r| r.map(drop).map_err(|e| e.reason)),
        Poll::Ready(Err(RejectReason::Aborted))
    );
    assert!(matches!(poll(&mut small), Poll::Ready(Ok(_))));
    // A zero timeout: queued, then it times out at once, also letting others by.
    let e = b
        .acquire_blocking(
            t(500),
            WaitOptions {
                timeout: Some(Duration::ZERO),
                ..WaitOptions::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.reason, RejectReason::Timeout);
    assert_eq!(b.stats().pending, 0);
}

#[test]
fn a_shrinking_budget_answers_every_waiter_that_can_no_longer_fit() {
    let b = waiting(4, 1_000);
    let _a = b.try_acquire(t(900)).unwrap();
    let mut w1 = queue(&b, t(500), WaitOptions::default());
    let mut w2 = queue(&b, t(800), WaitOptions::default());
    let mut w3 = queue(&b, t(200), WaitOptions::default());
    b.set_budget(600).unwrap();
    // The 800 behind the head is answered now, not when it reaches the head.
    let reason = |p: Poll<Result<Admission, llm_bulkhead::Rejection>>| match p {
        Poll::Ready(r) => Some(r.map(drop).map_err(|e| e.reason)),
        Poll::Pending => None,
    };
    assert_eq!(reason(poll(&mut w2)), Some(Err(RejectReason::BudgetLimit)));
    assert_eq!(reason(poll(&mut w1)), None);
    assert_eq!(reason(poll(&mut w3)), None);
    drop(_a);
    assert_eq!(reason(poll(&mut w1)), Some(Ok(())));
    assert_eq!(reason(poll(&mut w3)), Some(Ok(())));
    // A raised budget feeds waiters too.
    let _c = b.try_acquire(t(600)).unwrap();
    let mut w4 = queue(&b, t(300), WaitOptions::default());
    b.set_budget(900).unwrap();
    assert_eq!(reason(poll(&mut w4)), Some(Ok(())));
}

#[test]
fn close_answers_token_waiters_and_drain_waits_for_them() {
    let b = waiting(4, 100);
    let a = b.try_acquire(t(100)).unwrap();
    let mut w = queue(&b, t(50), WaitOptions::default());
    let r = b.drain_blocking(Some(Duration::ZERO));
    assert_eq!((r.drained, r.pending), (false, 1));
    b.close();
    assert!(matches!(poll(&mut w), Poll::Ready(Err(e)) if e.reason == RejectReason::Shutdown));
    drop(a);
    assert!(b.drain_blocking(Some(Duration::ZERO)).drained);
}

/// Threads acquire with waiting for tokens (some with a zero timeout), refund part of their
/// hold, and release; an independent tally, raised only after an acquire returned and lowered
/// before a release or refund, never exceeds the limits, and every demand (all fit when idle)
/// is admitted or times out: none is refused for tokens. The run starts with the whole budget
/// held until a thread is seen queued, so the queue is exercised whatever the scheduler does
/// (on a loaded machine the threads may otherwise run one after another and never meet).
fn stress(b: Bulkhead, max: u64, budget: u64) {
    const THREADS: usize = 4;
    const ITERS: u64 = 20_000;
    let slots = AtomicU64::new(0);
    let tokens = AtomicU64::new(0);
    let violations = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    let timeouts = AtomicU64::new(0);
    let start = Barrier::new(THREADS);
    let hold = b.try_acquire(t(budget)).unwrap();
    std::thread::scope(|s| {
        for th in 0..THREADS as u64 {
            let (b, slots, tokens, violations) = (&b, &slots, &tokens, &violations);
            let (admitted, timeouts, start) = (&admitted, &timeouts, &start);
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (th + 1);
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                start.wait();
                for _ in 0..ITERS {
                    let n = next() % (budget / 2) + 1;
                    let timeout = (next() % 8 == 0).then_some(Duration::ZERO);
                    let o = WaitOptions {
                        timeout,
                        ..WaitOptions::default()
                    };
                    match b.acquire_blocking(t(n), o) {
                        Ok(mut a) => {
                            admitted.fetch_add(1, SeqCst);
                            if slots.fetch_add(1, SeqCst) + 1 > max {
                                violations.fetch_add(1, SeqCst);
                            }
                            if tokens.fetch_add(n, SeqCst) + n > budget {
                                violations.fetch_add(1, SeqCst);
                            }
                            if next() % 2 == 0 {
                                let keep = n / 2;
                                tokens.fetch_sub(n - keep, SeqCst);
                                refund_to(&mut a, keep);
                            }
                            tokens.fetch_sub(a.held(), SeqCst);
                            slots.fetch_sub(1, SeqCst);
                            drop(a);
                        }
                        Err(e) => {
                            assert_eq!(e.reason, RejectReason::Timeout, "{e:?}");
                            timeouts.fetch_add(1, SeqCst);
                        }
                    }
                }
            });
        }
        // Synchronised on the bulkhead's state, not on time: someone waits for tokens.
        while b.stats().pending == 0 {
            std::thread::yield_now();
        }
        drop(hold);
    });
    assert_eq!(violations.load(SeqCst), 0);
    let s = b.stats();
    assert_eq!(s.admitted, admitted.load(SeqCst) + 1); // and the initial hold
    assert_eq!(s.rejected, timeouts.load(SeqCst));
    assert_eq!(s.rejected_by_reason.budget_limit, 0);
    assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
    assert!(admitted.load(SeqCst) > 0);
    assert!(
        s.queued_total > 0,
        "nobody waited: the run did not exercise the queue"
    );
}

#[test]
fn stress_without_classes_against_an_independent_tally() {
    stress(waiting(3, 1_000), 3, 1_000);
}

#[test]
fn stress_with_classes_against_an_independent_tally() {
    let b = Bulkhead::builder()
        .max_concurrent(3)
        .max_queue(16)
        .token_budget(1_000)
        .class("only", ClassLimits::default())
        .default_class("only")
        .wait_for_tokens(true)
        .build()
        .unwrap();
    stress(b, 3, 1_000);
}

/// A newcomer whose demand a reconfiguration makes impossible while it is between its fast
/// decision and the queue lock (held there by `PausePoint::EnterQueue`, where the shrink runs)
/// is refused with `budget_limit` under the lock, not queued behind the waiter already there,
/// with and without classes. Without the under-lock check the class newcomer stayed queued
/// (until it reached the head or the next sweep).
#[cfg(feature = "testing")]
#[test]
fn a_newcomer_made_impossible_by_a_racing_reconfiguration_is_refused_under_the_lock() {
    use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
    for classed in [false, true] {
        let mut builder = Bulkhead::builder()
            .max_concurrent(3)
            .max_queue(4)
            .token_budget(1_000)
            .wait_for_tokens(true);
        if classed {
            builder = builder
                .class("only", ClassLimits::default())
                .default_class("only");
        }
        let b = builder.build().unwrap();
        let held = b.try_acquire(t(900)).unwrap();
        // A waiter that still fits once the budget shrinks to 300 keeps the queue non-empty.
        let mut first = queue(&b, t(200), WaitOptions::default());
        let b2 = b.clone();
        let mut shrunk = false;
        set_pause_hook(move |p| {
            if p == PausePoint::EnterQueue && !shrunk {
                shrunk = true;
                b2.set_budget(300).unwrap();
            }
        });
        // 400 fits an idle budget of 1,000 (so it goes for the queue), never one of 300.
        let mut newcomer = Box::pin(b.acquire(t(400), WaitOptions::default()));
        let got = poll(&mut newcomer);
        clear_pause_hook();
        assert_eq!(b.limits().token_budget.unwrap().budget, 300, "the hook ran");
        match got {
            Poll::Ready(Err(e)) => {
                assert_eq!(e.reason, RejectReason::BudgetLimit, "{e:?}");
                assert_eq!(e.detail().pending, 1, "{e:?}");
            }
            other => panic!("classed {classed}: the newcomer was not refused: {other:?}"),
        }
        assert_eq!(b.stats().pending, 1);
        drop(held);
        assert!(matches!(poll(&mut first), Poll::Ready(Ok(_))));
    }
}
