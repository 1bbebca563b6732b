//! Models a decision racing a settlement (CONTRACT.md §2, §5, §10): with `max_concurrent = 1`,
//! thread B owns the only admission, shrinks its hold with `report_usage` (a `fetch_sub` of the
//! refund) and then gives it back (`release`, or `drop`: one `fetch_sub` of the slot and the
//! whole hold), while thread A runs `try_acquire` (load, decide, CAS).
//!
//! Asserted in every interleaving: nobody ever sees more than one slot in use; A is admitted
//! only if its CAS came after B's release (it then sees B's slot *and* B's tokens gone), and is
//! always admitted if it started after B's release returned (signalled through a loom
//! `AtomicBool`); otherwise A is refused with `concurrency_limit` and a detail that is a real
//! state (B's slot held, B's hold before or after its refund); at the end everything is zero
//! and the counters are exact.
#![cfg(loom)]

mod common;

use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{Bulkhead, RejectReason, Usage};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

fn race_acquire_with_settlement(release_by_drop: bool) {
    model(move || {
        let b = Bulkhead::builder()
            .max_concurrent(1)
            .token_budget(10)
            .build()
            .unwrap();
        let mut held = b.try_acquire(tokens(2, 2)).unwrap(); // the only slot; T = 4
        let released = Arc::new(AtomicBool::new(false));

        let tb = {
            let b = b.clone();
            let released = released.clone();
            thread::spawn(move || {
                let s = b.stats();
                assert!(s.in_flight <= 1, "over-admission: {s:?}");
                // Usage (1, 0) makes the hold 1 + max(2, 0) = 3: a refund of 1.
                let rep = held.report_usage(Usage::new(1, 0), None).unwrap();
                assert_eq!((rep.held, rep.sequence), (3, 1));
                if release_by_drop {
                    drop(held);
                } else {
                    let rep = held.release(Some(Usage::new(1, 1))).unwrap();
                    assert_eq!((rep.held, rep.consumed, rep.refunded), (3, Some(2), 1));
                }
                released.store(true, Ordering::SeqCst);
                let s = b.stats();
                assert!(s.in_flight <= 1, "over-admission: {s:?}");
            })
        };

        let ta = {
            let b = b.clone();
            let released = released.clone();
            thread::spawn(move || {
                let after_release = released.load(Ordering::SeqCst);
                match b.try_acquire(tokens(1, 1)) {
                    Ok(a) => {
                        // Admitted, so its CAS followed B's release: exactly A's slot and A's
                        // tokens are in flight.
                        let s = b.stats();
                        assert!(s.in_flight <= 1, "over-admission: {s:?}");
                        assert_eq!(s.in_flight, 1, "{s:?}");
                        assert_eq!(token_stats(&s).in_flight_tokens, 2, "{s:?}");
                        assert_eq!((a.revision(), a.held()), (0, 2));
                        drop(a);
                        true
                    }
                    Err(r) => {
                        assert!(
                            !after_release,
                            "refused although the only admission was already released: {r:?}"
                        );
                        assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
                        assert_eq!(r.revision, 0);
                        let d = &r.detail();
                        assert_eq!((d.in_flight, d.max_concurrent), (1, 1), "{r:?}");
                        let t = d.token_budget.unwrap();
                        // B's hold before (4) or after (3) its refund; never a mix.
                        assert!(
                            matches!(t.in_flight_tokens, 3 | 4),
                            "refusal not explained by a real state: {r:?}"
                        );
                        assert_eq!(t.available, 10 - t.in_flight_tokens);
                        assert_eq!(t.requested, 2);
                        false
                    }
                }
            })
        };

        tb.join().unwrap();
        let a_won = ta.join().unwrap();
        let wins = u64::from(a_won);
        assert_quiescent(&b, 1 + wins, 1 - wins);
        let s = b.stats();
        assert_eq!(s.rejected_by_reason.concurrency_limit, 1 - wins);
        let t = token_stats(&s);
        assert_eq!(t.total_reserved, 4 + 2 * wins);
        // B's report refunds 1, then its settlement refunds hold 3 − consumed: 1 with the
        // final usage (1, 1), 2 by drop (last report, (1, 0)). A's drop knows no usage.
        let settle_refund = if release_by_drop { 2 } else { 1 };
        assert_eq!(t.total_refunded, 1 + settle_refund);
        assert_eq!(t.total_consumed, 3 - settle_refund);
    });
}

#[test]
fn acquire_against_release() {
    race_acquire_with_settlement(false);
}

#[test]
fn acquire_against_drop() {
    race_acquire_with_settlement(true);
}
