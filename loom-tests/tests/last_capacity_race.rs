//! Models the admission decision (`Bulkhead::try_acquire`, CONTRACT.md §2 and §10): two
//! acquirers race, each with one load-decide-CAS loop on the packed state word, for the last
//! free slot and, separately, for the last tokens of the budget (enough for exactly one of the
//! two reservations).
//!
//! Asserted in every interleaving: exactly one wins; the loser is refused with the right reason
//! (`concurrency_limit` / `budget_limit`) and its `Rejection` describes the one real state it
//! was decided against (the winner already in, nothing else changed); the winner observes the
//! exact state it created; after everything is released, slots and tokens are back to zero and
//! the admitted / released / rejected counters (and the token totals) are exact.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{Admission, Bulkhead, Priority, RejectReason, Rejection, Usage};
use loom::thread;

// The refusal detail types are `#[non_exhaustive]`: the expected values are literals of the
// main crate's test-side mirrors.
#[path = "../../tests/support/detail.rs"]
mod detail;
use detail::{CapacityDetail, TokenCapacity};

/// Spawns `n` acquirers of `demand` against `b`; each checks the state it sees right after a
/// successful admission with `check_won` and hands its result back.
fn race(
    b: &Bulkhead,
    n: usize,
    demand: llm_bulkhead::Demand,
    check_won: fn(&Bulkhead, &Admission),
) -> (Vec<Admission>, Vec<Rejection>) {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let b = b.clone();
            thread::spawn(move || {
                let res = b.try_acquire(demand);
                if let Ok(a) = &res {
                    check_won(&b, a);
                }
                res
            })
        })
        .collect();
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for h in handles {
        match h.join().unwrap() {
            Ok(a) => won.push(a),
            Err(r) => lost.push(r),
        }
    }
    (won, lost)
}

#[test]
fn two_acquirers_race_for_the_last_slot() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(100)
            .build()
            .unwrap();
        // One slot of two is taken before the race: one is left.
        let held = b.try_acquire(tokens(1, 1)).unwrap();

        let (won, lost) = race(&b, 2, tokens(1, 1), |b, a| {
            // Nobody releases during the race and the loser adds nothing: the winner sees
            // exactly the state its CAS made, never more than the limit.
            let s = b.stats();
            assert!(s.in_flight <= 2, "over-admission: {s:?}");
            assert_eq!(s.in_flight, 2, "{s:?}");
            assert_eq!(token_stats(&s).in_flight_tokens, 4, "{s:?}");
            assert_eq!((a.revision(), a.held()), (0, 2));
        });

        assert_eq!(won.len(), 1, "exactly one acquirer must win the last slot");
        assert_eq!(lost.len(), 1);
        let r = &lost[0];
        assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
        assert_eq!(r.constraint, None);
        assert_eq!(r.revision, 0);
        // The only state that refuses this demand: the winner and `held` in, 4 tokens held.
        assert_eq!(
            CapacityDetail::of(&r.detail()),
            CapacityDetail {
                in_flight: 2,
                pending: 0,
                max_concurrent: 2,
                max_queue: 0,
                token_budget: Some(TokenCapacity {
                    budget: 100,
                    in_flight_tokens: 4,
                    effective_budget: 100,
                    available: 96,
                    requested: 2,
                }),
                classes: None
            }
        );

        let s = b.stats();
        assert_eq!((s.in_flight, s.admitted, s.rejected), (2, 2, 1), "{s:?}");
        assert_eq!(s.rejected_by_reason.concurrency_limit, 1);

        drop(won);
        held.release(None).unwrap();
        assert_quiescent(&b, 2, 1);
        let t = token_stats(&b.stats());
        assert_eq!(
            (t.total_reserved, t.total_consumed, t.total_refunded),
            (4, 0, 0)
        );
    });
}

#[test]
fn two_acquirers_race_for_the_last_tokens() {
    model(|| {
        // eff(normal) = 12 - 2 = 10. Slots are plentiful: only tokens can refuse.
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(12)
            .high_priority_reserve(2)
            .build()
            .unwrap();
        let held = b.try_acquire(tokens(3, 1)).unwrap(); // T = 4; 6 normal tokens left

        // Each wants 6: one fits (4 + 6 = 10 <= 10), two never do (16 > 10).
        let (won, lost) = race(&b, 2, tokens(4, 2), |b, a| {
            let s = b.stats();
            let t = token_stats(&s);
            assert!(t.in_flight_tokens <= 10, "budget exceeded: {s:?}");
            assert_eq!((s.in_flight, t.in_flight_tokens), (2, 10), "{s:?}");
            assert_eq!(
                (a.revision(), a.held(), a.priority()),
                (0, 6, Priority::Normal)
            );
        });

        assert_eq!(
            won.len(),
            1,
            "exactly one acquirer must win the last tokens"
        );
        assert_eq!(lost.len(), 1);
        let r = &lost[0];
        assert_eq!(r.reason, RejectReason::BudgetLimit, "{r:?}");
        assert_eq!(r.revision, 0);
        assert_eq!(
            CapacityDetail::of(&r.detail()),
            CapacityDetail {
                in_flight: 2,
                pending: 0,
                max_concurrent: 4,
                max_queue: 0,
                token_budget: Some(TokenCapacity {
                    budget: 12,
                    in_flight_tokens: 10,
                    effective_budget: 10,
                    available: 0,
                    requested: 6,
                }),
                classes: None
            }
        );
        let s = b.stats();
        assert_eq!(s.rejected_by_reason.budget_limit, 1, "{s:?}");
        assert_eq!(token_stats(&s).in_flight_tokens, 10, "{s:?}");

        for a in won {
            let rep = a.release(Some(Usage::new(4, 1))).unwrap();
            assert_eq!((rep.held, rep.consumed, rep.refunded), (6, Some(5), 1));
        }
        held.release(None).unwrap();
        assert_quiescent(&b, 2, 1);
        let t = token_stats(&b.stats());
        assert_eq!(
            (
                t.total_reserved,
                t.total_consumed,
                t.total_refunded,
                t.total_overrun
            ),
            (10, 5, 1, 0)
        );
    });
}
