//! Models the pools' multi-resource admission (`src/pools/engine.rs`): a partition unit, a
//! provider connection and a global-guard unit taken as one decision, their release, and the
//! retry budget's charge.
//!
//! * `two_partitions_share_one_connection`: two threads admit into two partitions of one
//!   provider with a single connection; in every interleaving at most one holds it (a tally
//!   raised after admission), and everything is zero at the end. Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_CHECK_THEN_ACT=1` (a step that checks, then adds: envoy#2927)
//!   admits both.
//! * `a_refused_step_gives_back_the_earlier_ones_against_a_release`: thread A releases the only
//!   connection while thread B decides (its partition unit taken first, its connection step
//!   possibly refused and undone); B is admitted if it started after A's release, and at the
//!   end every count is zero. Broken variant `LLM_BULKHEAD_LOOM_POOLS_SKIP_UNDO=1` (a refused
//!   decision keeps its partition unit) leaks it.
//! * `two_retries_in_a_budget_of_one`: two charges race on a budget of one: exactly one
//!   wins, and dropping it gives it back. Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_RETRY_CHECK_THEN_ACT=1` lets both win.
//! * `an_undone_unit_refuses_no_one`: thread A's decision takes the partition's only unit
//!   tentatively and is then refused by its token budget (it asks more than the budget);
//!   thread B asks the same partition for no tokens. Every serial order admits B, so B is
//!   admitted in every interleaving (it waits for A's unit to be undone). Broken variant
//!   `LLM_BULKHEAD_LOOM_POOLS_REFUSE_TENTATIVE=1` (a count full only with tentative units
//!   refuses at once) refuses B.
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::pools::*;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Provider `p` with one connection, partitions `p-x` and `p-y` of one unit each.
fn one_connection() -> PoolsConfig {
    let mut c = PoolsConfig::single("p", "x", 1);
    c.extend_with("p", "y", 1);
    c
}

fn assert_zero(pools: &Pools) {
    let s = pools.stats();
    assert_eq!(s.global.held, 0, "{s:?}");
    assert_eq!(s.providers[0].held, 0, "{s:?}");
    for p in &s.partitions {
        assert_eq!(
            (p.active, p.tentative, p.retries_in_flight),
            (0, 0, 0),
            "{p:?}"
        );
    }
}

#[test]
fn two_partitions_share_one_connection() {
    model(|| {
        let pools = Arc::new(Pools::new(&one_connection()).unwrap());
        let holders = Arc::new(AtomicU64::new(0));
        let admit = |pools: Arc<Pools>, holders: Arc<AtomicU64>, name: &'static str| {
            thread::spawn(move || {
                let id = pools.partition(name).unwrap();
                if let Ok(p) = pools.try_admit(&PoolRequest::new(1, id)) {
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(now, 1, "two admissions hold one connection");
                    holders.fetch_sub(1, Ordering::SeqCst);
                    p.complete(None);
                }
            })
        };
        let a = admit(pools.clone(), holders.clone(), "p-x");
        let b = admit(pools.clone(), holders.clone(), "p-y");
        a.join().unwrap();
        b.join().unwrap();
        assert_zero(&pools);
    });
}

#[test]
fn a_refused_step_gives_back_the_earlier_ones_against_a_release() {
    model(|| {
        let pools = Arc::new(Pools::new(&one_connection()).unwrap());
        let x = pools.partition("p-x").unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let tb = {
            let (pools, released) = (pools.clone(), released.clone());
            thread::spawn(move || {
                let y = pools.partition("p-y").unwrap();
                let after = released.load(Ordering::SeqCst);
                match pools.try_admit(&PoolRequest::new(2, y)) {
                    Ok(p) => p.complete(None),
                    Err(e) => {
                        assert!(!after, "refused after the release: {e}");
                        assert_eq!(e.reason, Reason::ConnectionLimitReached);
                    }
                }
            })
        };
        let held = pools.try_admit(&PoolRequest::new(1, x)).ok();
        drop(held);
        released.store(true, Ordering::SeqCst);
        tb.join().unwrap();
        assert_zero(&pools);
    });
}

#[test]
fn two_retries_in_a_budget_of_one() {
    model(|| {
        let mut c = PoolsConfig::single("p", "x", 2);
        c.partitions.get_mut("p-x").unwrap().retry = RetryConfig { percent: 0, min: 1 };
        let pools = Arc::new(Pools::new(&c).unwrap());
        let wins = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2)
            .map(|i| {
                let (pools, wins) = (pools.clone(), wins.clone());
                thread::spawn(move || {
                    let id = pools.partition("p-x").unwrap();
                    if let Ok(charge) = pools.charge_retry(i, id) {
                        let now = wins.fetch_add(1, Ordering::SeqCst) + 1;
                        assert_eq!(now, 1, "two retries in a budget of one");
                        wins.fetch_sub(1, Ordering::SeqCst);
                        drop(charge);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_zero(&pools);
    });
}

#[test]
fn an_undone_unit_refuses_no_one() {
    model(|| {
        let mut c = PoolsConfig::single("p", "x", 1);
        c.partitions.get_mut("p-x").unwrap().token_budget = Some(1);
        let pools = Arc::new(Pools::new(&c).unwrap());
        let ta = {
            let pools = pools.clone();
            thread::spawn(move || {
                let mut req = PoolRequest::new(1, pools.partition("p-x").unwrap());
                req.tokens = 2;
                // Refused by its budget, or by B's committed unit.
                assert!(pools.try_admit(&req).is_err());
            })
        };
        let id = pools.partition("p-x").unwrap();
        let b = pools.try_admit(&PoolRequest::new(2, id));
        assert!(b.is_ok(), "refused by an undone unit: {:?}", b.err());
        drop(b);
        ta.join().unwrap();
        assert_zero(&pools);
    });
}
