//! Class refusals, the hot path of `try_acquire` under overload with classes: they allocate
//! nothing (counted by a per-thread counting global allocator, with every refusal kept alive,
//! as a caller that answers with it does), and every refusal, those decided by the short paths
//! (at a class ceiling, at the shared remainder) included, explains itself exactly as
//! `would_admit` (which decides from its own collect of the words) does: same reason,
//! constraint, revision and whole detail. A refusal at the shared remainder is decided by the
//! rule on a collect, not by the stored shared word (`conservative`, with its broken variant).

use llm_bulkhead::{
    Advice, Bulkhead, ClassId, ClassLimits, Constraint, Demand, RejectReason, Rejection,
    Reservation,
};
use proptest::prelude::*;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::allocs;

/// Two classes on 6 slots and (optionally) a budget: `capped` with ceilings, `floored` with
/// floors.
fn bulkhead(budget: bool) -> Bulkhead {
    let b = Bulkhead::builder().max_concurrent(6);
    let b = if budget { b.token_budget(10_000) } else { b };
    b.class(
        "capped",
        ClassLimits {
            protected_concurrent: 1,
            max_concurrent: Some(2),
            protected_tokens: if budget { 500 } else { 0 },
            max_tokens: budget.then_some(3_000),
        },
    )
    .class(
        "floored",
        ClassLimits {
            protected_concurrent: 2,
            protected_tokens: if budget { 2_000 } else { 0 },
            ..ClassLimits::default()
        },
    )
    .default_class("capped")
    .build()
    .unwrap()
}

fn demand(b: &Bulkhead, class: &str, tokens: u64) -> Demand {
    let id = b.class_id(class).unwrap();
    if tokens == 0 {
        Demand::slot().in_class(id)
    } else {
        Demand::tokens(Reservation::new(tokens, 0).unwrap()).in_class(id)
    }
}

/// Allocations made while `refusals` refusals of `d` are made and kept.
fn allocations_of_kept_refusals(b: &Bulkhead, d: Demand, refusals: usize) -> (u64, Vec<Rejection>) {
    // Warm-up: the thread's statistics entry is made by its first decision.
    assert!(b.try_acquire(d).is_err());
    let mut kept = Vec::with_capacity(refusals);
    let before = allocs();
    for _ in 0..refusals {
        kept.push(b.try_acquire(d).unwrap_err());
    }
    (allocs() - before, kept)
}

#[test]
fn a_refusal_at_a_class_ceiling_allocates_nothing() {
    for budget in [false, true] {
        let b = bulkhead(budget);
        let d = demand(&b, "capped", 0);
        let held: Vec<_> = (0..2).map(|_| b.try_acquire(d).unwrap()).collect();
        let (n, kept) = allocations_of_kept_refusals(&b, d, 100);
        assert_eq!(
            n, 0,
            "budget {budget}: {n} allocations for 100 kept refusals"
        );
        for r in &kept {
            assert_eq!(
                (r.reason, r.constraint),
                (
                    RejectReason::ConcurrencyLimit,
                    Some(Constraint::AdmissionClass)
                )
            );
            let c = r.detail().classes.unwrap().class;
            assert_eq!(
                (c.id.as_str(), c.in_flight, c.max_concurrent),
                ("capped", 2, Some(2))
            );
        }
        drop(held);
    }
    // The token ceiling.
    let b = bulkhead(true);
    let (n, kept) = allocations_of_kept_refusals(&b, demand(&b, "capped", 3_001), 100);
    assert_eq!(n, 0);
    assert_eq!(kept[0].reason, RejectReason::BudgetLimit);
    assert_eq!(kept[0].constraint, Some(Constraint::AdmissionClass));
}

/// The refusals at the shared remainder (the global slots, another class's floor), decided by
/// their short path, keep their numbers inline too.
#[test]
fn other_class_refusals_allocate_nothing() {
    // The global slots: no floors, both slots held.
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .class("x", ClassLimits::default())
        .class("y", ClassLimits::default())
        .default_class("x")
        .build()
        .unwrap();
    let x = demand(&b, "x", 0);
    let held: Vec<_> = (0..2).map(|_| b.try_acquire(x).unwrap()).collect();
    let (n, kept) = allocations_of_kept_refusals(&b, x, 50);
    assert_eq!(n, 0);
    assert_eq!(kept[0].reason, RejectReason::ConcurrencyLimit);
    assert_eq!(kept[0].constraint, Some(Constraint::Global));
    drop(held);
    // Another class's floor: `a` holds the one shared slot (3 minus b's floor of 2), so a
    // second slot would borrow into b's floor.
    let b = Bulkhead::builder()
        .max_concurrent(3)
        .class("a", ClassLimits::default())
        .class(
            "b",
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        )
        .default_class("a")
        .build()
        .unwrap();
    let a = demand(&b, "a", 0);
    let _held = b.try_acquire(a).unwrap();
    let (n, kept) = allocations_of_kept_refusals(&b, a, 50);
    assert_eq!(n, 0);
    assert_eq!(
        kept[0].constraint,
        Some(Constraint::AdmissionClassProtection)
    );
}

/// The refusal `try_acquire` gives for `d`, beside `would_admit`'s, which decides and explains
/// from its own collect of every word.
fn both(b: &Bulkhead, d: Demand) -> Option<(Rejection, Rejection)> {
    let advice = b.would_admit(&d);
    match b.try_acquire(d) {
        Ok(a) => {
            assert!(matches!(advice, Advice::Admit { .. }), "{advice:?}");
            drop(a);
            None
        }
        Err(r) => match advice {
            Advice::Refuse(w) => Some((r, w)),
            other => panic!("try_acquire refused {r:?}, would_admit said {other:?}"),
        },
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Acquire (and keep) in class 0 or 1 with this many tokens.
    Take(usize, u64),
    /// Release the oldest kept admission.
    Release,
    /// Ask in class 0 or 1 with this many tokens (high priority or not), keep nothing.
    Ask(usize, u64, bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..2usize, 0..1_500u64).prop_map(|(k, t)| Step::Take(k, t)),
        Just(Step::Release),
        (0..2usize, 0..4_000u64, any::<bool>()).prop_map(|(k, t, h)| Step::Ask(k, t, h)),
    ]
}

fn limits() -> impl Strategy<Value = ClassLimits> {
    (
        0..3u32,
        prop::option::of(0..4u32),
        0..1_500u64,
        prop::option::of(0..4_000u64),
    )
        .prop_map(|(pc, mc, pt, mt)| ClassLimits {
            protected_concurrent: pc,
            max_concurrent: mc.map(|m| m.max(pc)),
            protected_tokens: pt,
            max_tokens: mt.map(|m| m.max(pt)),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every refusal of `try_acquire` on a bulkhead with classes, ceiling refusals included,
    /// equals `would_admit`'s for the same demand in the same state (reason, constraint,
    /// revision, whole detail), with or without a budget.
    #[test]
    fn class_refusals_explain_themselves_as_would_admit_does(
        budget in prop::option::of((6_000..12_000u64, 0..2_000u64)),
        a in limits(),
        b_limits in limits(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let mut builder = Bulkhead::builder().max_concurrent(6);
        if let Some((budget, reserve)) = budget {
            builder = builder.token_budget(budget).high_priority_reserve(reserve);
        }
        let strip = |l: ClassLimits| if budget.is_some() {
            l
        } else {
            ClassLimits { protected_tokens: 0, max_tokens: None, ..l }
        };
        let Ok(b) = builder
            .class("a", strip(a))
            .class("b", strip(b_limits))
            .default_class("a")
            .build()
        else {
            return Ok(()); // limits the builder refuses (floors over the budget)
        };
        let ids: [ClassId; 2] = [b.class_id("a").unwrap(), b.class_id("b").unwrap()];
        let make = |k: usize, t: u64, high: bool| {
            let d = if budget.is_some() && t > 0 {
                Demand::tokens(Reservation::new(t, 0).unwrap())
            } else {
                Demand::slot()
            };
            let d = d.in_class(ids[k]);
            if high { d.with_priority(llm_bulkhead::Priority::High) } else { d }
        };
        let mut held = std::collections::VecDeque::new();
        for s in steps {
            match s {
                Step::Take(k, t) => {
                    let d = make(k, t, false);
                    if let Some((r, w)) = both(&b, d) {
                        prop_assert_eq!(r, w);
                    } else {
                        held.push_back(b.try_acquire(d).unwrap());
                    }
                }
                Step::Release => drop(held.pop_front()),
                Step::Ask(k, t, high) => {
                    if let Some((r, w)) = both(&b, make(k, t, high)) {
                        prop_assert_eq!(r, w);
                    }
                }
            }
        }
    }
}

/// A refusal at the shared remainder is decided by the rule on a collect, not by the stored
/// shared word, which may count steps in progress: here an install that raised a floor has
/// added the raise to the stored `U` and is stopped (a pause hook, feature `testing`) before it
/// migrates the class, whose slot was already in use, so the raise takes nothing. The stored
/// word then has no room for a borrower of another class, but the truth has, and no state of
/// the call refuses it: it is admitted (the full protocol helps the migration and decides
/// again). Refusing on the stored word alone, the deliberately broken variant
/// `LLM_BULKHEAD_SHORT_REFUSAL_TRUSTS_STORED=1` that `.ci/run` runs, fails here.
#[cfg(feature = "testing")]
mod conservative {
    use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
    use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    use std::sync::mpsc;

    #[test]
    fn a_conservative_shared_word_refuses_no_one() {
        // Three slots; `a` and `b` without floors, each holding one (both borrowed).
        let b = Bulkhead::builder()
            .max_concurrent(3)
            .class("a", ClassLimits::default())
            .class("b", ClassLimits::default())
            .default_class("a")
            .build()
            .unwrap();
        let (a_id, b_id) = (b.class_id("a").unwrap(), b.class_id("b").unwrap());
        let held = [
            b.try_acquire(Demand::slot().in_class(a_id)).unwrap(),
            b.try_acquire(Demand::slot().in_class(b_id)).unwrap(),
        ];
        // `b`'s floor raised to 1: the install adds 1 to the stored `U` (3 of 3) and stops
        // before the migration takes it back (`b` already holds its floor's slot).
        let (at_tx, at_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let installer = {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut first = Some((at_tx, go_rx));
                set_pause_hook(move |p| {
                    if p == PausePoint::InstallMigrating {
                        if let Some((at, go)) = first.take() {
                            at.send(()).unwrap();
                            go.recv().unwrap();
                        }
                    }
                });
                let cur = b.limits();
                let next = cur.with_revision(cur.revision + 1).with_class(
                    b_id,
                    ClassLimits {
                        protected_concurrent: 1,
                        ..ClassLimits::default()
                    },
                );
                let out = b.apply_limits(next);
                clear_pause_hook();
                out
            })
        };
        at_rx
            .recv()
            .expect("the install stops before its migration");
        // `a` borrows its second slot: one of the two shared slots (3 minus b's floor) is in
        // use, by `a`, in every state of the call.
        let second = b.try_acquire(Demand::slot().in_class(a_id));
        go_tx.send(()).unwrap();
        installer.join().unwrap().expect("the install lands");
        let second = second.map_err(|rej| format!("refused by the stored word: {rej:?}"));
        assert!(second.is_ok(), "{second:?}");
        drop(second);
        drop(held);
        let s = b.stats();
        assert_eq!(s.in_flight, 0, "{s:?}");
    }
}

/// A borrower refused at the shared remainder is refused for the first row that refuses it,
/// also when the fast attempt's own class word decides the refusal (what the class alone
/// borrows is a lower bound of what all classes borrow): here `b` fills the shared slots and
/// `a`'s tokens would pass the shared tokens, so rows 4 (slots) and 5 (tokens) both refuse,
/// and row 4 comes first. `a` alone does not fill the shared slots, so its word cannot tell
/// row 4 and leaves the refusal to a collect; checking the token row on its word there, the
/// deliberately broken variant `LLM_BULKHEAD_OWN_PROTECTION_ROW_5_FIRST=1` that `.ci/run`
/// runs, reports a refusal for tokens and fails here.
mod own_word {
    use super::{both, demand};
    use llm_bulkhead::{Bulkhead, ClassLimits, Constraint, Demand, RejectReason};

    /// 4 slots and 10,000 tokens. `a`: a floor of 1 slot and 1,000 tokens. `b`: a floor of 1
    /// slot and 2,000 tokens. Shared: 2 slots and 7,000 tokens.
    fn bulkhead() -> Bulkhead {
        let floors = |pc, pt| ClassLimits {
            protected_concurrent: pc,
            protected_tokens: pt,
            ..ClassLimits::default()
        };
        Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(10_000)
            .class("a", floors(1, 1_000))
            .class("b", floors(1, 2_000))
            .default_class("a")
            .build()
            .unwrap()
    }

    /// Why `d` is refused (`try_acquire` and `would_admit` agreeing on the whole refusal).
    fn refused(b: &Bulkhead, d: Demand) -> (RejectReason, Option<Constraint>) {
        let (r, w) = both(b, d).expect("refused");
        assert_eq!(r, w, "try_acquire and would_admit explain it alike");
        (r.reason, r.constraint)
    }

    /// A refusal for another class's floor, of slots or of tokens.
    fn protection(reason: RejectReason) -> (RejectReason, Option<Constraint>) {
        (reason, Some(Constraint::AdmissionClassProtection))
    }

    #[test]
    fn a_class_word_decides_only_the_row_it_can_tell() {
        let b = bulkhead();
        // `a` inside its floors (1 slot, 1,000 tokens); `b` its floor slot and both shared
        // slots, no tokens.
        let _a = b.try_acquire(demand(&b, "a", 1_000)).unwrap();
        let _b: Vec<_> = (0..3)
            .map(|_| b.try_acquire(demand(&b, "b", 0)).unwrap())
            .collect();
        // `a` asks for a slot (borrowed: its floor slot is in use) and 7,500 tokens (all
        // borrowed: 7,500 > 7,000 shared). Row 1 passes (1,000 + 7,500 ≤ 10,000).
        let slots = protection(RejectReason::ConcurrencyLimit);
        let tokens = protection(RejectReason::BudgetLimit);
        assert_eq!(
            refused(&b, demand(&b, "a", 7_500)),
            slots,
            "row 4 comes before row 5"
        );
        // With `b` gone, row 4 passes; the tokens refuse (a collect decides: `a`'s slot is
        // borrowed, and its word alone cannot tell row 4).
        drop(_b);
        assert_eq!(refused(&b, demand(&b, "a", 7_500)), tokens);
        // With `a` gone too, its slot is inside its floor, so row 4 cannot refuse it and its
        // own word decides the token row: 8,500 tokens borrow 7,500 (past the floor's 1,000),
        // more than the 7,000 shared.
        drop(_a);
        assert_eq!(refused(&b, demand(&b, "a", 8_500)), tokens);
    }

    /// The refusal the class's own word decides, where it alone fills the shared slots: `a`
    /// holds both shared slots and asks for a third.
    #[test]
    fn a_class_that_fills_the_shared_slots_is_refused_by_its_own_word() {
        let b = bulkhead();
        let _a: Vec<_> = (0..3)
            .map(|_| b.try_acquire(demand(&b, "a", 0)).unwrap())
            .collect();
        let slots = protection(RejectReason::ConcurrencyLimit);
        assert_eq!(refused(&b, demand(&b, "a", 0)), slots);
    }
}
