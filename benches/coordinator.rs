//! The coordinator's uncontended path beside the core's pair, in one group so that one run
//! compares them:
//!
//! * `core_try_acquire_pair`: the core's `try_acquire(Demand::slot())` and drop (the anchor);
//! * `tokio_try_acquire_pair`: tokio's `Semaphore::try_acquire` and drop (a second anchor);
//! * `admit_release`: an eligible ticket with an empty queue, admitted and completed
//!   (`submit` + `wait_blocking` that returns at once + `complete`), the real clocks, u64 keys
//!   (the uncontended path: no mutex, the coarse wall clock for the received-at stamp, no
//!   monotonic clock read);
//! * `admit_release_paced_provider`: the same through a provider with `min_interval` 1 ns
//!   (pacing bookkeeping on every start; the interval has always passed);
//! * `cooldown`: one `cooldown()` call that changes nothing (the provider's not-before is
//!   already later).

use criterion::{black_box, criterion_main, Criterion};
use llm_bulkhead::{Bulkhead, Demand};
use std::time::Duration;

#[path = "support/coordinator.rs"]
mod support;
use support::{coordinator, pair};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("coordinator");
    let core = Bulkhead::builder().max_concurrent(64).build().unwrap();
    g.bench_function("core_try_acquire_pair", |b| {
        b.iter(|| black_box(black_box(&core).try_acquire(Demand::slot()).is_ok()))
    });
    let sem = tokio::sync::Semaphore::new(64);
    g.bench_function("tokio_try_acquire_pair", |b| {
        b.iter(|| black_box(black_box(&sem).try_acquire().is_ok()))
    });
    let co = coordinator(Duration::ZERO);
    let mut key = 0u64;
    g.bench_function("admit_release", |b| {
        b.iter(|| {
            key = key.wrapping_add(1);
            black_box(pair(black_box(&co), key))
        })
    });
    let paced = coordinator(Duration::from_nanos(1));
    g.bench_function("admit_release_paced_provider", |b| {
        b.iter(|| {
            key = key.wrapping_add(1);
            black_box(pair(black_box(&paced), key))
        })
    });
    let cool = coordinator(Duration::ZERO);
    cool.cooldown("a", Duration::from_secs(3600)).unwrap();
    g.bench_function("cooldown", |b| {
        b.iter(|| {
            black_box(
                black_box(&cool)
                    .cooldown("a", Duration::from_millis(1))
                    .is_ok(),
            )
        })
    });
    g.finish();
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
}

criterion_main!(benches);
