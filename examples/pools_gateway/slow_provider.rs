//! The seed's slow-provider test, as a section of the main demo (`examples/demo.rs` runs it
//! after the gateway simulation): two providers behind gateway pools, normal traffic to both,
//! then the primary turns slow. Simulated in process (threads and sleeps stand in for the
//! providers; `tests/pools_http.rs` runs the same scenario on loopback HTTP).
//!
//! It prints, per phase, the healthy provider's admissions, refusals and latencies, the slow
//! provider's queue and its refusals by reason, the fallback partition's use, and the
//! cancelled waiters, then checks each claim of the seed and returns `false` if one failed:
//!
//! * the healthy provider's partitions admit every request, in both phases (their median
//!   latency in each phase is printed as a figure, not checked: timing on a shared machine is
//!   no proof);
//! * the slow provider's batch queue fills and overflows with `pending_limit_reached`;
//! * every cancelled waiter gives everything back (and a started-then-cancelled one has its
//!   dispatch and completion events), so that at rest every count is zero;
//! * the primary's interactive overflow goes to its own fallback partition, never above that
//!   partition's active limit (an independent tally checks it on every admission).
#![allow(dead_code)]

use llm_bulkhead::pools::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The providers × classes matrix: the primary's interactive overflow goes to a partition of
/// the secondary kept for it (tenant tier `fallback`), so the secondary's own traffic keeps its
/// own budget.
const CONFIG: &str = r#"{
  "maxAttempts": 2,
  "global": { "maxActive": 24 },
  "providers": {
    "primary": { "connectionLimit": 6 },
    "secondary": { "connectionLimit": 8 }
  },
  "classes": {
    "interactive": { "overflow": "fallback" },
    "batch": { "overflow": "wait" }
  },
  "partitions": {
    "primary-interactive": {
      "provider": "primary", "trafficClass": "interactive", "activeLimit": 3,
      "fallback": ["secondary-fallback"]
    },
    "primary-batch": {
      "provider": "primary", "trafficClass": "batch", "activeLimit": 1,
      "pendingLimit": 3, "queueMaxAgeMs": 400
    },
    "secondary-interactive": {
      "provider": "secondary", "trafficClass": "interactive", "activeLimit": 3
    },
    "secondary-batch": {
      "provider": "secondary", "trafficClass": "batch", "activeLimit": 2,
      "pendingLimit": 2, "queueMaxAgeMs": 400
    },
    "secondary-fallback": {
      "provider": "secondary", "trafficClass": "interactive", "tenantTier": "fallback",
      "activeLimit": 2
    }
  }
}"#;

/// The phases: the baseline, then the primary slow.
const BASELINE: Duration = Duration::from_millis(350);
const SLOW: Duration = Duration::from_millis(700);
/// Provider latencies: healthy, and the primary when slow.
const FAST_US: u64 = 2_000;
const SLOW_US: u64 = 150_000;

/// Who sends what: (partition, threads, waits asynchronously and cancels).
const SENDERS: [(&str, usize, bool); 5] = [
    ("secondary-interactive", 2, false),
    ("secondary-batch", 2, false),
    ("primary-interactive", 4, false),
    ("primary-batch", 3, false),
    ("primary-batch", 2, true),
];

/// One phase's figures for one group of requests.
#[derive(Default, Clone)]
struct Figures {
    admitted: u64,
    refused: u64,
    /// Admission decision times (µs) and end-to-end times (admission + provider call, µs).
    decide_us: Vec<u64>,
    total_us: Vec<u64>,
}

struct Scene {
    pools: Pools,
    start: Instant,
    /// Per partition: admissions holding now (raised after the admission returns, lowered
    /// before it completes), and the most seen.
    held: Vec<(AtomicU64, AtomicU64)>,
    /// Per partition: its active limit (fixed in this run).
    limits: Vec<u64>,
    over: AtomicBool,
    /// [phase][0: secondary's own, 1: primary's] figures.
    figures: Mutex<[[Figures; 2]; 2]>,
    /// Refusals of the primary's batch partition by reason, in the slow phase.
    batch_reasons: Mutex<Vec<(Reason, u64)>>,
    /// Async waiters dropped before their outcome (queued, or started by a release).
    cancelled: AtomicU64,
    fallbacks_served: AtomicU64,
}

/// The events of the cancelled async waiters (ids ≥ 1 << 40), to check their story.
struct Recorder(std::sync::Arc<Mutex<Vec<(u64, String)>>>);

impl PoolsObserver for Recorder {
    fn on_decision(&self, e: &DecisionEvent<'_>) {
        if e.request_id >= 1 << 40 {
            let line = format!("{:?}", e.decision);
            self.0.lock().unwrap().push((e.request_id, line));
        }
    }
    fn on_completion(&self, e: &CompletionEvent<'_>) {
        if e.request_id >= 1 << 40 {
            let line = format!("completed {:?}", e.failure_class);
            self.0.lock().unwrap().push((e.request_id, line));
        }
    }
}

impl Scene {
    fn phase(&self) -> Option<usize> {
        let t = self.start.elapsed();
        if t < BASELINE {
            Some(0)
        } else if t < BASELINE + SLOW {
            Some(1)
        } else {
            None
        }
    }

    fn provider_us(&self, provider: &str) -> u64 {
        if provider == "primary" && self.phase() == Some(1) {
            SLOW_US
        } else {
            FAST_US
        }
    }

    /// Calls the permit's provider, tallied, then completes it.
    fn serve(&self, permit: PoolPermit<'_>) -> u64 {
        let at = permit.partition().index();
        let (now, most) = &self.held[at];
        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(n, Ordering::SeqCst);
        if n > self.limits[at] {
            self.over.store(true, Ordering::SeqCst);
        }
        let us = self.provider_us(self.pools.provider_of(permit.partition()));
        std::thread::sleep(Duration::from_micros(us));
        now.fetch_sub(1, Ordering::SeqCst);
        permit.complete(None);
        us
    }

    /// A refusal of the primary's batch partition, counted by reason while it is slow.
    fn refused_batch(&self, phase: usize, route: &Route) {
        if phase != 1 {
            return;
        }
        let reason = route.decisions().last().expect("a decision").reason;
        let mut r = self.batch_reasons.lock().unwrap();
        match r.iter_mut().find(|(x, _)| *x == reason) {
            Some((_, k)) => *k += 1,
            None => r.push((reason, 1)),
        }
    }

    fn record(&self, phase: usize, group: usize, admitted: bool, decide: Duration, total: u64) {
        let mut f = self.figures.lock().unwrap();
        let f = &mut f[phase][group];
        if admitted {
            f.admitted += 1;
            f.decide_us.push(decide.as_micros() as u64);
            f.total_us.push(total);
        } else {
            f.refused += 1;
        }
    }
}

fn sender(scene: &Scene, name: &str, thread: u64, cancels: bool) {
    let pools = &scene.pools;
    let id = pools.partition(name).expect("configured");
    let group = usize::from(name.starts_with("primary"));
    let mut n = 0u64;
    while let Some(phase) = scene.phase() {
        n += 1;
        let request_id = (thread << 32) + n;
        let mut req = PoolRequest::new(request_id, id);
        if cancels {
            // An async waiter that gives up: polled, left a moment, then dropped.
            req.request_id += 1 << 40;
            let mut wait = Box::pin(pools.admit_async(req, None));
            let mut cx = Context::from_waker(Waker::noop());
            let mut out = wait.as_mut().poll(&mut cx);
            if out.is_pending() {
                std::thread::sleep(Duration::from_millis(3));
                out = wait.as_mut().poll(&mut cx);
            }
            match out {
                Poll::Ready(out) => {
                    let route = *out.route();
                    match out.into_permit() {
                        Some(permit) => drop(scene.serve(permit)),
                        None => scene.refused_batch(phase, &route),
                    }
                }
                Poll::Pending => {
                    // Queued or just started: the events tell which (checked at the end).
                    drop(wait);
                    scene.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        let t0 = Instant::now();
        let out = if name.ends_with("batch") {
            pools.admit_blocking(&req, None)
        } else {
            pools.admit(&req)
        };
        let decide = t0.elapsed();
        let route = *out.route();
        match out.into_permit() {
            Some(permit) => {
                if permit.partition() != id {
                    scene.fallbacks_served.fetch_add(1, Ordering::Relaxed);
                }
                let us = scene.serve(permit);
                let total = decide.as_micros() as u64 + us;
                scene.record(phase, group, true, decide, total);
            }
            None => {
                scene.record(phase, group, false, decide, 0);
                if name == "primary-batch" {
                    scene.refused_batch(phase, &route);
                }
                // A refused caller does not retry at once.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Runs the scenario, prints it, checks it; `false` if a check failed.
pub fn run() -> bool {
    let config = PoolsConfig::from_json(CONFIG).expect("the demo's pools config parses");
    let events = std::sync::Arc::new(Mutex::new(Vec::new()));
    let pools = Pools::with_observer(&config, Recorder(events.clone())).expect("valid config");
    let limits: Vec<u64> = pools
        .stats()
        .partitions
        .iter()
        .map(|p| p.active_limit)
        .collect();
    let scene = Scene {
        pools,
        start: Instant::now(),
        held: limits
            .iter()
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect(),
        limits,
        over: AtomicBool::new(false),
        figures: Mutex::new(Default::default()),
        batch_reasons: Mutex::new(Vec::new()),
        cancelled: AtomicU64::new(0),
        fallbacks_served: AtomicU64::new(0),
    };
    println!(
        "\n## Gateway pools: the primary provider turns slow ({} ms baseline, then {} ms with the \
         primary at {} ms per call, the secondary at {} ms)\n",
        BASELINE.as_millis(),
        SLOW.as_millis(),
        SLOW_US / 1000,
        FAST_US / 1000
    );
    let mut most_pending = 0;
    std::thread::scope(|s| {
        let mut thread = 0u64;
        for (name, count, cancels) in SENDERS {
            for _ in 0..count {
                thread += 1;
                let (scene, t) = (&scene, thread);
                s.spawn(move || sender(scene, name, t, cancels));
            }
        }
        // Sample the slow partition's queue while the threads run.
        let batch = scene.pools.partition("primary-batch").expect("configured");
        while scene.phase().is_some() {
            let p = scene.pools.stats().partitions[batch.index()].pending;
            most_pending = most_pending.max(p);
            std::thread::sleep(Duration::from_millis(5));
        }
        // The senders stop at the end of the slow phase; a queued waiter leaves by its age.
    });

    let s = scene.pools.stats();
    let mut figures = scene.figures.lock().unwrap().clone();
    println!("| phase | secondary's own: admitted | refused | decision p50 / p99 | end-to-end p50 / p99 | primary's: admitted | refused |");
    println!("|---|---:|---:|---|---|---:|---:|");
    let mut medians = [0u64; 2];
    for (phase, name) in ["baseline", "primary slow"].iter().enumerate() {
        let [own, primary] = &mut figures[phase];
        medians[phase] = pct(&mut own.total_us, 0.5);
        println!(
            "| {name} | {} | {} | {} µs / {} µs | {:.1} ms / {:.1} ms | {} | {} |",
            own.admitted,
            own.refused,
            pct(&mut own.decide_us, 0.5),
            pct(&mut own.decide_us, 0.99),
            medians[phase] as f64 / 1000.0,
            pct(&mut own.total_us, 0.99) as f64 / 1000.0,
            primary.admitted,
            primary.refused,
        );
    }
    let reasons = scene.batch_reasons.lock().unwrap().clone();
    let find = |n: &str| {
        s.partitions
            .iter()
            .find(|p| p.name == n)
            .expect("configured")
    };
    let (pb, pi, sf) = (
        find("primary-batch"),
        find("primary-interactive"),
        find("secondary-fallback"),
    );
    println!(
        "\nprimary-batch (active 1, pending limit {}): queue at most {most_pending} deep; {} queued, \
         {} timed out; refusals by reason while slow: {}",
        pb.pending_limit,
        pb.queued,
        pb.timed_out,
        reasons
            .iter()
            .map(|(r, n)| format!("{} {n}", r.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let fallback_most = scene.held[s
        .partitions
        .iter()
        .position(|p| p.name == "secondary-fallback")
        .unwrap_or(0)]
    .1
    .load(Ordering::SeqCst);
    println!(
        "primary-interactive overflow: {} fallbacks decided, {} served by secondary-fallback \
         (active limit {}, at most {fallback_most} at once)",
        pi.fallbacks,
        scene.fallbacks_served.load(Ordering::Relaxed),
        sf.active_limit,
    );
    let cancelled = scene.cancelled.load(Ordering::Relaxed);

    // The checks.
    let mut ok = true;
    let mut check = |good: bool, what: String| {
        println!("  [{}] {what}", if good { "ok" } else { "FAILED" });
        ok &= good;
    };
    println!();
    let own = &figures;
    check(
        own[0][0].refused + own[1][0].refused == 0 && own[1][0].admitted > 0,
        format!(
            "the secondary's own partitions admitted every request in both phases ({} and {})",
            own[0][0].admitted, own[1][0].admitted
        ),
    );
    // Latency is a figure, not a check: on a shared machine a timing bound is a coin toss,
    // and the admissions above are what the pools decide.
    println!(
        "  [figure] the secondary's median latency: {:.1} ms while the primary was slow, {:.1} ms before",
        medians[1] as f64 / 1000.0,
        medians[0] as f64 / 1000.0
    );
    let overflowed = reasons
        .iter()
        .any(|(r, n)| *r == Reason::PendingLimitReached && *n > 0);
    check(
        overflowed,
        format!(
            "primary-batch's queue filled (to its limit of {}) and overflowed with pending_limit_reached",
            pb.pending_limit
        ),
    );
    check(
        pi.fallbacks > 0 && !scene.over.load(Ordering::SeqCst) && fallback_most <= sf.active_limit,
        format!(
            "the primary's overflow fell back within secondary-fallback's own budget (at most {fallback_most} of {}), and no partition passed its limit",
            sf.active_limit
        ),
    );
    let ev = events.lock().unwrap();
    let started_then_cancelled: Vec<u64> = ev
        .iter()
        .filter(|(_, l)| l == "completed Some(Cancelled)")
        .map(|(id, _)| *id)
        .collect();
    let told = started_then_cancelled.iter().all(|id| {
        let story: Vec<&str> = ev
            .iter()
            .filter(|(r, _)| r == id)
            .map(|(_, l)| l.as_str())
            .collect();
        story == ["Queue", "Dispatch", "completed Some(Cancelled)"]
    });
    check(
        cancelled > 0 && told,
        format!(
            "{cancelled} cancelled waiters gave everything back ({} had been started by a release: each has its dispatch and its cancelled completion events)",
            started_then_cancelled.len()
        ),
    );
    let rest = s.global.held == 0
        && s.providers.iter().all(|p| p.held == 0)
        && s.partitions
            .iter()
            .all(|p| (p.active, p.tentative, p.pending) == (0, 0, 0) && p.admitted == p.completed);
    check(
        rest,
        "at rest every partition, connection and the global guard is back to zero".into(),
    );
    ok
}
