//! Models of tag reuse (issue 11; `src/grace.rs`): under loom the shared word's limits tag and
//! the class words' tag (the class's version) have one bit and the limits ring two slots, so
//! two installs (each changing class `a`'s limits) bring every tag back to the value an
//! operation read before them and rewrite the ring slot (and floors entry) it read.
//!
//! Each model races one operation (a no-class decision, a drain-time admission, a class release
//! of a protected and of a borrowed admission, a class decision, a usage growth, an abandonment,
//! an undo through a token return) against two installs. Without the grace period
//! (`LLM_BULKHEAD_LOOM_NO_GRACE=1`, the deliberately broken variant) loom finds the interleaving
//! in which the operation reads, the two installs complete, and its CAS then succeeds against a
//! bit-identical word with limits or floors that are no longer current; with it, `apply_limits`
//! waits for the operation, whose CAS then fails on the tag that moved by one. The exception is
//! the borrowed release (one `fetch_add`, then a read of the floors): with the grace period off
//! loom does not find its window (see `a_protected_class_release_never_lands_on_a_wrapped_class_tag`),
//! and the deterministic regression in `tests/tag_wrap.rs` covers it.
//!
//! The no-class decision and the class fast attempt keep their marker in the calling thread's
//! counters entry of the bulkhead, not in the process-wide cell (`crate::grace::enter_decision`);
//! under loom the shared entry holds one such marker per loom thread. With
//! `LLM_BULKHEAD_LOOM_SKIP_DECISION_MARKERS=1` (the second broken variant) the grace period
//! scans the process-wide cells alone, and the two decision models fail: loom sees those
//! markers, and they are what holds the installs back.
//!
//! The grace period waits only for operations of the installing bulkhead that may hold a
//! count a whole tag period old (here: two installs), bounded from the installer's own scans
//! (`src/grace.rs`, "The period a marker holds"). Two more broken variants show the models see
//! that bound and the bulkhead ids: with `LLM_BULKHEAD_LOOM_GRACE_BOUND_NOW=1` an operation
//! the previous scan did not see is taken to hold the current count (not the previous scan's),
//! and seven models fail at `LOOM_MAX_PREEMPTIONS=3` (the operation must read between the first
//! install's scan and its bump: three preemptions); with `LLM_BULKHEAD_LOOM_GRACE_IGNORE_CELLS=1`
//! no process-wide cell counts as an operation of the installing bulkhead, and the four models
//! of class operations marked there fail (token return, protected release, usage growth,
//! abandonment). A class's tag is its version, which every change of its limits moves, its
//! ceilings too: with `LLM_BULKHEAD_LOOM_CLASS_VERSION_FLOORS_ONLY=1` (a ceiling-only change
//! leaves the version alone) `a_borrower_never_lands_past_a_lowered_class_ceiling` fails, when
//! the borrower's tag check after its class step is off as well
//! (`LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1`): that check alone also decides such a step
//! again under the lowered ceiling.
//! The class tag is as wide as the limits tag, and each class keeps its floors at every
//! version of a period (`src/words/floors.rs`), so the grace period of the limits tag is all a
//! class operation needs: with `LLM_BULKHEAD_LOOM_SHORT_FLOORS_TABLE=1` (one floors entry for
//! every version, so an install rewrites floors an operation may still read) six models of
//! class operations fail. `.ci/run` asserts that each of the six variants fails this file.
//!
//! Asserted in every interleaving:
//! * **no-class** (a decision, and the drain-time admission of a decision that found `WAITERS`
//!   up for a drainer alone): an admission made under revision 0 was made before the first
//!   install's tag bump (the installer, right after its first `apply_limits` returned, saw its
//!   slot);
//! * **class release:** the stored `U` is exact afterwards: with class `a`'s floor raised to 2,
//!   class `b` can borrow exactly 2 of the 4 slots and `a` take exactly its 2, no more;
//! * **class decision:** the same exactness after a protected admission raced the installs, and
//!   no admission beyond `max_concurrent`;
//! * **usage growth, token return, abandonment:** the stored `V` (or `U`) is exact afterwards.
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::{Admission, Bulkhead, ClassId, ClassLimits, Demand, Reservation, Usage};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Admits as many `demand`s as the bulkhead lets through (sequentially, after the race).
fn fill(b: &Bulkhead, demand: Demand) -> Vec<Admission> {
    let mut held = Vec::new();
    while let Ok(a) = b.try_acquire(demand) {
        held.push(a);
        assert!(held.len() <= 8, "no bulkhead here has 8 slots");
    }
    held
}

fn token_floor(protected_tokens: u64) -> ClassLimits {
    ClassLimits {
        protected_tokens,
        ..ClassLimits::default()
    }
}

fn floor(protected_concurrent: u32) -> ClassLimits {
    ClassLimits {
        protected_concurrent,
        ..ClassLimits::default()
    }
}

/// Two classes, `a` and `b` (the default), 4 slots, no floors yet.
fn classed(budget: Option<u64>) -> (Bulkhead, ClassId, ClassId) {
    let mut builder = Bulkhead::builder()
        .max_concurrent(4)
        .class("a", ClassLimits::default())
        .class("b", ClassLimits::default())
        .default_class("b");
    if let Some(t) = budget {
        builder = builder.token_budget(t);
    }
    let b = builder.build().unwrap();
    let (a, cb) = (b.class_id("a").unwrap(), b.class_id("b").unwrap());
    (b, a, cb)
}

/// Installs revisions 1 and 2 with class `a`'s floor at `a_floor`, each a change of `a`'s
/// limits (revision 2 adds a ceiling of 4, harmless on 4 slots): a class tag is the class's
/// version (one per change of its limits), so the second brings `a`'s one-bit class tag back
/// to the value of revision 0 and rewrites the floors entry it named.
fn install_two(b: &Bulkhead, a: ClassId, a_floor: ClassLimits) {
    for rev in 1..=2 {
        let limits = ClassLimits {
            max_concurrent: (rev == 2).then_some(4),
            ..a_floor
        };
        b.apply_limits(b.limits().with_revision(rev).with_class(a, limits))
            .unwrap();
    }
}

/// `U` is exact: `b` borrows exactly the 2 slots outside `a`'s floor of 2, `a` takes its 2.
fn assert_u_exact(b: &Bulkhead, a: ClassId, cb: ClassId) {
    let in_b = fill(b, Demand::slot().in_class(cb));
    let in_a = fill(b, Demand::slot().in_class(a));
    assert_eq!(
        (in_a.len(), in_b.len()),
        (2, 2),
        "U drifted: {:?}",
        b.stats()
    );
}

/// A no-class `try_acquire` on `b` (2 slots, one held) racing two kill-switch installs
/// (revisions 1 and 2, `max_concurrent` 0): an admission made under revision 0 was made before
/// the first install's tag bump (the installer, right after its first `apply_limits` returned,
/// saw its slot). Returns the admission, if any.
fn decide_against_two_kill_switches(b: &Bulkhead) -> Option<Admission> {
    // In flight as the installer saw it right after its first install returned.
    let seen = Arc::new(AtomicU64::new(u64::MAX));
    let installer = {
        let (b, seen) = (b.clone(), seen.clone());
        thread::spawn(move || {
            b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0))
                .unwrap();
            seen.store(b.stats().in_flight, Ordering::SeqCst);
            b.apply_limits(b.limits().with_revision(2).with_max_concurrent(0))
                .unwrap();
        })
    };
    let got = b.try_acquire(Demand::slot());
    installer.join().unwrap();
    if let Ok(a) = &got {
        assert_eq!(a.revision(), 0, "revisions 1 and 2 are kill switches");
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2,
            "admitted under revision 0 after revision 1 was installed"
        );
    }
    got.ok()
}

#[test]
fn a_no_class_decision_never_lands_on_a_wrapped_tag() {
    model(|| {
        let b = Bulkhead::new(2).unwrap();
        let held = b.try_acquire(Demand::slot()).unwrap();
        let got = decide_against_two_kill_switches(&b);
        drop((got, held));
        assert_eq!(b.stats().in_flight, 0);
    });
}

/// The drain-time admission: `WAITERS` is up for a drainer alone (nobody queued) and a slot is
/// free, so the decision admits through `admit_if_nobody_waits`, a read of the word and its
/// limits and a CAS of its own. That CAS must run inside the decision's grace-period operation
/// (CHANGELOG, Fixed): with `LLM_BULKHEAD_LOOM_DRAIN_ADMISSION_OUTSIDE_OP=1` (the broken
/// variant, the decision's operation left before it, as the code was before the fix) loom finds
/// the admission under revision 0 after revision 1 was installed.
#[test]
fn a_drain_time_admission_never_lands_on_a_wrapped_tag() {
    use std::future::Future;
    use std::task::{Context, Waker};
    model(|| {
        let b = Bulkhead::new(2).unwrap();
        let held = b.try_acquire(Demand::slot()).unwrap();
        // A drainer registered (one slot is in flight): `WAITERS` up, nobody queued.
        let mut drain = Box::pin(b.drain(None));
        assert!(drain
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let got = decide_against_two_kill_switches(&b);
        drop((got, drain, held));
        assert_eq!(b.stats().in_flight, 0);
    });
}

#[test]
fn a_class_release_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        let (b, a, cb) = classed(None);
        let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, floor(2)))
        };
        drop(held);
        installer.join().unwrap();
        assert_u_exact(&b, a, cb);
    });
}

/// The release of a protected admission (a CAS after reading the floors of its class word's
/// tag) while class `a`'s floor goes from 1 to 0. Without the grace period loom finds the CAS
/// landing on the class word brought back bit-identical, with the floor of 1 it read: it
/// subtracts nothing for a slot that the floor of 0 counts as borrowed, and `U` stays one too
/// high. (The model above releases a borrowed admission, whose release is a `fetch_add` with
/// its floors read after it; with the grace period off that model passes, because loom's
/// bounded exploration does not preempt the release between its `fetch_add` and that read,
/// even at 12 preemptions. `tests/tag_wrap.rs` stops it there deterministically, with and
/// without the grace period.)
#[test]
fn a_protected_class_release_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .class("a", floor(1))
            .class("b", ClassLimits::default())
            .default_class("b")
            .build()
            .unwrap();
        let (a, cb) = (b.class_id("a").unwrap(), b.class_id("b").unwrap());
        let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
        assert!(!held.resources().borrowed_concurrency);
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, floor(0)))
        };
        drop(held);
        installer.join().unwrap();
        // No floor left: U exact means b takes all 4 slots.
        let in_b = fill(&b, Demand::slot().in_class(cb));
        assert_eq!(in_b.len(), 4, "U drifted: {:?}", b.stats());
    });
}

#[test]
fn a_class_decision_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        let (b, a, cb) = classed(None);
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, floor(2)))
        };
        // Borrowed under the floors of revision 0 (none), or protected under revision 1 or 2.
        let got = b.try_acquire(Demand::slot().in_class(a)).unwrap();
        installer.join().unwrap();
        drop(got);
        assert_u_exact(&b, a, cb);
    });
}

#[test]
fn a_usage_growth_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        // A token floor of 4 for `a` from revision 1 on; `a` holds 2 tokens and grows to 4.
        let (b, a, cb) = classed(Some(8));
        let mut held = b
            .try_acquire(Demand::tokens(Reservation::new(1, 1).unwrap()).in_class(a))
            .unwrap();
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, token_floor(4)))
        };
        held.report_usage(Usage::new(1, 3)).unwrap();
        installer.join().unwrap();
        drop(held);
        // V exact: with a's token floor of 4 idle, b can take exactly the other 4 tokens.
        let one = Demand::tokens(Reservation::new(1, 0).unwrap()).in_class(cb);
        let in_b = fill(&b, one);
        assert_eq!(in_b.len(), 4, "V drifted: {:?}", b.stats());
    });
}

#[test]
fn an_abandonment_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        // `a` (no floor yet) holds a borrowed slot and abandons it while the floor goes to 2:
        // the class decrease must use the floors its class word is accounted under.
        let (b, a, cb) = classed(None);
        let mut held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
        assert!(held.resources().borrowed_concurrency);
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, floor(2)))
        };
        assert!(held.abandon_borrowed_concurrency());
        installer.join().unwrap();
        drop(held);
        assert_u_exact(&b, a, cb);
    });
}

#[test]
fn a_token_return_never_lands_on_a_wrapped_class_tag() {
    model(|| {
        // `a` holds 4 tokens and reconciles down to 2 (a token return) while its token floor
        // goes to 4.
        let (b, a, cb) = classed(Some(8));
        let mut held = b
            .try_acquire(Demand::tokens(Reservation::new(2, 2).unwrap()).in_class(a))
            .unwrap();
        let installer = {
            let b = b.clone();
            thread::spawn(move || install_two(&b, a, token_floor(4)))
        };
        let shrink = llm_bulkhead::Reconcile {
            remaining_output: 0,
            safety_margin: 0,
        };
        held.report_usage_reconciled(Usage::new(2, 0), shrink)
            .unwrap();
        installer.join().unwrap();
        drop(held);
        // V exact: with a's token floor of 4 idle, b borrows exactly the other 4 tokens.
        let tokens = |n| Demand::tokens(Reservation::new(n, 0).unwrap()).in_class(cb);
        let four = b.try_acquire(tokens(4)).unwrap();
        assert!(
            b.try_acquire(tokens(1)).is_err(),
            "V drifted: {:?}",
            b.stats()
        );
        drop(four);
    });
}

/// A class's version moves when any of its limits changes, its ceilings too (not only its
/// floors): a borrower of class `a` (no floor, ceiling 2, one admission held) reserves its
/// slot in the shared word, and an install lowering `a`'s ceiling to 1 races it. The borrower
/// may be admitted only before the install: if it was admitted under revision 0, the installer
/// saw its slot right after `apply_limits` returned. With
/// `LLM_BULKHEAD_LOOM_CLASS_VERSION_FLOORS_ONLY=1` (the broken variant: the ceiling-only change
/// leaves `a`'s version and word alone) and `LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1` (no tag
/// check after the borrower's class step, which alone would decide it again under the new
/// ceiling) loom finds the class step landing on the unchanged word after the install: two in
/// flight in `a` under a ceiling of 1.
#[test]
fn a_borrower_never_lands_past_a_lowered_class_ceiling() {
    model(|| {
        let ceiling = |m| ClassLimits {
            max_concurrent: Some(m),
            ..ClassLimits::default()
        };
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .class("a", ceiling(2))
            .default_class("a")
            .build()
            .unwrap();
        let a = b.class_id("a").unwrap();
        let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
        let seen = Arc::new(AtomicU64::new(u64::MAX));
        let installer = {
            let (b, seen) = (b.clone(), seen.clone());
            thread::spawn(move || {
                b.apply_limits(b.limits().with_revision(1).with_class(a, ceiling(1)))
                    .unwrap();
                seen.store(b.stats().in_flight, Ordering::SeqCst);
            })
        };
        let got = b.try_acquire(Demand::slot().in_class(a));
        installer.join().unwrap();
        if let Ok(x) = &got {
            assert_eq!(
                x.revision(),
                0,
                "revision 1 allows one slot in a, held already"
            );
            assert_eq!(
                seen.load(Ordering::SeqCst),
                2,
                "admitted under revision 0 after revision 1 was installed"
            );
        }
        drop((got, held));
        assert_eq!(b.stats().in_flight, 0);
    });
}
