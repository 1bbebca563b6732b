//! The wait queue (CONTRACT.md §2 rows 6–7, §3, §7; reference §2.3, §2.4, §8): FIFO hand-off,
//! the hand-off's own checks, bounds, timeouts, cancellation, close, raised limits, and async
//! waiters on several executors. No test sleeps or measures time: a waiter is known to be
//! queued when `stats().pending` says so, and timeouts use `Duration::ZERO`.

use llm_bulkhead::{
    Admission, Bulkhead, CancelToken, Demand, QueueTimeout, RejectReason, Rejection, Reservation,
    WaitOptions,
};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// `max_concurrent` slots and a queue of `max_queue`, nothing else.
fn queued(max_concurrent: u32, max_queue: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(max_queue)
        .build()
        .unwrap()
}

/// Nothing held or queued, and `admitted` admissions, all released.
fn assert_settled(b: &Bulkhead, admitted: u64) {
    let s = b.stats();
    assert_eq!(
        (s.in_flight, s.pending, s.admitted, s.released),
        (0, 0, admitted, admitted),
        "{s:?}"
    );
}

fn wait() -> WaitOptions {
    WaitOptions::default()
}

fn tokens(input: u64, output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, output).unwrap())
}

/// Spins (yielding) until `n` waiters are queued.
fn until_pending(b: &Bulkhead, n: u64) {
    while b.stats().pending != n {
        thread::yield_now();
    }
}

/// A waiter on its own thread: sends its outcome, then holds an admission until told to go.
fn waiter(
    b: &Bulkhead,
    demand: Demand,
    options: WaitOptions,
    tx: mpsc::Sender<(usize, Result<u64, RejectReason>)>,
    i: usize,
) -> (thread::JoinHandle<()>, mpsc::Sender<()>) {
    let b = b.clone();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let out = b.acquire_blocking(demand, options);
        let report = out.as_ref().map(Admission::held).map_err(|r| r.reason);
        tx.send((i, report)).unwrap();
        if let Ok(a) = out {
            let _ = go_rx.recv();
            drop(a);
        }
    });
    (h, go_tx)
}

#[test]
fn waiters_are_served_in_fifo_order() {
    let b = queued(1, 8);
    let holder = b.try_acquire(Demand::slot()).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut ws = Vec::new();
    for i in 0..4 {
        ws.push(waiter(&b, Demand::slot(), wait(), tx.clone(), i));
        until_pending(&b, i as u64 + 1);
    }
    // No barging while waiters are queued, even for try_acquire.
    assert_eq!(
        b.try_acquire(Demand::slot()).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    drop(holder);
    for expected in 0..4 {
        let (i, out) = rx.recv().unwrap();
        assert_eq!((i, out), (expected, Ok(0)));
        ws[i].1.send(()).unwrap(); // its release hands the slot to the next one
    }
    for (h, _) in ws {
        h.join().unwrap();
    }
    assert_settled(&b, 5);
}

/// Reference §2.4, worked example (ran e6 #24): `maxConcurrent 1`, budget 1000, holder 100,
/// queued w1 (800), w2 (100), w3 (100); budget lowered to 500; holder released →
/// w1 `budget_limit`, w2 ok, w3 ok after w2 releases.
#[test]
fn a_hand_off_runs_the_waiters_whole_decision_against_current_limits() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(8)
        .token_budget(1_000)
        .build()
        .unwrap();
    let holder = b.try_acquire(tokens(50, 50)).unwrap();
    let (tx, rx) = mpsc::channel();
    let w1 = waiter(&b, tokens(400, 400), wait(), tx.clone(), 1);
    until_pending(&b, 1);
    let w2 = waiter(&b, tokens(50, 50), wait(), tx.clone(), 2);
    until_pending(&b, 2);
    let w3 = waiter(&b, tokens(50, 50), wait(), tx.clone(), 3);
    until_pending(&b, 3);
    // Queued waiters hold nothing.
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 100);
    b.set_budget(500).unwrap();
    drop(holder);
    // One hand-off answers w1 (refused) and w2 (admitted); their threads report in any order.
    let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(1, Err(RejectReason::BudgetLimit)), (2, Ok(100))]);
    assert_eq!(b.stats().pending, 1);
    w2.1.send(()).unwrap();
    assert_eq!(rx.recv().unwrap(), (3, Ok(100)));
    w3.1.send(()).unwrap();
    for (h, _) in [w1, w2, w3] {
        h.join().unwrap();
    }
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
    assert_eq!(s.rejected_by_reason.get(RejectReason::BudgetLimit), 1);
}

#[test]
fn queue_bounds_and_fail_fast_reasons() {
    // Reference §2.3: max_queue 0 → concurrency_limit; a full queue → queue_limit; the kill
    // switch → concurrency_limit even with queue room; budget refusals are never queued.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .token_budget(100)
        .build()
        .unwrap();
    let holder = b.try_acquire(tokens(10, 10)).unwrap();
    let over = b.acquire_blocking(tokens(60, 60), wait()).unwrap_err();
    assert_eq!(
        (over.reason, over.detail().pending),
        (RejectReason::BudgetLimit, 0)
    );
    let (tx, rx) = mpsc::channel();
    let w = waiter(&b, tokens(10, 10), wait(), tx, 0);
    until_pending(&b, 1);
    let full = b.acquire_blocking(tokens(10, 10), wait()).unwrap_err();
    assert_eq!(
        (full.reason, full.detail().pending),
        (RejectReason::QueueLimit, 1)
    );
    drop(holder);
    assert_eq!(rx.recv().unwrap(), (0, Ok(20)));
    w.1.send(()).unwrap();
    w.0.join().unwrap();

    let none = Bulkhead::builder().max_concurrent(1).build().unwrap();
    let _h = none.try_acquire(Demand::slot()).unwrap();
    assert_eq!(
        none.acquire_blocking(Demand::slot(), wait())
            .unwrap_err()
            .reason,
        RejectReason::ConcurrencyLimit
    );
    let killed = Bulkhead::builder()
        .max_concurrent(0)
        .max_queue(5)
        .build()
        .unwrap();
    assert_eq!(
        killed
            .acquire_blocking(Demand::slot(), wait())
            .unwrap_err()
            .reason,
        RejectReason::ConcurrencyLimit
    );
}

#[test]
fn a_zero_timeout_leaves_the_queue_with_timeout_and_nothing_leaks() {
    let b = queued(1, 4);
    let holder = b.try_acquire(Demand::slot()).unwrap();
    let zero = WaitOptions {
        timeout: QueueTimeout::After(Duration::ZERO),
        ..wait()
    };
    let r = b.acquire_blocking(Demand::slot(), zero).unwrap_err();
    assert_eq!(r.reason, RejectReason::Timeout);
    assert_eq!(b.stats().pending, 0);
    // The flag went with the last waiter: the fast path admits again after the release.
    drop(holder);
    assert!(b.try_acquire(Demand::slot()).is_ok());
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
    assert_eq!(s.rejected_by_reason.get(RejectReason::Timeout), 1);
}

#[test]
fn cancellation_before_and_during_the_wait() {
    let b = queued(1, 4);
    // CONTRACT.md §9.2: an already-cancelled request is refused with `aborted`, even with a
    // free slot.
    let t = CancelToken::new();
    t.cancel();
    let pre = WaitOptions {
        cancel: Some(t),
        ..wait()
    };
    assert_eq!(
        b.acquire_blocking(Demand::slot(), pre).unwrap_err().reason,
        RejectReason::Aborted
    );
    assert_eq!(b.stats().in_flight, 0);

    let holder = b.try_acquire(Demand::slot()).unwrap();
    let token = CancelToken::new();
    let (tx, rx) = mpsc::channel();
    let w = waiter(
        &b,
        Demand::slot(),
        WaitOptions {
            cancel: Some(token.clone()),
            ..wait()
        },
        tx,
        0,
    );
    until_pending(&b, 1);
    token.cancel();
    assert_eq!(rx.recv().unwrap(), (0, Err(RejectReason::Aborted)));
    w.0.join().unwrap();
    assert_eq!(b.stats().pending, 0);
    drop(holder);
    let s = b.stats();
    assert_eq!((s.in_flight, s.admitted, s.released), (0, 1, 1));
}

#[test]
fn a_token_reused_for_many_waits_still_cancels_the_current_one() {
    let b = queued(1, 4);
    let token = CancelToken::new();
    let holder = b.try_acquire(Demand::slot()).unwrap();
    for _ in 0..3 {
        let zero = WaitOptions {
            timeout: QueueTimeout::After(Duration::ZERO),
            cancel: Some(token.clone()),
        };
        assert_eq!(
            b.acquire_blocking(Demand::slot(), zero).unwrap_err().reason,
            RejectReason::Timeout
        );
    }
    let (tx, rx) = mpsc::channel();
    let w = waiter(
        &b,
        Demand::slot(),
        WaitOptions {
            cancel: Some(token.clone()),
            ..wait()
        },
        tx,
        0,
    );
    until_pending(&b, 1);
    token.cancel();
    assert_eq!(rx.recv().unwrap(), (0, Err(RejectReason::Aborted)));
    w.0.join().unwrap();
    drop(holder);
    assert_eq!(b.stats().pending, 0);
}

#[test]
fn timed_acquire_reports_the_queue_wait_only_when_it_queued() {
    let b = queued(1, 2);
    let first = b.acquire_blocking_timed(Demand::slot(), wait());
    assert_eq!(first.timing.queue_wait_ns, 0);
    let held = first.value.unwrap();
    let b2 = b.clone();
    let t = thread::spawn(move || b2.acquire_blocking_timed(Demand::slot(), wait()));
    until_pending(&b, 1);
    drop(held);
    let second = t.join().unwrap();
    assert!(second.value.is_ok());
    assert!(second.timing.queue_wait_ns > 0, "it waited in the queue");
}

#[test]
fn close_answers_every_waiter_with_shutdown() {
    let b = queued(1, 4);
    let holder = b.try_acquire(Demand::slot()).unwrap();
    let (tx, rx) = mpsc::channel();
    let ws: Vec<_> = (0..3)
        .map(|i| {
            let w = waiter(&b, Demand::slot(), wait(), tx.clone(), i);
            until_pending(&b, i as u64 + 1);
            w
        })
        .collect();
    b.close();
    let mut got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(
        got,
        (0..3)
            .map(|i| (i, Err(RejectReason::Shutdown)))
            .collect::<Vec<_>>()
    );
    for (h, _) in ws {
        h.join().unwrap();
    }
    // In-flight work still releases; nothing else gets in.
    drop(holder);
    assert_eq!(
        b.acquire_blocking(Demand::slot(), wait())
            .unwrap_err()
            .reason,
        RejectReason::Shutdown
    );
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
}

#[test]
fn raising_max_concurrent_admits_waiters_at_once() {
    let b = queued(1, 4);
    let holder = b.try_acquire(Demand::slot()).unwrap();
    let (tx, rx) = mpsc::channel();
    let w1 = waiter(&b, Demand::slot(), wait(), tx.clone(), 1);
    until_pending(&b, 1);
    let w2 = waiter(&b, Demand::slot(), wait(), tx.clone(), 2);
    until_pending(&b, 2);
    b.apply_limits(b.limits().with_revision(1).with_max_concurrent(3))
        .unwrap();
    let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(1, Ok(0)), (2, Ok(0))]);
    assert_eq!(b.stats().in_flight, 3);
    for (h, go) in [w1, w2] {
        go.send(()).unwrap();
        h.join().unwrap();
    }
    drop(holder);
    assert_eq!(b.stats().in_flight, 0);
}

#[test]
fn lowering_max_concurrent_keeps_waiters_and_shrinks_by_attrition() {
    // Reference §2.4: maxConcurrent → 0 keeps existing waiters; they get in when capacity
    // returns.
    let b = queued(2, 4);
    let h1 = b.try_acquire(Demand::slot()).unwrap();
    let h2 = b.try_acquire(Demand::slot()).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = waiter(&b, Demand::slot(), wait(), tx, 0);
    until_pending(&b, 1);
    b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0))
        .unwrap();
    drop(h1); // slots 2 > 0: returned, not handed
    assert_eq!(b.stats().pending, 1);
    b.apply_limits(b.limits().with_revision(2).with_max_concurrent(2))
        .unwrap();
    assert_eq!(rx.recv().unwrap(), (0, Ok(0)));
    w.1.send(()).unwrap();
    w.0.join().unwrap();
    drop(h2);
    assert_eq!(b.stats().in_flight, 0);
}

mod asynchronous {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn an_async_waiter_gets_the_slot_on_any_executor() {
        let b = queued(1, 4);
        // futures-lite, not tokio.
        let held = futures_lite::future::block_on(b.acquire(Demand::slot(), wait())).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            futures_lite::future::block_on(b2.acquire(Demand::slot(), wait())).map(|a| a.revision())
        });
        until_pending(&b, 1);
        drop(held);
        assert_eq!(t.join().unwrap(), Ok(0));

        // tokio, current-thread and multi-thread.
        for multi in [false, true] {
            let rt = if multi {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .build()
                    .unwrap()
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
            };
            let b = b.clone();
            rt.block_on(async move {
                let held = b.acquire(Demand::slot(), wait()).await.unwrap();
                let b2 = b.clone();
                let task = tokio::spawn(async move {
                    b2.acquire(Demand::slot(), wait()).await.map(|a| a.held())
                });
                while b.stats().pending == 0 {
                    tokio::task::yield_now().await;
                }
                drop(held);
                assert_eq!(task.await.unwrap(), Ok(0));
            });
        }
        assert_eq!(b.stats().in_flight, 0);
    }

    #[test]
    fn dropping_a_queued_future_removes_its_waiter() {
        let b = queued(1, 4);
        let held = b.try_acquire(Demand::slot()).unwrap();
        {
            let mut f = pin!(b.acquire(Demand::slot(), wait()));
            assert!(poll_once(f.as_mut()).is_pending());
            assert_eq!(b.stats().pending, 1);
        }
        assert_eq!(b.stats().pending, 0);
        drop(held);
        assert!(
            b.try_acquire(Demand::slot()).is_ok(),
            "the flag went with it"
        );
        assert_eq!(b.stats().in_flight, 0);
    }

    #[test]
    fn a_future_dropped_after_its_grant_passes_the_slot_on() {
        let b = queued(1, 4);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let mut first = Box::pin(b.acquire(Demand::slot(), wait()));
        assert!(poll_once(first.as_mut()).is_pending());
        let mut second = Box::pin(b.acquire(Demand::slot(), wait()));
        assert!(poll_once(second.as_mut()).is_pending());
        drop(held); // handed to `first`, which is never polled again
        assert_eq!(b.stats().pending, 1);
        drop(first); // its slot passes to `second`
        match poll_once(second.as_mut()) {
            Poll::Ready(Ok(a)) => drop(a),
            other => panic!(
                "second should hold the slot: {:?}",
                other.map(|r| r.map(|a| a.id()))
            ),
        }
        assert_settled(&b, 3);
    }

    #[test]
    fn a_pre_cancelled_token_refuses_an_async_acquire() {
        let b = queued(1, 4);
        let t = CancelToken::new();
        t.cancel();
        let r: Rejection = futures_lite::future::block_on(b.acquire(
            Demand::slot(),
            WaitOptions {
                cancel: Some(t),
                ..wait()
            },
        ))
        .unwrap_err();
        assert_eq!(r.reason, RejectReason::Aborted);
    }
}

/// Many threads, few slots, a queue: every request ends admitted or refused, the limits are
/// never exceeded, and everything is back to zero at the end.
#[test]
fn a_saturated_bulkhead_with_a_queue_settles_everything() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let b = queued(2, 3);
    let tally = std::sync::Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let b = b.clone();
            let tally = tally.clone();
            thread::spawn(move || {
                let (mut ok, mut refused) = (0u64, 0u64);
                for j in 0..2_000 {
                    let options = WaitOptions {
                        timeout: if j % 7 == 0 {
                            QueueTimeout::After(Duration::ZERO)
                        } else {
                            QueueTimeout::Default
                        },
                        ..WaitOptions::default()
                    };
                    match b.acquire_blocking(Demand::slot(), options) {
                        Ok(a) => {
                            let now = tally.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 2, "thread {i}: {now} admissions in flight");
                            tally.fetch_sub(1, Ordering::SeqCst);
                            drop(a);
                            ok += 1;
                        }
                        Err(r) => {
                            assert!(
                                matches!(
                                    r.reason,
                                    RejectReason::QueueLimit | RejectReason::Timeout
                                ),
                                "{r:?}"
                            );
                            refused += 1;
                        }
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in threads {
        let (o, r) = t.join().unwrap();
        ok += o;
        refused += r;
    }
    assert_eq!(ok + refused, 12_000);
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
    assert_eq!((s.admitted, s.released, s.rejected), (ok, ok, refused));
}

mod drain_and_profiles {
    use super::*;
    use llm_bulkhead::{ClassLimits, DrainReport, Profile};

    #[test]
    fn drain_waits_for_in_flight_work_and_never_blocks_admissions() {
        let b = Bulkhead::builder().max_concurrent(2).build().unwrap();
        let a = b.try_acquire(Demand::slot()).unwrap();
        // Reference §8: a zero deadline on a busy bulkhead is a snapshot.
        let r = b.drain_blocking(Some(Duration::ZERO));
        assert_eq!((r.drained, r.in_flight, r.pending), (false, 1, 0));
        let b2 = b.clone();
        let (tx, rx) = mpsc::channel();
        let drainer = thread::spawn(move || {
            tx.send(()).unwrap();
            b2.drain_blocking(None)
        });
        rx.recv().unwrap();
        // drain does not close: new work is admitted (and released) meanwhile.
        drop(
            b.try_acquire(Demand::slot())
                .expect("drain does not block admissions"),
        );
        drop(a);
        let r: DrainReport = drainer.join().unwrap();
        assert_eq!((r.drained, r.in_flight, r.pending), (true, 0, 0));
        // The flag went with the drainer: the fast path admits again.
        assert!(b.try_acquire(Demand::slot()).is_ok());
    }

    #[test]
    fn drain_does_not_hang_when_the_last_waiter_times_out() {
        // CONTRACT.md §9.5 (the reference's BUG B8): after a kill switch the only outstanding
        // item is a waiter that leaves (here by cancellation); drain must complete.
        let b = queued(1, 2);
        let held = b.try_acquire(Demand::slot()).unwrap();
        let (tx, rx) = mpsc::channel();
        let token = CancelToken::new();
        let w = waiter(
            &b,
            Demand::slot(),
            WaitOptions {
                cancel: Some(token.clone()),
                ..wait()
            },
            tx,
            0,
        );
        until_pending(&b, 1);
        b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0))
            .unwrap();
        drop(held); // returned, not handed: max_concurrent is 0
        let b2 = b.clone();
        let drainer = thread::spawn(move || b2.drain_blocking(None));
        token.cancel();
        assert_eq!(rx.recv().unwrap(), (0, Err(RejectReason::Aborted)));
        w.0.join().unwrap();
        assert!(drainer.join().unwrap().drained);
    }

    #[test]
    fn async_drain_with_a_deadline_reports_and_cancels_nothing() {
        let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
        let a = b.try_acquire(Demand::slot()).unwrap();
        let r = futures_lite::future::block_on(b.drain(Some(Duration::from_millis(1))));
        assert_eq!((r.drained, r.in_flight), (false, 1));
        assert_eq!(b.stats().in_flight, 1, "drain cancels nothing");
        let b2 = b.clone();
        let t = thread::spawn(move || futures_lite::future::block_on(b2.drain(None)));
        drop(a);
        assert!(t.join().unwrap().drained);
    }

    #[test]
    fn a_classed_drain_completes() {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .class("a", ClassLimits::default())
            .default_class("a")
            .build()
            .unwrap();
        let a = b.try_acquire(Demand::slot()).unwrap();
        let b2 = b.clone();
        let t = thread::spawn(move || b2.drain_blocking(None));
        drop(a);
        assert!(t.join().unwrap().drained);
        assert!(b.try_acquire(Demand::slot()).is_ok());
    }

    #[test]
    fn async_timeouts_work_without_a_runtime() {
        let b = Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(2)
            .queue_timeout(Duration::from_millis(1))
            .build()
            .unwrap();
        let _held = b.try_acquire(Demand::slot()).unwrap();
        // The bulkhead's default timeout applies; the crate's timer thread wakes the future.
        let r = futures_lite::future::block_on(b.acquire(Demand::slot(), wait())).unwrap_err();
        assert_eq!(r.reason, RejectReason::Timeout);
        assert_eq!(b.stats().pending, 0);
    }

    #[test]
    fn profiles_set_the_queue_and_timeout_and_explicit_options_win() {
        let batch = Bulkhead::builder()
            .max_concurrent(1)
            .profile(Profile::Batch)
            .build()
            .unwrap();
        assert_eq!(batch.limits().max_queue, 20);
        assert_eq!(batch.default_queue_timeout(), Some(Duration::from_secs(30)));
        let interactive = Bulkhead::builder()
            .max_concurrent(1)
            .profile(Profile::Interactive)
            .build()
            .unwrap();
        let _h = interactive.try_acquire(Demand::slot()).unwrap();
        assert_eq!(
            interactive
                .acquire_blocking(Demand::slot(), wait())
                .unwrap_err()
                .reason,
            RejectReason::ConcurrencyLimit
        );
        let custom = Bulkhead::builder()
            .queue_timeout(Duration::from_secs(2))
            .profile(Profile::Batch)
            .max_queue(5)
            .max_concurrent(1)
            .build()
            .unwrap();
        assert_eq!(
            (custom.limits().max_queue, custom.default_queue_timeout()),
            (5, Some(Duration::from_secs(2)))
        );
    }
}
