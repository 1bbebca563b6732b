//! `run`, `estimate` and `would_admit` with the reference's numbers. Each test cites the
//! reference test (file and number from `async-bulkhead-llm-tests.md`). JavaScript-only cases
//! (negative or fractional numbers) are impossible by type here; the consistency check of an
//! override and overflow are what remain of them. A listener's `getUsage` that throws has no
//! Rust counterpart (a panicking usage function unwinds like any other panic and still
//! releases); "no usage" is `None`.
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    AdaptiveEstimator, Content, ContentBlock, EstimateError, LlmBulkhead, LlmRequest, Message,
    ModelAwareEstimator, RunError, RunOptions, TokenEstimator,
};
use llm_bulkhead::{
    Bulkhead, Event, Priority, Profile, QueueTimeout, RejectReason, Reservation, Usage, WaitOptions,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

type Res = Result<(), Box<dyn std::error::Error>>;

fn fixed(input: u64, output: u64) -> impl TokenEstimator + Clone {
    move |_: &LlmRequest| Ok(Reservation::new(input, output).unwrap())
}

fn counting(input: u64, output: u64, calls: Arc<AtomicU64>) -> impl TokenEstimator {
    move |_: &LlmRequest| {
        calls.fetch_add(1, Ordering::Relaxed);
        Ok(Reservation::new(input, output).unwrap())
    }
}

fn budget(mc: u32, b: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(mc)
        .token_budget(b)
        .build()
        .unwrap()
}

fn req() -> LlmRequest {
    LlmRequest::new("claude-sonnet-4", &["hello"])
}

fn over(input: u64, max_output: u64, reserved: Option<u64>) -> RunOptions {
    RunOptions {
        reservation: Some(llm_bulkhead::llm::ReservationOverride {
            input,
            max_output,
            reserved,
        }),
        ..RunOptions::default()
    }
}

fn tokens_in_flight(llm: &LlmBulkhead) -> u64 {
    llm.bulkhead()
        .stats()
        .token_budget
        .unwrap()
        .in_flight_tokens
}

#[test]
fn override_is_reserved_verbatim_and_skips_the_estimator() -> Res {
    // estimation_surface #13: B1000; override {300,400} → estimator not called, reservation
    // {300,400,700}, T 700 during the work, 0 after.
    let calls = Arc::new(AtomicU64::new(0));
    let llm = LlmBulkhead::new(budget(4, 1_000), counting(1, 1, calls.clone()));
    let seen = llm.run_blocking(&req(), over(300, 400, None), |ctx| {
        Ok::<_, ()>((ctx.reservation(), tokens_in_flight(&llm)))
    });
    let (res, t) = seen.unwrap();
    let res = res.unwrap();
    assert_eq!(
        (res.input(), res.max_output(), res.total()),
        (300, 400, 700)
    );
    assert_eq!(t, 700);
    assert_eq!(calls.load(Ordering::Relaxed), 0);
    assert_eq!(tokens_in_flight(&llm), 0);
    Ok(())
}

#[test]
fn run_honours_the_override_for_admission_and_refund() {
    // estimation_surface #14: mc1 B500; override {200,200}, usage {150,100} → reserved 400,
    // consumed 250, refunded 150, T 0.
    let llm = LlmBulkhead::new(budget(1, 500), fixed(1, 1));
    let options = over(200, 200, None).with_usage(|u: &Usage| Some(*u));
    llm.run_blocking(&req(), options, |_| Ok::<_, ()>(Usage::new(150, 100)))
        .unwrap();
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!(
        (
            t.total_reserved,
            t.total_consumed,
            t.total_refunded,
            t.in_flight_tokens
        ),
        (400, 250, 150, 0)
    );
}

#[test]
fn override_participates_in_budget_refusals() {
    // estimation_surface #15: B100; override {90,20} → budget_limit, requested 110.
    let llm = LlmBulkhead::new(budget(4, 100), fixed(1, 1));
    let called = std::cell::Cell::new(false);
    let r = llm.run_blocking(&req(), over(90, 20, None), |_| {
        called.set(true);
        Ok::<_, ()>(())
    });
    match r {
        Err(RunError::Rejected(rej)) => {
            assert_eq!(rej.reason, RejectReason::BudgetLimit);
            assert_eq!(rej.detail().token_budget.unwrap().requested, 110);
        }
        other => panic!("{other:?}"),
    }
    assert!(!called.get());
}

#[test]
fn would_admit_accepts_the_same_override() {
    // estimation_surface #16: B100, est 1/1 → admit; override {90,20} → budget_limit.
    let llm = LlmBulkhead::new(budget(4, 100), fixed(1, 1));
    assert!(llm
        .would_admit(&req(), &RunOptions::default())
        .unwrap()
        .admits());
    let advice = llm.would_admit(&req(), &over(90, 20, None)).unwrap();
    assert_eq!(advice.reason(), Some(RejectReason::BudgetLimit));
    assert_eq!(llm.bulkhead().stats().rejected, 0);
}

#[test]
fn estimate_previews_the_estimator_without_an_override() {
    // estimation_surface #17: est 5/5 → {5,5,10}.
    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(5, 5));
    let e = llm
        .estimate(&req(), &RunOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!((e.input(), e.max_output(), e.total()), (5, 5, 10));
}

#[test]
fn invalid_overrides_are_refused_before_anything_changes() {
    // estimation_surface #18 (and behaviour §3.4's message): reserved 999 vs 100 + 20.
    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(1, 1));
    let r = llm.run_blocking(&req(), over(100, 20, Some(999)), |_| Ok::<_, ()>(()));
    match r {
        Err(RunError::Invalid(e)) => {
            assert_eq!(
                e,
                EstimateError::InconsistentReservation {
                    reserved: 999,
                    sum: 120
                }
            );
            assert_eq!(
                e.to_string(),
                "reservation.reserved (999) must equal reservation.input + reservation.max_output (120)"
            );
        }
        other => panic!("{other:?}"),
    }
    let r = futures_lite::future::block_on(
        llm.run(&req(), over(u64::MAX, 1, None), async |_| Ok::<_, ()>(())),
    );
    assert!(matches!(
        r,
        Err(RunError::Invalid(EstimateError::Overflow { .. }))
    ));
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.rejected), (0, 0));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
}

#[test]
fn override_is_ignored_without_a_budget() {
    // estimation_surface #19: override {999999, 999999} without budget → ok, reservation None.
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), fixed(1, 1));
    let r = llm
        .run_blocking(&req(), over(999_999, 999_999, None), |ctx| {
            Ok::<_, ()>(ctx.reservation())
        })
        .unwrap();
    assert_eq!(r, None);
    // gateway_coordination #2: no budget → estimate None.
    assert_eq!(llm.estimate(&req(), &RunOptions::default()).unwrap(), None);
}

#[test]
fn gateway_shaped_request_end_to_end() {
    // estimation_surface #20: model-aware (default model claude-sonnet-4, opaque 2048);
    // request claude-sonnet-4-5, system 39 chars, text 39 chars + image, max 1024, extra 350
    // → {2418, 1024, 3442}, plus this crate's 7 for the message and 7 for the text block's keys
    // (text of spaces, whose tokens are the reference's chars / ratio); released with
    // {2000, 500} → T 0.
    let estimator = ModelAwareEstimator::builder()
        .default_model("claude-sonnet-4")
        .opaque_block_tokens(2_048)
        .build()
        .unwrap();
    let llm = LlmBulkhead::new(budget(4, 10_000), estimator);
    let request = LlmRequest {
        model: Some("claude-sonnet-4-5".into()),
        system: Some(Content::from(" ".repeat(39).as_str())),
        messages: vec![Message {
            role: "user".into(),
            content: Content::Blocks(vec![
                ContentBlock::from_text(" ".repeat(39)),
                ContentBlock::of_type("image"),
            ]),
            extra: Default::default(),
        }],
        max_tokens: Some(1_024),
        extra_input_tokens: Some(350),
        ..LlmRequest::default()
    };
    let e = llm
        .estimate(&request, &RunOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.input(), e.max_output(), e.total()),
        (2_432, 1_024, 3_456)
    );
    let options = RunOptions::default().with_usage(|_: &()| Some(Usage::new(2_000, 500)));
    llm.run_blocking(&request, options, |ctx| {
        assert_eq!(ctx.reservation(), Some(e));
        assert_eq!(tokens_in_flight(&llm), 3_456);
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(tokens_in_flight(&llm), 0);
}

#[test]
fn preview_identity_and_events_agree() {
    // gateway_coordination #1, #5, #6: mc4 B10000 est 100/1000; estimate {100,1000,1100};
    // a high-priority run sees the preview; admit event reservedTokens 1100, priority high;
    // ctx id equals the admit and release event ids; ids are unique.
    let llm = LlmBulkhead::new(budget(4, 10_000), fixed(100, 1_000));
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let l = log.clone();
    let _sub = llm
        .bulkhead()
        .subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    let preview = llm.estimate(&req(), &RunOptions::default()).unwrap();
    assert_eq!(preview.map(|r| r.total()), Some(1_100));
    let options = RunOptions {
        priority: Priority::High,
        ..RunOptions::default()
    };
    let id = llm
        .run_blocking(&req(), options, |ctx| {
            assert_eq!(ctx.reservation(), preview);
            assert_eq!(ctx.priority(), Priority::High);
            Ok::<_, ()>(ctx.admission_id())
        })
        .unwrap();
    let id = id
        .admission_id()
        .expect("an admitted run's id is its admission's");
    let events = log.lock().unwrap().clone();
    match (&events[0], &events[1]) {
        (Event::Admit(a), Event::Release(r)) => {
            assert_eq!((a.admission_id, r.admission_id), (id, id));
            assert_eq!((a.reserved_tokens, a.priority), (1_100, Priority::High));
        }
        other => panic!("{other:?}"),
    }
    let other = llm
        .run_blocking(&req(), RunOptions::default(), |ctx| {
            Ok::<_, ()>(ctx.admission_id())
        })
        .unwrap();
    assert_ne!(id, other);
}

#[test]
fn run_context_reports_usage() {
    // gateway_features #8: B1200, 100/1000; ctx.report_usage({20,5}) → held 1020; refunded 80
    // during the work; T 0 afterwards.
    let llm = LlmBulkhead::new(budget(10, 1_200), fixed(100, 1_000));
    llm.run_blocking(&req(), RunOptions::default(), |ctx| {
        let r = ctx.report_usage(Usage::new(20, 5)).unwrap();
        assert_eq!(r.held, 1_020);
        let t = llm.bulkhead().stats().token_budget.unwrap();
        assert_eq!((t.total_refunded, t.in_flight_tokens), (80, 1_020));
        Ok::<_, ()>(())
    })
    .unwrap();
    assert_eq!(tokens_in_flight(&llm), 0);
}

#[test]
fn mixed_report_and_release_traffic_returns_to_zero() {
    // gateway_features #9: B50000 mc20; 50 runs, job i reports {30+i%5, 3i} then
    // {30+i%5, 7i} → T 0, in flight 0.
    let llm = LlmBulkhead::new(budget(20, 50_000), fixed(100, 1_000));
    std::thread::scope(|s| {
        for t in 0..5u64 {
            let llm = &llm;
            s.spawn(move || {
                for j in 0..10u64 {
                    let i = t * 10 + j;
                    llm.run_blocking(&req(), RunOptions::default(), |ctx| {
                        ctx.report_usage(Usage::new(30 + i % 5, 3 * i)).unwrap();
                        ctx.report_usage(Usage::new(30 + i % 5, 7 * i)).unwrap();
                        Ok::<_, ()>(())
                    })
                    .unwrap();
                }
            });
        }
    });
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admitted, s.released), (0, 50, 50));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
}

#[test]
fn concurrency_rejection_carries_slot_detail() {
    // gateway_features #15 and llm_bulkhead #82/#83: mc1 no budget, one held → concurrency_limit,
    // detail in_flight 1, max_concurrent 1, no token detail.
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), fixed(1, 1));
    llm.run_blocking(&req(), RunOptions::default(), |_| {
        match llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())) {
            Err(RunError::Rejected(r)) => {
                assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
                assert_eq!((r.detail().in_flight, r.detail().max_concurrent), (1, 1));
                assert!(r.detail().token_budget.is_none());
            }
            other => panic!("{other:?}"),
        }
        Ok::<_, ()>(())
    })
    .unwrap();
}

#[test]
fn would_admit_mirrors_admission_without_reserving() {
    // gateway_features #17: B1200 (1100 each): admit; with one held → budget_limit, T stays
    // 1100; after release → admit.
    let llm = LlmBulkhead::new(budget(10, 1_200), fixed(100, 1_000));
    let o = RunOptions::default();
    assert!(llm.would_admit(&req(), &o).unwrap().admits());
    llm.run_blocking(&req(), RunOptions::default(), |_| {
        let a = llm.would_admit(&req(), &o).unwrap();
        assert_eq!(a.reason(), Some(RejectReason::BudgetLimit));
        assert_eq!(tokens_in_flight(&llm), 1_100);
        Ok::<_, ()>(())
    })
    .unwrap();
    assert!(llm.would_admit(&req(), &o).unwrap().admits());
}

#[test]
fn would_admit_reports_priority_concurrency_and_shutdown() {
    // gateway_features #18: B5000 mc1 H4000 (1100 each): normal → budget_limit (1000 < 1100);
    // high → admit; with a high one held → concurrency_limit; closed → shutdown.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(5_000)
        .high_priority_reserve(4_000)
        .build()
        .unwrap();
    let llm = LlmBulkhead::new(b, fixed(100, 1_000));
    let high = RunOptions {
        priority: Priority::High,
        ..RunOptions::default()
    };
    assert_eq!(
        llm.would_admit(&req(), &RunOptions::default())
            .unwrap()
            .reason(),
        Some(RejectReason::BudgetLimit)
    );
    assert!(llm.would_admit(&req(), &high).unwrap().admits());
    llm.run_blocking(&req(), high.clone(), |_| {
        assert_eq!(
            llm.would_admit(&req(), &high).unwrap().reason(),
            Some(RejectReason::ConcurrencyLimit)
        );
        Ok::<_, ()>(())
    })
    .unwrap();
    llm.bulkhead().close();
    assert_eq!(
        llm.would_admit(&req(), &high).unwrap().reason(),
        Some(RejectReason::Shutdown)
    );
}

#[test]
fn would_admit_detail_matches_the_reference() {
    // v38_features #12: mc3 B1000, gpt-4o 40 chars max 20 → requested 31, detail
    // {revision 0, in_flight 0, pending 0, mc 3, mq 0, budget 1000, T 0, eff 1000, available 1000}.
    let llm = LlmBulkhead::new(budget(3, 1_000), ModelAwareEstimator::default());
    // The reference's 11 input tokens (40 chars at 3.7) as extra input tokens (this crate's
    // estimate of 40 characters adds its message overhead).
    let mut r = LlmRequest::new("gpt-4o", &[]);
    r.extra_input_tokens = Some(11);
    r.max_tokens = Some(20);
    let a = llm.would_admit(&r, &RunOptions::default()).unwrap();
    assert!(a.admits());
    let d = a.detail();
    assert_eq!(
        (d.in_flight, d.pending, d.max_concurrent, d.max_queue),
        (0, 0, 3, 0)
    );
    let t = d.token_budget.unwrap();
    assert_eq!(
        (
            t.budget,
            t.in_flight_tokens,
            t.effective_budget,
            t.available,
            t.requested
        ),
        (1_000, 0, 1_000, 1_000, 31)
    );
    // v38_features #13: B100, 40 chars max 80 (91), one admitted → budget_limit, T 91,
    // available 9, requested 91.
    let llm = LlmBulkhead::new(budget(3, 100), ModelAwareEstimator::default());
    r.max_tokens = Some(80);
    llm.run_blocking(&r, RunOptions::default(), |_| {
        let a = llm.would_admit(&r, &RunOptions::default()).unwrap();
        let t = a.detail().token_budget.unwrap();
        assert_eq!(a.reason(), Some(RejectReason::BudgetLimit));
        assert_eq!((t.in_flight_tokens, t.available, t.requested), (91, 9, 91));
        Ok::<_, ()>(())
    })
    .unwrap();
}

#[test]
fn would_admit_zero_concurrency_kill_switch() {
    // reconfiguration #10: mc2 mq10 → mc0 mq10: concurrency_limit, nothing queued.
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .max_queue(10)
        .build()
        .unwrap();
    b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0))
        .unwrap();
    let llm = LlmBulkhead::new(b, fixed(1, 1));
    assert_eq!(
        llm.would_admit(&req(), &RunOptions::default())
            .unwrap()
            .reason(),
        Some(RejectReason::ConcurrencyLimit)
    );
    assert_eq!(llm.bulkhead().stats().pending, 0);
}

#[test]
fn run_releases_on_completion_and_on_error() {
    // llm_bulkhead #46, #47, #80, #81: B200 est 50/50 → T 0, available 200; the work's error
    // comes back as Work and the slot is released.
    let llm = LlmBulkhead::new(budget(2, 200), fixed(50, 50));
    let out = llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>("hello"));
    assert_eq!(out.unwrap(), "hello");
    let err = llm.run_blocking(&req(), RunOptions::default(), |_| Err::<(), _>("boom"));
    assert!(matches!(err, Err(RunError::Work("boom"))));
    let s = llm.bulkhead().stats();
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.token_budget.unwrap().available, 200);
}

#[test]
fn usage_from_the_result_drives_refunds() {
    // llm_bulkhead #58 (usage {80,40} of 500 → refunded 380), #59 (no usage function → no
    // refund), #60 (not called on error), #62 (invalid usage → no usage), #70, #71.
    let with_usage = || RunOptions::default().with_usage(|r: &(&str, Usage)| Some(r.1));
    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(250, 250));
    let r = llm
        .run_blocking(&req(), with_usage(), |_| {
            Ok::<_, ()>(("hello", Usage::new(80, 40)))
        })
        .unwrap();
    assert_eq!(r.0, "hello");
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.total_refunded), (0, 380));

    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(250, 250));
    llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>("x"))
        .unwrap();
    assert_eq!(
        llm.bulkhead().stats().token_budget.unwrap().total_refunded,
        0
    );

    let called = Arc::new(AtomicU64::new(0));
    let c = called.clone();
    let options = RunOptions::default().with_usage(move |_: &()| {
        c.fetch_add(1, Ordering::Relaxed);
        Some(Usage::new(1, 1))
    });
    let _ = llm.run_blocking(&req(), options, |_| Err::<(), _>("boom"));
    assert_eq!(called.load(Ordering::Relaxed), 0);
    assert_eq!(tokens_in_flight(&llm), 0);

    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(250, 250));
    let bad = RunOptions::default().with_usage(|_: &()| Some(Usage::new(u64::MAX, 1)));
    llm.run_blocking(&req(), bad, |_| Ok::<_, ()>(())).unwrap();
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!(
        (t.in_flight_tokens, t.total_consumed, t.total_refunded),
        (0, 0, 0)
    );

    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(250, 250));
    for _ in 0..3 {
        llm.run_blocking(&req(), with_usage(), |_| {
            Ok::<_, ()>(("", Usage::new(80, 20)))
        })
        .unwrap();
    }
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!(
        (t.total_reserved, t.total_consumed, t.total_refunded),
        (1_500, 300, 1_200)
    );

    let llm = LlmBulkhead::new(budget(4, 1_000), fixed(250, 250));
    llm.run_blocking(&req(), with_usage(), |_| {
        Ok::<_, ()>(("", Usage::new(50, 50)))
    })
    .unwrap();
    let t = llm.bulkhead().stats().token_budget.unwrap();
    assert_eq!(
        (t.total_reserved, t.total_consumed, t.total_refunded),
        (500, 100, 400)
    );
}

#[test]
fn queued_run_completes_after_the_first() {
    // llm_bulkhead #85 and #40/#76 (batch profile queues): mc1, the second run waits, then
    // both complete; in flight 0.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .profile(Profile::Batch)
        .build()
        .unwrap();
    let llm = LlmBulkhead::new(b, fixed(1, 1));
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let llm = &llm;
        let first = s.spawn(move || {
            llm.run_blocking(&req(), RunOptions::default(), |_| {
                go_rx.recv().unwrap();
                Ok::<_, ()>("first")
            })
        });
        while llm.bulkhead().stats().in_flight == 0 {
            std::thread::yield_now();
        }
        let second = s.spawn(move || {
            llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>("second"))
        });
        while llm.bulkhead().stats().pending == 0 {
            std::thread::yield_now();
        }
        go_tx.send(()).unwrap();
        assert_eq!(first.join().unwrap().unwrap(), "first");
        assert_eq!(second.join().unwrap().unwrap(), "second");
    });
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
}

#[test]
fn profiles() {
    // llm_bulkhead #31/#32 (preset values), #39 (no profile → fail-fast), #41 (explicit
    // max_queue 0 overrides batch), #42 (a plain max_queue queues).
    assert_eq!(Profile::Interactive.max_queue(), 0);
    assert_eq!(
        (Profile::Batch.max_queue(), Profile::Batch.timeout()),
        (20, Some(std::time::Duration::from_secs(30)))
    );
    for (b, expect_queue) in [
        (
            Bulkhead::builder().max_concurrent(1).build().unwrap(),
            false,
        ),
        (
            Bulkhead::builder()
                .max_concurrent(1)
                .profile(Profile::Batch)
                .max_queue(0)
                .build()
                .unwrap(),
            false,
        ),
        (
            Bulkhead::builder()
                .max_concurrent(1)
                .max_queue(2)
                .build()
                .unwrap(),
            true,
        ),
    ] {
        let llm = LlmBulkhead::new(b, fixed(1, 1));
        llm.run_blocking(&req(), RunOptions::default(), |_| {
            let a = llm.would_admit(&req(), &RunOptions::default()).unwrap();
            if expect_queue {
                assert!(matches!(
                    a,
                    llm_bulkhead::Advice::Admit {
                        would_queue: true,
                        ..
                    }
                ));
                // A zero timeout proves it would wait rather than be refused at once.
                let zero = RunOptions {
                    wait: WaitOptions {
                        timeout: QueueTimeout::After(std::time::Duration::ZERO),
                        ..WaitOptions::default()
                    },
                    ..RunOptions::default()
                };
                match llm.run_blocking(&req(), zero, |_| Ok::<_, ()>(())) {
                    Err(RunError::Rejected(r)) => assert_eq!(r.reason, RejectReason::Timeout),
                    other => panic!("{other:?}"),
                }
            } else {
                assert_eq!(a.reason(), Some(RejectReason::ConcurrencyLimit));
                match llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())) {
                    Err(RunError::Rejected(r)) => {
                        assert_eq!(r.reason, RejectReason::ConcurrencyLimit)
                    }
                    other => panic!("{other:?}"),
                }
            }
            Ok::<_, ()>(())
        })
        .unwrap();
    }
}

#[test]
fn close_refuses_new_runs_but_not_running_ones() {
    // llm_bulkhead #105, #107.
    let llm = LlmBulkhead::new(Bulkhead::new(2).unwrap(), fixed(1, 1));
    let out = llm.run_blocking(&req(), RunOptions::default(), |_| {
        llm.bulkhead().close();
        Ok::<_, ()>("completed")
    });
    assert_eq!(out.unwrap(), "completed");
    match llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(())) {
        Err(RunError::Rejected(r)) => assert_eq!(r.reason, RejectReason::Shutdown),
        other => panic!("{other:?}"),
    }
}

#[test]
fn admit_event_reserved_tokens() {
    // llm_bulkhead #97: est 50/50 → one admit event, reservedTokens 100.
    let llm = LlmBulkhead::new(budget(2, 1_000), fixed(50, 50));
    let admits = Arc::new(Mutex::new(Vec::new()));
    let a = admits.clone();
    let _sub = llm.bulkhead().subscribe(move |e: &Event| {
        if let Event::Admit(x) = e {
            a.lock().unwrap().push(x.reserved_tokens);
        }
    });
    llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(()))
        .unwrap();
    assert_eq!(*admits.lock().unwrap(), [100]);
}

#[test]
fn adaptive_estimator_fed_by_release_events() {
    // adaptive (v38_features #25): min_samples 2, smoothing 1, mc2 B100000; release events feed
    // observe; estimate input 100 (gpt-4o, 370 chars); after 2 runs with usage {200,5} the
    // estimate is input 200, reserved 250.
    let base = ModelAwareEstimator::builder()
        .output_cap(50)
        .build()
        .unwrap();
    let adaptive = Arc::new(
        AdaptiveEstimator::builder(base)
            .min_samples(2)
            .smoothing(1.0)
            .build()
            .unwrap(),
    );
    let llm = LlmBulkhead::with_shared_estimator(budget(2, 100_000), adaptive.clone());
    // The reference's base of 100 (370 chars at 3.7), given as extra input tokens: this crate's
    // base now counts message overheads and a script bound too.
    let mut request = LlmRequest::new("gpt-4o", &[]);
    request.extra_input_tokens = Some(100);
    let (feed, r2) = (adaptive.clone(), request.clone());
    let _sub = llm.bulkhead().subscribe(move |e: &Event| {
        if let Event::Release(x) = e {
            if let Some(u) = x.usage {
                feed.observe(&r2, u).unwrap();
            }
        }
    });
    let e = llm
        .estimate(&request, &RunOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!(e.input(), 100);
    for _ in 0..2 {
        let o = RunOptions::default().with_usage(|u: &Usage| Some(*u));
        llm.run_blocking(&request, o, |_| Ok::<_, ()>(Usage::new(200, 5)))
            .unwrap();
    }
    let e = llm
        .estimate(&request, &RunOptions::default())
        .unwrap()
        .unwrap();
    assert_eq!((e.input(), e.total()), (200, 250));
}

#[test]
fn stats_separate_admitted_released_and_rejected() {
    // llm_bulkhead #113 (adapted: no post-check race here, so no extra inner grant): mc2,
    // B10, est 8/0 → one admitted, one budget_limit.
    let llm = LlmBulkhead::new(budget(2, 10), fixed(8, 0));
    llm.run_blocking(&req(), RunOptions::default(), |_| {
        let r = llm.run_blocking(&req(), RunOptions::default(), |_| Ok::<_, ()>(()));
        assert!(
            matches!(r, Err(RunError::Rejected(ref x)) if x.reason == RejectReason::BudgetLimit)
        );
        Ok::<_, ()>(())
    })
    .unwrap();
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.released, s.rejected), (1, 1, 1));
    assert_eq!(s.rejected_by_reason.budget_limit, 1);
}
