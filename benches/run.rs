//! The cost of events and of `run`, each beside the bare pair it wraps, in one group per
//! question so that one run gives comparable numbers.
//!
//! * `events`: `try_acquire` + drop (budget and reservation, as `core`'s `ours_slots_tokens`)
//!   with nobody subscribed (the fast path, one relaxed flag load per hook), after a
//!   subscription was dropped again (the flag back to false), and with one no-op subscriber
//!   (each admission and release builds its event and calls the subscriber). The no-events
//!   baseline (the code before events) is `core`'s `uncontended_pair/ours_slots_tokens`, run
//!   from the parent commit; `bare_atomic_floor` is here for scale.
//! * `run`: the `run` overhead without estimation: `run_blocking` of a trivial closure and the
//!   async `run` of a trivial future (polled once with a no-op waker; it completes in that
//!   poll), on a bulkhead without a budget (no estimate) and on one with a budget and a
//!   per-call reservation override (no estimator call), each beside the bare
//!   `try_acquire` + `release` pair of the same demand; and `run_blocking` on a bulkhead with
//!   classes, protected and borrowing, beside the classed pair of the same demand.
//!   `run_blocking_timed_slot` is `run_blocking_slot` timed (`RunTiming`: three clock
//!   readings and the timing boxed on the context), beside the untimed call.
//!
//! * `observe`: what observe mode (`Mode::Observe`) costs. `enforce_run_blocking_slot` is
//!   `run/run_blocking_slot` again (the enforce path observe mode must not slow down; compare
//!   it with the same bench run from the parent commit with `--save-baseline`/`--baseline`),
//!   `observe_admitted` is an observe-mode `run_blocking` that is admitted (a free slot),
//!   `observe_bypassed` one that the advisory check refuses (`max_concurrent` 0) and that runs
//!   bypassed, and `enforce_refused` the enforce-mode refusal of the same call, for scale.
//!   `pair_slot` is the bare pair, the in-run reference for ratios.
//!
//! Estimation cost (a 200-character message) is in `benches/estimate.rs`.

use criterion::{black_box, criterion_main, Criterion};
use llm_bulkhead::llm::{
    LlmBulkhead, LlmRequest, Mode, NaiveEstimator, ReservationOverride, RunOptions,
};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Event, Reservation};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const MAX_CONCURRENT: u32 = 1024;
const BUDGET: u64 = 1 << 30;

fn tokens_bulkhead() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .token_budget(BUDGET)
        .build()
        .expect("valid limits")
}

fn token_demand() -> Demand {
    Demand::tokens(Reservation::new(1_200, 800).expect("no overflow"))
}

#[inline(always)]
fn pair(b: &Bulkhead, demand: Demand) -> bool {
    match b.try_acquire(black_box(demand)) {
        Ok(a) => {
            drop(a);
            true
        }
        Err(r) => {
            drop(r);
            false
        }
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
}

fn events(c: &mut Criterion) {
    let mut g = c.benchmark_group("events");
    let floor = AtomicU64::new(0);
    g.bench_function("bare_atomic_floor", |b| {
        b.iter(|| {
            let f = black_box(&floor);
            let cur = f.load(Ordering::Acquire);
            let ok = cur < 1024
                && f.compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
            if ok {
                f.fetch_sub(1, Ordering::Release);
            }
            black_box(ok)
        })
    });
    let plain = tokens_bulkhead();
    g.bench_function("no_subscriber", |b| b.iter(|| pair(&plain, token_demand())));
    let unsubscribed = tokens_bulkhead();
    drop(unsubscribed.subscribe(|_: &Event| {}));
    g.bench_function("unsubscribed", |b| {
        b.iter(|| pair(&unsubscribed, token_demand()))
    });
    let observed = tokens_bulkhead();
    let seen = std::sync::Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let _sub = observed.subscribe(move |e: &Event| {
        black_box(e);
        s.fetch_add(1, Ordering::Relaxed);
    });
    g.bench_function("one_subscriber", |b| {
        b.iter(|| pair(&observed, token_demand()))
    });
    g.finish();
    // (`seen` stays 0 when a filter skipped `one_subscriber`.)
    black_box(seen.load(Ordering::Relaxed));
}

fn poll_ready<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a trivial run completes in one poll"),
    }
}

fn run(c: &mut Criterion) {
    let mut g = c.benchmark_group("run");
    let request = LlmRequest::new("m", &["x"]);

    let slots = Bulkhead::new(MAX_CONCURRENT).expect("valid limits");
    g.bench_function("pair_slot", |b| {
        b.iter(|| {
            let a = slots.try_acquire(black_box(Demand::slot())).unwrap();
            black_box(a.release(None).is_ok())
        })
    });
    let llm_slots = LlmBulkhead::new(slots.clone(), NaiveEstimator);
    g.bench_function("run_blocking_slot", |b| {
        b.iter(|| {
            llm_slots
                .run_blocking(black_box(&request), RunOptions::default(), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                })
                .unwrap()
        })
    });
    // The same run, timed: what asking for `RunTiming` costs over the untimed call.
    g.bench_function("run_blocking_timed_slot", |b| {
        b.iter(|| {
            let t =
                llm_slots.run_blocking_timed(black_box(&request), RunOptions::default(), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                });
            (t.value.unwrap(), t.timing)
        })
    });
    g.bench_function("run_async_slot", |b| {
        b.iter(|| {
            poll_ready(
                llm_slots.run(black_box(&request), RunOptions::default(), async |ctx| {
                    Ok::<_, ()>(ctx.revision())
                }),
            )
            .unwrap()
        })
    });

    let tokens = tokens_bulkhead();
    g.bench_function("pair_tokens", |b| {
        b.iter(|| {
            let a = tokens.try_acquire(black_box(token_demand())).unwrap();
            black_box(a.release(None).is_ok())
        })
    });
    let llm_tokens = LlmBulkhead::new(tokens.clone(), NaiveEstimator);
    let over = || RunOptions {
        reservation: Some(ReservationOverride {
            input: 1_200,
            max_output: 800,
            reserved: None,
        }),
        ..RunOptions::default()
    };
    g.bench_function("run_blocking_tokens_override", |b| {
        b.iter(|| {
            llm_tokens
                .run_blocking(black_box(&request), black_box(over()), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                })
                .unwrap()
        })
    });
    g.bench_function("run_async_tokens_override", |b| {
        b.iter(|| {
            poll_ready(
                llm_tokens.run(black_box(&request), black_box(over()), async |ctx| {
                    Ok::<_, ()>(ctx.revision())
                }),
            )
            .unwrap()
        })
    });

    // With classes: the class protocol's fast path, protected (inside the class's floors) and
    // borrowing (no floor), each beside the bare pair of the same demand.
    let classed = Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .class(
            "floor",
            ClassLimits {
                protected_concurrent: 8,
                ..ClassLimits::default()
            },
        )
        .class("shared", ClassLimits::default())
        .default_class("shared")
        .build()
        .expect("valid limits");
    let floor = classed.class_id("floor").expect("a class");
    let shared = classed.class_id("shared").expect("a class");
    let llm_classed = LlmBulkhead::new(classed.clone(), NaiveEstimator);
    for (name, class) in [("protected", floor), ("borrowing", shared)] {
        g.bench_function(format!("pair_classed_{name}"), |b| {
            b.iter(|| {
                let a = classed
                    .try_acquire(black_box(Demand::slot().in_class(class)))
                    .unwrap();
                black_box(a.release(None).is_ok())
            })
        });
        let options = || RunOptions {
            class: Some(class),
            ..RunOptions::default()
        };
        g.bench_function(format!("run_blocking_classed_{name}"), |b| {
            b.iter(|| {
                llm_classed
                    .run_blocking(black_box(&request), black_box(options()), |ctx| {
                        Ok::<_, ()>(ctx.revision())
                    })
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn observe(c: &mut Criterion) {
    let mut g = c.benchmark_group("observe");
    let request = LlmRequest::new("m", &["x"]);
    let observe = || RunOptions {
        mode: Mode::observe(),
        ..RunOptions::default()
    };
    let slots = Bulkhead::new(MAX_CONCURRENT).expect("valid limits");
    g.bench_function("pair_slot", |b| {
        b.iter(|| {
            let a = slots.try_acquire(black_box(Demand::slot())).unwrap();
            black_box(a.release(None).is_ok())
        })
    });
    let llm = LlmBulkhead::new(slots.clone(), NaiveEstimator);
    g.bench_function("enforce_run_blocking_slot", |b| {
        b.iter(|| {
            llm.run_blocking(black_box(&request), RunOptions::default(), |ctx| {
                Ok::<_, ()>(ctx.revision())
            })
            .unwrap()
        })
    });
    g.bench_function("observe_admitted", |b| {
        b.iter(|| {
            llm.run_blocking(black_box(&request), black_box(observe()), |ctx| {
                Ok::<_, ()>(ctx.revision())
            })
            .unwrap()
        })
    });
    let closed_door = LlmBulkhead::new(Bulkhead::new(0).expect("valid limits"), NaiveEstimator);
    g.bench_function("observe_bypassed", |b| {
        b.iter(|| {
            closed_door
                .run_blocking(black_box(&request), black_box(observe()), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                })
                .unwrap()
        })
    });
    g.bench_function("enforce_refused", |b| {
        b.iter(|| {
            closed_door
                .run_blocking(black_box(&request), RunOptions::default(), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                })
                .is_err()
        })
    });
    g.finish();
    assert_eq!(closed_door.bulkhead().stats().admitted, 0);
}

/// The criterion groups of this target (in a module: the macro's function has no doc comment).
mod group {
    criterion::criterion_group! {
        name = benches;
        config = super::config();
        targets = super::events, super::run, super::observe
    }
}
criterion_main!(group::benches);
