//! The cluster handle tests' injected clock and a leased agent: one clock for the store, the
//! agent and its handle (ms), moved by the test, and an agent alone on its table past
//! learning, holding the whole bulkhead.

#[path = "cluster_config.rs"]
mod cluster_config;

use llm_bulkhead::cluster::{AgentEvent, Clock, ClusterAgent, MemoryStore};
use llm_bulkhead::Bulkhead;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

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

/// A waker that counts its wake-ups.
pub struct Count(pub AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A counting waker and its count.
pub fn counting_waker() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count(AtomicUsize::new(0)));
    (count.clone(), Waker::from(count))
}

/// Sets its flag when dropped (a work's future was dropped).
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Drives a work admitted on `b` (the agent's bulkhead) whose admission deadline is
/// `deadline`: the first poll leaves it pending and holding one slot; the agent's step one ms
/// before the deadline neither wakes nor ends it; its step at the deadline wakes it once, the
/// slot still held. Returns the poll after that wake-up.
pub fn poll_across_deadline<F: Future>(
    mut fut: Pin<&mut F>,
    clock: &Manual,
    agent: &mut ClusterAgent,
    b: &Bulkhead,
    deadline: u64,
) -> Poll<F::Output> {
    let (count, waker) = counting_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert_eq!(b.stats().in_flight, 1);
    clock.set(deadline - 1);
    agent.tick();
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "not woken before the deadline"
    );
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    clock.set(deadline);
    agent.tick();
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken at the deadline");
    assert_eq!(b.stats().in_flight, 1, "held until the work ends");
    fut.as_mut().poll(&mut cx)
}

/// The future of [`counting_handler`]'s handler.
pub type Answer = Pin<Box<dyn Future<Output = &'static str> + Send>>;

/// The inner service of the tower tests: a handler answering "ok" and the count of its calls
/// (a refused request must never reach it).
#[allow(dead_code)]
pub fn counting_handler() -> (
    Arc<AtomicUsize>,
    impl Fn() -> Answer + Clone + Send + Sync + 'static,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let handler = move || {
        let c = c2.clone();
        Box::pin(async move {
            c.fetch_add(1, Ordering::SeqCst);
            "ok"
        }) as Answer
    };
    (calls, handler)
}
