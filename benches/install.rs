//! Latency of `apply_limits` while the data plane is busy (issue 26, item 1).
//!
//! Eight worker threads run `try_acquire`/release pairs while the main thread installs
//! snapshots that alternate `max_concurrent`, and the latency of each `apply_limits` call is
//! recorded. Three scenarios:
//!
//! * `same bulkhead`: the workers and the installs on one bulkhead without classes;
//! * `across bulkheads`: the workers on another bulkhead, with three classes (pairs inside
//!   and beyond their floors), the installs on an idle bulkhead without classes;
//! * `across, paced 1 ms`: the same, with the installs 1 ms apart, as a control plane sends
//!   them (500 installs);
//! * `same classed bulkhead`: the workers and the installs on the classed bulkhead. A class
//!   tag is the class's version, which only a change of that class's own limits moves
//!   (`src/grace.rs`, "Class versions"), so these installs wait for no class operation;
//! * `classed, floors change`: the same, but every install also changes class `a`'s floor (2
//!   and 3 alternately). A class tag is as wide as the limits tag, and each class keeps its
//!   floors at every version of a period (`src/words/floors.rs`), so these installs, too, wait
//!   only for an operation preempted across 16,384 of them. (With the 2-bit class tag this
//!   replaced, the fourth change of a class's limits waited for any operation preempted across
//!   all four: p99 20-24 ms.)
//!
//! Prints one row per scenario: `scenario  installs  p50  p90  p99  max` (microseconds).
//! `scripts/perf-table` runs it (target `install`) and prints every row beside the targets
//! (p99 ≤ 50 µs, max ≤ 1 ms). With more runnable threads than cores (8 workers on a 2-core
//! machine) most workers are preempted at any instant, which is the condition measured.
//!
//! Usage: `cargo bench --bench install -- [--installs N] [--workers N]` (defaults 2,000 and 8).

use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn main() {
    let mut installs = 2_000usize;
    let mut workers = 8usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--installs" => {
                installs = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--installs N")
            }
            "--workers" => {
                workers = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--workers N")
            }
            // cargo bench passes --bench; anything else is criterion-style noise we ignore.
            _ => {}
        }
    }
    println!(
        "{:<24}{:>9}{:>10}{:>10}{:>10}{:>10}",
        "scenario", "installs", "p50 µs", "p90 µs", "p99 µs", "max µs"
    );
    let same = Bulkhead::new(1_000).unwrap();
    row("same bulkhead", &run(&same, &same, workers, installs, None));
    let busy = classed();
    let idle = Bulkhead::new(1_000).unwrap();
    row(
        "across bulkheads",
        &run(&busy, &idle, workers, installs, None),
    );
    let idle = Bulkhead::new(1_000).unwrap();
    let paced = installs.min(500);
    row(
        "across, paced 1 ms",
        &run(&busy, &idle, workers, paced, Some(Duration::from_millis(1))),
    );
    row(
        "same classed bulkhead",
        &run(&busy, &busy, workers, installs, None),
    );
    let floors = |i: usize| Some(2 + (i % 2) as u32);
    row(
        "classed, floors change",
        &run_with(&busy, &busy, workers, installs, None, floors),
    );
}

/// A bulkhead with three classes, each with floors of 2 slots, 1,000 slots in all: a worker's
/// pair is protected or borrows depending on what the others hold.
fn classed() -> Bulkhead {
    let floors = ClassLimits {
        protected_concurrent: 2,
        ..ClassLimits::default()
    };
    Bulkhead::builder()
        .max_concurrent(1_000)
        .class("a", floors)
        .class("b", floors)
        .class("c", floors)
        .default_class("a")
        .build()
        .unwrap()
}

/// Installs `installs` snapshots on `target` (alternating `max_concurrent` 999 and 1,000)
/// while `workers` threads run pairs on `busy`; returns each install's latency, sorted.
fn run(
    busy: &Bulkhead,
    target: &Bulkhead,
    workers: usize,
    installs: usize,
    pace: Option<Duration>,
) -> Vec<Duration> {
    run_with(busy, target, workers, installs, pace, |_| None)
}

/// [`run`], with install `i` also setting class `a`'s floor to `a_floor(i)` when that is
/// `Some`.
fn run_with(
    busy: &Bulkhead,
    target: &Bulkhead,
    workers: usize,
    installs: usize,
    pace: Option<Duration>,
    a_floor: impl Fn(usize) -> Option<u32>,
) -> Vec<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(workers + 1));
    let classes: Vec<_> = ["a", "b", "c"]
        .iter()
        .filter_map(|n| busy.class_id(n).ok())
        .collect();
    let handles: Vec<_> = (0..workers)
        .map(|i| {
            let (b, stop, start) = (busy.clone(), stop.clone(), start.clone());
            let class = (!classes.is_empty()).then(|| classes[i % classes.len()]);
            std::thread::spawn(move || {
                start.wait();
                let mut pairs = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let d = match class {
                        Some(c) => Demand::slot().in_class(c),
                        None => Demand::slot(),
                    };
                    if let Ok(a) = b.try_acquire(d) {
                        drop(a);
                    }
                    pairs += 1;
                }
                pairs
            })
        })
        .collect();
    start.wait();
    // Let the workers reach full speed first.
    std::thread::sleep(Duration::from_millis(20));
    let mut lat = Vec::with_capacity(installs);
    for i in 0..installs {
        let cur = target.limits();
        let mut next = cur
            .with_revision(cur.revision + 1)
            .with_max_concurrent(if i % 2 == 0 { 999 } else { 1_000 });
        if let (Some(floor), Ok(a)) = (a_floor(i), target.class_id("a")) {
            next = next.with_class(
                a,
                ClassLimits {
                    protected_concurrent: floor,
                    ..ClassLimits::default()
                },
            );
        }
        let t0 = Instant::now();
        target.apply_limits(next).unwrap();
        lat.push(t0.elapsed());
        if let Some(p) = pace {
            std::thread::sleep(p);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let pairs: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(pairs > 0, "the workers ran no pair");
    lat.sort();
    lat
}

fn row(name: &str, lat: &[Duration]) {
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "{:<24}{:>9}{:>10.1}{:>10.1}{:>10.1}{:>10.1}",
        name,
        lat.len(),
        q(0.50),
        q(0.90),
        q(0.99),
        lat[lat.len() - 1].as_secs_f64() * 1e6
    );
}
