//! Edge defects a new user hits (issue 13 §3), each with the behaviour it must have.

use llm_bulkhead::{
    ApplyLimitsError, Bulkhead, ClassLimits, ConfigProblem, Demand, Reservation, MAX_REVISION,
};

fn revision_too_large(e: &llm_bulkhead::ConfigError) -> bool {
    e.field == "revision"
        && e.problem
            == ConfigProblem::TooLarge {
                value: MAX_REVISION + 1,
                max: MAX_REVISION,
            }
}

#[test]
fn revisions_above_2_pow_53_minus_1_are_refused_everywhere() {
    let e = Bulkhead::builder()
        .max_concurrent(1)
        .initial_revision(MAX_REVISION + 1)
        .build()
        .unwrap_err();
    assert!(revision_too_large(&e), "{e:?}");

    let b = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(10)
        .initial_revision(MAX_REVISION - 1)
        .build()
        .unwrap();
    match b.apply_limits(b.limits().with_revision(MAX_REVISION + 1)) {
        Err(ApplyLimitsError::Invalid(e)) => assert!(revision_too_large(&e), "{e:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.limits().revision, MAX_REVISION - 1, "nothing changed");
    b.set_budget(20).unwrap();
    assert_eq!(b.limits().revision, MAX_REVISION);
    match b.set_budget(30) {
        Err(ApplyLimitsError::Invalid(e)) => assert!(revision_too_large(&e), "{e:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.limits().token_budget.unwrap().budget,
        20,
        "nothing changed"
    );
}

#[test]
fn debug_lists_only_the_classes_in_use() {
    let b = Bulkhead::new(2).unwrap();
    let s = format!("{:?}", b.limits());
    assert!(s.contains("classes: []"), "{s}");
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .class("a", ClassLimits::default())
        .default_class("a")
        .build()
        .unwrap();
    assert_eq!(
        format!("{:?}", b.stats()).matches("ClassLimits {").count(),
        2,
        "the table and the class stats"
    );
}

#[test]
fn a_class_refusal_explains_itself_with_the_class_numbers() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(50_000)
        .class(
            "capped",
            ClassLimits {
                max_concurrent: Some(1),
                max_tokens: Some(10_000),
                ..ClassLimits::default()
            },
        )
        .default_class("capped")
        .build()
        .unwrap();
    let held = b
        .try_acquire(Demand::tokens(Reservation::new(9_000, 0).unwrap()))
        .unwrap();
    let e = b
        .try_acquire(Demand::tokens(Reservation::new(3_000, 0).unwrap()))
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("class capped: 3000 tokens requested, 1000 of its ceiling of 10000 available"),
        "{msg}"
    );
    drop(held);
    let _one = b.try_acquire(Demand::slot()).unwrap();
    let msg = b.try_acquire(Demand::slot()).unwrap_err().to_string();
    assert!(
        msg.contains("class capped: 1 of its ceiling of 1 slots in use"),
        "{msg}"
    );
}

#[test]
fn a_builder_without_max_concurrent_is_an_error_and_an_explicit_zero_is_the_kill_switch() {
    // Before issue 13 this built a bulkhead that refused everything.
    let e = Bulkhead::builder()
        .token_budget(1_000)
        .max_queue(4)
        .build()
        .unwrap_err();
    assert_eq!(
        (e.field, &e.problem),
        ("max_concurrent", &ConfigProblem::Missing)
    );
    assert_eq!(e.to_string(), "max_concurrent is required");
    let off = Bulkhead::builder().max_concurrent(0).build().unwrap();
    assert_eq!(
        off.try_acquire(Demand::slot()).unwrap_err().reason,
        llm_bulkhead::RejectReason::ConcurrencyLimit
    );
}

/// Statistics saturate instead of wrapping: a usage report of `u64::MAX − 1` tokens and then
/// one of 5 leave `total_consumed` at `u64::MAX` (it wrapped to 3 before), in the totals and
/// in the class's.
#[test]
fn statistics_saturate_instead_of_wrapping() {
    use llm_bulkhead::{ClassLimits, Demand, Reservation, Usage};
    for classed in [false, true] {
        let mut builder = llm_bulkhead::Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(1_000);
        if classed {
            builder = builder
                .class("a", ClassLimits::default())
                .default_class("a");
        }
        let b = builder.build().unwrap();
        let demand = || Demand::tokens(Reservation::new(10, 10).unwrap());
        b.try_acquire(demand())
            .unwrap()
            .release(Some(Usage::new(u64::MAX - 1, 0)))
            .unwrap();
        b.try_acquire(demand())
            .unwrap()
            .release(Some(Usage::new(5, 0)))
            .unwrap();
        let s = b.stats();
        assert_eq!(
            s.token_budget.unwrap().total_consumed,
            u64::MAX,
            "classed {classed}"
        );
        if classed {
            assert_eq!(s.classes.unwrap().classes[0].total_consumed, u64::MAX);
        }
    }
}
