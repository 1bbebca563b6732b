//! A token reservation the replica's share cannot hold now, but the global limits can.
//!
//! The core says a reservation "never fits" ([`Rejection::never_fits`]) when it is above a
//! bound of the limits it saw. On a cluster-managed bulkhead those limits are the replica's
//! *share*, which is zero while the table learns, zero after the agent degraded, and small
//! beside a large request; it grows at a later renewal when the replica's demand asks for it.
//! So the cluster layers (the handle, and the LLM and tower layers built with `clustered`)
//! judge "never fits" against the **global** limits the agent knows (the global budget for
//! the demand's priority, and the class's global ceiling and reach) and answer a reservation
//! that fits them with [`ClusterRejection::ShareTooSmall`](super::ClusterRejection): a
//! retryable refusal that names the share, the global limit and when the share may change
//! (the renewal period). The judgement is made on the refusal path only, after the core
//! refused; the core's decision path carries nothing of it.
//!
//! The refused reservation is also kept (the largest since the agent's last renewal), so the
//! agent's next renewal asks for room for it ([`super::ClusterAgent::tick`]).

use crate::sync::{AtomicU64, Ordering};
use crate::{Bulkhead, ClassLimits, Demand, FitLimit, LimitsSnapshot, Rejection};
use std::fmt;

/// A token demand the replica's installed share cannot hold however much work ends, while the
/// global limits can: retry it after the share's next renewal (or on another replica). Found
/// in [`ClusterRejection::ShareTooSmall`](super::ClusterRejection::ShareTooSmall), and as the
/// tower layer's 503 `share_too_small` with a `Retry-After`.
///
/// ```
/// use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, ClusterRejection, MemoryStore};
/// use llm_bulkhead::{Bulkhead, Demand, Reservation};
/// let b = Bulkhead::builder().max_concurrent(4).token_budget(1_000).build().unwrap();
/// let agent = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// // No lease yet: share zero, but 300 tokens fit the global budget of 1 000.
/// let r = agent.handle().try_acquire(Demand::tokens(Reservation::new(200, 100).unwrap())).unwrap_err();
/// let ClusterRejection::ShareTooSmall(s) = r else { panic!("{r:?}") };
/// assert_eq!((s.requested, s.share, s.global), (300, 0, 1_000));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShareTooSmall {
    /// The share's bound the reservation is above (as [`NeverFits::limit`](crate::NeverFits)).
    pub limit: FitLimit,
    /// The reservation (tokens).
    pub requested: u64,
    /// The most that bound of the installed share admits now.
    pub share: u64,
    /// The most the global limits admit to this demand (at least `requested`): the tightest
    /// of the global budget for its priority, its class's global ceiling and reach.
    pub global: u64,
    /// When to retry: the agent's renewal period (`ttl / 3`), ms. The share changes at a
    /// renewal at the earliest.
    pub retry_after_ms: u64,
    /// The core's refusal it explains (reason `budget_limit`, with the share's figures).
    pub rejection: Rejection,
}

impl ShareTooSmall {
    /// [`retry_after_ms`](Self::retry_after_ms) in whole seconds, rounded up, at least 1 (the
    /// `Retry-After` header's unit).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, ClusterRejection, MemoryStore};
    /// # use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// # let b = Bulkhead::builder().max_concurrent(4).token_budget(1_000).build().unwrap();
    /// # let agent = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// # let ClusterRejection::ShareTooSmall(s) = agent.handle().try_acquire(Demand::tokens(Reservation::new(1, 0).unwrap())).unwrap_err() else { panic!() };
    /// assert!(s.retry_after_secs() >= 1);
    /// ```
    #[must_use]
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1_000).max(1)
    }
}

impl fmt::Display for ShareTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the replica's cluster share is too small now: a reservation of {} tokens is above \
             the share's {} of {}, while the global limit admits {} (retry after {} ms)",
            self.requested,
            self.limit.as_str(),
            self.share,
            self.global,
            self.retry_after_ms
        )
    }
}

/// The global limits the agent knows, for the judgement, and the largest reservation refused
/// as too large for the share since the agent's last renewal.
pub(super) struct GlobalFit {
    base: LimitsSnapshot,
    /// The classes by name (a refusal's detail names its class), in the bulkhead's order.
    classes: Vec<(String, ClassLimits)>,
    retry_after_ms: u64,
    short: AtomicU64,
    /// The deliberately broken variant `LLM_BULKHEAD_CLUSTER_NO_SHARE_FIT=1` (feature
    /// `testing`, read once): every refusal is judged against the share alone, as before this
    /// judgement existed (a share too small is "never fits", and no demand is kept).
    /// `tests/cluster_share_fit.rs` fails on it.
    share_only: bool,
}

impl GlobalFit {
    pub(super) fn new(bulkhead: &Bulkhead, base: LimitsSnapshot, retry_after_ms: u64) -> Self {
        let classes = bulkhead
            .class_names()
            .iter()
            .filter_map(|name| {
                let id = bulkhead.class_id(name).ok()?;
                Some((name.clone(), *base.classes.get(id)?))
            })
            .collect();
        GlobalFit {
            base,
            classes,
            retry_after_ms,
            short: AtomicU64::new(0),
            share_only: cfg!(feature = "testing")
                && std::env::var_os("LLM_BULKHEAD_CLUSTER_NO_SHARE_FIT").is_some_and(|v| v == "1"),
        }
    }

    /// The tightest global bound `requested` tokens of `demand` in `class` are above, if any.
    fn global_bound(&self, demand: &Demand, class: Option<&str>, requested: u64) -> (bool, u64) {
        let Some(b) = self.base.token_budget else {
            return (false, u64::MAX);
        };
        let eff = b.effective(demand.priority());
        let class = class.and_then(|n| self.classes.iter().find(|(c, _)| c == n));
        let ceiling = class.and_then(|(_, c)| c.max_tokens);
        let floors: u64 = self.classes.iter().map(|(_, c)| c.protected_tokens).sum();
        let reach = class.map(|(_, c)| {
            c.protected_tokens
                .saturating_add(eff.saturating_sub(floors))
        });
        let bounds = [Some(eff), ceiling, reach];
        let most = bounds.into_iter().flatten().min().unwrap_or(u64::MAX);
        (requested > most, most)
    }

    /// `rejection` of `demand` as a [`ShareTooSmall`] when the core found it never fits the
    /// installed share but it fits the global limits; `Err` gives the rejection back as it is.
    /// Cold: only a refusal comes here, and only a never-fits one does more than one test.
    #[cold]
    pub(super) fn judge(
        &self,
        demand: &Demand,
        rejection: Rejection,
    ) -> Result<ShareTooSmall, Rejection> {
        let Some(n) = rejection.never_fits().filter(|_| !self.share_only) else {
            return Err(rejection);
        };
        let detail = rejection.detail();
        let class = detail.classes.as_deref().map(|c| c.class.id.as_str());
        let (above, global) = self.global_bound(demand, class, n.requested);
        if above {
            return Err(rejection);
        }
        // The agent's next renewal asks for room for it.
        self.short.fetch_max(n.requested, Ordering::Relaxed);
        Ok(ShareTooSmall {
            limit: n.limit,
            requested: n.requested,
            share: n.most,
            global,
            retry_after_ms: self.retry_after_ms,
            rejection,
        })
    }

    /// The largest reservation refused as too large for the share since the last
    /// [`renewed`](Self::renewed).
    pub(super) fn short(&self) -> u64 {
        self.short.load(Ordering::Relaxed)
    }

    /// A renewal asked for what [`short`](Self::short) said: start again.
    pub(super) fn renewed(&self) {
        self.short.store(0, Ordering::Relaxed);
    }
}
