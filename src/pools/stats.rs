//! Per-partition, per-provider and global statistics of the pools.

use super::engine::{
    Engine, ACTIVE_LIMIT, MAX_AGE_MS, OBSERVE, PENDING_LIMIT, RESERVE, RETRY_MIN, RETRY_PERCENT,
    TOKEN_BUDGET,
};
use super::words::retry_limit;
use crate::sync::Ordering;

/// A snapshot of every count of a [`Pools`](super::Pools). Each count is one atomic read; two
/// counts were not necessarily read at the same instant.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 2))?;
/// let s = pools.stats();
/// assert_eq!((s.global.held, s.global.limit), (0, 2));
/// assert_eq!(s.providers[0].name, "p");
/// assert_eq!(s.partitions[0].name, "p-c");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PoolsStats {
    /// The global guard.
    pub global: GuardStats,
    /// Each provider's connections, in name order.
    pub providers: Vec<GuardStats>,
    /// Each partition, in name order.
    pub partitions: Vec<PartitionStats>,
}

/// A bounded count: the global guard or a provider's connections.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 2))?;
/// assert_eq!(pools.stats().providers[0].limit, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct GuardStats {
    /// `global` or the provider's name.
    pub name: String,
    /// Units held (tentative ones included).
    pub held: u64,
    /// The limit.
    pub limit: u64,
    /// The limit's version.
    pub limit_version: u64,
}

/// One partition's counts.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 2))?;
/// let p = &pools.stats().partitions[0];
/// assert_eq!((p.active, p.active_limit, p.retry_limit, p.retry_remaining), (0, 2, 3, 3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PartitionStats {
    /// The partition's name.
    pub name: String,
    /// Its provider.
    pub provider: String,
    /// Its traffic class.
    pub traffic_class: String,
    /// The version of its limits.
    pub limit_version: u64,
    /// Observe (shadow) mode: limits counted, not enforced.
    pub observe: bool,
    /// Active requests (decisions not yet final included).
    pub active: u64,
    /// Of `active`, decisions not yet final.
    pub tentative: u64,
    /// The active limit.
    pub active_limit: u64,
    /// The high-priority reserve.
    pub high_priority_reserve: u64,
    /// Tokens held.
    pub tokens: u64,
    /// The token budget, if any.
    pub token_budget: Option<u64>,
    /// Requests waiting in the pending queue.
    pub pending: u64,
    /// The pending queue's limit (0: the class does not wait).
    pub pending_limit: u64,
    /// The longest a request may wait, in milliseconds.
    pub queue_max_age_ms: u64,
    /// How long the oldest waiter has waited (`None`: nobody waits).
    pub oldest_wait: Option<std::time::Duration>,
    /// Requests that entered the pending queue.
    pub queued: u64,
    /// Requests refused at the queue's entry (queue full, deadline unmeetable).
    pub queue_refusals: u64,
    /// Waiters that left without starting: their queue age or their deadline passed.
    pub timed_out: u64,
    /// Retries in flight (Envoy's `rq_retry_open` when at the limit).
    pub retries_in_flight: u64,
    /// The retry budget's current limit.
    pub retry_limit: u64,
    /// Retries the budget still allows now (Envoy's `remaining_retries`).
    pub retry_remaining: u64,
    /// Whether the retry budget is full (Envoy's `rq_retry_open`).
    pub retry_open: bool,
    /// Retries refused by the budget (Envoy's `upstream_rq_retry_overflow`).
    pub retry_overflow: u64,
    /// Retries charged.
    pub retries_charged: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Admitted requests that ended (admitted less those active at the read).
    pub completed: u64,
    /// Refusals by the active limit.
    pub refused_active: u64,
    /// Refusals of normal priority by the high-priority reserve.
    pub refused_reserve: u64,
    /// Refusals by the token budget.
    pub refused_tokens: u64,
    /// Refusals by the provider's connection limit.
    pub refused_connection: u64,
    /// Refusals by the global guard.
    pub refused_global: u64,
    /// Requests this partition sent to a fallback.
    pub fallbacks: u64,
    /// Requests answered with a degraded result.
    pub degraded: u64,
    /// Observe mode: admissions (and retries) a limit would have refused.
    pub shadow_refusals: u64,
    /// Refusals that first waited for other decisions in progress (their tentative units) to
    /// be confirmed or undone; each was then explained by admitted requests. A measure of
    /// contention, not of error.
    pub contended_refusals: u64,
    /// Decisions taken again because a reconfiguration overlapped them.
    pub reconfig_retries: u64,
}

pub(crate) fn read(e: &Engine, oldest: &[Option<std::time::Duration>]) -> super::PoolsStats {
    let (gv, [gl]) = e.global_limits.read();
    let global = GuardStats {
        name: "global".into(),
        held: e.global.held(),
        limit: gl,
        limit_version: gv / 2,
    };
    let providers = e
        .providers
        .iter()
        .map(|p| {
            let (v, [l]) = p.limits.read();
            GuardStats {
                name: p.name.clone(),
                held: p.conns.held(),
                limit: l,
                limit_version: v / 2,
            }
        })
        .collect();
    let partitions = e
        .partitions
        .iter()
        .zip(oldest)
        .map(|(p, &oldest_wait)| {
            let (v, l) = p.limits.read();
            let a = p.hot.active.read();
            let c = &p.hot.counters;
            let get = |x: &crate::sync::AtomicU64| x.load(Ordering::Relaxed);
            let pending = get(&p.hot.pending);
            let rl = retry_limit(
                l[RETRY_PERCENT],
                l[RETRY_MIN],
                a.active - a.tentative,
                pending,
            );
            PartitionStats {
                name: p.name.clone(),
                provider: e.providers[p.provider].name.clone(),
                traffic_class: e.classes[p.class].clone(),
                limit_version: v / 2,
                observe: l[OBSERVE] != 0,
                active: a.active,
                tentative: a.tentative,
                active_limit: l[ACTIVE_LIMIT],
                high_priority_reserve: l[RESERVE],
                tokens: p.tokens.held(),
                token_budget: (l[TOKEN_BUDGET] != 0).then_some(l[TOKEN_BUDGET]),
                pending,
                pending_limit: l[PENDING_LIMIT],
                queue_max_age_ms: l[MAX_AGE_MS],
                oldest_wait,
                queued: get(&c.queued),
                queue_refusals: get(&c.queue_refusals),
                timed_out: get(&c.timed_out),
                retries_in_flight: a.retries,
                retry_limit: rl,
                retry_remaining: rl.saturating_sub(a.retries),
                retry_open: a.retries >= rl,
                retry_overflow: get(&c.retry_overflow),
                retries_charged: get(&c.retries_charged),
                admitted: get(&c.admitted),
                // Derived (engine.rs, `Counters::admitted`), from two reads: while requests
                // are admitted it may be off by the admissions in progress (never below 0).
                completed: get(&c.admitted).saturating_sub(a.active - a.tentative),
                refused_active: get(&c.refused[0]),
                refused_reserve: get(&c.refused[1]),
                refused_tokens: get(&c.refused[2]),
                refused_connection: get(&c.refused[3]),
                refused_global: get(&c.refused[4]),
                fallbacks: get(&c.fallbacks),
                degraded: get(&c.degraded),
                shadow_refusals: get(&c.shadow_refusals),
                contended_refusals: get(&c.contended_refusals),
                reconfig_retries: get(&c.reconfig_retries),
            }
        })
        .collect();
    super::PoolsStats {
        global,
        providers,
        partitions,
    }
}

/// Sets the pools' gauges through the `metrics` facade (feature `metrics`), labelled by
/// partition or provider: active, active limit, retries in flight, retry limit, tokens,
/// connections, and the global guard.
#[cfg(feature = "metrics")]
pub(crate) fn record_gauges(s: &PoolsStats) {
    metrics::gauge!("llm_bulkhead_pool_global_active").set(s.global.held as f64);
    metrics::gauge!("llm_bulkhead_pool_global_limit").set(s.global.limit as f64);
    for p in &s.providers {
        let l = p.name.clone();
        metrics::gauge!("llm_bulkhead_pool_connections", "provider" => l.clone())
            .set(p.held as f64);
        metrics::gauge!("llm_bulkhead_pool_connection_limit", "provider" => l).set(p.limit as f64);
    }
    for p in &s.partitions {
        let gauge = |name: &'static str, v: u64| {
            metrics::gauge!(name, "partition" => p.name.clone(), "provider" => p.provider.clone(),
                "traffic_class" => p.traffic_class.clone())
            .set(v as f64)
        };
        gauge("llm_bulkhead_pool_active", p.active);
        gauge("llm_bulkhead_pool_active_limit", p.active_limit);
        gauge("llm_bulkhead_pool_pending", p.pending);
        gauge("llm_bulkhead_pool_pending_limit", p.pending_limit);
        let age = p.oldest_wait.map_or(0, |d| d.as_millis() as u64);
        gauge("llm_bulkhead_pool_oldest_wait_ms", age);
        gauge("llm_bulkhead_pool_tokens", p.tokens);
        gauge("llm_bulkhead_pool_retries_in_flight", p.retries_in_flight);
        gauge("llm_bulkhead_pool_retry_limit", p.retry_limit);
        gauge("llm_bulkhead_pool_retry_overflow", p.retry_overflow);
        gauge("llm_bulkhead_pool_limit_version", p.limit_version);
    }
}
