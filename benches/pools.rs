//! Gateway pools against the core, in one run.
//!
//! * `pools_pair`: one admission and its release, uncontended: the core's `try_acquire` pair
//!   (the anchor), a pool admission (partition + connection + global guard, with the retry
//!   budget's word in the partition's line) and its release, the same with a token budget, and
//!   a retry's charge, admission and release.
//! * `pools_two_threads`: the pool pair on one thread, and on two threads in partitions of
//!   different providers (they share only the global guard's line), beside the core's pair on
//!   two threads (one shared state word).
//!
//! Run: `cargo bench --bench pools -- --warm-up-time 1 --measurement-time 2`.

use criterion::{black_box, criterion_main, Criterion, Throughput};
use llm_bulkhead::pools::*;
use llm_bulkhead::{Bulkhead, Demand};
use std::sync::Barrier;
use std::time::{Duration, Instant};

fn pools() -> Pools {
    let mut c = PoolsConfig::single("a", "x", 1024);
    c.extend_with("b", "x", 1024);
    c.partitions.get_mut("a-x").unwrap().token_budget = Some(1 << 30);
    Pools::new(&c).expect("valid")
}

fn core_pair(b: &Bulkhead) -> bool {
    match b.try_acquire(black_box(Demand::slot())) {
        Ok(a) => {
            drop(a);
            true
        }
        Err(_) => false,
    }
}

fn pool_pair(p: &Pools, req: &PoolRequest) -> bool {
    match p.try_admit(black_box(req)) {
        Ok(permit) => {
            drop(permit);
            true
        }
        Err(_) => false,
    }
}

fn pools_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("pools_pair");
    let core = Bulkhead::new(1024).unwrap();
    g.bench_function("core_try_acquire_pair", |b| b.iter(|| core_pair(&core)));
    let p = pools();
    let b_id = p.partition("b-x").unwrap();
    let req = PoolRequest::new(1, b_id);
    g.bench_function("pool_admit_release", |b| b.iter(|| pool_pair(&p, &req)));
    let mut tokens = PoolRequest::new(1, p.partition("a-x").unwrap());
    tokens.tokens = 2_000;
    g.bench_function("pool_admit_release_tokens", |b| {
        b.iter(|| pool_pair(&p, &tokens))
    });
    g.bench_function("pool_retry_charge_admit_release", |b| {
        b.iter(|| {
            let charge = p.charge_retry(1, b_id).expect("budget");
            p.admit_retry(black_box(&req), charge)
                .into_permit()
                .is_some()
        })
    });
    g.finish();
    let s = p.stats();
    assert!(s
        .partitions
        .iter()
        .all(|x| x.active == 0 && x.admitted == x.completed));
}

/// `iters` pairs on each of `threads` threads; wall time from the barrier to the last end.
fn run<S: Sync>(
    shared: &S,
    threads: usize,
    iters: u64,
    pair: impl Fn(&S, usize) -> bool + Sync,
) -> Duration {
    let barrier = Barrier::new(threads);
    let (barrier, pair) = (&barrier, &pair);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let w: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        assert!(pair(black_box(shared), i), "refused");
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        w.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    spans.iter().map(|s| s.1).max().unwrap() - start
}

fn pools_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("pools_two_threads");
    let p = pools();
    let reqs = [
        PoolRequest::new(1, p.partition("a-x").unwrap()),
        PoolRequest::new(2, p.partition("b-x").unwrap()),
    ];
    let core = Bulkhead::new(1024).unwrap();
    g.throughput(Throughput::Elements(1));
    g.bench_function("pool_one_thread", |b| {
        b.iter_custom(|n| run(&p, 1, n, |p, i| pool_pair(p, &reqs[i])))
    });
    // One iteration = one pair on each thread.
    g.throughput(Throughput::Elements(2));
    g.bench_function("pool_two_providers", |b| {
        b.iter_custom(|n| run(&p, 2, n, |p, i| pool_pair(p, &reqs[i])))
    });
    g.bench_function("core_two_threads", |b| {
        b.iter_custom(|n| run(&core, 2, n, |c, _| core_pair(c)))
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

/// The criterion group of this target (in a module: the macro's function has no doc comment).
mod group {
    use super::{config, pools_pair, pools_two_threads};
    criterion::criterion_group! {
        name = pools_benches;
        config = config();
        targets = pools_pair, pools_two_threads
    }
}
criterion_main!(group::pools_benches);
