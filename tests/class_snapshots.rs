//! Limits snapshots and class identities (issue 13 §3): `with_class` given a class the
//! snapshot's table does not have is a typed error before anything changes, never a silent
//! no-op or a write to whatever class has the same position; a snapshot taken from another
//! bulkhead is applied by its class names (CONTRACT.md §4), not by position alone.

use llm_bulkhead::{
    ApplyLimitsError, Bulkhead, ClassId, ClassLimits, ConfigError, ConfigProblem, LimitsSnapshot,
};

fn build(names: &[&str]) -> Bulkhead {
    names
        .iter()
        .fold(Bulkhead::builder().max_concurrent(8), |b, n| {
            b.class(*n, ClassLimits::default())
        })
        .default_class(names[0])
        .build()
        .unwrap()
}

fn ceiling(n: u32) -> ClassLimits {
    ClassLimits {
        max_concurrent: Some(n),
        ..ClassLimits::default()
    }
}

fn invalid(r: Result<llm_bulkhead::LimitsChange, ApplyLimitsError>) -> ConfigError {
    match r {
        Err(ApplyLimitsError::Invalid(e)) => e,
        other => panic!("expected an invalid snapshot, got {other:?}"),
    }
}

/// Nothing changed: revision 0 and every class at its construction-time limits.
fn assert_unchanged(b: &Bulkhead) {
    let l = b.limits();
    assert_eq!(l.revision, 0);
    assert!(
        l.classes.iter().all(|c| *c == ClassLimits::default()),
        "{l:?}"
    );
}

#[test]
fn a_class_of_another_bulkhead_in_with_class_is_refused_by_apply_limits() {
    let (b, other) = (
        build(&["premium", "standard"]),
        build(&["premium", "standard"]),
    );
    let foreign = other.class_id("premium").unwrap();
    let s = b.limits().with_revision(1).with_class(foreign, ceiling(1));
    // The limit was not written to b's "premium" (the same position).
    assert_eq!(s.classes.iter().next(), Some(&ClassLimits::default()));
    let e = invalid(b.apply_limits(s));
    assert_eq!(e.field, "classes");
    assert_eq!(e.problem, ConfigProblem::UnknownClassId(foreign));
    assert!(e.to_string().contains("class id 0"), "{e}");
    assert_unchanged(&b);
    // A later with_class of a valid id does not clear the refusal.
    let own = b.class_id("standard").unwrap();
    let s = b
        .limits()
        .with_revision(1)
        .with_class(foreign, ceiling(1))
        .with_class(own, ceiling(2));
    assert_eq!(
        invalid(b.apply_limits(s)).problem,
        ConfigProblem::UnknownClassId(foreign)
    );
    assert_unchanged(&b);
}

#[test]
fn a_class_on_a_snapshot_without_classes_is_refused() {
    let plain = Bulkhead::new(4).unwrap();
    let class = build(&["a"]).class_id("a").unwrap();
    let e = invalid(
        plain.apply_limits(
            plain
                .limits()
                .with_revision(1)
                .with_max_concurrent(2)
                .with_class(class, ceiling(1)),
        ),
    );
    assert_eq!(e.problem, ConfigProblem::UnknownClassId(class));
    assert_eq!(plain.limits().max_concurrent, 4);
}

#[test]
fn try_with_class_reports_the_id_at_once() {
    let (b, other) = (build(&["a", "b"]), build(&["a", "b"]));
    let own = b.class_id("b").unwrap();
    let s = b.limits().try_with_class(own, ceiling(3)).unwrap();
    assert_eq!(s.classes.get(own), Some(&ceiling(3)));
    let foreign = other.class_id("b").unwrap();
    let e = b.limits().try_with_class(foreign, ceiling(3)).unwrap_err();
    assert_eq!(
        (e.field, e.problem),
        ("classes", ConfigProblem::UnknownClassId(foreign))
    );
}

#[test]
fn a_stale_revision_is_still_refused_first() {
    let (b, other) = (build(&["a"]), build(&["a"]));
    let s = b
        .limits()
        .with_class(other.class_id("a").unwrap(), ceiling(1));
    assert!(matches!(
        b.apply_limits(s),
        Err(ApplyLimitsError::StaleRevision { attempted: 0, .. })
    ));
}

#[test]
fn get_does_not_answer_for_another_bulkheads_class() {
    let (b, other) = (build(&["a"]), build(&["a"]));
    let table = b.limits().classes;
    assert!(table.get(b.class_id("a").unwrap()).is_some());
    assert_eq!(table.get(other.class_id("a").unwrap()), None);
}

#[test]
fn a_snapshot_of_a_bulkhead_with_the_same_classes_applies_by_name() {
    let (a, b) = (build(&["premium", "batch"]), build(&["premium", "batch"]));
    let from_a = a
        .limits()
        .with_revision(1)
        .with_class(a.class_id("batch").unwrap(), ceiling(2));
    b.apply_limits(from_a).unwrap();
    let batch = b.class_id("batch").unwrap();
    assert_eq!(b.limits().classes.get(batch), Some(&ceiling(2)));
    // Installed with b's provenance: b's ids work on it, a's do not.
    assert!(b.limits().try_with_class(batch, ceiling(1)).is_ok());
    assert!(b
        .limits()
        .try_with_class(a.class_id("batch").unwrap(), ceiling(1))
        .is_err());
}

#[test]
fn a_snapshot_of_a_bulkhead_with_other_classes_is_refused() {
    // Same count, so the old positional check let it through onto the wrong classes.
    let (a, b) = (build(&["premium", "batch"]), build(&["batch", "premium"]));
    let from_a = a
        .limits()
        .with_revision(1)
        .with_class(a.class_id("premium").unwrap(), ceiling(1));
    let e = invalid(b.apply_limits(from_a));
    assert_eq!(
        (e.field, e.problem.clone()),
        ("classes", ConfigProblem::ForeignClassTable)
    );
    assert!(e.to_string().contains("other admission classes"), "{e}");
    assert_unchanged(&b);
    // Renamed classes too.
    let c = build(&["premium", "bulk"]);
    let e = invalid(c.apply_limits(a.limits().with_revision(1)));
    assert_eq!(e.problem, ConfigProblem::ForeignClassTable);
    assert_unchanged(&c);
}

#[test]
fn a_deserialised_snapshot_is_positional_and_takes_one_bulkheads_ids() {
    let (b, other) = (build(&["a", "b"]), build(&["a", "b"]));
    let json = serde_json::to_string(&b.limits().with_revision(1)).unwrap();
    let s: LimitsSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(s, b.limits().with_revision(1));
    // Given b's id it takes b's ids only...
    let mixed = s
        .with_class(b.class_id("a").unwrap(), ceiling(1))
        .with_class(other.class_id("b").unwrap(), ceiling(1));
    assert_eq!(
        invalid(b.apply_limits(mixed)).problem,
        ConfigProblem::UnknownClassId(other.class_id("b").unwrap())
    );
    // ...and, so bound, applies to b and not to another bulkhead.
    let bound = s.with_class(b.class_id("b").unwrap(), ceiling(2));
    assert_eq!(
        invalid(other.apply_limits(bound)).problem,
        ConfigProblem::ForeignClassTable
    );
    b.apply_limits(bound).unwrap();
    assert_eq!(
        b.limits().classes.get(b.class_id("b").unwrap()),
        Some(&ceiling(2))
    );
    // Without ids it is positional: any bulkhead with that many classes takes it.
    other.apply_limits(s).unwrap();
    // A position the deserialised table lacks is refused like a foreign id.
    let short: LimitsSnapshot = serde_json::from_str(
        &serde_json::to_string(&build(&["x"]).limits().with_revision(1)).unwrap(),
    )
    .unwrap();
    let second: ClassId = b.class_id("b").unwrap();
    assert_eq!(
        short
            .try_with_class(second, ceiling(1))
            .unwrap_err()
            .problem,
        ConfigProblem::UnknownClassId(second)
    );
}

#[test]
fn a_snapshot_holding_a_refused_id_does_not_serialise() {
    let (b, other) = (build(&["a"]), build(&["a"]));
    let s = b
        .limits()
        .with_class(other.class_id("a").unwrap(), ceiling(1));
    let e = serde_json::to_string(&s).unwrap_err();
    assert!(
        e.to_string().contains("not a class of this snapshot"),
        "{e}"
    );
    // And it is not equal to the snapshot it came from.
    assert_ne!(s, b.limits());
    assert_eq!(b.limits(), other.limits(), "provenance is not compared");
}
