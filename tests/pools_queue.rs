//! The pending queue of a partition, one rule per test, on an injected clock (no sleeps, no
//! timing): age refusal with its own reason, refusal at entry, the global guard's hand-off
//! across partitions, and a cancelled waiter whose start goes on to the next one.

use llm_bulkhead::pools::*;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const AGE_MS: u64 = 60_000;

/// Partitions `p-w` and `q-w` (class `w` waits: `pending` places, a minute of age), one unit
/// each, a global guard of `global`, on a clock the test moves.
fn pools(pending: u64, global: u64) -> (Pools, Arc<AtomicU64>, Instant) {
    let mut c = PoolsConfig::single("p", "w", 1);
    c.extend_with("q", "w", 1);
    c.global.max_active = global;
    c.classes.get_mut("w").unwrap().overflow = Overflow::Wait;
    for p in c.partitions.values_mut() {
        (p.pending_limit, p.queue_max_age_ms) = (pending, AGE_MS);
    }
    let base = Instant::now();
    let ms = Arc::new(AtomicU64::new(0));
    let m = ms.clone();
    let clock = move || base + Duration::from_millis(m.load(Ordering::SeqCst));
    (Pools::with_clock(&c, None, clock).unwrap(), ms, base)
}

fn last(out: &PoolOutcome<'_>) -> (Decision, Reason) {
    let d = *out.route().decisions().last().unwrap();
    (d.decision, d.reason)
}

/// Polls `f` once with a waker that does nothing.
fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::pin::Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_waiter_older_than_the_max_age_is_refused_with_its_own_reason() {
    let (pools, ms, _) = pools(4, 2);
    let id = pools.partition("p-w").unwrap();
    let held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    let mut wait = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    assert!(poll(&mut wait).is_pending());
    ms.store(AGE_MS / 2, Ordering::SeqCst);
    let s = &pools.stats().partitions[0];
    assert_eq!(
        (s.pending, s.oldest_wait),
        (1, Some(Duration::from_millis(AGE_MS / 2)))
    );
    // One waiter: the queue is short, and still its age refuses it.
    ms.store(AGE_MS, Ordering::SeqCst);
    pools.expire_waiters();
    let Poll::Ready(out) = poll(&mut wait) else {
        panic!("the waiter is still queued past its age")
    };
    assert_eq!(last(&out), (Decision::Reject, Reason::QueueAgeExceeded));
    let s = &pools.stats().partitions[0];
    assert_eq!((s.pending, s.timed_out, s.oldest_wait), (0, 1, None));
    drop(held);
}

#[test]
fn a_deadline_nearer_than_the_oldest_wait_is_refused_at_entry() {
    let (pools, ms, base) = pools(4, 2);
    let id = pools.partition("p-w").unwrap();
    let _held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    let mut first = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    assert!(poll(&mut first).is_pending());
    ms.store(20_000, Ordering::SeqCst);
    // 10 s left, and the oldest waiter has waited 20 s: refused at entry.
    let near = base + Duration::from_millis(30_000);
    let out = pools.admit_blocking(&PoolRequest::new(3, id), Some(near));
    assert_eq!(last(&out), (Decision::Reject, Reason::DeadlineUnmeetable));
    // A deadline already passed, the same.
    let out = pools.admit_blocking(&PoolRequest::new(4, id), Some(base));
    assert_eq!(last(&out), (Decision::Reject, Reason::DeadlineUnmeetable));
    assert_eq!(pools.stats().partitions[0].queue_refusals, 2);
}

#[test]
fn a_release_on_one_partition_starts_a_waiter_of_another_blocked_by_the_guard() {
    // A guard of 1 over two partitions: `q-w`'s waiter needs the guard unit `p-w` holds.
    let (pools, _, _) = pools(4, 1);
    let (p, q) = (
        pools.partition("p-w").unwrap(),
        pools.partition("q-w").unwrap(),
    );
    let held = pools.admit(&PoolRequest::new(1, p)).into_permit().unwrap();
    let mut wait = Box::pin(pools.admit_async(PoolRequest::new(2, q), None));
    assert!(poll(&mut wait).is_pending());
    // Its entry was refused by the guard (counted once), and it queued.
    let s = &pools.stats().partitions[q.index()];
    assert_eq!((s.refused_global, s.pending), (1, 1));
    held.complete(None);
    let Poll::Ready(out) = poll(&mut wait) else {
        panic!("the release did not start the waiter")
    };
    assert_eq!(last(&out), (Decision::Dispatch, Reason::CapacityAvailable));
    assert_eq!(pools.name(out.into_permit().unwrap().partition()), "q-w");
}

#[test]
fn a_dropped_waiter_that_was_started_passes_its_start_on() {
    let (pools, _, _) = pools(4, 2);
    let id = pools.partition("p-w").unwrap();
    let held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    let mut first = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    let mut second = Box::pin(pools.admit_async(PoolRequest::new(3, id), None));
    assert!(poll(&mut first).is_pending());
    assert!(poll(&mut second).is_pending());
    // The release starts the first waiter; it is dropped before it sees its start.
    held.complete(None);
    drop(first);
    let Poll::Ready(out) = poll(&mut second) else {
        panic!("the dropped waiter's start was not passed on")
    };
    let permit = out.into_permit().unwrap();
    let s = &pools.stats().partitions[0];
    assert_eq!((s.active, s.pending), (1, 0));
    drop(permit);
    let s = &pools.stats();
    assert_eq!((s.partitions[0].active, s.global.held), (0, 0));
}
