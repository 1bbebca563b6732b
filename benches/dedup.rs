//! De-duplication cost: the default key of a 1 KB request (canonical encoding + XXH3-128),
//! and a call through `Dedup::run` (key, map insert, the shared flight, removal) around a
//! trivial future, beside the same future awaited bare, in the same run; and de-duplication
//! inside `run` (`LlmBulkhead::run_shared` leading a flight, and opted out) beside the plain
//! `run` of the same request. The target is ≤ 200 ns for leading a flight of a 1 KB
//! request, hashing included. In instructions (`benches/llm_instructions.rs`, callgrind) the
//! key costs 2,541 (the XXH3-128 hash alone about 865), a `Dedup::run` leader 3,300 with 8
//! locked read-modify-writes (3,388 with 11 before the flight's claim word and single count,
//! 3,799 before issue 15's speed work), a `run_shared` leader 4,769 and opted out 1,113, the
//! plain `run` 504, then 477 (callgrind at the merge of the two, with the run path's trim of f87a84a). Times: README,
//! "De-duplication and estimation".

use criterion::{black_box, criterion_main, Criterion};
use llm_bulkhead::llm::{
    BoxWork, Dedup, DedupKey, DedupSettings, FollowerOptions, LlmBulkhead, NaiveEstimator,
    RunContext, RunOptions,
};
use llm_bulkhead::Bulkhead;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[path = "support/request.rs"]
mod request;
use request::request;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the benchmarked futures complete at once"),
    }
}

fn dedup(c: &mut Criterion) {
    let mut g = c.benchmark_group("dedup");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let r = request(1_024);
    let json_len = serde_json::to_string(&r).unwrap().len();
    eprintln!("request: {json_len} bytes of JSON");
    g.bench_function("key_1kb", |b| {
        b.iter(|| DedupKey::for_request(black_box(&r), "tenant-a", None))
    });
    g.bench_function("bare_future", |b| {
        b.iter(|| ready(async { black_box(7u64) }))
    });
    let d: Dedup<u64> = Dedup::new(10_000);
    g.bench_function("run_1kb_leader", |b| {
        b.iter(|| {
            let k = DedupKey::for_request(black_box(&r), "tenant-a", None);
            ready(d.run(Some(k), FollowerOptions::default(), || async {
                black_box(7u64)
            }))
            .unwrap()
        })
    });
    // De-duplication inside `run`: an `LlmBulkhead` `run` of a trivial future (no budget, so no
    // estimate), beside `run_shared` leading a flight for the same 1 KB request (key, map,
    // flight, admission, release, removal) and with the call opted out (`dedup: false`).
    let plain = LlmBulkhead::new(Bulkhead::new(1_024).unwrap(), NaiveEstimator);
    let shared = plain.clone().with_dedup(DedupSettings::default()).unwrap();
    g.bench_function("llm_run_1kb", |b| {
        b.iter(|| {
            ready(plain.run(black_box(&r), RunOptions::default(), async |_| {
                Ok::<_, ()>(black_box(7u64))
            }))
            .unwrap()
        })
    });
    g.bench_function("llm_run_shared_1kb_leader", |b| {
        b.iter(|| ready(shared.run_shared(black_box(&r), RunOptions::default(), work)).unwrap())
    });
    g.bench_function("llm_run_shared_1kb_opted_out", |b| {
        b.iter(|| {
            let o = RunOptions {
                dedup: false,
                ..RunOptions::default()
            };
            ready(shared.run_shared(black_box(&r), o, work)).unwrap()
        })
    });
    g.finish();
}

fn work(_: &mut RunContext) -> BoxWork<'_, u64, ()> {
    Box::pin(async { Ok(black_box(7u64)) })
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    dedup(&mut c);
}

criterion_main!(benches);
