//! The reference library's cases that apply to the admission core, with its numbers
//! (../shared/reference/async-bulkhead-llm-tests.md and -behaviour.md). The reference's
//! estimator is replaced by explicit reservations; where CONTRACT.md §9 deliberately differs
//! from the reference, the test says so and asserts the contract.

use llm_bulkhead::{
    ApplyLimitsError, BudgetLimits, Bulkhead, ConfigProblem, Demand, LimitsSnapshot, Priority,
    Reconcile, RejectReason, Reservation, Usage, MAX_SLOTS, MAX_TOKENS,
};

fn res(input: u64, max_output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, max_output).unwrap())
}

fn budgeted(max_concurrent: u32, budget: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .token_budget(budget)
        .build()
        .unwrap()
}

fn tokens(b: &Bulkhead) -> llm_bulkhead::TokenStats {
    b.stats().token_budget.unwrap()
}

// ---- construction and validation (llm_bulkhead.test.ts #34–#38) ----

#[test]
fn invalid_configuration_names_field_and_bound() {
    let e = Bulkhead::builder()
        .max_concurrent(MAX_SLOTS + 1)
        .build()
        .unwrap_err();
    assert_eq!(e.field, "max_concurrent");
    assert_eq!(
        e.problem,
        ConfigProblem::TooLarge {
            value: u64::from(MAX_SLOTS) + 1,
            max: u64::from(MAX_SLOTS)
        }
    );
    assert!(e.to_string().contains("32767"), "{e}");
    let e = Bulkhead::builder()
        .token_budget(MAX_TOKENS + 1)
        .build()
        .unwrap_err();
    assert_eq!(e.field, "token_budget.budget");
    let e = Bulkhead::builder()
        .token_budget(10)
        .high_priority_reserve(11)
        .build()
        .unwrap_err();
    assert_eq!(e.field, "token_budget.high_priority_reserve");
    assert!(Bulkhead::builder()
        .max_concurrent(MAX_SLOTS)
        .token_budget(MAX_TOKENS)
        .build()
        .is_ok());
}

#[test]
fn budget_zero_is_legal_and_admits_only_zero_token_demands() {
    // #37: B0, est 10/10 → budget_limit, T stays 0. #38: est 0/0 → ok.
    let b = budgeted(5, 0);
    assert_eq!(
        b.try_acquire(res(10, 10)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    assert_eq!(tokens(&b).in_flight_tokens, 0);
    assert_eq!(tokens(&b).budget, 0);
    assert!(b.try_acquire(res(0, 0)).is_ok());
}

// ---- token budget (#43–#50) ----

#[test]
fn budget_limit_and_no_leak_on_rejection() {
    // #44: B200, est 150/100 → budget_limit.
    let b = budgeted(4, 200);
    assert_eq!(
        b.try_acquire(res(150, 100)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    // #50: B100, est 60/60, 5 attempts all rejected, T 0.
    let b = budgeted(4, 100);
    for _ in 0..5 {
        assert_eq!(
            b.try_acquire(res(60, 60)).unwrap_err().reason,
            RejectReason::BudgetLimit
        );
    }
    assert_eq!(tokens(&b).in_flight_tokens, 0);
    assert_eq!(b.stats().rejected_by_reason.budget_limit, 5);
}

#[test]
fn reservations_accumulate_and_return() {
    // #46/#48: B1000, est 50/50 × 3 → T 300 → 0.
    let b = budgeted(5, 1_000);
    let held: Vec<_> = (0..3)
        .map(|_| b.try_acquire(res(50, 50)).unwrap())
        .collect();
    assert_eq!(tokens(&b).in_flight_tokens, 300);
    drop(held);
    assert_eq!(tokens(&b).in_flight_tokens, 0);
    assert_eq!(tokens(&b).available, 1_000);
}

#[test]
fn stats_token_budget_absent_without_budget() {
    // #49, #72
    assert!(Bulkhead::new(2).unwrap().stats().token_budget.is_none());
}

// ---- refunds and cumulative counters (#55–#70) ----

#[test]
fn release_with_usage_refunds_unused_tokens() {
    // #55: est 100/400 (500): T 500; release {100,50} → T 0, totalRefunded 350.
    let b = budgeted(2, 10_000);
    let a = b.try_acquire(res(100, 400)).unwrap();
    assert_eq!(tokens(&b).in_flight_tokens, 500);
    a.release(Some(Usage::new(100, 50))).unwrap();
    assert_eq!(
        (tokens(&b).in_flight_tokens, tokens(&b).total_refunded),
        (0, 350)
    );
    // #56: release() without usage performs no refund.
    let b = budgeted(2, 10_000);
    b.try_acquire(res(100, 400)).unwrap().release(None).unwrap();
    assert_eq!(tokens(&b).total_refunded, 0);
    // #57: est 50/50; release {80,80} → refunded 0, consumed 160, T 0.
    let b = budgeted(2, 10_000);
    let r = b
        .try_acquire(res(50, 50))
        .unwrap()
        .release(Some(Usage::new(80, 80)))
        .unwrap();
    assert_eq!((r.refunded, r.consumed), (0, Some(160)));
    assert_eq!(tokens(&b).in_flight_tokens, 0);
}

#[test]
fn invalid_release_usage_changes_nothing_and_keeps_the_admission() {
    // #63 adapted (CONTRACT.md §9.6): the reference releases, then throws. Here invalid usage
    // is refused before any state changes, and the admission comes back so nothing is lost.
    let b = budgeted(1, 1_000);
    let a = b.try_acquire(res(100, 100)).unwrap();
    let err = a.release(Some(Usage::new(u64::MAX, 10))).unwrap_err();
    assert_eq!((b.stats().in_flight, tokens(&b).in_flight_tokens), (1, 200));
    drop(err);
    assert_eq!((b.stats().in_flight, tokens(&b).in_flight_tokens), (0, 0));
}

#[test]
fn cumulative_counters() {
    // #64, #70: 3 × (500 reserved, usage {80,20}) → refunded 1200; reserved 1500 = 300 + 1200.
    let b = budgeted(4, 10_000);
    for _ in 0..3 {
        b.try_acquire(res(100, 400))
            .unwrap()
            .release(Some(Usage::new(80, 20)))
            .unwrap();
    }
    let t = tokens(&b);
    assert_eq!(
        (t.total_reserved, t.total_consumed, t.total_refunded),
        (1_500, 300, 1_200)
    );
    assert_eq!(t.total_reserved, t.total_consumed + t.total_refunded);
    // #65/#66: totalReserved grows per admission only; B600, 500 each.
    let b = budgeted(4, 600);
    let a = b.try_acquire(res(100, 400)).unwrap();
    assert_eq!(tokens(&b).total_reserved, 500);
    assert!(b.try_acquire(res(100, 400)).is_err());
    assert_eq!(tokens(&b).total_reserved, 500);
    drop(a);
    assert_eq!(tokens(&b).total_reserved, 500);
    // #67–#69: consumed counts usage, 0 without usage, and counts over-consumption.
    let b = budgeted(4, 10_000);
    b.try_acquire(res(100, 400)).unwrap().release(None).unwrap();
    assert_eq!(tokens(&b).total_consumed, 0);
    b.try_acquire(res(100, 400))
        .unwrap()
        .release(Some(Usage::new(300, 400)))
        .unwrap();
    assert_eq!(
        (tokens(&b).total_consumed, tokens(&b).total_refunded),
        (700, 0)
    );
}

#[test]
fn consumption_is_counted_even_when_the_hold_is_zero() {
    // Reference bug B4; CONTRACT.md §9.3 counts it.
    let b = budgeted(1, 100);
    b.try_acquire(res(0, 0))
        .unwrap()
        .release(Some(Usage::new(30, 20)))
        .unwrap();
    assert_eq!(tokens(&b).total_consumed, 50);
    let b = budgeted(1, 2_000);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    let r = a
        .report_usage(
            Usage::new(100, 1_000),
            Some(Reconcile {
                remaining_output: 0,
                safety_margin: 0,
            }),
        )
        .unwrap();
    assert_eq!(r.held, 0);
    a.release(Some(Usage::new(100, 1_000))).unwrap();
    assert_eq!(tokens(&b).total_consumed, 1_100);
}

// ---- concurrency (#73–#75, #113) ----

#[test]
fn admits_up_to_max_concurrent_and_restores_after_release() {
    let b = Bulkhead::new(3).unwrap();
    let held: Vec<_> = (0..3)
        .map(|_| b.try_acquire(Demand::slot()).unwrap())
        .collect();
    assert_eq!(b.stats().in_flight, 3);
    assert_eq!(
        b.try_acquire(Demand::slot()).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    drop(held);
    assert_eq!(b.stats().in_flight, 0);
    assert!(b.try_acquire(Demand::slot()).is_ok());
}

#[test]
fn no_same_tick_budget_race() {
    // #113 and reference bug B6: mc2, B10, 8-token demands. The reference answers
    // ok/budget_limit/concurrency_limit because its loser briefly holds a slot; here a decision
    // never counts a slot that a loser is about to return (CONTRACT.md §9.4).
    let b = budgeted(2, 10);
    let a = b.try_acquire(res(8, 0)).unwrap();
    assert_eq!(
        b.try_acquire(res(8, 0)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    assert_eq!(
        b.try_acquire(res(8, 0)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    let s = b.stats();
    assert_eq!(
        (s.admitted, s.rejected, s.rejected_by_reason.budget_limit),
        (1, 2, 2)
    );
    drop(a);
}

// ---- priority (behaviour §3.5) ----

#[test]
fn high_priority_reserve_worked_example() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(2_400)
        .high_priority_reserve(400)
        .build()
        .unwrap();
    let _n1 = b.try_acquire(res(100, 1_000)).unwrap();
    let r = b.try_acquire(res(100, 1_000)).unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    let t = r.detail().token_budget.unwrap();
    assert_eq!(
        (
            t.budget,
            t.in_flight_tokens,
            t.effective_budget,
            t.available,
            t.requested
        ),
        (2_400, 1_100, 2_000, 900, 1_100)
    );
    assert!(b
        .try_acquire(res(100, 1_000).with_priority(Priority::High))
        .is_ok());
}

// ---- usage reports (behaviour §5.2 worked examples) ----

#[test]
fn legacy_report_refund_and_overrun() {
    // budget 1200, 100+1000: report {20,5} → hold 1020, refund 80, available 180.
    let b = budgeted(2, 1_200);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    let r = a.report_usage(Usage::new(20, 5), None).unwrap();
    assert_eq!(r.held, 1_020);
    assert_eq!((tokens(&b).total_refunded, tokens(&b).available), (80, 180));
    drop(a);
    // budget 2400: {100,1400} → hold 1500, overrun 400; the next 1100 is refused.
    let b = budgeted(2, 2_400);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    assert_eq!(
        a.report_usage(Usage::new(100, 1_400), None).unwrap().held,
        1_500
    );
    assert_eq!(tokens(&b).total_overrun, 400);
    assert_eq!(
        b.try_acquire(res(100, 1_000)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
}

#[test]
fn progressive_reconciliation() {
    let rc = |remaining_output, safety_margin| {
        Some(Reconcile {
            remaining_output,
            safety_margin,
        })
    };
    let b = budgeted(2, 2_400);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    assert_eq!(
        a.report_usage(Usage::new(20, 100), rc(900, 50))
            .unwrap()
            .held,
        950
    );
    assert_eq!(tokens(&b).total_refunded, 150);
    let r = a.report_usage(Usage::new(20, 400), rc(600, 50)).unwrap();
    assert_eq!((r.held, r.sequence), (650, 2));
    assert_eq!(tokens(&b).total_refunded, 450);
    drop(a);
    // {100,1200} with 0/100 → 100 + 200 overrun = 300.
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    assert_eq!(
        a.report_usage(Usage::new(100, 1_200), rc(0, 100))
            .unwrap()
            .held,
        300
    );
}

#[test]
fn usage_sequence_and_clamping() {
    // Reservation 1100: {50,10} seq1 hold 1050; {40,5} stale seq1; {50,20} seq2 Δ0;
    // {50,1200} seq3 hold 1250, output_remaining 0, over_reservation; release seq 3, held 1250.
    let b = budgeted(1, 5_000);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    let r = a.report_usage(Usage::new(50, 10), None).unwrap();
    assert_eq!((r.sequence, r.held), (1, 1_050));
    let r = a.report_usage(Usage::new(40, 5), None).unwrap();
    assert_eq!((r.sequence, r.held, r.consumed), (1, 1_050, 60));
    let r = a.report_usage(Usage::new(50, 20), None).unwrap();
    assert_eq!((r.sequence, r.held), (2, 1_050));
    let r = a.report_usage(Usage::new(50, 1_200), None).unwrap();
    assert_eq!(
        (r.sequence, r.held, r.output_remaining, r.over_reservation),
        (3, 1_250, Some(0), true)
    );
    let rel = a.release(None).unwrap();
    assert_eq!((rel.usage_sequence, rel.held), (3, 1_250));
}

#[test]
fn a_hold_only_change_increments_the_sequence() {
    // Behaviour §5.2 step 4: same usage, different remaining_output → new sequence.
    let rc = |remaining_output, safety_margin| {
        Some(Reconcile {
            remaining_output,
            safety_margin,
        })
    };
    let b = budgeted(1, 5_000);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    let u = Usage::new(100, 100);
    let seq: Vec<_> = [rc(900, 0), rc(800, 0), rc(800, 0), rc(900, 55)]
        .into_iter()
        .map(|r| {
            let x = a.report_usage(u, r).unwrap();
            (x.sequence, x.held)
        })
        .collect();
    assert_eq!(seq, [(1, 900), (2, 800), (2, 800), (3, 955)]);
}

#[test]
fn re_inflation_is_booked_as_overrun_without_admission_check() {
    // Reference B5 (kept by the contract: growth is accounting, not admission).
    let b = budgeted(2, 1_200);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    let u = Usage::new(100, 100);
    a.report_usage(
        u,
        Some(Reconcile {
            remaining_output: 500,
            safety_margin: 0,
        }),
    )
    .unwrap();
    let _other = b.try_acquire(res(600, 0)).unwrap();
    assert_eq!(tokens(&b).in_flight_tokens, 1_100);
    assert_eq!(a.report_usage(u, None).unwrap().held, 1_100);
    assert_eq!(
        (tokens(&b).total_overrun, tokens(&b).in_flight_tokens),
        (600, 1_700)
    );
}

#[test]
fn release_examples() {
    // After report {100,250}, release() → consumed 350, refund 750 (hold 1100).
    let b = budgeted(1, 2_000);
    let mut a = b.try_acquire(res(100, 1_000)).unwrap();
    a.report_usage(Usage::new(100, 250), None).unwrap();
    let r = a.release(None).unwrap();
    assert_eq!((r.consumed, r.refunded, r.held), (Some(350), 750, 1_100));
}

// ---- limits (reconfiguration.test.ts) ----

fn reconf_fixture() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .initial_revision(7)
        .token_budget(1_000)
        .build()
        .unwrap()
}

#[test]
fn fail_closed_construction_and_later_activation() {
    // #1
    let b = Bulkhead::builder().build().unwrap();
    assert_eq!(
        b.try_acquire(Demand::slot()).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    assert_eq!(
        b.limits(),
        LimitsSnapshot {
            revision: 0,
            max_concurrent: 0,
            max_queue: 0,
            token_budget: None,
            classes: Default::default()
        }
    );
    b.apply_limits(b.limits().with_revision(1).with_max_concurrent(1))
        .unwrap();
    assert!(b.try_acquire(Demand::slot()).is_ok());
}

#[test]
fn initial_snapshot_and_stale_revisions() {
    // #2, #3
    let b = reconf_fixture();
    let expected = LimitsSnapshot {
        revision: 7,
        max_concurrent: 1,
        max_queue: 1,
        token_budget: Some(BudgetLimits {
            budget: 1_000,
            high_priority_reserve: 0,
        }),
        classes: Default::default(),
    };
    assert_eq!((b.limits(), b.stats().limits), (expected, expected));
    for rev in [7, 6] {
        let junk = expected.with_revision(rev).with_max_concurrent(u32::MAX);
        assert_eq!(
            b.apply_limits(junk),
            Err(ApplyLimitsError::StaleRevision {
                attempted: rev,
                current: Box::new(expected)
            })
        );
    }
    // #4: an invalid newer snapshot changes nothing.
    let bad = expected.with_revision(8).with_max_concurrent(MAX_SLOTS + 1);
    assert!(
        matches!(b.apply_limits(bad), Err(ApplyLimitsError::Invalid(e)) if e.field == "max_concurrent")
    );
    assert_eq!(b.limits(), expected);
}

#[test]
fn revisions_are_pinned_to_admitted_work() {
    // #6
    let b = reconf_fixture();
    let a = b.try_acquire(res(100, 300)).unwrap();
    b.apply_limits(b.limits().with_revision(8).with_max_concurrent(2))
        .unwrap();
    assert_eq!(a.revision(), 7);
    let next = b.try_acquire(res(100, 300)).unwrap();
    assert_eq!(next.revision(), 8);
    assert_eq!(a.release(None).unwrap().revision, 7);
}

#[test]
fn shrink_by_attrition_and_kill_switch() {
    // #7
    let b = Bulkhead::new(2).unwrap();
    let (x, y) = (
        b.try_acquire(Demand::slot()).unwrap(),
        b.try_acquire(Demand::slot()).unwrap(),
    );
    b.apply_limits(b.limits().with_revision(1).with_max_concurrent(1))
        .unwrap();
    assert_eq!(b.stats().in_flight, 2);
    assert_eq!(
        b.try_acquire(Demand::slot()).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    drop(x);
    assert_eq!(
        b.try_acquire(Demand::slot()).unwrap_err().reason,
        RejectReason::ConcurrencyLimit
    );
    drop(y);
    let z = b.try_acquire(Demand::slot()).unwrap();
    drop(z);
    // #10: max_concurrent 0 with a queue still refuses with concurrency_limit.
    b.apply_limits(
        b.limits()
            .with_revision(2)
            .with_max_concurrent(0)
            .with_max_queue(10),
    )
    .unwrap();
    let r = b.try_acquire(Demand::slot()).unwrap_err();
    assert_eq!(
        (r.reason, r.revision, r.detail().pending),
        (RejectReason::ConcurrencyLimit, 2, 0)
    );
}

#[test]
fn reserve_update_and_reserve_above_a_shrunken_budget() {
    // #9: rev8 mc3 B1000 H700 → normal budget_limit (400 > 300); high ok.
    let b = reconf_fixture();
    let snap = b
        .limits()
        .with_revision(8)
        .with_max_concurrent(3)
        .with_token_budget(Some(BudgetLimits {
            budget: 1_000,
            high_priority_reserve: 700,
        }));
    b.apply_limits(snap).unwrap();
    assert_eq!(
        b.try_acquire(res(100, 300)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    assert!(b
        .try_acquire(res(100, 300).with_priority(Priority::High))
        .is_ok());
    // #12: rev9 B300 H700 → accepted; normal demands refused.
    let snap = snap.with_revision(9).with_token_budget(Some(BudgetLimits {
        budget: 300,
        high_priority_reserve: 700,
    }));
    b.apply_limits(snap).unwrap();
    let t = tokens(&b);
    assert_eq!((t.budget, t.high_priority_reserve), (300, 700));
    assert_eq!(
        b.try_acquire(res(100, 300)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
}

#[test]
fn budget_shape_is_fixed_at_construction() {
    // #11
    let b = reconf_fixture();
    let e = b
        .apply_limits(b.limits().with_revision(8).with_token_budget(None))
        .unwrap_err();
    assert!(e.to_string().contains("token_budget is required"), "{e}");
    assert_eq!(b.limits().revision, 7);
    let plain = Bulkhead::new(1).unwrap();
    let e = plain
        .apply_limits(
            plain
                .limits()
                .with_revision(1)
                .with_token_budget(Some(BudgetLimits {
                    budget: 1,
                    high_priority_reserve: 0,
                })),
        )
        .unwrap_err();
    assert!(e.to_string().contains("must be omitted"), "{e}");
    assert_eq!(plain.limits().revision, 0);
}

#[test]
fn set_budget_advances_the_revision() {
    // #13
    let b = reconf_fixture();
    b.set_budget(250).unwrap();
    assert_eq!(
        b.limits(),
        LimitsSnapshot {
            revision: 8,
            max_concurrent: 1,
            max_queue: 1,
            token_budget: Some(BudgetLimits {
                budget: 250,
                high_priority_reserve: 0
            }),
            classes: Default::default()
        }
    );
    assert!(Bulkhead::new(1).unwrap().set_budget(5).is_err());
}

// ---- close (#104, #107; reference bug B1) ----

#[test]
fn close_refuses_new_work_but_not_in_flight_work() {
    let b = budgeted(2, 1_000);
    let mut a = b.try_acquire(res(100, 300)).unwrap();
    b.close();
    assert_eq!(
        b.try_acquire(res(1, 1)).unwrap_err().reason,
        RejectReason::Shutdown
    );
    a.report_usage(Usage::new(50, 50), None).unwrap();
    a.release(None).unwrap();
    let s = b.stats();
    assert!(s.closed);
    assert_eq!(
        (s.in_flight, s.token_budget.unwrap().in_flight_tokens),
        (0, 0)
    );
    // limits can still be applied after close (behaviour §7.2).
    assert!(b.apply_limits(b.limits().with_revision(1)).is_ok());
}

#[test]
fn shutdown_wins_over_capacity_reasons() {
    // Reference B1: closed + budget exhausted → the reference says budget_limit; the contract
    // checks shutdown first (CONTRACT.md §9.1).
    let b = budgeted(1, 0);
    b.close();
    assert_eq!(
        b.try_acquire(res(5, 5)).unwrap_err().reason,
        RejectReason::Shutdown
    );
}

// ---- rejection body ----

#[cfg(feature = "serde")]
#[test]
fn rejection_serialises_for_a_429_body() {
    let b = Bulkhead::builder()
        .max_concurrent(3)
        .token_budget(100)
        .build()
        .unwrap();
    let r = b.try_acquire(res(60, 60)).unwrap_err();
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "reason": "budget_limit",
            "constraint": null,
            "revision": 0,
            "detail": {
                "in_flight": 0, "pending": 0, "max_concurrent": 3, "max_queue": 0,
                "token_budget": {"budget": 100, "in_flight_tokens": 0, "effective_budget": 100,
                                 "available": 100, "requested": 120}
            }
        })
    );
    let e: &dyn std::error::Error = &r;
    assert!(e.to_string().contains("budget_limit"));
}

#[test]
fn admission_is_send_and_static() {
    fn check<T: Send + 'static>() {}
    check::<llm_bulkhead::Admission>();
    check::<Bulkhead>();
}

#[test]
fn dropping_during_a_panic_releases() {
    let b = budgeted(1, 1_000);
    let b2 = b.clone();
    let r = std::panic::catch_unwind(move || {
        let _a = b2.try_acquire(res(100, 100)).unwrap();
        panic!("provider call blew up");
    });
    assert!(r.is_err());
    assert_eq!((b.stats().in_flight, tokens(&b).in_flight_tokens), (0, 0));
}

// ---- the limits tag wraps around its 14 bits and the ring slots are reused ----

#[test]
fn decisions_stay_exact_across_tag_wraparound() {
    // 40,000 installs: the 14-bit tag wraps more than twice and every ring slot is rewritten
    // thousands of times. After each install the decision must use exactly the new limits.
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .build()
        .unwrap();
    let held = b.try_acquire(res(10, 0)).unwrap();
    for rev in 1..=40_000u64 {
        let (max_concurrent, budget) = match rev % 4 {
            0 => (1, 100), // slot full
            1 => (2, 10),  // budget full (10 held)
            2 => (2, 100), // fits
            _ => (0, 100), // kill switch
        };
        let snap = b
            .limits()
            .with_revision(rev)
            .with_max_concurrent(max_concurrent)
            .with_token_budget(Some(BudgetLimits {
                budget,
                high_priority_reserve: 0,
            }));
        b.apply_limits(snap).unwrap();
        match (rev % 4, b.try_acquire(res(5, 0))) {
            (2, Ok(a)) => assert_eq!(a.revision(), rev),
            (1, Err(r)) => assert_eq!((r.reason, r.revision), (RejectReason::BudgetLimit, rev)),
            (0 | 3, Err(r)) => {
                assert_eq!(
                    (r.reason, r.revision),
                    (RejectReason::ConcurrencyLimit, rev)
                )
            }
            (k, other) => panic!("revision {rev} (case {k}): unexpected {other:?}"),
        }
    }
    assert_eq!(held.revision(), 0);
    drop(held);
    assert_eq!(b.stats().in_flight, 0);
}
