//! The LLM layer's `run_blocking` through a cluster share's window beside the same call on a
//! plain bulkhead, in one run: what `LlmBulkhead::clustered` adds to a run (one read of the
//! agent's clock after the commit, the admission's deadline, and the overdue check at the
//! release), with the bare pair and the `ClusterBulkhead` handle's pair for scale.
//!
//! The agent runs on its own thread with a `MemoryStore` (no Redis: the decision path is what
//! is measured), on the system clock shifted past the store's learning period, and renews
//! every TTL/3 while the benchmark runs. `coarse_*` is the same over `CoarseClock` (Linux).
//!
//! ```sh
//! cargo bench --features cluster --bench cluster_run -- --warm-up-time 1 --measurement-time 2
//! ```

#[path = "../tests/support/cluster_config.rs"]
mod cluster_config;

use criterion::{black_box, criterion_main, Criterion};
use llm_bulkhead::cluster::{
    Clock, ClusterAgent, ClusterBulkhead, MemoryStore, RunningAgent, SystemClock,
};
use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
use llm_bulkhead::{Bulkhead, Demand};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MAX_CONCURRENT: u32 = 1024;

/// `C` shifted forward by `shift` ms (so that a fresh store's learning period passes at once).
struct Shifted<C> {
    clock: C,
    shift: AtomicU64,
}

impl<C: Clock> Clock for Shifted<C> {
    fn now_ms(&self) -> u64 {
        self.clock.now_ms() + self.shift.load(Ordering::Relaxed)
    }
    fn resolution_ms(&self) -> u64 {
        self.clock.resolution_ms()
    }
}

/// A bulkhead whose agent holds its whole global limit, renewing on its own thread.
fn leased<C: Clock + 'static>(clock: C) -> (Bulkhead, RunningAgent) {
    let b = Bulkhead::new(MAX_CONCURRENT).unwrap();
    let clock = Arc::new(Shifted {
        clock,
        shift: AtomicU64::new(0),
    });
    let c2 = clock.clone();
    let store = MemoryStore::with_clock(move || c2.now_ms());
    let mut agent = ClusterAgent::with_clock(
        b.clone(),
        Box::new(store),
        cluster_config::agent_config("bench"),
        clock.clone(),
    )
    .unwrap();
    agent.tick();
    // Past learning (TTL + quarantine, 3 s): the next renewal grants the whole limit.
    clock.shift.store(3_001, Ordering::Relaxed);
    agent.tick();
    assert_eq!(b.limits().max_concurrent, MAX_CONCURRENT, "the whole grant");
    (b, agent.spawn().unwrap())
}

fn run_blocking(llm: &LlmBulkhead, request: &LlmRequest) -> bool {
    llm.run_blocking(black_box(request), RunOptions::default(), |ctx| {
        Ok::<_, ()>(ctx.revision())
    })
    .is_ok()
}

fn handle_pair(h: &ClusterBulkhead) -> bool {
    h.try_acquire(black_box(Demand::slot())).is_ok()
}

fn cluster(c: &mut Criterion) {
    let mut g = c.benchmark_group("cluster_run");
    let request = LlmRequest::default();
    let plain_b = Bulkhead::new(MAX_CONCURRENT).unwrap();
    let plain = LlmBulkhead::new(plain_b.clone(), NaiveEstimator);
    let (_b, running) = leased(SystemClock::new());
    let handle = running.handle();
    let clustered = LlmBulkhead::clustered(&handle, NaiveEstimator);
    g.bench_function("pair_slot", |b| {
        b.iter(|| plain_b.try_acquire(black_box(Demand::slot())).is_ok())
    });
    g.bench_function("run_blocking_slot", |b| {
        b.iter(|| run_blocking(&plain, &request))
    });
    g.bench_function("clustered_run_blocking_slot", |b| {
        b.iter(|| run_blocking(&clustered, &request))
    });
    g.bench_function("handle_pair_slot", |b| b.iter(|| handle_pair(&handle)));
    #[cfg(target_os = "linux")]
    let coarse = {
        let (_cb, coarse) = leased(llm_bulkhead::cluster::CoarseClock::new());
        let ch = coarse.handle();
        let cl = LlmBulkhead::clustered(&ch, NaiveEstimator);
        g.bench_function("coarse_clustered_run_blocking_slot", |b| {
            b.iter(|| run_blocking(&cl, &request))
        });
        g.bench_function("coarse_handle_pair_slot", |b| b.iter(|| handle_pair(&ch)));
        coarse
    };
    g.finish();
    let status = running.status();
    assert_eq!(status.lapsed_refusals, 0, "every run inside a window");
    running.stop().unwrap();
    #[cfg(target_os = "linux")]
    coarse.stop().unwrap();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

/// The criterion group of this target (in a module: the macro's function has no doc comment).
mod group {
    criterion::criterion_group! {
        name = benches;
        config = super::config();
        targets = super::cluster
    }
}
criterion_main!(group::benches);
