//! Models reconfiguration racing decisions (CONTRACT.md §2, §6, §10): `apply_limits` writes the
//! next slot of the limits ring (2 slots under loom) with a `Release` fence and `Relaxed`
//! stores, then bumps the tag in the state word with a CAS, while an acquirer runs
//! `try_acquire` (load the word, read the ring slot its tag names, decide, CAS, or on a refusal
//! re-read the word to make sure the tag did not move).
//!
//! Four scenarios: (a) kill switch (`max_concurrent` → 0), (b) shrink, (c) raise, and (d) two
//! consecutive installs, so that the second rewrites the ring slot of the initial limits while a
//! decider that loaded the old tag may still be reading it (a torn read is possible and must
//! never decide anything).
//!
//! Asserted in every interleaving, for every attempt of the acquirer:
//! * the revision it carries (admission or rejection) is one that was installed, and installed
//!   before the attempt ended (checked against `limits()` right after); it is never older than
//!   the newest install whose `apply_limits` had returned before the attempt started (signalled
//!   by the applier through a loom atomic after `apply_limits` returns); under the kill switch
//!   such an attempt never succeeds;
//! * the outcome is exactly what the sequential rule (CONTRACT.md §2) gives for the state at the
//!   decision (known exactly here) and the limits *of the revision it carries*: an admission
//!   respects the slot and token limits of the revision that authorised it, and a rejection's
//!   reason and whole detail match those limits (a torn read of the ring would show up as a
//!   revision paired with another revision's numbers);
//! * `apply_limits` reports the right previous snapshot; at the end the last snapshot is current,
//!   nothing is in flight and the counters are exact.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{
    BudgetLimits, Bulkhead, CapacityDetail, LimitsSnapshot, RejectReason, TokenCapacity,
};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// One limits snapshot, reduced to what these models vary.
#[derive(Clone, Copy, Debug)]
struct Lim {
    rev: u64,
    max: u32,
    budget: u64,
}

impl Lim {
    fn snapshot(self) -> LimitsSnapshot {
        LimitsSnapshot {
            revision: self.rev,
            max_concurrent: self.max,
            max_queue: 0,
            token_budget: Some(BudgetLimits {
                budget: self.budget,
                high_priority_reserve: 0,
            }),
            classes: Default::default(),
        }
    }
}

/// Every demand in these models (held ones and the acquirer's) reserves this many tokens.
const R: u64 = 2;

#[derive(Clone, Copy)]
struct Scenario {
    initial: Lim,
    installs: &'static [Lim],
    /// Admissions taken before the race and held until the end.
    held: u64,
    /// Sequential `try_acquire` calls made by the acquirer.
    attempts: usize,
}

/// The sequential decision of CONTRACT.md §2 for `slots`/`tokens` in use under `lim`.
fn expected(slots: u64, tokens: u64, lim: Lim) -> Result<(), RejectReason> {
    if tokens + R > lim.budget {
        Err(RejectReason::BudgetLimit)
    } else if slots >= u64::from(lim.max) {
        Err(RejectReason::ConcurrencyLimit)
    } else {
        Ok(())
    }
}

fn run(sc: Scenario) {
    model(move || {
        let b = Bulkhead::builder()
            .max_concurrent(sc.initial.max)
            .token_budget(sc.initial.budget)
            .initial_revision(sc.initial.rev)
            .build()
            .unwrap();
        let held: Vec<_> = (0..sc.held)
            .map(|_| b.try_acquire(tokens(1, 1)).unwrap())
            .collect();
        // How many installs have returned (written by the applier after each returns).
        let installed = Arc::new(AtomicUsize::new(0));
        let kill_is_last = sc.installs.last().is_some_and(|l| l.max == 0);

        let applier = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                let mut previous = sc.initial.rev;
                for (i, lim) in sc.installs.iter().enumerate() {
                    let change = b.apply_limits(lim.snapshot()).unwrap();
                    assert_eq!(change.previous.revision, previous);
                    assert_eq!(change.current, lim.snapshot());
                    previous = lim.rev;
                    installed.store(i + 1, Ordering::SeqCst);
                }
            })
        };

        let acquirer = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                let lim_of = |rev: u64| -> Lim {
                    std::iter::once(&sc.initial)
                        .chain(sc.installs)
                        .find(|l| l.rev == rev)
                        .copied()
                        .unwrap_or_else(|| panic!("revision {rev} was never installed"))
                };
                let mut wins = Vec::new();
                let mut refused = 0u64;
                for _ in 0..sc.attempts {
                    let n = installed.load(Ordering::SeqCst);
                    let newest_returned = if n == 0 {
                        sc.initial.rev
                    } else {
                        sc.installs[n - 1].rev
                    };
                    // Nobody else changes slots or tokens during the race: the state at the
                    // decision is known exactly.
                    let slots = sc.held + wins.len() as u64;
                    let tokens_held = R * slots;
                    let res = b.try_acquire(tokens(1, 1));
                    // Not from the future: the revision carried was installed before the attempt
                    // ended (`limits()` takes the reconfiguration lock, which `apply_limits`
                    // holds from before its tag bump until the canonical snapshot is updated).
                    let carried = res.as_ref().map_or_else(|r| r.revision, |a| a.revision());
                    let current_now = b.limits().revision;
                    assert!(
                        carried <= current_now,
                        "carries revision {carried}, not installed yet (current {current_now})"
                    );
                    match res {
                        Ok(a) => {
                            let lim = lim_of(a.revision());
                            assert!(
                                a.revision() >= newest_returned,
                                "admitted under revision {} after revision {newest_returned} \
                                 was installed",
                                a.revision()
                            );
                            assert!(
                                !(kill_is_last && n == sc.installs.len()),
                                "admitted after the kill switch was installed: {a:?}"
                            );
                            assert_eq!(
                                expected(slots, tokens_held, lim),
                                Ok(()),
                                "admission not allowed by the limits of its revision {lim:?}"
                            );
                            let s = b.stats();
                            assert_eq!(s.in_flight, slots + 1, "{s:?}");
                            assert!(s.in_flight <= u64::from(lim.max), "{s:?} under {lim:?}");
                            let t = token_stats(&s);
                            assert!(t.in_flight_tokens <= lim.budget, "{s:?} under {lim:?}");
                            wins.push(a);
                        }
                        Err(r) => {
                            let lim = lim_of(r.revision);
                            assert!(
                                r.revision >= newest_returned,
                                "refused under revision {} after revision {newest_returned} \
                                 was installed: {r:?}",
                                r.revision
                            );
                            assert_eq!(
                                expected(slots, tokens_held, lim),
                                Err(r.reason),
                                "refusal not explained by the limits of its revision: {r:?}"
                            );
                            assert_eq!(r.constraint, None);
                            // `CapacityDetail` and `TokenCapacity` are `#[non_exhaustive]`:
                            // compare their fields.
                            let d: CapacityDetail = r.detail();
                            assert_eq!(
                                (d.in_flight, d.pending, d.max_concurrent, d.max_queue),
                                (slots, 0, u64::from(lim.max), 0),
                                "refusal detail is not one real state: {r:?}"
                            );
                            assert!(d.classes.is_none(), "{r:?}");
                            let t: TokenCapacity = d.token_budget.expect("a budget refusal");
                            assert_eq!(
                                (
                                    t.budget,
                                    t.in_flight_tokens,
                                    t.effective_budget,
                                    t.available,
                                    t.requested
                                ),
                                (
                                    lim.budget,
                                    tokens_held,
                                    lim.budget,
                                    lim.budget.saturating_sub(tokens_held),
                                    R
                                ),
                                "refusal detail is not one real state: {r:?}"
                            );
                            refused += 1;
                        }
                    }
                }
                (wins, refused)
            })
        };

        applier.join().unwrap();
        let (wins, refused) = acquirer.join().unwrap();
        let last = sc.installs.last().copied().unwrap_or(sc.initial);
        assert_eq!(b.limits(), last.snapshot());
        let admitted = sc.held + wins.len() as u64;
        let s = b.stats();
        assert_eq!(s.in_flight, admitted, "{s:?}");
        assert_eq!(token_stats(&s).in_flight_tokens, R * admitted, "{s:?}");
        drop(wins);
        drop(held);
        assert_quiescent(&b, admitted, refused);
    });
}

#[test]
fn acquire_against_kill_switch() {
    run(Scenario {
        initial: Lim {
            rev: 0,
            max: 2,
            budget: 10,
        },
        installs: &[Lim {
            rev: 1,
            max: 0,
            budget: 10,
        }],
        held: 0,
        attempts: 2,
    });
}

#[test]
fn acquire_against_shrink() {
    // Revision 0 admits one more; revision 1 (one slot, budget 3) refuses with budget_limit
    // (2 held + 2 > 3), so each revision gives a different answer.
    run(Scenario {
        initial: Lim {
            rev: 0,
            max: 2,
            budget: 10,
        },
        installs: &[Lim {
            rev: 1,
            max: 1,
            budget: 3,
        }],
        held: 1,
        attempts: 2,
    });
}

#[test]
fn acquire_against_raise() {
    // Revision 0 is full; revision 1 admits both attempts.
    run(Scenario {
        initial: Lim {
            rev: 0,
            max: 1,
            budget: 10,
        },
        installs: &[Lim {
            rev: 1,
            max: 3,
            budget: 10,
        }],
        held: 1,
        attempts: 2,
    });
}

#[test]
fn acquire_against_two_installs_reusing_a_ring_slot() {
    // RING is 2 under loom: revision 7 is written into the slot of revision 5 while a decider
    // holding the old tag may read it. Every revision answers differently for the first
    // attempt (5: concurrency_limit, 6: budget_limit, 7: admit), and revision 7's numbers would
    // admit under revision 5's label if a torn read ever decided.
    run(Scenario {
        initial: Lim {
            rev: 5,
            max: 1,
            budget: 10,
        },
        installs: &[
            Lim {
                rev: 6,
                max: 2,
                budget: 3,
            },
            Lim {
                rev: 7,
                max: 2,
                budget: 20,
            },
        ],
        held: 1,
        attempts: 2,
    });
}

#[test]
fn acquire_against_kill_switch_then_reopen_reusing_a_ring_slot() {
    // Revision 1 kills; revision 2 reopens with a token budget that fits only one more, written
    // into the slot of revision 0.
    run(Scenario {
        initial: Lim {
            rev: 0,
            max: 2,
            budget: 20,
        },
        installs: &[
            Lim {
                rev: 1,
                max: 0,
                budget: 20,
            },
            Lim {
                rev: 2,
                max: 3,
                budget: 4,
            },
        ],
        held: 1,
        attempts: 2,
    });
}
