//! Allocations of a de-duplication leader that nobody joins (the common case): counted by a
//! per-thread counting global allocator, after a warm-up call (the map's capacity, the key's
//! per-thread buffer and the thread's statistics entry are made once and reused). The bounds
//! are the design's: a `Dedup::run` leader allocates only its flight, with the work inside it;
//! a `run_shared` leader allocates its flight, the boxed work its caller returns and the
//! type-erased result; a key allocates nothing.

use llm_bulkhead::llm::{
    BoxWork, Dedup, DedupKey, DedupSettings, FollowerOptions, LlmBulkhead, LlmRequest,
    NaiveEstimator, RunContext, RunOptions,
};
use llm_bulkhead::Bulkhead;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocs;

fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the measured futures complete at once"),
    }
}

#[path = "../benches/support/request.rs"]
mod request;

/// The benchmarks' 1.1 KB request.
fn request() -> LlmRequest {
    request::request(1_024)
}

/// Allocations of one call of `f`, after one warm-up call.
fn count(mut f: impl FnMut()) -> u64 {
    f();
    let before = allocs();
    f();
    allocs() - before
}

#[test]
fn a_key_allocates_nothing() {
    let r = request();
    let n = count(|| {
        std::hint::black_box(DedupKey::for_request(&r, "tenant-a", None));
    });
    assert_eq!(n, 0);
}

#[test]
fn a_dedup_leader_allocates_only_its_flight() {
    let r = request();
    let d: Dedup<u64> = Dedup::new(100);
    let n = count(|| {
        let k = DedupKey::for_request(&r, "tenant-a", None);
        let run = d.run(Some(k), FollowerOptions::default(), || async { 7u64 });
        assert!(run.is_leader());
        assert_eq!(ready(run), Ok(7));
    });
    eprintln!("dedup leader: {n}");
    assert_eq!(n, 1);
    assert_eq!(d.stats().active, 0);
}

fn work(_: &mut RunContext) -> BoxWork<'_, u64, ()> {
    Box::pin(async { Ok(7u64) })
}

#[test]
fn a_run_shared_leader_allocates_its_flight_its_work_and_its_result() {
    let r = request();
    let llm = LlmBulkhead::new(Bulkhead::new(8).unwrap(), NaiveEstimator)
        .with_dedup(DedupSettings::default())
        .unwrap();
    let n = count(|| {
        assert_eq!(
            ready(llm.run_shared(&r, RunOptions::default(), work)).unwrap(),
            7
        );
    });
    eprintln!("run_shared leader: {n}");
    assert!(n <= 3, "{n} allocations");
    assert_eq!(llm.stats().dedup.unwrap().leaders, 2);
}
