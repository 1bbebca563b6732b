//! The replica side of a lease, pure: what share a replica may install at each instant of its
//! own monotonic clock, given the replies it received. The agent (`super::agent`) drives it with
//! a real clock; `tests/cluster_model.rs` drives it with simulated, drifting clocks.
//!
//! A reply to a request sent at local time `s` is valid until
//! `s + ttl − ⌈ttl·ρ⌉ − margin`: the store stamped the record after `s`, and a local clock
//! that runs up to ρ slow still stops before the store's `renewed_at + ttl`. Then the replica
//! degrades ([`Degrade`]): by default to `min(floor, grant)` for `floor_hold`, then to zero.

use super::allocator::{Amounts, RenewReply, RenewRequest, StoreParams};
use super::classes::ClassShare;
use std::time::Duration;

/// What a replica installs once its lease is no longer valid (the store unreachable, or its
/// replies lost).
///
/// ```
/// use llm_bulkhead::cluster::Degrade;
/// assert_eq!(Degrade::default(), Degrade::FloorThenClosed);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Degrade {
    /// The pre-reserved floor (`min(floor, last grant)`) for `floor_hold`, then zero. Strict:
    /// the store keeps the floor reserved until `ttl + quarantine`, and the configuration
    /// requires `quarantine ≥ floor_hold + max_admission` (with the clock-rate slack).
    #[default]
    FloorThenClosed,
    /// Zero at once. Strict.
    FailClosed,
    /// The global limits, as if alone: **up to R× the global limit** with R replicas. No global
    /// bound holds while any replica is in this state; choose it only where an overshoot is
    /// cheaper than a refusal.
    FailOpen,
}

/// A budget's cluster settings (the global limits come from the bulkhead the agent manages).
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClusterConfig};
/// use std::time::Duration;
/// let c = ClusterConfig::new("gateway", "openai")
///     .ttl(Duration::from_secs(1))
///     .max_admission(Duration::from_secs(2))
///     .floor(Amounts::new(1, 500))
///     .floor_hold(Duration::from_millis(500));
/// // A quarantine shorter than floor_hold + max_admission (plus slack) is refused.
/// assert!(c.clone().quarantine(Duration::from_secs(2)).validate().is_err());
/// assert!(c.quarantine(Duration::from_secs(3)).validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Key namespace (e.g. the deployment).
    pub namespace: String,
    /// The budget's name within the namespace (e.g. the provider account).
    pub budget: String,
    /// Lease time to live; the agent renews every `ttl / 3`.
    pub ttl: Duration,
    /// How long a silent replica's reservation stays after its TTL.
    pub quarantine: Duration,
    /// The longest an admission may stay in flight (the gateway's upstream deadline `D`).
    pub max_admission: Duration,
    /// The per-replica floor, pre-reserved for the degraded mode.
    pub floor: Amounts,
    /// How long the floor is kept once the lease lapsed.
    pub floor_hold: Duration,
    /// Bound on the difference between clock rates (replica vs store), parts per million.
    pub rate_bound_ppm: u32,
    /// Safety margin subtracted from every local validity (scheduling, one round trip).
    pub margin: Duration,
    /// The degraded mode.
    pub degrade: Degrade,
}

/// A [`ClusterConfig`] that cannot keep the stated invariant, or does not fit the store.
///
/// ```
/// use llm_bulkhead::cluster::{ClusterConfig, ClusterConfigError};
/// let e = ClusterConfig::new("", "b").validate().unwrap_err();
/// assert_eq!(e, ClusterConfigError::BadName("namespace"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterConfigError {
    /// An empty name, or one with characters other than `[A-Za-z0-9_.-]`.
    BadName(&'static str),
    /// A TTL under 30 ms or above one day, or a margin not below a third of it.
    BadTtl,
    /// `quarantine` is shorter than `needed` (`floor_hold + max_admission` plus the clock-rate
    /// slack and the margin).
    QuarantineTooShort {
        /// What it would need to be, in ms.
        needed_ms: u64,
    },
    /// A clock-rate bound above 10 %.
    BadRateBound,
    /// The agent's clock may lag the true time by more than `margin`
    /// ([`Clock::resolution_ms`](super::Clock::resolution_ms)).
    ClockTooCoarse {
        /// The clock's resolution, in ms.
        resolution_ms: u64,
    },
}

impl std::fmt::Display for ClusterConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterConfigError::BadName(field) => {
                write!(f, "{field}: a non-empty name of [A-Za-z0-9_.-]")
            }
            ClusterConfigError::BadTtl => {
                f.write_str("ttl: between 30 ms and one day, and more than 3x the margin")
            }
            ClusterConfigError::QuarantineTooShort { needed_ms } => write!(
                f,
                "quarantine: at least floor_hold + max_admission with slack, {needed_ms} ms"
            ),
            ClusterConfigError::BadRateBound => f.write_str("rate_bound_ppm: at most 100000"),
            ClusterConfigError::ClockTooCoarse { resolution_ms } => write!(
                f,
                "the clock may lag {resolution_ms} ms, more than the margin"
            ),
        }
    }
}

impl std::error::Error for ClusterConfigError {}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn ms_up(d: Duration) -> u64 {
    ms(d).saturating_add(u64::from(d.subsec_nanos() % 1_000_000 != 0))
}

/// `⌈x·ppm/10⁶⌉`.
fn slack(x: u64, ppm: u32) -> u64 {
    (u128::from(x) * u128::from(ppm)).div_ceil(1_000_000) as u64
}

impl ClusterConfig {
    /// Defaults: TTL 3 s, quarantine 5 min, max admission 4 min 30 s, no floor, floor hold
    /// 10 s, clock rates within 1 %, margin 50 ms, [`Degrade::FloorThenClosed`].
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// assert!(ClusterConfig::new("ns", "b").validate().is_ok());
    /// ```
    #[must_use]
    pub fn new(namespace: &str, budget: &str) -> Self {
        ClusterConfig {
            namespace: namespace.to_owned(),
            budget: budget.to_owned(),
            ttl: Duration::from_secs(3),
            quarantine: Duration::from_secs(300),
            max_admission: Duration::from_secs(270),
            floor: Amounts::ZERO,
            floor_hold: Duration::from_secs(10),
            rate_bound_ppm: 10_000,
            margin: Duration::from_millis(50),
            degrade: Degrade::FloorThenClosed,
        }
    }

    /// With another TTL.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// # use std::time::Duration;
    /// assert_eq!(ClusterConfig::new("a", "b").ttl(Duration::from_secs(1)).ttl, Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// With another quarantine.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// # use std::time::Duration;
    /// assert_eq!(ClusterConfig::new("a", "b").quarantine(Duration::ZERO).quarantine, Duration::ZERO);
    /// ```
    #[must_use]
    pub fn quarantine(mut self, quarantine: Duration) -> Self {
        self.quarantine = quarantine;
        self
    }

    /// With another longest admission.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// # use std::time::Duration;
    /// let c = ClusterConfig::new("a", "b").max_admission(Duration::from_secs(1));
    /// assert_eq!(c.max_admission, Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn max_admission(mut self, d: Duration) -> Self {
        self.max_admission = d;
        self
    }

    /// With another floor.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig};
    /// assert_eq!(ClusterConfig::new("a", "b").floor(Amounts::new(1, 0)).floor.slots, 1);
    /// ```
    #[must_use]
    pub fn floor(mut self, floor: Amounts) -> Self {
        self.floor = floor;
        self
    }

    /// With another floor hold.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// # use std::time::Duration;
    /// assert_eq!(ClusterConfig::new("a", "b").floor_hold(Duration::ZERO).floor_hold, Duration::ZERO);
    /// ```
    #[must_use]
    pub fn floor_hold(mut self, d: Duration) -> Self {
        self.floor_hold = d;
        self
    }

    /// With another degraded mode.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterConfig, Degrade};
    /// assert_eq!(ClusterConfig::new("a", "b").degrade(Degrade::FailClosed).degrade, Degrade::FailClosed);
    /// ```
    #[must_use]
    pub fn degrade(mut self, degrade: Degrade) -> Self {
        self.degrade = degrade;
        self
    }

    /// The shortest quarantine that keeps the invariant: a replica cut off right after a
    /// renewal admits until `ttl + floor_hold` on its clock, and that work lasts up to
    /// `max_admission`; its clock may run ρ slow against the store's.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::ClusterConfig;
    /// # use std::time::Duration;
    /// let c = ClusterConfig::new("a", "b").max_admission(Duration::from_secs(1)).floor_hold(Duration::ZERO);
    /// assert_eq!(c.needed_quarantine_ms(), 1_000 + 2 * 10 + 3_000 * 2 / 100 + 50);
    /// ```
    #[must_use]
    pub fn needed_quarantine_ms(&self) -> u64 {
        let hold = if self.degrade == Degrade::FloorThenClosed {
            ms_up(self.floor_hold)
        } else {
            0
        };
        let local = hold.saturating_add(ms_up(self.max_admission));
        // Twice ρ: local durations stretch by up to ρ, and the TTL's own slack rounds.
        local
            .saturating_add(slack(local, self.rate_bound_ppm.saturating_mul(2)))
            .saturating_add(slack(
                ms_up(self.ttl),
                self.rate_bound_ppm.saturating_mul(2),
            ))
            .saturating_add(ms_up(self.margin))
    }

    /// Checks names, TTL and the quarantine rule.
    ///
    /// # Errors
    /// [`ClusterConfigError`]; a [`Degrade::FailOpen`] configuration skips the quarantine
    /// rule (it has no global bound to keep).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterConfig, ClusterConfigError};
    /// # use std::time::Duration;
    /// let e = ClusterConfig::new("a", "b").quarantine(Duration::from_secs(1)).validate().unwrap_err();
    /// assert!(matches!(e, ClusterConfigError::QuarantineTooShort { .. }));
    /// ```
    pub fn validate(&self) -> Result<(), ClusterConfigError> {
        let good = |s: &str| {
            !s.is_empty()
                && s.len() <= 200
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        };
        if !good(&self.namespace) {
            return Err(ClusterConfigError::BadName("namespace"));
        }
        if !good(&self.budget) {
            return Err(ClusterConfigError::BadName("budget"));
        }
        let ttl = ms(self.ttl);
        if !(30..=86_400_000).contains(&ttl) || ms_up(self.margin).saturating_mul(3) >= ttl {
            return Err(ClusterConfigError::BadTtl);
        }
        if self.rate_bound_ppm > 100_000 {
            return Err(ClusterConfigError::BadRateBound);
        }
        let needed_ms = self.needed_quarantine_ms();
        if self.degrade != Degrade::FailOpen && ms(self.quarantine) < needed_ms {
            return Err(ClusterConfigError::QuarantineTooShort { needed_ms });
        }
        Ok(())
    }

    /// The store-side parameters for the global limits `global`, without classes (the agent
    /// adds its bulkhead's class table).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig};
    /// let p = ClusterConfig::new("a", "b").store_params(Amounts::new(8, 0));
    /// assert_eq!((p.global.slots, p.ttl_ms), (8, 3_000));
    /// ```
    #[must_use]
    pub fn store_params(&self, global: Amounts) -> StoreParams {
        StoreParams {
            global,
            floor: self.floor.min(global),
            ttl_ms: ms(self.ttl),
            quarantine_ms: ms(self.quarantine),
            classes: Vec::new(),
        }
    }
}

/// Where a lease stands at one instant.
///
/// ```
/// use llm_bulkhead::cluster::Phase;
/// assert_ne!(Phase::Valid, Phase::Closed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// No reply yet: share zero.
    NoLease,
    /// The last grant is valid.
    Valid,
    /// Lapsed: the floor, for `floor_hold`.
    Floor,
    /// Lapsed for good: zero (or, with [`Degrade::FailOpen`], the global limits).
    Closed,
}

/// One replica's view of its lease, on its own monotonic clock (ms).
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease, Phase, RenewReply};
/// use std::time::Duration;
/// let c = ClusterConfig::new("a", "b").ttl(Duration::from_secs(1)).floor(Amounts::new(1, 0))
///     .floor_hold(Duration::from_millis(100));
/// let mut l = Lease::new(&c, Amounts::new(8, 0));
/// l.on_reply(0, &RenewReply { granted: Amounts::new(5, 0), epoch: 1, seq: 1, now_ms: 0, learning: false, classes: vec![] });
/// assert_eq!((l.phase_at(10), l.share_at(10).slots), (Phase::Valid, 5));
/// let end = l.next_change(10).unwrap();
/// assert_eq!(l.share_at(end).slots, 1); // the floor
/// assert_eq!(l.share_at(end + 100).slots, 0);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    validity_ms: u64,
    floor_hold_ms: u64,
    floor: Amounts,
    global: Amounts,
    degrade: Degrade,
    grant: Amounts,
    classes: Vec<ClassShare>,
    valid_until: Option<u64>,
    epoch: u64,
    seq: u64,
}

impl Lease {
    /// No lease yet, for a budget of `global`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease, Phase};
    /// let l = Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0));
    /// assert_eq!((l.phase_at(0), l.share_at(0)), (Phase::NoLease, Amounts::ZERO));
    /// ```
    #[must_use]
    pub fn new(c: &ClusterConfig, global: Amounts) -> Self {
        let ttl = ms(c.ttl);
        let validity_ms = ttl
            .saturating_sub(slack(ttl, c.rate_bound_ppm))
            .saturating_sub(ms_up(c.margin));
        Lease {
            validity_ms,
            floor_hold_ms: ms(c.floor_hold),
            floor: c.floor.min(global),
            global,
            degrade: c.degrade,
            grant: Amounts::ZERO,
            classes: Vec::new(),
            valid_until: None,
            epoch: 0,
            seq: 0,
        }
    }

    /// Takes the store's reply to a request sent at local time `sent_at`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease, RenewReply};
    /// let mut l = Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0));
    /// l.on_reply(5, &RenewReply { granted: Amounts::new(2, 0), epoch: 1, seq: 3, now_ms: 0, learning: false, classes: vec![] });
    /// assert_eq!(l.grant().slots, 2);
    /// ```
    pub fn on_reply(&mut self, sent_at: u64, reply: &RenewReply) {
        self.grant = reply.granted;
        self.classes.clone_from(&reply.classes);
        self.valid_until = Some(sent_at.saturating_add(self.validity_ms));
        self.epoch = reply.epoch;
        self.seq = reply.seq;
    }

    /// The last grant received.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease};
    /// assert_eq!(Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0)).grant(), Amounts::ZERO);
    /// ```
    #[must_use]
    pub fn grant(&self) -> Amounts {
        self.grant
    }

    /// The phase at local time `now`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease, Phase};
    /// assert_eq!(Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0)).phase_at(9), Phase::NoLease);
    /// ```
    #[must_use]
    pub fn phase_at(&self, now: u64) -> Phase {
        let Some(until) = self.valid_until else {
            return Phase::NoLease;
        };
        if now < until {
            Phase::Valid
        } else if self.degrade == Degrade::FloorThenClosed
            && now < until.saturating_add(self.floor_hold_ms)
        {
            Phase::Floor
        } else {
            Phase::Closed
        }
    }

    /// The share the replica may have installed at local time `now`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease};
    /// assert_eq!(Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0)).share_at(0), Amounts::ZERO);
    /// ```
    #[must_use]
    pub fn share_at(&self, now: u64) -> Amounts {
        match self.phase_at(now) {
            Phase::NoLease => Amounts::ZERO,
            Phase::Valid => self.grant,
            Phase::Floor => self.floor.min(self.grant),
            Phase::Closed if self.degrade == Degrade::FailOpen => self.global,
            Phase::Closed => Amounts::ZERO,
        }
    }

    /// The class shares the replica may have installed at local time `now`, in class order
    /// (missing: zero): the granted ones while valid, those cut to the per-replica floor on the
    /// floor (less than granted, which the store keeps reserved), zero when closed; `None` for
    /// fail-open's global class limits.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClassShare, ClusterConfig, Lease, RenewReply};
    /// let mut l = Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0));
    /// let g = ClassShare { floor: Amounts::new(1, 0), ceiling: Amounts::new(3, 0) };
    /// l.on_reply(0, &RenewReply { granted: Amounts::new(4, 0), epoch: 1, seq: 1, now_ms: 0,
    ///                             learning: false, classes: vec![g] });
    /// assert_eq!(l.class_shares_at(1), Some(vec![g]));
    /// ```
    #[must_use]
    pub fn class_shares_at(&self, now: u64) -> Option<Vec<ClassShare>> {
        let cap = match self.phase_at(now) {
            Phase::Valid => return Some(self.classes.clone()),
            Phase::Floor => ClassShare {
                floor: self.floor,
                ceiling: self.floor,
            },
            Phase::Closed if self.degrade == Degrade::FailOpen => return None,
            Phase::NoLease | Phase::Closed => ClassShare::ZERO,
        };
        Some(self.classes.iter().map(|g| g.min(cap)).collect())
    }

    /// The next local time after `now` at which [`share_at`](Self::share_at) changes without a
    /// reply, if any.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease};
    /// assert_eq!(Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0)).next_change(0), None);
    /// ```
    #[must_use]
    pub fn next_change(&self, now: u64) -> Option<u64> {
        let until = self.valid_until?;
        let floor_end = until.saturating_add(self.floor_hold_ms);
        [until, floor_end].into_iter().find(|&t| t > now)
    }

    /// A renewal request carrying this lease's epoch and sequence.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClusterConfig, Lease};
    /// let l = Lease::new(&ClusterConfig::new("a", "b"), Amounts::new(8, 0));
    /// assert_eq!(l.request("r", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO).seq, 0);
    /// ```
    #[must_use]
    pub fn request(
        &self,
        replica: &str,
        applied: Amounts,
        held: Amounts,
        wants: Amounts,
    ) -> RenewRequest {
        RenewRequest {
            epoch: self.epoch,
            seq: self.seq,
            ..RenewRequest::new(replica, applied, held, wants.min(self.global))
        }
    }
}
