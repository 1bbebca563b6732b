//! Models `close` racing a decision and in-flight work (CONTRACT.md §2 check 0, §5, §7, §10):
//! `close` is one `fetch_or` of the closed bit on the state word; `try_acquire` loads the word,
//! decides and CASes; an admission taken before the close keeps reporting usage (growing its
//! hold: a CAS loop with no admission check) and releases (`fetch_sub`) after the close.
//!
//! Asserted in every interleaving: an acquire that starts after `close()` returned (signalled
//! through a loom `AtomicBool`) is refused with `shutdown`; one that raced either succeeds
//! (and can still report usage and release after the close) or is refused with `shutdown` and a
//! detail that is a real state; the in-flight admission's report and release succeed after the
//! close with the right numbers; the bulkhead stays closed; a later acquire is refused with
//! `shutdown`; at the end slots and tokens are zero and every counter is exact.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{Bulkhead, RejectReason, Usage};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn acquire_against_close_with_work_in_flight() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(10)
            .build()
            .unwrap();
        let mut in_flight = b.try_acquire(tokens(2, 2)).unwrap(); // T = 4
        let closed = Arc::new(AtomicBool::new(false));

        let closer = {
            let b = b.clone();
            let closed = closed.clone();
            thread::spawn(move || {
                b.close();
                closed.store(true, Ordering::SeqCst);
                assert!(b.is_closed());
                // Work admitted before the close goes on: usage (3, 3) grows the hold to
                // 3 + max(2, 3) = 6 (overrun of 2, no admission check), then it releases.
                let rep = in_flight.report_usage(Usage::new(3, 3), None).unwrap();
                assert_eq!((rep.held, rep.sequence, rep.consumed), (6, 1, 6));
                assert!(rep.over_reservation);
                let rel = in_flight.release(Some(Usage::new(3, 3))).unwrap();
                assert_eq!((rel.held, rel.consumed, rel.refunded), (6, Some(6), 0));
            })
        };

        let acquirer = {
            let b = b.clone();
            let closed = closed.clone();
            thread::spawn(move || {
                let after_close = closed.load(Ordering::SeqCst);
                match b.try_acquire(tokens(1, 1)) {
                    Ok(mut a) => {
                        assert!(!after_close, "admitted after close() returned: {a:?}");
                        assert_eq!(a.revision(), 0);
                        // It raced and won; it may now be running after the close: usage (0, 0)
                        // shrinks the hold to 0 + max(1, 0) = 1 (refund 1), then release.
                        let rep = a.report_usage(Usage::new(0, 0), None).unwrap();
                        assert_eq!(rep.held, 1);
                        let rel = a.release(None).unwrap();
                        assert_eq!((rel.held, rel.consumed, rel.refunded), (1, Some(0), 1));
                        true
                    }
                    Err(r) => {
                        // Slots (at most 2 of 2 after this one) and tokens (at most 6 + 2 of
                        // 10) always suffice: only the close can refuse.
                        assert_eq!(r.reason, RejectReason::Shutdown, "{r:?}");
                        assert_eq!(r.revision, 0);
                        let t = r.detail().token_budget.unwrap();
                        // The in-flight admission before its report, after it, or released.
                        assert!(
                            matches!(
                                (r.detail().in_flight, t.in_flight_tokens),
                                (1, 4) | (1, 6) | (0, 0)
                            ),
                            "refusal not explained by a real state: {r:?}"
                        );
                        false
                    }
                }
            })
        };

        closer.join().unwrap();
        let won = u64::from(acquirer.join().unwrap());
        assert!(b.is_closed());
        let late = b.try_acquire(tokens(0, 0)).unwrap_err();
        assert_eq!(late.reason, RejectReason::Shutdown);

        let s = b.stats();
        assert!(s.closed);
        assert_eq!(s.rejected_by_reason.shutdown, 2 - won, "{s:?}");
        assert_quiescent(&b, 1 + won, 2 - won);
        let t = token_stats(&s);
        assert_eq!(
            (
                t.total_reserved,
                t.total_overrun,
                t.total_consumed,
                t.total_refunded
            ),
            (4 + 2 * won, 2, 6, 2 * won)
        );
    });
}

#[test]
fn two_acquirers_against_close() {
    // Only the last slot is free: the close and the two acquirers race; at most one is
    // admitted, and a loser is refused with shutdown or concurrency_limit according to the
    // state it saw.
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(10)
            .build()
            .unwrap();
        let held = b.try_acquire(tokens(1, 1)).unwrap();
        let closed = Arc::new(AtomicBool::new(false));
        let closer = {
            let b = b.clone();
            let closed = closed.clone();
            thread::spawn(move || {
                b.close();
                closed.store(true, Ordering::SeqCst);
            })
        };
        let acquirers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                let closed = closed.clone();
                thread::spawn(move || {
                    let after_close = closed.load(Ordering::SeqCst);
                    let res = b.try_acquire(tokens(1, 1));
                    match &res {
                        Ok(_) => assert!(!after_close, "admitted after close() returned"),
                        Err(r) if after_close => {
                            assert_eq!(r.reason, RejectReason::Shutdown, "{r:?}")
                        }
                        Err(r) => match r.reason {
                            RejectReason::Shutdown => {}
                            // Not closed yet, but the other acquirer holds the last slot.
                            RejectReason::ConcurrencyLimit => {
                                assert_eq!(r.detail().in_flight, 2, "{r:?}");
                                assert_eq!(r.detail().token_budget.unwrap().in_flight_tokens, 4);
                            }
                            other => panic!("unexpected reason {other}: {r:?}"),
                        },
                    }
                    res
                })
            })
            .collect();
        closer.join().unwrap();
        let results: Vec<_> = acquirers.into_iter().map(|h| h.join().unwrap()).collect();
        let won = results.iter().filter(|r| r.is_ok()).count() as u64;
        assert!(
            won <= 1,
            "over-admission: {won} acquirers won the last slot"
        );
        let s = b.stats();
        assert_eq!(s.in_flight, 1 + won, "{s:?}");
        let shutdowns = results
            .iter()
            .filter(|r| matches!(r, Err(e) if e.reason == RejectReason::Shutdown))
            .count() as u64;
        assert_eq!(s.rejected_by_reason.shutdown, shutdowns, "{s:?}");
        drop(results);
        drop(held);
        assert_quiescent(&b, 1 + won, 2 - won);
    });
}
