//! The cluster handle tests' injected clock and a leased agent: one clock for the store, the
//! agent and its handle (ms), moved by the test, and an agent alone on its table past
//! learning, holding the whole bulkhead.

#[path = "cluster_config.rs"]
mod cluster_config;

use llm_bulkhead::cluster::{AgentEvent, Clock, ClusterAgent, MemoryStore};
use llm_bulkhead::Bulkhead;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use cluster_config::agent_config;

/// The test's clock. Queued values are returned first, one per read: a thread paused between
/// two reads.
#[derive(Clone, Default)]
pub struct Manual {
    now: Arc<AtomicU64>,
    queued: Arc<Mutex<VecDeque<u64>>>,
}

impl Clock for Manual {
    fn now_ms(&self) -> u64 {
        if let Some(t) = self.queued.lock().unwrap().pop_front() {
            return t;
        }
        self.now.load(Ordering::SeqCst)
    }
}

impl Manual {
    pub fn set(&self, t: u64) {
        self.now.store(t, Ordering::SeqCst);
    }

    #[allow(dead_code)]
    pub fn next_reads(&self, ts: &[u64]) {
        self.queued.lock().unwrap().extend(ts);
    }
}

/// When [`leased`] renewed: the lease is valid until `RENEWED + 940`, then the floor (2 slots)
/// until `RENEWED + 1_440` (`agent_config`).
pub const RENEWED: u64 = 3_001;

/// An agent over `b` (built with 8 slots) alone on a table, past learning, holding all of
/// `b`'s global limits.
pub fn leased(
    b: &Bulkhead,
) -> (
    Manual,
    MemoryStore,
    ClusterAgent,
    Arc<Mutex<Vec<AgentEvent>>>,
) {
    let clock = Manual::default();
    let c2 = clock.clone();
    let store = MemoryStore::with_clock(move || c2.now_ms());
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = events.clone();
    let mut agent = ClusterAgent::with_clock(
        b.clone(),
        Box::new(store.clone()),
        agent_config("gate"),
        Arc::new(clock.clone()),
    )
    .unwrap()
    .on_event(move |e| e2.lock().unwrap().push(e.clone()));
    agent.tick();
    clock.set(RENEWED);
    agent.tick();
    assert_eq!(b.limits().max_concurrent, 8);
    (clock, store, agent, events)
}
