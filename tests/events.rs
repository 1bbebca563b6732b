//! Events (reference §10.2) with the reference's numbers: `gateway_coordination.test.ts` #4, #7,
//! #8; `llm_bulkhead.test.ts` #97–#100, #102, #103; `gateway_features.test.ts` #16;
//! `reconfiguration.test.ts` #5 and #6; plus abandonment, panics and re-entrancy.

use llm_bulkhead::{
    AbandonCause, BudgetLimits, Bulkhead, ClassLimits, Demand, Event, Priority, RejectReason,
    Reservation, Usage, WaitOptions,
};
use std::sync::{Arc, Mutex};

type Log = Arc<Mutex<Vec<Event>>>;

/// A bulkhead of `max_concurrent` slots and a token budget, nothing else.
fn budgeted(max_concurrent: u32, budget: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .token_budget(budget)
        .build()
        .unwrap()
}

fn record(b: &Bulkhead) -> (Log, llm_bulkhead::Subscription) {
    let log: Log = Arc::default();
    let l = log.clone();
    let sub = b.subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    (log, sub)
}

fn names(log: &Log) -> Vec<&'static str> {
    log.lock().unwrap().iter().map(Event::name).collect()
}

fn tokens(input: u64, output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, output).unwrap())
}

#[test]
fn admit_and_release_carry_the_same_identity() {
    // gateway_coordination #4: mc4 B10000, 100/1000; release {80,20}.
    let b = budgeted(4, 10_000);
    let (log, _sub) = record(&b);
    let a = b.try_acquire(tokens(100, 1_000)).unwrap();
    let id = a.id();
    a.release(Some(Usage::new(80, 20))).unwrap();
    let events = log.lock().unwrap().clone();
    assert_eq!(events.len(), 2);
    match &events[0] {
        Event::Admit(e) => {
            assert_eq!(e.admission_id, id);
            assert_eq!(e.priority, Priority::Normal);
            assert_eq!(e.reserved_tokens, 1_100);
        }
        other => panic!("{other:?}"),
    }
    match &events[1] {
        Event::Release(e) => {
            assert_eq!(e.admission_id, id);
            assert_eq!((e.held_tokens, e.usage_sequence), (1_100, 0));
            assert_eq!(e.refunded_tokens, 1_000);
            assert_eq!(e.usage, Some(Usage::new(80, 20)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn usage_events_have_monotonic_sequences_and_skip_stale_reports() {
    // gateway_coordination #7.
    let b = budgeted(4, 10_000);
    let (log, _sub) = record(&b);
    let mut a = b
        .try_acquire(tokens(100, 1_000).with_priority(Priority::High))
        .unwrap();
    assert_eq!(a.report_usage(Usage::new(50, 10)).unwrap().sequence, 1);
    assert_eq!(a.report_usage(Usage::new(40, 5)).unwrap().sequence, 1);
    assert_eq!(a.report_usage(Usage::new(50, 20)).unwrap().sequence, 2);
    assert_eq!(a.report_usage(Usage::new(50, 1_200)).unwrap().sequence, 3);
    let usage: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Usage(u) => Some(u.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(usage.len(), 3);
    assert_eq!(
        usage.iter().map(|u| u.sequence).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert!(usage.iter().all(|u| u.priority == Priority::High));
    let e1 = &usage[0];
    assert_eq!(
        (
            e1.reserved_tokens,
            e1.previous_held_tokens,
            e1.held_tokens,
            e1.delta_tokens
        ),
        (1_100, 1_100, 1_050, -50)
    );
    assert_eq!(e1.usage, Usage::new(50, 10));
    assert_eq!(
        (e1.output_cap, e1.output_remaining, e1.over_reservation),
        (Some(1_000), Some(990), false)
    );
    assert_eq!(
        (
            usage[1].previous_held_tokens,
            usage[1].held_tokens,
            usage[1].delta_tokens
        ),
        (1_050, 1_050, 0)
    );
    let e3 = &usage[2];
    assert_eq!(
        (e3.previous_held_tokens, e3.held_tokens, e3.delta_tokens),
        (1_050, 1_250, 200)
    );
    assert_eq!((e3.output_remaining, e3.over_reservation), (Some(0), true));
    let id = a.id();
    drop(a);
    let last = log.lock().unwrap().last().cloned().unwrap();
    match last {
        Event::Release(r) => {
            assert_eq!(r.admission_id, id);
            assert_eq!((r.usage_sequence, r.held_tokens), (3, 1_250));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn usage_events_without_a_budget() {
    // gateway_coordination #8.
    let b = Bulkhead::new(1).unwrap();
    let (log, _sub) = record(&b);
    let mut a = b.try_acquire(Demand::slot()).unwrap();
    a.report_usage(Usage::new(3, 4)).unwrap();
    let e = log.lock().unwrap()[1].clone();
    match e {
        Event::Usage(u) => {
            assert_eq!(
                (
                    u.sequence,
                    u.reserved_tokens,
                    u.previous_held_tokens,
                    u.held_tokens,
                    u.delta_tokens
                ),
                (1, 0, 0, 0, 0)
            );
            assert_eq!((u.output_cap, u.output_remaining), (None, None));
            assert!(!u.over_reservation);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reject_events_carry_reason_and_detail() {
    // llm_bulkhead #97–#99, gateway_features #16.
    let b = budgeted(10, 1_100);
    let (log, _sub) = record(&b);
    let a = b.try_acquire(tokens(100, 1_000)).unwrap();
    assert_eq!(
        b.try_acquire(tokens(100, 1_000)).unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    let rejects: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Reject(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(rejects.len(), 1);
    assert_eq!(rejects[0].rejection.reason, RejectReason::BudgetLimit);
    assert_eq!(rejects[0].rejection.detail().max_concurrent, 10);
    assert_eq!(
        rejects[0]
            .rejection
            .detail()
            .token_budget
            .unwrap()
            .in_flight_tokens,
        1_100
    );
    drop(a);

    let one = Bulkhead::new(1).unwrap();
    let (log, _sub) = record(&one);
    let held = one.try_acquire(Demand::slot()).unwrap();
    let _ = one.try_acquire(Demand::slot());
    assert_eq!(names(&log), ["admit", "reject"]);
    drop(held);
}

#[test]
fn release_event_reports_usage_and_refund() {
    // llm_bulkhead #100: 500 reserved, release {80,40} → refunded 380.
    let b = budgeted(1, 1_000);
    let (log, _sub) = record(&b);
    b.try_acquire(tokens(250, 250))
        .unwrap()
        .release(Some(Usage::new(80, 40)))
        .unwrap();
    let e = log.lock().unwrap()[1].clone();
    match e {
        Event::Release(r) => {
            assert_eq!((r.reserved_tokens, r.refunded_tokens), (500, 380));
            assert_eq!(r.usage, Some(Usage::new(80, 40)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsubscribe_stops_delivery() {
    // llm_bulkhead #102.
    let b = Bulkhead::new(1).unwrap();
    let (log, sub) = record(&b);
    drop(b.try_acquire(Demand::slot()).unwrap());
    assert_eq!(names(&log), ["admit", "release"]);
    drop(sub);
    drop(b.try_acquire(Demand::slot()).unwrap());
    assert_eq!(names(&log).len(), 2);
}

#[test]
fn a_panicking_subscriber_is_caught_counted_and_harmless() {
    // llm_bulkhead #103, and the count in stats.
    let b = budgeted(2, 1_000);
    let _bad = b.subscribe(|e: &Event| {
        if matches!(e, Event::Admit(_) | Event::Release(_)) {
            panic!("subscriber bug")
        }
    });
    let (log, _good) = record(&b);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let a = b.try_acquire(tokens(100, 100)).unwrap();
    drop(a);
    std::panic::set_hook(prev);
    // The later subscriber still ran, and accounting is intact.
    assert_eq!(names(&log), ["admit", "release"]);
    let s = b.stats();
    assert_eq!(s.subscriber_panics, 2);
    assert_eq!((s.in_flight, s.admitted, s.released), (0, 1, 1));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
}

#[test]
fn an_admit_listener_may_reconfigure_without_relabelling_the_admission() {
    // reconfiguration #6: revision 7 stays 7; the next admission gets 8.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(1_000)
        .initial_revision(7)
        .build()
        .unwrap();
    let (log, _rec) = record(&b);
    let handle = b.clone();
    let once = std::sync::Once::new();
    let _sub = b.subscribe(move |e: &Event| {
        if matches!(e, Event::Admit(_)) {
            once.call_once(|| {
                let next = handle
                    .limits()
                    .with_revision(8)
                    .with_max_concurrent(2)
                    .with_token_budget(Some(BudgetLimits {
                        budget: 2_000,
                        high_priority_reserve: 0,
                    }));
                handle.apply_limits(next).unwrap();
            });
        }
    });
    let mut a = b.try_acquire(tokens(100, 100)).unwrap();
    assert_eq!(b.limits().revision, 8);
    assert_eq!(a.revision(), 7);
    a.report_usage(Usage::new(10, 10)).unwrap();
    drop(a);
    let revisions: Vec<(&str, u64)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e.name(),
                match e {
                    Event::Admit(x) => x.revision,
                    Event::Usage(x) => x.revision,
                    Event::Release(x) => x.revision,
                    Event::Reconfigure(x) => x.current.revision,
                    _ => u64::MAX,
                },
            )
        })
        .collect();
    assert_eq!(
        revisions,
        [
            ("admit", 7),
            ("reconfigure", 8),
            ("usage", 7),
            ("release", 7)
        ]
    );
    assert_eq!(b.try_acquire(tokens(1, 1)).unwrap().revision(), 8);
}

#[test]
fn reconfigure_event_has_previous_and_current() {
    // reconfiguration #5 (the event part): rev 7 {mc1 mq1 B1000 H0} → rev 8 {mc2 mq3 B500 H100};
    // the queued waiter is then answered budget_limit (400 + 400 > 400).
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .token_budget(1_000)
        .initial_revision(7)
        .build()
        .unwrap();
    let (log, _sub) = record(&b);
    let first = b.try_acquire(tokens(200, 200)).unwrap();
    let b2 = b.clone();
    let waiter =
        std::thread::spawn(move || b2.acquire_blocking(tokens(200, 200), WaitOptions::default()));
    while b.stats().pending == 0 {
        std::thread::yield_now();
    }
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
    assert_eq!(
        waiter.join().unwrap().unwrap_err().reason,
        RejectReason::BudgetLimit
    );
    let events = log.lock().unwrap().clone();
    let reconf: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Reconfigure(c) => Some(**c),
            _ => None,
        })
        .collect();
    assert_eq!(reconf.len(), 1);
    assert_eq!(
        (
            reconf[0].previous.revision,
            reconf[0].previous.max_concurrent
        ),
        (7, 1)
    );
    assert_eq!(reconf[0].current, next);
    // The waiter's refusal is an event too.
    assert_eq!(
        events
            .iter()
            .filter(
                |e| matches!(e, Event::Reject(r) if r.rejection.reason == RejectReason::BudgetLimit)
            )
            .count(),
        1
    );
    assert_eq!(b.stats().token_budget.unwrap().in_flight_tokens, 400);
    drop(first);
}

#[test]
fn abandonment_event_names_class_cause_and_hold() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(1_000)
        .class("batch", ClassLimits::default())
        .default_class("batch")
        .build()
        .unwrap();
    let (log, _sub) = record(&b);
    let mut a = b.try_acquire(tokens(100, 200)).unwrap();
    assert!(a.abandon_borrowed_concurrency());
    assert!(!a.abandon_borrowed_concurrency());
    drop(a);
    let events = log.lock().unwrap().clone();
    assert_eq!(
        events.iter().map(Event::name).collect::<Vec<_>>(),
        ["admit", "borrowed_concurrency_abandon", "release"]
    );
    match &events[1] {
        Event::BorrowedConcurrencyAbandon(x) => {
            assert_eq!(x.cause, AbandonCause::Manual);
            assert_eq!(x.class.as_deref(), Some("batch"));
            assert_eq!(x.held_tokens, 300);
            assert!(x.resources.borrowed_concurrency);
        }
        other => panic!("{other:?}"),
    }
    match &events[0] {
        Event::Admit(x) => assert_eq!(x.class.as_deref(), Some("batch")),
        other => panic!("{other:?}"),
    }
    let s = b.stats();
    assert_eq!(s.borrowed_concurrency_abandoned_by_cause.manual, 1);
    assert_eq!(s.borrowed_concurrency_abandoned_by_cause.deadline, 0);
}

#[test]
fn events_from_many_threads_balance() {
    // Every admission has exactly one release event, whatever the interleaving.
    let b = budgeted(4, 4_000);
    let counts = Arc::new(Mutex::new((0u64, 0u64, 0u64)));
    let c = counts.clone();
    let _sub = b.subscribe(move |e: &Event| {
        let mut c = c.lock().unwrap();
        match e {
            Event::Admit(_) => c.0 += 1,
            Event::Release(_) => c.1 += 1,
            Event::Reject(_) => c.2 += 1,
            _ => {}
        }
    });
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for i in 0..500u64 {
                    if let Ok(a) = b.try_acquire(tokens(500, 500 + i % 3)) {
                        drop(a);
                    }
                }
            });
        }
    });
    let (admits, releases, rejects) = *counts.lock().unwrap();
    let s = b.stats();
    assert_eq!(admits, s.admitted);
    assert_eq!(releases, s.released);
    assert_eq!(rejects, s.rejected);
    assert_eq!(admits + rejects, 2_000);
}

#[cfg(feature = "serde")]
#[test]
fn events_serialise_in_snake_case() {
    let b = budgeted(1, 100);
    let (log, _sub) = record(&b);
    drop(b.try_acquire(tokens(10, 10)).unwrap());
    let _ = b.try_acquire(tokens(100, 10));
    let json: Vec<serde_json::Value> = log
        .lock()
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    assert_eq!(json[0]["event"], "admit");
    assert_eq!(json[0]["reserved_tokens"], 20);
    assert_eq!(json[1]["event"], "release");
    assert_eq!(json[1]["held_tokens"], 20);
    assert_eq!(json[2]["event"], "reject");
    assert_eq!(json[2]["reason"], "budget_limit");
    assert_eq!(json[2]["detail"]["token_budget"]["requested"], 110);
}

/// A subscriber to some kinds gets only those, and a decision builds nothing else: a
/// refusal-only subscriber sees no admission or release, and the pair's events are not built.
#[test]
fn a_subscriber_gets_only_the_kinds_it_asked_for() {
    use llm_bulkhead::Interest;
    let b = budgeted(1, 1_000);
    let log: Log = Arc::default();
    let l = log.clone();
    let sub = b.subscribe_to(
        Interest::REJECT | Interest::RECONFIGURE,
        move |e: &Event| l.lock().unwrap().push(e.clone()),
    );
    let held = b.try_acquire(Demand::slot()).unwrap();
    assert!(b.try_acquire(Demand::slot()).is_err());
    drop(held);
    b.apply_limits(b.limits().with_revision(1)).unwrap();
    assert_eq!(names(&log), ["reject", "reconfigure"]);
    // An admission made while only refusals are wanted reports no release later, even to a
    // subscriber to everything that arrived meanwhile (as before anyone subscribed).
    let quiet = b.try_acquire(Demand::slot()).unwrap();
    let (all, all_sub) = record(&b);
    drop(quiet);
    assert!(names(&all).is_empty());
    drop((sub, all_sub));
}

/// Decision timing (seed: `decisionDurationNs`, `queueWaitNs`): admit and reject events carry
/// it only while a subscriber asks for it, from `try_acquire`, `acquire_blocking` (through
/// the queue) and the async `acquire`.
#[test]
fn admit_and_reject_events_carry_timing_only_when_asked() {
    use llm_bulkhead::{Interest, Timing};
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .build()
        .unwrap();
    let timings = |log: &Log| -> Vec<(&'static str, Option<Timing>)> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Event::Admit(a) => Some(("admit", a.timing)),
                Event::Reject(r) => Some(("reject", r.timing)),
                _ => None,
            })
            .collect()
    };
    // Not asked: no timing.
    let (plain, plain_sub) = record(&b);
    let held = b.try_acquire(Demand::slot()).unwrap();
    assert!(b.try_acquire(Demand::slot()).is_err());
    drop(held);
    assert_eq!(timings(&plain), [("admit", None), ("reject", None)]);
    drop(plain_sub);
    // Asked for.
    let log: Log = Arc::default();
    let l = log.clone();
    let sub = b.subscribe_to(
        Interest::ADMIT | Interest::REJECT | Interest::DECISION_TIMING,
        move |e: &Event| l.lock().unwrap().push(e.clone()),
    );
    let held = b.try_acquire(Demand::slot()).unwrap();
    assert!(b.try_acquire(Demand::slot()).is_err());
    // A blocking waiter, queued until `held` is dropped.
    let b2 = b.clone();
    let waiter = std::thread::spawn(move || {
        b2.acquire_blocking(Demand::slot(), WaitOptions::default())
            .map(|a| a.release(None).unwrap())
    });
    while b.stats().pending == 0 {
        std::thread::yield_now();
    }
    drop(held);
    waiter.join().unwrap().unwrap();
    let async_admission =
        futures_lite::future::block_on(b.acquire(Demand::slot(), WaitOptions::default()));
    drop(async_admission.unwrap());
    let seen = timings(&log);
    assert_eq!(seen.len(), 4, "{seen:?}");
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["admit", "reject", "admit", "admit"]);
    for (i, (_, t)) in seen.iter().enumerate() {
        let t = t.unwrap_or_else(|| panic!("event {i} has no timing"));
        if i != 2 {
            // Never queued.
            assert_eq!(t.queue_wait_ns, 0, "event {i}");
        }
    }
    drop(sub);
}
