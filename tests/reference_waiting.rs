//! The reference's queue, close and drain cases (../shared/reference/async-bulkhead-llm-tests.md)
//! with their numbers, adapted to Rust: a waiter is known to be queued when `stats().pending`
//! says so; deadlines are zero or generous, never used to synchronise.

use llm_bulkhead::{
    BudgetLimits, Bulkhead, CancelToken, Demand, Profile, RejectReason, Reservation, WaitOptions,
};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

// `DrainReport` and `Resources` are `#[non_exhaustive]`: expected values are literals of
// test-side mirrors.
#[path = "support/detail.rs"]
mod detail;
use detail::DrainReport;

fn tokens(input: u64, output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, output).unwrap())
}

fn until_pending(b: &Bulkhead, n: u64) {
    while b.stats().pending != n {
        thread::yield_now();
    }
}

/// A blocking acquire on its own thread; its result (held tokens or reason) comes back on the
/// returned channel, and it releases when `go` is sent.
fn spawn_waiter(
    b: &Bulkhead,
    d: Demand,
    o: WaitOptions,
) -> (mpsc::Receiver<Result<u64, RejectReason>>, mpsc::Sender<()>) {
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let b = b.clone();
    thread::spawn(move || match b.acquire_blocking(d, o) {
        Ok(a) => {
            tx.send(Ok(a.held())).unwrap();
            let _ = go_rx.recv();
        }
        Err(r) => tx.send(Err(r.reason)).unwrap(),
    });
    (rx, go_tx)
}

/// limits #5: "applies one coherent snapshot before newly opened queue capacity resumes".
/// rev 7, mc1 mq1 B1000: first held (400); second queued (400); apply rev8 mc2 mq3 B500 H100
/// → the queued one gets budget_limit (400 + 400 > 400); inFlight 1; T 400.
#[test]
fn limits_5_a_raised_limit_reruns_the_waiters_checks_under_the_new_snapshot() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .token_budget(1_000)
        .initial_revision(7)
        .build()
        .unwrap();
    let first = b.try_acquire(tokens(200, 200)).unwrap();
    let (rx, _go) = spawn_waiter(&b, tokens(200, 200), WaitOptions::default());
    until_pending(&b, 1);
    let next = b
        .limits()
        .with_revision(8)
        .with_max_concurrent(2)
        .with_max_queue(3)
        .with_token_budget(Some(BudgetLimits {
            budget: 500,
            high_priority_reserve: 100,
        }));
    b.apply_limits(next).unwrap();
    assert_eq!(rx.recv().unwrap(), Err(RejectReason::BudgetLimit));
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (1, 0));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 400);
    drop(first);
}

/// #45: "budget_limit is fail-fast even with queue headroom": mc1 batch B50, est 30/30 →
/// budget_limit, pending 0.
#[test]
fn case_45_budget_refusals_are_never_queued() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .profile(Profile::Batch)
        .token_budget(50)
        .build()
        .unwrap();
    let r = b
        .acquire_blocking(tokens(30, 30), WaitOptions::default())
        .unwrap_err();
    assert_eq!(
        (r.reason, r.detail().pending),
        (RejectReason::BudgetLimit, 0)
    );
    assert_eq!(b.stats().pending, 0);
}

/// #41: "explicit maxQueue overrides profile default": batch + maxQueue 0 → concurrency_limit.
#[test]
fn case_41_explicit_max_queue_beats_the_profile() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .profile(Profile::Batch)
        .max_queue(0)
        .build()
        .unwrap();
    let _held = b.try_acquire(Demand::slot()).unwrap();
    assert_eq!(
        b.acquire_blocking(Demand::slot(), WaitOptions::default())
            .unwrap_err()
            .reason,
        RejectReason::ConcurrencyLimit
    );
}

/// #116: "queued request abort does not leak token reservation": mc1 mq1 B1000 est 50/50:
/// r1 ok; r2 queued, T 100 while queued; abort → aborted; T 100; release r1 → 0.
/// (#79: the abort frees the queue place: pending 0.)
#[test]
fn case_116_a_cancelled_waiter_held_no_tokens() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .token_budget(1_000)
        .build()
        .unwrap();
    let r1 = b.try_acquire(tokens(50, 50)).unwrap();
    let token = CancelToken::new();
    let (rx, _go) = spawn_waiter(
        &b,
        tokens(50, 50),
        WaitOptions {
            cancel: Some(token.clone()),
            ..WaitOptions::default()
        },
    );
    until_pending(&b, 1);
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 100);
    token.cancel();
    assert_eq!(rx.recv().unwrap(), Err(RejectReason::Aborted));
    let s = b.stats();
    assert_eq!(
        (s.pending, s.token_budget.unwrap().in_flight_tokens),
        (0, 100)
    );
    drop(r1);
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 0);
    assert_eq!(b.stats().rejected_by_reason.get(RejectReason::Aborted), 1);
}

/// #106 / #107: close() rejects pending waiters with shutdown and does not interrupt
/// in-flight work.
#[test]
fn case_106_close_rejects_waiters_and_leaves_work_running() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .profile(Profile::Batch)
        .build()
        .unwrap();
    let running = b.try_acquire(Demand::slot()).unwrap();
    let (rx, _go) = spawn_waiter(&b, Demand::slot(), WaitOptions::default());
    until_pending(&b, 1);
    b.close();
    assert_eq!(rx.recv().unwrap(), Err(RejectReason::Shutdown));
    assert_eq!(running.revision(), 0); // still held, still usable
    drop(running);
    assert_eq!(b.stats().in_flight, 0);
}

/// drain #3, #4, #6: a deadline reports `{drained: false, inFlight 1, pending 0}` and cancels
/// nothing; `timeoutMs: 0` on an idle bulkhead is drained; close + a bounded drain compose.
#[test]
fn drain_cases_3_4_6() {
    let b = Bulkhead::builder().max_concurrent(2).build().unwrap();
    assert_eq!(
        DrainReport::of(b.drain_blocking(Some(Duration::ZERO))),
        DrainReport {
            drained: true,
            in_flight: 0,
            pending: 0
        }
    );
    let work = b.try_acquire(Demand::slot()).unwrap();
    b.close();
    assert_eq!(
        DrainReport::of(b.drain_blocking(Some(Duration::from_millis(1)))),
        DrainReport {
            drained: false,
            in_flight: 1,
            pending: 0
        }
    );
    assert_eq!(b.stats().in_flight, 1, "a bounded drain cancels nothing");
    drop(work);
    assert_eq!(
        DrainReport::of(b.drain_blocking(Some(Duration::from_secs(60)))),
        DrainReport {
            drained: true,
            in_flight: 0,
            pending: 0
        }
    );
}
