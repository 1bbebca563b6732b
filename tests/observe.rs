//! Observe (shadow) mode of `LlmBulkhead::run`: every case of the reference's
//! `observe_mode.test.ts` (#1–#8) with its numbers, the observe part of
//! `admission_classes.test.ts` #9, the ran cases of async-bulkhead-llm-behaviour.md §9.4
//! (e7 #34: observe mode waits in the queue), and what the contract adds: shutdown and
//! cancellation are never bypassed, bypassed work never touches capacity (also when it panics
//! or its future is dropped), and the bypass events carry their fields.
//!
//! The reference's fixture `budgeted(B)`: mc1, est 5/5 (= 10). No test sleeps: queue timeouts
//! are zero, async runs are polled by hand with a no-op waker where the order matters.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    AdmissionKind, LlmBulkhead, LlmEvent, LlmRequest, Mode, ModeError, ObserveStats, RunError,
    RunOptions, ShadowReasons,
};
use llm_bulkhead::{
    Bulkhead, CancelToken, ClassLimits, Constraint, Demand, Event, QueueTimeout, Reconcile,
    RejectCounts, RejectReason, Reservation, Usage, UsageError, WaitOptions,
};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Counts with the given ones set (`RejectCounts` is `#[non_exhaustive]`: no literal outside
/// the crate).
fn counts(set: impl FnOnce(&mut RejectCounts)) -> RejectCounts {
    let mut c = RejectCounts::default();
    set(&mut c);
    c
}

/// The reference fixture `budgeted(B)`: mc1, est 5/5.
fn budgeted(budget: u64) -> LlmBulkhead {
    LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(budget)
            .build()
            .unwrap(),
        |_: &LlmRequest| Ok(Reservation::new(5, 5).unwrap()),
    )
}

fn req() -> LlmRequest {
    LlmRequest::new("gpt-4o", &["hello"])
}

fn observe() -> RunOptions {
    RunOptions {
        mode: Mode::observe(),
        ..RunOptions::default()
    }
}

fn zero_timeout() -> WaitOptions {
    WaitOptions {
        timeout: QueueTimeout::After(Duration::ZERO),
        cancel: None,
    }
}

/// Every event of `b` from now on.
fn record(b: &Bulkhead) -> (Arc<Mutex<Vec<Event>>>, llm_bulkhead::Subscription) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = Arc::clone(&log);
    let sub = b.subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    (log, sub)
}

fn names(log: &Mutex<Vec<Event>>) -> Vec<&'static str> {
    log.lock().unwrap().iter().map(Event::name).collect()
}

fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Capacity accounting is at rest: no slot, no token, no waiter, no bypass running.
fn at_rest(llm: &LlmBulkhead) {
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admissions_in_flight, s.pending), (0, 0, 0));
    if let Some(t) = s.token_budget {
        assert_eq!(t.in_flight_tokens, 0);
    }
    if let Some(o) = llm.stats().observe {
        assert_eq!(o.in_flight, 0);
    }
}

fn rejected<R: std::fmt::Debug, E: std::fmt::Debug>(
    r: Result<R, RunError<E>>,
) -> llm_bulkhead::Rejection {
    match r {
        Err(RunError::Rejected(rej)) => rej,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

// ---- observe_mode.test.ts ----

#[test]
fn t1_bypasses_a_budget_rejection_and_records_usage_without_holding_capacity() {
    // #1: B0 → ctx {bypassed, budget_limit, reservation {5,5,10}}, id /^shadow-/,
    // bypassDetail.tokenBudget {budget 0, requested 10}; reportUsage({3,2}) → {sequence 1,
    // held 0, consumed 5, outputRemaining 3}; returns "proxied"; stats as below; one bypass
    // {budget_limit, raced false}, one bypassUsage {1, {3,2}}, one bypassRelease {1, {3,2}}.
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    let out = llm.run_blocking(&req(), observe(), |ctx| {
        assert_eq!(ctx.admission_kind(), AdmissionKind::Bypassed);
        assert_eq!(ctx.bypass_reason(), Some(RejectReason::BudgetLimit));
        assert_eq!(ctx.bypass_raced(), Some(false));
        let r = ctx.reservation().unwrap();
        assert_eq!((r.input(), r.max_output(), r.total()), (5, 5, 10));
        assert!(ctx.admission_id().is_shadow());
        assert!(ctx.admission_id().to_string().starts_with("shadow-"));
        let t = ctx.bypass_detail().unwrap().detail().token_budget.unwrap();
        assert_eq!((t.budget, t.requested), (0, 10));
        let u = ctx.report_usage(Usage::new(3, 2)).unwrap();
        assert_eq!(
            (u.sequence, u.held, u.consumed, u.output_remaining),
            (1, 0, 5, Some(3))
        );
        // The report carries the shadow id, displayed as the reference's `"shadow-" + uuid`.
        assert_eq!(u.admission_id, ctx.admission_id());
        assert_eq!(u.admission_id.to_string(), ctx.admission_id().to_string());
        assert!(u.admission_id.to_string().starts_with("shadow-"));
        assert_eq!(ctx.held(), 0);
        Ok::<_, ()>("proxied")
    });
    assert_eq!(out.unwrap(), "proxied");
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
    assert_eq!((s.admitted, s.released, s.rejected), (0, 0, 0));
    let t = s.token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.total_reserved), (0, 0));
    let o: ObserveStats = llm.stats().observe.unwrap();
    assert_eq!(
        (
            o.bypassed,
            o.race_bypassed,
            o.bypassed_by_reason,
            o.in_flight,
            o.usage_reported,
            o.total_input_tokens,
            o.total_output_tokens
        ),
        (1, 0, counts(|c| c.budget_limit = 1), 0, 1, 3, 2)
    );
    assert_eq!(names(&log), ["bypass", "bypass_usage", "bypass_release"]);
    let log = log.lock().unwrap().clone();
    let Some(LlmEvent::Bypass(b)) = LlmEvent::of(&log[0]) else {
        panic!()
    };
    assert_eq!((b.reason, b.raced), (RejectReason::BudgetLimit, false));
    let Some(LlmEvent::BypassUsage(u)) = LlmEvent::of(&log[1]) else {
        panic!()
    };
    assert_eq!((u.sequence, u.usage), (1, Usage::new(3, 2)));
    let Some(LlmEvent::BypassRelease(r)) = LlmEvent::of(&log[2]) else {
        panic!()
    };
    assert_eq!((r.usage_sequence, r.usage), (1, Some(Usage::new(3, 2))));
    assert_eq!(
        (b.admission_id, u.admission_id),
        (r.admission_id, r.admission_id)
    );
}

#[test]
fn t2_marks_normally_admitted_observe_mode_callbacks_as_admitted() {
    // #2: B100 → ctx {admitted, no bypass reason}; observe undefined; admitted 1, released 1.
    let llm = budgeted(100);
    llm.run_blocking(&req(), observe(), |ctx| {
        assert_eq!(ctx.admission_kind(), AdmissionKind::Admitted);
        assert_eq!(ctx.bypass_reason(), None);
        assert!(ctx.bypass_detail().is_none());
        assert!(!ctx.admission_id().is_shadow());
        Ok::<_, ()>(())
    })
    .unwrap();
    let s = llm.bulkhead().stats();
    assert_eq!(llm.stats().observe, None);
    assert_eq!((s.admitted, s.released), (1, 1));
}

#[test]
fn t3_does_not_bypass_shutdown() {
    // #3: B0 + close → rejects shutdown; callback not called; observe undefined. The reference
    // also counts budget_limit first (its B2); here shutdown is decided first (CONTRACT §9.1),
    // so it is the only refusal counted.
    let llm = budgeted(0);
    llm.bulkhead().close();
    let rej = rejected(llm.run_blocking(&req(), observe(), |_| -> Result<(), ()> {
        panic!("the callback must not run")
    }));
    assert_eq!(rej.reason, RejectReason::Shutdown);
    let s = llm.bulkhead().stats();
    assert_eq!(llm.stats().observe, None);
    assert_eq!(s.rejected_by_reason, counts(|c| c.shutdown = 1));
}

#[test]
fn t4_does_not_bypass_an_already_aborted_signal_even_when_budget_is_exhausted() {
    // #4: B0 + pre-aborted signal → rejects aborted; callback not called; observe undefined;
    // rejectedByReason.aborted 1 (the advisory budget_limit is not counted).
    let llm = budgeted(0);
    let token = CancelToken::new();
    token.cancel();
    let options = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::Default,
            cancel: Some(token),
        },
        ..observe()
    };
    let (log, _sub) = record(llm.bulkhead());
    let rej = rejected(llm.run_blocking(&req(), options, |_| -> Result<(), ()> {
        panic!("the callback must not run")
    }));
    assert_eq!(rej.reason, RejectReason::Aborted);
    let s = llm.bulkhead().stats();
    assert_eq!(llm.stats().observe, None);
    assert_eq!(s.rejected_by_reason, counts(|c| c.aborted = 1));
    // The hard refusal is reported with its detail.
    assert_eq!(names(&log), ["reject"]);
    let Event::Reject(r) = &log.lock().unwrap()[0] else {
        panic!()
    };
    assert_eq!(r.rejection.reason, RejectReason::Aborted);
    assert_eq!(r.rejection.detail().token_budget.unwrap().requested, 10);
}

#[test]
fn t5_honours_a_restricted_shadow_reasons_list() {
    // #5: B0, shadowReasons ["concurrency_limit"] → rejects; callback not called; observe
    // undefined; rejectedByReason.budget_limit 1.
    let llm = budgeted(0);
    let options = RunOptions {
        mode: Mode::Observe(ShadowReasons::new([RejectReason::ConcurrencyLimit]).unwrap()),
        ..RunOptions::default()
    };
    let rej = rejected(llm.run_blocking(&req(), options, |_| -> Result<(), ()> {
        panic!("the callback must not run")
    }));
    assert_eq!(rej.reason, RejectReason::BudgetLimit);
    let s = llm.bulkhead().stats();
    assert_eq!(llm.stats().observe, None);
    assert_eq!(s.rejected_by_reason.budget_limit, 1);
    assert_eq!(s.rejected, 1);
}

/// The reference's #6 setup: mc1 mq1, no budget, one slot held.
fn queueing() -> (LlmBulkhead, llm_bulkhead::Admission) {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .build()
        .unwrap();
    let held = b.try_acquire(Demand::slot()).unwrap();
    (LlmBulkhead::new(b, llm_bulkhead::llm::NaiveEstimator), held)
}

fn assert_timeout_race(llm: &LlmBulkhead) {
    let s = llm.bulkhead().stats();
    let o = llm.stats().observe.unwrap();
    assert_eq!((o.bypassed, o.race_bypassed), (1, 1));
    assert_eq!(o.bypassed_by_reason, counts(|c| c.timeout = 1));
    assert_eq!(s.rejected_by_reason.timeout, 1);
    assert_eq!((s.in_flight, s.pending, s.admitted), (1, 0, 1)); // only the held slot
}

#[test]
fn t6_bypasses_a_queue_timeout_race_after_an_advisory_positive_decision() {
    // #6: mc1 mq1 no budget, one held; observe with a timeout → ctx {bypassed, timeout},
    // returns "after-timeout"; observe {bypassed 1, raceBypassed 1, {timeout 1}};
    // llm.rejectedByReason.timeout 1. The reference waits 5 ms; a zero timeout times out as
    // soon as the waiter is queued.
    let (llm, held) = queueing();
    let options = RunOptions {
        wait: zero_timeout(),
        ..observe()
    };
    let out = llm.run_blocking(&req(), options, |ctx| {
        assert_eq!(ctx.admission_kind(), AdmissionKind::Bypassed);
        assert_eq!(ctx.bypass_reason(), Some(RejectReason::Timeout));
        assert_eq!(ctx.bypass_raced(), Some(true));
        Ok::<_, ()>("after-timeout")
    });
    assert_eq!(out.unwrap(), "after-timeout");
    assert_timeout_race(&llm);
    drop(held);
    at_rest(&llm);
}

#[test]
fn t6_async_bypasses_a_queue_timeout_race() {
    // #6 with the async run (the crate's timer thread fires the zero timeout).
    let (llm, held) = queueing();
    let options = RunOptions {
        wait: zero_timeout(),
        ..observe()
    };
    let out = futures_lite::future::block_on(llm.run(&req(), options, async |ctx| {
        assert_eq!(ctx.bypass_reason(), Some(RejectReason::Timeout));
        Ok::<_, ()>("after-timeout")
    }));
    assert_eq!(out.unwrap(), "after-timeout");
    assert_timeout_race(&llm);
    drop(held);
    at_rest(&llm);
}

#[test]
fn t7_retains_reported_usage_when_bypassed_work_throws() {
    // #7: B0; fn reports {7,4} then throws "upstream failed" → rejects with it; observe
    // {usageReported 1, totalInputTokens 7, totalOutputTokens 4}; bypassRelease usage {7,4}.
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    let r = llm.run_blocking(&req(), observe(), |ctx| {
        ctx.report_usage(Usage::new(7, 4)).unwrap();
        Err::<(), _>("upstream failed")
    });
    assert!(matches!(r, Err(RunError::Work("upstream failed"))));
    let o = llm.stats().observe.unwrap();
    assert_eq!(
        (
            o.usage_reported,
            o.total_input_tokens,
            o.total_output_tokens
        ),
        (1, 7, 4)
    );
    let log = log.lock().unwrap().clone();
    let Some(LlmEvent::BypassRelease(r)) = log.last().and_then(LlmEvent::of) else {
        panic!("{log:?}")
    };
    assert_eq!(r.usage, Some(Usage::new(7, 4)));
    at_rest(&llm);
}

#[test]
fn t8_rejects_invalid_observe_mode_options() {
    // #8: mode "invalid" → /mode must be/; shadowReasons ["shutdown"] → /shadowReasons may
    // contain only/. Here the mode is typed; the names are parsed (configuration files).
    let e = "invalid".parse::<Mode>().unwrap_err();
    assert_eq!(e, ModeError::UnknownMode("invalid".into()));
    assert!(e.to_string().starts_with("mode must be"), "{e}");
    let e = "shutdown".parse::<ShadowReasons>().unwrap_err();
    assert!(
        e.to_string().starts_with("shadow_reasons may contain only"),
        "{e}"
    );
    for reason in [RejectReason::Shutdown, RejectReason::Aborted] {
        assert_eq!(
            ShadowReasons::new([RejectReason::Timeout, reason]),
            Err(ModeError::NotShadowable(reason.as_str().into()))
        );
    }
    assert!("budget_limit, nonsense".parse::<ShadowReasons>().is_err());
    assert_eq!("enforce".parse::<Mode>(), Ok(Mode::Enforce));
    assert_eq!(
        "queue_limit,timeout".parse::<ShadowReasons>().unwrap(),
        ShadowReasons::new([RejectReason::QueueLimit, RejectReason::Timeout]).unwrap()
    );
    assert_eq!("".parse::<ShadowReasons>(), Ok(ShadowReasons::NONE));
    assert_eq!(ShadowReasons::default(), ShadowReasons::ALL);
    assert_eq!(RunOptions::default().mode, Mode::Enforce);
}

// ---- admission_classes.test.ts #9 (observe part) ----

#[test]
fn classes_t9_carries_the_class_through_observe_bypasses() {
    // classed(mc4, B2000), est 100/300: premium {mc2, maxTok 1200}, standard {mc1, maxTok
    // 800}, default standard. A default (standard) admission is held; run observe → ctx
    // {bypassed, class standard, concurrency_limit}, returns "observed"; bypass event
    // {class standard, concurrency_limit, constraint admission_class}.
    let ceilings = |mc, tokens| ClassLimits {
        max_concurrent: Some(mc),
        max_tokens: Some(tokens),
        ..ClassLimits::default()
    };
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(2_000)
        .class("premium", ceilings(2, 1_200))
        .class("standard", ceilings(1, 800))
        .default_class("standard")
        .build()
        .unwrap();
    let standard = b.class_id("standard").unwrap();
    let llm = LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(100, 300).unwrap()));
    let premium = RunOptions {
        class: Some(llm.bulkhead().class_id("premium").unwrap()),
        ..RunOptions::default()
    }
    .with_usage(|_: &u32| Some(Usage::new(100, 20)));
    let n = llm.run_blocking(&req(), premium, |ctx| {
        assert_eq!(ctx.class(), llm.bulkhead().class_id("premium").ok());
        Ok::<_, ()>(42)
    });
    assert_eq!(n.unwrap(), 42);
    let held = llm
        .bulkhead()
        .try_acquire(Demand::tokens(Reservation::new(100, 300).unwrap()))
        .unwrap();
    let (log, _sub) = record(llm.bulkhead());
    let out = llm.run_blocking(&req(), observe(), |ctx| {
        assert_eq!(ctx.admission_kind(), AdmissionKind::Bypassed);
        assert_eq!(ctx.class(), Some(standard));
        assert_eq!(ctx.bypass_reason(), Some(RejectReason::ConcurrencyLimit));
        assert!(!ctx.resources().borrowed_concurrency);
        Ok::<_, ()>("observed")
    });
    assert_eq!(out.unwrap(), "observed");
    let log = log.lock().unwrap().clone();
    let Some(LlmEvent::Bypass(e)) = LlmEvent::of(&log[0]) else {
        panic!("{log:?}")
    };
    assert_eq!(e.class.as_deref(), Some("standard"));
    assert_eq!(e.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(e.constraint, Some(Constraint::AdmissionClass));
    let s = llm.bulkhead().stats();
    let c = s.classes.unwrap();
    let st = c.classes.iter().find(|c| c.name == "standard").unwrap();
    assert_eq!(
        (st.in_flight, st.in_flight_tokens, st.admitted),
        (1, 400, 1)
    );
    drop(held);
    at_rest(&llm);
}

// ---- behaviour §9.4: observe mode still waits in the queue (ran e7 #34) ----

#[test]
fn observe_waits_in_the_queue_when_the_advisory_check_admits() {
    let (llm, held) = queueing();
    let (log, _sub) = record(llm.bulkhead());
    let mut fut = pin!(llm.run(&req(), observe(), async |ctx| {
        Ok::<_, ()>(ctx.admission_kind())
    }));
    assert!(poll_once(fut.as_mut()).is_pending());
    assert_eq!(llm.bulkhead().stats().pending, 1);
    drop(held); // the slot is handed to the queued run
    let Poll::Ready(kind) = poll_once(fut.as_mut()) else {
        panic!("the handed slot admits it")
    };
    assert_eq!(kind.unwrap(), AdmissionKind::Admitted);
    assert_eq!(llm.stats().observe, None);
    assert!(!names(&log).contains(&"bypass"));
    at_rest(&llm);
}

#[test]
fn queue_limit_is_bypassed_without_a_race() {
    // mc1 mq1: one held, one queued; a third observe run is refused queue_limit by the
    // advisory check: bypassed, raced false, nothing counted as rejected.
    let (llm, held) = queueing();
    let mut queued = pin!(llm.run(&req(), RunOptions::default(), async |_| Ok::<_, ()>(())));
    assert!(poll_once(queued.as_mut()).is_pending());
    let out = llm.run_blocking(&req(), observe(), |ctx| {
        Ok::<_, ()>((ctx.bypass_reason(), ctx.bypass_raced()))
    });
    assert_eq!(out.unwrap(), (Some(RejectReason::QueueLimit), Some(false)));
    let s = llm.bulkhead().stats();
    assert_eq!(s.rejected, 0);
    assert_eq!(
        llm.stats().observe.unwrap().bypassed_by_reason.queue_limit,
        1
    );
    // Enforce mode refuses the same call.
    let rej = rejected(llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())));
    assert_eq!(rej.reason, RejectReason::QueueLimit);
    drop(held);
    assert!(poll_once(queued.as_mut()).is_ready());
    at_rest(&llm);
}

// ---- shutdown and cancellation are never bypassed ----

#[test]
fn a_cancelled_queued_observe_run_is_aborted_not_bypassed() {
    let (llm, held) = queueing();
    let token = CancelToken::new();
    let options = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::Default,
            cancel: Some(token.clone()),
        },
        ..observe()
    };
    let mut fut = pin!(llm.run(&req(), options, async |_| -> Result<(), ()> {
        panic!("the callback must not run")
    }));
    assert!(poll_once(fut.as_mut()).is_pending());
    token.cancel();
    let Poll::Ready(r) = poll_once(fut.as_mut()) else {
        panic!("cancellation answers at the next poll")
    };
    assert_eq!(rejected(r).reason, RejectReason::Aborted);
    let s = llm.bulkhead().stats();
    assert_eq!(
        (llm.stats().observe, s.rejected_by_reason.aborted),
        (None, 1)
    );
    drop(held);
    at_rest(&llm);
}

#[test]
fn close_while_queued_in_observe_mode_is_shutdown_not_bypassed() {
    let (llm, held) = queueing();
    let mut fut = pin!(llm.run(&req(), observe(), async |_| -> Result<(), ()> {
        panic!("the callback must not run")
    }));
    assert!(poll_once(fut.as_mut()).is_pending());
    llm.bulkhead().close();
    let Poll::Ready(r) = poll_once(fut.as_mut()) else {
        panic!("close answers waiters")
    };
    assert_eq!(rejected(r).reason, RejectReason::Shutdown);
    assert_eq!(llm.stats().observe, None);
    drop(held);
    at_rest(&llm);
}

#[test]
fn a_closed_bulkhead_with_free_capacity_is_shutdown_in_observe_mode() {
    let llm = budgeted(100);
    llm.bulkhead().close();
    for options in [
        observe(),
        RunOptions {
            mode: Mode::Observe(ShadowReasons::ALL),
            wait: zero_timeout(),
            ..RunOptions::default()
        },
    ] {
        let rej = rejected(llm.run_blocking(&req(), options, |_| Ok::<_, ()>(())));
        assert_eq!(rej.reason, RejectReason::Shutdown);
    }
    let s = llm.bulkhead().stats();
    assert_eq!(
        (llm.stats().observe, s.rejected_by_reason.shutdown),
        (None, 2)
    );
}

// ---- bypassed work never touches capacity ----

#[test]
fn bypassed_work_leaves_capacity_at_zero_while_it_runs() {
    let llm = budgeted(0);
    llm.run_blocking(&req(), observe(), |ctx| {
        let s = llm.bulkhead().stats();
        assert_eq!(
            (s.in_flight, s.admissions_in_flight, s.available_slots),
            (0, 0, 1)
        );
        let t = s.token_budget.unwrap();
        assert_eq!((t.in_flight_tokens, t.total_reserved), (0, 0));
        assert_eq!(llm.stats().observe.unwrap().in_flight, 1);
        // Usage reports hold nothing: growth past the reservation books no overrun.
        let r = ctx.report_usage(Usage::new(50, 500)).unwrap();
        assert_eq!((r.held, r.consumed, r.over_reservation), (0, 550, true));
        assert!(!ctx.abandon_borrowed_concurrency());
        assert!(!ctx.stop_requested());
        let t = llm.bulkhead().stats().token_budget.unwrap();
        assert_eq!((t.in_flight_tokens, t.total_overrun), (0, 0));
        Ok::<_, ()>(())
    })
    .unwrap();
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.released), (0, 0));
    let t = s.token_budget.unwrap();
    assert_eq!(
        (t.total_consumed, t.total_refunded, t.total_overrun),
        (0, 0, 0)
    );
    at_rest(&llm);
}

#[test]
fn bypassed_usage_is_validated_and_clamped_like_an_admissions() {
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    llm.run_blocking(&req(), observe(), |ctx| {
        // Clamped: neither field decreases.
        ctx.report_usage(Usage::new(4, 3)).unwrap();
        let r = ctx.report_usage(Usage::new(2, 5)).unwrap();
        assert_eq!((r.sequence, r.consumed), (2, 9));
        // The same clamped usage: the sequence stays (no event).
        let r = ctx.report_usage(Usage::new(1, 1)).unwrap();
        assert_eq!(r.sequence, 2);
        // A progressive report is validated against the output cap (5), changes nothing.
        let e = ctx
            .report_usage_reconciled(
                Usage::new(4, 5),
                Reconcile {
                    remaining_output: 6,
                    safety_margin: 0,
                },
            )
            .unwrap_err();
        assert!(matches!(e, UsageError::RemainingExceedsCap { .. }), "{e:?}");
        assert!(ctx.report_usage(Usage::new(u64::MAX, 1)).is_err());
        assert_eq!(ctx.report_usage(Usage::new(4, 5)).unwrap().sequence, 2);
        Ok::<_, ()>(())
    })
    .unwrap();
    let log = log.lock().unwrap().clone();
    let usages: Vec<_> = log
        .iter()
        .filter_map(|e| match LlmEvent::of(e) {
            Some(LlmEvent::BypassUsage(u)) => Some((u.sequence, u.usage)),
            _ => None,
        })
        .collect();
    assert_eq!(usages, [(1, Usage::new(4, 3)), (2, Usage::new(4, 5))]);
    let o = llm.stats().observe.unwrap();
    assert_eq!((o.total_input_tokens, o.total_output_tokens), (4, 5));
}

#[test]
fn a_panic_inside_bypassed_work_leaks_nothing() {
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = llm.run_blocking(&req(), observe(), |ctx| -> Result<(), ()> {
            ctx.report_usage(Usage::new(2, 1)).unwrap();
            panic!("work panicked")
        });
    }));
    assert!(r.is_err());
    at_rest(&llm);
    let o = llm.stats().observe.unwrap();
    assert_eq!((o.bypassed, o.in_flight, o.usage_reported), (1, 0, 1));
    assert_eq!(names(&log), ["bypass", "bypass_usage", "bypass_release"]);
    let last = log.lock().unwrap()[2].clone();
    let Some(LlmEvent::BypassRelease(e)) = LlmEvent::of(&last) else {
        panic!("{last:?}")
    };
    assert_eq!(e.usage, Some(Usage::new(2, 1)));
    // Nothing was admitted or released, and the next observe run bypasses as before.
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.released, s.rejected), (0, 0, 0));
    let out = llm.run_blocking(&req(), observe(), |ctx| Ok::<_, ()>(ctx.admission_kind()));
    assert_eq!(out.unwrap(), AdmissionKind::Bypassed);
    at_rest(&llm);
}

#[test]
fn dropping_a_bypassed_run_future_settles_it() {
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    {
        let mut fut = pin!(llm.run(&req(), observe(), async |ctx| {
            ctx.report_usage(Usage::new(1, 1)).unwrap();
            std::future::pending::<()>().await;
            Ok::<_, ()>(())
        }));
        assert!(poll_once(fut.as_mut()).is_pending());
        let o = llm.stats().observe.unwrap();
        assert_eq!((o.bypassed, o.in_flight), (1, 1));
    }
    at_rest(&llm);
    assert_eq!(names(&log), ["bypass", "bypass_usage", "bypass_release"]);
    assert_eq!(llm.stats().observe.unwrap().usage_reported, 1);
}

#[test]
fn a_borrowed_concurrency_deadline_does_not_apply_to_bypassed_work() {
    let llm = budgeted(0);
    let trigger = llm_bulkhead::llm::DeadlineTrigger::new();
    trigger.fire();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(llm_bulkhead::llm::Deadline::Manual(trigger)),
        ..observe()
    };
    let out = llm.run_blocking(&req(), options, |ctx| Ok::<_, ()>(ctx.stop_requested()));
    assert!(!out.unwrap());
    assert_eq!(llm.bulkhead().stats().borrowed_concurrency_abandoned, 0);
}

#[test]
fn enforce_mode_is_unchanged_by_the_option() {
    // The same refusal in enforce mode (the default) is an error, counted, not bypassed.
    let llm = budgeted(0);
    let rej = rejected(llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())));
    assert_eq!(rej.reason, RejectReason::BudgetLimit);
    let s = llm.bulkhead().stats();
    assert_eq!((llm.stats().observe, s.rejected), (None, 1));
    // ShadowReasons::NONE observes nothing: every refusal is answered.
    let none = RunOptions {
        mode: Mode::Observe(ShadowReasons::NONE),
        ..RunOptions::default()
    };
    let rej = rejected(llm.run_blocking(&req(), none, |_| Ok::<_, ()>(())));
    assert_eq!(rej.reason, RejectReason::BudgetLimit);
    assert_eq!(llm.stats().observe, None);
}

#[test]
fn shadow_ids_are_distinct_and_counted_per_bypass() {
    let llm = budgeted(0);
    let ids: Vec<_> = (0..3)
        .map(|_| {
            llm.run_blocking(&req(), observe(), |ctx| Ok::<_, ()>(ctx.admission_id()))
                .unwrap()
        })
        .collect();
    assert!(ids.iter().all(|id| id.is_shadow()));
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert_eq!(llm.stats().observe.unwrap().bypassed, 3);
}

// ---- events for bypasses carry the fields ----

#[test]
fn bypass_events_serialise_with_snake_case_fields() {
    let llm = budgeted(0);
    let (log, _sub) = record(llm.bulkhead());
    let options = observe().with_usage(|u: &Usage| Some(*u));
    llm.run_blocking(&req(), options, |ctx| {
        ctx.report_usage_reconciled(
            Usage::new(3, 1),
            Reconcile {
                remaining_output: 2,
                safety_margin: 1,
            },
        )
        .unwrap();
        Ok::<_, ()>(Usage::new(3, 2))
    })
    .unwrap();
    let json: Vec<serde_json::Value> = log
        .lock()
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(json.len(), 3, "{json:#?}");
    let (bypass, usage, release) = (&json[0], &json[1], &json[2]);
    // The fields come in the event type's declaration order after `event`, as a core event's
    // do (the payload is serialised in place, not through a map that sorts its keys).
    let text = serde_json::to_string(&log.lock().unwrap()[0]).unwrap();
    let at = |k: &str| {
        text.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} in {text}"))
    };
    let order = [
        "event",
        "admission_id",
        "revision",
        "priority",
        "reason",
        "constraint",
        "detail",
        "reservation",
        "raced",
    ];
    assert!(
        order.windows(2).all(|p| at(p[0]) < at(p[1])),
        "fields out of declaration order: {text}"
    );
    assert_eq!(bypass["event"], "bypass");
    let id = bypass["admission_id"].as_str().unwrap();
    assert!(id.starts_with("shadow-") && id.len() == 43, "{id}");
    assert_eq!(bypass["revision"], 0);
    assert_eq!(bypass["priority"], "normal");
    assert_eq!(bypass["reason"], "budget_limit");
    assert_eq!(bypass["raced"], false);
    assert_eq!(bypass["detail"]["token_budget"]["budget"], 0);
    assert_eq!(bypass["detail"]["token_budget"]["requested"], 10);
    assert_eq!(bypass["detail"]["max_concurrent"], 1);
    assert_eq!(bypass["reservation"]["input"], 5);
    assert_eq!(bypass["reservation"]["max_output"], 5);
    assert_eq!(usage["event"], "bypass_usage");
    assert_eq!(usage["admission_id"], id);
    assert_eq!(usage["reason"], "budget_limit");
    assert_eq!(usage["sequence"], 1);
    assert_eq!(usage["usage"]["input"], 3);
    assert_eq!(usage["output_cap"], 5);
    assert_eq!(usage["output_remaining"], 4);
    assert_eq!(usage["over_reservation"], false);
    assert_eq!(usage["progressive"]["remaining_output"], 2);
    assert_eq!(release["event"], "bypass_release");
    assert_eq!(release["admission_id"], id);
    assert_eq!(release["usage_sequence"], 1);
    assert_eq!(release["usage"]["output"], 2);
    assert_eq!(release["reservation"]["input"], 5);
    let o = llm.stats().observe.unwrap();
    assert_eq!((o.total_input_tokens, o.total_output_tokens), (3, 2));
    let stats = serde_json::to_value(llm.stats()).unwrap();
    assert_eq!(stats["observe"]["bypassed_by_reason"]["budget_limit"], 1);
    assert_eq!(stats["observe"]["race_bypassed"], 0);
}

// ---- real threads: observe mode never lets admitted work exceed the limits ----

#[test]
fn observe_mode_on_threads_keeps_capacity_within_limits_and_counts_every_run() {
    // mc2, B25, 10-token runs: at most two admitted at a time; the rest bypass. Every run is
    // either admitted or bypassed, capacity never exceeds the limits while work runs, and
    // everything is at rest afterwards.
    const THREADS: u64 = 4;
    const RUNS: u64 = 300;
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(25)
            .build()
            .unwrap(),
        |_: &LlmRequest| Ok(Reservation::new(5, 5).unwrap()),
    );
    let options = || observe().with_usage(|r: &(AdmissionKind, Usage)| Some(r.1));
    let (admitted, bypassed) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let (mut admitted, mut bypassed) = (0u64, 0u64);
                    for _ in 0..RUNS {
                        let (kind, _) = llm
                            .run_blocking(&req(), options(), |ctx| {
                                let s = llm.bulkhead().stats();
                                assert!(s.in_flight <= 2, "{s:?}");
                                assert!(s.token_budget.unwrap().in_flight_tokens <= 25, "{s:?}");
                                if ctx.admission_kind() == AdmissionKind::Bypassed {
                                    assert!(ctx.admission_id().is_shadow());
                                    assert_eq!(ctx.held(), 0);
                                }
                                Ok::<_, ()>((ctx.admission_kind(), Usage::new(5, 5)))
                            })
                            .unwrap();
                        match kind {
                            AdmissionKind::Admitted => admitted += 1,
                            AdmissionKind::Bypassed => bypassed += 1,
                        }
                    }
                    (admitted, bypassed)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
    });
    assert_eq!(admitted + bypassed, THREADS * RUNS);
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.released), (admitted, admitted));
    let o = llm.stats().observe.unwrap_or_default();
    assert_eq!(o.bypassed, bypassed);
    assert_eq!(o.bypassed, o.bypassed_by_reason.total());
    assert_eq!(o.usage_reported, bypassed);
    // Every run reported {5,5}: admitted ones are consumed, bypassed ones are observed.
    assert_eq!(s.token_budget.unwrap().total_consumed, admitted * 10);
    assert_eq!(o.total_input_tokens + o.total_output_tokens, bypassed * 10);
    at_rest(&llm);
}

#[test]
fn observe_mode_run_futures_and_contexts_can_move_across_threads() {
    // A multi-threaded executor needs the future (and so the context) to be Send.
    fn assert_send<T: Send>(_: &T) {}
    let llm = budgeted(0);
    let fut = llm.run(&req(), observe(), async |ctx| {
        Ok::<_, ()>(ctx.admission_kind())
    });
    assert_send(&fut);
    let kind = std::thread::scope(|s| {
        s.spawn(move || futures_lite::future::block_on(fut))
            .join()
            .unwrap()
    });
    assert_eq!(kind.unwrap(), AdmissionKind::Bypassed);
    at_rest(&llm);
}
