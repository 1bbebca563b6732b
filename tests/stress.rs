//! Bounded stress tests on real threads, with an independent tally kept outside the bulkhead.
//!
//! The tally is raised *after* an admission or hold growth and lowered *before* a release or
//! hold shrink, so it is always a lower bound of the true state; an admission that pushed the
//! true state over a limit would push the tally over it too. Overrun (usage growth, which is
//! accounting and not admission) is tallied *before* it happens, so `budget + overrun` is
//! always an upper bound for the tokens held. No test sleeps or measures time.

use llm_bulkhead::{Admission, Bulkhead, Demand, Reconcile, RejectReason, Reservation, Usage};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Barrier;

const THREADS: usize = 4;
const ITERS: usize = 50_000;
const MAX: u64 = 3;
const BUDGET: u64 = 2_500;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

#[derive(Default)]
struct Tally {
    slots: AtomicU64,
    tokens: AtomicU64,
    overrun: AtomicU64,
    admitted: AtomicU64,
    refused: AtomicU64,
    violations: AtomicU64,
}

impl Tally {
    fn raise_slots(&self) {
        if self.slots.fetch_add(1, SeqCst) + 1 > MAX {
            self.violations.fetch_add(1, SeqCst);
        }
    }
    fn raise_tokens(&self, n: u64) {
        let now = self.tokens.fetch_add(n, SeqCst) + n;
        if now > BUDGET + self.overrun.load(SeqCst) {
            self.violations.fetch_add(1, SeqCst);
        }
    }
}

/// Releases (or drops) an admission, lowering the tally first.
fn settle(rng: &mut Rng, tally: &Tally, a: Admission, used: Usage) {
    tally.tokens.fetch_sub(a.held(), SeqCst);
    tally.slots.fetch_sub(1, SeqCst);
    if rng.below(2) == 0 {
        a.release(Some(used)).unwrap();
    } else {
        drop(a);
    }
}

#[test]
fn slots_and_tokens_never_exceed_limits_and_return_to_zero() {
    let b = Bulkhead::builder()
        .max_concurrent(MAX as u32)
        .token_budget(BUDGET)
        .build()
        .unwrap();
    let tally = Tally::default();
    let done = AtomicBool::new(false);
    let start = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for t in 0..THREADS {
            let (b, tally, start) = (&b, &tally, &start);
            workers.push(s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                start.wait();
                // Each thread keeps up to `MAX + 1` admissions at once, so that even fully
                // serialised threads reach both limits.
                let mut held: Vec<(Admission, Usage)> = Vec::new();
                for _ in 0..ITERS {
                    if !held.is_empty() && (held.len() > MAX as usize || rng.below(2) == 0) {
                        let (a, used) = held.swap_remove(rng.below(held.len() as u64) as usize);
                        settle(&mut rng, tally, a, used);
                        continue;
                    }
                    let (input, cap) = (rng.below(8) * 100, rng.below(8) * 100);
                    match b.try_acquire(Demand::tokens(Reservation::new(input, cap).unwrap())) {
                        Err(r) => {
                            assert!(matches!(
                                r.reason,
                                RejectReason::BudgetLimit | RejectReason::ConcurrencyLimit
                            ));
                            // The refusal is explained by the state it saw.
                            let t = r.detail().token_budget.unwrap();
                            match r.reason {
                                RejectReason::BudgetLimit => {
                                    assert!(t.in_flight_tokens + input + cap > BUDGET)
                                }
                                _ => assert!(r.detail().in_flight >= MAX),
                            }
                            tally.refused.fetch_add(1, SeqCst);
                        }
                        Ok(mut a) => {
                            tally.admitted.fetch_add(1, SeqCst);
                            tally.raise_slots();
                            tally.raise_tokens(a.held());
                            // A usage report: the new hold is predicted here, independently.
                            let used = Usage::new(rng.below(8) * 100, rng.below(10) * 100);
                            let progressive = rng.below(2) == 0;
                            let new_hold = if progressive {
                                let rem = cap.saturating_sub(used.output);
                                rem + 50 + used.output.saturating_sub(cap)
                            } else {
                                used.input + cap.max(used.output)
                            };
                            let old = a.held();
                            if new_hold > old {
                                tally.overrun.fetch_add(new_hold - old, SeqCst);
                            } else {
                                tally.tokens.fetch_sub(old - new_hold, SeqCst);
                            }
                            let reconcile = progressive.then(|| Reconcile {
                                remaining_output: cap.saturating_sub(used.output),
                                safety_margin: 50,
                            });
                            let rep = a.report_usage_reconciled(used, reconcile).unwrap();
                            assert_eq!(rep.held, new_hold);
                            if new_hold > old {
                                tally.raise_tokens(new_hold - old);
                            }
                            held.push((a, used));
                        }
                    }
                }
                for (a, used) in held {
                    settle(&mut rng, tally, a, used);
                }
            }));
        }
        // An observer checks the bulkhead's own view against the limits while work runs.
        let (b, tally, done) = (&b, &tally, &done);
        let observer = s.spawn(move || {
            let mut samples = 0u64;
            loop {
                let last = done.load(SeqCst);
                let st = b.stats();
                let t = st.token_budget.unwrap();
                assert!(st.in_flight <= MAX, "{st:?}");
                assert!(
                    t.in_flight_tokens <= BUDGET + tally.overrun.load(SeqCst),
                    "{st:?}"
                );
                samples += 1;
                if last {
                    break;
                }
            }
            samples
        });
        start.wait();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, SeqCst);
        assert!(observer.join().unwrap() > 0);
    });
    assert_eq!(tally.violations.load(SeqCst), 0);
    let s = b.stats();
    let t = s.token_budget.unwrap();
    assert_eq!(
        (s.in_flight, s.admissions_in_flight, t.in_flight_tokens),
        (0, 0, 0)
    );
    assert_eq!(s.admitted, tally.admitted.load(SeqCst));
    assert_eq!(s.released, s.admitted);
    assert_eq!(s.rejected, tally.refused.load(SeqCst));
    assert_eq!(t.total_overrun, tally.overrun.load(SeqCst));
    assert!(
        s.admitted > 0 && s.rejected > 0,
        "the test must exercise both outcomes: {s:?}"
    );
}

/// Reconfiguration races decisions: a reconfigurer alternates between a kill switch and an
/// open limit with increasing revisions. Every admission must carry an open revision (never
/// a kill-switch one); a decision that starts after `apply_limits` returned must carry that
/// revision or a newer one (CONTRACT.md §6); everything returns to zero.
#[test]
fn no_admission_under_a_kill_switch_revision() {
    let b = Bulkhead::builder()
        .max_concurrent(3)
        .initial_revision(0)
        .build()
        .unwrap();
    let stop = AtomicBool::new(false);
    let published = AtomicU64::new(0);
    let admissions = AtomicU64::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (b, stop, published, admissions) = (&b, &stop, &published, &admissions);
                s.spawn(move || {
                    let mut admitted = 0u64;
                    while !stop.load(SeqCst) {
                        let floor = published.load(SeqCst);
                        if let Ok(a) = b.try_acquire(Demand::slot()) {
                            // Even revisions are open (max 3), odd ones are kill switches.
                            assert_eq!(a.revision() % 2, 0, "admitted under a kill switch");
                            assert!(a.revision() >= floor, "decided under a replaced snapshot");
                            admitted += 1;
                            admissions.fetch_add(1, SeqCst);
                        }
                    }
                    admitted
                })
            })
            .collect();
        // At least 2,000 installs, and go on until the workers have raced them many times.
        let mut rev = 0u64;
        while rev < 2_000 || admissions.load(SeqCst) < 20_000 {
            rev += 1;
            let snap = b
                .limits()
                .with_revision(rev)
                .with_max_concurrent(if rev % 2 == 1 { 0 } else { 3 });
            b.apply_limits(snap).unwrap();
            published.store(rev, SeqCst);
            if rev % 2 == 1 {
                // The kill switch is installed: nothing can be admitted until the next install.
                assert!(b.try_acquire(Demand::slot()).is_err());
            }
        }
        stop.store(true, SeqCst);
        let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(total > 0);
    });
    assert_eq!(b.stats().in_flight, 0);
}
