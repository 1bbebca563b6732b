//! `run` beyond the reference's numbered cases: the borrowed-concurrency deadline (reference
//! §6.2, driven by a manual trigger so that no test sleeps or measures time), panics, cancel
//! safety of the async `run`, advisory answers with classes, and the property that `estimate`
//! is what `run` reserves.
#![cfg(feature = "llm")]

use futures_lite::future;
use llm_bulkhead::llm::{
    Deadline, DeadlineTrigger, EstimateError, LlmBulkhead, LlmRequest, ModelAwareEstimator,
    ReservationOverride, RunError, RunOptions, TokenEstimator,
};
use llm_bulkhead::{
    AbandonCause, Bulkhead, ClassLimits, Event, RejectReason, Reservation, Usage, WaitOptions,
};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

fn fixed(input: u64, output: u64) -> impl TokenEstimator {
    move |_: &LlmRequest| Ok(Reservation::new(input, output).unwrap())
}

fn req() -> LlmRequest {
    LlmRequest::new("m", &["hello"])
}

/// mc2, B1000; class "batch" has no floor (every slot borrowed), "interactive" a floor of 1.
fn classed() -> LlmBulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(1_000)
        .class("batch", ClassLimits::default())
        .class(
            "interactive",
            ClassLimits {
                protected_concurrent: 1,
                ..ClassLimits::default()
            },
        )
        .default_class("batch")
        .build()
        .unwrap();
    LlmBulkhead::new(b, fixed(100, 200))
}

fn manual(trigger: &DeadlineTrigger) -> RunOptions {
    RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        ..RunOptions::default()
    }
}

fn assert_idle(llm: &LlmBulkhead) {
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admissions_in_flight, s.pending), (0, 0, 0));
    assert_eq!(s.admitted, s.released);
    if let Some(t) = s.token_budget {
        assert_eq!(t.in_flight_tokens, 0);
    }
}

#[test]
fn deadline_abandons_the_borrowed_slot_and_keeps_tokens_until_the_work_ends() {
    let llm = classed();
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let l = log.clone();
    let _sub = llm
        .bulkhead()
        .subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    let trigger = DeadlineTrigger::new();
    let options = manual(&trigger).with_usage(|u: &Usage| Some(*u));
    let r = llm.run_blocking(&req(), options, |ctx| {
        assert!(ctx.resources().borrowed_concurrency);
        assert!(!ctx.stop_requested());
        trigger.fire();
        assert!(ctx.stop_requested());
        let s = llm.bulkhead().stats();
        // The slot is back, the admission and its tokens are not (reference §6.1/§6.2).
        assert_eq!((s.in_flight, s.admissions_in_flight), (0, 1));
        assert_eq!(s.token_budget.unwrap().in_flight_tokens, 300);
        assert_eq!(s.borrowed_concurrency_abandoned_by_cause.deadline, 1);
        // Usage reports still work while the work finishes.
        ctx.report_usage(Usage::new(100, 20)).unwrap();
        Ok::<_, ()>(Usage::new(100, 50))
    });
    let e = match r {
        Err(RunError::Deadline(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.deadline, None);
    assert!(e.resources.borrowed_concurrency);
    assert_idle(&llm);
    let s = llm.bulkhead().stats();
    assert_eq!(s.token_budget.unwrap().total_consumed, 150);
    assert_eq!(
        (
            s.borrowed_concurrency_abandoned_by_cause.manual,
            s.borrowed_concurrency_abandoned_by_cause.deadline
        ),
        (0, 1)
    );
    let events = log.lock().unwrap().clone();
    let names: Vec<_> = events.iter().map(Event::name).collect();
    assert_eq!(
        names,
        ["admit", "borrowed_concurrency_abandon", "usage", "release"]
    );
    match &events[1] {
        Event::BorrowedConcurrencyAbandon(a) => {
            assert_eq!(a.cause, AbandonCause::Deadline);
            assert_eq!(a.held_tokens, 300);
        }
        other => panic!("{other:?}"),
    }
    // A second fire does nothing.
    trigger.fire();
    assert_idle(&llm);
}

#[test]
fn deadline_is_ignored_for_a_protected_slot() {
    let llm = classed();
    let trigger = DeadlineTrigger::new();
    let options = RunOptions {
        class: Some(llm.bulkhead().class_id("interactive").unwrap()),
        ..manual(&trigger)
    };
    let r = llm.run_blocking(&req(), options, |ctx| {
        assert!(!ctx.resources().borrowed_concurrency);
        trigger.fire();
        assert!(!ctx.stop_requested());
        Ok::<_, ()>("done")
    });
    assert_eq!(r.unwrap(), "done");
    assert_eq!(
        llm.bulkhead()
            .stats()
            .borrowed_concurrency_abandoned_by_cause
            .deadline,
        0
    );
    assert_idle(&llm);
}

#[test]
fn deadline_after_a_manual_abandonment_does_nothing() {
    // Reference e9 #44: the deadline finds the slot already abandoned; the caller gets the
    // work's own answer.
    let llm = classed();
    let trigger = DeadlineTrigger::new();
    let r = llm.run_blocking(&req(), manual(&trigger), |ctx| {
        assert!(ctx.abandon_borrowed_concurrency());
        trigger.fire();
        assert!(!ctx.stop_requested());
        Err::<(), _>("provider error")
    });
    assert!(matches!(r, Err(RunError::Work("provider error"))));
    let c = llm
        .bulkhead()
        .stats()
        .borrowed_concurrency_abandoned_by_cause;
    assert_eq!((c.manual, c.deadline), (1, 0));
    assert_idle(&llm);
}

#[test]
fn a_trigger_fired_before_admission_expires_at_admission() {
    let llm = classed();
    let trigger = DeadlineTrigger::new();
    trigger.fire();
    let r = llm.run_blocking(&req(), manual(&trigger), |ctx| {
        assert!(ctx.stop_requested());
        assert_eq!(llm.bulkhead().stats().in_flight, 0);
        Err::<(), _>("stopped early")
    });
    // The deadline wins over the work's own error.
    assert!(matches!(r, Err(RunError::Deadline(_))));
    assert_idle(&llm);
}

#[test]
fn a_clock_deadline_fires_on_the_timer_thread() {
    // No duration is asserted: the work waits for the stop signal, however long it takes.
    let llm = classed();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::After(Duration::from_millis(1))),
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&req(), options, |ctx| {
        while !ctx.stop_requested() {
            std::thread::yield_now();
        }
        Ok::<_, ()>(())
    });
    match r {
        Err(RunError::Deadline(e)) => assert_eq!(e.deadline, Some(Duration::from_millis(1))),
        other => panic!("{other:?}"),
    }
    assert_idle(&llm);
}

#[test]
fn a_clock_deadline_that_does_not_expire_is_disarmed() {
    let llm = classed();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::After(Duration::from_secs(3_600))),
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&req(), options, |ctx| {
        assert!(!ctx.stop_requested());
        Ok::<_, ()>(7)
    });
    assert_eq!(r.unwrap(), 7);
    assert_idle(&llm);
}

#[test]
fn invalid_deadlines_are_refused_before_anything_changes() {
    let llm = classed();
    for d in [Duration::ZERO, Duration::MAX] {
        let options = RunOptions {
            borrowed_concurrency_deadline: Some(Deadline::After(d)),
            ..RunOptions::default()
        };
        match llm.run_blocking(&req(), options, |_| Ok::<_, ()>(())) {
            Err(RunError::Invalid(EstimateError::InvalidSetting { field, .. })) => {
                assert_eq!(field, "borrowed_concurrency_deadline")
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(llm.bulkhead().stats().admitted, 0);
}

#[test]
fn async_work_stops_when_the_deadline_fires_from_another_thread() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let llm = Arc::new(classed());
    let trigger = DeadlineTrigger::new();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let llm = llm.clone();
        let options = manual(&trigger);
        rt.spawn(async move {
            llm.run(&req(), options, async move |ctx| {
                started_tx.send(()).unwrap();
                // The "provider call" never ends by itself; the stop signal ends it.
                future::or(future::pending::<()>(), ctx.stopped()).await;
                Ok::<_, ()>(())
            })
            .await
        })
    };
    rt.block_on(started_rx).unwrap();
    trigger.fire();
    let r = rt.block_on(task).unwrap();
    assert!(matches!(r, Err(RunError::Deadline(_))));
    assert_idle(&llm);
}

#[test]
fn a_panicking_work_leaks_nothing() {
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(1_000)
            .build()
            .unwrap(),
        fixed(100, 100),
    );
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = llm.run_blocking(&req(), RunOptions::default(), |ctx| {
            ctx.report_usage(Usage::new(10, 10)).unwrap();
            panic!("work bug");
            #[allow(unreachable_code)]
            Ok::<_, ()>(())
        });
    }));
    assert!(r.is_err());
    assert_idle(&llm);
    // The last report was used for the release.
    assert_eq!(
        llm.bulkhead().stats().token_budget.unwrap().total_consumed,
        20
    );

    // With an armed deadline lease, too; a later fire finds nothing.
    let llm = classed();
    let trigger = DeadlineTrigger::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = llm.run_blocking(&req(), manual(&trigger), |_| -> Result<(), ()> {
            panic!("work bug")
        });
    }));
    assert!(r.is_err());
    trigger.fire();
    assert_idle(&llm);
    assert_eq!(
        llm.bulkhead()
            .stats()
            .borrowed_concurrency_abandoned_by_cause
            .deadline,
        0
    );
}

#[test]
fn a_panicking_async_work_leaks_nothing() {
    let llm = classed();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        future::block_on(
            llm.run(&req(), RunOptions::default(), async |_| -> Result<(), ()> {
                panic!("async work bug")
            }),
        )
    }));
    assert!(r.is_err());
    assert_idle(&llm);
}

fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn dropping_the_run_future_while_the_work_runs_releases() {
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(1_000)
            .build()
            .unwrap(),
        fixed(100, 100),
    );
    {
        let fut = llm.run(&req(), RunOptions::default(), async |ctx| {
            ctx.report_usage(Usage::new(10, 5)).unwrap();
            future::pending::<()>().await;
            Ok::<_, ()>(())
        });
        let mut fut = std::pin::pin!(fut);
        assert!(poll_once(fut.as_mut()).is_pending());
        let s = llm.bulkhead().stats();
        assert_eq!(s.in_flight, 1);
        assert_eq!(s.token_budget.unwrap().in_flight_tokens, 110); // 10 + max(100, 5)
    }
    assert_idle(&llm);
    assert_eq!(
        llm.bulkhead().stats().token_budget.unwrap().total_consumed,
        15
    );
}

#[test]
fn dropping_the_run_future_while_queued_leaks_nothing() {
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(4)
            .build()
            .unwrap(),
        fixed(1, 1),
    );
    llm.run_blocking(&req(), RunOptions::default(), |_| {
        {
            let fut = llm.run(&req(), RunOptions::default(), async |_| Ok::<_, ()>(()));
            let mut fut = std::pin::pin!(fut);
            assert!(poll_once(fut.as_mut()).is_pending());
            assert_eq!(llm.bulkhead().stats().pending, 1);
        }
        assert_eq!(llm.bulkhead().stats().pending, 0);
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_idle(&llm);
}

#[test]
fn async_run_queues_and_is_answered_on_tokio() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let llm = Arc::new(LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(8)
            .build()
            .unwrap(),
        fixed(1, 1),
    ));
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let llm = llm.clone();
                tokio::spawn(async move {
                    llm.run(&req(), RunOptions::default(), async move |_| {
                        tokio::task::yield_now().await;
                        Ok::<_, ()>(i)
                    })
                    .await
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    // With 1 slot and 8 queue places nobody is refused.
    assert_eq!(
        results.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert_idle(&llm);
}

#[test]
fn cancelled_wait_is_aborted() {
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), fixed(1, 1));
    let cancel = llm_bulkhead::CancelToken::new();
    cancel.cancel();
    let options = RunOptions {
        wait: WaitOptions {
            cancel: Some(cancel),
            ..WaitOptions::default()
        },
        ..RunOptions::default()
    };
    match llm.run_blocking(&req(), options, |_| Ok::<_, ()>(())) {
        Err(RunError::Rejected(r)) => assert_eq!(r.reason, RejectReason::Aborted),
        other => panic!("{other:?}"),
    }
}

#[test]
fn would_admit_with_classes_names_the_constraint() {
    // mc2 with "interactive" floor 1: one batch run holds the only shared slot; another batch
    // would be refused for protection, an interactive one admitted.
    let llm = classed();
    llm.run_blocking(&req(), RunOptions::default(), |_| {
        let batch = llm.would_admit(&req(), &RunOptions::default()).unwrap();
        match &batch {
            llm_bulkhead::Advice::Refuse(r) => {
                assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
                assert_eq!(
                    r.constraint,
                    Some(llm_bulkhead::Constraint::AdmissionClassProtection)
                );
                assert!(r.detail().classes.is_some());
            }
            other => panic!("{other:?}"),
        }
        // The real decision agrees.
        match llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())) {
            Err(RunError::Rejected(r)) => assert_eq!(Some(r.reason), batch.reason()),
            other => panic!("{other:?}"),
        }
        let interactive = RunOptions {
            class: Some(llm.bulkhead().class_id("interactive").unwrap()),
            ..RunOptions::default()
        };
        assert!(llm.would_admit(&req(), &interactive).unwrap().admits());
        Ok::<_, ()>(())
    })
    .unwrap();
}

fn request_strategy() -> impl Strategy<Value = LlmRequest> {
    (
        prop::sample::select(vec!["gpt-4o", "claude-sonnet-4-5", "unknown", "o1-mini"]),
        "[a-zé😀 ]{0,300}",
        prop::option::of(0u64..5_000),
        prop::option::of(0u64..1_000),
    )
        .prop_map(|(model, text, max_tokens, extra)| {
            let mut r = LlmRequest::new(model, &[&text]);
            r.max_tokens = max_tokens;
            r.extra_input_tokens = extra;
            r
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn estimate_is_what_run_reserves(
        request in request_strategy(),
        high in any::<bool>(),
        over in prop::option::of((0u64..10_000, 0u64..10_000, any::<bool>())),
        with_budget in any::<bool>(),
    ) {
        let mut builder = Bulkhead::builder().max_concurrent(4);
        if with_budget {
            builder = builder.token_budget(1_000_000);
        }
        let llm = LlmBulkhead::new(builder.build().unwrap(), ModelAwareEstimator::default());
        let options = RunOptions {
            priority: if high { llm_bulkhead::Priority::High } else { llm_bulkhead::Priority::Normal },
            reservation: over.map(|(input, max_output, consistent)| ReservationOverride {
                input,
                max_output,
                reserved: consistent.then_some(input + max_output),
            }),
            ..RunOptions::default()
        };
        let preview = llm.estimate(&request, &options).unwrap();
        let async_options = options.clone();
        let reserved = llm
            .run_blocking(&request, options, |ctx| Ok::<_, ()>(ctx.reservation()))
            .unwrap();
        prop_assert_eq!(preview, reserved);
        let reserved = future::block_on(
            llm.run(&request, async_options, async |ctx| Ok::<_, ()>(ctx.reservation())),
        )
        .unwrap();
        prop_assert_eq!(preview, reserved);
        prop_assert_eq!(preview.is_some(), with_budget);
        prop_assert_eq!(llm.bulkhead().stats().in_flight, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Single-threaded, `would_admit` predicts `try_acquire` exactly: the same answer, and for
    /// a refusal the same rejection (reason, revision and capacity detail); and it changes
    /// nothing (the counters move only with the real decisions).
    #[test]
    fn would_admit_predicts_try_acquire(
        ops in prop::collection::vec((0u64..600, any::<bool>(), any::<bool>()), 1..40),
        mc in 0u32..4,
        reserve in 0u64..500,
    ) {
        let b = Bulkhead::builder()
            .max_concurrent(mc)
            .token_budget(1_000)
            .high_priority_reserve(reserve)
            .build()
            .unwrap();
        let mut held = Vec::new();
        for (tokens, high, release_first) in ops {
            if release_first && !held.is_empty() {
                drop(held.remove(0));
            }
            let d = llm_bulkhead::Demand::tokens(Reservation::new(tokens, 1).unwrap())
                .with_priority(if high { llm_bulkhead::Priority::High } else { llm_bulkhead::Priority::Normal });
            let before = b.stats();
            let advice = b.would_admit(&d);
            prop_assert_eq!(b.stats(), before);
            match (advice, b.try_acquire(d)) {
                (llm_bulkhead::Advice::Admit { would_queue, .. }, Ok(a)) => {
                    prop_assert!(!would_queue);
                    held.push(a);
                }
                (llm_bulkhead::Advice::Refuse(expected), Err(actual)) => {
                    prop_assert_eq!(expected, actual);
                }
                (advice, actual) => prop_assert!(false, "{:?} vs {:?}", advice, actual),
            }
        }
    }
}

/// Deadlines fired from another thread race with the works' own completion: whichever wins,
/// a run answers `Deadline` exactly when its slot was abandoned with cause `deadline`, and
/// nothing leaks.
#[test]
fn deadlines_racing_completion_stay_consistent() {
    let llm = classed();
    let (tx, rx) = std::sync::mpsc::channel::<DeadlineTrigger>();
    let deadline_errors = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        let firer = s.spawn(move || {
            for t in rx {
                t.fire();
            }
        });
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (llm, tx, errors) = (&llm, tx.clone(), &deadline_errors);
                s.spawn(move || {
                    for i in 0..300u64 {
                        let trigger = DeadlineTrigger::new();
                        let options = manual(&trigger).with_usage(|u: &Usage| Some(*u));
                        let fired_inside = std::cell::Cell::new(false);
                        let r = llm.run_blocking(&req(), options, |ctx| {
                            match (i + w) % 3 {
                                0 => {
                                    trigger.fire();
                                    fired_inside.set(true);
                                }
                                1 => tx.send(trigger.clone()).unwrap(),
                                _ => {}
                            }
                            ctx.report_usage(Usage::new(10, i % 50)).unwrap();
                            Ok::<_, ()>(Usage::new(10, i % 70))
                        });
                        if fired_inside.get() {
                            assert!(matches!(r, Err(RunError::Deadline(_))), "{r:?}");
                        }
                        match r {
                            Ok(_) => {}
                            Err(RunError::Deadline(_)) => {
                                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(RunError::Rejected(rej)) => {
                                // "batch" has one shared slot (the other is
                                // "interactive"'s floor): the workers compete for it.
                                assert_eq!(rej.reason, RejectReason::ConcurrencyLimit);
                            }
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        drop(tx);
        firer.join().unwrap();
    });
    assert_idle(&llm);
    let s = llm.bulkhead().stats();
    assert_eq!(
        s.borrowed_concurrency_abandoned_by_cause.deadline,
        deadline_errors.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(s.borrowed_concurrency_abandoned_by_cause.deadline > 0);
}

/// Decision timing reaches the admit event of `run_blocking`'s fast decision too, when a
/// subscriber asks for it (`Interest::DECISION_TIMING`), and not otherwise.
#[test]
fn run_admit_events_carry_decision_timing_when_asked() {
    use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunOptions};
    use llm_bulkhead::{Bulkhead, Event, Interest, Reservation};
    use std::sync::{Arc, Mutex};
    for asked in [false, true] {
        let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let mut interest = Interest::ADMIT;
        if asked {
            interest = interest | Interest::DECISION_TIMING;
        }
        let _sub = b.subscribe_to(interest, move |e: &Event| {
            if let Event::Admit(a) = e {
                s.lock().unwrap().push(a.timing);
            }
        });
        let llm = LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(1, 1).unwrap()));
        llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| {
            Ok::<_, ()>(())
        })
        .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].is_some(), asked);
        if let Some(t) = seen[0] {
            assert_eq!(t.queue_wait_ns, 0);
        }
    }
}
