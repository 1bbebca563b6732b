//! Instruction counts of the LLM layer's hot paths, for callgrind (repeatable where criterion
//! on a shared machine is not). Each operation runs `N` times after a warm-up; the per-call
//! count is the difference of two runs divided by the difference of their `N`:
//!
//! ```text
//! cargo bench --bench llm_instructions --no-run
//! for n in 10000 20000; do valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/release/deps/llm_instructions-* run_shared_leader $n; done
//! ```
//!
//! `benches/ratios.py`-style arithmetic is left to the reader: `(Ir(20000) - Ir(10000)) / 10000`
//! (or with 2,000 and 12,000). Last measured (1.1 KB request, callgrind at the merge of the two, after the
//! flight's claim word and single count and the run path's trim of f87a84a): `key_1kb` 2,541,
//! `dedup_leader_1kb` 3,300, `run_shared_leader_1kb` 4,769, `run_shared_opted_out_1kb` 1,113,
//! `llm_run_1kb` 504, 477 after the async `run` read its options in place (at 1916aa5: 2,545, 3,388, 4,940, 1,205, 698; at ddb2802, before issue
//! 15's work: 2,712, 3,799, 5,959, 1,385, 703), and `run_blocking` over its pair: slot 335
//! against 257 (+78), tokens override 353 against 270 (+83), classed protected 590 against
//! 538 (+52), borrowing 689 against 637 (+52) (before: +224, +235, +211, +214).
//! With timed runs (issue 32, N = 5,000, one run, the same binary's code before and after):
//! `run_blocking_slot` 310 (309 before), `run_blocking_tokens_override` 331 (330),
//! `run_blocking_classed_protected` 490 (489), `llm_run_1kb` 409 (466),
//! `run_shared_leader_1kb` 4,717 (4,806); the opted-in `run_blocking_timed_slot` 871.
//! Operations: `pair_slot`, `run_blocking_slot`, `run_blocking_timed_slot`, `pair_tokens`,
//! `run_blocking_tokens_override` (a budget and a per-call reservation override, as
//! `benches/run.rs`), `pair_classed_protected`,
//! `run_blocking_classed_protected`, `pair_classed_borrowing`,
//! `run_blocking_classed_borrowing`, `key_1kb`, `dedup_leader_1kb`, `llm_run_1kb`,
//! `run_shared_leader_1kb`, `run_shared_opted_out_1kb`, `estimate_<model>` (200 characters).

use llm_bulkhead::llm::{
    BoxWork, Dedup, DedupKey, DedupSettings, FollowerOptions, LlmBulkhead, LlmRequest,
    ModelAwareEstimator, NaiveEstimator, ReservationOverride, RunContext, RunOptions,
    TokenEstimator,
};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Reservation};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

#[path = "support/request.rs"]
mod request;
use request::request;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the measured futures complete at once"),
    }
}

fn work(_: &mut RunContext) -> BoxWork<'_, u64, ()> {
    Box::pin(async { Ok(black_box(7u64)) })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(op), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok())) else {
        // `cargo bench` runs every target with `--bench`: nothing to do without an operation.
        eprintln!("usage: llm_instructions OPERATION N");
        return;
    };
    let small = LlmRequest::new("m", &["x"]);
    let big = request(1_024);
    let slots = Bulkhead::new(1_024).unwrap();
    // As `benches/run.rs`'s `pair_tokens` and `run_blocking_tokens_override`.
    let tokens = Bulkhead::builder()
        .max_concurrent(1_024)
        .token_budget(1 << 30)
        .build()
        .unwrap();
    let llm_tokens = LlmBulkhead::new(tokens.clone(), NaiveEstimator);
    let llm_slots = LlmBulkhead::new(slots.clone(), NaiveEstimator);
    let classed = Bulkhead::builder()
        .max_concurrent(1_024)
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
        .unwrap();
    let llm_classed = LlmBulkhead::new(classed.clone(), NaiveEstimator);
    let shared = llm_slots
        .clone()
        .with_dedup(DedupSettings::default())
        .unwrap();
    let dedup: Dedup<u64> = Dedup::new(10_000);
    let aware = ModelAwareEstimator::default();
    let class = |name: &str| classed.class_id(name).unwrap();
    let mut one: Box<dyn FnMut()> = match op.as_str() {
        "pair_slot" => Box::new(|| {
            let a = slots.try_acquire(black_box(Demand::slot())).unwrap();
            black_box(a.release(None).is_ok());
        }),
        "run_blocking_slot" => Box::new(|| {
            let r = llm_slots.run_blocking(black_box(&small), RunOptions::default(), |ctx| {
                Ok::<_, ()>(ctx.revision())
            });
            black_box(r.unwrap());
        }),
        // The same run, timed (two clock readings more, and the timing boxed on the context).
        "run_blocking_timed_slot" => Box::new(|| {
            let t = llm_slots.run_blocking_timed(black_box(&small), RunOptions::default(), |ctx| {
                Ok::<_, ()>(ctx.revision())
            });
            black_box((t.value.unwrap(), t.timing));
        }),
        "pair_tokens" => Box::new(|| {
            let d = Demand::tokens(Reservation::new(1_200, 800).unwrap());
            let a = tokens.try_acquire(black_box(d)).unwrap();
            black_box(a.release(None).is_ok());
        }),
        "run_blocking_tokens_override" => Box::new(|| {
            let o = RunOptions {
                reservation: Some(ReservationOverride {
                    input: 1_200,
                    max_output: 800,
                    reserved: None,
                }),
                ..RunOptions::default()
            };
            let r = llm_tokens.run_blocking(black_box(&small), black_box(o), |ctx| {
                Ok::<_, ()>(ctx.revision())
            });
            black_box(r.unwrap());
        }),
        "pair_classed_protected" | "pair_classed_borrowing" => {
            let c = class(if op.ends_with("protected") {
                "floor"
            } else {
                "shared"
            });
            Box::new(move || {
                let a = classed
                    .try_acquire(black_box(Demand::slot().in_class(c)))
                    .unwrap();
                black_box(a.release(None).is_ok());
            })
        }
        "run_blocking_classed_protected" | "run_blocking_classed_borrowing" => {
            let c = class(if op.ends_with("protected") {
                "floor"
            } else {
                "shared"
            });
            Box::new(move || {
                let o = RunOptions {
                    class: Some(c),
                    ..RunOptions::default()
                };
                let r = llm_classed.run_blocking(black_box(&small), black_box(o), |ctx| {
                    Ok::<_, ()>(ctx.revision())
                });
                black_box(r.unwrap());
            })
        }
        "key_1kb" => Box::new(|| {
            black_box(DedupKey::for_request(black_box(&big), "tenant-a", None));
        }),
        "dedup_leader_1kb" => Box::new(|| {
            let k = DedupKey::for_request(black_box(&big), "tenant-a", None);
            let r = ready(dedup.run(Some(k), FollowerOptions::default(), || async {
                black_box(7u64)
            }));
            black_box(r.unwrap());
        }),
        "llm_run_1kb" => Box::new(|| {
            let r = ready(
                llm_slots.run(black_box(&big), RunOptions::default(), async |_| {
                    Ok::<_, ()>(black_box(7u64))
                }),
            );
            black_box(r.unwrap());
        }),
        "run_shared_leader_1kb" => Box::new(|| {
            black_box(
                ready(shared.run_shared(black_box(&big), RunOptions::default(), work)).unwrap(),
            );
        }),
        "run_shared_opted_out_1kb" => Box::new(|| {
            let o = RunOptions {
                dedup: false,
                ..RunOptions::default()
            };
            black_box(ready(shared.run_shared(black_box(&big), o, work)).unwrap());
        }),
        m if m.starts_with("estimate_") => {
            let r = LlmRequest::new(&m["estimate_".len()..], &[&"a".repeat(200)]);
            Box::new(move || {
                black_box(aware.estimate(black_box(&r)).unwrap());
            })
        }
        other => {
            eprintln!("unknown operation {other}");
            std::process::exit(2);
        }
    };
    for _ in 0..1_000 {
        one();
    }
    for _ in 0..n {
        one();
    }
}
