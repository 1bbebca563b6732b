//! Timing through `run` (issue 32 item 4): `run_timed`, `run_blocking_timed` and
//! `run_shared_timed` report how long the decision took, how long of it was queued and how long
//! the work ran, and the work reads the decision's part from its context. Every duration comes
//! from an injected clock that moves only when the test moves it (and, for [`Ticking`], by a
//! fixed step at each reading), so the figures are checked exactly; nothing sleeps. Untimed
//! calls must not read the clock at all. A property test drives the engine and a model of the
//! readings with the same random paths, steps and work times.
#![cfg(feature = "serde")]

#[path = "support/llm.rs"]
mod llm_support;

use futures_lite::future;
use llm_bulkhead::llm::{
    AdmissionKind, Clock, Deadline, DeadlineTrigger, LlmBulkhead, ManualClock, Mode,
    NaiveEstimator, RunError, RunOptions, RunTimed, RunTiming,
};
use llm_bulkhead::{Bulkhead, CancelToken, Demand, RejectReason, Timing, WaitOptions};
use llm_support::{dedup_llm, poll, request};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

/// A clock that steps by `tick` at every reading (after the reading's step, it shows the
/// reading's number times `tick`, plus what `advance` added), and counts its readings.
#[derive(Clone)]
struct Ticking {
    origin: Instant,
    at: Arc<Mutex<Duration>>,
    tick: Duration,
    reads: Arc<AtomicU32>,
}

impl Ticking {
    fn new(tick_ms: u64) -> Ticking {
        Ticking {
            origin: Instant::now(),
            at: Arc::default(),
            tick: Duration::from_millis(tick_ms),
            reads: Arc::default(),
        }
    }
    fn advance(&self, ms: u64) {
        *self.at.lock().unwrap() += Duration::from_millis(ms);
    }
    fn reads(&self) -> u32 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Clock for Ticking {
    fn now(&self) -> Instant {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let mut at = self.at.lock().unwrap();
        *at += self.tick;
        self.origin + *at
    }
}

fn timing(decision_ms: u64, queue_ms: u64, work_ms: Option<u64>) -> RunTiming {
    let mut t = RunTiming::default();
    t.decision_ns = decision_ms * MS;
    t.queue_wait_ns = queue_ms * MS;
    t.work_ns = work_ms.map(|w| w * MS);
    t
}

fn decision(decision_ms: u64, queue_ms: u64) -> Timing {
    timing(decision_ms, queue_ms, None).decision()
}

fn timed<T: std::fmt::Debug>(t: RunTimed<T>) -> (T, RunTiming) {
    (t.value, t.timing)
}

#[test]
fn untimed_runs_read_no_clock_and_give_the_work_no_timing() {
    let clock = Ticking::new(1);
    let llm =
        dedup_llm(Bulkhead::builder().max_concurrent(1).build().unwrap()).with_clock(clock.clone());
    let solo = RunOptions {
        dedup: false,
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&request(), solo.clone(), |ctx| {
        Ok::<_, ()>((ctx.timing(), ctx.admitted_at()))
    });
    assert_eq!(r.unwrap(), (None, None));
    let r = future::block_on(llm.run(&request(), solo.clone(), async |ctx| {
        Ok::<_, ()>(ctx.timing())
    }));
    assert_eq!(r.unwrap(), None);
    // A shared run, and a follower of it.
    let leader = llm.run_shared(&request(), RunOptions::default(), |ctx| {
        let t = ctx.timing();
        Box::pin(async move { Ok::<_, ()>(t) })
    });
    let follower = llm.run_shared(&request(), RunOptions::default(), |_| {
        Box::pin(async { Ok::<_, ()>(Some(Timing::default())) })
    });
    let (a, b) = future::block_on(async { (leader.await, follower.await) });
    assert_eq!((a.unwrap(), b.unwrap()), (None, None));
    // Refusals, through the waiting acquire too (a token makes the fast decision decline).
    let held = llm.bulkhead().try_acquire(Demand::slot()).unwrap();
    let token = RunOptions {
        wait: WaitOptions::new().cancel(CancelToken::new()),
        ..solo.clone()
    };
    for options in [solo, token] {
        let r = llm.run_blocking(&request(), options, |_| Ok::<_, ()>(()));
        assert!(matches!(r, Err(RunError::Rejected(_))));
    }
    drop(held);
    assert_eq!(clock.reads(), 0, "an untimed call read the clock");
}

#[test]
fn a_timed_run_on_a_free_slot_reports_its_decision_and_its_work() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(3));
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    let (r, t) = timed(
        llm.run_blocking_timed(&request(), RunOptions::default(), |ctx| {
            let seen = (ctx.timing(), ctx.admitted_at());
            clock.advance(Duration::from_millis(40)); // the provider call
            Ok::<_, ()>(seen)
        }),
    );
    let admitted = clock.origin() + Duration::from_secs(3);
    assert_eq!(r.unwrap(), (Some(decision(0, 0)), Some(admitted)));
    assert_eq!(t, timing(0, 0, Some(40)));
    // The async `run` the same way.
    let (r, t) = timed(future::block_on(llm.run_timed(
        &request(),
        RunOptions::default(),
        async |ctx| {
            clock.advance(Duration::from_millis(15));
            Ok::<_, ()>(ctx.timing())
        },
    )));
    assert_eq!(
        (r.unwrap(), t),
        (Some(decision(0, 0)), timing(0, 0, Some(15)))
    );
}

#[test]
fn the_readings_split_decision_queue_and_work() {
    // One millisecond per reading: the figures count the readings between the steps.
    let clock = Ticking::new(1);
    let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator).with_clock(clock.clone());
    // The fast decision: start, decided, ended.
    let (r, t) = timed(
        llm.run_blocking_timed(&request(), RunOptions::default(), |ctx| {
            Ok::<_, ()>(ctx.timing())
        }),
    );
    assert_eq!(
        (r.unwrap(), t),
        (Some(decision(1, 0)), timing(1, 0, Some(1)))
    );
    assert_eq!(clock.reads(), 3);
    // A token sends it to the waiting acquire, which admits without queueing: one reading
    // more, still decision time.
    let with_token = || RunOptions {
        wait: WaitOptions::new().cancel(CancelToken::new()),
        ..RunOptions::default()
    };
    let (r, t) =
        timed(llm.run_blocking_timed(&request(), with_token(), |ctx| Ok::<_, ()>(ctx.timing())));
    assert_eq!(
        (r.unwrap(), t),
        (Some(decision(2, 0)), timing(2, 0, Some(1)))
    );
    // Refused without a queue: timed, and no work.
    let held = llm.bulkhead().try_acquire(Demand::slot()).unwrap();
    let (r, t) =
        timed(llm.run_blocking_timed(&request(), RunOptions::default(), |_| Ok::<_, ()>(())));
    assert!(
        matches!(r, Err(RunError::Rejected(ref x)) if x.reason == RejectReason::ConcurrencyLimit)
    );
    assert_eq!(t, timing(2, 0, None));
    drop(held);
    // Invalid before any decision: nothing read.
    let before = clock.reads();
    let bad = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::After(Duration::ZERO)),
        ..RunOptions::default()
    };
    let (r, t) = timed(llm.run_blocking_timed(&request(), bad, |_| Ok::<_, ()>(())));
    assert!(matches!(r, Err(RunError::Invalid(_))));
    assert_eq!((t, clock.reads()), (RunTiming::default(), before));
}

#[test]
fn a_queued_blocking_run_reports_its_queue_wait() {
    let clock = Ticking::new(1);
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(1)
            .build()
            .unwrap(),
        NaiveEstimator,
    )
    .with_clock(clock.clone());
    let held = llm.bulkhead().try_acquire(Demand::slot()).unwrap();
    let runner = {
        let llm = llm.clone();
        std::thread::spawn(move || {
            llm.run_blocking_timed(&request(), RunOptions::default(), |ctx| {
                Ok::<_, ()>(ctx.timing())
            })
        })
    };
    while llm.bulkhead().stats().pending == 0 {
        std::thread::yield_now(); // until the run is queued
    }
    clock.advance(30);
    drop(held); // hands the slot to the queued run
    let (r, t) = timed(runner.join().unwrap());
    // Readings: start 1, waiting 2, (+30) decided 33, ended 34.
    assert_eq!(r.unwrap(), Some(decision(1, 31)));
    assert_eq!(t, timing(1, 31, Some(1)));
}

#[test]
fn a_queued_async_run_reports_its_queue_wait_and_a_timed_out_one_too() {
    let clock = ManualClock::new();
    let llm = LlmBulkhead::new(
        Bulkhead::builder()
            .max_concurrent(1)
            .max_queue(2)
            .build()
            .unwrap(),
        NaiveEstimator,
    )
    .with_clock(clock.clone());
    let held = llm.bulkhead().try_acquire(Demand::slot()).unwrap();
    let mut run = Box::pin(
        llm.run_timed(&request(), RunOptions::default(), async |ctx| {
            clock.advance(Duration::from_millis(5));
            Ok::<_, ()>(ctx.timing())
        }),
    );
    assert!(poll(run.as_mut()).is_pending());
    assert_eq!(llm.bulkhead().stats().pending, 1);
    clock.advance(Duration::from_millis(25));
    drop(held);
    let Poll::Ready(t) = poll(run.as_mut()) else {
        panic!("the run should be admitted once the slot is handed over")
    };
    let (r, t) = timed(t);
    assert_eq!(r.unwrap(), Some(decision(0, 25)));
    assert_eq!(t, timing(0, 25, Some(5)));
    // A refusal after queueing (its token cancelled) is timed as queue wait, with no work.
    let held = llm.bulkhead().try_acquire(Demand::slot()).unwrap();
    let token = CancelToken::new();
    let options = RunOptions {
        wait: WaitOptions::new().cancel(token.clone()),
        ..RunOptions::default()
    };
    let mut run = Box::pin(llm.run_timed(&request(), options, async |_| Ok::<_, ()>(())));
    assert!(poll(run.as_mut()).is_pending());
    clock.advance(Duration::from_millis(12));
    token.cancel();
    let Poll::Ready(t) = poll(run.as_mut()) else {
        panic!("a cancelled wait answers")
    };
    let (r, t) = timed(t);
    assert!(matches!(r, Err(RunError::Rejected(ref x)) if x.reason == RejectReason::Aborted));
    assert_eq!(t, timing(0, 12, None));
    drop(held);
}

#[test]
fn the_work_time_of_a_run_answered_at_the_deadline_ends_at_expiry() {
    let clock = ManualClock::new();
    let b = llm_support::borrowing_builder().build().unwrap();
    let llm = LlmBulkhead::new(b, NaiveEstimator).with_clock(clock.clone());
    let trigger = DeadlineTrigger::new();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        ..RunOptions::default()
    };
    let (r, t) = timed(future::block_on(llm.run_timed(
        &request(),
        options,
        async |_| {
            clock.advance(Duration::from_millis(70));
            trigger.fire();
            future::pending::<Result<(), ()>>().await
        },
    )));
    assert!(matches!(r, Err(RunError::Deadline(_))));
    assert_eq!(t, timing(0, 0, Some(70)));
}

#[test]
fn shared_runs_time_the_leader_and_the_followers_wait() {
    let clock = ManualClock::new();
    let llm = dedup_llm(Bulkhead::new(2).unwrap()).with_clock(clock.clone());
    let (go, gate) = tokio::sync::oneshot::channel::<()>();
    let tick = clock.clone();
    let mut leader =
        Box::pin(
            llm.run_shared_timed(&request(), RunOptions::default(), move |ctx| {
                let seen = ctx.timing();
                Box::pin(async move {
                    gate.await.map_err(|_| ())?;
                    tick.advance(Duration::from_millis(90));
                    Ok::<_, ()>(seen)
                })
            }),
        );
    assert!(poll(leader.as_mut()).is_pending());
    clock.advance(Duration::from_millis(10)); // the follower joins 10 ms into the call
    let mut follower = Box::pin(
        llm.run_shared_timed(&request(), RunOptions::default(), |_| {
            Box::pin(async { Ok::<_, ()>(None) })
        }),
    );
    assert!(poll(follower.as_mut()).is_pending());
    go.send(()).unwrap();
    let Poll::Ready(a) = poll(leader.as_mut()) else {
        panic!("the leader's call completes")
    };
    let Poll::Ready(b) = poll(follower.as_mut()) else {
        panic!("the follower gets the leader's result")
    };
    let ((a, ta), (b, tb)) = (timed(a), timed(b));
    assert_eq!(
        (a.unwrap(), ta),
        (Some(decision(0, 0)), timing(0, 0, Some(100)))
    );
    assert_eq!(
        (b.unwrap(), tb),
        (Some(decision(0, 0)), timing(0, 90, None))
    );
    assert_eq!(llm.stats().dedup.unwrap().hits, 1);
    // Not de-duplicated (opted out): the leader's own timing, as `run_timed`.
    let solo = RunOptions {
        dedup: false,
        ..RunOptions::default()
    };
    let tick = clock.clone();
    let (r, t) = timed(future::block_on(llm.run_shared_timed(
        &request(),
        solo,
        move |_| {
            Box::pin(async move {
                tick.advance(Duration::from_millis(3));
                Ok::<Option<Timing>, ()>(None)
            })
        },
    )));
    assert_eq!((r.unwrap(), t), (None, timing(0, 0, Some(3))));
}

#[test]
fn an_observed_bypass_is_timed_like_an_admission() {
    let clock = Ticking::new(1);
    let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator).with_clock(clock.clone());
    let observe = RunOptions {
        mode: Mode::observe(),
        ..RunOptions::default()
    };
    let (r, t) = timed(llm.run_blocking_timed(&request(), observe, |ctx| {
        Ok::<_, ()>((ctx.admission_kind(), ctx.timing()))
    }));
    // start 1, waiting 2, decided 3, ended 4.
    assert_eq!(r.unwrap(), (AdmissionKind::Bypassed, Some(decision(2, 0))));
    assert_eq!(t, timing(2, 0, Some(1)));
}

#[test]
fn a_detached_works_time_ends_when_it_is_handed_on() {
    use llm_bulkhead::llm::{Detach, DetachedWork};
    let clock = ManualClock::new();
    let b = llm_support::borrowing_builder().build().unwrap();
    let llm = LlmBulkhead::new(b, NaiveEstimator).with_clock(clock.clone());
    let parked: Arc<Mutex<Vec<DetachedWork>>> = Arc::default();
    let p = parked.clone();
    let detach: Detach = Arc::new(move |w: DetachedWork| p.lock().unwrap().push(w));
    let trigger = DeadlineTrigger::new();
    let options = RunOptions {
        borrowed_concurrency_deadline: Some(Deadline::Manual(trigger.clone())),
        detach_at_deadline: Some(detach),
        ..RunOptions::default()
    };
    let (go, gate) = tokio::sync::oneshot::channel::<()>();
    let tick = clock.clone();
    let mut run = Box::pin(llm.run_shared_timed(&request(), options, move |_| {
        Box::pin(async move {
            tick.advance(Duration::from_millis(20));
            gate.await.map_err(|_| ())?; // the provider call, which ignores the stop signal
            tick.advance(Duration::from_millis(500)); // after the caller was answered
            Ok::<u32, ()>(1)
        })
    }));
    assert!(poll(run.as_mut()).is_pending());
    trigger.fire();
    let Poll::Ready(t) = poll(run.as_mut()) else {
        panic!("answered at expiry")
    };
    let (r, t) = timed(t);
    assert!(matches!(r, Err(RunError::Deadline(_))));
    assert_eq!(t, timing(0, 0, Some(20)));
    // The work goes on where it was handed, and settles when it ends.
    let mut w = parked.lock().unwrap().pop().expect("the work was detached");
    go.send(()).unwrap();
    assert!(poll(w.as_mut()).is_ready());
    assert_eq!(llm.bulkhead().stats().admissions_in_flight, 0);
}

/// The way a generated call goes through the decision.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// A free slot, no token: the fast decision admits.
    Fast,
    /// A free slot and a token: the waiting acquire admits without queueing.
    Slow,
    /// No slot and no queue: refused by the waiting acquire.
    Refused,
    /// No slot, observe mode: bypassed.
    Bypassed,
    /// A zero deadline: invalid before any decision.
    Invalid,
}

/// The model: what a timed run reports, from the readings its path takes (one `tick` each),
/// and the work's own time `work`. Returns the timing and the number of readings.
fn model(path: Path, tick: u64, work: u64) -> (RunTiming, u32) {
    match path {
        // start, decided, ended.
        Path::Fast => (timing(tick, 0, Some(tick + work)), 3),
        // start, waiting, decided, ended.
        Path::Slow | Path::Bypassed => (timing(2 * tick, 0, Some(tick + work)), 4),
        // start, waiting, decided.
        Path::Refused => (timing(2 * tick, 0, None), 3),
        Path::Invalid => (RunTiming::default(), 0),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Engine against model: random paths, clock steps and work times, through the blocking
    /// and the async run; the run's timing, the context's, and the number of clock readings
    /// are the model's.
    #[test]
    fn timed_runs_follow_the_model(
        steps in proptest::collection::vec((0u8..5, 0u64..4, 0u64..50, proptest::bool::ANY), 1..12),
    ) {
        for (path, tick, work, blocking) in steps {
            let path = [Path::Fast, Path::Slow, Path::Refused, Path::Bypassed, Path::Invalid][path as usize];
            let clock = Ticking::new(tick);
            let slots = if matches!(path, Path::Refused | Path::Bypassed) { 0 } else { 1 };
            let llm = LlmBulkhead::new(Bulkhead::new(slots).unwrap(), NaiveEstimator)
                .with_clock(clock.clone());
            let mut options = RunOptions::default();
            match path {
                Path::Slow => options.wait = WaitOptions::new().cancel(CancelToken::new()),
                Path::Bypassed => options.mode = Mode::observe(),
                Path::Invalid => {
                    options.borrowed_concurrency_deadline = Some(Deadline::After(Duration::ZERO))
                }
                Path::Fast | Path::Refused => {}
            }
            let t = if blocking {
                llm.run_blocking_timed(&request(), options, |ctx| {
                    clock.advance(work);
                    Ok::<_, ()>(ctx.timing())
                })
            } else {
                future::block_on(llm.run_timed(&request(), options, async |ctx| {
                    clock.advance(work);
                    Ok::<_, ()>(ctx.timing())
                }))
            };
            let (want, reads) = model(path, tick, work);
            proptest::prop_assert_eq!(t.timing, want);
            proptest::prop_assert_eq!(clock.reads(), reads);
            if let Ok(seen) = t.value {
                proptest::prop_assert_eq!(seen, Some(want.decision()));
            } else {
                proptest::prop_assert!(want.work_ns.is_none());
            }
        }
    }
}
