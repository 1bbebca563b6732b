//! The pools' configuration: a providers × classes matrix as data (TOML or JSON), and its
//! validation. Every struct refuses unknown fields; the seed's camelCase names (`activeLimit`,
//! `pendingLimit`, `connectionLimit`, `queueMaxAgeMs`, ...) are aliases of the snake_case
//! names the crate writes. Every error names the cell it is about.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The most attempts one request may make (its first partition and its fallbacks).
pub const MAX_ATTEMPTS: u32 = 8;

/// A pools configuration: the global guard, the providers, the traffic classes, and the
/// partitions that join them. Build it with [`Pools::new`](super::Pools::new).
///
/// ```
/// # #[cfg(feature = "toml")] {
/// use llm_bulkhead::pools::{PoolsConfig, Overflow};
/// let c = PoolsConfig::from_toml(r#"
///     [global]
///     maxActive = 48
///     [providers.primary]
///     connectionLimit = 32
///     [providers.secondary]
///     connection_limit = 16
///     [classes.interactive]
///     overflow = "fallback"
///     [classes.batch]
///     overflow = "reject"
///     [partitions.primary-interactive]
///     provider = "primary"
///     trafficClass = "interactive"
///     activeLimit = 24
///     highPriorityReserve = 4
///     fallback = ["secondary-interactive"]
///     [partitions.secondary-interactive]
///     provider = "secondary"
///     traffic_class = "interactive"
///     active_limit = 12
///     [partitions.primary-batch]
///     provider = "primary"
///     traffic_class = "batch"
///     active_limit = 8
///     retry = { percent = 10, min = 1 }
/// "#).unwrap();
/// assert_eq!(c.classes["interactive"].overflow, Overflow::Fallback);
/// assert!(c.validate().is_ok());
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolsConfig {
    /// The global guard over every partition together.
    pub global: GlobalConfig,
    /// Providers by name, each with its connection limit.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Traffic classes by name, each with its overflow action.
    #[serde(default)]
    pub classes: BTreeMap<String, ClassConfig>,
    /// Partitions by name.
    #[serde(default)]
    pub partitions: BTreeMap<String, PartitionConfig>,
    /// The attempt budget of one request: its first partition and its fallbacks together
    /// (1 to [`MAX_ATTEMPTS`]).
    #[serde(default = "default_attempts", alias = "maxAttempts")]
    pub max_attempts: u32,
}

fn default_attempts() -> u32 {
    3
}

impl Default for PoolsConfig {
    /// Empty (it does not validate: no partition), with an attempt budget of 3.
    fn default() -> Self {
        PoolsConfig {
            global: GlobalConfig::default(),
            providers: BTreeMap::new(),
            classes: BTreeMap::new(),
            partitions: BTreeMap::new(),
            max_attempts: default_attempts(),
        }
    }
}

/// The global guard: at most `max_active` admitted requests over all partitions.
///
/// ```
/// let g = llm_bulkhead::pools::GlobalConfig { max_active: 64 };
/// assert_eq!(g.max_active, 64);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalConfig {
    /// The most admitted requests over all partitions.
    #[serde(alias = "maxActive")]
    pub max_active: u64,
}

/// A provider: a connection limit its partitions share.
///
/// ```
/// let p = llm_bulkhead::pools::ProviderConfig { connection_limit: 32 };
/// assert_eq!(p.connection_limit, 32);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The most admitted requests (each holds one connection) over the provider's partitions.
    #[serde(alias = "connectionLimit")]
    pub connection_limit: u64,
}

/// A traffic class: what happens when its partition is full.
///
/// ```
/// use llm_bulkhead::pools::{ClassConfig, Overflow};
/// assert_eq!(ClassConfig::default().overflow, Overflow::Reject);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// The one documented overflow action of the class.
    #[serde(default)]
    pub overflow: Overflow,
}

/// The overflow action of a traffic class: what a full partition does with a request.
///
/// ```
/// use llm_bulkhead::pools::Overflow;
/// assert_eq!(Overflow::default(), Overflow::Reject);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// A fast local rejection with the refusal's reason.
    #[default]
    Reject,
    /// Try the partition's approved fallbacks, in order, each with its own budget; a request
    /// that allows no fallback, or finds none with capacity, is rejected.
    Fallback,
    /// Answer with the gateway's documented degraded result (the caller serves it); no
    /// provider is called.
    Degrade,
    /// A bounded wait in the partition's pending queue (at most `pending_limit` waiters, each
    /// at most `queue_max_age_ms`), through [`Pools::admit_blocking`](super::Pools::admit_blocking)
    /// or [`Pools::admit_async`](super::Pools::admit_async); a caller that cannot wait
    /// ([`Pools::admit`](super::Pools::admit)) is rejected.
    Wait,
}

/// A partition: one provider, one traffic class, optionally one model family and tenant tier.
///
/// ```
/// use llm_bulkhead::pools::PartitionConfig;
/// let p = PartitionConfig::new("primary", "interactive", 24);
/// assert_eq!((p.active_limit, p.retry.percent, p.retry.min), (24, 20, 3));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionConfig {
    /// The provider's name (a key of [`PoolsConfig::providers`]).
    pub provider: String,
    /// The traffic class's name (a key of [`PoolsConfig::classes`]).
    #[serde(alias = "trafficClass", alias = "class")]
    pub traffic_class: String,
    /// A model family that splits the provider's class further (optional).
    #[serde(
        default,
        alias = "modelFamily",
        skip_serializing_if = "Option::is_none"
    )]
    pub model_family: Option<String>,
    /// A tenant tier that splits it further (optional).
    #[serde(default, alias = "tenantTier", skip_serializing_if = "Option::is_none")]
    pub tenant_tier: Option<String>,
    /// The most active (admitted) requests.
    #[serde(alias = "activeLimit")]
    pub active_limit: u64,
    /// Active units only high-priority requests may use (below `active_limit`).
    #[serde(default, alias = "highPriorityReserve")]
    pub high_priority_reserve: u64,
    /// The most tokens admitted requests may hold (optional).
    #[serde(
        default,
        alias = "tokenBudget",
        skip_serializing_if = "Option::is_none"
    )]
    pub token_budget: Option<u64>,
    /// The retry budget.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Approved fallback partitions, in order (the class's overflow must be `fallback`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback: Vec<String>,
    /// Observe (shadow) mode: the partition's own limits are counted, not enforced.
    #[serde(default)]
    pub observe: bool,
    /// The most requests waiting in the partition's pending queue (class overflow `wait`).
    #[serde(default, alias = "pendingLimit")]
    pub pending_limit: u64,
    /// The longest a request may wait in the pending queue, in milliseconds (class overflow
    /// `wait`); an older waiter is refused with [`Reason::QueueAgeExceeded`](super::Reason).
    #[serde(default, alias = "queueMaxAgeMs")]
    pub queue_max_age_ms: u64,
}

impl PartitionConfig {
    /// A partition of `provider` and `class` with `active_limit`, no reserve, no token budget,
    /// the default retry budget and no fallback.
    ///
    /// ```
    /// let p = llm_bulkhead::pools::PartitionConfig::new("a", "batch", 2);
    /// assert!(p.fallback.is_empty());
    /// ```
    pub fn new(provider: &str, class: &str, active_limit: u64) -> Self {
        PartitionConfig {
            provider: provider.to_owned(),
            traffic_class: class.to_owned(),
            model_family: None,
            tenant_tier: None,
            active_limit,
            high_priority_reserve: 0,
            token_budget: None,
            retry: RetryConfig::default(),
            fallback: Vec::new(),
            observe: false,
            pending_limit: 0,
            queue_max_age_ms: 0,
        }
    }
}

/// A retry budget of Envoy's shape: at most `max(percent × (active + pending) / 100, min)`
/// retries in flight (charged when a retry is decided, held through its back-off, given back
/// when its attempt ends). The defaults are Envoy's: 20 % and 3.
///
/// ```
/// let r = llm_bulkhead::pools::RetryConfig::default();
/// assert_eq!((r.percent, r.min), (20, 3));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Percent of the active requests (0 to 100).
    #[serde(default = "default_percent", alias = "budgetPercent")]
    pub percent: u64,
    /// Retries always allowed, whatever the active count.
    #[serde(default = "default_min", alias = "minRetryConcurrency")]
    pub min: u64,
}

fn default_percent() -> u64 {
    20
}
fn default_min() -> u64 {
    3
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            percent: default_percent(),
            min: default_min(),
        }
    }
}

/// Why a [`PoolsConfig`] (or a change of limits) was refused. Each names its cell:
/// `global`, `providers.NAME`, `classes.NAME` or `partitions.NAME`, and the field.
///
/// ```
/// use llm_bulkhead::pools::{PoolsConfig, PoolsConfigError};
/// assert_eq!(PoolsConfig::default().validate(), Err(PoolsConfigError::NoPartitions));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolsConfigError {
    /// No partition is configured.
    NoPartitions,
    /// A limit that must be positive is zero.
    ZeroLimit {
        /// The cell, e.g. `partitions.primary-interactive`.
        cell: String,
        /// The field.
        field: &'static str,
    },
    /// A limit is above what the words can count.
    TooLarge {
        /// The cell.
        cell: String,
        /// The field.
        field: &'static str,
        /// The largest value allowed.
        max: u64,
    },
    /// Two limits contradict each other (the text says which).
    Inconsistent {
        /// The cell.
        cell: String,
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A retry percent above 100.
    RetryPercentAbove100 {
        /// The cell.
        cell: String,
        /// The percent given.
        percent: u64,
    },
    /// A name that is not configured (a provider, a class or a fallback partition).
    Unknown {
        /// The cell that names it.
        cell: String,
        /// The field.
        field: &'static str,
        /// The unknown name.
        name: String,
    },
    /// A partition lists itself as its fallback.
    FallbackToSelf {
        /// The cell.
        cell: String,
    },
    /// The fallback graph has a cycle: these partitions, in order, back to the first.
    FallbackCycle {
        /// The partitions of the cycle.
        cycle: Vec<String>,
    },
    /// Two partitions have the same key (provider, class, model family, tenant tier).
    DuplicateKey {
        /// The cell.
        cell: String,
        /// The partition that already has the key.
        other: String,
    },
}

impl fmt::Display for PoolsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PoolsConfigError::*;
        match self {
            NoPartitions => write!(f, "no partition is configured"),
            ZeroLimit { cell, field } => write!(f, "{cell}.{field} must be positive"),
            TooLarge { cell, field, max } => write!(f, "{cell}.{field} is above {max}"),
            Inconsistent {
                cell,
                field,
                detail,
            } => write!(f, "{cell}.{field}: {detail}"),
            RetryPercentAbove100 { cell, percent } => {
                write!(f, "{cell}.retry.percent is {percent}, above 100")
            }
            Unknown { cell, field, name } => write!(f, "{cell}.{field}: unknown name `{name}`"),
            FallbackToSelf { cell } => write!(f, "{cell}.fallback lists the partition itself"),
            FallbackCycle { cycle } => {
                write!(f, "fallback cycle: {} -> {}", cycle.join(" -> "), cycle[0])
            }
            DuplicateKey { cell, other } => {
                write!(f, "{cell} has the same key as partitions.{other}")
            }
        }
    }
}

impl std::error::Error for PoolsConfigError {}

fn cell(name: &str) -> String {
    format!("partitions.{name}")
}

/// Checks one partition's limits (also for a change at run time).
pub(crate) fn check_limits(
    name: &str,
    p: &PartitionConfig,
    global: u64,
    connections: u64,
) -> Result<(), PoolsConfigError> {
    use super::words::{MAX_ACTIVE, MAX_GAUGE, MAX_RETRIES};
    use PoolsConfigError::*;
    let c = || cell(name);
    if p.active_limit == 0 {
        return Err(ZeroLimit {
            cell: c(),
            field: "active_limit",
        });
    }
    if p.active_limit > MAX_ACTIVE {
        return Err(TooLarge {
            cell: c(),
            field: "active_limit",
            max: MAX_ACTIVE,
        });
    }
    if p.token_budget == Some(0) {
        return Err(ZeroLimit {
            cell: c(),
            field: "token_budget",
        });
    }
    if p.token_budget.unwrap_or(0) > MAX_GAUGE {
        return Err(TooLarge {
            cell: c(),
            field: "token_budget",
            max: MAX_GAUGE,
        });
    }
    if p.high_priority_reserve >= p.active_limit {
        return Err(Inconsistent {
            cell: c(),
            field: "high_priority_reserve",
            detail: format!(
                "{} leaves no unit for normal priority below active_limit {}",
                p.high_priority_reserve, p.active_limit
            ),
        });
    }
    if p.active_limit > connections || p.active_limit > global {
        return Err(Inconsistent {
            cell: c(),
            field: "active_limit",
            detail: format!(
                "{} is above its provider's connection_limit {connections} or the global \
                 max_active {global}: it could never be reached",
                p.active_limit
            ),
        });
    }
    if p.retry.percent > 100 {
        return Err(RetryPercentAbove100 {
            cell: c(),
            percent: p.retry.percent,
        });
    }
    if p.retry.min > MAX_RETRIES {
        return Err(TooLarge {
            cell: c(),
            field: "retry.min",
            max: MAX_RETRIES,
        });
    }
    for (field, v, max) in [
        ("pending_limit", p.pending_limit, MAX_PENDING),
        ("queue_max_age_ms", p.queue_max_age_ms, MAX_AGE_MS),
    ] {
        if v > max {
            return Err(TooLarge {
                cell: c(),
                field,
                max,
            });
        }
    }
    Ok(())
}

/// The longest pending queue of a partition.
pub(crate) const MAX_PENDING: u64 = 1 << 24;
/// The longest queue age: one day.
pub(crate) const MAX_AGE_MS: u64 = 86_400_000;

/// Checks that a partition of a class that waits has a bounded wait: a pending limit and a
/// queue age, both positive (also for a change at run time).
pub(crate) fn check_queue(
    name: &str,
    p: &PartitionConfig,
    overflow: Overflow,
) -> Result<(), PoolsConfigError> {
    if overflow != Overflow::Wait {
        return Ok(());
    }
    for (field, v) in [
        ("pending_limit", p.pending_limit),
        ("queue_max_age_ms", p.queue_max_age_ms),
    ] {
        if v == 0 {
            return Err(PoolsConfigError::ZeroLimit {
                cell: cell(name),
                field,
            });
        }
    }
    Ok(())
}

impl PoolsConfig {
    /// Checks the whole configuration: every limit, every name, the partition keys, and that
    /// the fallback graph has no cycle.
    ///
    /// # Errors
    /// The first problem found, naming its cell.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut c = PoolsConfig::default();
    /// c.global.max_active = 8;
    /// c.providers.insert("a".into(), ProviderConfig { connection_limit: 8 });
    /// c.classes.insert("batch".into(), ClassConfig { overflow: Overflow::Fallback });
    /// let mut p = PartitionConfig::new("a", "batch", 4);
    /// p.fallback = vec!["a-batch".into()];
    /// c.partitions.insert("a-batch".into(), p);
    /// assert_eq!(c.validate(), Err(PoolsConfigError::FallbackToSelf { cell: "partitions.a-batch".into() }));
    /// ```
    pub fn validate(&self) -> Result<(), PoolsConfigError> {
        use PoolsConfigError::*;
        if self.partitions.is_empty() {
            return Err(NoPartitions);
        }
        let g = self.global.max_active;
        gauge_limit("global", "max_active", g)?;
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(Inconsistent {
                cell: "pools".into(),
                field: "max_attempts",
                detail: format!("{} is not between 1 and {MAX_ATTEMPTS}", self.max_attempts),
            });
        }
        for (name, p) in &self.providers {
            gauge_limit(
                &format!("providers.{name}"),
                "connection_limit",
                p.connection_limit,
            )?;
        }
        let mut keys = HashMap::new();
        for (name, p) in &self.partitions {
            let Some(provider) = self.providers.get(&p.provider) else {
                return Err(Unknown {
                    cell: cell(name),
                    field: "provider",
                    name: p.provider.clone(),
                });
            };
            let Some(class) = self.classes.get(&p.traffic_class) else {
                return Err(Unknown {
                    cell: cell(name),
                    field: "traffic_class",
                    name: p.traffic_class.clone(),
                });
            };
            check_limits(name, p, g, provider.connection_limit)?;
            let key = (
                &p.provider,
                &p.traffic_class,
                &p.model_family,
                &p.tenant_tier,
            );
            if let Some(other) = keys.insert(key, name) {
                return Err(DuplicateKey {
                    cell: cell(name),
                    other: other.clone(),
                });
            }
            self.check_fallbacks(name, p, class.overflow)?;
            check_queue(name, p, class.overflow)?;
        }
        match self.fallback_cycle() {
            Some(cycle) => Err(FallbackCycle { cycle }),
            None => Ok(()),
        }
    }

    fn check_fallbacks(
        &self,
        name: &str,
        p: &PartitionConfig,
        overflow: Overflow,
    ) -> Result<(), PoolsConfigError> {
        use PoolsConfigError::*;
        if overflow != Overflow::Fallback && !p.fallback.is_empty() {
            return Err(Inconsistent {
                cell: cell(name),
                field: "fallback",
                detail: format!(
                    "class `{}` has overflow {overflow:?}: a fallback list needs overflow \
                     Fallback",
                    p.traffic_class
                ),
            });
        }
        for t in &p.fallback {
            if t == name {
                return Err(FallbackToSelf { cell: cell(name) });
            }
            if !self.partitions.contains_key(t) {
                return Err(Unknown {
                    cell: cell(name),
                    field: "fallback",
                    name: t.clone(),
                });
            }
        }
        Ok(())
    }

    /// A cycle of the fallback graph, if there is one (depth-first, in name order).
    fn fallback_cycle(&self) -> Option<Vec<String>> {
        // 0: not seen, 1: on the current path, 2: done.
        let mut state: HashMap<&str, u8> = HashMap::new();
        let mut path: Vec<&str> = Vec::new();
        for start in self.partitions.keys() {
            if let Some(c) = self.visit(start, &mut state, &mut path) {
                return Some(c);
            }
        }
        None
    }

    fn visit<'a>(
        &'a self,
        node: &'a str,
        state: &mut HashMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|n| *n == node).unwrap_or(0);
                return Some(path[at..].iter().map(|s| (*s).to_owned()).collect());
            }
            _ => {}
        }
        state.insert(node, 1);
        path.push(node);
        for next in &self.partitions[node].fallback {
            if let Some(c) = self.visit(next, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(node, 2);
        None
    }

    /// Parses a configuration from TOML (feature `toml`); [`validate`](Self::validate) it
    /// (or build it) before use.
    ///
    /// # Errors
    /// A [`LoadError::Parse`](crate::config::LoadError) naming the field.
    ///
    /// ```
    /// use llm_bulkhead::pools::PoolsConfig;
    /// let e = PoolsConfig::from_toml("[global]\nmax_actve = 3\n").unwrap_err();
    /// assert!(e.to_string().contains("unknown field `max_actve`"));
    /// ```
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, crate::config::LoadError> {
        crate::config::parse_text(crate::config::Format::Toml, text)
    }

    /// Parses a configuration from JSON (feature `json`).
    ///
    /// # Errors
    /// A [`LoadError::Parse`](crate::config::LoadError) naming the field.
    ///
    /// ```
    /// use llm_bulkhead::pools::PoolsConfig;
    /// let c = PoolsConfig::from_json(r#"{"global": {"maxActive": 3}}"#).unwrap();
    /// assert_eq!(c.global.max_active, 3);
    /// ```
    #[cfg(feature = "json")]
    pub fn from_json(text: &str) -> Result<Self, crate::config::LoadError> {
        crate::config::parse_text(crate::config::Format::Json, text)
    }
}

fn gauge_limit(cell: &str, field: &'static str, v: u64) -> Result<(), PoolsConfigError> {
    use super::words::MAX_GAUGE;
    if v == 0 {
        return Err(PoolsConfigError::ZeroLimit {
            cell: cell.to_owned(),
            field,
        });
    }
    if v > MAX_GAUGE {
        return Err(PoolsConfigError::TooLarge {
            cell: cell.to_owned(),
            field,
            max: MAX_GAUGE,
        });
    }
    Ok(())
}
