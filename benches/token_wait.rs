//! Criterion benchmarks of token waiting (`BulkheadBuilder::wait_for_tokens`) beside tokio's
//! `Semaphore::acquire_many`, in the same run:
//!
//! * `token_handoff_blocking`: two OS threads, a budget of 100 tokens (slots to spare), each
//!   demand 60 tokens, so only one fits at a time: each release hands its tokens to the other,
//!   parked thread. One iteration is one hand-off. Ours (`acquire_blocking`) beside tokio's
//!   `acquire_many(60)` on a 100-permit semaphore driven by `futures_lite::future::block_on`.
//! * `token_handoff_async`: the same with two tasks on a two-worker tokio runtime.
//! * `fairness_64`: one thread holds the whole budget, queues 64 waiters of mixed sizes (1 to
//!   1,000 tokens of 1,000), then frees the budget and releases each admission as soon as it
//!   completes. One iteration is the whole cycle; before timing, the order of completion is
//!   checked against the order of arrival (printed as inversions: 0 means FIFO).

use criterion::{criterion_main, Criterion, Throughput};
use llm_bulkhead::{Bulkhead, Demand, Reservation, WaitOptions};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

fn t(n: u64) -> Demand {
    Demand::tokens(Reservation::new(0, n).unwrap())
}

fn token_bulkhead(budget: u64, queue: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(100)
        .max_queue(queue)
        .token_budget(budget)
        .wait_for_tokens(true)
        .build()
        .unwrap()
}

fn run_threads(threads: usize, per_thread: u64, turn: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(threads);
    let (barrier, turn) = (&barrier, &turn);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..per_thread {
                        turn();
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        let spans: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        spans.iter().map(|s| s.1).max().unwrap() - spans.iter().map(|s| s.0).min().unwrap()
    })
}

fn token_handoff_blocking(c: &mut Criterion) {
    let mut g = c.benchmark_group("token_handoff_blocking");
    g.throughput(Throughput::Elements(1));
    let b = token_bulkhead(100, 2);
    g.bench_function("ours", |bench| {
        bench.iter_custom(|iters| {
            run_threads(2, iters.div_ceil(2), || {
                drop(b.acquire_blocking(t(60), WaitOptions::default()).unwrap())
            })
        })
    });
    let sem = Semaphore::new(100);
    g.bench_function("tokio_acquire_many", |bench| {
        bench.iter_custom(|iters| {
            run_threads(2, iters.div_ceil(2), || {
                drop(futures_lite::future::block_on(sem.acquire_many(60)).unwrap())
            })
        })
    });
    g.finish();
    assert_eq!(b.stats().in_flight, 0);
}

fn async_turns<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, turn: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per = iters.div_ceil(2);
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let turn = turn.clone();
                tokio::spawn(async move {
                    for _ in 0..per {
                        turn().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        start.elapsed()
    })
}

fn token_handoff_async(c: &mut Criterion) {
    let mut g = c.benchmark_group("token_handoff_async");
    g.throughput(Throughput::Elements(1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let b = token_bulkhead(100, 2);
    g.bench_function("ours", |bench| {
        bench.iter_custom(|iters| {
            let b = b.clone();
            async_turns(&rt, iters, move || {
                let b = b.clone();
                async move { drop(b.acquire(t(60), WaitOptions::default()).await) }
            })
        })
    });
    let sem = Arc::new(Semaphore::new(100));
    g.bench_function("tokio_acquire_many", |bench| {
        bench.iter_custom(|iters| {
            let sem = sem.clone();
            async_turns(&rt, iters, move || {
                let sem = sem.clone();
                async move { drop(sem.acquire_many(60).await.unwrap()) }
            })
        })
    });
    g.finish();
}

const SIZES: usize = 64;

fn sizes() -> Vec<u32> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..SIZES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000 + 1) as u32
        })
        .collect()
}

fn poll<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Pairs out of arrival order in `order`.
fn inversions(order: &[usize]) -> usize {
    let mut n = 0;
    for i in 0..order.len() {
        for j in i + 1..order.len() {
            n += usize::from(order[i] > order[j]);
        }
    }
    n
}

/// One fairness cycle on our bulkhead; returns the completion order.
fn ours_cycle(b: &Bulkhead, sizes: &[u32]) -> Vec<usize> {
    let first = b.try_acquire(t(1_000)).unwrap();
    let mut futs: Vec<_> = sizes
        .iter()
        .map(|&n| Some(Box::pin(b.acquire(t(u64::from(n)), WaitOptions::default()))))
        .collect();
    for f in futs.iter_mut().flatten() {
        assert!(poll(f.as_mut()).is_pending());
    }
    drop(first);
    let mut order = Vec::with_capacity(sizes.len());
    while order.len() < sizes.len() {
        for (i, slot) in futs.iter_mut().enumerate() {
            if let Some(f) = slot {
                if let Poll::Ready(a) = poll(f.as_mut()) {
                    drop(a.unwrap()); // released at once: hands its tokens on
                    order.push(i);
                    *slot = None;
                }
            }
        }
    }
    order
}

/// The same cycle on a tokio semaphore with `acquire_many`.
fn tokio_cycle(sem: &Semaphore, sizes: &[u32]) -> Vec<usize> {
    let first = sem.try_acquire_many(1_000).unwrap();
    let mut futs: Vec<_> = sizes
        .iter()
        .map(|&n| Some(Box::pin(sem.acquire_many(n))))
        .collect();
    for f in futs.iter_mut().flatten() {
        assert!(poll(f.as_mut()).is_pending());
    }
    drop(first);
    let mut order = Vec::with_capacity(sizes.len());
    while order.len() < sizes.len() {
        for (i, slot) in futs.iter_mut().enumerate() {
            if let Some(f) = slot {
                if let Poll::Ready(p) = poll(f.as_mut()) {
                    drop(p.unwrap());
                    order.push(i);
                    *slot = None;
                }
            }
        }
    }
    order
}

fn fairness(c: &mut Criterion) {
    let sizes = sizes();
    let b = token_bulkhead(1_000, SIZES as u32);
    let sem = Semaphore::new(1_000);
    let (ours, theirs) = (ours_cycle(&b, &sizes), tokio_cycle(&sem, &sizes));
    eprintln!(
        "fairness_64: inversions of completion vs arrival: ours {}, tokio acquire_many {}",
        inversions(&ours),
        inversions(&theirs)
    );
    assert_eq!(inversions(&ours), 0);
    let mut g = c.benchmark_group("fairness_64");
    g.throughput(Throughput::Elements(SIZES as u64));
    g.bench_function("ours", |bench| bench.iter(|| ours_cycle(&b, &sizes)));
    g.bench_function("tokio_acquire_many", |bench| {
        bench.iter(|| tokio_cycle(&sem, &sizes))
    });
    g.finish();
}

fn benches() {
    let mut c = config().configure_from_args();
    token_handoff_blocking(&mut c);
    token_handoff_async(&mut c);
    fairness(&mut c);
}

criterion_main!(benches);
