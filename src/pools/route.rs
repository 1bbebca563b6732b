//! Classification, the routed admission with its overflow action and fallbacks, and retries.

use super::config::{Overflow, MAX_ATTEMPTS};
use super::engine::{bump, Granted, Refused};
use super::events::{Decision, Reason};
use super::{PartitionId, PoolPermit, Pools, RetryCharge};
use crate::Priority;
use std::fmt;
use std::time::Instant;

/// What a request is, for [`Pools::classify`]: its provider and traffic class, and optionally
/// its model family and tenant tier.
///
/// ```
/// use llm_bulkhead::pools::Classification;
/// let c = Classification::new("primary", "interactive").model_family("gpt").tenant_tier("gold");
/// assert_eq!(c.tenant_tier, Some("gold"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classification<'a> {
    /// The provider's name.
    pub provider: &'a str,
    /// The traffic class's name.
    pub traffic_class: &'a str,
    /// The model family, if partitions split by it.
    pub model_family: Option<&'a str>,
    /// The tenant tier, if partitions split by it.
    pub tenant_tier: Option<&'a str>,
}

impl<'a> Classification<'a> {
    /// A classification by provider and traffic class.
    ///
    /// ```
    /// let c = llm_bulkhead::pools::Classification::new("p", "c");
    /// assert!(c.model_family.is_none());
    /// ```
    pub fn new(provider: &'a str, traffic_class: &'a str) -> Self {
        Classification {
            provider,
            traffic_class,
            model_family: None,
            tenant_tier: None,
        }
    }

    /// With a model family.
    ///
    /// ```
    /// let c = llm_bulkhead::pools::Classification::new("p", "c").model_family("m");
    /// assert_eq!(c.model_family, Some("m"));
    /// ```
    pub fn model_family(mut self, family: &'a str) -> Self {
        self.model_family = Some(family);
        self
    }

    /// With a tenant tier.
    ///
    /// ```
    /// let c = llm_bulkhead::pools::Classification::new("p", "c").tenant_tier("t");
    /// assert_eq!(c.tenant_tier, Some("t"));
    /// ```
    pub fn tenant_tier(mut self, tier: &'a str) -> Self {
        self.tenant_tier = Some(tier);
        self
    }
}

/// A classification or name that matches nothing configured.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// assert_eq!(pools.classify(&Classification::new("x", "c")), Err(RouteError::UnknownProvider("x".into())));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    /// No provider has this name.
    UnknownProvider(String),
    /// No traffic class has this name.
    UnknownClass(String),
    /// No partition has this name.
    UnknownPartition(String),
    /// The provider and class exist, but no partition of theirs matches the model family and
    /// tenant tier.
    NoPartition {
        /// The provider.
        provider: String,
        /// The class.
        traffic_class: String,
    },
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::UnknownProvider(n) => write!(f, "unknown provider `{n}`"),
            RouteError::UnknownClass(n) => write!(f, "unknown traffic class `{n}`"),
            RouteError::UnknownPartition(n) => write!(f, "unknown partition `{n}`"),
            RouteError::NoPartition {
                provider,
                traffic_class,
            } => write!(
                f,
                "no partition of provider `{provider}` and class `{traffic_class}` matches"
            ),
        }
    }
}

impl std::error::Error for RouteError {}

/// A classified request: its id (for events), partition, priority, tokens (counted against a
/// partition's token budget) and whether policy allows it a fallback.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let r = PoolRequest::new(42, pools.partition("p-c")?);
/// assert!(r.allow_fallback);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRequest {
    /// The caller's request id (events carry it; nothing else of the request is kept).
    pub request_id: u64,
    /// The partition chosen by classification.
    pub partition: PartitionId,
    /// The priority: high may use the partition's reserve.
    pub priority: Priority,
    /// Tokens the request holds while admitted (0: none).
    pub tokens: u64,
    /// Whether policy allows this request a fallback partition.
    pub allow_fallback: bool,
}

impl PoolRequest {
    /// A normal-priority request with no tokens that allows a fallback.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let r = PoolRequest::new(1, pools.partition("p-c")?);
    /// assert_eq!((r.tokens, r.priority), (0, llm_bulkhead::Priority::Normal));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(request_id: u64, partition: PartitionId) -> Self {
        PoolRequest {
            request_id,
            partition,
            priority: Priority::Normal,
            tokens: 0,
            allow_fallback: true,
        }
    }
}

/// One decision made for a request, as its [`Route`] lists it.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let out = pools.admit(&PoolRequest::new(1, pools.partition("p-c")?));
/// let d = out.route().decisions()[0];
/// assert_eq!((d.decision, d.reason, d.attempt), (Decision::Dispatch, Reason::CapacityAvailable, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DecisionRecord {
    /// The partition that decided.
    pub partition: PartitionId,
    /// What it decided.
    pub decision: Decision,
    /// Why (for a refusal: the limit that refused).
    pub reason: Reason,
    /// Where the request went next ([`Decision::Fallback`]).
    pub fallback: Option<PartitionId>,
    /// The partition's limit version the decision read.
    pub limit_version: u64,
    /// The attempt number (1 for the first partition).
    pub attempt: u32,
}

impl serde::Serialize for PartitionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

/// Every decision made for one request, in order (at most [`MAX_ATTEMPTS`]), and why the
/// search ended when it ended without a dispatch.
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let id = pools.partition("p-c")?;
/// let _held = pools.admit(&PoolRequest::new(1, id)).into_permit();
/// let out = pools.admit(&PoolRequest::new(2, id));
/// assert_eq!(out.route().decisions().len(), 1);
/// assert!(out.route().visited(id));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Route {
    len: u8,
    items: [Option<DecisionRecord>; MAX_ATTEMPTS as usize],
    /// Why the search ended without a dispatch, when it was the fallback policy that ended it
    /// ([`Reason::NoEligibleFallback`] or [`Reason::AttemptBudgetSpent`]).
    pub ended_by: Option<Reason>,
}

impl Route {
    pub(crate) fn new() -> Route {
        Route {
            len: 0,
            items: [None; MAX_ATTEMPTS as usize],
            ended_by: None,
        }
    }

    /// The decisions, in order.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.admit(&PoolRequest::new(1, pools.partition("p-c")?)).route().decisions().len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decisions(&self) -> Vec<DecisionRecord> {
        self.items[..self.len as usize]
            .iter()
            .flatten()
            .copied()
            .collect()
    }

    /// Whether a decision for this request was already made by `partition`.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// assert!(pools.admit(&PoolRequest::new(1, id)).route().visited(id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn visited(&self, partition: PartitionId) -> bool {
        self.items[..self.len as usize]
            .iter()
            .flatten()
            .any(|d| d.partition == partition)
    }

    /// The number of attempts (partitions that decided).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.admit(&PoolRequest::new(1, pools.partition("p-c")?)).route().attempts(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attempts(&self) -> u32 {
        u32::from(self.len)
    }

    fn push(&mut self, d: DecisionRecord) {
        self.items[self.len as usize] = Some(d);
        self.len += 1;
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("decisions", &self.decisions())
            .field("ended_by", &self.ended_by)
            .finish()
    }
}

/// The answer of [`Pools::admit`]: admitted (with the permit), or refused with the class's
/// overflow action (rejected, or degraded). Each carries the request's [`Route`].
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let out = pools.admit(&PoolRequest::new(1, pools.partition("p-c")?));
/// assert!(matches!(out, PoolOutcome::Dispatched { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use]
pub enum PoolOutcome<'p> {
    /// Admitted: call the provider of the permit's partition.
    Dispatched {
        /// The admission.
        permit: PoolPermit<'p>,
        /// Every decision made.
        route: Route,
    },
    /// Refused: answer with an overload error (`bulkhead_overloaded`, with the last reason).
    Rejected {
        /// Every decision made.
        route: Route,
    },
    /// Refused: serve the documented degraded result; no provider is called.
    Degraded {
        /// Every decision made.
        route: Route,
    },
}

impl<'p> PoolOutcome<'p> {
    /// The route, whatever the outcome.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert_eq!(pools.admit(&PoolRequest::new(1, pools.partition("p-c")?)).route().attempts(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn route(&self) -> &Route {
        match self {
            PoolOutcome::Dispatched { route, .. }
            | PoolOutcome::Rejected { route }
            | PoolOutcome::Degraded { route } => route,
        }
    }

    /// The permit, if admitted.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// assert!(pools.admit(&PoolRequest::new(1, pools.partition("p-c")?)).into_permit().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_permit(self) -> Option<PoolPermit<'p>> {
        match self {
            PoolOutcome::Dispatched { permit, .. } => Some(permit),
            _ => None,
        }
    }
}

/// A refusal of one decision ([`Pools::try_admit`], [`Pools::charge_retry`]).
///
/// ```
/// use llm_bulkhead::pools::*;
/// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
/// let id = pools.partition("p-c")?;
/// let _held = pools.try_admit(&PoolRequest::new(1, id))?;
/// let e = pools.try_admit(&PoolRequest::new(2, id)).unwrap_err();
/// assert_eq!(e.to_string(), "bulkhead_overloaded: partition 0: active_limit_reached (limit version 1)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolRefusal {
    /// The partition that refused.
    pub partition: PartitionId,
    /// The limit that refused.
    pub reason: Reason,
    /// The partition's limit version the decision read.
    pub limit_version: u64,
}

impl fmt::Display for PoolRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bulkhead_overloaded: partition {}: {} (limit version {})",
            self.partition.0,
            self.reason.as_str(),
            self.limit_version
        )
    }
}

impl std::error::Error for PoolRefusal {}

impl Pools {
    /// The partition of a classified request: the one whose provider and class match and
    /// whose model family and tenant tier match or are unset, the most specific first.
    ///
    /// # Errors
    /// [`RouteError`]: an unknown provider or class, or no matching partition.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut config = PoolsConfig::single("p", "c", 2);
    /// let mut gold = PartitionConfig::new("p", "c", 1);
    /// gold.tenant_tier = Some("gold".into());
    /// config.partitions.insert("p-c-gold".into(), gold);
    /// let pools = Pools::new(&config)?;
    /// let id = pools.classify(&Classification::new("p", "c").tenant_tier("gold"))?;
    /// assert_eq!(pools.name(id), "p-c-gold");
    /// let id = pools.classify(&Classification::new("p", "c").tenant_tier("free"))?;
    /// assert_eq!(pools.name(id), "p-c");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn classify(&self, c: &Classification<'_>) -> Result<PartitionId, RouteError> {
        let e = &self.engine;
        if !e.providers.iter().any(|p| p.name == c.provider) {
            return Err(RouteError::UnknownProvider(c.provider.to_owned()));
        }
        if !e.classes.iter().any(|n| n == c.traffic_class) {
            return Err(RouteError::UnknownClass(c.traffic_class.to_owned()));
        }
        // Score: 2 for a matching model family, 1 for a matching tenant tier; a partition
        // that sets a key the request does not match is out.
        let fits = |set: &Option<String>, want: Option<&str>| match set {
            None => Some(false),
            Some(s) => (want == Some(s.as_str())).then_some(true),
        };
        e.partitions
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.config.provider == c.provider && p.config.traffic_class == c.traffic_class
            })
            .filter_map(|(i, p)| {
                let m = fits(&p.config.model_family, c.model_family)?;
                let t = fits(&p.config.tenant_tier, c.tenant_tier)?;
                Some((2 * u8::from(m) + u8::from(t), i))
            })
            .max()
            .map(|(_, i)| PartitionId(i as u32))
            .ok_or_else(|| RouteError::NoPartition {
                provider: c.provider.to_owned(),
                traffic_class: c.traffic_class.to_owned(),
            })
    }

    /// One decision on the request's partition, without its overflow action: admitted only
    /// when the partition, its provider's connections and the global guard all have room.
    /// Emits one decision event.
    ///
    /// # Errors
    /// [`PoolRefusal`] with the limit that refused.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut config = PoolsConfig::single("p", "c", 2);
    /// config.global.max_active = 2;
    /// config.extend_with("q", "c", 2);
    /// config.global.max_active = 3; // the guard is below the sum of the partitions
    /// let pools = Pools::new(&config)?;
    /// let (p, q) = (pools.partition("p-c")?, pools.partition("q-c")?);
    /// let _a = pools.try_admit(&PoolRequest::new(1, p))?;
    /// let _b = pools.try_admit(&PoolRequest::new(2, p))?;
    /// let _c = pools.try_admit(&PoolRequest::new(3, q))?;
    /// assert_eq!(pools.try_admit(&PoolRequest::new(4, q)).unwrap_err().reason, Reason::GlobalLimitReached);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_admit(&self, req: &PoolRequest) -> Result<PoolPermit<'_>, PoolRefusal> {
        let pi = req.partition.index();
        match self.decide_newcomer(pi, req.priority, req.tokens) {
            Ok(g) => {
                self.emit(
                    req,
                    g.version,
                    Decision::Dispatch,
                    granted_reason(g),
                    None,
                    1,
                );
                Ok(self.permit(req, req.partition, g, None))
            }
            Err(r) => {
                self.emit(req, r.version, Decision::Reject, r.reason, None, 1);
                Err(PoolRefusal {
                    partition: req.partition,
                    reason: r.reason,
                    limit_version: r.version,
                })
            }
        }
    }

    /// Admits the request on its partition or, when that is full, applies the class's
    /// overflow action: reject, degrade, or try the approved fallbacks in order (each its own
    /// budget), never a partition already visited, within the attempt budget. One decision
    /// event per decision; the outcome's [`Route`] lists them all. Nothing is retried.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut config = PoolsConfig::single("p", "batch", 1);
    /// config.classes.get_mut("batch").unwrap().overflow = Overflow::Degrade;
    /// let pools = Pools::new(&config)?;
    /// let id = pools.partition("p-batch")?;
    /// let _held = pools.admit(&PoolRequest::new(1, id)).into_permit();
    /// assert!(matches!(pools.admit(&PoolRequest::new(2, id)), PoolOutcome::Degraded { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, req: &PoolRequest) -> PoolOutcome<'_> {
        self.route(req, None)
    }

    /// Charges a retry to `partition`'s retry budget when the retry is decided; the charge is
    /// held through the back-off and, once passed to [`admit_retry`](Self::admit_retry),
    /// until the retry's attempt ends. Exact under concurrency: the check against
    /// `max(percent × (active + pending) / 100, min)` and the charge are one CAS on the word
    /// that holds the active and retry counts (the pending count is read just before it).
    /// Emits one decision event ([`Decision::Retry`] or a rejection).
    ///
    /// # Errors
    /// [`PoolRefusal`] with [`Reason::RetryBudgetReached`] (counted in `retry_overflow`).
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 4))?;
    /// let id = pools.partition("p-c")?;
    /// let charges: Vec<_> = (0..3).map(|i| pools.charge_retry(i, id).unwrap()).collect();
    /// assert_eq!(pools.charge_retry(9, id).unwrap_err().reason, Reason::RetryBudgetReached);
    /// drop(charges); // the retries were abandoned: the units come back
    /// assert!(pools.charge_retry(10, id).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_retry(
        &self,
        request_id: u64,
        partition: PartitionId,
    ) -> Result<RetryCharge<'_>, PoolRefusal> {
        let req = PoolRequest::new(request_id, partition);
        match self.engine.charge_retry(partition.index()) {
            Ok((version, _)) => {
                self.emit(
                    &req,
                    version,
                    Decision::Retry,
                    Reason::CapacityAvailable,
                    None,
                    1,
                );
                Ok(RetryCharge {
                    pools: self,
                    partition,
                    live: true,
                })
            }
            Err(r) => {
                self.emit(&req, r.version, Decision::Reject, r.reason, None, 1);
                Err(PoolRefusal {
                    partition,
                    reason: r.reason,
                    limit_version: r.version,
                })
            }
        }
    }

    /// As [`admit`](Self::admit), for a retry whose back-off ended: the permit holds the
    /// charge until it completes; if the retry is refused, the charge is given back now.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let pools = Pools::new(&PoolsConfig::single("p", "c", 1))?;
    /// let id = pools.partition("p-c")?;
    /// let held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    /// let charge = pools.charge_retry(2, id)?;
    /// assert!(pools.admit_retry(&PoolRequest::new(2, id), charge).into_permit().is_none());
    /// assert_eq!(pools.stats().partitions[0].retries_in_flight, 0);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_retry<'p>(
        &'p self,
        req: &PoolRequest,
        charge: RetryCharge<'p>,
    ) -> PoolOutcome<'p> {
        self.route(req, Some(charge))
    }

    fn route<'p>(
        &'p self,
        req: &PoolRequest,
        mut charge: Option<RetryCharge<'p>>,
    ) -> PoolOutcome<'p> {
        let e = &self.engine;
        let mut route = Route::new();
        let mut at = req.partition;
        loop {
            let attempt = route.attempts() + 1;
            let p = &e.partitions[at.index()];
            let refused = match self.decide_newcomer(at.index(), req.priority, req.tokens) {
                Ok(g) => {
                    let retry = charge.take().map(RetryCharge::take);
                    return self.dispatched(req, at, g, route, retry);
                }
                Err(r) => r,
            };
            let Refused {
                reason, version, ..
            } = refused;
            match p.overflow {
                // A caller that cannot wait is rejected (the waits are `admit_blocking` and
                // `admit_async`).
                Overflow::Reject | Overflow::Wait => {
                    self.record(&mut route, req, at, Decision::Reject, reason, None, version);
                    return PoolOutcome::Rejected { route };
                }
                Overflow::Degrade => {
                    bump(&p.hot.counters.degraded);
                    self.record(
                        &mut route,
                        req,
                        at,
                        Decision::Degrade,
                        reason,
                        None,
                        version,
                    );
                    return PoolOutcome::Degraded { route };
                }
                Overflow::Fallback => {
                    // The first approved fallback this request has not visited yet; the
                    // graph is acyclic, and this check holds whatever the graph.
                    let next = p
                        .fallback
                        .iter()
                        .map(|&f| PartitionId(f as u32))
                        .find(|&f| f != at && !route.visited(f));
                    let ended = if !req.allow_fallback || next.is_none() {
                        Some(Reason::NoEligibleFallback)
                    } else if attempt >= e.max_attempts {
                        Some(Reason::AttemptBudgetSpent)
                    } else {
                        None
                    };
                    if let Some(end) = ended {
                        self.record(&mut route, req, at, Decision::Reject, reason, None, version);
                        route.ended_by = Some(end);
                        return PoolOutcome::Rejected { route };
                    }
                    bump(&p.hot.counters.fallbacks);
                    self.record(
                        &mut route,
                        req,
                        at,
                        Decision::Fallback,
                        reason,
                        next,
                        version,
                    );
                    at = next.unwrap_or(at);
                }
            }
        }
    }

    /// An admission on `at`: its dispatch decision recorded, its permit made.
    pub(crate) fn dispatched(
        &self,
        req: &PoolRequest,
        at: PartitionId,
        g: Granted,
        mut route: Route,
        retry: Option<PartitionId>,
    ) -> PoolOutcome<'_> {
        let reason = granted_reason(g);
        self.record(
            &mut route,
            req,
            at,
            Decision::Dispatch,
            reason,
            None,
            g.version,
        );
        let permit = self.permit(req, at, g, retry);
        PoolOutcome::Dispatched { permit, route }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        route: &mut Route,
        req: &PoolRequest,
        at: PartitionId,
        decision: Decision,
        reason: Reason,
        fallback: Option<PartitionId>,
        version: u64,
    ) {
        let attempt = route.attempts() + 1;
        route.push(DecisionRecord {
            partition: at,
            decision,
            reason,
            fallback,
            limit_version: version,
            attempt,
        });
        let req = PoolRequest {
            partition: at,
            ..*req
        };
        self.emit(&req, version, decision, reason, fallback, attempt);
    }

    #[inline]
    fn emit(
        &self,
        req: &PoolRequest,
        version: u64,
        decision: Decision,
        reason: Reason,
        fallback: Option<PartitionId>,
        attempt: u32,
    ) {
        if let Some(o) = &self.engine.observer {
            let e = self.engine.event(
                req.partition.index(),
                req.request_id,
                req.priority,
                (decision, reason, version),
                fallback.map(PartitionId::index),
                attempt,
            );
            o.on_decision(&e);
        }
    }

    #[inline]
    pub(crate) fn permit(
        &self,
        req: &PoolRequest,
        at: PartitionId,
        g: Granted,
        retry: Option<PartitionId>,
    ) -> PoolPermit<'_> {
        PoolPermit {
            pools: self,
            core: super::permit::Core {
                partition: at,
                request_id: req.request_id,
                priority: req.priority,
                tokens: g.tokens,
                retry,
                version: g.version,
                started: self.engine.observer.as_ref().map(|_| Instant::now()),
                done: false,
            },
        }
    }
}

fn granted_reason(g: Granted) -> Reason {
    if g.shadow {
        Reason::ObservedOverLimit
    } else {
        Reason::CapacityAvailable
    }
}
