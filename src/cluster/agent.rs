//! The agent: one per replica and budget. It leases a share from the store, installs it on the
//! bulkhead as a revisioned snapshot, renews every `ttl / 3` (earlier, rate-limited, when the
//! bulkhead refuses or queues work), reports what it has installed, what is in flight and its
//! demand, and degrades on its own deadline when the store does not answer.
//!
//! [`ClusterAgent::tick`] is one step on an injected [`Clock`]; [`ClusterAgent::spawn`] runs
//! the steps on a thread of its own with a blocking store client, so no async runtime is
//! needed.

use super::allocator::{Amounts, StoreParams};
use super::class_view::{self, ClassDemand};
use super::classes::ClassShare;
use super::gate::{ClusterBulkhead, Gate};
use super::lease::{ClusterConfig, ClusterConfigError, Lease, Phase};
use super::share_fit::GlobalFit;
use super::store::{LeaseStore, StoreError};
use crate::sync::{lock, Arc, AtomicBool, Condvar, Mutex, Ordering};
use crate::{Bulkhead, LimitsSnapshot};
use std::time::{Duration, Instant};

/// A monotonic clock in milliseconds.
///
/// ```
/// use llm_bulkhead::cluster::{Clock, SystemClock};
/// let c = SystemClock::new();
/// assert!(c.now_ms() <= c.now_ms());
/// ```
pub trait Clock: Send + Sync {
    /// Milliseconds since an arbitrary fixed origin; never decreases.
    fn now_ms(&self) -> u64;

    /// How far a reading may lag the true time, in ms (0: not at all, the default). The agent
    /// refuses a clock that lags more than the configuration's `margin`.
    fn resolution_ms(&self) -> u64 {
        0
    }
}

/// [`Instant`]-based [`Clock`] (`CLOCK_MONOTONIC` on Linux).
///
/// ```
/// use llm_bulkhead::cluster::{Clock, SystemClock};
/// assert!(SystemClock::new().now_ms() < 1_000);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SystemClock(Instant);

impl SystemClock {
    /// A clock whose origin is now.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::SystemClock;
    /// let _ = SystemClock::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        SystemClock(Instant::now())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What an agent did, for logs and metrics (never carries the store's URL).
///
/// ```
/// use llm_bulkhead::cluster::{AgentEvent, Amounts};
/// let e = AgentEvent::Installed { share: Amounts::new(2, 0), revision: 3 };
/// assert!(matches!(e, AgentEvent::Installed { .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// The store answered a renewal.
    Renewed {
        /// The share granted.
        granted: Amounts,
        /// Whether the table is learning (nobody grows).
        learning: bool,
    },
    /// A renewal failed; the lease runs on until its local validity ends.
    StoreFailed(StoreError),
    /// A new share was installed with `apply_limits`.
    Installed {
        /// The share.
        share: Amounts,
        /// The snapshot's revision.
        revision: u64,
    },
    /// Work was still in flight `max_admission` after the share dropped to zero: assumption A4
    /// (every admission ends within `max_admission`) does not hold for this gateway.
    AdmissionOverdue {
        /// Slots still in flight.
        in_flight: u64,
    },
    /// Cut signals fired at their admissions' deadlines
    /// ([`ClusterAdmission::cut_signal`](super::ClusterAdmission::cut_signal)).
    AdmissionsCut {
        /// Signals fired in this step.
        count: u64,
    },
    /// Admissions taken through the [`ClusterBulkhead`] were released after their deadline:
    /// the work ran longer than `max_admission` (assumption A4 broken for them).
    OverdueReleased {
        /// All such releases so far.
        total: u64,
    },
}

/// An agent's state, for health checks.
///
/// ```
/// use llm_bulkhead::cluster::{AgentStatus, Phase};
/// assert_eq!(AgentStatus::default().phase, Phase::NoLease);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatus {
    /// The replica id (random per process start).
    pub replica: String,
    /// Where the lease stands.
    pub phase: Phase,
    /// The share installed now.
    pub installed: Amounts,
    /// The class shares installed now, in the bulkhead's class order (empty without classes).
    pub installed_classes: Vec<ClassShare>,
    /// The last grant received.
    pub granted: Amounts,
    /// Successful renewals.
    pub renewals: u64,
    /// Failed store calls.
    pub failures: u64,
    /// The last store error, if the last call failed.
    pub last_error: Option<StoreError>,
    /// Whether the last reply said the table is learning.
    pub learning: bool,
    /// Admissions through the [`ClusterBulkhead`] released after their deadline.
    pub overdue: u64,
    /// Cut signals fired at admission deadlines.
    pub cut: u64,
    /// Admissions refused because the share's window had ended before the agent installed the
    /// next share (the agent's thread ran late).
    pub lapsed_refusals: u64,
}

impl Default for AgentStatus {
    fn default() -> Self {
        AgentStatus {
            replica: String::new(),
            phase: Phase::NoLease,
            installed: Amounts::ZERO,
            installed_classes: Vec::new(),
            granted: Amounts::ZERO,
            renewals: 0,
            failures: 0,
            last_error: None,
            learning: false,
            overdue: 0,
            cut: 0,
            lapsed_refusals: 0,
        }
    }
}

fn global_of(base: &LimitsSnapshot) -> Amounts {
    Amounts::new(
        u64::from(base.max_concurrent),
        base.token_budget.map_or(0, |b| b.budget),
    )
}

type EventFn = Box<dyn FnMut(&AgentEvent) + Send>;

/// The agent of one replica for one budget.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClusterAgent, ClusterConfig, Clock, MemoryStore, Phase};
/// use llm_bulkhead::Bulkhead;
/// use std::sync::Arc;
/// use std::time::Duration;
/// struct At(u64);
/// impl Clock for At { fn now_ms(&self) -> u64 { self.0 } }
///
/// let store = MemoryStore::with_clock(|| 0);
/// let c = ClusterConfig::new("doc", "b").ttl(Duration::from_secs(1))
///     .max_admission(Duration::from_secs(1)).floor_hold(Duration::ZERO).quarantine(Duration::from_secs(2));
/// // The bulkhead carries the global limits; the agent installs zero until the first lease.
/// let b = Bulkhead::new(8).unwrap();
/// let mut agent = ClusterAgent::with_clock(b.clone(), Box::new(store), c, Arc::new(At(0))).unwrap();
/// assert_eq!(b.limits().max_concurrent, 0);
/// agent.tick(); // a new table learns first: still zero
/// assert_eq!(agent.status().phase, Phase::Valid);
/// ```
pub struct ClusterAgent {
    bulkhead: Bulkhead,
    store: Box<dyn LeaseStore>,
    config: ClusterConfig,
    params: StoreParams,
    base: LimitsSnapshot,
    global: Amounts,
    lease: Lease,
    status: AgentStatus,
    revision: u64,
    next_renew: u64,
    last_renew: Option<u64>,
    rejected_seen: u64,
    peak: Amounts,
    class_demand: ClassDemand,
    closed_since: Option<u64>,
    overdue_reported: bool,
    on_event: Option<EventFn>,
    gate: Arc<Gate>,
}

impl std::fmt::Debug for ClusterAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAgent")
            .field("config", &self.config)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

fn replica_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let host: String = host
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect();
    // A fresh allocation's address adds entropy between agents of one process.
    let salt = Box::new(0u8);
    format!("{host}-{}-{nanos:x}-{:p}", std::process::id(), &*salt)
}

impl ClusterAgent {
    /// An agent for `bulkhead`, whose current limits are the **global** limits. Installs share
    /// zero at once (the bulkhead refuses everything until the first grant).
    ///
    /// # Errors
    /// [`ClusterConfigError`] from [`ClusterConfig::validate`]; or `BadTtl` if the
    /// bulkhead's limits cannot be replaced (a revision at [`MAX_REVISION`](crate::MAX_REVISION)).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// assert!(ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("", "b")).is_err());
    /// ```
    pub fn new(
        bulkhead: Bulkhead,
        store: Box<dyn LeaseStore>,
        config: ClusterConfig,
    ) -> Result<Self, ClusterConfigError> {
        Self::with_clock(bulkhead, store, config, Arc::new(SystemClock::new()))
    }

    /// [`new`](Self::new) on `clock`: the agent's steps, its lease and its handles'
    /// admission windows and deadlines all read it (tests inject a manual one; `CoarseClock`
    /// makes the handle's read cheap on Linux).
    ///
    /// # Errors
    /// As [`new`](Self::new), and [`ClusterConfigError::ClockTooCoarse`] if the clock may lag
    /// more than the configuration's `margin`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore, SystemClock};
    /// # use std::sync::Arc;
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let c = ClusterConfig::new("a", "b");
    /// let a = ClusterAgent::with_clock(b, Box::new(MemoryStore::new()), c, Arc::new(SystemClock::new()));
    /// assert!(a.is_ok());
    /// ```
    pub fn with_clock(
        bulkhead: Bulkhead,
        store: Box<dyn LeaseStore>,
        config: ClusterConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ClusterConfigError> {
        config.validate()?;
        let margin_ms = u64::try_from(config.margin.as_millis()).unwrap_or(u64::MAX);
        let resolution_ms = clock.resolution_ms();
        if resolution_ms > margin_ms {
            return Err(ClusterConfigError::ClockTooCoarse { resolution_ms });
        }
        let max_admission_ms = u64::try_from(config.max_admission.as_millis()).unwrap_or(u64::MAX);
        let base = bulkhead.limits();
        let global = global_of(&base);
        let mut params = config.store_params(global);
        params.classes = class_view::params(&bulkhead, &base, global, params.floor)?;
        // The share changes at a renewal at the earliest: a refusal for a share too small
        // says to retry after one renewal period.
        let fit = GlobalFit::new(&bulkhead, base, (params.ttl_ms / 3).max(1));
        let mut agent = ClusterAgent {
            params,
            lease: Lease::new(&config, global),
            status: AgentStatus {
                replica: replica_id(),
                ..AgentStatus::default()
            },
            revision: base.revision,
            bulkhead,
            store,
            config,
            base,
            global,
            next_renew: 0,
            last_renew: None,
            rejected_seen: 0,
            peak: Amounts::ZERO,
            class_demand: ClassDemand::default(),
            closed_since: None,
            overdue_reported: false,
            on_event: None,
            gate: Arc::new(Gate::new(clock, max_admission_ms, fit)),
        };
        agent.status.installed = global;
        if !agent.install(Amounts::ZERO, Some(&[])) {
            return Err(ClusterConfigError::BadTtl);
        }
        Ok(agent)
    }

    /// Calls `f` with every [`AgentEvent`] (on the agent's thread; keep it short).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap()
    ///     .on_event(|e| eprintln!("{e:?}"));
    /// # let _ = a;
    /// ```
    #[must_use]
    pub fn on_event(mut self, f: impl FnMut(&AgentEvent) + Send + 'static) -> Self {
        self.on_event = Some(Box::new(f));
        self
    }

    /// The agent's state.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// assert_eq!(a.status().renewals, 0);
    /// ```
    #[must_use]
    pub fn status(&self) -> &AgentStatus {
        &self.status
    }

    /// The agent's clock.
    #[cfg(feature = "cluster-tokio")]
    pub(super) fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.gate.clock)
    }

    /// A handle whose admissions stop at the end of the installed share's window, whatever
    /// this agent's thread does, and carry the admission deadline ([`ClusterBulkhead`]).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// assert!(a.handle().try_acquire(llm_bulkhead::Demand::slot()).is_err());
    /// ```
    #[must_use]
    pub fn handle(&self) -> ClusterBulkhead {
        ClusterBulkhead::new(self.bulkhead.clone(), Arc::clone(&self.gate))
    }

    fn emit(&mut self, e: AgentEvent) {
        if let Some(f) = self.on_event.as_mut() {
            f(&e);
        }
    }

    /// Installs `share` and the class shares `classes` (`None`: the global class limits) in
    /// one snapshot if they differ from what is installed; false if the bulkhead refused (then
    /// it keeps its previous, and the store still counts that one as applied).
    fn install(&mut self, share: Amounts, classes: Option<&[ClassShare]>) -> bool {
        let (next, installed) =
            class_view::snapshot(&self.bulkhead, &self.base, self.global, share, classes);
        if share == self.status.installed && installed == self.status.installed_classes {
            return true;
        }
        let current = self.bulkhead.limits().revision;
        self.revision = self.revision.max(current).saturating_add(1);
        match self
            .bulkhead
            .apply_limits(next.with_revision(self.revision))
        {
            Ok(_) => {
                self.status.installed = share;
                self.status.installed_classes = installed;
                let revision = self.revision;
                self.emit(AgentEvent::Installed { share, revision });
                true
            }
            Err(_) => false,
        }
    }

    /// What is in flight, the demand, and whether the bulkhead refused or queued work since
    /// the last renewal. The demand is the peak in flight since the last renewal (sampled at
    /// every step) or, under pressure, twice the share installed; and at least the tokens in
    /// flight plus the largest reservation refused since the last renewal because the share
    /// could not hold it (`ShareTooSmall`), so a share of zero asks for room for one request
    /// of that size, not one token.
    fn demand(&mut self) -> (Amounts, Amounts, bool) {
        let s = self.bulkhead.stats();
        let held = Amounts::new(
            s.in_flight.max(s.admissions_in_flight),
            s.token_budget.map_or(0, |t| t.in_flight_tokens),
        );
        let rejected = self.rejected(&s);
        let pressed = rejected > self.rejected_seen || s.pending > 0;
        self.peak = self.peak.max(held);
        let mut wants = self.peak;
        if pressed {
            // Refused or queued work: ask for twice the share (at least one more slot).
            let i = self.status.installed;
            let more = Amounts::new(
                (i.slots * 2).max(held.slots + s.pending + 1),
                (i.tokens * 2).max(held.tokens + 1),
            );
            wants = wants.max(more);
        }
        let short = self.gate.fit.short();
        if short > 0 {
            wants.tokens = wants.tokens.max(held.tokens.saturating_add(short));
        }
        (held, wants.min(self.global), pressed)
    }

    /// One step at the agent's clock: renews when due (or early under pressure, at most every
    /// `ttl / 10`), installs the share the lease allows now with its admission window, fires
    /// the cut signals whose deadline passed, and returns when to step again (clock ms).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let mut a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// let next = a.tick();
    /// assert!(next <= 1_000);
    /// ```
    pub fn tick(&mut self) -> u64 {
        let clock = Arc::clone(&self.gate.clock);
        let ttl = self.params.ttl_ms;
        let gap = (ttl / 10).max(1);
        let now = clock.now_ms();
        let (held, wants, pressed) = self.demand();
        // Early also when a reservation was refused as too large for the share.
        let early = pressed
            && (self.lease.grant().slots < self.global.slots || self.gate.fit.short() > 0)
            && self.last_renew.is_none_or(|t| now >= t + gap);
        if now >= self.next_renew || early {
            let stats = self.bulkhead.stats();
            let uses = self.class_demand.uses(
                &stats,
                &self.params.classes,
                &self.status.installed_classes,
            );
            let req = self
                .lease
                .request(&self.status.replica, self.status.installed, held, wants)
                .with_classes(uses);
            self.last_renew = Some(now);
            self.rejected_seen = self.rejected(&stats);
            self.class_demand.renewed(&req.classes, &stats);
            self.gate.fit.renewed();
            self.peak = held;
            // A store that stops answering must not hold this thread past the next change of
            // the share (the end of the lease or of the floor): the call gets what is left.
            let left = self.lease.next_change(now).map_or(u64::MAX, |t| t - now);
            self.store.set_call_timeout(Duration::from_millis(left));
            match self.store.renew(&self.params, &req) {
                Ok(reply) => {
                    self.lease.on_reply(now, &reply);
                    self.status.renewals += 1;
                    self.status.granted = reply.granted;
                    self.status.learning = reply.learning;
                    self.status.last_error = None;
                    self.next_renew = now + (ttl / 3).max(1);
                    self.emit(AgentEvent::Renewed {
                        granted: reply.granted,
                        learning: reply.learning,
                    });
                }
                Err(e) => {
                    self.status.failures += 1;
                    self.status.last_error = Some(e.clone());
                    self.next_renew = now + gap;
                    self.emit(AgentEvent::StoreFailed(e));
                }
            }
        }
        let now = clock.now_ms();
        self.status.phase = self.lease.phase_at(now);
        let share = self.lease.share_at(now);
        let classes = self.lease.class_shares_at(now);
        self.install_windowed(now, share, classes.as_deref());
        self.watch_overdue(now, held);
        let mut next = self.next_renew.min(now + gap);
        if let Some(t) = self.lease.next_change(now) {
            next = next.min(t);
        }
        if let Some(t) = self.watch_deadlines(now) {
            next = next.min(t);
        }
        next
    }

    /// Refusals since start that count as pressure (the core's, without shutdown, and the
    /// handle's refusals past a lapsed window).
    fn rejected(&self, s: &crate::Stats) -> u64 {
        s.rejected
            .saturating_sub(s.rejected_by_reason.shutdown)
            .saturating_add(self.gate.late())
    }

    /// The end of the window in which `share`, installed at `now`, may admit: the lease's next
    /// change while it is valid or on the floor; none (`u64::MAX`) for share zero, which the
    /// core refuses by itself, and for fail-open's global limits.
    fn window(&self, now: u64, share: Amounts) -> u64 {
        match self.lease.phase_at(now) {
            Phase::Valid | Phase::Floor if share != Amounts::ZERO => {
                self.lease.next_change(now).unwrap_or(u64::MAX)
            }
            _ => u64::MAX,
        }
    }

    /// Installs `share` with its window. The window only narrows before the install (a
    /// handle never admits under the new share with the old, longer window, nor under the old
    /// share with the new one) and takes its exact value after it.
    fn install_windowed(&mut self, now: u64, share: Amounts, classes: Option<&[ClassShare]>) {
        let until = self.window(now, share);
        let narrowed = self.gate.until().min(until);
        self.gate.set_until(narrowed);
        if self.install(share, classes) {
            self.gate.set_until(until);
        }
    }

    /// Fires due cut signals and reports overdue releases; returns the next armed deadline.
    fn watch_deadlines(&mut self, now: u64) -> Option<u64> {
        let (fired, next) = self.gate.fire_due(now);
        if fired > 0 {
            self.status.cut += fired;
            self.emit(AgentEvent::AdmissionsCut { count: fired });
        }
        self.status.lapsed_refusals = self.gate.late();
        let overdue = self.gate.overdue();
        if overdue > self.status.overdue {
            self.status.overdue = overdue;
            self.emit(AgentEvent::OverdueReleased { total: overdue });
        }
        next
    }

    /// A4's check: once the share is zero, everything in flight must end within
    /// `max_admission`.
    fn watch_overdue(&mut self, now: u64, held: Amounts) {
        if self.status.installed != Amounts::ZERO {
            self.closed_since = None;
            self.overdue_reported = false;
            return;
        }
        let since = *self.closed_since.get_or_insert(now);
        let d = u64::try_from(self.config.max_admission.as_millis()).unwrap_or(u64::MAX);
        if held.slots > 0 && now.saturating_sub(since) > d && !self.overdue_reported {
            self.overdue_reported = true;
            self.emit(AgentEvent::AdmissionOverdue {
                in_flight: held.slots,
            });
        }
    }

    /// Leaves gracefully: installs zero, waits (at most `max_admission`, on `clock`) for the
    /// work in flight to end, then removes its record so the share is free at once. If the
    /// work does not end in time, the record stays and expires after `ttl + quarantine`.
    ///
    /// # Errors
    /// The store's, if the release failed (the record then expires on its own).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// a.leave().unwrap();
    /// ```
    pub fn leave(mut self) -> Result<(), StoreError> {
        let clock = Arc::clone(&self.gate.clock);
        let now = clock.now_ms();
        self.install_windowed(now, Amounts::ZERO, Some(&[]));
        let d = u64::try_from(self.config.max_admission.as_millis()).unwrap_or(u64::MAX);
        let until = clock.now_ms().saturating_add(d);
        // Also bounded in real time: an injected clock that stands still (a paused test
        // runtime) must not hold the leave for ever.
        let real_until = Instant::now().checked_add(self.config.max_admission);
        loop {
            let (held, _, _) = self.demand();
            if held == Amounts::ZERO {
                break;
            }
            if clock.now_ms() >= until || real_until.is_some_and(|t| Instant::now() >= t) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let req = self.lease.request(
            &self.status.replica,
            Amounts::ZERO,
            Amounts::ZERO,
            Amounts::ZERO,
        );
        self.store.release(&self.params, &req)
    }

    /// Runs the agent on its own thread with the system clock until [`RunningAgent::stop`].
    ///
    /// # Errors
    /// The OS refused a thread.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// let running = a.spawn().unwrap();
    /// running.stop().unwrap();
    /// ```
    pub fn spawn(self) -> std::io::Result<RunningAgent> {
        let shared = Arc::new(Control {
            stop: AtomicBool::new(false),
            status: Mutex::new(self.status.clone()),
            wake: Condvar::new(),
            gate: Mutex::new(()),
        });
        let control = Arc::clone(&shared);
        let handle = self.handle();
        let thread = crate::sync::thread::Builder::new()
            .name(format!("llm-bulkhead-cluster-{}", self.config.budget))
            .spawn(move || run(self, &control))?;
        Ok(RunningAgent {
            handle,
            control: shared,
            thread: Some(thread),
        })
    }
}

struct Control {
    stop: AtomicBool,
    status: Mutex<AgentStatus>,
    wake: Condvar,
    gate: Mutex<()>,
}

fn run(mut agent: ClusterAgent, control: &Control) -> Result<(), StoreError> {
    let clock = Arc::clone(&agent.gate.clock);
    while !control.stop.load(Ordering::Acquire) {
        let next = agent.tick();
        *lock(&control.status) = agent.status.clone();
        let wait = next.saturating_sub(clock.now_ms());
        let g = lock(&control.gate);
        if control.stop.load(Ordering::Acquire) {
            break;
        }
        // A stop notifies under the gate, so it is never missed between the check and the wait.
        let _ = control.wake.wait_timeout(g, Duration::from_millis(wait));
    }
    agent.leave()
}

/// An agent running on its own thread.
///
/// ```
/// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
/// let b = llm_bulkhead::Bulkhead::new(4).unwrap();
/// let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// let running = a.spawn().unwrap();
/// assert!(!running.status().replica.is_empty());
/// running.stop().unwrap();
/// ```
#[derive(Debug)]
pub struct RunningAgent {
    handle: ClusterBulkhead,
    control: Arc<Control>,
    thread: Option<std::thread::JoinHandle<Result<(), StoreError>>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

impl RunningAgent {
    /// The agent's state after its last step.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn().unwrap();
    /// let _ = a.status().phase;
    /// # a.stop().unwrap();
    /// ```
    #[must_use]
    pub fn status(&self) -> AgentStatus {
        lock(&self.control.status).clone()
    }

    /// The agent's [`ClusterBulkhead`] ([`ClusterAgent::handle`]).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn().unwrap();
    /// let h = a.handle();
    /// # let _ = h;
    /// # a.stop().unwrap();
    /// ```
    #[must_use]
    pub fn handle(&self) -> ClusterBulkhead {
        self.handle.clone()
    }

    /// Stops the agent: it installs zero, waits for the work in flight (at most
    /// `max_admission`) and returns its share to the store ([`ClusterAgent::leave`]).
    ///
    /// # Errors
    /// The store's, if the release failed.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let b = llm_bulkhead::Bulkhead::new(4).unwrap();
    /// # let a = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap().spawn().unwrap();
    /// a.stop().unwrap();
    /// ```
    pub fn stop(mut self) -> Result<(), StoreError> {
        self.signal();
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Ok(()),
        }
    }

    fn signal(&self) {
        self.control.stop.store(true, Ordering::Release);
        let _g = lock(&self.control.gate);
        self.control.wake.notify_all();
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        self.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
