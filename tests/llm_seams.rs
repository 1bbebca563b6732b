//! The LLM layer as a user of the seed meets it (issue 32 items 1, 2, 3 and 5): `run` on a
//! de-duplicating bulkhead is a typed error, follower refusals are counted as rejections, async
//! `run` answers the borrowed-concurrency deadline at expiry, and request-level acquires.
//! Deadlines are driven by a manual trigger and futures polled by hand with a no-op waker, so
//! nothing sleeps and no duration is asserted.
#![cfg(feature = "serde")]

#[path = "support/llm.rs"]
mod llm_support;

use llm_bulkhead::llm::{
    AcquireError, BoxWork, Deadline, DeadlineTrigger, DedupError, DedupSettings, EstimateError,
    LlmBulkhead, LlmRequest, Mode, NaiveEstimator, ReservationOverride, RunContext, RunError,
    RunOptions,
};
use llm_bulkhead::{
    Bulkhead, CancelToken, ClassLimits, Event, Priority, QueueTimeout, RejectReason, Reservation,
    WaitOptions,
};
use llm_support::{dedup_llm, poll, record, request};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

fn rejects(log: &Mutex<Vec<Event>>) -> Vec<(Option<String>, RejectReason)> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::Reject(r) => Some((r.class.clone(), r.rejection.reason)),
            _ => None,
        })
        .collect()
}

fn is_invalid<T: std::fmt::Debug, E: std::fmt::Debug>(r: Result<T, RunError<E>>, field: &str) {
    match r {
        Err(RunError::Invalid(EstimateError::InvalidSetting { field: f, .. })) if f == field => {}
        other => panic!("expected an invalid {field}, got {other:?}"),
    }
}

// Item 1: a setting never silently does nothing.

#[test]
fn run_and_run_blocking_refuse_dedup_on_a_deduplicating_bulkhead() {
    let llm = dedup_llm(Bulkhead::new(4).unwrap());
    let ran = AtomicU32::new(0);
    let work = |_: &mut RunContext| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(())
    };
    is_invalid(
        llm.run_blocking(&request(), RunOptions::default(), work),
        "dedup",
    );
    let fut = llm.run(&request(), RunOptions::default(), async |_| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(())
    });
    is_invalid(futures_lite::future::block_on(fut), "dedup");
    // Nothing ran, nothing was admitted or counted.
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let s = llm.stats().bulkhead;
    assert_eq!((s.admitted, s.rejected), (0, 0));
    // Opting out runs alone, as asked.
    let alone = RunOptions {
        dedup: false,
        ..RunOptions::default()
    };
    llm.run_blocking(&request(), alone.clone(), work).unwrap();
    futures_lite::future::block_on(llm.run(&request(), alone, async |_| Ok::<_, ()>(()))).unwrap();
    // A bulkhead whose de-duplication is switched off shares nothing: nothing to refuse.
    let off = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
        .with_dedup(DedupSettings {
            enabled: false,
            ..DedupSettings::default()
        })
        .unwrap();
    off.run_blocking(&request(), RunOptions::default(), work)
        .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

// Item 2: follower refusals are rejections.

type Out = Result<String, RunError<String>>;

/// A shared call held open until `gate` is sent to (or dropped).
fn gated(
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
) -> impl for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, String, String> + Send + 'static {
    move |_ctx: &mut RunContext| -> BoxWork<'_, String, String> {
        Box::pin(async move {
            if let Some(g) = gate {
                let _ = g.await;
            }
            Ok("answer".to_owned())
        })
    }
}

#[test]
fn follower_refusals_are_counted_as_rejections_with_their_reasons() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class("batch", ClassLimits::default())
        .default_class("batch")
        .build()
        .unwrap();
    let llm = dedup_llm(b);
    let (log, _sub) = record(llm.bulkhead());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let share = |s: &String| (s != "answer").then(|| s.clone());
    let mut leader: Pin<Box<dyn Future<Output = Out> + Send>> =
        Box::pin(llm.run_shared_with(&request(), RunOptions::default(), share, gated(Some(rx))));
    assert!(poll(leader.as_mut()).is_pending());
    // A follower whose share will be declined.
    let mut unshared =
        Box::pin(llm.run_shared_with(&request(), RunOptions::default(), share, gated(None)));
    assert!(poll(unshared.as_mut()).is_pending());
    // A follower that gives up at its own (zero) timeout.
    let impatient = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::After(Duration::ZERO),
            cancel: None,
        },
        ..RunOptions::default()
    };
    let mut late = Box::pin(llm.run_shared_with(&request(), impatient, share, gated(None)));
    assert!(matches!(
        poll(late.as_mut()),
        Poll::Ready(Err(RunError::Shared(DedupError::Timeout)))
    ));
    // A follower whose own token is cancelled.
    let token = CancelToken::new();
    let cancellable = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::Default,
            cancel: Some(token.clone()),
        },
        ..RunOptions::default()
    };
    let mut gone = Box::pin(llm.run_shared_with(&request(), cancellable, share, gated(None)));
    assert!(poll(gone.as_mut()).is_pending());
    token.cancel();
    assert!(matches!(
        poll(gone.as_mut()),
        Poll::Ready(Err(RunError::Shared(DedupError::Cancelled)))
    ));
    tx.send(()).unwrap();
    assert!(matches!(
        poll(unshared.as_mut()),
        Poll::Ready(Err(RunError::Shared(DedupError::Unshareable)))
    ));
    assert!(matches!(poll(leader.as_mut()), Poll::Ready(Ok(ref s)) if s == "answer"));

    let s = llm.stats().bulkhead;
    assert_eq!((s.admitted, s.rejected), (1, 3));
    let r = s.rejected_by_reason;
    assert_eq!(
        (r.timeout, r.aborted, r.unshareable_result, r.total()),
        (1, 1, 1, 3)
    );
    let batch = &s.classes.unwrap().classes[0];
    assert_eq!((batch.name.as_str(), batch.rejected), ("batch", 3));
    assert_eq!(
        batch
            .rejected_by_reason
            .get(RejectReason::UnshareableResult),
        1
    );
    let class = Some("batch".to_owned());
    assert_eq!(
        rejects(&log),
        [
            (class.clone(), RejectReason::Timeout),
            (class.clone(), RejectReason::Aborted),
            (class, RejectReason::UnshareableResult),
        ]
    );
    assert_eq!(
        RejectReason::UnshareableResult.to_string(),
        "unshareable_result"
    );
    assert_eq!(llm.bulkhead().stats().in_flight, 0);
}

#[cfg(feature = "metrics")]
#[test]
fn follower_refusals_reach_the_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let llm = dedup_llm(Bulkhead::new(4).unwrap());
        let telemetry = llm_bulkhead::telemetry::Telemetry::default().tracing(false);
        let _sub = telemetry.instrument(llm.bulkhead());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let share = |_: &String| None;
        let mut leader = Box::pin(llm.run_shared_with(
            &request(),
            RunOptions::default(),
            share,
            gated(Some(rx)),
        ));
        assert!(poll(leader.as_mut()).is_pending());
        let mut follower =
            Box::pin(llm.run_shared_with(&request(), RunOptions::default(), share, gated(None)));
        assert!(poll(follower.as_mut()).is_pending());
        tx.send(()).unwrap();
        assert!(poll(follower.as_mut()).is_ready());
        assert!(poll(leader.as_mut()).is_ready());
        // Counters are read from `stats()` when scraped.
        telemetry.record(llm.bulkhead());
    });
    let found = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .any(|(k, _, _, v)| {
            let key = k.key();
            key.name() == "llm_bulkhead_rejected_total"
                && key
                    .labels()
                    .any(|l| l.key() == "reason" && l.value() == "unshareable_result")
                && v == DebugValue::Counter(1)
        });
    assert!(
        found,
        "no llm_bulkhead_rejected_total{{reason=unshareable_result}} = 1"
    );
}

// Item 3: what each entry point does at the borrowed-concurrency deadline.

/// A classed bulkhead whose default class has no floor: every slot is borrowed.
fn borrowing() -> LlmBulkhead {
    llm_support::borrowing_budgeted()
}

fn manual(trigger: &DeadlineTrigger) -> RunOptions {
    RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        ..RunOptions::default()
    }
}

/// Sets its flag when dropped (the work's future was dropped, not run to its end).
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn assert_idle(llm: &LlmBulkhead) {
    let s = llm.bulkhead().stats();
    assert_eq!((s.in_flight, s.admissions_in_flight, s.pending), (0, 0, 0));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
}

#[test]
fn async_run_answers_the_deadline_at_expiry_while_the_work_ignores_it() {
    let llm = borrowing();
    let trigger = DeadlineTrigger::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let mut run = Box::pin(llm.run(&request(), manual(&trigger), async move |ctx| {
        let _guard = DropFlag(flag);
        ctx.report_usage(llm_bulkhead::Usage::new(100, 30)).unwrap();
        // A provider call that never answers and never looks at the stop signal.
        std::future::pending::<()>().await;
        Ok::<_, ()>(())
    }));
    assert!(poll(run.as_mut()).is_pending());
    assert_eq!(llm.bulkhead().stats().in_flight, 1);
    trigger.fire();
    let e = match poll(run.as_mut()) {
        Poll::Ready(Err(RunError::Deadline(e))) => e,
        other => panic!("expected the deadline at expiry, got {other:?}"),
    };
    assert!(e.resources.borrowed_concurrency);
    // The class leaves the process by name (item 6).
    assert_eq!(serde_json::to_value(&e).unwrap()["class"], "batch");
    // The work's future was dropped, and its tokens settled with its last report.
    assert!(dropped.load(Ordering::SeqCst));
    assert_idle(&llm);
    let s = llm.bulkhead().stats();
    assert_eq!(s.token_budget.unwrap().total_consumed, 130);
    assert_eq!(s.borrowed_concurrency_abandoned_by_cause.deadline, 1);
}

#[test]
fn run_shared_without_a_spawner_answers_the_deadline_at_expiry_too() {
    let llm = borrowing().with_dedup(DedupSettings::default()).unwrap();
    let trigger = DeadlineTrigger::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let mut run = Box::pin(llm.run_shared(&request(), manual(&trigger), move |_ctx| {
        Box::pin(async move {
            let _guard = DropFlag(flag);
            std::future::pending::<()>().await;
            Ok::<u32, ()>(1)
        })
    }));
    assert!(poll(run.as_mut()).is_pending());
    trigger.fire();
    assert!(matches!(
        poll(run.as_mut()),
        Poll::Ready(Err(RunError::Deadline(_)))
    ));
    assert!(dropped.load(Ordering::SeqCst));
    assert_idle(&llm);
}

#[test]
fn run_blocking_answers_the_deadline_when_the_work_returns_on_the_callers_thread() {
    let llm = borrowing();
    let trigger = DeadlineTrigger::new();
    let caller = std::thread::current().id();
    let r = llm.run_blocking(&request(), manual(&trigger), |ctx| {
        assert_eq!(std::thread::current().id(), caller);
        trigger.fire();
        // Expired, yet the work goes on here until it returns: the slot is already back.
        assert!(ctx.stop_requested());
        assert_eq!(llm.bulkhead().stats().in_flight, 0);
        assert_eq!(llm.bulkhead().stats().admissions_in_flight, 1);
        Ok::<_, ()>("the result is dropped")
    });
    assert!(matches!(r, Err(RunError::Deadline(_))));
    assert_idle(&llm);
}

// Item 5: request-level acquires.

fn budgeted() -> LlmBulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(2)
        .token_budget(1_000)
        .high_priority_reserve(400)
        .build()
        .unwrap();
    LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(300, 400).unwrap()))
}

#[test]
fn try_acquire_estimates_and_applies_priority_reserve_and_override() {
    let llm = budgeted();
    // 700 tokens do not fit a normal demand's effective budget (1,000 − 400)...
    match llm.try_acquire(&request(), &RunOptions::default()) {
        Err(AcquireError::Rejected(r)) => {
            assert_eq!(r.reason, RejectReason::BudgetLimit);
            assert_eq!(r.detail().token_budget.unwrap().requested, 700);
        }
        other => panic!("{other:?}"),
    }
    // ...but do fit a high-priority one, which may use the reserve.
    let high = RunOptions {
        priority: Priority::High,
        ..RunOptions::default()
    };
    let a = llm.try_acquire(&request(), &high).unwrap();
    assert_eq!(a.priority(), Priority::High);
    assert_eq!(a.reservation().unwrap().total(), 700);
    assert_eq!(
        llm.estimate(&request(), &high).unwrap(),
        a.reservation(),
        "the acquire reserves what estimate previews"
    );
    drop(a);
    // A reservation override replaces the estimator.
    let small = RunOptions {
        reservation: Some(ReservationOverride {
            input: 10,
            max_output: 20,
            reserved: None,
        }),
        ..RunOptions::default()
    };
    let a = llm.try_acquire(&request(), &small).unwrap();
    assert_eq!(a.reservation().unwrap().total(), 30);
    assert_eq!(llm.bulkhead().stats().admitted, 2);
    drop(a);
    // Never de-duplicated: an acquire on a de-duplicating bulkhead is a plain acquire.
    let shared = dedup_llm(Bulkhead::new(2).unwrap());
    let (x, y) = (
        shared.try_acquire(&request(), &RunOptions::default()),
        shared.try_acquire(&request(), &RunOptions::default()),
    );
    assert!(x.is_ok() && y.is_ok());
    assert_eq!(shared.stats().dedup.unwrap().hits, 0);
}

#[test]
fn acquires_apply_the_class_and_refuse_what_they_cannot_honour() {
    let b = llm_support::premium_and_batch(Bulkhead::builder().max_concurrent(2))
        .build()
        .unwrap();
    let premium = b.class_id("premium").unwrap();
    let llm = LlmBulkhead::new(b, NaiveEstimator);
    let in_premium = RunOptions {
        class: Some(premium),
        ..RunOptions::default()
    };
    let a = llm.acquire_blocking(&request(), in_premium).unwrap();
    assert_eq!(a.class(), Some(premium));
    assert!(!a.resources().borrowed_concurrency);
    let other = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .class("x", ClassLimits::default())
            .default_class("x")
            .build()
            .unwrap(),
        NaiveEstimator,
    );
    let foreign = other.bulkhead().class_id("x").unwrap();
    let invalid = |o: RunOptions, field: &str| match llm.try_acquire(&request(), &o) {
        Err(AcquireError::Invalid(EstimateError::InvalidSetting { field: f, .. })) => {
            assert_eq!(f, field)
        }
        r => panic!("expected an invalid {field}, got {r:?}"),
    };
    invalid(
        RunOptions {
            class: Some(foreign),
            ..RunOptions::default()
        },
        "class",
    );
    invalid(
        RunOptions {
            borrowed_concurrency_deadline: Some(Deadline::Manual(DeadlineTrigger::new())),
            ..RunOptions::default()
        },
        "borrowed_concurrency_deadline",
    );
    invalid(
        RunOptions {
            mode: Mode::observe(),
            ..RunOptions::default()
        },
        "mode",
    );
    invalid(
        RunOptions {
            wait: WaitOptions {
                timeout: QueueTimeout::After(Duration::from_secs(1)),
                cancel: None,
            },
            ..RunOptions::default()
        },
        "wait",
    );
    // Nothing was taken or counted by the invalid calls.
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.rejected, s.in_flight), (1, 0, 1));
    drop(a);
}

#[test]
fn the_async_acquire_waits_in_the_queue_with_the_options_wait() {
    // One slot, a queue, and room in the budget for two reservations.
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(2)
        .token_budget(2_000)
        .high_priority_reserve(400)
        .build()
        .unwrap();
    let llm = LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(300, 400).unwrap()));
    let high = || RunOptions {
        priority: Priority::High,
        ..RunOptions::default()
    };
    let held = llm.try_acquire(&request(), &high()).unwrap();
    let mut waiting = Box::pin(llm.acquire(&request(), high()));
    assert!(poll(waiting.as_mut()).is_pending());
    assert_eq!(llm.bulkhead().stats().pending, 1);
    // A cancelled token answers `aborted`.
    let token = CancelToken::new();
    token.cancel();
    let cancelled = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::Default,
            cancel: Some(token),
        },
        ..high()
    };
    match futures_lite::future::block_on(llm.acquire(&request(), cancelled)) {
        Err(AcquireError::Rejected(r)) => assert_eq!(r.reason, RejectReason::Aborted),
        other => panic!("{other:?}"),
    }
    drop(held);
    let a = match poll(waiting.as_mut()) {
        Poll::Ready(Ok(a)) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!(a.reservation().unwrap().total(), 700);
    drop(a);
    // The blocking one with a zero timeout behind a held slot: `timeout`.
    let _held = llm.try_acquire(&request(), &high()).unwrap();
    let zero = RunOptions {
        wait: WaitOptions {
            timeout: QueueTimeout::After(Duration::ZERO),
            cancel: None,
        },
        ..high()
    };
    match llm.acquire_blocking(&request(), zero) {
        Err(AcquireError::Rejected(r)) => assert_eq!(r.reason, RejectReason::Timeout),
        other => panic!("{other:?}"),
    }
}

// Item 6: an empty model name is a typed error.

#[cfg(feature = "json")]
#[test]
fn an_empty_model_name_is_refused_with_a_typed_error() {
    use llm_bulkhead::config::{BulkheadConfig, LoadError};
    use llm_bulkhead::llm::ModelAwareEstimator;
    match BulkheadConfig::from_json(r#"{"max_concurrent": 1, "model": ""}"#) {
        Err(LoadError::Parse { path, .. }) => assert_eq!(path, "model"),
        other => panic!("{other:?}"),
    }
    let mut c = BulkheadConfig::from_json(r#"{"max_concurrent": 1, "model": "gpt-4o"}"#).unwrap();
    assert!(c.build_llm().is_ok());
    c.model = Some(String::new()); // set in code, past the reader
    assert!(matches!(
        c.build_llm(),
        Err(LoadError::Estimator(EstimateError::InvalidSetting {
            field: "default_model",
            ..
        }))
    ));
    let invalid = |e: Result<ModelAwareEstimator, EstimateError>, field: &str| match e {
        Err(EstimateError::InvalidSetting { field: f, .. }) => assert_eq!(f, field),
        other => panic!("expected an invalid {field}, got {:?}", other.map(|_| ())),
    };
    invalid(
        ModelAwareEstimator::builder().default_model("").build(),
        "default_model",
    );
    invalid(
        ModelAwareEstimator::builder().ratio("", 3.0).build(),
        "ratio",
    );
}
