//! The reference library's admission-class cases, with its numbers: every applicable test of
//! `admission_classes.test.ts` (#1–#13, ../shared/reference/async-bulkhead-llm-tests.md), the
//! worked examples of async-bulkhead-llm-behaviour.md §4.4–§4.8 (attribution, hold changes,
//! raised floors, the high-priority reserve), §6.1 (manual abandonment), the detail shape of
//! §10.1 and the class statistics of §10.3, and the seed's worked example
//! (../shared/seeds/000_f3b16fdc056bf453.txt: 12 slots and 24,000 tokens).
//!
//! The crate has no `wouldAdmit`, `run`, events, deduplication or wait queue yet: admission
//! and decision content is ported with `try_acquire` (which, unlike `wouldAdmit`, counts its
//! refusals), and the parts about deduplication, events, observe mode and queued waiters are
//! skipped with a comment naming the reference test. The reference's estimator "est 100/300"
//! is an explicit `Reservation::new(100, 300)` (400 tokens). Where CONTRACT.md §9 deliberately
//! differs from the reference, the test says so and asserts the contract.

use llm_bulkhead::{
    Admission, ApplyLimitsError, BudgetLimits, Bulkhead, ClassLimits, ClassStats, ConfigError,
    ConfigProblem, Constraint, Demand, LimitsSnapshot, Priority, Reconcile, RejectReason,
    Rejection, Reservation, Usage, MAX_CLASSED_SLOTS, MAX_CLASSES,
};

// The refusal detail types are `#[non_exhaustive]`: the expected values are written as
// literals of exhaustive test-side mirrors.
#[path = "support/detail.rs"]
mod detail;
use detail::{
    ClassCapacity, ClassDetail, ClassTokenCapacity, Resources, SharedAmount, SharedCapacity,
    TokenCapacity,
};

fn res(input: u64, max_output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, max_output).unwrap())
}

/// The reference fixture's estimator, "est 100/300": 400 tokens.
fn est() -> Demand {
    res(100, 300)
}

fn ceilings(max_concurrent: u32, max_tokens: u64) -> ClassLimits {
    ClassLimits {
        max_concurrent: Some(max_concurrent),
        max_tokens: Some(max_tokens),
        ..ClassLimits::default()
    }
}

/// The suite's shared fixture `classed({mc, B})`: classes `premium {maxConcurrent 2,
/// maxInFlightTokens 1200}` and `standard {maxConcurrent 1, maxInFlightTokens 800}`, default
/// `standard`, no queue, no reserve.
fn classed(max_concurrent: u32, budget: u64) -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(max_concurrent)
        .token_budget(budget)
        .class("premium", ceilings(2, 1_200))
        .class("standard", ceilings(1, 800))
        .default_class("standard")
        .build()
        .unwrap()
}

/// `demand` in the class named `name`.
fn into(b: &Bulkhead, name: &str, demand: Demand) -> Demand {
    demand.in_class(b.class_id(name).unwrap())
}

/// `n` admissions of `demand`, each of which must be admitted.
fn admit_n(b: &Bulkhead, n: usize, demand: Demand) -> Vec<Admission> {
    (0..n).map(|_| b.try_acquire(demand).unwrap()).collect()
}

fn class_stats(b: &Bulkhead, name: &str) -> ClassStats {
    let s = b.stats().classes.expect("classes configured");
    s.classes
        .into_iter()
        .find(|c| c.name == name)
        .expect("a configured class")
}

fn class_detail(r: &Rejection) -> ClassDetail {
    ClassDetail::of(
        r.detail()
            .classes
            .as_deref()
            .expect("a class refusal carries class numbers"),
    )
}

fn tokens_in_flight(b: &Bulkhead) -> u64 {
    b.stats().token_budget.unwrap().in_flight_tokens
}

fn class_problem(e: &ConfigError) -> (&str, &ConfigProblem) {
    match &e.problem {
        ConfigProblem::Class { class, problem } => (class.as_str(), problem),
        other => panic!("expected a per-class problem, got {other:?}"),
    }
}

fn invalid(e: ApplyLimitsError) -> ConfigError {
    match e {
        ApplyLimitsError::Invalid(e) => e,
        other => panic!("expected an invalid snapshot, got {other:?}"),
    }
}

// ---- #1 validates a fixed class table and refuses unbounded class creation ----

#[test]
fn t01_validates_a_fixed_class_table_and_refuses_unbounded_class_creation() {
    // defaultClass "missing" → /defaultClass/.
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .class("premium", ClassLimits::default())
        .class("standard", ClassLimits::default())
        .default_class("missing")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "default_class");
    assert_eq!(
        e.problem,
        ConfigProblem::ClassTable("must name a configured class")
    );
    assert!(e.to_string().contains("default_class"), "{e}");

    // maxInFlightTokens without tokenBudget → /requires tokenBudget/.
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "premium",
            ClassLimits {
                max_tokens: Some(1_200),
                ..ClassLimits::default()
            },
        )
        .default_class("premium")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.max_tokens");
    assert_eq!(
        class_problem(&e),
        ("premium", &ConfigProblem::NeedsTokenBudget)
    );
    assert!(e.to_string().contains("requires a token budget"), "{e}");

    // protectedInFlightTokens without tokenBudget → /protectedInFlightTokens requires tokenBudget/.
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "premium",
            ClassLimits {
                protected_tokens: 100,
                ..ClassLimits::default()
            },
        )
        .default_class("premium")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.protected_tokens");
    assert_eq!(
        class_problem(&e),
        ("premium", &ConfigProblem::NeedsTokenBudget)
    );
    assert!(
        e.to_string()
            .contains("classes.protected_tokens requires a token budget"),
        "{e}"
    );

    // A plain bulkhead: `acquire(…, {admissionClass: "standard"})` rejects /requires
    // admissionClasses/. Here a class is named only through `class_id`, which has nothing to
    // resolve (CONTRACT.md §9.6: a typed error before any state changes); a default class
    // without a table is refused at construction.
    let plain = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(2_000)
        .build()
        .unwrap();
    let e = plain.class_id("standard").unwrap_err();
    assert_eq!(e.to_string(), "unknown admission class \"standard\"");
    assert!(plain.class_names().is_empty());
    assert!(plain.stats().classes.is_none());
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .default_class("standard")
        .build()
        .unwrap_err();
    assert_eq!(
        e.problem,
        ConfigProblem::ClassTable("needs admission classes")
    );

    // Unknown "raw-tenant-id" rejects /unknown admissionClass/ and creates nothing.
    let b = classed(4, 2_000);
    let e = b.class_id("raw-tenant-id").unwrap_err();
    assert_eq!(e.0, "raw-tenant-id");
    assert!(e.to_string().contains("unknown admission class"), "{e}");

    // Stats class keys ["premium", "standard"], in construction order.
    assert_eq!(b.class_names(), ["premium", "standard"]);
    let s = b.stats().classes.unwrap();
    let names: Vec<&str> = s.classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["premium", "standard"]);
    assert_eq!(s.default_class, "standard");

    // The table is bounded (behaviour §4.1: fixed keys; here at most MAX_CLASSES entries),
    // names are non-empty after trimming and unique, and a table needs a default class.
    let mut many = Bulkhead::builder().max_concurrent(4);
    for i in 0..=MAX_CLASSES {
        many = many.class(format!("c{i}"), ClassLimits::default());
    }
    let e = many.default_class("c0").build().unwrap_err();
    assert_eq!(e.field, "classes");
    assert_eq!(
        e.problem,
        ConfigProblem::TooLarge {
            value: MAX_CLASSES as u64 + 1,
            max: MAX_CLASSES as u64
        }
    );
    let e = Bulkhead::builder()
        .max_concurrent(1)
        .class("  ", ClassLimits::default())
        .default_class("  ")
        .build()
        .unwrap_err();
    assert_eq!(
        e.problem,
        ConfigProblem::ClassTable("a class name must not be empty")
    );
    let e = Bulkhead::builder()
        .max_concurrent(1)
        .class("a", ClassLimits::default())
        .class("a", ClassLimits::default())
        .default_class("a")
        .build()
        .unwrap_err();
    assert_eq!(
        e.problem,
        ConfigProblem::ClassTable("class names must be unique")
    );
    let e = Bulkhead::builder()
        .max_concurrent(1)
        .class("a", ClassLimits::default())
        .build()
        .unwrap_err();
    assert_eq!(e.field, "default_class");

    // Behaviour §4.1: a class ceiling may exceed the global one; zero floors and ceilings are
    // valid.
    assert!(Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .class("big", ceilings(10, 1_000))
        .class(
            "zero",
            ClassLimits {
                protected_concurrent: 0,
                max_concurrent: Some(0),
                protected_tokens: 0,
                max_tokens: Some(0)
            }
        )
        .default_class("big")
        .build()
        .is_ok());
}

// ---- #2 supports concurrency-only classes without a token budget ----

#[test]
fn t02_supports_concurrency_only_classes_without_a_token_budget() {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .class(
            "premium",
            ClassLimits {
                max_concurrent: Some(2),
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap();
    let first = b.try_acquire(est()).unwrap(); // default class: standard
    assert_eq!(first.class(), Some(b.class_id("standard").unwrap()));
    assert_eq!(first.reservation(), None); // no budget: nothing reserved

    // The reference asks `wouldAdmit(standard, {detail: true})`; try_acquire gives the same
    // decision (and counts the refusal).
    let r = b.try_acquire(into(&b, "standard", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClass));
    let d = class_detail(&r);
    assert_eq!(d.class.id, "standard");
    assert_eq!(d.class.token_budget, None);
    assert_eq!(d.shared.token_budget, None);
    assert_eq!(r.detail().token_budget, None);

    let premium = b.try_acquire(into(&b, "premium", est())).unwrap();
    assert_eq!(premium.class(), Some(b.class_id("premium").unwrap()));
    drop((first, premium));
    assert_eq!(b.stats().in_flight, 0);
}

// ---- #3 enforces class concurrency without consuming another class's headroom ----

#[test]
fn t03_enforces_class_concurrency_without_consuming_another_classs_headroom() {
    let b = classed(4, 2_000);
    let standard = b.class_id("standard").unwrap();
    let s1 = b.try_acquire(into(&b, "standard", est())).unwrap();
    assert_eq!(s1.class(), Some(standard));
    assert_eq!(b.class_names()[standard.index()], "standard");

    let r = b.try_acquire(into(&b, "standard", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClass));
    assert_eq!(r.revision, 0);
    // The whole detail (behaviour §10.1), from the state after the refusal.
    assert_eq!(r.detail().in_flight, 1);
    assert_eq!(r.detail().pending, 0);
    assert_eq!(r.detail().max_concurrent, 4);
    assert_eq!(r.detail().max_queue, 0);
    assert_eq!(
        TokenCapacity::of_opt(&r.detail().token_budget),
        Some(TokenCapacity {
            budget: 2_000,
            in_flight_tokens: 400,
            effective_budget: 2_000,
            available: 1_600,
            requested: 400
        })
    );
    assert_eq!(
        class_detail(&r),
        ClassDetail {
            shared: SharedCapacity {
                concurrency: SharedAmount {
                    capacity: 4,
                    in_use: 1,
                    available: 3,
                    requested_borrowed: 1
                },
                token_budget: Some(SharedAmount {
                    capacity: 2_000,
                    in_use: 400,
                    available: 1_600,
                    requested_borrowed: 400
                }),
            },
            class: ClassCapacity {
                id: "standard".into(),
                in_flight: 1,
                protected_concurrent: 0,
                protected_concurrent_in_use: 0,
                borrowed_concurrent: 1,
                available_protected_concurrent: 0,
                max_concurrent: Some(1),
                available_concurrent: Some(0),
                token_budget: Some(ClassTokenCapacity {
                    in_flight_tokens: 400,
                    protected_tokens: 0,
                    protected_tokens_in_use: 0,
                    borrowed_tokens: 400,
                    available_protected_tokens: 0,
                    max_tokens: Some(800),
                    available: Some(400),
                    requested: 400
                }),
            },
        }
    );

    let p1 = b.try_acquire(into(&b, "premium", est())).unwrap();
    assert_eq!(b.stats().in_flight, 2);
    let s = class_stats(&b, "standard");
    assert_eq!((s.in_flight, s.admitted, s.rejected), (1, 1, 1));
    assert_eq!(s.rejected_by_reason.concurrency_limit, 1);
    assert_eq!(s.rejected_by_reason.total(), 1);
    assert_eq!(class_stats(&b, "premium").in_flight, 1);

    s1.release(None).unwrap();
    p1.release(None).unwrap();
    assert_eq!(class_stats(&b, "standard").in_flight, 0);
    assert_eq!(class_stats(&b, "premium").in_flight, 0);
    assert_eq!(b.stats().in_flight, 0);
}

// ---- #4 enforces and progressively reconciles class token ceilings ----

#[test]
fn t04_enforces_and_progressively_reconciles_class_token_ceilings() {
    let b = classed(4, 4_000);
    let standard = b.class_id("standard").unwrap();
    let mut s1 = b.try_acquire(into(&b, "standard", est())).unwrap();

    b.apply_limits(
        b.limits()
            .with_revision(1)
            .with_max_concurrent(4)
            .with_max_queue(0)
            .with_token_budget(Some(BudgetLimits {
                budget: 4_000,
                high_priority_reserve: 0,
            }))
            .with_class(standard, ceilings(2, 700)),
    )
    .unwrap();

    let r = b.try_acquire(into(&b, "standard", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClass));
    assert_eq!(r.revision, 1);
    let t = class_detail(&r).class.token_budget.unwrap();
    assert_eq!(
        (t.in_flight_tokens, t.max_tokens, t.available, t.requested),
        (400, Some(700), Some(300), 400)
    );

    let report = s1
        .report_usage_reconciled(
            Usage::new(100, 10),
            Reconcile {
                remaining_output: 50,
                safety_margin: 10,
            },
        )
        .unwrap();
    assert_eq!(s1.class(), Some(standard)); // the reference's report carries admissionClass
    assert_eq!(report.held, 60);
    let s = class_stats(&b, "standard");
    assert_eq!(
        (s.in_flight_tokens, s.total_reserved, s.total_refunded),
        (60, 400, 340)
    );

    let s2 = b.try_acquire(into(&b, "standard", est())).unwrap();
    assert_eq!(class_stats(&b, "standard").in_flight_tokens, 460);

    s1.release(Some(Usage::new(100, 10))).unwrap();
    s2.release(Some(Usage::new(100, 20))).unwrap();
    let s = class_stats(&b, "standard");
    assert_eq!(
        (
            s.in_flight,
            s.in_flight_tokens,
            s.released,
            s.total_consumed
        ),
        (0, 0, 2, 230)
    );
    // Not asserted by the reference, but implied by CONTRACT.md §5: 340 from the report,
    // then 0 (hold 60 < 110 consumed) and 280 (400 − 120) at release.
    assert_eq!(s.total_refunded, 620);
    assert_eq!(tokens_in_flight(&b), 0);
}

// ---- #5 distinguishes global and class capacity constraints ----

#[test]
fn t05_distinguishes_global_and_class_capacity_constraints() {
    let b = classed(1, 4_000);
    let p = b.try_acquire(into(&b, "premium", est())).unwrap();
    // The reference uses wouldAdmit(standard, detail).
    let r = b.try_acquire(into(&b, "standard", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::Global));
    assert_eq!((r.detail().in_flight, r.detail().max_concurrent), (1, 1));
    let d = class_detail(&r);
    assert_eq!((d.class.id.as_str(), d.class.in_flight), ("standard", 0));
    // The tentative class step was undone: standard holds nothing.
    assert_eq!(class_stats(&b, "standard").in_flight, 0);
    assert_eq!(class_stats(&b, "standard").in_flight_tokens, 0);
    drop(p);
}

// ---- #6 atomically reconfigures the fixed class keys and shrinks by attrition ----

#[test]
fn t06_atomically_reconfigures_the_fixed_class_keys_and_shrinks_by_attrition() {
    let b = classed(4, 2_000);
    let premium = b.class_id("premium").unwrap();
    let standard = b.class_id("standard").unwrap();
    let l = b.limits();
    assert_eq!(l.revision, 0);
    assert_eq!((l.max_concurrent, l.max_queue), (4, 0));
    assert_eq!(
        l.token_budget,
        Some(BudgetLimits {
            budget: 2_000,
            high_priority_reserve: 0
        })
    );
    let table: Vec<ClassLimits> = l.classes.iter().copied().collect();
    assert_eq!(table, [ceilings(2, 1_200), ceilings(1, 800)]);
    assert_eq!(b.stats().limits, l);
    // "Frozen": a snapshot is a value; changing a copy changes nothing.
    let mut copy = b.limits();
    copy.max_concurrent = 99;
    copy.classes = Default::default();
    assert_ne!(copy, l);
    assert_eq!(b.limits(), l);

    // A missing key or an extra key `dynamicTenant` → /exactly the construction-time class
    // keys/. Classes are positional here, so the gateway-shaped JSON path is what can carry
    // the wrong number of entries (a renamed key is not expressible: CONTRACT.md §9.6).
    let json = serde_json::to_value(l.with_revision(1)).unwrap();
    let mut missing = json.clone();
    missing["classes"].as_array_mut().unwrap().pop();
    let missing: LimitsSnapshot = serde_json::from_value(missing).unwrap();
    let e = invalid(b.apply_limits(missing).unwrap_err());
    assert_eq!(e.field, "classes");
    assert_eq!(
        e.problem,
        ConfigProblem::ClassCount {
            expected: 2,
            got: 1
        }
    );
    assert!(
        e.to_string()
            .contains("exactly the construction-time class keys"),
        "{e}"
    );
    let mut extra = json.clone();
    let dynamic_tenant = serde_json::to_value(ClassLimits::default()).unwrap();
    extra["classes"]
        .as_array_mut()
        .unwrap()
        .push(dynamic_tenant);
    let extra: LimitsSnapshot = serde_json::from_value(extra).unwrap();
    let e = invalid(b.apply_limits(extra).unwrap_err());
    assert_eq!(
        e.problem,
        ConfigProblem::ClassCount {
            expected: 2,
            got: 3
        }
    );
    assert!(
        e.to_string()
            .contains("exactly the construction-time class keys"),
        "{e}"
    );
    assert_eq!(b.limits(), l);

    // standard maxConcurrent −1 (other fields 99) → /maxConcurrent/, limits unchanged. A
    // negative value cannot be represented (CONTRACT.md §9.6), not even through JSON; the
    // out-of-range value closest to it is one above the packed field's bound.
    let mut negative = json.clone();
    negative["classes"][1]["max_concurrent"] = serde_json::json!(-1);
    assert!(serde_json::from_value::<LimitsSnapshot>(negative).is_err());
    let bad = ClassLimits {
        protected_concurrent: 99,
        max_concurrent: Some(MAX_CLASSED_SLOTS + 1),
        protected_tokens: 99,
        max_tokens: Some(99),
    };
    let e = invalid(
        b.apply_limits(l.with_revision(1).with_class(standard, bad))
            .unwrap_err(),
    );
    assert_eq!(e.field, "classes.max_concurrent");
    assert_eq!(
        class_problem(&e),
        (
            "standard",
            &ConfigProblem::TooLarge {
                value: u64::from(MAX_CLASSED_SLOTS) + 1,
                max: u64::from(MAX_CLASSED_SLOTS)
            }
        )
    );
    assert!(e.to_string().contains("max_concurrent"), "{e}");
    assert_eq!(b.limits(), l);

    // Floors premium 3 + standard 2 (sum 5 > 4) → /protectedConcurrent sum/, unchanged.
    let floors = l
        .with_revision(1)
        .with_class(
            premium,
            ClassLimits {
                protected_concurrent: 3,
                ..ClassLimits::default()
            },
        )
        .with_class(
            standard,
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        );
    let e = invalid(b.apply_limits(floors).unwrap_err());
    assert_eq!(e.field, "classes.protected_concurrent");
    assert_eq!(
        e.problem,
        ConfigProblem::FloorsExceedLimit { sum: 5, limit: 4 }
    );
    assert!(e.to_string().contains("protected_concurrent sum"), "{e}");
    assert_eq!(b.limits(), l);

    // Premium held; premium {maxConcurrent 0, maxInFlightTokens 0} is applied and revokes
    // nothing; a new premium gets budget_limit/admission_class (the class token ceiling is
    // checked before the class concurrency ceiling).
    let held = b.try_acquire(into(&b, "premium", est())).unwrap();
    let change = b
        .apply_limits(l.with_revision(1).with_class(premium, ceilings(0, 0)))
        .unwrap();
    assert_eq!(change.previous, l);
    assert_eq!(b.limits().classes.get(premium), Some(&ceilings(0, 0)));
    assert_eq!(class_stats(&b, "premium").in_flight, 1);
    let r = b.try_acquire(into(&b, "premium", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClass));
    assert_eq!(held.revision(), 0);
    held.release(None).unwrap();
    assert_eq!(class_stats(&b, "premium").in_flight, 0);
}

// ---- #7 partitions deduplication by class and validates every caller ----
// Skipped: admission_classes.test.ts #7 is about in-flight deduplication, which the crate
// does not have yet (the unknown-class part is covered by #1).

// ---- #8 rechecks class capacity after a queued request receives a global slot ----

#[test]
fn t08_class_capacity_is_checked_against_the_newest_snapshot() {
    // Skipped part: admission_classes.test.ts #8's queued waiter and its hand-off (no wait
    // queue yet). Ported: the same decisions made by try_acquire, which answers
    // concurrency_limit where the reference would queue (CONTRACT.md §2, last row).
    let b = Bulkhead::builder()
        .max_concurrent(1)
        .max_queue(1)
        .class(
            "premium",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap();
    let standard = b.class_id("standard").unwrap();
    let p = b.try_acquire(into(&b, "premium", Demand::slot())).unwrap();
    let r = b.try_acquire(Demand::slot()).unwrap_err();
    assert_eq!(
        (r.reason, r.constraint),
        (RejectReason::ConcurrencyLimit, Some(Constraint::Global))
    );
    b.apply_limits(b.limits().with_revision(1).with_class(
        standard,
        ClassLimits {
            max_concurrent: Some(0),
            ..ClassLimits::default()
        },
    ))
    .unwrap();
    p.release(None).unwrap();
    let r = b.try_acquire(Demand::slot()).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClass));
    assert_eq!(r.revision, 1);
    let d = class_detail(&r);
    assert_eq!(
        (d.class.id.as_str(), d.class.max_concurrent),
        ("standard", Some(0))
    );
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
}

// ---- #9 carries the class through events, run context, and observe bypasses ----

#[test]
fn t09_carries_the_class_on_the_admission() {
    // The run context, events and observe-mode bypass of admission_classes.test.ts #9 are
    // in tests/observe.rs (classes_t9_…). Ported here: the admission carries its class, named
    // or default.
    let b = classed(4, 2_000);
    let p = b.try_acquire(into(&b, "premium", est())).unwrap();
    assert_eq!(p.class(), Some(b.class_id("premium").unwrap()));
    p.release(Some(Usage::new(100, 20))).unwrap();
    let d = b.try_acquire(est()).unwrap();
    assert_eq!(d.class(), Some(b.class_id("standard").unwrap()));
    let s = class_stats(&b, "premium");
    assert_eq!((s.admitted, s.released, s.total_consumed), (1, 1, 120));
}

// ---- #10 validates protected floors against class and global limits ----

#[test]
fn t10_validates_protected_floors_against_class_and_global_limits() {
    // premium {protectedConcurrent 2, maxConcurrent 1} → /protectedConcurrent must be <=/.
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .class("standard", ClassLimits::default())
        .default_class("standard")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.protected_concurrent");
    assert_eq!(
        class_problem(&e),
        (
            "premium",
            &ConfigProblem::FloorAboveCeiling {
                floor: 2,
                ceiling: 1
            }
        )
    );
    assert!(
        e.to_string()
            .contains("protected_concurrent = 2 must be <="),
        "{e}"
    );

    // Token floor above its own ceiling, the same rule.
    let e = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(1_000)
        .class(
            "premium",
            ClassLimits {
                protected_tokens: 500,
                max_tokens: Some(400),
                ..ClassLimits::default()
            },
        )
        .default_class("premium")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.protected_tokens");
    assert_eq!(
        class_problem(&e),
        (
            "premium",
            &ConfigProblem::FloorAboveCeiling {
                floor: 500,
                ceiling: 400
            }
        )
    );

    // Global maxConcurrent 2 with floors 2 + 1 → /protectedConcurrent sum/.
    let e = Bulkhead::builder()
        .max_concurrent(2)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                protected_concurrent: 1,
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.protected_concurrent");
    assert_eq!(
        e.problem,
        ConfigProblem::FloorsExceedLimit { sum: 3, limit: 2 }
    );
    assert!(e.to_string().contains("protected_concurrent sum"), "{e}");

    // Budget 1000 with token floors 700 + 400 → /protectedInFlightTokens sum/.
    let e = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(1_000)
        .class(
            "premium",
            ClassLimits {
                protected_tokens: 700,
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                protected_tokens: 400,
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap_err();
    assert_eq!(e.field, "classes.protected_tokens");
    assert_eq!(
        e.problem,
        ConfigProblem::FloorsExceedLimit {
            sum: 1_100,
            limit: 1_000
        }
    );
    assert!(e.to_string().contains("protected_tokens sum"), "{e}");

    // Exactly filling both limits is valid.
    assert!(Bulkhead::builder()
        .max_concurrent(3)
        .token_budget(1_100)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 2,
                protected_tokens: 700,
                ..ClassLimits::default()
            }
        )
        .class(
            "standard",
            ClassLimits {
                protected_concurrent: 1,
                protected_tokens: 400,
                ..ClassLimits::default()
            }
        )
        .default_class("standard")
        .build()
        .is_ok());
}

// ---- #11 protects class concurrency floors and accounts shared borrowing (behaviour §4.4) ----

#[test]
fn t11_protects_class_concurrency_floors_and_accounts_shared_borrowing() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(4),
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                protected_concurrent: 1,
                max_concurrent: Some(4),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap();
    let premium: Vec<_> = admit_n(&b, 3, into(&b, "premium", Demand::slot()));
    // Behaviour §4.4: #1 and #2 are protected, #3 borrows.
    let borrowed: Vec<bool> = premium
        .iter()
        .map(|a| a.resources().borrowed_concurrency)
        .collect();
    assert_eq!(borrowed, [false, false, true]);

    let r = b
        .try_acquire(into(&b, "premium", Demand::slot()))
        .unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));
    assert_eq!(
        (
            r.detail().in_flight,
            r.detail().max_concurrent,
            r.detail().token_budget
        ),
        (3, 4, None)
    );
    assert_eq!(
        class_detail(&r),
        ClassDetail {
            shared: SharedCapacity {
                concurrency: SharedAmount {
                    capacity: 1,
                    in_use: 1,
                    available: 0,
                    requested_borrowed: 1
                },
                token_budget: None,
            },
            class: ClassCapacity {
                id: "premium".into(),
                in_flight: 3,
                protected_concurrent: 2,
                protected_concurrent_in_use: 2,
                borrowed_concurrent: 1,
                available_protected_concurrent: 0,
                max_concurrent: Some(4),
                available_concurrent: Some(1),
                token_budget: None,
            },
        }
    );

    // Standard is admitted inside its floor.
    let s1 = b.try_acquire(Demand::slot()).unwrap();
    assert_eq!(Resources::of(s1.resources()), Resources::default());
    let shared = b.stats().classes.unwrap().shared;
    assert_eq!(
        (
            shared.max_concurrent,
            shared.in_flight,
            shared.available_concurrent
        ),
        (1, 1, 0)
    );
    assert_eq!(shared.token_budget, None);
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.protected_concurrent_in_use,
            p.borrowed_concurrent,
            p.total_borrowed_admissions
        ),
        (2, 1, 1)
    );
    assert_eq!(p.rejected_by_reason.concurrency_limit, 1);
    let s = class_stats(&b, "standard");
    assert_eq!(
        (s.protected_concurrent_in_use, s.borrowed_concurrent),
        (1, 0)
    );
    assert_eq!(s.total_borrowed_admissions, 0);
    drop((premium, s1));
    assert_eq!(b.stats().in_flight, 0);
}

// ---- #12 protects token floors and reports borrowed token reservations (behaviour §4.4) ----

#[test]
fn t12_protects_token_floors_and_reports_borrowed_token_reservations() {
    let b = Bulkhead::builder()
        .max_concurrent(10)
        .token_budget(2_000)
        .class(
            "premium",
            ClassLimits {
                protected_tokens: 400,
                max_tokens: Some(2_000),
                ..ClassLimits::default()
            },
        )
        .class(
            "standard",
            ClassLimits {
                protected_tokens: 800,
                max_tokens: Some(2_000),
                ..ClassLimits::default()
            },
        )
        .default_class("standard")
        .build()
        .unwrap();
    let premium: Vec<_> = admit_n(&b, 3, into(&b, "premium", est()));
    // Behaviour §4.4: borrowT 0, 400, 400; no concurrency floor, so every slot is borrowed.
    let attributed: Vec<Resources> = premium
        .iter()
        .map(|a| Resources::of(a.resources()))
        .collect();
    let borrowed = |t| Resources {
        borrowed_concurrency: true,
        borrowed_tokens: t,
    };
    assert_eq!(attributed, [borrowed(0), borrowed(400), borrowed(400)]);

    // The reference asks wouldAdmit for the 4th premium.
    let r = b.try_acquire(into(&b, "premium", est())).unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));
    assert_eq!(
        TokenCapacity::of_opt(&r.detail().token_budget),
        Some(TokenCapacity {
            budget: 2_000,
            in_flight_tokens: 1_200,
            effective_budget: 2_000,
            available: 800,
            requested: 400
        })
    );
    assert_eq!(
        class_detail(&r),
        ClassDetail {
            shared: SharedCapacity {
                concurrency: SharedAmount {
                    capacity: 10,
                    in_use: 3,
                    available: 7,
                    requested_borrowed: 1
                },
                token_budget: Some(SharedAmount {
                    capacity: 800,
                    in_use: 800,
                    available: 0,
                    requested_borrowed: 400
                }),
            },
            class: ClassCapacity {
                id: "premium".into(),
                in_flight: 3,
                protected_concurrent: 0,
                protected_concurrent_in_use: 0,
                borrowed_concurrent: 3,
                available_protected_concurrent: 0,
                max_concurrent: None,
                available_concurrent: None,
                token_budget: Some(ClassTokenCapacity {
                    in_flight_tokens: 1_200,
                    protected_tokens: 400,
                    protected_tokens_in_use: 400,
                    borrowed_tokens: 800,
                    available_protected_tokens: 0,
                    max_tokens: Some(2_000),
                    available: Some(800),
                    requested: 400
                }),
            },
        }
    );

    let standard: Vec<_> = admit_n(&b, 2, est());
    for a in &standard {
        assert_eq!(Resources::of(a.resources()), borrowed(0)); // inside standard's token floor
    }
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.protected_tokens_in_use,
            p.borrowed_in_flight_tokens,
            p.total_borrowed_tokens_reserved
        ),
        (400, 800, 800)
    );
    let s = class_stats(&b, "standard");
    assert_eq!(
        (s.protected_tokens_in_use, s.borrowed_in_flight_tokens),
        (800, 0)
    );
    assert_eq!(s.total_borrowed_tokens_reserved, 0);
    // §10.3: the shared token remainder in stats, from the raw budget.
    let shared = b.stats().classes.unwrap().shared.token_budget.unwrap();
    assert_eq!(
        (shared.budget, shared.in_flight_tokens, shared.available),
        (800, 800, 0)
    );
    assert_eq!(tokens_in_flight(&b), 2_000);
    drop((premium, standard));
    assert_eq!(tokens_in_flight(&b), 0);
    // Attribution is cumulative and never changes afterwards.
    assert_eq!(
        class_stats(&b, "premium").total_borrowed_tokens_reserved,
        800
    );
}

// ---- #13 restores raised floors by attrition without revoking active work (behaviour §4.6) ----

#[test]
fn t13_restores_raised_floors_by_attrition_without_revoking_active_work() {
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .class("premium", ClassLimits::default())
        .class("standard", ClassLimits::default())
        .default_class("standard")
        .build()
        .unwrap();
    let premium = b.class_id("premium").unwrap();
    let standard = b.class_id("standard").unwrap();
    // The reference issues these three in one tick (Promise.all); with no floors yet, the
    // same-tick protection race (CONTRACT.md §9.4) cannot bite, and here they are sequential.
    let mut held: Vec<_> = admit_n(&b, 3, Demand::slot().in_class(premium));

    b.apply_limits(
        b.limits()
            .with_revision(1)
            .with_class(
                premium,
                ClassLimits {
                    protected_concurrent: 1,
                    ..ClassLimits::default()
                },
            )
            .with_class(
                standard,
                ClassLimits {
                    protected_concurrent: 2,
                    ..ClassLimits::default()
                },
            ),
    )
    .unwrap();
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.in_flight,
            p.protected_concurrent_in_use,
            p.borrowed_concurrent
        ),
        (3, 1, 2)
    );
    // Behaviour §4.6: the shared remainder is over-used (2 of 1) until attrition.
    let shared = b.stats().classes.unwrap().shared;
    assert_eq!(
        (
            shared.max_concurrent,
            shared.in_flight,
            shared.available_concurrent
        ),
        (1, 2, 0)
    );

    let r = b.try_acquire(Demand::slot().in_class(premium)).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));
    let c = class_detail(&r).shared.concurrency;
    assert_eq!((c.capacity, c.in_use, c.available), (1, 2, 0));

    let s1 = b.try_acquire(Demand::slot()).unwrap(); // inside standard's floor (global 4/4)
    assert!(!s1.resources().borrowed_concurrency);
    let r = b.try_acquire(Demand::slot()).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::Global));

    held.pop().unwrap().release(None).unwrap();
    let s2 = b.try_acquire(Demand::slot()).unwrap();
    assert!(!s2.resources().borrowed_concurrency);
    assert_eq!(b.stats().in_flight, 4);
    // Still over the shared capacity: new borrowing stays paused.
    let r = b.try_acquire(Demand::slot().in_class(premium)).unwrap_err();
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));
    drop((held, s1, s2));
    assert_eq!(b.stats().in_flight, 0);
}

// ---- behaviour §2.2: rule order with classes (ran e8 #40) ----

#[test]
fn class_rules_are_checked_in_order() {
    // Floors of `f` bind everything shared (Σ floors = both global limits).
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .class("x", ceilings(0, 10))
        .class(
            "y",
            ClassLimits {
                max_concurrent: Some(0),
                ..ClassLimits::default()
            },
        )
        .class(
            "f",
            ClassLimits {
                protected_concurrent: 2,
                protected_tokens: 100,
                ..ClassLimits::default()
            },
        )
        .class("z", ClassLimits::default())
        .default_class("f")
        .build()
        .unwrap();
    let sixty = res(30, 30);
    let outcome = |name: &str| {
        let r = b.try_acquire(into(&b, name, sixty)).unwrap_err();
        (r.reason, r.constraint.unwrap())
    };
    // {maxConcurrent 0, maxInFlightTokens 10}, 60 tokens: rule 2 beats rule 3.
    assert_eq!(
        outcome("x"),
        (RejectReason::BudgetLimit, Constraint::AdmissionClass)
    );
    // Class ceiling maxConcurrent 0 while another class's floors bind: rule 3.
    assert_eq!(
        outcome("y"),
        (RejectReason::ConcurrencyLimit, Constraint::AdmissionClass)
    );
    // Both protection rules bind: rule 4 first.
    assert_eq!(
        outcome("z"),
        (
            RejectReason::ConcurrencyLimit,
            Constraint::AdmissionClassProtection
        )
    );
    // The global budget exhausted as well: rule 1 first.
    let f = b.try_acquire(res(50, 50)).unwrap();
    assert_eq!(f.resources().borrowed_tokens, 0);
    for name in ["x", "y", "z"] {
        assert_eq!(
            outcome(name),
            (RejectReason::BudgetLimit, Constraint::Global)
        );
    }
    drop(f);
}

// ---- behaviour §4.4: resources without floors, and without classes ----

#[test]
fn resources_without_floors_mark_everything_borrowed() {
    // Behaviour §4.4 (ran e5 #23): no class anywhere has a floor → `{true, r}`.
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .class("a", ClassLimits::default())
        .default_class("a")
        .build()
        .unwrap();
    let a = b.try_acquire(res(1, 1)).unwrap();
    assert_eq!(
        Resources::of(a.resources()),
        Resources {
            borrowed_concurrency: true,
            borrowed_tokens: 2
        }
    );
    let s = class_stats(&b, "a");
    assert_eq!(
        (
            s.total_borrowed_admissions,
            s.total_borrowed_tokens_reserved
        ),
        (1, 2)
    );
    // Without classes: `{false, 0}` always.
    let plain = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .build()
        .unwrap();
    let a = plain.try_acquire(res(1, 1)).unwrap();
    assert_eq!(Resources::of(a.resources()), Resources::default());
    assert_eq!(a.class(), None);
}

// ---- behaviour §4.5: attributing a change in hold ----

#[test]
fn hold_changes_fill_the_floor_first_and_come_off_the_borrowed_part_first() {
    // Ran e4 #18: class floor 500, two admissions of 400.
    let b = Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(2_000)
        .class(
            "a",
            ClassLimits {
                protected_tokens: 500,
                ..ClassLimits::default()
            },
        )
        .default_class("a")
        .build()
        .unwrap();
    let mut a1 = b.try_acquire(est()).unwrap();
    let mut a2 = b.try_acquire(est()).unwrap();
    assert_eq!(a1.resources().borrowed_tokens, 0);
    assert_eq!(a2.resources().borrowed_tokens, 300);
    let s = class_stats(&b, "a");
    assert_eq!(
        (
            s.in_flight_tokens,
            s.protected_tokens_in_use,
            s.borrowed_in_flight_tokens
        ),
        (800, 500, 300)
    );

    // Progressive report on #1 → hold 100: 500 = 500 protected + 0 borrowed.
    let r = a1
        .report_usage_reconciled(
            Usage::new(100, 0),
            Reconcile {
                remaining_output: 100,
                safety_margin: 0,
            },
        )
        .unwrap();
    assert_eq!(r.held, 100);
    let s = class_stats(&b, "a");
    assert_eq!(
        (
            s.in_flight_tokens,
            s.protected_tokens_in_use,
            s.borrowed_in_flight_tokens
        ),
        (500, 500, 0)
    );

    // Overrun on #2 (+300): 800 = 500 + 300.
    let r = a2.report_usage(Usage::new(100, 600)).unwrap();
    assert_eq!((r.held, r.over_reservation), (700, true));
    let s = class_stats(&b, "a");
    assert_eq!(
        (
            s.in_flight_tokens,
            s.protected_tokens_in_use,
            s.borrowed_in_flight_tokens
        ),
        (800, 500, 300)
    );
    assert_eq!(s.total_overrun, 300);
    assert_eq!(b.stats().token_budget.unwrap().total_overrun, 300);
    // Attribution fixed at admission never changes.
    assert_eq!(a1.resources().borrowed_tokens, 0);
    assert_eq!(a2.resources().borrowed_tokens, 300);
    assert_eq!(s.total_borrowed_tokens_reserved, 300);
    drop((a1, a2));
    assert_eq!(class_stats(&b, "a").in_flight_tokens, 0);
    assert_eq!(tokens_in_flight(&b), 0);
}

// ---- behaviour §4.8: interplay with the high-priority reserve (B12) ----

#[test]
fn token_floors_and_the_high_priority_reserve() {
    // B = 1000, H = 500, class floor 800 (floors are validated against B, not B − H).
    let b = Bulkhead::builder()
        .max_concurrent(10)
        .token_budget(1_000)
        .high_priority_reserve(500)
        .class(
            "a",
            ClassLimits {
                protected_tokens: 800,
                ..ClassLimits::default()
            },
        )
        .class("b", ClassLimits::default())
        .default_class("a")
        .build()
        .unwrap();
    let three_hundred = res(100, 200);

    // Normal requests of the floored class stop at 300.
    let n1 = b.try_acquire(three_hundred).unwrap();
    assert_eq!(n1.resources().borrowed_tokens, 0);
    let r = b.try_acquire(three_hundred).unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    assert_eq!(r.constraint, Some(Constraint::Global));
    assert_eq!(
        TokenCapacity::of_opt(&r.detail().token_budget),
        Some(TokenCapacity {
            budget: 1_000,
            in_flight_tokens: 300,
            effective_budget: 500,
            available: 200,
            requested: 300
        })
    );
    // At normal priority the shared token capacity is max(0, 500 − 800) = 0.
    assert_eq!(
        class_detail(&r).shared.token_budget,
        Some(SharedAmount {
            capacity: 0,
            in_use: 0,
            available: 0,
            requested_borrowed: 0
        })
    );

    // A high-priority one still gets in (inside the floor).
    let h1 = b
        .try_acquire(three_hundred.with_priority(Priority::High))
        .unwrap();
    assert_eq!(h1.resources().borrowed_tokens, 0);
    assert_eq!(tokens_in_flight(&b), 600);

    // Another class at high priority: shared capacity 1000 − 800 = 200.
    let r = b
        .try_acquire(into(&b, "b", three_hundred).with_priority(Priority::High))
        .unwrap_err();
    assert_eq!(r.reason, RejectReason::BudgetLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));
    assert_eq!(
        class_detail(&r).shared.token_budget,
        Some(SharedAmount {
            capacity: 200,
            in_use: 0,
            available: 200,
            requested_borrowed: 300
        })
    );
    let b1 = b
        .try_acquire(into(&b, "b", res(100, 100)).with_priority(Priority::High))
        .unwrap();
    assert_eq!(b1.resources().borrowed_tokens, 200);
    // Stats use the raw budget (B16): 1000 − 800 = 200, all in use.
    let shared = b.stats().classes.unwrap().shared.token_budget.unwrap();
    assert_eq!(
        (shared.budget, shared.in_flight_tokens, shared.available),
        (200, 200, 0)
    );
    drop((n1, h1, b1));
    assert_eq!(tokens_in_flight(&b), 0);
}

// ---- behaviour §6.1: manual abandonment ----

#[test]
fn manual_abandonment_returns_a_borrowed_slot_and_keeps_the_tokens() {
    // Always false without classes.
    let plain = Bulkhead::builder()
        .max_concurrent(1)
        .token_budget(1_000)
        .build()
        .unwrap();
    let mut a = plain.try_acquire(res(100, 200)).unwrap();
    assert!(!a.abandon_borrowed_concurrency());
    assert_eq!(plain.stats().in_flight, 1);
    assert_eq!(plain.stats().borrowed_concurrency_abandoned, 0);
    drop(a);

    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(1_000)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 1,
                ..ClassLimits::default()
            },
        )
        .class("standard", ClassLimits::default())
        .default_class("standard")
        .build()
        .unwrap();
    let mut p1 = b.try_acquire(into(&b, "premium", res(100, 200))).unwrap();
    // False for a protected slot (no token floor: the whole reservation is borrowed tokens).
    assert_eq!(
        Resources::of(p1.resources()),
        Resources {
            borrowed_concurrency: false,
            borrowed_tokens: 300
        }
    );
    assert!(!p1.abandon_borrowed_concurrency());
    let mut p2 = b.try_acquire(into(&b, "premium", res(100, 200))).unwrap();
    assert!(p2.resources().borrowed_concurrency);
    // Global 2/2; standard would borrow past the remainder.
    let r = b.try_acquire(Demand::slot()).unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    assert_eq!(r.constraint, Some(Constraint::AdmissionClassProtection));

    // True once; the slot (and premium's concurrency) come back, the tokens stay held.
    assert!(p2.abandon_borrowed_concurrency());
    assert!(!p2.abandon_borrowed_concurrency());
    assert_eq!(p2.held(), 300);
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight, s.released), (1, 2, 0));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 600);
    assert_eq!(s.borrowed_concurrency_abandoned, 1);
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.in_flight,
            p.in_flight_tokens,
            p.borrowed_concurrency_abandoned
        ),
        (1, 600, 1)
    );
    assert_eq!(p.released, 0);
    // The returned slot is usable at once.
    let s1 = b.try_acquire(Demand::slot()).unwrap();
    assert_eq!(b.stats().in_flight, 2);
    s1.release(None).unwrap();

    // A later release settles the tokens and does not return the slot again.
    let report = p2.release(Some(Usage::new(100, 150))).unwrap();
    assert_eq!(
        (report.held, report.consumed, report.refunded),
        (300, Some(250), 50)
    );
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight), (1, 1));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 300);
    assert_eq!(s.borrowed_concurrency_abandoned, 1);
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.in_flight,
            p.in_flight_tokens,
            p.released,
            p.borrowed_concurrency_abandoned
        ),
        (1, 300, 1, 1)
    );
    // `abandon` after release cannot be written: `release` consumes the admission.

    p1.release(None).unwrap();
    let s = b.stats();
    assert_eq!((s.in_flight, s.admissions_in_flight, s.released), (0, 0, 3));
    assert_eq!(s.token_budget.unwrap().in_flight_tokens, 0);
    let p = class_stats(&b, "premium");
    assert_eq!((p.in_flight, p.in_flight_tokens, p.released), (0, 0, 2));
}

#[test]
fn a_class_without_a_floor_can_always_abandon() {
    // Behaviour §4.4/§6.1: with classes, an admission in a class without a concurrency floor
    // is always borrowed, so abandonment works for it; dropping it later settles the tokens.
    let b = classed(1, 2_000);
    let mut s1 = b.try_acquire(est()).unwrap();
    assert!(s1.abandon_borrowed_concurrency());
    assert_eq!(b.stats().in_flight, 0);
    // The class's own concurrency came back too (standard's ceiling is 1).
    let s2 = b.try_acquire(est()).unwrap();
    assert_eq!(class_stats(&b, "standard").in_flight, 1);
    assert_eq!(tokens_in_flight(&b), 800);
    // The abandoned admission's hold is still accounted: a report still moves it, in the
    // class and globally.
    let r = s1
        .report_usage_reconciled(
            Usage::new(100, 0),
            Reconcile {
                remaining_output: 100,
                safety_margin: 0,
            },
        )
        .unwrap();
    assert_eq!(r.held, 100);
    assert_eq!(tokens_in_flight(&b), 500);
    assert_eq!(class_stats(&b, "standard").in_flight_tokens, 500);
    assert_eq!(class_stats(&b, "standard").total_refunded, 300);
    drop(s1);
    assert_eq!(tokens_in_flight(&b), 400);
    assert_eq!(class_stats(&b, "standard").in_flight_tokens, 400);
    assert_eq!(b.stats().in_flight, 1);
    drop(s2);
    assert_eq!(
        (
            b.stats().in_flight,
            b.stats().admissions_in_flight,
            tokens_in_flight(&b)
        ),
        (0, 0, 0)
    );
}

// ---- CONTRACT.md §9 deliberate differences, with classes ----

#[test]
fn shutdown_wins_over_class_reasons() {
    // CONTRACT.md §9.1: the reference lets a class reason win over shutdown (B1); the
    // contract checks shutdown first, with no constraint (behaviour §4.7).
    let b = classed(4, 2_000);
    let s1 = b.try_acquire(est()).unwrap();
    b.close();
    let r = b.try_acquire(est()).unwrap_err(); // standard's ceiling would refuse too
    assert_eq!((r.reason, r.constraint), (RejectReason::Shutdown, None));
    drop(s1);
}

#[test]
fn protection_check_has_no_same_tick_race() {
    // Behaviour §12 B7: maxConcurrent 2, classes {P: {}, S: {protectedConcurrent 1}};
    // `Promise.all([acquire(S), acquire(P)])` refuses P in the reference, sequentially both
    // succeed. CONTRACT.md §9.4: a decision never counts another's tentative step, so both
    // orders admit both.
    for p_first in [false, true] {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .class("P", ClassLimits::default())
            .class(
                "S",
                ClassLimits {
                    protected_concurrent: 1,
                    ..ClassLimits::default()
                },
            )
            .default_class("S")
            .build()
            .unwrap();
        let p = into(&b, "P", Demand::slot());
        let s = into(&b, "S", Demand::slot());
        let order = if p_first { [p, s] } else { [s, p] };
        let held: Vec<_> = order.iter().map(|d| b.try_acquire(*d).unwrap()).collect();
        let shared = b.stats().classes.unwrap().shared;
        assert_eq!((shared.max_concurrent, shared.in_flight), (1, 1));
        drop(held);
    }
}

// ---- the seed's worked example (seeds/000_f3b16fdc056bf453.txt) ----

fn seed() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(12)
        .token_budget(24_000)
        .class(
            "premium",
            ClassLimits {
                protected_concurrent: 6,
                max_concurrent: Some(10),
                protected_tokens: 12_000,
                max_tokens: Some(20_000),
            },
        )
        .class(
            "standard",
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(6),
                protected_tokens: 4_000,
                max_tokens: Some(10_000),
            },
        )
        .default_class("standard")
        .build()
        .unwrap()
}

#[test]
fn seed_worked_example_protected_and_shared_remainders() {
    let b = seed();
    // 8 slots and 16,000 tokens protected; 4 slots and 8,000 tokens shared.
    let shared = b.stats().classes.unwrap().shared;
    assert_eq!((shared.max_concurrent, shared.available_concurrent), (4, 4));
    let t = shared.token_budget.unwrap();
    assert_eq!((t.budget, t.available), (8_000, 8_000));

    // Premium uses its floor first (6 slots, 12,000 tokens), then borrows the remainder.
    let premium: Vec<_> = admit_n(&b, 10, into(&b, "premium", res(1_000, 1_000)));
    for (i, a) in premium.iter().enumerate() {
        let borrowed = i >= 6;
        assert_eq!(
            Resources::of(a.resources()),
            Resources {
                borrowed_concurrency: borrowed,
                borrowed_tokens: if borrowed { 2_000 } else { 0 }
            }
        );
    }
    let shared = b.stats().classes.unwrap().shared;
    assert_eq!((shared.in_flight, shared.available_concurrent), (4, 0));
    let t = shared.token_budget.unwrap();
    assert_eq!((t.in_flight_tokens, t.available), (8_000, 0));

    // It cannot take standard's 2 slots / 4,000 tokens (first failure: its token ceiling).
    let r = b
        .try_acquire(into(&b, "premium", res(1_000, 1_000)))
        .unwrap_err();
    assert_eq!(
        (r.reason, r.constraint),
        (RejectReason::BudgetLimit, Some(Constraint::AdmissionClass))
    );
    assert_eq!(b.stats().available_slots, 2);

    // Standard still has them, inside its floors.
    let standard: Vec<_> = admit_n(&b, 2, res(1_000, 1_000));
    for a in &standard {
        assert_eq!(Resources::of(a.resources()), Resources::default());
    }
    assert_eq!((b.stats().in_flight, tokens_in_flight(&b)), (12, 24_000));
    let s = class_stats(&b, "standard");
    assert_eq!(
        (s.protected_concurrent_in_use, s.protected_tokens_in_use),
        (2, 4_000)
    );
    let p = class_stats(&b, "premium");
    assert_eq!(
        (
            p.borrowed_concurrent,
            p.borrowed_in_flight_tokens,
            p.total_borrowed_admissions
        ),
        (4, 8_000, 4)
    );
    assert_eq!(p.total_borrowed_tokens_reserved, 8_000);
    drop((premium, standard));
    assert_eq!((b.stats().in_flight, tokens_in_flight(&b)), (0, 0));
}

#[test]
fn seed_worked_example_floors_alone_protect_standard() {
    // In the seed, premium's ceilings (10 slots, 20,000 tokens) coincide with what the floors
    // leave it. Lifting the ceilings shows the floors alone keep standard's 2 slots and
    // 4,000 tokens: the refusals become admission_class_protection.
    let lifted = |b: &Bulkhead| {
        let premium = b.class_id("premium").unwrap();
        b.apply_limits(b.limits().with_revision(1).with_class(
            premium,
            ClassLimits {
                protected_concurrent: 6,
                protected_tokens: 12_000,
                ..ClassLimits::default()
            },
        ))
        .unwrap();
    };

    // Slots: 10 premium of 2,000 tokens; the 11th would borrow a 5th shared slot.
    let b = seed();
    lifted(&b);
    let premium: Vec<_> = admit_n(&b, 10, into(&b, "premium", res(1_000, 1_000)));
    let r = b
        .try_acquire(into(&b, "premium", res(1_000, 1_000)))
        .unwrap_err();
    assert_eq!(
        (r.reason, r.constraint),
        (
            RejectReason::ConcurrencyLimit,
            Some(Constraint::AdmissionClassProtection)
        )
    );
    assert_eq!(
        class_detail(&r).shared.concurrency,
        SharedAmount {
            capacity: 4,
            in_use: 4,
            available: 0,
            requested_borrowed: 1
        }
    );
    let standard: Vec<_> = admit_n(&b, 2, res(1_000, 1_000));
    drop((premium, standard));

    // Tokens: premium of 4,000 each; 3 fill its 12,000 floor, 2 borrow the 8,000 remainder,
    // the 6th (inside its slot floor) would borrow 4,000 more.
    let b = seed();
    lifted(&b);
    let premium: Vec<_> = admit_n(&b, 5, into(&b, "premium", res(2_000, 2_000)));
    let r = b
        .try_acquire(into(&b, "premium", res(2_000, 2_000)))
        .unwrap_err();
    assert_eq!(
        (r.reason, r.constraint),
        (
            RejectReason::BudgetLimit,
            Some(Constraint::AdmissionClassProtection)
        )
    );
    assert_eq!(
        class_detail(&r).shared.token_budget,
        Some(SharedAmount {
            capacity: 8_000,
            in_use: 8_000,
            available: 0,
            requested_borrowed: 4_000
        })
    );
    assert_eq!(class_detail(&r).shared.concurrency.requested_borrowed, 0);
    let s = b.try_acquire(res(2_000, 2_000)).unwrap();
    assert_eq!(Resources::of(s.resources()), Resources::default());
    assert_eq!(tokens_in_flight(&b), 24_000);
    drop((premium, s));
    assert_eq!(tokens_in_flight(&b), 0);
}
