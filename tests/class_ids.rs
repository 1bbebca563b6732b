//! Class identities (issue 13 §3): a class of another bulkhead, or any class on a bulkhead
//! without classes, is refused with `RejectReason::UnknownClass` before anything changes, on
//! every entry point, instead of silently becoming the default class.

use futures_lite::future::block_on;
use llm_bulkhead::llm::{
    EstimateError, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions,
};
use llm_bulkhead::{
    Bulkhead, ClassId, ClassLimits, Demand, Event, RejectReason, Reservation, WaitOptions,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Two classes; "premium" (index 0) has a ceiling of 1, "standard" is the default.
fn classed() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(4)
        .token_budget(1_000)
        .class(
            "premium",
            ClassLimits {
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .class("standard", ClassLimits::default())
        .default_class("standard")
        .build()
        .unwrap()
}

/// Every way to ask `b` for `demand`, each of which must refuse it with `UnknownClass`, and
/// leave nothing counted, published or held.
fn assert_refused_everywhere(b: &Bulkhead, demand: Demand) {
    let events = Arc::new(AtomicUsize::new(0));
    let seen = events.clone();
    let _sub = b.subscribe(move |_: &Event| {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    let unknown = |r: Result<llm_bulkhead::Admission, llm_bulkhead::Rejection>| match r {
        Err(rej) => {
            assert_eq!(rej.reason, RejectReason::UnknownClass);
            assert_eq!(rej.revision, 0);
            assert!(
                rej.to_string().contains("not a class of this bulkhead"),
                "{rej}"
            );
        }
        Ok(a) => panic!("admitted into {:?}", a.class()),
    };
    unknown(b.try_acquire(demand));
    unknown(b.acquire_blocking(demand, WaitOptions::default()));
    unknown(block_on(b.acquire(demand, WaitOptions::default())));
    unknown(block_on(b.acquire_timed(demand, WaitOptions::default())).value);
    // Even with a cancelled token: the class is checked first, and no `aborted` is counted.
    let token = llm_bulkhead::CancelToken::new();
    token.cancel();
    let cancelled = WaitOptions {
        cancel: Some(token),
        ..WaitOptions::default()
    };
    unknown(b.acquire_blocking(demand, cancelled.clone()));
    unknown(block_on(b.acquire(demand, cancelled)));
    assert_eq!(
        b.would_admit(&demand).reason(),
        Some(RejectReason::UnknownClass)
    );
    let s = b.stats();
    assert_eq!((s.admitted, s.rejected, s.in_flight), (0, 0, 0), "{s:?}");
    assert_eq!(
        events.load(Ordering::SeqCst),
        0,
        "no event for a caller's error"
    );
}

#[test]
fn a_class_of_another_bulkhead_is_refused_not_mapped_to_the_default_class() {
    let (b, other) = (classed(), classed());
    // Same table, same names, same index: still not this bulkhead's class.
    let foreign = other.class_id("premium").unwrap();
    assert_eq!(foreign.index(), 0);
    assert_ne!(Some(foreign), b.class_id("premium").ok());
    assert_refused_everywhere(&b, Demand::slot().in_class(foreign));
    let tokens = Demand::tokens(Reservation::new(10, 10).unwrap()).in_class(foreign);
    assert_refused_everywhere(&b, tokens);
    // Its own ids work, and an admission's class is one of its own.
    let own = b.class_id("premium").unwrap();
    let a = b.try_acquire(Demand::slot().in_class(own)).unwrap();
    assert_eq!(a.class(), Some(own));
    let again = Demand::slot().in_class(a.class().unwrap());
    assert_eq!(
        b.try_acquire(again).unwrap_err().reason,
        RejectReason::ConcurrencyLimit,
        "the premium ceiling, so the id named premium"
    );
}

#[test]
fn a_class_on_a_bulkhead_without_classes_is_refused() {
    let plain = Bulkhead::builder()
        .max_concurrent(2)
        .max_queue(2)
        .build()
        .unwrap();
    let class = classed().class_id("standard").unwrap();
    assert_refused_everywhere(&plain, Demand::slot().in_class(class));
    assert!(plain.try_acquire(Demand::slot()).is_ok());
}

#[test]
fn a_class_id_serialises_as_its_name_and_is_not_statistics() {
    let b = classed();
    let id: ClassId = b.class_id("standard").unwrap();
    // By name, as events carry it (issue 32 item 6); another bulkhead's class of the same
    // position keeps its own name.
    assert_eq!(serde_json::to_string(&id).unwrap(), r#""standard""#);
    let other = Bulkhead::builder()
        .max_concurrent(1)
        .class("x", llm_bulkhead::ClassLimits::default())
        .class("y", llm_bulkhead::ClassLimits::default())
        .default_class("x")
        .build()
        .unwrap();
    assert_eq!(
        serde_json::to_string(&other.class_id("y").unwrap()).unwrap(),
        r#""y""#
    );
    assert!(!RejectReason::COUNTED.contains(&RejectReason::UnknownClass));
    assert_eq!(RejectReason::UnknownClass.as_str(), "unknown_class");
}

#[test]
fn the_llm_layer_refuses_a_foreign_class_before_estimating_or_running() {
    let llm = LlmBulkhead::new(classed(), NaiveEstimator);
    let foreign = classed().class_id("premium").unwrap();
    let options = || RunOptions {
        class: Some(foreign),
        ..RunOptions::default()
    };
    let invalid =
        |e: &EstimateError| matches!(e, EstimateError::InvalidSetting { field: "class", .. });
    let request = LlmRequest::default();
    assert!(invalid(&llm.estimate(&request, &options()).unwrap_err()));
    assert!(invalid(&llm.would_admit(&request, &options()).unwrap_err()));
    let ran = AtomicUsize::new(0);
    let out = llm.run_blocking(&request, options(), |_| {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>(())
    });
    assert!(
        matches!(out, Err(RunError::Invalid(ref e)) if invalid(e)),
        "{out:?}"
    );
    let out = block_on(llm.run(&request, options(), async |_| -> Result<(), ()> {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }));
    assert!(
        matches!(out, Err(RunError::Invalid(ref e)) if invalid(e)),
        "{out:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let s = llm.bulkhead().stats();
    assert_eq!((s.admitted, s.rejected), (0, 0));
}

/// Compiles only if `T` does not implement `DeserializeOwned` (two blanket impls of one trait
/// make `some_item` ambiguous when it does), the way `static_assertions::assert_not_impl_any`
/// works.
trait AmbiguousIfDeserialize<A> {
    fn some_item() {}
}
impl<T: ?Sized> AmbiguousIfDeserialize<()> for T {}
#[allow(dead_code)]
struct Invalid;
impl<T: serde::de::DeserializeOwned> AmbiguousIfDeserialize<Invalid> for T {}

#[test]
fn a_class_id_cannot_be_forged_from_a_number() {
    // Neither the id nor a demand carrying one deserialises: "7" or "0" cannot become a class.
    <ClassId as AmbiguousIfDeserialize<_>>::some_item();
    <Demand as AmbiguousIfDeserialize<_>>::some_item();
    // Ids of different bulkheads differ even at the same position, and print both parts.
    let (a, b) = (classed(), classed());
    let (x, y) = (
        a.class_id("premium").unwrap(),
        b.class_id("premium").unwrap(),
    );
    assert_ne!(x, y);
    assert_eq!(x.index(), y.index());
    assert_eq!(
        serde_json::to_string(&x).unwrap(),
        serde_json::to_string(&y).unwrap()
    );
    assert!(
        format!("{x:?}").starts_with("ClassId { index: 0, bulkhead: "),
        "{x:?}"
    );
    assert_eq!(std::mem::size_of::<Option<ClassId>>(), 8);
}
