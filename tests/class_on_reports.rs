//! The class and the resources on everything that reports about an admission (seed 000,
//! issue 15 items 5 and 6): usage and release reports, admit, reject, usage and release events,
//! with and without classes; and a bounded drain while an abandoned borrowed admission is still
//! unreleased. Nothing sleeps: threads are synchronised with channels.

use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Event, RejectReason, Reservation, Usage};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// `DrainReport` and `Resources` are `#[non_exhaustive]`: expected values are literals of
// test-side mirrors.
#[path = "support/detail.rs"]
mod detail;
use detail::{DrainReport, Resources};

type Log = Arc<Mutex<Vec<Event>>>;

fn record(b: &Bulkhead) -> (Log, llm_bulkhead::Subscription) {
    let log: Log = Arc::default();
    let l = log.clone();
    let sub = b.subscribe(move |e: &Event| l.lock().unwrap().push(e.clone()));
    (log, sub)
}

fn tokens(input: u64, output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, output).unwrap())
}

/// 4 slots and 4,000 tokens; `premium` protects 1 slot and 500 tokens, `standard` (the default)
/// protects nothing, so everything it takes is borrowed.
fn classed() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(4_000)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 1,
                protected_tokens: 500,
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                max_concurrent: Some(2),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap()
}

#[test]
fn usage_and_release_reports_carry_the_class() {
    let b = classed();
    let premium = b.class_id("premium").unwrap();
    let standard = b.class_id("standard").unwrap();

    let mut a = b.try_acquire(tokens(100, 200).in_class(premium)).unwrap();
    let u = a.report_usage(Usage::new(10, 5)).unwrap();
    assert_eq!(u.class, Some(premium));
    assert_eq!(u.class, a.class());
    let r = a.release(Some(Usage::new(10, 20))).unwrap();
    assert_eq!(r.class, Some(premium));

    // The default class, chosen by omission, is named on the reports as the default.
    let mut a = b.try_acquire(tokens(100, 200)).unwrap();
    assert_eq!(
        a.report_usage(Usage::new(1, 1)).unwrap().class,
        Some(standard)
    );
    assert_eq!(a.release(None).unwrap().class, Some(standard));

    // Without classes there is no class.
    let plain = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(1_000)
        .build()
        .unwrap();
    let mut a = plain.try_acquire(tokens(100, 200)).unwrap();
    assert_eq!(a.report_usage(Usage::new(1, 1)).unwrap().class, None);
    assert_eq!(a.release(None).unwrap().class, None);
}

#[cfg(feature = "serde")]
#[test]
fn reports_serialise_their_class_by_name() {
    // By name, as events carry it (issue 32 item 6): a gateway forwards them as they are.
    let b = classed();
    let premium = b.class_id("premium").unwrap();
    let mut a = b.try_acquire(tokens(100, 200).in_class(premium)).unwrap();
    let u = serde_json::to_value(a.report_usage(Usage::new(1, 1)).unwrap()).unwrap();
    assert_eq!(u["class"], "premium");
    let r = serde_json::to_value(a.release(None).unwrap()).unwrap();
    assert_eq!(r["class"], "premium");
    // The default class too, and after the bulkhead is gone.
    let a = b.try_acquire(tokens(100, 200)).unwrap();
    drop(b);
    let r = serde_json::to_value(a.release(None).unwrap()).unwrap();
    assert_eq!(r["class"], "standard");
}

#[test]
fn admit_and_release_events_carry_resources_without_classes() {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(1_000)
        .build()
        .unwrap();
    let (log, _sub) = record(&b);
    let a = b.try_acquire(tokens(100, 200)).unwrap();
    a.release(Some(Usage::new(50, 50))).unwrap();
    let events = log.lock().unwrap().clone();
    assert_eq!(
        events.iter().map(Event::name).collect::<Vec<_>>(),
        ["admit", "release"]
    );
    match (&events[0], &events[1]) {
        (Event::Admit(x), Event::Release(y)) => {
            assert_eq!(Resources::of(x.resources), Resources::default());
            assert_eq!(Resources::of(y.resources), Resources::default());
            assert_eq!((x.class.as_deref(), y.class.as_deref()), (None, None));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn admit_and_release_events_carry_resources_and_class_with_classes() {
    let b = classed();
    let premium = b.class_id("premium").unwrap();
    let (log, _sub) = record(&b);
    // Inside premium's floors: protected.
    let inside = b.try_acquire(tokens(100, 200).in_class(premium)).unwrap();
    // Past them (the floor's slot is taken, and 300 + 400 > 500): borrowed.
    let past = b.try_acquire(tokens(150, 250).in_class(premium)).unwrap();
    // Standard has no floor: all borrowed.
    let std_one = b.try_acquire(tokens(10, 20)).unwrap();
    assert_eq!(
        Resources::of(inside.resources()),
        Resources {
            borrowed_concurrency: false,
            borrowed_tokens: 0
        }
    );
    assert!(past.resources().borrowed_concurrency);
    assert_eq!(past.resources().borrowed_tokens, 200);
    assert_eq!(
        Resources::of(std_one.resources()),
        Resources {
            borrowed_concurrency: true,
            borrowed_tokens: 30
        }
    );
    let expected = [inside.resources(), past.resources(), std_one.resources()];
    let ids = [inside.id(), past.id(), std_one.id()];
    drop(std_one);
    drop(past);
    drop(inside);
    let events = log.lock().unwrap().clone();
    assert_eq!(
        events.iter().map(Event::name).collect::<Vec<_>>(),
        ["admit", "admit", "admit", "release", "release", "release"]
    );
    let classes = ["premium", "premium", "standard"];
    for (i, e) in events[..3].iter().enumerate() {
        let Event::Admit(x) = e else { panic!("{e:?}") };
        assert_eq!(x.admission_id, ids[i]);
        assert_eq!(x.resources, expected[i]);
        assert_eq!(x.class.as_deref(), Some(classes[i]));
    }
    // Releases come in reverse order; each repeats its admission's attribution.
    for (j, e) in events[3..].iter().enumerate() {
        let i = 2 - j;
        let Event::Release(x) = e else {
            panic!("{e:?}")
        };
        assert_eq!(x.admission_id, ids[i]);
        assert_eq!(x.resources, expected[i]);
        assert_eq!(x.class.as_deref(), Some(classes[i]));
    }
}

#[test]
fn reject_and_usage_events_carry_the_class() {
    let b = classed();
    let premium = b.class_id("premium").unwrap();
    let (log, _sub) = record(&b);
    // Standard's ceiling is 2 slots: the third is refused in standard.
    let s1 = b.try_acquire(tokens(10, 10)).unwrap();
    let s2 = b.try_acquire(tokens(10, 10)).unwrap();
    let refused = b.try_acquire(tokens(10, 10)).unwrap_err();
    assert_eq!(refused.reason, RejectReason::ConcurrencyLimit);
    // A premium demand over the whole budget is refused in premium.
    let too_big = b
        .try_acquire(tokens(3_000, 2_000).in_class(premium))
        .unwrap_err();
    assert_eq!(too_big.reason, RejectReason::BudgetLimit);
    let mut p = b.try_acquire(tokens(100, 100).in_class(premium)).unwrap();
    p.report_usage(Usage::new(50, 10)).unwrap();
    drop((s1, s2, p));
    let events = log.lock().unwrap().clone();
    let rejects: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Reject(r) => Some((r.class.as_deref(), r.rejection.reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejects,
        [
            (Some("standard"), RejectReason::ConcurrencyLimit),
            (Some("premium"), RejectReason::BudgetLimit)
        ]
    );
    let usage: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Usage(u) => Some((u.class.as_deref(), u.held_tokens)),
            _ => None,
        })
        .collect();
    assert_eq!(usage, [(Some("premium"), 150)]);
    let releases: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Release(r) => Some(r.class.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        releases,
        [
            Some("standard".to_owned()),
            Some("standard".to_owned()),
            Some("premium".to_owned())
        ]
    );
}

#[test]
fn reject_and_usage_events_without_classes_have_none() {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(1_000)
        .build()
        .unwrap();
    let (log, _sub) = record(&b);
    let mut a = b.try_acquire(tokens(100, 100)).unwrap();
    assert!(b.try_acquire(tokens(1, 1)).is_err());
    a.report_usage(Usage::new(1, 1)).unwrap();
    drop(a);
    for e in log.lock().unwrap().iter() {
        let class = match e {
            Event::Admit(x) => &x.class,
            Event::Reject(x) => &x.class,
            Event::Usage(x) => &x.class,
            Event::Release(x) => &x.class,
            other => panic!("{other:?}"),
        };
        assert_eq!(class, &None, "{e:?}");
    }
    assert_eq!(log.lock().unwrap().len(), 4);
}

/// A manual `acquire` caller abandons its borrowed slot and does not release: a bounded drain
/// lets shutdown go on and reports the admission (seed 000: "use bounded drain when shutdown
/// must proceed despite an unsettled caller").
#[test]
fn bounded_drain_reports_an_abandoned_unreleased_admission() {
    let b = classed();
    let mut a = b.try_acquire(tokens(100, 200)).unwrap();
    assert!(a.resources().borrowed_concurrency);
    assert!(a.abandon_borrowed_concurrency());
    b.close();
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (0, 1));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 300);
    let report = DrainReport {
        drained: false,
        in_flight: 1,
        pending: 0,
    };
    // A snapshot, and a real bound that passes (the admission is never released meanwhile).
    assert_eq!(
        DrainReport::of(b.drain_blocking(Some(Duration::ZERO))),
        report
    );
    assert_eq!(
        DrainReport::of(b.drain_blocking(Some(Duration::from_millis(5)))),
        report
    );
    assert_eq!(
        DrainReport::of(futures_lite::future::block_on(
            b.drain(Some(Duration::from_millis(5)))
        )),
        report
    );
    // The slot count stayed 0 throughout; the release settles the admission and a drain
    // without a bound completes.
    assert_eq!(b.stats().in_flight, 0);
    a.release(None).unwrap();
    assert_eq!(
        DrainReport::of(b.drain_blocking(None)),
        DrainReport {
            drained: true,
            in_flight: 0,
            pending: 0
        }
    );
}

/// The same while another thread holds the abandoned admission: its owner is told to release
/// only after the drain reported, so the drain cannot have seen the release.
#[test]
fn bounded_drain_while_another_thread_holds_the_abandoned_admission() {
    let b = classed();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let owner = {
        let b = b.clone();
        std::thread::spawn(move || {
            let mut a = b.try_acquire(tokens(100, 200)).unwrap();
            assert!(a.abandon_borrowed_concurrency());
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            a.release(Some(Usage::new(100, 10))).unwrap()
        })
    };
    ready_rx.recv().unwrap();
    b.close();
    let r = DrainReport::of(b.drain_blocking(Some(Duration::from_millis(5))));
    assert_eq!(
        r,
        DrainReport {
            drained: false,
            in_flight: 1,
            pending: 0
        }
    );
    assert_eq!(b.stats().in_flight, 0);
    go_tx.send(()).unwrap();
    let released = owner.join().unwrap();
    assert_eq!(released.class, b.class_id("standard").ok());
    assert!(b.drain_blocking(None).drained);
}

/// A `run` whose borrowed-concurrency deadline fired: while its work is still running, a bounded
/// drain counts the admission, the slot count is 0, and the work's own usage report names the
/// class.
#[cfg(feature = "serde")]
#[test]
fn bounded_drain_while_a_deadline_abandoned_run_is_still_working() {
    use llm_bulkhead::llm::{
        Deadline, DeadlineTrigger, LlmBulkhead, LlmRequest, RunError, RunOptions,
    };
    let llm = LlmBulkhead::new(classed(), |_: &LlmRequest| {
        Ok(Reservation::new(100, 200).unwrap())
    });
    let standard = llm.bulkhead().class_id("standard").unwrap();
    let trigger = DeadlineTrigger::new();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&LlmRequest::default(), options, |ctx| {
        trigger.fire();
        assert!(ctx.stop_requested());
        let b = llm.bulkhead();
        b.close();
        assert_eq!(
            DrainReport::of(b.drain_blocking(Some(Duration::from_millis(5)))),
            DrainReport {
                drained: false,
                in_flight: 1,
                pending: 0
            }
        );
        assert_eq!(b.stats().in_flight, 0);
        let u = ctx.report_usage(Usage::new(10, 10)).unwrap();
        assert_eq!(u.class, Some(standard));
        Ok::<_, ()>(())
    });
    assert!(matches!(r, Err(RunError::Deadline(ref d)) if d.class == Some(standard)));
    assert!(llm.bulkhead().drain_blocking(None).drained);
}
