//! The state of a [`Pools`](super::Pools) and its one decision over several resources.
//!
//! ## The decision
//!
//! A request is admitted only when it holds, together, a unit of its partition's active limit
//! (and its tokens, when the partition has a token budget), a connection of its provider and a
//! unit of the global guard. [`Engine::decide`] takes them in that order, each with a CAS that
//! succeeds only if the count stays within its limit:
//!
//! 1. the partition's active word, as a *tentative* unit (counted in the word's tentative part);
//! 2. the partition's tokens, tentatively;
//! 3. the provider's connections, tentatively;
//! 4. the global guard, tentatively;
//! 5. the versions of the three limit cells are read again: a change means a reconfiguration
//!    overlapped the decision, which then gives every unit back and decides again;
//! 6. the tentative marks are cleared: the admission is final.
//!
//! A refused step gives back the units taken before it, in reverse order, and the request is
//! refused with the reason of that step. Nothing waits while holding a unit of a later step
//! than the one it waits at (no hold-and-wait cycle, no deadlock), and a decision that meets
//! only committed units (the uncontended case) takes every step lock-free.
//!
//! **No overshoot, at any instant.** A count only grows by a CAS that checked the new value
//! against the limit the decision read; it shrinks by undo and release. So no count is ever
//! above its limit, tentative units included (Envoy's fetch-add-then-check, envoy#2927,
//! overshoots for a moment). After a reconfiguration to a lower limit, units admitted under the
//! older one stay until released, as in the core; no new unit is taken above the new limit once
//! [`apply_partition`](super::Pools::apply_partition) returns.
//!
//! **No spurious refusal.** A tentative unit that is later given back must not refuse another
//! request that no serial order refuses. So a step whose count is full only with tentative
//! units (the committed ones alone leave room) does not refuse: it waits for those decisions
//! to be confirmed or undone (a spin, then a yield: they are a few instructions from either)
//! and decides on what they leave (`words.rs`, `step`). A refusal is thus always explained by
//! committed holders at an instant of the call. The wait cannot be circular: a decision holds
//! tentative units only on the steps before the one it is at, and waits only at that step, so
//! every chain of waits runs forward through the steps and ends at step 5, which never waits.
//! It is the contended path's price: a decision that finds another in flight on a full count
//! waits for it (and, if that thread is preempted, until it runs again), where it used to
//! refuse. A refusal that waited is counted as `contended_refusals` in the partition's stats;
//! `tests/pools_races.rs` pins the race, and `tests/pools_stress.rs` classifies every
//! refusal against the committed holders of its limit.

use super::config::{check_limits, Overflow, PartitionConfig, PoolsConfig, PoolsConfigError};
use super::events::{DecisionEvent, PoolsObserver, Reason};
use super::words::{retry_limit, ActiveWord, Gauge, LimitCell};
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::Priority;
use crossbeam_utils::CachePadded;
use std::time::Instant;

/// Limit words of a partition: active limit, reserve, token budget (0: none), retry percent,
/// retry min, observe, pending limit, queue max age (ms).
pub(crate) const ACTIVE_LIMIT: usize = 0;
pub(crate) const RESERVE: usize = 1;
pub(crate) const TOKEN_BUDGET: usize = 2;
pub(crate) const RETRY_PERCENT: usize = 3;
pub(crate) const RETRY_MIN: usize = 4;
pub(crate) const OBSERVE: usize = 5;
pub(crate) const PENDING_LIMIT: usize = 6;
pub(crate) const MAX_AGE_MS: usize = 7;

/// Per-partition counters (relaxed: statistics only).
#[derive(Default)]
pub(crate) struct Counters {
    /// Admissions (their completions are `admitted` less the final active units: a release
    /// counts nothing, which keeps a read-modify-write off its path).
    pub(crate) admitted: AtomicU64,
    /// Refusals by the step that refused: active, reserve, tokens, connection, global.
    pub(crate) refused: [AtomicU64; 5],
    pub(crate) fallbacks: AtomicU64,
    pub(crate) degraded: AtomicU64,
    pub(crate) shadow_refusals: AtomicU64,
    pub(crate) contended_refusals: AtomicU64,
    pub(crate) reconfig_retries: AtomicU64,
    pub(crate) retries_charged: AtomicU64,
    pub(crate) retry_overflow: AtomicU64,
    /// Requests that entered the pending queue.
    pub(crate) queued: AtomicU64,
    /// Requests refused at the queue's entry.
    pub(crate) queue_refusals: AtomicU64,
    /// Waiters that left the pending queue without starting (their age, their deadline).
    pub(crate) timed_out: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The hot line of a partition: its active word and its counters.
pub(crate) struct Hot {
    pub(crate) active: ActiveWord,
    pub(crate) counters: Counters,
    /// Waiters in the partition's pending queue (changed under the queue's mutex; read by
    /// decisions that keep a newcomer behind them, and by stats).
    pub(crate) pending: AtomicU64,
}

pub(crate) struct Partition {
    pub(crate) name: String,
    pub(crate) provider: usize,
    pub(crate) class: usize,
    pub(crate) config: PartitionConfig,
    pub(crate) fallback: Box<[usize]>,
    pub(crate) overflow: Overflow,
    pub(crate) hot: CachePadded<Hot>,
    pub(crate) tokens: CachePadded<Gauge>,
    pub(crate) limits: LimitCell<8>,
}

pub(crate) struct Provider {
    pub(crate) name: String,
    pub(crate) conns: CachePadded<Gauge>,
    pub(crate) limits: LimitCell<1>,
}

pub(crate) struct Engine {
    pub(crate) global: CachePadded<Gauge>,
    pub(crate) global_limits: LimitCell<1>,
    pub(crate) providers: Box<[Provider]>,
    pub(crate) partitions: Box<[Partition]>,
    pub(crate) classes: Box<[String]>,
    pub(crate) max_attempts: u32,
    /// Serialises the writers of the limit cells.
    pub(crate) reconfig: Mutex<()>,
    pub(crate) observer: Option<Box<dyn PoolsObserver>>,
    /// Waiters in every pending queue: a release that finds it zero has nobody to start and
    /// takes no lock (`queue.rs`, "The hand-off").
    pub(crate) queued: AtomicU64,
    /// The clock of queue ages and deadlines (`Instant::now` unless one was injected).
    pub(crate) clock: Option<Box<dyn Fn() -> Instant + Send + Sync>>,
}

/// A refused decision: the reason and the limit version the decision read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) reason: Reason,
    pub(crate) version: u64,
    /// Not a refusal: a newcomer's units could have gone to queued waiters, so it gave them
    /// back to decide behind them, under the queue's mutex (`queue.rs`, "Fairness").
    pub(crate) behind: bool,
}

/// An admitted decision: the version, and whether observe mode let it past a partition limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) version: u64,
    pub(crate) shadow: bool,
    /// Tokens taken (0 when the partition had no budget).
    pub(crate) tokens: u64,
}

pub(crate) fn partition_words(p: &PartitionConfig) -> [u64; 8] {
    [
        p.active_limit,
        p.high_priority_reserve,
        p.token_budget.unwrap_or(0),
        p.retry.percent,
        p.retry.min,
        u64::from(p.observe),
        p.pending_limit,
        p.queue_max_age_ms,
    ]
}

impl Engine {
    pub(crate) fn new(
        c: &PoolsConfig,
        observer: Option<Box<dyn PoolsObserver>>,
    ) -> Result<Engine, PoolsConfigError> {
        c.validate()?;
        let providers: Vec<Provider> = c
            .providers
            .iter()
            .map(|(name, p)| Provider {
                name: name.clone(),
                conns: CachePadded::new(Gauge::default()),
                limits: LimitCell::new([p.connection_limit]),
            })
            .collect();
        let classes: Vec<String> = c.classes.keys().cloned().collect();
        let names: Vec<&String> = c.partitions.keys().collect();
        let index = |list: &[&String], n: &str| list.iter().position(|x| *x == n);
        let partitions = c
            .partitions
            .iter()
            .map(|(name, p)| Partition {
                name: name.clone(),
                provider: index(&c.providers.keys().collect::<Vec<_>>(), &p.provider).unwrap_or(0),
                class: classes
                    .iter()
                    .position(|x| *x == p.traffic_class)
                    .unwrap_or(0),
                config: p.clone(),
                // Names were checked by `validate`.
                fallback: p.fallback.iter().filter_map(|t| index(&names, t)).collect(),
                overflow: c.classes[&p.traffic_class].overflow,
                hot: CachePadded::new(Hot {
                    active: ActiveWord::default(),
                    counters: Counters::default(),
                    pending: AtomicU64::new(0),
                }),
                tokens: CachePadded::new(Gauge::default()),
                limits: LimitCell::new(partition_words(p)),
            })
            .collect();
        Ok(Engine {
            global: CachePadded::new(Gauge::default()),
            global_limits: LimitCell::new([c.global.max_active]),
            providers: providers.into(),
            partitions,
            classes: classes.into(),
            max_attempts: c.max_attempts,
            reconfig: Mutex::new(()),
            observer,
            queued: AtomicU64::new(0),
            clock: None,
        })
    }

    /// Now, on the pools' clock.
    pub(crate) fn now(&self) -> Instant {
        match &self.clock {
            Some(c) => c(),
            None => Instant::now(),
        }
    }

    /// One decision on partition `pi` (module docs, "The decision"). `COUNT`: a refusal is
    /// counted in the partition's stats (a newcomer's); a queued waiter judged again by the
    /// start rule is not counted at each look. `FAIR`: a newcomer deciding without the
    /// queue's mutex, which defers to the queued waiters that may need a unit it took
    /// (`queue.rs`, "Fairness").
    #[inline]
    pub(crate) fn decide<const COUNT: bool, const FAIR: bool>(
        &self,
        pi: usize,
        priority: Priority,
        tokens: u64,
    ) -> Result<Granted, Refused> {
        let p = &self.partitions[pi];
        let prov = &self.providers[p.provider];
        loop {
            let (pv, pl) = p.limits.read();
            let (cv, [conn_limit]) = prov.limits.read();
            let (gv, [global_limit]) = self.global_limits.read();
            let version = pv / 2;
            let refuse = |reason| {
                Err(Refused {
                    reason,
                    version,
                    behind: false,
                })
            };
            let enforce = pl[OBSERVE] == 0;
            let cap = match priority {
                Priority::High => pl[ACTIVE_LIMIT],
                Priority::Normal => pl[ACTIVE_LIMIT] - pl[RESERVE],
            };
            // 1. The partition's active unit (tentative).
            let mut shadow = match p.hot.active.take(cap, enforce) {
                Ok(over) => over,
                Err(full) => {
                    let c = p.hot.active.read();
                    let reserve = c.active - c.tentative < pl[ACTIVE_LIMIT];
                    self.count_refusal::<COUNT>(p, usize::from(reserve), full.waited);
                    let reason = if reserve {
                        Reason::HighPriorityReserve
                    } else {
                        Reason::ActiveLimitReached
                    };
                    return refuse(reason);
                }
            };
            crate::sync::pause(crate::sync::PausePoint::PoolsTentativeTaken);
            // 2. The partition's tokens (tentative), when it has a budget.
            let budget = pl[TOKEN_BUDGET];
            let take_tokens = budget != 0 && tokens != 0;
            if take_tokens {
                let limit = if enforce {
                    budget
                } else {
                    super::words::MAX_GAUGE
                };
                match p.tokens.take(tokens, limit, true) {
                    Ok(()) => shadow |= !enforce && p.tokens.held() > budget,
                    Err(full) => {
                        p.hot.active.give(true, false);
                        self.count_refusal::<COUNT>(p, 2, full.waited);
                        return refuse(Reason::TokenBudgetReached);
                    }
                }
            }
            // 3. The provider's connection (tentative).
            if let Err(full) = prov.conns.take(1, conn_limit, true) {
                self.undo_partition(p, take_tokens.then_some(tokens));
                self.count_refusal::<COUNT>(p, 3, full.waited);
                return refuse(Reason::ConnectionLimitReached);
            }
            // 4. The global guard (tentative: step 5 may still give it back).
            if let Err(full) = self.global.take(1, global_limit, true) {
                prov.conns.give(1, true);
                self.undo_partition(p, take_tokens.then_some(tokens));
                self.count_refusal::<COUNT>(p, 4, full.waited);
                return refuse(Reason::GlobalLimitReached);
            }
            // 5. No reconfiguration overlapped the steps: every limit read was in force at
            // each CAS. Otherwise give everything back and decide under the new limits.
            if !(p.limits.unchanged(pv)
                && prov.limits.unchanged(cv)
                && self.global_limits.unchanged(gv))
            {
                self.global.give(1, true);
                prov.conns.give(1, true);
                self.undo_partition(p, take_tokens.then_some(tokens));
                bump(&p.hot.counters.reconfig_retries);
                continue;
            }
            // 5b. A newcomer whose units may be what queued waiters wait for gives them back
            // and decides behind those waiters (`queue.rs`, "Fairness"). After its steps, so
            // that a release's freed unit it took is seen with the waiters it was meant for.
            if FAIR && self.behind_waiters(p, conn_limit, global_limit) {
                self.global.give(1, true);
                prov.conns.give(1, true);
                self.undo_partition(p, take_tokens.then_some(tokens));
                return Err(Refused {
                    reason: Reason::CapacityAvailable,
                    version,
                    behind: true,
                });
            }
            // 6. Final.
            self.global.confirm();
            p.hot.active.confirm();
            if take_tokens {
                p.tokens.confirm();
            }
            prov.conns.confirm();
            bump(&p.hot.counters.admitted);
            if shadow {
                bump(&p.hot.counters.shadow_refusals);
            }
            return Ok(Granted {
                version,
                shadow,
                tokens: if take_tokens { tokens } else { 0 },
            });
        }
    }

    /// Whether a newcomer that holds its units (tentatively) may have taken one that a queued
    /// waiter needs: waiters wait, and its partition has some, or its provider's connections
    /// or the global guard have fewer free units left than there are waiters. The waiters'
    /// count is read after the steps, SeqCst: a release that freed a unit before a waiter's
    /// entry counted it is not one the waiter was owed (`queue.rs`, "Fairness").
    #[inline]
    fn behind_waiters(&self, p: &Partition, conn_limit: u64, global_limit: u64) -> bool {
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_NEWCOMER_JUMPS") {
            // Broken on purpose: a newcomer keeps a unit freed for a waiter
            // (`loom-tests/tests/pools_queue.rs`).
            return false;
        }
        crate::sync::loom_sc_fence();
        let waiters = self.queued.load(Ordering::SeqCst);
        if waiters == 0 {
            return false;
        }
        let free = |limit: u64, g: &Gauge| limit.saturating_sub(g.held());
        p.hot.pending.load(Ordering::SeqCst) != 0
            || free(conn_limit, &self.providers[p.provider].conns) < waiters
            || free(global_limit, &self.global) < waiters
    }

    fn undo_partition(&self, p: &Partition, tokens: Option<u64>) {
        if let Some(n) = tokens {
            p.tokens.give(n, true);
        }
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_SKIP_UNDO") {
            // Broken on purpose: the partition's tentative unit is never given back
            // (`loom-tests/tests/pools.rs` fails on it).
            return;
        }
        p.hot.active.give(true, false);
    }

    fn count_refusal<const COUNT: bool>(&self, p: &Partition, step: usize, waited: bool) {
        if !COUNT {
            return;
        }
        bump(&p.hot.counters.refused[step]);
        if waited {
            bump(&p.hot.counters.contended_refusals);
        }
    }

    /// Gives back an admission's units: global, connection, tokens, then the active unit (and
    /// its retry unit).
    #[inline]
    pub(crate) fn release(&self, pi: usize, tokens: u64, retry: bool) {
        let p = &self.partitions[pi];
        self.global.give(1, false);
        self.providers[p.provider].conns.give(1, false);
        if tokens != 0 {
            p.tokens.give(tokens, false);
        }
        p.hot.active.give(false, retry);
    }

    /// Charges a retry to partition `pi`: `Ok((version, limit))` or the refusal.
    pub(crate) fn charge_retry(&self, pi: usize) -> Result<(u64, u64), Refused> {
        let p = &self.partitions[pi];
        let (pv, pl) = p.limits.read();
        let enforce = pl[OBSERVE] == 0;
        // Waiters count in the budget's base (Envoy: active + pending); read before the
        // charge's CAS, so the limit is the one of that instant.
        let pending = p.hot.pending.load(Ordering::SeqCst);
        match p
            .hot
            .active
            .charge_retry(pl[RETRY_PERCENT], pl[RETRY_MIN], pending, enforce)
        {
            Ok((limit, over)) => {
                bump(&p.hot.counters.retries_charged);
                if over {
                    bump(&p.hot.counters.shadow_refusals);
                }
                Ok((pv / 2, limit))
            }
            Err(_) => {
                bump(&p.hot.counters.retry_overflow);
                Err(Refused {
                    reason: Reason::RetryBudgetReached,
                    version: pv / 2,
                    behind: false,
                })
            }
        }
    }

    /// A decision event for partition `pi`, read after the decision.
    pub(crate) fn event<'a>(
        &'a self,
        pi: usize,
        request_id: u64,
        priority: Priority,
        d: (super::events::Decision, Reason, u64),
        fallback: Option<usize>,
        attempt: u32,
    ) -> DecisionEvent<'a> {
        let p = &self.partitions[pi];
        let (_, pl) = p.limits.read();
        let c = p.hot.active.read();
        DecisionEvent {
            request_id,
            provider: &self.providers[p.provider].name,
            partition: &p.name,
            traffic_class: &self.classes[p.class],
            priority,
            active: c.active,
            active_limit: pl[ACTIVE_LIMIT],
            pending: p.hot.pending.load(Ordering::Relaxed),
            pending_limit: pl[PENDING_LIMIT],
            retry_count: c.retries,
            retry_limit: retry_limit(
                pl[RETRY_PERCENT],
                pl[RETRY_MIN],
                c.active - c.tentative,
                p.hot.pending.load(Ordering::Relaxed),
            ),
            decision: d.0,
            reason: d.1,
            fallback_partition: fallback.map(|f| self.partitions[f].name.as_str()),
            limit_version: d.2,
            attempt,
        }
    }

    /// Installs a partition's new limits (same provider, class, keys and fallbacks).
    pub(crate) fn apply_partition(
        &self,
        pi: usize,
        next: &PartitionConfig,
    ) -> Result<u64, PoolsConfigError> {
        let _serial = crate::sync::lock(&self.reconfig);
        let p = &self.partitions[pi];
        let same_shape = next.provider == p.config.provider
            && next.traffic_class == p.config.traffic_class
            && next.model_family == p.config.model_family
            && next.tenant_tier == p.config.tenant_tier
            && next.fallback == p.config.fallback;
        if !same_shape {
            return Err(PoolsConfigError::Inconsistent {
                cell: format!("partitions.{}", p.name),
                field: "provider",
                detail: "a change of limits keeps the partition's provider, class, keys and \
                         fallbacks"
                    .into(),
            });
        }
        let (_, [g]) = self.global_limits.read();
        let (_, [c]) = self.providers[p.provider].limits.read();
        check_limits(&p.name, next, g, c)?;
        super::config::check_queue(&p.name, next, p.overflow)?;
        Ok(p.limits.store(partition_words(next)) / 2)
    }

    /// Installs a provider's connection limit (at least every partition's active limit).
    pub(crate) fn apply_provider(&self, vi: usize, limit: u64) -> Result<u64, PoolsConfigError> {
        let _serial = crate::sync::lock(&self.reconfig);
        let cell = format!("providers.{}", self.providers[vi].name);
        self.check_gauge(cell, "connection_limit", limit, Some(vi))?;
        Ok(self.providers[vi].limits.store([limit]) / 2)
    }

    /// Installs the global guard's limit (at least every partition's active limit).
    pub(crate) fn apply_global(&self, limit: u64) -> Result<u64, PoolsConfigError> {
        let _serial = crate::sync::lock(&self.reconfig);
        self.check_gauge("global".into(), "max_active", limit, None)?;
        Ok(self.global_limits.store([limit]) / 2)
    }

    fn check_gauge(
        &self,
        cell: String,
        field: &'static str,
        limit: u64,
        provider: Option<usize>,
    ) -> Result<(), PoolsConfigError> {
        if limit == 0 {
            return Err(PoolsConfigError::ZeroLimit { cell, field });
        }
        if limit > super::words::MAX_GAUGE {
            let max = super::words::MAX_GAUGE;
            return Err(PoolsConfigError::TooLarge { cell, field, max });
        }
        for p in self.partitions.iter() {
            let (_, pl) = p.limits.read();
            if provider.is_none_or(|v| v == p.provider) && pl[ACTIVE_LIMIT] > limit {
                return Err(PoolsConfigError::Inconsistent {
                    cell,
                    field,
                    detail: format!(
                        "{limit} is below partitions.{}.active_limit {}",
                        p.name, pl[ACTIVE_LIMIT]
                    ),
                });
            }
        }
        Ok(())
    }
}
