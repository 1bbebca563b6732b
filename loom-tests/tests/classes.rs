//! Models the admission-class protocol (`src/protocol/classed.rs`; CONTRACT.md §2 rows 2–5, §4, §5 and
//! §10). Each class has a word `[tokens][in flight][ctag][DETACHED]`; the
//! shared word stores `U = Σ max(in_flight_j, floor_j)` and `V = Σ max(tokens_j, token_floor_j)`
//! beside the limits tag and the flags, and is kept never below the truth: increases reach it
//! before the class word, decreases after. A protected admission CASes its class word and
//! validates on a second load of the shared word; a borrower CASes the shared word (rows 4, 5)
//! and then its class word, expecting exactly the class state it classified. Releases go class
//! word first, then the shared word, inside a grace-period operation that a class-mode free
//! waits for, so that the state stays allocated until the release is done. A floor change bumps the tag with an
//! advance for every raise, then migrates each class word (deciders help).
//!
//! Models, each small (two or three threads) and each asserting its invariants in every
//! interleaving:
//!
//! 1. two borrowers of two classes race for the one shared slot (and, separately, the last
//!    shared tokens) while a third class's floor is idle, so the global word alone would admit
//!    both: at most one wins, committed borrowed capacity never exceeds the shared remainder,
//!    the idle floor stays usable, and the loser is refused with the right reason and
//!    constraint. Both refusing (each saw the other's tentative step) is allowed by CONTRACT.md
//!    §10; it is counted and printed, together with rejections whose detail shows room;
//! 2. a protected admission against a borrower of another class at the boundary: the protected
//!    one always gets in, the borrower never takes the idle floor;
//! 3. a release in one class against a borrow in another: no over-admission, per-class state
//!    exact, everything zero at the end;
//! 4. abandonment of a borrowed slot against an acquire that needs that slot (slot returned
//!    once, tokens kept until release, counters exact), and abandonment racing the drop of the
//!    last `Bulkhead` handle (checked allocator: no use after free, no double free, no leak);
//! 5. `apply_limits` raising a floor against a borrower and a release: the admission or the
//!    refusal matches the revision it carries, the per-class state afterwards is exactly what
//!    the threads hold, and borrowing stays refused while `U` exceeds the new limit.
//!
//! Four more models check that a protected admission is never refused with its floor idle
//! while a release, an abandonment or a usage-report shrink of another admission is between its
//! two words (see "Found and fixed" below).
#![cfg(loom)]

mod common;

use common::checked_alloc::{checked, Checking};
use common::{assert_quiescent, model, token_stats, tokens};
use llm_bulkhead::{
    Admission, Bulkhead, ClassId, ClassLimits, ClassStats, ClassesStats, Constraint, Demand,
    RejectReason, Rejection, Stats,
};
use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};

#[global_allocator]
static ALLOC: Checking = Checking;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A class with a concurrency floor only.
fn floor(protected_concurrent: u32) -> ClassLimits {
    ClassLimits {
        protected_concurrent,
        ..ClassLimits::default()
    }
}

/// A class with a token floor only.
fn token_floor(protected_tokens: u64) -> ClassLimits {
    ClassLimits {
        protected_tokens,
        ..ClassLimits::default()
    }
}

/// A bulkhead with the given classes (the first is the default) and their ids.
fn build<const N: usize>(
    max_concurrent: u32,
    budget: Option<u64>,
    classes: [(&str, ClassLimits); N],
) -> (Bulkhead, [ClassId; N]) {
    let mut builder = Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .default_class(classes[0].0);
    if let Some(budget) = budget {
        builder = builder.token_budget(budget);
    }
    for (name, limits) in classes {
        builder = builder.class(name, limits);
    }
    let b = builder.build().unwrap();
    let ids = classes.map(|(name, _)| b.class_id(name).unwrap());
    (b, ids)
}

fn slot(k: ClassId) -> Demand {
    Demand::slot().in_class(k)
}

fn classed_tokens(k: ClassId, input: u64, max_output: u64) -> Demand {
    tokens(input, max_output).in_class(k)
}

fn classes(s: &Stats) -> &ClassesStats {
    s.classes.as_ref().expect("the bulkhead has classes")
}

fn class(s: &Stats, k: ClassId) -> &ClassStats {
    &classes(s).classes[k.index()]
}

/// Every class and the shared remainder are back to zero, and every class's admissions are
/// released.
/// Class `k`'s `(in flight, tokens in flight)`.
fn held(s: &Stats, k: ClassId) -> (u64, u64) {
    let c = class(s, k);
    (c.in_flight, c.in_flight_tokens)
}

fn assert_classes_quiescent(b: &Bulkhead) {
    let s = b.stats();
    let cs = classes(&s);
    for c in &cs.classes {
        assert_eq!((c.in_flight, c.in_flight_tokens), (0, 0), "{s:?}");
        assert_eq!(c.admitted, c.released, "{s:?}");
    }
    assert_eq!(cs.shared.in_flight, 0, "{s:?}");
    if let Some(t) = cs.shared.token_budget {
        assert_eq!(t.in_flight_tokens, 0, "{s:?}");
    }
}

/// Outcome counts over every iteration of one model. Plain std atomics: they live outside the
/// model (loom runs all iterations on the test's OS thread) and are read after `model` returns.
struct Tally {
    iterations: AtomicUsize,
    one_won: AtomicUsize,
    both_refused: AtomicUsize,
    loser_protection: AtomicUsize,
    loser_global: AtomicUsize,
    detail_shows_room: AtomicUsize,
}

impl Tally {
    const fn new() -> Tally {
        Tally {
            iterations: AtomicUsize::new(0),
            one_won: AtomicUsize::new(0),
            both_refused: AtomicUsize::new(0),
            loser_protection: AtomicUsize::new(0),
            loser_global: AtomicUsize::new(0),
            detail_shows_room: AtomicUsize::new(0),
        }
    }

    fn bump(c: &AtomicUsize) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self, name: &str) {
        let g = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        eprintln!(
            "[classes] {name}: {} interleavings; one winner in {}, both refused (spurious, \
             CONTRACT.md §10) in {}; losers' constraint: admission_class_protection {}, global \
             {}; refusals whose class detail shows shared room for the request: {}",
            g(&self.iterations),
            g(&self.one_won),
            g(&self.both_refused),
            g(&self.loser_protection),
            g(&self.loser_global),
            g(&self.detail_shows_room),
        );
        assert!(g(&self.iterations) > 0);
        assert!(g(&self.one_won) > 0, "no interleaving admitted a racer");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Two classes race for the last shared capacity
// ---------------------------------------------------------------------------------------------

/// What one racer saw, with its class.
type Outcome = (ClassId, Result<Admission, Rejection>);

/// Runs a borrower of class `k` for `demand` on its own thread; a winner checks the state it
/// knows (`check_won`, given the stats and the admission) before handing its result back.
fn racer(
    b: &Bulkhead,
    k: ClassId,
    demand: Demand,
    check_won: fn(&Stats, ClassId, &Admission),
) -> thread::JoinHandle<Outcome> {
    let b = b.clone();
    thread::spawn(move || {
        let res = b.try_acquire(demand);
        if let Ok(a) = &res {
            assert_eq!(a.class(), Some(k));
            check_won(&b.stats(), k, a);
        }
        (k, res)
    })
}

/// Splits racer outcomes into admissions and rejections, tallying the loser constraints.
fn split(tally: &Tally, outcomes: Vec<Outcome>) -> (Vec<Outcome>, Vec<(ClassId, Rejection)>) {
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for (k, res) in outcomes {
        match res {
            Ok(a) => won.push((k, Ok(a))),
            Err(r) => {
                match r.constraint {
                    Some(Constraint::AdmissionClassProtection) => {
                        Tally::bump(&tally.loser_protection)
                    }
                    Some(Constraint::Global) => Tally::bump(&tally.loser_global),
                    other => panic!("a racer refused with constraint {other:?}: {r:?}"),
                }
                lost.push((k, r));
            }
        }
    }
    Tally::bump(&tally.iterations);
    match won.len() {
        0 => Tally::bump(&tally.both_refused),
        1 => Tally::bump(&tally.one_won),
        n => panic!("{n} racers won capacity for one"),
    }
    (won, lost)
}

/// Max 4 slots, floors a:1, b:1, c:1: the shared remainder is 1 slot. `a` and `b` each hold
/// their floor; `c`'s floor is idle, so the global word (2 of 4 used) would admit both racers:
/// only row 4 can stop the second. `a` and `b` each try one more (borrowed) slot. The second
/// racer's shared CAS fails when the first one's lands between its read and its CAS; its
/// attempt then checks row 4 again on the word it found before trying again (broken variant:
/// `LLM_BULKHEAD_LOOM_RESERVE_UNCHECKED=1`, which `.ci/run` requires this model to fail).
#[test]
fn two_classes_race_for_the_last_shared_slot() {
    static TALLY: Tally = Tally::new();
    model(|| {
        let (b, [ca, cb, cc]) = build(4, None, [("a", floor(1)), ("b", floor(1)), ("c", floor(1))]);
        let a0 = b.try_acquire(slot(ca)).unwrap();
        let b0 = b.try_acquire(slot(cb)).unwrap();
        assert!(!a0.resources().borrowed_concurrency && !b0.resources().borrowed_concurrency);

        let check_won: fn(&Stats, ClassId, &Admission) = |s, k, a| {
            // The winner holds the only shared slot: two floors and itself are in, and the
            // other racer can never commit (nobody releases during the race).
            assert!(a.resources().borrowed_concurrency);
            let cs = classes(s);
            assert_eq!(s.in_flight, 3, "{s:?}");
            assert_eq!(cs.shared.in_flight, 1, "{s:?}");
            assert!(cs.shared.in_flight <= cs.shared.max_concurrent, "{s:?}");
            assert_eq!(cs.classes[k.index()].in_flight, 2, "{s:?}");
            // The other racer's class: its floor admission, perhaps plus a tentative step.
            let other = 1 - k.index();
            assert!(matches!(cs.classes[other].in_flight, 1 | 2), "{s:?}");
            assert_eq!(cs.classes[2].in_flight, 0, "{s:?}");
        };
        let ta = racer(&b, ca, slot(ca), check_won);
        let tb = racer(&b, cb, slot(cb), check_won);
        let outcomes = vec![ta.join().unwrap(), tb.join().unwrap()];
        let (won, lost) = split(&TALLY, outcomes);
        let w = won.len() as u64;

        for (k, r) in &lost {
            assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
            assert_eq!(r.revision, 0);
            let detail = r.detail();
            let d = detail
                .classes
                .as_ref()
                .expect("a class refusal has class detail");
            assert_eq!(d.class.id, b.class_names()[k.index()]);
            // Its own tentative slot is undone before the detail is collected: only its floor
            // admission is left in its class.
            assert_eq!(
                (d.class.in_flight, d.class.borrowed_concurrent),
                (1, 0),
                "{r:?}"
            );
            assert_eq!(d.shared.concurrency.capacity, 1, "{r:?}");
            assert_eq!(d.shared.concurrency.requested_borrowed, 1, "{r:?}");
            if w == 1 && d.shared.concurrency.available >= 1 {
                // The winner holds the shared slot, yet the detail shows it free (its global
                // part is the word loaded before the winner committed). Counted, not asserted.
                Tally::bump(&TALLY.detail_shows_room);
            }
        }

        // Committed state after the race, from the stats.
        let s = b.stats();
        let cs = classes(&s);
        assert_eq!(s.in_flight, 2 + w, "{s:?}");
        assert_eq!(cs.shared.in_flight, w, "{s:?}");
        assert!(cs.shared.in_flight <= cs.shared.max_concurrent, "{s:?}");
        for k in [ca, cb] {
            let won_k = won.iter().filter(|(j, _)| *j == k).count() as u64;
            let lost_k = lost.iter().filter(|(j, _)| *j == k).count() as u64;
            let c = &cs.classes[k.index()];
            assert_eq!(c.in_flight, 1 + won_k, "{s:?}");
            assert_eq!(
                (c.admitted, c.total_borrowed_admissions),
                (1 + won_k, won_k)
            );
            assert_eq!(c.rejected_by_reason.concurrency_limit, lost_k, "{s:?}");
        }
        assert_eq!(cs.classes[cc.index()].in_flight, 0, "{s:?}");

        // The idle floor was never lent: class c still gets its protected slot.
        let c0 = b
            .try_acquire(slot(cc))
            .expect("c's floor must survive the race");
        assert!(!c0.resources().borrowed_concurrency);
        // After a double refusal the shared slot is free: alone, a borrower fits.
        let retry = (w == 0).then(|| {
            let a = b
                .try_acquire(slot(ca))
                .expect("the shared slot is free after a double refusal");
            assert!(a.resources().borrowed_concurrency);
            a
        });
        let admitted = 3 + w + u64::from(retry.is_some());
        drop((won, retry, c0, a0, b0));
        assert_quiescent(&b, admitted, lost.len() as u64);
        assert_classes_quiescent(&b);
    });
    TALLY.report("two_classes_race_for_the_last_shared_slot");
}

/// The token twin of the previous model (row 5). Budget 12, token floors a:3, b:3, c:4: the
/// shared remainder is 2 tokens. `a` and `b` each hold 3 tokens (their floors); `c`'s floor is
/// idle, so the global word (6 of 12 held) would admit both racers; each asks 2 borrowed
/// tokens. No concurrency floor exists, so only `V` can refuse.
#[test]
fn two_classes_race_for_the_last_shared_tokens() {
    static TALLY: Tally = Tally::new();
    model(|| {
        let (b, [ca, cb, cc]) = build(
            4,
            Some(12),
            [
                ("a", token_floor(3)),
                ("b", token_floor(3)),
                ("c", token_floor(4)),
            ],
        );
        let a0 = b.try_acquire(classed_tokens(ca, 2, 1)).unwrap();
        let b0 = b.try_acquire(classed_tokens(cb, 2, 1)).unwrap();
        assert_eq!(a0.resources().borrowed_tokens, 0);
        assert_eq!(b0.resources().borrowed_tokens, 0);

        let check_won: fn(&Stats, ClassId, &Admission) = |s, k, a| {
            assert_eq!(a.resources().borrowed_tokens, 2);
            let cs = classes(s);
            let shared = cs.shared.token_budget.unwrap();
            assert_eq!(token_stats(s).in_flight_tokens, 8, "{s:?}");
            assert_eq!((shared.budget, shared.in_flight_tokens), (2, 2), "{s:?}");
            assert_eq!(cs.classes[k.index()].in_flight_tokens, 5, "{s:?}");
            let other = 1 - k.index();
            assert!(matches!(cs.classes[other].in_flight_tokens, 3 | 5), "{s:?}");
            assert_eq!(cs.classes[2].in_flight_tokens, 0, "{s:?}");
        };
        let ta = racer(&b, ca, classed_tokens(ca, 1, 1), check_won);
        let tb = racer(&b, cb, classed_tokens(cb, 1, 1), check_won);
        let outcomes = vec![ta.join().unwrap(), tb.join().unwrap()];
        let (won, lost) = split(&TALLY, outcomes);
        let w = won.len() as u64;

        for (k, r) in &lost {
            assert_eq!(r.reason, RejectReason::BudgetLimit, "{r:?}");
            let detail = r.detail();
            let d = detail
                .classes
                .as_ref()
                .expect("a class refusal has class detail");
            assert_eq!(d.class.id, b.class_names()[k.index()]);
            let ct = d.class.token_budget.unwrap();
            assert_eq!((ct.in_flight_tokens, ct.requested), (3, 2), "{r:?}");
            let st = d.shared.token_budget.unwrap();
            assert_eq!((st.capacity, st.requested_borrowed), (2, 2), "{r:?}");
            if w == 1 && st.available >= st.requested_borrowed {
                Tally::bump(&TALLY.detail_shows_room);
            }
        }

        let s = b.stats();
        let cs = classes(&s);
        let shared = cs.shared.token_budget.unwrap();
        assert_eq!(token_stats(&s).in_flight_tokens, 6 + 2 * w, "{s:?}");
        assert_eq!(shared.in_flight_tokens, 2 * w, "{s:?}");
        assert!(shared.in_flight_tokens <= shared.budget, "{s:?}");
        for k in [ca, cb] {
            let won_k = won.iter().filter(|(j, _)| *j == k).count() as u64;
            let lost_k = lost.iter().filter(|(j, _)| *j == k).count() as u64;
            let c = &cs.classes[k.index()];
            assert_eq!(c.in_flight_tokens, 3 + 2 * won_k, "{s:?}");
            assert_eq!(c.total_borrowed_tokens_reserved, 2 * won_k, "{s:?}");
            assert_eq!(c.rejected_by_reason.budget_limit, lost_k, "{s:?}");
        }

        // c's token floor was never lent.
        let c0 = b
            .try_acquire(classed_tokens(cc, 2, 2))
            .expect("c's token floor must survive the race");
        assert_eq!(c0.resources().borrowed_tokens, 0);
        let retry = (w == 0).then(|| {
            b.try_acquire(classed_tokens(ca, 1, 1))
                .expect("the shared tokens are free after a double refusal")
        });
        let admitted = 3 + w + u64::from(retry.is_some());
        drop((won, retry, c0, a0, b0));
        assert_quiescent(&b, admitted, lost.len() as u64);
        assert_classes_quiescent(&b);
    });
    TALLY.report("two_classes_race_for_the_last_shared_tokens");
}

// ---------------------------------------------------------------------------------------------
// 2. A protected admission against a borrower at the boundary
// ---------------------------------------------------------------------------------------------

/// Max 2, class p has floor 1, class b none: the shared remainder is 1 slot. One thread
/// admits into p's floor; the other borrows the shared slot, then tries a second borrow. The
/// second borrow is at the boundary: before p commits, the global word has a free slot for it,
/// and only p's (idle or tentative) floor refuses it.
#[test]
fn protected_admission_against_a_borrower_at_the_boundary() {
    model(|| {
        let (b, [cp, cb]) = build(2, None, [("p", floor(1)), ("b", floor(0))]);
        let protected = {
            let b = b.clone();
            thread::spawn(move || {
                let a = b
                    .try_acquire(slot(cp))
                    .expect("inside its floor with a global slot free: never refused");
                assert!(!a.resources().borrowed_concurrency);
                a
            })
        };
        let borrower = {
            let b = b.clone();
            thread::spawn(move || {
                let first = b
                    .try_acquire(slot(cb))
                    .expect("the shared slot is free for the first borrow");
                assert!(first.resources().borrowed_concurrency);
                let r = b
                    .try_acquire(slot(cb))
                    .expect_err("a second borrow would take p's floor");
                assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
                assert_eq!(
                    r.constraint,
                    Some(Constraint::AdmissionClassProtection),
                    "{r:?}"
                );
                let detail = r.detail();
                let d = detail.classes.as_ref().unwrap();
                assert_eq!((d.class.id.as_str(), d.class.in_flight), ("b", 1), "{r:?}");
                assert_eq!(d.shared.concurrency.capacity, 1, "{r:?}");
                first
            })
        };
        let p = protected.join().unwrap();
        let first = borrower.join().unwrap();

        let s = b.stats();
        let cs = classes(&s);
        assert_eq!(s.in_flight, 2, "{s:?}");
        assert_eq!(
            (class(&s, cp).in_flight, class(&s, cb).in_flight),
            (1, 1),
            "{s:?}"
        );
        assert_eq!(cs.shared.in_flight, 1, "{s:?}");
        assert_eq!(class(&s, cb).rejected_by_reason.concurrency_limit, 1);
        drop((p, first));
        assert_quiescent(&b, 2, 1);
        assert_classes_quiescent(&b);
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A release in one class against a borrow in another
// ---------------------------------------------------------------------------------------------

/// Max 2, budget 10, class p has floor 1, class b none. `p0` holds p's floor and `b0` holds
/// the shared slot (2 tokens each). One thread releases `b0`; the other borrows for p (p is at
/// its floor), which fits only once the release is seen in both words.
#[test]
fn release_in_one_class_against_a_borrow_in_another() {
    model(|| {
        let (b, [cp, cb]) = build(2, Some(10), [("p", floor(1)), ("b", floor(0))]);
        let p0 = b.try_acquire(classed_tokens(cp, 1, 1)).unwrap();
        let b0 = b.try_acquire(classed_tokens(cb, 1, 1)).unwrap();
        let releaser = thread::spawn(move || {
            let rel = b0.release(None).unwrap();
            assert_eq!(rel.held, 2);
        });
        let borrower = {
            let b = b.clone();
            thread::spawn(move || match b.try_acquire(classed_tokens(cp, 1, 1)) {
                Ok(a) => {
                    assert!(a.resources().borrowed_concurrency);
                    // b0 is gone from both words (the global word had no slot otherwise), and
                    // p0 and this admission are all that is left.
                    let s = b.stats();
                    let cs = classes(&s);
                    assert_eq!(s.in_flight, 2, "{s:?}");
                    assert_eq!(token_stats(&s).in_flight_tokens, 4, "{s:?}");
                    assert_eq!(cs.classes[cp.index()].in_flight, 2, "{s:?}");
                    assert_eq!(cs.classes[cb.index()].in_flight, 0, "{s:?}");
                    assert_eq!(cs.shared.in_flight, 1, "{s:?}");
                    Ok(a)
                }
                Err(r) => {
                    assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
                    assert!(
                        matches!(
                            r.constraint,
                            Some(Constraint::AdmissionClassProtection | Constraint::Global)
                        ),
                        "{r:?}"
                    );
                    Err(r)
                }
            })
        };
        releaser.join().unwrap();
        let res = borrower.join().unwrap();
        let w = u64::from(res.is_ok());

        let s = b.stats();
        let cs = classes(&s);
        assert_eq!(s.in_flight, 1 + w, "{s:?}");
        assert_eq!(token_stats(&s).in_flight_tokens, 2 + 2 * w, "{s:?}");
        assert_eq!(held(&s, cp), (1 + w, 2 + 2 * w), "{s:?}");
        assert_eq!(held(&s, cb), (0, 0), "{s:?}");
        assert_eq!(cs.shared.in_flight, w, "{s:?}");
        assert_eq!(class(&s, cb).released, 1, "{s:?}");
        drop(res);
        drop(p0);
        assert_quiescent(&b, 2 + w, 1 - w);
        assert_classes_quiescent(&b);
    });
}

// ---------------------------------------------------------------------------------------------
// 4. Abandonment
// ---------------------------------------------------------------------------------------------

/// Max 2, budget 10, class p has floor 1, class b none. `p0` holds p's floor (2 tokens) and `a`
/// the shared slot (4 tokens). One thread abandons `a`'s borrowed slot, checks that its tokens
/// are still held, then releases it; the other borrows for b, which fits only once the
/// abandoned slot is back in both words.
#[test]
fn abandonment_against_an_acquire_that_needs_the_slot() {
    model(|| {
        let (b, [cp, cb]) = build(2, Some(10), [("p", floor(1)), ("b", floor(0))]);
        let p0 = b.try_acquire(classed_tokens(cp, 1, 1)).unwrap();
        let mut a = b.try_acquire(classed_tokens(cb, 2, 2)).unwrap();
        assert!(a.resources().borrowed_concurrency);

        let abandoner = {
            let b = b.clone();
            thread::spawn(move || {
                assert!(a.abandon_borrowed_concurrency());
                assert!(!a.abandon_borrowed_concurrency(), "idempotent");
                assert_eq!(a.held(), 4, "the hold stays until release");
                let s = b.stats();
                // p0 and a's tokens are held whatever the acquirer did; a is still an
                // admission in flight although its slot is back.
                assert!(token_stats(&s).in_flight_tokens >= 6, "{s:?}");
                assert!(s.admissions_in_flight >= 2, "{s:?}");
                assert_eq!(s.borrowed_concurrency_abandoned, 1, "{s:?}");
                assert_eq!(class(&s, cb).borrowed_concurrency_abandoned, 1, "{s:?}");
                let rel = a.release(None).unwrap();
                assert_eq!(rel.held, 4);
            })
        };
        let acquirer = {
            let b = b.clone();
            thread::spawn(move || match b.try_acquire(classed_tokens(cb, 1, 1)) {
                Ok(x) => {
                    assert!(x.resources().borrowed_concurrency);
                    Some(x)
                }
                Err(r) => {
                    // Before the abandonment (or between its two words).
                    assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
                    assert!(
                        matches!(
                            r.constraint,
                            Some(Constraint::AdmissionClassProtection | Constraint::Global)
                        ),
                        "{r:?}"
                    );
                    None
                }
            })
        };
        abandoner.join().unwrap();
        let x = acquirer.join().unwrap();
        let w = u64::from(x.is_some());

        // a is released; p0 and maybe x remain. The slot went back exactly once: a second
        // return would show up as a missing slot here (or an underflow of the word).
        let s = b.stats();
        assert_eq!(s.in_flight, 1 + w, "{s:?}");
        assert_eq!(s.admissions_in_flight, 1 + w, "{s:?}");
        assert_eq!(s.admitted, 2 + w, "{s:?}");
        assert_eq!(s.borrowed_concurrency_abandoned, 1, "{s:?}");
        assert_eq!(token_stats(&s).in_flight_tokens, 2 + 2 * w, "{s:?}");
        assert_eq!(held(&s, cb), (w, 2 * w), "{s:?}");
        assert_eq!(
            (
                class(&s, cb).released,
                class(&s, cb).borrowed_concurrency_abandoned
            ),
            (1, 1),
            "{s:?}"
        );
        assert_eq!(class(&s, cp).in_flight, 1, "{s:?}");
        drop((x, p0));
        assert_quiescent(&b, 2 + w, 1 - w);
        assert_classes_quiescent(&b);
    });
}

/// The abandoning admission runs on another thread while the last `Bulkhead` handle is
/// dropped: either the pin is taken first (the slot goes back, the pin keeps the state alive
/// until release) or the handle count is already zero (the slot is kept until release). Run
/// under the checking allocator: the shared block and the class-word slice are each freed
/// exactly once, after every use.
#[test]
fn abandonment_while_the_last_handle_drops() {
    model(|| {
        checked(2, || {
            let (b, [cb]) = build(1, Some(10), [("b", floor(0))]);
            let mut a = b.try_acquire(classed_tokens(cb, 2, 2)).unwrap();
            let t = thread::spawn(move || {
                assert!(a.abandon_borrowed_concurrency());
                assert_eq!(a.held(), 4);
                let rel = a.release(None).unwrap();
                assert_eq!(rel.held, 4);
            });
            drop(b);
            t.join().unwrap();
        });
    });
}

/// As above, with a second admission settled by the main thread after the last handle is
/// gone: the free must wait for whichever of the pin, the abandoned admission's kept slot and
/// the other admission's slot goes last.
#[test]
fn abandonment_while_the_last_handle_and_another_admission_go() {
    model(|| {
        checked(2, || {
            let (b, [cb]) = build(2, Some(10), [("b", floor(0))]);
            let mut a = b.try_acquire(classed_tokens(cb, 2, 2)).unwrap();
            let other = b.try_acquire(classed_tokens(cb, 1, 1)).unwrap();
            let t = thread::spawn(move || {
                assert!(a.abandon_borrowed_concurrency());
                drop(a);
            });
            drop(b);
            drop(other);
            t.join().unwrap();
        });
    });
}

// ---------------------------------------------------------------------------------------------
// 5. apply_limits raising a floor
// ---------------------------------------------------------------------------------------------

/// Max 4, budget 20, class a has no floor, class b floor 1. `a0` and `a1` borrow two shared
/// slots, `b1` holds b's floor (2 tokens each): `U = 3`. Concurrently: revision 1 raises b's
/// floor to 3, a borrower for a tries a third slot, and the main thread releases `a1`.
/// Under revision 0 the borrow always fits (`U + 1 ≤ 4`); under revision 1 it never does
/// (`U ≥ 1 + 3` before it counts itself).
#[test]
fn apply_limits_raising_a_floor_against_a_borrow_and_a_release() {
    model(|| {
        let (b, [ca, cb]) = build(4, Some(20), [("a", floor(0)), ("b", floor(1))]);
        let a0 = b.try_acquire(classed_tokens(ca, 1, 1)).unwrap();
        let a1 = b.try_acquire(classed_tokens(ca, 1, 1)).unwrap();
        let b1 = b.try_acquire(classed_tokens(cb, 1, 1)).unwrap();
        let raised = b.limits().with_revision(1).with_class(cb, floor(3));
        let installed = Arc::new(AtomicBool::new(false));

        let applier = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                let change = b.apply_limits(raised).unwrap();
                assert_eq!(change.previous.revision, 0);
                installed.store(true, loom::sync::atomic::Ordering::SeqCst);
            })
        };
        let borrower = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                let after_install = installed.load(loom::sync::atomic::Ordering::SeqCst);
                match b.try_acquire(classed_tokens(ca, 1, 1)) {
                    Ok(a2) => {
                        assert_eq!(a2.revision(), 0, "revision 1 never admits this borrow");
                        assert!(!after_install, "admitted under a replaced snapshot");
                        assert!(a2.resources().borrowed_concurrency);
                        Some(a2)
                    }
                    Err(r) => {
                        assert_eq!(r.revision, 1, "revision 0 never refuses this: {r:?}");
                        assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
                        assert_eq!(
                            r.constraint,
                            Some(Constraint::AdmissionClassProtection),
                            "{r:?}"
                        );
                        None
                    }
                }
            })
        };
        drop(a1);
        applier.join().unwrap();
        let a2 = borrower.join().unwrap();
        let w = u64::from(a2.is_some());

        // Per class, exactly what the threads hold: a0 (+ a2) in a, b1 in b.
        let s = b.stats();
        assert_eq!(s.limits.revision, 1);
        assert_eq!(s.limits.classes.get(cb), Some(&floor(3)));
        assert_eq!(s.in_flight, 2 + w, "{s:?}");
        assert_eq!(token_stats(&s).in_flight_tokens, 4 + 2 * w, "{s:?}");
        assert_eq!(held(&s, ca), (1 + w, 2 + 2 * w), "{s:?}");
        assert_eq!(held(&s, cb), (1, 2), "{s:?}");
        assert_eq!(classes(&s).shared.max_concurrent, 1, "{s:?}");

        // U = (1 + w) + 3 ≥ 4: no more borrowing under revision 1 (with w = 1, U = 5 exceeds the
        // limit: raising a floor revoked nothing).
        let r = b
            .try_acquire(classed_tokens(ca, 1, 1))
            .expect_err("U + 1 > max_concurrent");
        assert_eq!(
            (r.reason, r.constraint, r.revision),
            (
                RejectReason::ConcurrencyLimit,
                Some(Constraint::AdmissionClassProtection),
                1
            ),
            "{r:?}"
        );
        // The raised floor is usable at once, whatever U is.
        let b2 = b
            .try_acquire(classed_tokens(cb, 1, 1))
            .expect("b is inside its raised floor and a global slot is free");
        assert!(!b2.resources().borrowed_concurrency);
        drop(b2);
        // Borrowing resumes once completions bring U back: with a empty, U = 3.
        drop((a2, a0));
        let a3 = b
            .try_acquire(classed_tokens(ca, 1, 1))
            .expect("U + 1 = 4 fits again");
        assert_eq!(a3.revision(), 1);
        drop((a3, b1));
        assert_quiescent(&b, 5 + w, 2 - w);
        assert_classes_quiescent(&b);
    });
}

// ---------------------------------------------------------------------------------------------
// Found and fixed (under the earlier, collect-based protocol): a floor lent while a return of
// capacity is between its two words
// ---------------------------------------------------------------------------------------------
//
// The first class protocol stored no U/V: a borrower collected every class word. A release
// decremented the class word, then the global word; a borrower collecting in between computed
// `U` without the returning slot and committed while the global word still counted it, and a
// protected admission of another class was then refused with its floor idle. loom found it
// (`LOOM_LOG=trace`). In the current protocol a release's decrease reaches the stored `U`/`V`
// after its class word, so a borrower in that window sees the slot still counted and is
// refused instead (the release has not happened yet in the linear order), while a protected
// admission needs no global slot count at all (`G ≤ U`). The four models below failed under
// the first protocol and guard against the hazard coming back.

/// Max 2, class p has floor 1, class b none; `b0` holds the one shared slot. One thread
/// releases `b0`, another borrows for b, the main thread admits into p's idle floor.
/// Sequentially p always gets in (its floor is idle and `U ≤ 2` leaves it a global slot).
#[test]
fn protected_admission_against_a_release_and_a_borrow() {
    model(|| {
        let (b, [cp, cb]) = build(2, None, [("p", floor(1)), ("b", floor(0))]);
        let b0 = b.try_acquire(slot(cb)).unwrap();
        let releaser = thread::spawn(move || drop(b0));
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(slot(cb)).ok())
        };
        let p = b.try_acquire(slot(cp));
        releaser.join().unwrap();
        let x = borrower.join().unwrap();
        let p = p.unwrap_or_else(|r| {
            panic!(
                "protected admission refused with its floor idle (borrower admitted: {}): {r:?}",
                x.is_some()
            )
        });
        assert!(!p.resources().borrowed_concurrency);
        drop((p, x));
        assert_classes_quiescent(&b);
    });
}

/// The abandonment twin: `b0` abandons its borrowed slot (class word, then global word) while
/// a borrower for b and a protected admission for p race.
#[test]
fn protected_admission_against_an_abandonment_and_a_borrow() {
    model(|| {
        let (b, [cp, cb]) = build(2, None, [("p", floor(1)), ("b", floor(0))]);
        let mut b0 = b.try_acquire(slot(cb)).unwrap();
        let abandoner = thread::spawn(move || {
            assert!(b0.abandon_borrowed_concurrency());
            b0
        });
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(slot(cb)).ok())
        };
        let p = b.try_acquire(slot(cp));
        let b0 = abandoner.join().unwrap();
        let x = borrower.join().unwrap();
        let p = p.unwrap_or_else(|r| {
            panic!(
                "protected admission refused with its floor idle (borrower admitted: {}): {r:?}",
                x.is_some()
            )
        });
        drop((p, x, b0));
        assert_classes_quiescent(&b);
    });
}

/// The token twin: budget 4, class p has token floor 2, class b none; `b0` holds the 2 shared
/// tokens. Its release returns class tokens, then global tokens; a borrower for b computes
/// `V = 2 + 2 ≤ 4` in between and commits (`T = 4`), and p's 2 tokens inside its floor are
/// refused by row 1 (`T + 2 > 4`, constraint `global`).
#[test]
fn protected_tokens_against_a_release_and_a_borrow() {
    model(|| {
        let (b, [cp, cb]) = build(3, Some(4), [("p", token_floor(2)), ("b", token_floor(0))]);
        let b0 = b.try_acquire(classed_tokens(cb, 1, 1)).unwrap();
        let releaser = thread::spawn(move || drop(b0));
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(classed_tokens(cb, 1, 1)).ok())
        };
        let p = b.try_acquire(classed_tokens(cp, 1, 1));
        releaser.join().unwrap();
        let x = borrower.join().unwrap();
        let p = p.unwrap_or_else(|r| {
            panic!(
                "tokens inside an idle token floor refused (borrower admitted: {}): {r:?}",
                x.is_some()
            )
        });
        assert_eq!(p.resources().borrowed_tokens, 0);
        drop((p, x));
        assert_classes_quiescent(&b);
    });
}

/// The usage-report twin: a shrinking report returns class tokens, then global tokens. Budget
/// 6, class p has token floor 2, class b none; `b0` holds 4 shared tokens and reports usage that
/// shrinks its hold to 2, while a borrower for b asks 2 and p asks 2 inside its floor.
/// Sequentially p always fits (`T ≤ 4` before it whatever the order).
#[test]
fn protected_tokens_against_a_shrinking_report_and_a_borrow() {
    model(|| {
        let (b, [cp, cb]) = build(3, Some(6), [("p", token_floor(2)), ("b", token_floor(0))]);
        let mut b0 = b.try_acquire(classed_tokens(cb, 2, 2)).unwrap();
        let reporter = thread::spawn(move || {
            let rep = b0.report_usage(llm_bulkhead::Usage::new(0, 0)).unwrap();
            assert_eq!(rep.held, 2);
            b0
        });
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(classed_tokens(cb, 1, 1)).ok())
        };
        let p = b.try_acquire(classed_tokens(cp, 1, 1));
        let b0 = reporter.join().unwrap();
        let x = borrower.join().unwrap();
        let p = p.unwrap_or_else(|r| {
            panic!(
                "tokens inside an idle token floor refused (borrower admitted: {}): {r:?}",
                x.is_some()
            )
        });
        drop((p, x, b0));
        assert_classes_quiescent(&b);
    });
}

// ---------------------------------------------------------------------------------------------
// The shared word's lifetime and reconfiguration steps (`src/protocol/classed.rs`)
// ---------------------------------------------------------------------------------------------

/// A borrowed release has a decrease for the shared word after its class step; what keeps the
/// state allocated meanwhile is its grace-period operation, which a class-mode free waits for
/// (`crate::grace::wait_for_operations`). Here it races the drop of the last handle and a
/// protected release of another class: the state is freed exactly once, after both releases
/// finished with it (checked allocator). With the free's wait left out
/// (`LLM_BULKHEAD_LOOM_FREE_UNGUARDED=1`, the broken variant `.ci/run` requires this model to
/// fail on) the free races the release's shared-word update, which then reads freed memory.
#[test]
fn borrowed_release_while_the_last_handle_drops() {
    model(|| {
        checked(2, || {
            let (b, [ca, cb]) = build(3, Some(10), [("a", floor(1)), ("b", floor(0))]);
            let borrowed = b.try_acquire(classed_tokens(cb, 2, 2)).unwrap();
            let protected = b.try_acquire(classed_tokens(ca, 1, 1)).unwrap();
            assert!(borrowed.resources().borrowed_concurrency);
            assert!(!protected.resources().borrowed_concurrency);
            let t = thread::spawn(move || {
                let rel = borrowed.release(None).unwrap();
                assert_eq!(rel.held, 4);
            });
            drop(b);
            drop(protected);
            t.join().unwrap();
        });
    });
}

/// `apply_limits` lowers class a's floor (2 → 1) while a protected admission of a and a
/// borrower of b decide. Max 3; `b0` already borrows. Under revision 0 the shared remainder is
/// 1 and taken (`U = 2 + 1`), so the borrower is refused; under revision 1 it is 2 and the
/// borrower fits (`U = max(n_a, 1) + 1 ≤ 2` before it). The protected admission fits under
/// both. Afterwards the stored `U` must be exact: with everything released, exactly two
/// borrowers of b fit, and a third is refused for protection.
///
/// One outcome is a documented imprecision (CONTRACT.md §10): while `apply_limits` is still
/// running, between a class's migration CAS and the decrease that follows it, the stored `U`
/// is one too high, and a borrower deciding under revision 1 in that window is refused. Once
/// `apply_limits` has returned that cannot happen; the model asserts exactly that and counts
/// the windowed refusals.
#[test]
fn apply_limits_lowering_a_floor_against_a_protected_admission_and_a_borrow() {
    static WINDOWED: AtomicUsize = AtomicUsize::new(0);
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    model(|| {
        RUNS.fetch_add(1, Ordering::Relaxed);
        let (b, [ca, cb]) = build(3, None, [("a", floor(2)), ("b", floor(0))]);
        let b0 = b.try_acquire(slot(cb)).unwrap();
        let lowered = b.limits().with_revision(1).with_class(ca, floor(1));
        let installed = Arc::new(AtomicBool::new(false));
        let applier = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                b.apply_limits(lowered).unwrap();
                installed.store(true, loom::sync::atomic::Ordering::SeqCst);
            })
        };
        let borrower = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                let after_install = installed.load(loom::sync::atomic::Ordering::SeqCst);
                match b.try_acquire(slot(cb)) {
                    Ok(x) => {
                        assert_eq!(x.revision(), 1, "revision 0 has no shared slot left");
                        assert!(x.resources().borrowed_concurrency);
                        Some(x)
                    }
                    Err(r) => {
                        assert_eq!(
                            (r.reason, r.constraint),
                            (
                                RejectReason::ConcurrencyLimit,
                                Some(Constraint::AdmissionClassProtection)
                            ),
                            "{r:?}"
                        );
                        if r.revision == 1 {
                            assert!(!after_install, "refused after apply_limits returned: {r:?}");
                            WINDOWED.fetch_add(1, Ordering::Relaxed);
                        }
                        None
                    }
                }
            })
        };
        let a0 = b
            .try_acquire(slot(ca))
            .expect("a's floor is idle under both revisions");
        assert!(!a0.resources().borrowed_concurrency);
        applier.join().unwrap();
        let x = borrower.join().unwrap();
        let w = u64::from(x.is_some());
        let s = b.stats();
        assert_eq!(s.in_flight, 2 + w, "{s:?}");
        assert_eq!(class(&s, cb).in_flight, 1 + w, "{s:?}");
        drop((a0, b0, x));
        // Exactness of the stored U after the migration: shared remainder 3 − 1 = 2.
        let y0 = b.try_acquire(slot(cb)).expect("first shared slot");
        let y1 = b.try_acquire(slot(cb)).expect("second shared slot");
        let r = b
            .try_acquire(slot(cb))
            .expect_err("the shared remainder is 2");
        assert_eq!(
            (r.reason, r.constraint),
            (
                RejectReason::ConcurrencyLimit,
                Some(Constraint::AdmissionClassProtection)
            ),
            "{r:?}"
        );
        drop((y0, y1));
        assert_quiescent(&b, 4 + w, 2 - w);
        assert_classes_quiescent(&b);
    });
    println!(
        "[classes] lowering a floor: {} interleavings; borrower refused under revision 1 while apply_limits was still migrating (CONTRACT.md §10): {}",
        RUNS.load(Ordering::Relaxed),
        WINDOWED.load(Ordering::Relaxed)
    );
}

/// A protected admission (inside its class's idle floor) against `close()`: its class CAS can
/// land after the close, so its final load of the shared word must see the flag. Whatever the
/// interleaving, an admission that started after `close()` returned is refused with
/// `shutdown`, and one admitted is admitted under an open bulkhead (its slot is counted, and
/// everything returns to zero).
#[test]
fn protected_admission_against_close() {
    model(|| {
        let (b, [cp, _cq]) = build(2, None, [("p", floor(1)), ("q", floor(0))]);
        let closed = Arc::new(AtomicBool::new(false));
        let closer = {
            let b = b.clone();
            let closed = closed.clone();
            thread::spawn(move || {
                b.close();
                closed.store(true, loom::sync::atomic::Ordering::SeqCst);
                // An admission decided before close took effect is visible by now.
                b.stats().in_flight
            })
        };
        let after_close = closed.load(loom::sync::atomic::Ordering::SeqCst);
        let outcome = b.try_acquire(slot(cp));
        match &outcome {
            Ok(a) => {
                assert!(!after_close, "admitted after close() returned");
                assert!(!a.resources().borrowed_concurrency);
            }
            Err(r) => assert_eq!(r.reason, RejectReason::Shutdown, "{r:?}"),
        }
        let seen_after_close = closer.join().unwrap();
        if outcome.is_ok() {
            assert_eq!(
                seen_after_close, 1,
                "admitted by a step after close() returned"
            );
        }
        assert!(b.try_acquire(slot(cp)).is_err());
        let admitted = u64::from(outcome.is_ok());
        drop(outcome);
        assert_quiescent(&b, admitted, 2 - admitted);
        assert_classes_quiescent(&b);
    });
}

/// A borrower of tokens only (class `c`: its slot inside `c`'s floor of one, its 50 tokens
/// beyond `c`'s token floor of none) against an install that gives class `a` a floor of one
/// slot, followed by a protected demand of `a`, which the stored `U` (past `max_concurrent`
/// once the floor is raised) sends to the collect-checked path. `b` holds the other slot.
/// Whatever the interleaving, at most two admissions are held: a borrower whose class step
/// lands after the install (its reservation before it) must decide again, since the
/// collect-checked path's collect may not have seen its slot, which the stored word does not
/// reserve (`src/protocol/classed/moved.rs`, "A borrower's step"). Fails with
/// `LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1`, which admits such a step unchecked, and with
/// `LLM_BULKHEAD_LOOM_NO_ANNOUNCE=1`, whose install moves the tag without announcing it. A
/// borrower whose class step came before the install's CAS of the tag stands (the install
/// sets every class word's `EPOCH` in between): the model fails with
/// `LLM_BULKHEAD_LOOM_NO_EPOCH_FLIP=1`, whose install leaves the words alone, and with
/// `LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH=1`, whose borrower, retrying its class CAS on a
/// word the install already marked, reports the word it classified instead.
#[test]
fn a_borrower_overtaken_by_a_floor_raise() {
    overtaken_by_a_floor_raise(false);
}

/// The same race with the protected demand on a third thread, concurrent with the install:
/// it may decide between the install's CAS of the tag and `apply_limits`' return. The
/// borrower, whose tokens are all borrowed, learns of the install from the tag the install
/// announces before its CAS (`Shared::announced`). Fails with
/// `LLM_BULKHEAD_LOOM_NO_ANNOUNCE=1` (the tag moves unannounced) and with
/// `LLM_BULKHEAD_LOOM_BORROW_UNVALIDATED=1`, `LLM_BULKHEAD_LOOM_NO_EPOCH_FLIP=1` and
/// `LLM_BULKHEAD_LOOM_MOVED_IGNORES_EPOCH=1`, as the model above does. (Announcing after the
/// CAS is unsound too, when the demand decides between the CAS and the announcement; with
/// three preemptions loom did not reach that window.)
#[test]
fn a_borrower_overtaken_while_the_install_is_in_progress() {
    overtaken_by_a_floor_raise(true);
}

/// The two models above: the protected demand after `apply_limits` returned, or
/// (`concurrent`) on a third thread while it runs.
fn overtaken_by_a_floor_raise(concurrent: bool) {
    model(move || {
        let (b, [cb, ca, cc]) = build(
            2,
            Some(100),
            [("b", floor(0)), ("a", floor(0)), ("c", floor(1))],
        );
        let held = b.try_acquire(slot(cb)).unwrap();
        let raised = b.limits().with_revision(1).with_class(ca, floor(1));
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(classed_tokens(cc, 0, 50)).ok())
        };
        let protected = if concurrent {
            let protected = {
                let b = b.clone();
                thread::spawn(move || b.try_acquire(slot(ca)).ok())
            };
            b.apply_limits(raised).unwrap();
            protected.join().unwrap()
        } else {
            b.apply_limits(raised).unwrap();
            b.try_acquire(slot(ca)).ok()
        };
        let borrowed = borrower.join().unwrap();
        let admitted = 1 + u64::from(protected.is_some()) + u64::from(borrowed.is_some());
        assert!(
            admitted <= 2,
            "{admitted} admissions under max_concurrent 2: protected {:?}, borrowed {:?}",
            protected.as_ref().map(|a| (a.revision(), a.resources())),
            borrowed.as_ref().map(|a| (a.revision(), a.resources())),
        );
        assert_eq!(b.stats().in_flight, admitted);
        drop((held, protected, borrowed));
        assert_classes_quiescent(&b);
    });
}

/// Max 2, classes `a` and `b` without floors. A borrower of `a` (a slot) against an install
/// that raises `a`'s floor to 1, a new version of the class: its word migrates, and the
/// borrower's class step may find the migrated word (`src/protocol/classed/reserve.rs`,
/// `class_step_moved`). Then, with the borrower released, the raised floor and the other
/// slot must both be usable: a protected admission in `a` and a borrower in `b`, with a
/// third refused. Fails with `LLM_BULKHEAD_LOOM_MIGRATED_OLD_FLOORS=1`, which classifies the
/// migrated word under the floors of the version the borrower read: its slot, inside the
/// raised floor, stays counted in the shared word as borrowed, and `b` finds no slot.
#[test]
fn a_borrower_whose_class_migrates_between_its_two_steps() {
    model(|| {
        let (b, [ca, cb]) = build(2, None, [("a", floor(0)), ("b", floor(0))]);
        let raised = b.limits().with_revision(1).with_class(ca, floor(1));
        let borrower = {
            let b = b.clone();
            thread::spawn(move || b.try_acquire(slot(ca)).ok())
        };
        b.apply_limits(raised).unwrap();
        let admitted = borrower.join().unwrap();
        let a = admitted.expect("one slot of two in use at most: never refused");
        let s = b.stats();
        assert_eq!((s.in_flight, held(&s, ca)), (1, (1, 0)), "{s:?}");
        drop(a);
        let protected = b.try_acquire(slot(ca)).expect("a's raised floor is idle");
        assert!(!protected.resources().borrowed_concurrency);
        let other = b
            .try_acquire(slot(cb))
            .expect("U = 1 (a's floor): one shared slot left for b");
        let third = b.try_acquire(slot(cb));
        assert!(third.is_err(), "two slots, two admissions: {third:?}");
        drop((protected, other));
        assert_classes_quiescent(&b);
    });
}

/// A borrower of 20 tokens (class `q`, no floors) while a usage report grows another
/// admission of `q` from 30 to 60 tokens, past what the budget of 100 leaves once `p`'s token
/// floor of 50 is counted; then a demand of 40 tokens inside `p`'s floor, which the stored
/// `V` sends to the collect-checked path. Its collect may miss the borrower's tokens (reserved,
/// not yet in `q`'s word): both admitted would hold 120 tokens, 40 admitted past the budget.
/// The exact check counts what the stored word holds beyond its collect
/// (`src/protocol/classed/moved.rs`, "Steps in flight"); fails with
/// `LLM_BULKHEAD_LOOM_EXACT_IGNORES_STORED=1`, which decides on the collect alone.
#[test]
fn a_borrower_in_flight_while_usage_grows() {
    model(|| {
        let (b, [cq, cp]) = build(8, Some(100), [("q", floor(0)), ("p", token_floor(50))]);
        against_growth(&b, (cq, 30, 60), (cq, 20), (cp, 40));
    });
}

/// An admission of `grown.0` of `grown.1` tokens; a borrower of `borrower.1` tokens in class
/// `borrower.0` on its own thread while a usage report grows that admission to `grown.2`
/// tokens, past the budget of 100; then a demand of `inside.1` tokens inside the token floor
/// of class `inside.0`: never both admitted, and nothing held at the end.
fn against_growth(
    b: &Bulkhead,
    (cg, from, to): (ClassId, u64, u64),
    (cq, r): (ClassId, u64),
    (cp, inside): (ClassId, u64),
) {
    let mut grows = b.try_acquire(classed_tokens(cg, 0, from)).unwrap();
    let borrower = {
        let b = b.clone();
        thread::spawn(move || b.try_acquire(classed_tokens(cq, 0, r)).ok())
    };
    grows.report_usage(llm_bulkhead::Usage::new(0, to)).unwrap();
    let admitted = b.try_acquire(classed_tokens(cp, 0, inside)).ok();
    let borrowed = borrower.join().unwrap();
    assert!(
        !(admitted.is_some() && borrowed.is_some()),
        "{to} + {r} + {inside} tokens held under a budget of 100"
    );
    drop((grows, admitted, borrowed));
    assert_classes_quiescent(b);
}

/// A borrower of 25 tokens in class `q`, whose token floor of 20 holds nothing: it borrows 5,
/// reserved on the shared word, and the other 20 lie inside its floor, which the stored `V`
/// counts as the floor, reserved by no one. Meanwhile a usage report grows an admission of
/// `g` from 10 to 40 tokens, so the stored `V` passes the budget of 100, and a demand of 45
/// inside `p`'s token floor of 50 takes the collect-checked path. Its collect may miss the
/// borrower's step and count only the 5 reserved: both admitted would hold 110 tokens. The
/// borrower checks its in-floor part as a protected step does, on its load after the class
/// CAS (`src/protocol/classed/moved.rs`, "A borrower's step"); fails with
/// `LLM_BULKHEAD_LOOM_BORROW_FLOOR_UNVALIDATED=1`, which skips that check.
#[test]
fn a_borrower_inside_its_token_floor_while_usage_grows() {
    model(|| {
        let (b, [cg, cq, cp]) = build(
            8,
            Some(100),
            [
                ("g", floor(0)),
                ("q", token_floor(20)),
                ("p", token_floor(50)),
            ],
        );
        against_growth(&b, (cg, 10, 40), (cq, 25), (cp, 45));
    });
}

/// A protected admission against `apply_limits` installing the kill switch
/// (`max_concurrent = 0`, floors 0). Its class CAS can land after the tag bump, so its final
/// load must see the new tag and start again. An admission carries revision 0 and started
/// before `apply_limits` returned; under revision 1 it is refused.
#[test]
fn protected_admission_against_the_kill_switch() {
    model(|| {
        let (b, [cp, cq]) = build(2, None, [("p", floor(1)), ("q", floor(0))]);
        let kill = b
            .limits()
            .with_revision(1)
            .with_max_concurrent(0)
            .with_class(cp, floor(0))
            .with_class(cq, floor(0));
        let installed = Arc::new(AtomicBool::new(false));
        let applier = {
            let b = b.clone();
            let installed = installed.clone();
            thread::spawn(move || {
                b.apply_limits(kill).unwrap();
                installed.store(true, loom::sync::atomic::Ordering::SeqCst);
                // An admission decided under revision 0 is visible by now.
                b.stats().in_flight
            })
        };
        let after_install = installed.load(loom::sync::atomic::Ordering::SeqCst);
        let outcome = b.try_acquire(slot(cp));
        match &outcome {
            Ok(a) => {
                assert_eq!(a.revision(), 0);
                assert!(!after_install, "admitted under a replaced snapshot");
            }
            Err(r) => {
                assert_eq!(r.revision, 1, "revision 0 admits this: {r:?}");
                assert_eq!(r.reason, RejectReason::ConcurrencyLimit, "{r:?}");
            }
        }
        let seen_after_install = applier.join().unwrap();
        if outcome.is_ok() {
            assert_eq!(
                seen_after_install, 1,
                "decided under revision 0 after apply_limits returned"
            );
        }
        let admitted = u64::from(outcome.is_ok());
        drop(outcome);
        assert_quiescent(&b, admitted, 1 - admitted);
        assert_classes_quiescent(&b);
    });
}

/// Two protected admissions of one class race for the last slot of its floor, with no shared
/// slot beyond the floors. Both read the floor idle; the loser's class CAS finds the slot
/// taken, so its step is no longer protected: the fast attempt's retry on the word it found
/// must see that and hand the decision on (which refuses it at the protection), never step
/// past the floor as a protected step, which no shared word counts. Exactly one is admitted,
/// and nothing ever exceeds `max_concurrent`. `LLM_BULKHEAD_LOOM_PROTECTED_RETRY_UNCHECKED=1`
/// (the retry takes its step without checking the word) must fail it (`.ci/run`).
#[test]
fn protected_admissions_race_for_the_last_floor_slot() {
    model(|| {
        let (b, [cp, _]) = build(1, None, [("p", floor(1)), ("q", floor(0))]);
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.try_acquire(slot(cp)))
            })
            .collect();
        let outcomes: Vec<_> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let s = b.stats();
        assert_eq!(s.in_flight, 1, "one slot: {s:?}");
        let refused: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert_eq!(refused.len(), 1, "the floor's one slot admits one: {s:?}");
        assert_eq!(
            (refused[0].reason, refused[0].constraint),
            (
                RejectReason::ConcurrencyLimit,
                Some(Constraint::AdmissionClassProtection)
            ),
            "{:?}",
            refused[0]
        );
        drop(outcomes);
        assert_quiescent(&b, 1, 1);
        assert_classes_quiescent(&b);
    });
}

/// Two admissions of the same class race at its floor boundary, each with tokens beyond the
/// token floor (so each reserves its borrowed tokens in the shared word before its class
/// CAS). Both read an idle floor; the loser's class CAS finds the floor taken, so its slot is
/// now borrowed: it must reserve that slot too (or start again), never commit it unreserved.
/// Afterwards the one shared slot is taken, so a borrower of another class is refused, and
/// nothing ever exceeds `max_concurrent`.
#[test]
fn same_class_admissions_race_at_the_floor_boundary() {
    model(|| {
        let limits = ClassLimits {
            protected_concurrent: 1,
            protected_tokens: 100,
            ..ClassLimits::default()
        };
        let (b, [cp, cq]) = build(2, Some(1_000), [("p", limits), ("q", floor(0))]);
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.try_acquire(classed_tokens(cp, 100, 50)).ok())
            })
            .collect();
        let won: Vec<_> = racers
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        assert_eq!(
            won.len(),
            2,
            "both fit: one inside the floor, one in the shared slot"
        );
        let borrowed: Vec<bool> = won
            .iter()
            .map(|a| a.resources().borrowed_concurrency)
            .collect();
        assert_eq!(borrowed.iter().filter(|x| **x).count(), 1, "{borrowed:?}");
        let s = b.stats();
        assert_eq!(s.in_flight, 2, "{s:?}");
        let r = b
            .try_acquire(slot(cq))
            .expect_err("the shared slot is taken");
        assert_eq!(
            (r.reason, r.constraint),
            (
                RejectReason::ConcurrencyLimit,
                Some(Constraint::AdmissionClassProtection)
            ),
            "{r:?}"
        );
        drop(won);
        assert_quiescent(&b, 2, 1);
        assert_classes_quiescent(&b);
    });
}
