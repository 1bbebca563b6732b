//! `Rejection::never_fits` against its plain model: a `budget_limit` refusal says the demand
//! can never fit exactly when an idle bulkhead with the same limits refuses it too (on any
//! limits, any background load, any class and priority).

use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Priority, RejectReason, Reservation};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Setup {
    budget: u64,
    reserve: u64,
    classes: Vec<(u64, Option<u64>)>,
}

fn build(s: &Setup) -> Option<Bulkhead> {
    let mut b = Bulkhead::builder()
        .max_concurrent(16)
        .token_budget(s.budget)
        .high_priority_reserve(s.reserve);
    for (i, (floor, ceiling)) in s.classes.iter().enumerate() {
        b = b.class(
            format!("c{i}"),
            ClassLimits {
                protected_tokens: *floor,
                max_tokens: *ceiling,
                ..Default::default()
            },
        );
    }
    if !s.classes.is_empty() {
        b = b.default_class("c0");
    }
    b.build().ok()
}

fn demand(b: &Bulkhead, class: usize, tokens: u64, high: bool) -> Demand {
    let mut d = Demand::tokens(Reservation::new(tokens, 0).unwrap());
    if high {
        d = d.with_priority(Priority::High);
    }
    match b.class_names().get(class) {
        Some(name) => d.in_class(b.class_id(name).unwrap()),
        None => d,
    }
}

fn setup() -> impl Strategy<Value = Setup> {
    (1u64..2_000, 0u64..1_000).prop_flat_map(|(budget, reserve)| {
        let class = (0u64..=budget / 2, prop::option::of(1u64..=budget));
        prop::collection::vec(class, 0..=3).prop_map(move |classes| Setup {
            budget,
            reserve: reserve.min(budget),
            classes,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn never_fits_is_an_idle_twin_refusing(
        s in setup(),
        load in prop::collection::vec((0usize..3, 1u64..800, any::<bool>()), 0..6),
        (class, tokens, high) in (0usize..3, 0u64..4_000, any::<bool>()),
    ) {
        let Some(loaded) = build(&s) else { return Ok(()) };
        let idle = build(&s).unwrap();
        let held: Vec<_> = load
            .iter()
            .filter_map(|&(c, t, h)| loaded.try_acquire(demand(&loaded, c, t, h)).ok())
            .collect();
        let refused = loaded.try_acquire(demand(&loaded, class, tokens, high));
        let twin = idle.try_acquire(demand(&idle, class, tokens, high));
        if let Err(r) = &refused {
            if r.reason == RejectReason::BudgetLimit {
                let never = r.never_fits();
                prop_assert_eq!(never.is_some(), twin.is_err(), "{:?} {:?} {:?}", r, never, twin.as_ref().err());
                if let Some(n) = never {
                    prop_assert!(n.requested > n.most);
                    prop_assert_eq!(n.requested, tokens);
                }
            } else {
                prop_assert_eq!(r.never_fits(), None);
            }
        }
        drop(held);
    }
}
