//! Gateway pools (feature `serde`): provider × traffic-class partitions behind one global
//! guard, each provider with a connection limit, each partition with its active limit, a
//! high-priority reserve, an optional token budget, a retry budget and one overflow action.
//!
//! A request is classified to a partition ([`Pools::classify`]) and admitted only when it holds
//! a unit of its partition, a connection of its provider and a unit of the global guard
//! together ([`Pools::try_admit`]; the protocol and why no count ever passes its limit are in
//! `engine.rs`). [`Pools::admit`] applies the partition's class overflow action when it is
//! full: a fast rejection, a degraded answer, or the partition's approved fallbacks in order,
//! each with its own budget. A request carries its [`Route`]: every decision made for it, in
//! order; it never visits a partition twice, the attempt budget ends the search, and there is
//! no retry loop: a refusal is an answer.
//!
//! Retries are charged to their partition's retry budget when they are decided
//! ([`Pools::charge_retry`]), held through the back-off and until the retry's attempt ends.
//!
//! ```
//! use llm_bulkhead::pools::*;
//! let mut config = PoolsConfig::single("primary", "interactive", 2);
//! config.extend_with("secondary", "interactive", 2);
//! config.classes.get_mut("interactive").unwrap().overflow = Overflow::Fallback;
//! config.partitions.get_mut("primary-interactive").unwrap().fallback =
//!     vec!["secondary-interactive".into()];
//! let pools = Pools::new(&config)?;
//!
//! let primary = pools.classify(&Classification::new("primary", "interactive"))?;
//! let a = pools.admit(&PoolRequest::new(1, primary)).into_permit().unwrap();
//! let b = pools.admit(&PoolRequest::new(2, primary)).into_permit().unwrap();
//! // The primary is full: the third request falls back to the secondary's own budget.
//! let third = pools.admit(&PoolRequest::new(3, primary));
//! let route = third.route();
//! assert_eq!(route.decisions()[0].decision, Decision::Fallback);
//! assert_eq!(route.decisions()[0].reason, Reason::ActiveLimitReached);
//! assert_eq!(route.decisions()[1].decision, Decision::Dispatch);
//! assert_eq!(pools.name(third.into_permit().unwrap().partition()), "secondary-interactive");
//! # drop((a, b));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A class whose overflow is [`Overflow::Wait`] waits in its partition's pending queue
//! ([`Pools::admit_blocking`], [`Pools::admit_async`]), bounded in length and age; a release
//! starts the waiters it made startable, inside the release (`queue.rs`).

mod config;
mod engine;
mod events;
mod permit;
mod queue;
mod route;
mod stats;
mod words;

pub use config::{
    ClassConfig, GlobalConfig, Overflow, PartitionConfig, PoolsConfig, PoolsConfigError,
    ProviderConfig, RetryConfig, MAX_ATTEMPTS,
};
#[cfg(feature = "metrics")]
pub use events::MetricsObserver;
#[cfg(feature = "tracing")]
pub use events::TracingObserver;
pub use events::{CompletionEvent, Decision, DecisionEvent, FailureClass, PoolsObserver, Reason};
pub use permit::{OwnedPoolPermit, PoolPermit, RetryCharge};
pub use route::{
    Classification, DecisionRecord, PoolOutcome, PoolRefusal, PoolRequest, Route, RouteError,
};
pub use stats::{GuardStats, PartitionStats, PoolsStats};

use crate::sync::Arc;
use crate::wait::multi::MultiWait;
use engine::Engine;
use queue::Pending;
use std::time::Instant;

/// A partition's index in its [`Pools`] (name order), from [`Pools::partition`] or
/// [`Pools::classify`].
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// assert_eq!(pools.partition("p-c")?.index(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(pub(crate) u32);

impl PartitionId {
    /// The index, in name order.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.partition("p-c")?.index(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Gateway pools: the partitions, providers and global guard of a [`PoolsConfig`] (module
/// docs). Share it by reference or in an `Arc`; permits borrow it.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let id = pools.partition("p-c")?;
/// let permit = pools.try_admit(&PoolRequest::new(1, id))?;
/// let refused = pools.try_admit(&PoolRequest::new(2, id)).unwrap_err();
/// assert_eq!(refused.reason, Reason::ActiveLimitReached);
/// drop(permit);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pools {
    pub(crate) engine: Arc<Engine>,
    /// Every partition's pending queue (`queue.rs`).
    pub(crate) queue: MultiWait<Pending>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools")
            .field("partitions", &self.engine.partitions.len())
            .field("providers", &self.engine.providers.len())
            .finish()
    }
}

impl Pools {
    /// Validates `config` and builds the pools, with no observer.
    ///
    /// # Errors
    /// The first problem of the configuration ([`PoolsConfig::validate`]).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// assert!(Pools::new(&PoolsConfig::default()).is_err());
    /// ```
    pub fn new(config: &PoolsConfig) -> Result<Pools, PoolsConfigError> {
        Ok(Pools::of(Engine::new(config, None)?))
    }

    fn of(engine: Engine) -> Pools {
        let engine = Arc::new(engine);
        let queue = MultiWait::new(Pending::new(engine.clone()));
        Pools { engine, queue }
    }

    /// As [`with_observer`](Self::with_observer), with the clock that queue ages and
    /// deadlines are read on (the default is `Instant::now`): tests inject one to age a
    /// queue without waiting. On an injected clock a waiter's wait has no timer of its own:
    /// a release, an entry and [`expire_waiters`](Self::expire_waiters) remove the waiters
    /// whose deadline passed on this clock (call `expire_waiters` when the clock moves and
    /// nothing else happens).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let start = std::time::Instant::now();
    /// let pools = Pools::with_clock(&PoolsConfig::single("p", "c", 1), None, move || start)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock(
        config: &PoolsConfig,
        observer: Option<Box<dyn PoolsObserver>>,
        clock: impl Fn() -> Instant + Send + Sync + 'static,
    ) -> Result<Pools, PoolsConfigError> {
        let mut engine = Engine::new(config, observer)?;
        engine.clock = Some(Box::new(clock));
        Ok(Pools::of(engine))
    }

    /// Removes the waiters whose deadline (queue age or caller's) passed on the pools'
    /// clock, and starts the ones that can start. Releases do this already; call it when
    /// nothing is released for a while and the waiters' own timers are not wanted.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// Pools::new(&PoolsConfig::single("p", "c", 1))?.expire_waiters();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expire_waiters(&self) {
        self.kick();
    }

    /// As [`new`](Self::new), with an observer that receives every decision and completion
    /// event (`TracingObserver` with feature `tracing`, `MetricsObserver` with `metrics`, both
    /// as a pair, or your own).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// struct Nothing;
    /// impl PoolsObserver for Nothing {
    ///     fn on_decision(&self, _: &DecisionEvent<'_>) {}
    ///     fn on_completion(&self, _: &CompletionEvent<'_>) {}
    /// }
    /// let pools = Pools::with_observer(&PoolsConfig::single("p", "c", 1), Nothing)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_observer(
        config: &PoolsConfig,
        observer: impl PoolsObserver + 'static,
    ) -> Result<Pools, PoolsConfigError> {
        Ok(Pools::of(Engine::new(config, Some(Box::new(observer)))?))
    }

    /// The partition named `name`.
    ///
    /// # Errors
    /// [`RouteError::UnknownPartition`].
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert!(matches!(pools.partition("nope"), Err(RouteError::UnknownPartition(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn partition(&self, name: &str) -> Result<PartitionId, RouteError> {
        self.engine
            .partitions
            .iter()
            .position(|p| p.name == name)
            .map(|i| PartitionId(i as u32))
            .ok_or_else(|| RouteError::UnknownPartition(name.to_owned()))
    }

    /// A partition's name.
    ///
    /// # Panics
    /// If `id` is not from these pools (ids are indices).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.name(pools.partition("p-c")?), "p-c");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self, id: PartitionId) -> &str {
        &self.engine.partitions[id.index()].name
    }

    /// The provider of a partition.
    ///
    /// # Panics
    /// If `id` is not from these pools (ids are indices).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.provider_of(pools.partition("p-c")?), "p");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn provider_of(&self, id: PartitionId) -> &str {
        let e = &self.engine;
        &e.providers[e.partitions[id.index()].provider].name
    }

    /// The statistics of every partition, provider and the global guard.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.stats().partitions.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> PoolsStats {
        let now = self.engine.now();
        let oldest = self.queue.read(|s, _| s.oldest_waits(now));
        stats::read(&self.engine, &oldest)
    }

    /// Sets the pools' gauges through the `metrics` facade (feature `metrics`); call it when
    /// metrics are scraped.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// Pools::new(&PoolsConfig::single("p", "c", 1))?.record_gauges();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "metrics")]
    pub fn record_gauges(&self) {
        stats::record_gauges(&self.stats());
    }

    /// Installs new limits for partition `name` atomically: a decision reads all of the old
    /// limits or all of the new ones, and carries the version it read. The provider, class,
    /// keys and fallbacks must stay as they are. Returns the new version.
    ///
    /// # Errors
    /// [`PoolsConfigError`] naming the cell; nothing changes then.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let config = PoolsConfig::single("p", "c", 4);
    /// let pools = Pools::new(&config)?;
    /// let mut next = config.partitions["p-c"].clone();
    /// next.active_limit = 2;
    /// assert_eq!(pools.apply_partition("p-c", &next)?, 2);
    /// next.active_limit = 0;
    /// assert!(matches!(pools.apply_partition("p-c", &next), Err(PoolsConfigError::ZeroLimit { .. })));
    /// assert_eq!(pools.stats().partitions[0].active_limit, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_partition(
        &self,
        name: &str,
        next: &PartitionConfig,
    ) -> Result<u64, PoolsConfigError> {
        let id = self
            .partition(name)
            .map_err(|_| PoolsConfigError::Unknown {
                cell: "partitions".into(),
                field: "name",
                name: name.to_owned(),
            })?;
        let v = self.engine.apply_partition(id.index(), next)?;
        // A raised limit may start waiters.
        self.kick();
        Ok(v)
    }

    /// Installs a provider's connection limit (not below any of its partitions' active
    /// limits). Returns the new version.
    ///
    /// # Errors
    /// [`PoolsConfigError`] naming the cell; nothing changes then.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 4))?;
    /// assert_eq!(pools.apply_provider("p", 8)?, 2);
    /// assert!(pools.apply_provider("p", 3).is_err()); // below the partition's 4
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_provider(
        &self,
        name: &str,
        connection_limit: u64,
    ) -> Result<u64, PoolsConfigError> {
        let vi = self
            .engine
            .providers
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| PoolsConfigError::Unknown {
                cell: "providers".into(),
                field: "name",
                name: name.to_owned(),
            })?;
        let v = self.engine.apply_provider(vi, connection_limit)?;
        self.kick();
        Ok(v)
    }

    /// Installs the global guard's limit (not below any partition's active limit). Returns
    /// the new version.
    ///
    /// # Errors
    /// [`PoolsConfigError`] naming the cell; nothing changes then.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 4))?;
    /// assert_eq!(pools.apply_global(16)?, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply_global(&self, max_active: u64) -> Result<u64, PoolsConfigError> {
        let v = self.engine.apply_global(max_active)?;
        self.kick();
        Ok(v)
    }
}

impl PoolsConfig {
    /// A configuration of one provider and one class with one partition,
    /// `"{provider}-{class}"`, whose active, connection and global limits are all `limit`;
    /// the class rejects on overflow. A start for tests and examples.
    ///
    /// ```
    /// let c = llm_bulkhead::pools::PoolsConfig::single("p", "c", 3);
    /// assert_eq!(c.partitions["p-c"].active_limit, 3);
    /// ```
    pub fn single(provider: &str, class: &str, limit: u64) -> PoolsConfig {
        let mut c = PoolsConfig::default();
        c.extend_with(provider, class, limit);
        c
    }

    /// Adds provider `provider` (if new, with connection limit `limit`), class `class` (if
    /// new, rejecting on overflow) and partition `"{provider}-{class}"` with active limit
    /// `limit`; raises the global guard by `limit`.
    ///
    /// ```
    /// let mut c = llm_bulkhead::pools::PoolsConfig::single("p", "c", 3);
    /// c.extend_with("q", "c", 2);
    /// assert_eq!(c.global.max_active, 5);
    /// ```
    pub fn extend_with(&mut self, provider: &str, class: &str, limit: u64) {
        self.global.max_active += limit;
        self.providers
            .entry(provider.to_owned())
            .or_insert(ProviderConfig {
                connection_limit: limit,
            });
        self.classes.entry(class.to_owned()).or_default();
        self.partitions.insert(
            format!("{provider}-{class}"),
            PartitionConfig::new(provider, class, limit),
        );
    }
}
