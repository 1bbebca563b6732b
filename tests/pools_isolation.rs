//! The seed's invariant: a request refused by one partition never consumes another
//! partition's capacity, and a slow provider fills only its own partitions. Also the
//! high-priority reserve, observe (shadow) mode and the retry budget's figures in the stats.

use llm_bulkhead::pools::*;
use llm_bulkhead::Priority;

fn two_providers() -> PoolsConfig {
    let mut c = PoolsConfig::single("primary", "interactive", 4);
    c.extend_with("primary", "batch", 2);
    c.extend_with("secondary", "interactive", 3);
    c.providers.get_mut("primary").unwrap().connection_limit = 5;
    c
}

#[test]
fn a_slow_provider_fills_only_its_own_partitions() {
    let pools = Pools::new(&two_providers()).unwrap();
    let id = |n: &str| pools.partition(n).unwrap();
    let (pi, pb, si) = (
        id("primary-interactive"),
        id("primary-batch"),
        id("secondary-interactive"),
    );
    // The primary is slow: its interactive partition fills and stays full.
    let stuck: Vec<_> = (0..4)
        .map(|n| pools.try_admit(&PoolRequest::new(n, pi)).unwrap())
        .collect();
    for n in 0..1_000 {
        let e = pools.try_admit(&PoolRequest::new(100 + n, pi)).unwrap_err();
        assert_eq!(e.reason, Reason::ActiveLimitReached);
    }
    let s = pools.stats();
    // A thousand refusals took nothing from anyone.
    assert_eq!(
        (s.global.held, s.providers[0].held, s.providers[1].held),
        (4, 4, 0)
    );
    let by = |name: &str| {
        s.partitions
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by("primary-interactive").refused_active, 1_000);
    assert_eq!(by("secondary-interactive").active, 0);
    // The healthy provider admits its whole partition.
    let healthy: Vec<_> = (0..3)
        .map(|n| pools.try_admit(&PoolRequest::new(n, si)).unwrap())
        .collect();
    // The primary's batch partition has one connection left of the five it shares.
    let batch = pools.try_admit(&PoolRequest::new(7, pb)).unwrap();
    assert_eq!(
        pools
            .try_admit(&PoolRequest::new(8, pb))
            .unwrap_err()
            .reason,
        Reason::ConnectionLimitReached
    );
    drop((stuck, healthy, batch));
    let s = pools.stats();
    assert_eq!(s.global.held, 0);
    assert!(s
        .partitions
        .iter()
        .all(|p| p.active == 0 && p.admitted == p.completed));
}

#[test]
fn the_reserve_is_for_high_priority_only() {
    let mut c = PoolsConfig::single("p", "c", 3);
    c.partitions.get_mut("p-c").unwrap().high_priority_reserve = 1;
    let pools = Pools::new(&c).unwrap();
    let id = pools.partition("p-c").unwrap();
    let normal = PoolRequest::new(1, id);
    let high = PoolRequest {
        priority: Priority::High,
        ..normal
    };
    let a = pools.try_admit(&normal).unwrap();
    let b = pools.try_admit(&normal).unwrap();
    assert_eq!(
        pools.try_admit(&normal).unwrap_err().reason,
        Reason::HighPriorityReserve
    );
    let c3 = pools.try_admit(&high).unwrap();
    assert_eq!(
        pools.try_admit(&high).unwrap_err().reason,
        Reason::ActiveLimitReached
    );
    drop((a, b, c3));
}

#[test]
fn observe_mode_counts_what_it_would_refuse_and_refuses_nothing_of_its_own() {
    let mut c = PoolsConfig::single("p", "c", 2);
    c.global.max_active = 3;
    c.providers.get_mut("p").unwrap().connection_limit = 3;
    c.partitions.get_mut("p-c").unwrap().observe = true;
    let pools = Pools::new(&c).unwrap();
    let id = pools.partition("p-c").unwrap();
    let held: Vec<_> = (0..3)
        .map(|n| pools.admit(&PoolRequest::new(n, id)))
        .collect();
    let reasons: Vec<_> = held
        .iter()
        .map(|o| o.route().decisions()[0].reason)
        .collect();
    assert_eq!(
        reasons,
        [
            Reason::CapacityAvailable,
            Reason::CapacityAvailable,
            Reason::ObservedOverLimit
        ]
    );
    // The shared limits are still enforced: the provider's connections are all held.
    assert_eq!(
        pools
            .try_admit(&PoolRequest::new(9, id))
            .unwrap_err()
            .reason,
        Reason::ConnectionLimitReached
    );
    let s = &pools.stats().partitions[0];
    assert_eq!((s.active, s.shadow_refusals, s.observe), (3, 1, true));
}

#[test]
fn the_retry_budget_shows_remaining_open_and_overflow() {
    let mut c = PoolsConfig::single("p", "c", 20);
    c.partitions.get_mut("p-c").unwrap().retry = RetryConfig {
        percent: 20,
        min: 1,
    };
    let pools = Pools::new(&c).unwrap();
    let id = pools.partition("p-c").unwrap();
    // Ten active requests: max(20 % of 10, 1) = 2 retries.
    let active: Vec<_> = (0..10)
        .map(|n| pools.try_admit(&PoolRequest::new(n, id)).unwrap())
        .collect();
    let r1 = pools.charge_retry(1, id).unwrap();
    let s = &pools.stats().partitions[0];
    assert_eq!(
        (
            s.retry_limit,
            s.retries_in_flight,
            s.retry_remaining,
            s.retry_open
        ),
        (2, 1, 1, false)
    );
    let r2 = pools.charge_retry(2, id).unwrap();
    assert_eq!(
        pools.charge_retry(3, id).unwrap_err().reason,
        Reason::RetryBudgetReached
    );
    let s = &pools.stats().partitions[0];
    assert_eq!(
        (s.retry_remaining, s.retry_open, s.retry_overflow),
        (0, true, 1)
    );
    drop((r1, r2, active));
    let s = &pools.stats().partitions[0];
    assert_eq!((s.retries_in_flight, s.active), (0, 0));
}

#[test]
fn a_demand_of_any_size_is_a_refusal_not_an_overflow() {
    let mut c = PoolsConfig::single("p", "c", 2);
    c.partitions.get_mut("p-c").unwrap().token_budget = Some(1_000);
    let pools = Pools::new(&c).unwrap();
    let id = pools.partition("p-c").unwrap();
    let held = pools
        .try_admit(&PoolRequest {
            tokens: 10,
            ..PoolRequest::new(1, id)
        })
        .unwrap();
    let huge = PoolRequest {
        tokens: u64::MAX,
        ..PoolRequest::new(2, id)
    };
    assert_eq!(
        pools.try_admit(&huge).unwrap_err().reason,
        Reason::TokenBudgetReached
    );
    drop(held);
    let s = &pools.stats().partitions[0];
    assert_eq!((s.active, s.tokens), (0, 0));
}
