//! Revisioned limits under load, on the no-class core (the gateway demo, `examples/demo.rs`,
//! shows admission classes): eight worker threads share one bulkhead (4 slots, a 6,000-token
//! in-flight budget with a 1,500-token high-priority reserve). Each worker makes "provider
//! calls": it reserves estimated input + max output tokens, does real CPU work sized by the
//! tokens, reports streaming usage halfway, and releases with the final usage. Midway the
//! control plane shrinks the bulkhead to 2 slots (revision 1), then opens it to 6 (revision 2).
//!
//! It prints a table of decisions per worker and per revision, and the final stats.
//!
//! Run: `cargo run --release --example threads`

use llm_bulkhead::{Bulkhead, Demand, Priority, Reconcile, RejectReason, Reservation, Usage};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const WORKERS: u64 = 8;
const CALLS: u64 = 300;

/// A small deterministic generator so every run makes the same requests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// "Calls the provider": waits like network I/O (2 µs per output token) and does a little CPU
/// work proportional to the tokens, as parsing a response would.
fn provider_work(tokens: u64) -> u64 {
    std::thread::sleep(Duration::from_micros(2 * tokens));
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..tokens * 4 {
        h = (h ^ i).wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[derive(Default, Clone)]
struct Row {
    admitted: u64,
    refused: BTreeMap<&'static str, u64>,
    consumed: u64,
    high: u64,
}

fn main() {
    let bulkhead = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(6_000)
        .high_priority_reserve(1_500)
        .build()
        .expect("valid configuration");
    let rows = Mutex::new(vec![Row::default(); WORKERS as usize]);
    let by_revision = Mutex::new(BTreeMap::<u64, u64>::new());
    let progress = AtomicU64::new(0);
    let sink = AtomicU64::new(0);

    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (bulkhead, rows, by_revision, progress, sink) =
                (&bulkhead, &rows, &by_revision, &progress, &sink);
            s.spawn(move || {
                let mut rng = Rng(w * 7_919 + 1);
                let mut row = Row::default();
                for _ in 0..CALLS {
                    let input = 200 + rng.next() % 1_800;
                    let max_output = 256 << (rng.next() % 3);
                    let priority = if rng.next() % 10 == 0 {
                        Priority::High
                    } else {
                        Priority::Normal
                    };
                    let demand =
                        Demand::tokens(Reservation::new(input, max_output).expect("small numbers"))
                            .with_priority(priority);
                    match bulkhead.try_acquire(demand) {
                        Ok(mut admission) => {
                            row.admitted += 1;
                            row.high += u64::from(priority == Priority::High);
                            *by_revision
                                .lock()
                                .unwrap()
                                .entry(admission.revision())
                                .or_default() += 1;
                            let output = rng.next() % (max_output + 64); // sometimes over the cap
                                                                         // Streaming: halfway through, report progress and return unused tokens.
                            let half = Usage::new(input, output / 2);
                            let remaining = max_output.saturating_sub(output / 2);
                            admission
                                .report_usage_reconciled(
                                    half,
                                    Reconcile {
                                        remaining_output: remaining,
                                        safety_margin: 32,
                                    },
                                )
                                .expect("valid usage");
                            sink.fetch_add(provider_work(output), Ordering::Relaxed);
                            let report = admission
                                .release(Some(Usage::new(input, output)))
                                .expect("valid usage");
                            row.consumed += report.consumed.unwrap_or(0);
                        }
                        Err(rejection) => {
                            *row.refused.entry(rejection.reason.as_str()).or_default() += 1;
                        }
                    }
                    progress.fetch_add(1, Ordering::Relaxed);
                    // Think time before this client's next call.
                    std::thread::sleep(Duration::from_micros(200 + rng.next() % 400));
                }
                rows.lock().unwrap()[w as usize] = row;
            });
        }
        // The control plane: shrink at one third of the calls, open up at two thirds.
        let total = WORKERS * CALLS;
        let mut step = 0;
        while progress.load(Ordering::Relaxed) < total {
            std::thread::sleep(Duration::from_millis(1));
            let done = progress.load(Ordering::Relaxed);
            if step == 0 && done >= total / 3 {
                bulkhead
                    .apply_limits(bulkhead.limits().with_revision(1).with_max_concurrent(2))
                    .unwrap();
                step = 1;
            } else if step == 1 && done >= 2 * total / 3 {
                bulkhead
                    .apply_limits(bulkhead.limits().with_revision(2).with_max_concurrent(6))
                    .unwrap();
                step = 2;
            }
        }
    });

    let rows = rows.into_inner().unwrap();
    let reasons = [RejectReason::ConcurrencyLimit, RejectReason::BudgetLimit];
    println!("llm-bulkhead threads: {WORKERS} threads x {CALLS} calls, 4 slots (then 2, then 6), budget 6000 (reserve 1500)\n");
    println!("| worker | admitted | high prio | refused: concurrency_limit | refused: budget_limit | tokens consumed |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut sum = Row::default();
    for (i, r) in rows.iter().enumerate() {
        let refused: Vec<u64> = reasons
            .iter()
            .map(|x| r.refused.get(x.as_str()).copied().unwrap_or(0))
            .collect();
        println!(
            "| {i} | {} | {} | {} | {} | {} |",
            r.admitted, r.high, refused[0], refused[1], r.consumed
        );
        sum.admitted += r.admitted;
        sum.high += r.high;
        sum.consumed += r.consumed;
        for (k, v) in &r.refused {
            *sum.refused.entry(k).or_default() += v;
        }
    }
    let get = |k: RejectReason| sum.refused.get(k.as_str()).copied().unwrap_or(0);
    println!(
        "| all | {} | {} | {} | {} | {} |\n",
        sum.admitted,
        sum.high,
        get(RejectReason::ConcurrencyLimit),
        get(RejectReason::BudgetLimit),
        sum.consumed
    );
    println!("| limits revision | max_concurrent | admissions decided under it |");
    println!("|---:|---:|---:|");
    for (rev, n) in by_revision.into_inner().unwrap() {
        println!("| {rev} | {} | {n} |", [4, 2, 6][rev as usize]);
    }
    let s = bulkhead.stats();
    let t = s.token_budget.expect("budget configured");
    println!("\nfinal stats:");
    println!(
        "  in flight {} (slots) / {} (admissions), tokens in flight {}",
        s.in_flight, s.admissions_in_flight, t.in_flight_tokens
    );
    println!(
        "  admitted {}, released {}, rejected {} ({:?})",
        s.admitted, s.released, s.rejected, s.rejected_by_reason
    );
    println!(
        "  tokens: reserved {}, consumed {}, refunded {}, overrun {}",
        t.total_reserved, t.total_consumed, t.total_refunded, t.total_overrun
    );
    assert_eq!(
        (s.in_flight, t.in_flight_tokens),
        (0, 0),
        "everything returned"
    );
    assert_eq!(s.admitted, sum.admitted);
    assert_eq!(s.rejected, WORKERS * CALLS - sum.admitted);
    println!("  (work checksum {:x})", sink.load(Ordering::Relaxed));
}
