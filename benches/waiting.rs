//! Criterion benchmarks of the wait queue beside tokio's semaphore, in the same run:
//!
//! * `handoff_blocking`: two OS threads share one slot and take turns through the queue: each
//!   release hands the slot to the other thread, which is parked. One iteration is one
//!   hand-off (release → the waiter runs). Ours (`acquire_blocking`) beside tokio's
//!   `Semaphore::acquire` driven by `futures_lite::future::block_on` (which also parks).
//! * `handoff_async`: the same with two tasks on a two-worker tokio runtime, ours
//!   (`acquire().await`) beside tokio's `acquire().await`.
//! * `saturated_queue`: four threads, two slots, a queue of four; one iteration is one
//!   admission + release on each thread (aggregate throughput).
//! * `classes`: the async hand-off and the saturated queue on a bulkhead with two admission
//!   classes (one with a floor), beside the same no-class runs: the cost of class queueing.
//!
//! * `async_acquire_no_wait`: `acquire().await` that never waits (free slots), dropped at once,
//!   in a loop inside one task on a current-thread tokio runtime (what a tokio/axum handler pays
//!   on every request when there is room): ours for a slot and for a slot with a token
//!   reservation, beside tokio's `Semaphore::acquire().await` and our synchronous
//!   `try_acquire` pair in the same loop.
//!
//! `scripts/perf-table` runs this target and prints the README's tables from it.

use criterion::{criterion_main, Criterion, Throughput};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, WaitOptions};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
}

/// Runs `per_thread` turns on each of `threads` threads and returns the wall time.
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
        let start = spans.iter().map(|s| s.0).min().unwrap();
        let end = spans.iter().map(|s| s.1).max().unwrap();
        end - start
    })
}

fn handoff_blocking(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff_blocking");
    g.throughput(Throughput::Elements(1));
    let b = queued_plain(1, 2);
    g.bench_function("ours", |bench| {
        bench.iter_custom(|iters| {
            run_threads(2, iters.div_ceil(2), || {
                drop(
                    b.acquire_blocking(Demand::slot(), WaitOptions::default())
                        .unwrap(),
                )
            })
        })
    });
    let sem = Semaphore::new(1);
    g.bench_function("tokio_semaphore", |bench| {
        bench.iter_custom(|iters| {
            run_threads(2, iters.div_ceil(2), || {
                drop(futures_lite::future::block_on(sem.acquire()).unwrap())
            })
        })
    });
    g.finish();
    assert_eq!(b.stats().in_flight, 0);
}

/// Two tasks on `rt` take `iters / 2` turns each, a turn being one future from `turn`;
/// returns the wall time.
fn async_turns<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, turn: F) -> Duration
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
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
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// [`async_turns`] where a turn is one `acquire().await` of a slot of `b`, dropped at once.
fn our_async_turns(rt: &tokio::runtime::Runtime, iters: u64, b: &Bulkhead) -> Duration {
    let b = b.clone();
    async_turns(rt, iters, move || {
        let b = b.clone();
        async move { drop(b.acquire(Demand::slot(), WaitOptions::default()).await) }
    })
}

fn handoff_async(c: &mut Criterion) {
    let mut g = c.benchmark_group("handoff_async");
    g.throughput(Throughput::Elements(1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let b = queued_plain(1, 2);
    g.bench_function("ours", |bench| {
        bench.iter_custom(|iters| our_async_turns(&rt, iters, &b))
    });
    let sem = Arc::new(Semaphore::new(1));
    g.bench_function("tokio_semaphore", |bench| {
        bench.iter_custom(|iters| {
            let sem = sem.clone();
            async_turns(&rt, iters, move || {
                let sem = sem.clone();
                async move { drop(sem.acquire().await.unwrap()) }
            })
        })
    });
    g.finish();
}

fn saturated_queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("saturated_queue");
    g.throughput(Throughput::Elements(4));
    let b = queued_plain(2, 4);
    g.bench_function("ours_4_threads_2_slots", |bench| {
        bench.iter_custom(|iters| {
            run_threads(4, iters, || {
                drop(
                    b.acquire_blocking(Demand::slot(), WaitOptions::default())
                        .unwrap(),
                )
            })
        })
    });
    let sem = Semaphore::new(2);
    g.bench_function("tokio_4_threads_2_permits", |bench| {
        bench.iter_custom(|iters| {
            run_threads(4, iters, || {
                drop(futures_lite::future::block_on(sem.acquire()).unwrap())
            })
        })
    });
    g.finish();
    eprintln!(
        "size of the acquire future: {} bytes (its waiter node is inside it)",
        std::mem::size_of::<llm_bulkhead::Acquire<'static>>()
    );
}

/// Two classes, `a` with a floor of one slot, `b` without.
fn classed(max_concurrent: u32, max_queue: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(max_queue)
        .class(
            "a",
            ClassLimits {
                protected_concurrent: 1,
                ..ClassLimits::default()
            },
        )
        .class("b", ClassLimits::default())
        .default_class("b")
        .build()
        .unwrap()
}

fn classes(c: &mut Criterion) {
    let mut g = c.benchmark_group("classes_waiting");
    g.throughput(Throughput::Elements(1));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    for (name, b) in [
        ("handoff_async_no_class", queued_plain(1, 2)),
        ("handoff_async_class_b", classed(1, 2)),
    ] {
        g.bench_function(name, |bench| {
            bench.iter_custom(|iters| our_async_turns(&rt, iters, &b))
        });
    }
    g.throughput(Throughput::Elements(4));
    for (name, b) in [
        ("saturated_4_threads_no_class", queued_plain(2, 4)),
        ("saturated_4_threads_classes", two_plain_classes(2, 4)),
    ] {
        let ids = [b.class_id("a").ok(), b.class_id("b").ok()];
        g.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                let next = std::sync::atomic::AtomicUsize::new(0);
                run_threads(4, iters, || {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let d = match ids[i % 2] {
                        Some(k) => Demand::slot().in_class(k),
                        None => Demand::slot(),
                    };
                    drop(b.acquire_blocking(d, WaitOptions::default()).unwrap())
                })
            })
        });
        assert_eq!(b.stats().in_flight, 0);
    }
    g.finish();
}

/// Two classes without floors: every request may wait (with a floor, a borrower is refused
/// for protection instead, CONTRACT.md §2 row 4, and would not measure the queue).
fn two_plain_classes(max_concurrent: u32, max_queue: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(max_queue)
        .class("a", ClassLimits::default())
        .class("b", ClassLimits::default())
        .default_class("b")
        .build()
        .unwrap()
}

fn queued_plain(max_concurrent: u32, max_queue: u32) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .max_queue(max_queue)
        .build()
        .unwrap()
}

/// Runs `iters` awaits of `turn()` in one task on the current-thread runtime `rt`; returns the
/// time of the loop (the runtime's `block_on` entry is outside it).
fn current_thread_loop<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, turn: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    rt.block_on(async {
        let start = Instant::now();
        let mut ok = 0u64;
        for _ in 0..iters {
            ok += u64::from(turn().await);
        }
        let t = start.elapsed();
        assert_eq!(ok, iters, "an acquire failed");
        t
    })
}

fn async_acquire_no_wait(c: &mut Criterion) {
    let mut g = c.benchmark_group("async_acquire_no_wait");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let b = Bulkhead::builder()
        .max_concurrent(1024)
        .max_queue(16)
        .token_budget(1 << 30)
        .build()
        .unwrap();
    let tokens = Demand::tokens(llm_bulkhead::Reservation::new(1_200, 800).unwrap());
    g.bench_function("tokio_semaphore", |bench| {
        let sem = Semaphore::new(1024);
        bench.iter_custom(|iters| {
            current_thread_loop(&rt, iters, || async {
                let p = std::hint::black_box(&sem).acquire().await;
                p.is_ok()
            })
        })
    });
    g.bench_function("ours_slot", |bench| {
        bench.iter_custom(|iters| {
            current_thread_loop(&rt, iters, || async {
                let a = std::hint::black_box(&b)
                    .acquire(std::hint::black_box(Demand::slot()), WaitOptions::default())
                    .await;
                a.is_ok()
            })
        })
    });
    g.bench_function("ours_slots_tokens", |bench| {
        bench.iter_custom(|iters| {
            current_thread_loop(&rt, iters, || async {
                let a = std::hint::black_box(&b)
                    .acquire(std::hint::black_box(tokens), WaitOptions::default())
                    .await;
                a.is_ok()
            })
        })
    });
    g.bench_function("ours_try_acquire_slot", |bench| {
        bench.iter_custom(|iters| {
            current_thread_loop(&rt, iters, || async {
                std::hint::black_box(&b)
                    .try_acquire(std::hint::black_box(Demand::slot()))
                    .is_ok()
            })
        })
    });
    g.finish();
    let s = b.stats();
    assert_eq!((s.in_flight, s.rejected), (0, 0));
}

fn benches() {
    let mut c = config().configure_from_args();
    async_acquire_no_wait(&mut c);
    handoff_blocking(&mut c);
    handoff_async(&mut c);
    saturated_queue(&mut c);
    classes(&mut c);
}

criterion_main!(benches);
