//! Models the hand-off from a release to a partition's pending queue (`src/pools/queue.rs`,
//! "The hand-off"): a release gives its units back, then reads how many wait; a newcomer
//! counts itself, then is judged once more. No waiter stays queued with its units free.
//!
//! * `a_release_starts_the_waiter`: the main thread admits and releases the partition's one
//!   unit while a second thread waits for it (blocking); in every interleaving the waiter is
//!   admitted, and everything is zero at the end. Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_NO_HANDOFF=1` (a release starts nobody) leaves it waiting.
//! * `an_undone_decision_starts_the_waiter`: a waiter for partition `x`, a decision on `x`
//!   that may take `x`'s unit and give it back (its connection step refused), and the release
//!   of the provider's one connection, held on partition `y`. The waiter may be judged while
//!   the other decision holds `x`'s unit tentatively; it waits for that unit's undo rather
//!   than refusing, so it starts although the undo hands nothing on. Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_REFUSE_TENTATIVE=1` (a count full only with tentative units
//!   refuses at once) leaves it waiting.
//!
//! * `a_newcomer_does_not_take_a_waiters_unit`: the provider's one connection is held on
//!   partition `r`; a waiter of `w` is queued for it; then a newcomer to `r` (nobody waits
//!   there) races with the connection's release. The waiter is older and keeps what it gets:
//!   the newcomer is refused in every interleaving. Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_NEWCOMER_JUMPS=1` (a newcomer keeps a unit it took while a
//!   waiter was owed it) admits it.
//!
//! A waiter left waiting spins in its blocking wait (a yield under loom, which has no timed
//! park) until loom's branch limit ends the execution: the broken variants fail that way.
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::pools::*;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Partition `p-w` (class `w` waits: one pending place, a minute of age) with one unit,
/// and, with `reject`, partition `p-r` (class `r` rejects) with one unit; the provider has
/// one connection.
fn config(reject: bool) -> PoolsConfig {
    let mut c = PoolsConfig::single("p", "w", 1);
    if reject {
        c.extend_with("p", "r", 1);
    }
    c.classes.get_mut("w").unwrap().overflow = Overflow::Wait;
    let w = c.partitions.get_mut("p-w").unwrap();
    (w.pending_limit, w.queue_max_age_ms) = (1, 60_000);
    c
}

fn assert_zero(pools: &Pools) {
    let s = pools.stats();
    assert_eq!((s.global.held, s.providers[0].held), (0, 0), "{s:?}");
    for p in &s.partitions {
        assert_eq!((p.active, p.tentative, p.pending), (0, 0, 0), "{p:?}");
    }
}

/// A thread that waits on `p-w` and must be admitted.
fn waiter(pools: &Arc<Pools>) -> thread::JoinHandle<()> {
    let pools = pools.clone();
    thread::spawn(move || {
        let id = pools.partition("p-w").unwrap();
        let out = pools.admit_blocking(&PoolRequest::new(2, id), None);
        let permit = out.into_permit().expect("the waiter is admitted");
        permit.complete(None);
    })
}

#[test]
fn a_release_starts_the_waiter() {
    model(|| {
        let pools = Arc::new(Pools::new(&config(false)).unwrap());
        let w = waiter(&pools);
        let id = pools.partition("p-w").unwrap();
        // Refused if the waiter holds the unit already: then it is the waiter's to release.
        if let Some(p) = pools.admit(&PoolRequest::new(1, id)).into_permit() {
            p.complete(None);
        }
        w.join().unwrap();
        assert_zero(&pools);
    });
}

#[test]
fn an_undone_decision_starts_the_waiter() {
    model(|| {
        let pools = Arc::new(Pools::new(&config(true)).unwrap());
        let r = pools.partition("p-r").unwrap();
        // The provider's one connection, held on the other partition.
        let held = pools.try_admit(&PoolRequest::new(1, r)).unwrap();
        let w = waiter(&pools);
        let d = {
            let pools = pools.clone();
            thread::spawn(move || {
                let x = pools.partition("p-w").unwrap();
                if let Ok(p) = pools.try_admit(&PoolRequest::new(3, x)) {
                    p.complete(None);
                }
            })
        };
        held.complete(None);
        d.join().unwrap();
        w.join().unwrap();
        assert_zero(&pools);
    });
}

#[test]
fn a_newcomer_does_not_take_a_waiters_unit() {
    model(|| {
        let pools = Arc::new(Pools::new(&config(true)).unwrap());
        let (r, w) = (
            pools.partition("p-r").unwrap(),
            pools.partition("p-w").unwrap(),
        );
        let held = pools.try_admit(&PoolRequest::new(1, r)).unwrap();
        // The waiter keeps its permit until the newcomer has decided: whatever it got was its
        // own.
        let decided = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (pools, decided) = (pools.clone(), decided.clone());
            thread::spawn(move || {
                let out = pools.admit_blocking(&PoolRequest::new(2, w), None);
                let permit = out.into_permit().expect("the waiter is admitted");
                while !decided.load(Ordering::SeqCst) {
                    thread::yield_now();
                }
                permit.complete(None);
            })
        };
        while pools.stats().partitions[w.index()].pending == 0 {
            thread::yield_now();
        }
        let newcomer = {
            let pools = pools.clone();
            thread::spawn(move || pools.try_admit(&PoolRequest::new(3, r)).map(drop).is_ok())
        };
        held.complete(None);
        assert!(
            !newcomer.join().unwrap(),
            "the newcomer took the waiter's connection"
        );
        decided.store(true, Ordering::SeqCst);
        waiter.join().unwrap();
        assert_zero(&pools);
    });
}
