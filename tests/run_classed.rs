//! `run` on a bulkhead with classes takes the class protocol's fast attempt first (issue 15
//! item 9). What must not change with it: every admission and refusal is counted once, in the
//! right class, with the same events.
#![cfg(feature = "serde")]

#[path = "support/llm.rs"]
mod llm_support;

use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, RunError, RunOptions};
use llm_bulkhead::{
    Bulkhead, Constraint, Demand, Event, QueueTimeout, RejectReason, Reservation, WaitOptions,
};
use llm_support::record;
use std::time::Duration;

fn llm(max_queue: u32) -> LlmBulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .max_queue(max_queue)
        .token_budget(1_000);
    let b = llm_support::premium_and_batch(b).build().unwrap();
    LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(10, 10).unwrap()))
}

#[test]
fn classed_runs_are_counted_once_in_their_class() {
    let llm = llm(0);
    let b = llm.bulkhead().clone();
    let premium = b.class_id("premium").unwrap();
    let (log, _sub) = record(&b);
    let in_premium = RunOptions {
        class: Some(premium),
        ..RunOptions::default()
    };
    let r = llm.run_blocking(&LlmRequest::default(), in_premium.clone(), |ctx| {
        assert_eq!(ctx.class(), Some(premium));
        assert!(!ctx.resources().borrowed_concurrency);
        // Inside: batch takes the shared slot; a second batch run meets batch's ceiling.
        let inner = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| {
            assert!(ctx.resources().borrowed_concurrency);
            let refused = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |_| {
                Ok::<_, ()>(())
            });
            match refused {
                Err(RunError::Rejected(r)) => assert_eq!(r.reason, RejectReason::ConcurrencyLimit),
                other => panic!("{other:?}"),
            }
            Ok::<_, ()>(2)
        });
        Ok::<_, ()>(inner.unwrap())
    });
    assert_eq!(r.unwrap(), 2);
    let s = b.stats();
    assert_eq!((s.admitted, s.released, s.rejected), (2, 2, 1));
    assert_eq!(s.rejected_by_reason.concurrency_limit, 1);
    let classes = s.classes.unwrap().classes;
    assert_eq!(
        (classes[0].admitted, classes[0].total_borrowed_admissions),
        (1, 0)
    );
    assert_eq!(
        (classes[1].admitted, classes[1].total_borrowed_admissions),
        (1, 1)
    );
    assert_eq!(classes[1].rejected, 1);
    assert_eq!(
        (classes[0].total_reserved, classes[1].total_reserved),
        (20, 20)
    );
    let names: Vec<_> = log.lock().unwrap().iter().map(Event::name).collect();
    assert_eq!(names, ["admit", "admit", "reject", "release", "release"]);
}

#[test]
fn a_classed_async_run_is_counted_once_when_refused_with_a_queue() {
    // With a queue, class refusals are never queued: each is counted once.
    let llm = llm(4);
    let b = llm.bulkhead().clone();
    let held = b.try_acquire(Demand::slot()).unwrap(); // batch: at its ceiling
    let r = futures_lite::future::block_on(llm.run(
        &LlmRequest::default(),
        RunOptions::default(),
        async |_| Ok::<_, ()>(()),
    ));
    assert!(
        matches!(r, Err(RunError::Rejected(ref x)) if x.reason == RejectReason::ConcurrencyLimit)
    );
    let premium = b.class_id("premium").unwrap();
    let p = b.try_acquire(Demand::slot().in_class(premium)).unwrap();
    // Both slots are taken: a premium run would borrow the shared slot, which is gone; a
    // class refusal is never queued, whatever the timeout.
    let r = llm.run_blocking(
        &LlmRequest::default(),
        RunOptions {
            class: Some(premium),
            wait: WaitOptions {
                timeout: QueueTimeout::After(Duration::ZERO),
                cancel: None,
            },
            ..RunOptions::default()
        },
        |_| Ok::<_, ()>(()),
    );
    let r = match r {
        Err(RunError::Rejected(x)) => x,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (r.reason, r.constraint),
        (
            RejectReason::ConcurrencyLimit,
            Some(Constraint::AdmissionClassProtection)
        )
    );
    let s = b.stats();
    assert_eq!(s.rejected, 2);
    assert_eq!(
        (
            s.rejected_by_reason.concurrency_limit,
            s.rejected_by_reason.timeout
        ),
        (2, 0)
    );
    let classes = s.classes.unwrap().classes;
    assert_eq!((classes[0].rejected, classes[1].rejected), (1, 1));
    drop((held, p));
}
