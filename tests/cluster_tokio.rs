//! The agent as a tokio task, on a paused runtime: tokio's clock is the agent's and the
//! store's, so the lease, the admission windows and the deadlines follow the test's time with
//! no real time in the test. Same state machine as the thread: learning first, then the
//! whole budget alone; cut off, the floor at the lease's end and zero `floor_hold` later; a cut
//! signal fires at its admission's deadline; a stop returns the share to the store.

#[path = "support/cluster_config.rs"]
mod cluster_config;

use llm_bulkhead::cluster::{
    AsyncAgent, Clock, ClusterAgent, ClusterConfig, MemoryStore, Phase, StoreError, TokioClock,
};
use llm_bulkhead::{Bulkhead, Demand};
use std::sync::Arc;
use std::time::Duration;

fn config() -> ClusterConfig {
    cluster_config::agent_config("tokio")
}

fn start(b: &Bulkhead) -> (TokioClock, MemoryStore, AsyncAgent) {
    let clock = TokioClock::new();
    let store = MemoryStore::with_clock(move || clock.now_ms());
    let agent = ClusterAgent::with_clock(
        b.clone(),
        Box::new(store.clone()),
        config(),
        Arc::new(clock),
    )
    .unwrap()
    .spawn_on(&tokio::runtime::Handle::current());
    (clock, store, agent)
}

/// Steps the test's time 1 ms at a time until `f` holds (bounded: 20 s of tokio time).
async fn until(clock: &TokioClock, what: &str, mut f: impl FnMut() -> bool) -> u64 {
    let limit = clock.now_ms() + 20_000;
    while !f() {
        assert!(
            clock.now_ms() < limit,
            "{what}: not within 20 s of tokio time"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    clock.now_ms()
}

#[tokio::test(start_paused = true)]
async fn the_task_follows_the_lease_on_tokio_time() {
    let b = Bulkhead::new(8).unwrap();
    let (clock, store, agent) = start(&b);
    assert_eq!(b.limits().max_concurrent, 0, "zero until the first grant");
    // A new table learns for ttl + quarantine (3 s): nothing before, the whole budget after.
    let granted = until(&clock, "the grant", || b.limits().max_concurrent == 8).await;
    assert!(granted >= 3_000, "granted at {granted} ms, during learning");
    let renewals = agent.status().renewals;
    assert!(renewals >= 9, "{renewals} renewals in 3 s (every ttl / 3)");

    // A cut signal fires at its admission's deadline, on the agent's step.
    let h = agent.handle();
    let a = h.try_acquire(Demand::slot()).unwrap();
    let deadline = a.deadline_ms();
    assert_eq!(deadline, clock.now_ms() + 1_000);
    a.cut_signal().await;
    assert_eq!(
        clock.now_ms(),
        deadline,
        "fired at the deadline, not a step later"
    );
    drop(a);

    // Cut off: the floor at the lease's end, zero floor_hold later.
    store.set_reachable(false);
    let last_ok = {
        let n = agent.status().renewals;
        until(&clock, "a failed renewal", || agent.status().failures > 0).await;
        assert_eq!(agent.status().renewals, n);
        n
    };
    let floor = until(&clock, "the floor", || b.limits().max_concurrent == 2).await;
    assert_eq!(agent.status().phase, Phase::Floor);
    let zero = until(&clock, "zero", || b.limits().max_concurrent == 0).await;
    // Each seen at its install or 1 ms later.
    assert!(
        (499..=501).contains(&(zero - floor)),
        "the floor lasts floor_hold: {floor} → {zero}"
    );
    assert_eq!(agent.status().phase, Phase::Closed);
    assert_eq!(agent.status().renewals, last_ok);

    // Healed: the whole budget again; a stop returns it to the store at once.
    store.set_reachable(true);
    until(&clock, "the grant again", || b.limits().max_concurrent == 8).await;
    assert_eq!(store.table().records.len(), 1);
    agent.stop().await.unwrap();
    assert_eq!(b.limits().max_concurrent, 0);
    assert!(store.table().records.is_empty(), "the record was released");
}

/// The floor's window is the handle's: at the floor's end the handle refuses at once, whether
/// or not the agent's step (due at the same instant) has run yet.
#[tokio::test(start_paused = true)]
async fn the_handle_refuses_at_the_floors_end() {
    let b = Bulkhead::new(8).unwrap();
    let (clock, store, agent) = start(&b);
    until(&clock, "the grant", || b.limits().max_concurrent == 8).await;
    store.set_reachable(false);
    let h = agent.handle();
    let floor = until(&clock, "the floor", || b.limits().max_concurrent == 2).await;
    let refused = until(&clock, "a refusal", || {
        h.try_acquire(Demand::slot()).is_err()
    })
    .await;
    // The test sees the floor at its install or one step of 1 ms later.
    assert!(
        (499..=500).contains(&(refused - floor)),
        "{floor} → {refused}"
    );
    let closed = until(&clock, "closed", || agent.status().phase == Phase::Closed).await;
    // The agent's step at the same instant (seen at most one test step later): the handle
    // did not wait for it.
    assert!(
        closed == refused || closed == refused + 1,
        "{refused} → {closed}"
    );
    // Still cut off: the release fails, typed, and the record expires on its own.
    assert_eq!(agent.stop().await, Err(StoreError::Partitioned));
}

/// A stop with work still in flight waits at most `max_admission` and leaves the record to
/// expire; on a paused runtime (whose clock stands still while the leave waits on the blocking
/// pool) it still ends, bounded by real time too.
#[tokio::test(start_paused = true)]
async fn a_stop_with_work_in_flight_ends_on_a_paused_clock() {
    let b = Bulkhead::new(8).unwrap();
    let (clock, store, agent) = start(&b);
    until(&clock, "the grant", || b.limits().max_concurrent == 8).await;
    let held = agent.handle().try_acquire(Demand::slot()).unwrap();
    agent.stop().await.unwrap();
    assert_eq!(b.limits().max_concurrent, 0);
    assert_eq!(
        store.table().records.len(),
        1,
        "not drained: the record stays"
    );
    drop(held);
}
