//! Instruction counts of the hot paths beside their anchors, for callgrind (stable on a
//! shared, noisy machine where wall time is not). Each operation runs `n` times in a loop:
//!
//! ```text
//! cargo bench --bench instructions --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/instructions-* OP N
//! ```
//!
//! `.ci/instructions` runs every operation at two counts and prints the difference per
//! operation (the start-up cost cancels), with the anchors' counts and the ratios.
//! Without arguments (as `cargo bench` runs it) every operation runs a few times, as a check.
//!
//! `acquire_await_budget_slot` and `_tokens` are `benches/waiting.rs`'s
//! `async_acquire_no_wait` rows (a bulkhead with a budget). At 6a67e57 they counted 266 and
//! 267 instructions against 238 for `acquire_await` and 241 for tokio's, yet took about
//! twice `acquire_await`'s time: a stall, not work, and not the budget's. The same loop
//! without a budget but written as these rows are (`let a = ...await; assert!(a.is_ok())`)
//! was as slow. It was store forwarding (this Zen 4 machine has no counters; a C probe of
//! the patterns gave ~0.4 ns for an 8-byte store read back by the same load, ~9 ns for a
//! 16-byte load over two 8-byte stores): the out-of-line `Acquire::poll` wrote its
//! `Poll<Result<Admission, Rejection>>` with 8-byte stores and the awaiting code read it
//! with 16-byte loads, and the release copied `Option<Usage>` (a 16-byte load over the
//! 8-byte `None` just written), with the release's `lock cmpxchg` waiting for them. Now
//! `poll` is inlined and builds the admission once from `Granted` scalars (as
//! `try_acquire` does) and the release tests `reported` before copying it: 199, 250 and
//! 252 instructions, and by `time` (20M turns, three interleaved rounds) 0.22-0.24 s for
//! `acquire_await` (was 0.38), 0.32-0.44 s for both budget rows (were 0.57-0.68), tokio's
//! 0.46-0.57 s. What is left in the criterion `ours_slot` row (slower than its token row)
//! is the bench's own `black_box(Demand::slot())` each turn: a demand built field by field
//! into a temporary and copied out of it with 16-byte loads. Making `Demand` four whole
//! words (32 bytes, no padding) removed that (0.44 -> 0.36 s) but slowed a constant
//! `Demand::slot()` written straight into the future (0.23 -> 0.34 s), so it was not kept.

use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Reservation, WaitOptions};

#[cfg(feature = "coordinator")]
#[path = "support/coordinator.rs"]
mod coordinator_support;
#[cfg(feature = "llm")]
#[path = "support/request.rs"]
mod request;
use std::hint::black_box;
use std::sync::Arc;
use tokio::sync::Semaphore;

const OPS: &[&str] = &[
    "tokio_try_acquire_empty",
    "refuse_slot",
    "refuse_budget",
    "refuse_slot_kept",
    "refuse_class_ceiling",
    "refuse_class_protection",
    "tokio_pair",
    "pair_slot",
    "pair_slot_subscribed",
    "pair_tokens",
    "pair_protected",
    "pair_borrowing",
    "tokio_acquire_await",
    "acquire_await",
    "acquire_await_budget_slot",
    "acquire_await_budget_tokens",
    "tokio_handoff_async",
    "handoff_async",
    "pool_pair",
    "pool_refusal",
    "coordinator_pair",
    "dedup_key",
    "dedup_leader",
];

fn token_demand() -> Demand {
    Demand::tokens(Reservation::new(200, 800).expect("no overflow"))
}

/// Three classes with floors of 8 slots and 8 reservations, ceilings of 48 slots, on 64 slots
/// (as `benches/core.rs`'s `classes` group).
fn classes_bulkhead() -> Bulkhead {
    let limits = ClassLimits {
        protected_concurrent: 8,
        max_concurrent: Some(48),
        protected_tokens: 8 * 1_000,
        max_tokens: Some(llm_bulkhead::MAX_CLASSED_TOKENS / 2),
    };
    ["premium", "standard", "batch"]
        .iter()
        .fold(
            Bulkhead::builder()
                .max_concurrent(64)
                .token_budget(llm_bulkhead::MAX_CLASSED_TOKENS),
            |b, name| b.class(*name, limits),
        )
        .default_class("standard")
        .build()
        .unwrap()
}

#[inline(never)]
fn ours_loop(b: &Bulkhead, d: Demand, n: u64) -> u64 {
    let mut ok = 0;
    for _ in 0..n {
        match b.try_acquire(black_box(d)) {
            Ok(a) => {
                drop(a);
                ok += 1;
            }
            Err(r) => drop(r),
        }
    }
    ok
}

/// [`ours_loop`] for refusals whose `Rejection` is kept (its address given to `black_box`), as a
/// caller that answers with it does: every field is stored. In [`ours_loop`] a refusal is
/// dropped at once, and the inlined no-class refusal then stores nothing of it.
#[inline(never)]
fn ours_loop_kept(b: &Bulkhead, d: Demand, n: u64) -> u64 {
    let mut refused = 0;
    for _ in 0..n {
        if let Err(r) = b.try_acquire(black_box(d)) {
            black_box(&r);
            refused += 1;
        }
    }
    refused
}

#[inline(never)]
fn tokio_loop(s: &Semaphore, n: u64) -> u64 {
    let mut ok = 0;
    for _ in 0..n {
        if black_box(s).try_acquire().is_ok() {
            ok += 1;
        }
    }
    ok
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// Two tasks on one current-thread runtime share one slot: each holds it across a yield, so
/// the other queues, and every release is a hand-off to a queued task (one per iteration).
fn handoff<F, Fut>(n: u64, turn: F)
where
    F: Fn() -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let rt = current_thread();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let turn = turn.clone();
                tokio::task::spawn_local(async move {
                    for _ in 0..n / 2 {
                        turn().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

fn run(op: &str, n: u64) {
    match op {
        "tokio_try_acquire_empty" => {
            let s = Semaphore::new(0);
            assert_eq!(tokio_loop(&s, n), 0);
        }
        "tokio_pair" => {
            let s = Semaphore::new(64);
            assert_eq!(tokio_loop(&s, n), n);
        }
        "refuse_slot" => {
            let b = Bulkhead::builder().max_concurrent(0).build().unwrap();
            assert_eq!(ours_loop(&b, Demand::slot(), n), 0);
        }
        "refuse_budget" => {
            let b = Bulkhead::builder()
                .max_concurrent(64)
                .token_budget(500)
                .build()
                .unwrap();
            assert_eq!(ours_loop(&b, token_demand(), n), 0);
        }
        "refuse_slot_kept" => {
            let b = Bulkhead::builder().max_concurrent(0).build().unwrap();
            assert_eq!(ours_loop_kept(&b, Demand::slot(), n), n);
        }
        "refuse_class_ceiling" => {
            let b = Bulkhead::builder()
                .max_concurrent(4)
                .class(
                    "capped",
                    ClassLimits {
                        protected_concurrent: 0,
                        max_concurrent: Some(1),
                        ..ClassLimits::default()
                    },
                )
                .class(
                    "floored",
                    ClassLimits {
                        protected_concurrent: 2,
                        ..ClassLimits::default()
                    },
                )
                .default_class("capped")
                .build()
                .unwrap();
            let d = Demand::slot().in_class(b.class_id("capped").unwrap());
            let _held = b.try_acquire(d).unwrap();
            assert_eq!(ours_loop(&b, d, n), 0);
        }
        "refuse_class_protection" => {
            let b = Bulkhead::builder()
                .max_concurrent(3)
                .class("a", ClassLimits::default())
                .class(
                    "b",
                    ClassLimits {
                        protected_concurrent: 2,
                        ..ClassLimits::default()
                    },
                )
                .default_class("a")
                .build()
                .unwrap();
            let d = Demand::slot().in_class(b.class_id("a").unwrap());
            let _held = b.try_acquire(d).unwrap();
            assert_eq!(ours_loop(&b, d, n), 0);
        }
        "pair_slot" => {
            let b = Bulkhead::new(64).unwrap();
            assert_eq!(ours_loop(&b, Demand::slot(), n), n);
        }
        // A subscriber to refusals only, as telemetry's (tracing) is: what telemetry adds to a
        // pair's decision path (`benches/telemetry.rs` times it with the metrics recorder).
        "pair_slot_subscribed" => {
            let b = Bulkhead::new(64).unwrap();
            let _sub = b.subscribe_to(llm_bulkhead::Interest::REJECT, |e| {
                black_box(e);
            });
            assert_eq!(ours_loop(&b, Demand::slot(), n), n);
        }
        "pair_tokens" => {
            let b = Bulkhead::builder()
                .max_concurrent(64)
                .token_budget(1 << 30)
                .build()
                .unwrap();
            assert_eq!(ours_loop(&b, token_demand(), n), n);
        }
        "pair_protected" => {
            let b = classes_bulkhead();
            let d = token_demand().in_class(b.class_id("premium").unwrap());
            assert_eq!(ours_loop(&b, d, n), n);
        }
        "pair_borrowing" => {
            let b = classes_bulkhead();
            let d = token_demand().in_class(b.class_id("batch").unwrap());
            let held: Vec<_> = (0..8).map(|_| b.try_acquire(d).unwrap()).collect();
            assert_eq!(ours_loop(&b, d, n), n);
            assert!(b.try_acquire(d).unwrap().resources().borrowed_concurrency);
            drop(held);
        }
        "tokio_acquire_await" => {
            let s = Semaphore::new(64);
            current_thread().block_on(async {
                for _ in 0..n {
                    drop(black_box(&s).acquire().await.unwrap());
                }
            });
        }
        "acquire_await" => {
            let b = Bulkhead::builder()
                .max_concurrent(64)
                .max_queue(64)
                .build()
                .unwrap();
            current_thread().block_on(async {
                for _ in 0..n {
                    drop(
                        black_box(&b)
                            .acquire(Demand::slot(), WaitOptions::default())
                            .await
                            .unwrap(),
                    );
                }
            });
        }
        "acquire_await_budget_slot" | "acquire_await_budget_tokens" => {
            // `benches/waiting.rs`'s `async_acquire_no_wait` rows: a budget, and the admission
            // dropped inside the awaited future.
            let b = Bulkhead::builder()
                .max_concurrent(1024)
                .max_queue(16)
                .token_budget(1 << 30)
                .build()
                .unwrap();
            let d = if op.ends_with("slot") {
                Demand::slot()
            } else {
                Demand::tokens(Reservation::new(1_200, 800).unwrap())
            };
            current_thread().block_on(async {
                for _ in 0..n {
                    let a = black_box(&b)
                        .acquire(black_box(d), WaitOptions::default())
                        .await;
                    assert!(a.is_ok());
                }
            });
        }
        "tokio_handoff_async" => {
            let s = Arc::new(Semaphore::new(1));
            handoff(n, move || {
                let s = s.clone();
                async move {
                    let p = s.acquire().await.unwrap();
                    tokio::task::yield_now().await;
                    drop(p);
                }
            });
        }
        "handoff_async" => {
            let b = Bulkhead::builder()
                .max_concurrent(1)
                .max_queue(2)
                .build()
                .unwrap();
            let probe = b.clone();
            handoff(n, move || {
                let b = b.clone();
                async move {
                    let a = b.acquire(Demand::slot(), WaitOptions::default()).await;
                    tokio::task::yield_now().await;
                    drop(a.unwrap());
                }
            });
            assert!(probe.stats().queued_total >= n / 2);
        }
        // Gateway pools: one admission and its release (partition, connection, guard), and a
        // refusal by a full partition.
        #[cfg(feature = "serde")]
        "pool_pair" | "pool_refusal" => {
            use llm_bulkhead::pools::{PoolRequest, Pools, PoolsConfig};
            let p = Pools::new(&PoolsConfig::single("p", "c", 1)).unwrap();
            let req = PoolRequest::new(1, p.partition("p-c").unwrap());
            let _held = (op == "pool_refusal").then(|| p.try_admit(&req).unwrap());
            let mut admitted = 0;
            for _ in 0..n {
                if let Ok(permit) = p.try_admit(black_box(&req)) {
                    drop(permit);
                    admitted += 1;
                }
            }
            assert_eq!(admitted, if op == "pool_pair" { n } else { 0 });
        }
        // The coordinator: an eligible ticket with an empty queue, submitted, started and
        // completed (`benches/coordinator.rs`'s `admit_release`), beside `pair_slot`.
        #[cfg(feature = "coordinator")]
        "coordinator_pair" => {
            let c = coordinator_support::coordinator(std::time::Duration::ZERO);
            let started = (0..n).filter(|&k| coordinator_support::pair(&c, k)).count();
            assert_eq!(started as u64, n);
        }
        // `benches/dedup.rs`'s `key_1kb`, the anchor of `dedup_leader`: the key alone.
        #[cfg(feature = "llm")]
        "dedup_key" => {
            let r = request::request(1_024);
            for _ in 0..n {
                black_box(llm_bulkhead::llm::DedupKey::for_request(
                    black_box(&r),
                    "tenant-a",
                    None,
                ));
            }
        }
        // `benches/dedup.rs`'s `run_1kb_leader`: the key of the 1.1 KB request, then
        // `Dedup::run` leading a flight of a ready future, polled once with a no-op waker (key,
        // map entry, the flight, its poll, the key's removal).
        #[cfg(feature = "llm")]
        "dedup_leader" => {
            use llm_bulkhead::llm::{Dedup, DedupKey, FollowerOptions};
            let r = request::request(1_024);
            let d: Dedup<u64> = Dedup::new(10_000);
            let mut sum = 0;
            for _ in 0..n {
                let k = DedupKey::for_request(black_box(&r), "tenant-a", None);
                let run = d.run(Some(k), FollowerOptions::default(), || async {
                    black_box(7u64)
                });
                sum += ready(run).unwrap();
            }
            assert_eq!(sum, 7 * n);
            assert_eq!(d.stats().active, 0);
        }
        other => panic!("unknown operation {other}"),
    }
}

/// A future that completes at once, polled once with a no-op waker (as `benches/dedup.rs`).
#[cfg(feature = "llm")]
fn ready<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the measured futures complete at once"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [op, n] if !op.starts_with('-') => run(op, n.parse().expect("a count")),
        _ => {
            for op in OPS {
                run(op, 16);
            }
        }
    }
}
