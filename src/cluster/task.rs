//! The agent as a tokio task (feature `cluster-tokio`): the same state machine as the agent
//! thread ([`ClusterAgent::tick`]), stepped from a task that sleeps on tokio's timer between
//! steps. The store client stays blocking, so each step runs on tokio's blocking pool
//! (`spawn_blocking`) and never holds an executor thread while a store call waits; a step and
//! a leave take the agent by value and give it back, so no lock guards it.
//!
//! The agent's clock stays injectable: [`TokioClock`] reads tokio's clock, so under a paused
//! runtime (`tokio::time::pause`, or `start_paused` in tests) the lease, the admission windows
//! and the deadlines follow `tokio::time::advance`, with no real time in the test.

use super::agent::{AgentStatus, Clock, ClusterAgent};
use super::gate::ClusterBulkhead;
use super::store::StoreError;
use crate::sync::{lock, Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A [`Clock`] on tokio's clock (milliseconds since the clock was made): it follows a paused
/// runtime's `advance`. Read it inside a runtime.
///
/// ```
/// use llm_bulkhead::cluster::{Clock, TokioClock};
/// let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
/// rt.block_on(async {
///     let c = TokioClock::new();
///     tokio::time::advance(std::time::Duration::from_millis(1_500)).await;
///     assert_eq!(c.now_ms(), 1_500);
/// });
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TokioClock(tokio::time::Instant);

impl TokioClock {
    /// A clock whose origin is now (on tokio's clock). Inside a runtime.
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// let _ = rt.block_on(async { llm_bulkhead::cluster::TokioClock::new() });
    /// ```
    #[must_use]
    pub fn new() -> Self {
        TokioClock(tokio::time::Instant::now())
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// An agent running as a tokio task ([`ClusterAgent::spawn_on`]).
///
/// ```
/// use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
/// let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
/// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
/// let agent = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// let running = agent.spawn_on(rt.handle());
/// rt.block_on(running.stop()).unwrap();
/// ```
#[derive(Debug)]
pub struct AsyncAgent {
    handle: ClusterBulkhead,
    status: Arc<Mutex<AgentStatus>>,
    stop: Arc<Notify>,
    task: Option<JoinHandle<Result<(), StoreError>>>,
}

impl ClusterAgent {
    /// Runs the agent as a task on `runtime` (its steps on the blocking pool, its waits on
    /// tokio's timer) until [`AsyncAgent::stop`]. The runtime needs its timer enabled.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_time().build().unwrap();
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let agent = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// let running = agent.spawn_on(rt.handle());
    /// assert!(!running.status().replica.is_empty());
    /// rt.block_on(running.stop()).unwrap();
    /// ```
    #[must_use]
    pub fn spawn_on(self, runtime: &tokio::runtime::Handle) -> AsyncAgent {
        let status = Arc::new(Mutex::new(self.status().clone()));
        let stop = Arc::new(Notify::new());
        let handle = self.handle();
        let task = runtime.spawn(run(self, Arc::clone(&status), Arc::clone(&stop)));
        AsyncAgent {
            handle,
            status,
            stop,
            task: Some(task),
        }
    }
}

/// Runs `f` on the agent on the blocking pool and gives the agent back. A panic in the step
/// is the step's own: it is re-raised here.
async fn blocking<T: Send + 'static>(
    agent: ClusterAgent,
    f: impl FnOnce(&mut ClusterAgent) -> T + Send + 'static,
) -> (ClusterAgent, T) {
    let step = tokio::task::spawn_blocking(move || {
        let mut agent = agent;
        let out = f(&mut agent);
        (agent, out)
    });
    match step.await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

async fn run(
    mut agent: ClusterAgent,
    status: Arc<Mutex<AgentStatus>>,
    stop: Arc<Notify>,
) -> Result<(), StoreError> {
    let clock = agent.clock();
    loop {
        let (a, next) = blocking(agent, ClusterAgent::tick).await;
        agent = a;
        *lock(&status) = agent.status().clone();
        let wait = Duration::from_millis(next.saturating_sub(clock.now_ms()));
        // `notify_one` keeps a permit when nobody waits, so a stop between two steps is seen
        // here.
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.notified() => break,
        }
    }
    tokio::task::spawn_blocking(move || agent.leave())
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

impl AsyncAgent {
    /// The agent's state after its last step.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn_on(rt.handle());
    /// let _ = a.status().phase;
    /// # rt.block_on(a.stop()).unwrap();
    /// ```
    #[must_use]
    pub fn status(&self) -> AgentStatus {
        lock(&self.status).clone()
    }

    /// The agent's [`ClusterBulkhead`].
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn_on(rt.handle());
    /// let h = a.handle();
    /// # let _ = h;
    /// # rt.block_on(a.stop()).unwrap();
    /// ```
    #[must_use]
    pub fn handle(&self) -> ClusterBulkhead {
        self.handle.clone()
    }

    /// Stops the agent: it installs zero, waits for the work in flight (at most
    /// `max_admission`, on the blocking pool) and returns its share to the store
    /// ([`ClusterAgent::leave`]).
    ///
    /// # Errors
    /// The store's, if the release failed.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes leaves the task to finish the leave on its own.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn_on(rt.handle());
    /// rt.block_on(a.stop()).unwrap();
    /// ```
    pub async fn stop(mut self) -> Result<(), StoreError> {
        self.stop.notify_one();
        match self.task.take() {
            Some(task) => match task.await {
                Ok(r) => r,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime shut down under the task: nothing left to return.
                Err(_) => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Drop for AsyncAgent {
    fn drop(&mut self) {
        // The task leaves on its own (if its runtime still runs).
        self.stop.notify_one();
    }
}
