//! What telemetry costs a decision: a `try_acquire` + drop pair on a bulkhead without classes
//! (1,000 slots, `Demand::slot()`), on one thread and on two threads sharing the bulkhead,
//! in three variants measured in one process:
//!
//! * `bare`: nobody subscribed (the anchor);
//! * `noop_subscriber`: one subscriber that does nothing, so every admission and release
//!   builds its event and delivers it;
//! * `telemetry`: `telemetry::Telemetry::default().instrument(..)` (tracing and metrics, as the
//!   gateway example runs it) with a Prometheus recorder installed, scraped once per sample
//!   ([`Telemetry::record`] + `render`, outside the timed loop).
//!
//! Groups: `telemetry_pair` (one pair per iteration) and `telemetry_two_threads` (one pair on
//! each of two threads per iteration: wall time of the run over `iters`). `scripts/perf-table`
//! shows each variant as a ratio to `bare` of the same group and run.

use criterion::{black_box, criterion_main, Criterion};
use llm_bulkhead::telemetry::Telemetry;
use llm_bulkhead::{Bulkhead, Demand, Event};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// 1,000 slots: far above what two threads hold at once, so no pair is ever refused.
fn bulkhead() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(1_000)
        .build()
        .expect("valid limits")
}

#[inline(always)]
fn pair(b: &Bulkhead) -> bool {
    match b.try_acquire(black_box(Demand::slot())) {
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

/// `iters` pairs on each of two threads; the wall time from the barrier to the last finish.
fn two(b: &Bulkhead, iters: u64) -> Duration {
    let barrier = Barrier::new(2);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let h: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        assert!(pair(black_box(b)), "a pair was refused");
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        h.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    let start = spans.iter().map(|s| s.0).min().expect("two");
    let end = spans.iter().map(|s| s.1).max().expect("two");
    end - start
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

fn telemetry(c: &mut Criterion) {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder");
    let bare = bulkhead();
    let noop = bulkhead();
    let _noop_sub = noop.subscribe(|e: &Event| {
        black_box(e);
    });
    let instrumented = bulkhead();
    let telemetry = Telemetry::default().name("bench");
    let _telemetry_sub = telemetry.instrument(&instrumented);
    let scrape = || {
        telemetry.record(&instrumented);
        black_box(prometheus.render());
    };

    let mut g = c.benchmark_group("telemetry_pair");
    g.bench_function("bare", |b| b.iter(|| pair(&bare)));
    g.bench_function("noop_subscriber", |b| b.iter(|| pair(&noop)));
    g.bench_function("telemetry", |b| {
        scrape();
        b.iter(|| pair(&instrumented))
    });
    g.finish();

    let mut g = c.benchmark_group("telemetry_two_threads");
    g.bench_function("bare", |b| b.iter_custom(|n| two(&bare, n)));
    g.bench_function("noop_subscriber", |b| b.iter_custom(|n| two(&noop, n)));
    g.bench_function("telemetry", |b| {
        b.iter_custom(|n| {
            scrape();
            two(&instrumented, n)
        })
    });
    g.finish();
    // Every pair the telemetry variant made is in what a scrape exports.
    scrape();
    let text = prometheus.render();
    assert!(
        text.contains("llm_bulkhead_admitted_total{bulkhead=\"bench\"}"),
        "{text}"
    );
}

/// The criterion groups of this target (in a module: the macro's function has no doc comment).
mod group {
    criterion::criterion_group! {
        name = benches;
        config = super::config();
        targets = super::telemetry
    }
}
criterion_main!(group::benches);
