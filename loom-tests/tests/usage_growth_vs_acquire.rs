//! Models usage reports racing a token decision (CONTRACT.md §2 check 1, §5, §10): thread B's
//! `report_usage` grows (CAS loop, no admission check: overrun is accounting) or shrinks
//! (`fetch_sub` of the refund) its hold, while thread A's `try_acquire` decides `T + r ≤ B` and
//! CASes the word.
//!
//! Growth (budget 10, B holds 4 and grows to 7, A asks 6): A may be admitted only if its CAS
//! came before the growth, i.e. A's reservation plus B's hold *before* growth fits (6 + 4 ≤ 10);
//! never against the grown hold (6 + 7 > 10). The witness is the state word itself: B reads the
//! tokens in flight right after its growth returned; B's growth CAS follows A's admission in
//! the word's modification order exactly when A was admitted, so B must see 13 (overrun on top
//! of A) if A won and 7 if A lost. An A that started after the growth returned is refused with
//! `budget_limit` and a detail showing the grown hold. Nobody releases before the end, so the
//! witness is exact; after both release everything is zero and the counters are exact.
//!
//! Shrink (the mirror image: B holds 4 and shrinks to 3, A asks 7): A is admitted only against
//! the shrunk hold, and always once the shrink has returned.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{Bulkhead, RejectReason, Usage};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

const BUDGET: u64 = 10;

#[test]
fn usage_growth_against_acquire() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(BUDGET)
            .build()
            .unwrap();
        let mut hold_b = b.try_acquire(tokens(2, 2)).unwrap(); // B's hold: 4
        let grown = Arc::new(AtomicBool::new(false));

        let tb = {
            let b = b.clone();
            let grown = grown.clone();
            thread::spawn(move || {
                // Usage (5, 2): hold 5 + max(2, 2) = 7, growth 3, never refused for budget.
                let rep = hold_b.report_usage(Usage::new(5, 2), None).unwrap();
                assert_eq!((rep.held, rep.sequence, rep.consumed), (7, 1, 7));
                assert!(rep.over_reservation);
                grown.store(true, Ordering::SeqCst);
                let seen = token_stats(&b.stats()).in_flight_tokens;
                (hold_b, seen)
            })
        };

        let ta = {
            let b = b.clone();
            let grown = grown.clone();
            thread::spawn(move || {
                let after_growth = grown.load(Ordering::SeqCst);
                match b.try_acquire(tokens(3, 3)) {
                    Ok(a) => {
                        assert!(!after_growth, "admitted against the grown hold: {a:?}");
                        // Admission is only ever checked against the pre-growth hold.
                        assert!(a.held() + 4 <= BUDGET);
                        let t = token_stats(&b.stats()).in_flight_tokens;
                        // A's 6 on top of B's 4, or of B's 7 if B grew since (overrun).
                        assert!(matches!(t, 10 | 13), "tokens in flight {t}");
                        Ok(a)
                    }
                    Err(r) => {
                        assert_eq!(r.reason, RejectReason::BudgetLimit, "{r:?}");
                        let t = r.detail().token_budget.unwrap();
                        // Only the grown hold refuses 6 tokens.
                        assert_eq!(
                            (
                                r.detail().in_flight,
                                t.in_flight_tokens,
                                t.available,
                                t.requested
                            ),
                            (1, 7, 3, 6),
                            "refusal not explained by a real state: {r:?}"
                        );
                        Err(r)
                    }
                }
            })
        };

        let (hold_b, seen_by_b) = tb.join().unwrap();
        let res_a = ta.join().unwrap();
        let won = u64::from(res_a.is_ok());
        if res_a.is_ok() {
            assert_eq!(
                seen_by_b, 13,
                "A admitted, yet B's growth did not land on top of it"
            );
        } else {
            assert_eq!(seen_by_b, 7, "A refused, yet B saw more than its own hold");
        }
        let s = b.stats();
        assert_eq!(token_stats(&s).in_flight_tokens, 7 + 6 * won, "{s:?}");

        let rel = hold_b.release(None).unwrap();
        assert_eq!((rel.held, rel.consumed, rel.refunded), (7, Some(7), 0));
        if let Ok(a) = res_a {
            let rel = a.release(Some(Usage::new(3, 1))).unwrap();
            assert_eq!((rel.held, rel.refunded), (6, 2));
        }
        assert_quiescent(&b, 1 + won, 1 - won);
        let t = token_stats(&b.stats());
        assert_eq!((t.total_overrun, t.total_reserved), (3, 4 + 6 * won));
        assert_eq!(b.stats().rejected_by_reason.budget_limit, 1 - won);
    });
}

#[test]
fn usage_shrink_against_acquire() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(BUDGET)
            .build()
            .unwrap();
        let mut hold_b = b.try_acquire(tokens(2, 2)).unwrap(); // B's hold: 4
        let shrunk = Arc::new(AtomicBool::new(false));

        let tb = {
            let shrunk = shrunk.clone();
            thread::spawn(move || {
                // Usage (1, 0): hold 1 + max(2, 0) = 3, a refund of 1.
                let rep = hold_b.report_usage(Usage::new(1, 0), None).unwrap();
                assert_eq!(rep.held, 3);
                shrunk.store(true, Ordering::SeqCst);
                hold_b
            })
        };

        let ta = {
            let b = b.clone();
            let shrunk = shrunk.clone();
            thread::spawn(move || {
                let after_shrink = shrunk.load(Ordering::SeqCst);
                match b.try_acquire(tokens(4, 3)) {
                    Ok(a) => {
                        // 7 fits only next to the shrunk hold (3 + 7 = 10).
                        let s = b.stats();
                        assert_eq!(token_stats(&s).in_flight_tokens, 10, "{s:?}");
                        Some(a)
                    }
                    Err(r) => {
                        assert!(!after_shrink, "refused after the refund returned: {r:?}");
                        assert_eq!(r.reason, RejectReason::BudgetLimit, "{r:?}");
                        let t = r.detail().token_budget.unwrap();
                        assert_eq!((t.in_flight_tokens, t.available, t.requested), (4, 6, 7));
                        None
                    }
                }
            })
        };

        let hold_b = tb.join().unwrap();
        let a = ta.join().unwrap();
        let won = u64::from(a.is_some());
        drop(a);
        drop(hold_b);
        assert_quiescent(&b, 1 + won, 1 - won);
        assert_eq!(token_stats(&b.stats()).total_overrun, 0);
    });
}
