//! The cluster handle: admissions that stop at the lease's end and carry the admission deadline.
//!
//! The quarantine argument (see the module docs, A3 and A4) needs two things from the replica:
//! no admission after the installed share's window ends, and no admission in flight longer
//! than `max_admission`. The agent alone cannot give the first: it changes the installed share
//! from its own thread, and a thread can be descheduled, or held by a grace period in
//! `apply_limits`, past the end of the window. So [`ClusterBulkhead::try_acquire`] checks the
//! window itself, on the agent's clock, right after the core's commit: whatever the agent's
//! thread does, an admission is kept only if it committed while the share that admitted it was
//! valid. One clock read, after the commit, is enough: it bounds the commit from above.
//!
//! For the second, a demanding user wants three things, and gets them:
//! * **every admission knows its deadline** ([`ClusterAdmission::deadline_ms`], `max_admission`
//!   after the admission, on the agent's clock);
//! * **work that must stop is told so**: [`ClusterAdmission::cut_signal`] fires at the deadline
//!   (the agent's step fires it, so an injected clock drives it), and
//!   [`ClusterBulkhead::run`] drops the work's future at the deadline (for an HTTP client
//!   future, dropping it closes the upstream request);
//! * **work that overran is counted, never hidden**: the capacity stays held until the work
//!   really ends (releasing the slot early would make the local count smaller than what runs
//!   upstream, and the global bound is about what runs upstream), and an admission released
//!   after its deadline is counted in [`AgentStatus::overdue`](super::AgentStatus::overdue)
//!   and reported as [`AgentEvent::OverdueReleased`](super::AgentEvent::OverdueReleased).
//!
//! The price is one read of the agent's clock per admission, after the core's commit, and an
//! `Arc` count for the admission's link back to the agent. On a loaded VM the precise clock
//! costs several times the core's pair; the agent's clock can be `CoarseClock` (Linux), which
//! reads in a fraction of that and may lag one kernel tick (at most the `margin`, checked).
//!
//! The LLM layer and the tower layer built over the handle (`LlmBulkhead::clustered`,
//! `BulkheadLayer::clustered`, with the features `llm` and `tower`) admit on the bulkhead
//! themselves and then make the same check (`ClusterWindow::check`, right after their commit,
//! queued admissions included), so they admit nothing past the window either; the LLM layer
//! also cuts its runs at the deadline. Built over the bare [`Bulkhead`] they are not
//! cluster-managed and carry nothing of this, and neither does the core's decision path:
//! admissions taken on the [`Bulkhead`] directly skip the window check, and for them the
//! agent's punctuality (A3) is assumed as before.
//!
//! # Memory ordering
//! The agent installs a shrinking window before the share it belongs to and the exact window
//! after it (`Release`); the handle reads it with `Acquire`. A window read after the store
//! therefore sees the share installed with it, and `apply_limits` already guarantees that no
//! decision against an older share commits once it returned.

use super::agent::Clock;
use super::share_fit::{GlobalFit, ShareTooSmall};
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use crate::{Admission, Bulkhead, Demand, Rejection};
use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll, Waker};

/// What the agent shares with its handles.
pub(super) struct Gate {
    pub(super) clock: Arc<dyn Clock>,
    /// Admissions commit only while `clock < until` (ms); `u64::MAX` while the installed share
    /// needs no window (zero, or fail-open).
    until: AtomicU64,
    max_admission_ms: u64,
    /// Admissions released after their deadline.
    overdue: AtomicU64,
    /// The agent's clock at its last step: a release at or after it is past every deadline
    /// up to it (read on release instead of the clock, which costs more than the pair).
    stepped: AtomicU64,
    /// Refusals because the window had ended before the agent changed the share.
    late: AtomicU64,
    cuts: Mutex<Vec<Weak<CutState>>>,
    /// The deliberately broken variant (`LLM_BULKHEAD_CLUSTER_NO_WINDOW=1` with the feature
    /// `testing`, read once): the handle skips its window checks, as the bare bulkhead does.
    /// `tests/cluster_redis.rs` (the blackhole test) and `tests/cluster_gate.rs` fail on it.
    no_window: bool,
    /// The deliberately broken variant `LLM_BULKHEAD_CLUSTER_NO_CUT=1` (feature `testing`,
    /// read once): a cut signal made for a layer's run wakes nothing at the deadline, and a
    /// run asking whether it passed hears no, so the LLM layer's runs are never cut.
    /// `tests/cluster_layers.rs` (the cut tests) fail on it.
    no_cut: bool,
    /// The global limits, for the layers' judgement of a refusal that never fits the share.
    pub(super) fit: GlobalFit,
}

impl Gate {
    pub(super) fn new(clock: Arc<dyn Clock>, max_admission_ms: u64, fit: GlobalFit) -> Self {
        Gate {
            fit,
            clock,
            until: AtomicU64::new(u64::MAX),
            max_admission_ms,
            overdue: AtomicU64::new(0),
            stepped: AtomicU64::new(0),
            late: AtomicU64::new(0),
            cuts: Mutex::new(Vec::new()),
            // Test builds only (feature `testing`), as the other broken variants.
            no_window: cfg!(feature = "testing")
                && std::env::var_os("LLM_BULKHEAD_CLUSTER_NO_WINDOW").is_some_and(|v| v == "1"),
            no_cut: cfg!(feature = "testing")
                && std::env::var_os("LLM_BULKHEAD_CLUSTER_NO_CUT").is_some_and(|v| v == "1"),
        }
    }

    pub(super) fn until(&self) -> u64 {
        self.until.load(Ordering::Acquire)
    }

    /// Whether an admission at `now` falls outside the installed share's window.
    fn outside(&self, now: u64) -> bool {
        now >= self.until() && !self.no_window
    }

    pub(super) fn set_until(&self, until: u64) {
        self.until.store(until, Ordering::Release);
    }

    pub(super) fn overdue(&self) -> u64 {
        self.overdue.load(Ordering::Relaxed)
    }

    pub(super) fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Fires every cut signal whose deadline is at or before `now`; returns how many fired and
    /// the earliest deadline still armed.
    pub(super) fn fire_due(&self, now: u64) -> (u64, Option<u64>) {
        self.stepped.fetch_max(now, Ordering::Release);
        let mut fired = Vec::new();
        let next = {
            let mut cuts = lock(&self.cuts);
            let mut next: Option<u64> = None;
            cuts.retain(|w| {
                let Some(c) = w.upgrade() else { return false };
                if c.deadline <= now {
                    fired.push(c);
                    return false;
                }
                next = Some(next.map_or(c.deadline, |n| n.min(c.deadline)));
                true
            });
            next
        };
        // Wakers run outside the lock.
        for c in &fired {
            c.fire();
        }
        (fired.len() as u64, next)
    }
}

/// A [`Bulkhead`] managed by a cluster agent, whose admissions stop at the end of the share's
/// window and carry the admission deadline. Clones share the agent's state. Get one from
/// [`ClusterAgent::handle`](super::ClusterAgent::handle) or
/// [`RunningAgent::handle`](super::RunningAgent::handle).
///
/// ```
/// use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, ClusterRejection, MemoryStore};
/// use llm_bulkhead::{Bulkhead, Demand};
/// let b = Bulkhead::new(4).unwrap();
/// let agent = ClusterAgent::new(b, Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// let h = agent.handle();
/// // No lease yet: share zero, the core refuses.
/// assert!(matches!(h.try_acquire(Demand::slot()), Err(ClusterRejection::Refused(_))));
/// ```
#[derive(Clone)]
pub struct ClusterBulkhead {
    bulkhead: Bulkhead,
    window: ClusterWindow,
}

/// The post-commit part of a cluster admission: the window check and the deadline. The
/// handle, the LLM layer and the tower layer each call [`check`](Self::check) right after
/// the core committed an admission; a bulkhead that is not cluster-managed has none, so the
/// core's decision path carries nothing of it.
#[derive(Clone)]
pub(crate) struct ClusterWindow(Arc<Gate>);

impl ClusterWindow {
    /// Call right after the core's commit: the ticket (the admission's deadline) if the
    /// installed share's window had not ended, else [`ClusterRejection::ShareLapsed`] (the
    /// caller gives the admission back at once). One read of the agent's clock.
    #[inline]
    pub(crate) fn check(&self) -> Result<Ticket, ClusterRejection> {
        let g = &*self.0;
        // After the commit: this read bounds it, however long the thread was paused before.
        let now = g.clock.now_ms();
        if g.outside(now) {
            return Err(self.lapsed());
        }
        Ok(Ticket {
            deadline_ms: now.saturating_add(g.max_admission_ms),
            gate: Arc::clone(&self.0),
        })
    }

    /// The cluster answer to the core's refusal of `demand`: a reservation the installed
    /// share can never hold but the global limits can is
    /// [`ClusterRejection::ShareTooSmall`] (retryable, and kept for the agent's next
    /// renewal); every other refusal, a reservation above the global limits included, is
    /// [`ClusterRejection::Refused`] as the core made it.
    #[cold]
    pub(crate) fn refused(&self, demand: &Demand, rejection: Rejection) -> ClusterRejection {
        match self.judge(demand, rejection) {
            Ok(s) => ClusterRejection::ShareTooSmall(s),
            Err(r) => ClusterRejection::Refused(r),
        }
    }

    /// As [`refused`](Self::refused), for the layers' own refusal types: the share too small,
    /// or the core's refusal given back as it is.
    #[cold]
    pub(crate) fn judge(
        &self,
        demand: &Demand,
        rejection: Rejection,
    ) -> Result<Box<ShareTooSmall>, Rejection> {
        self.0.fit.judge(demand, rejection).map(Box::new)
    }

    #[cold]
    fn lapsed(&self) -> ClusterRejection {
        self.0.late.fetch_add(1, Ordering::Relaxed);
        ClusterRejection::ShareLapsed
    }
}

/// A cluster admission's link back to the agent: its deadline, and the overdue count when it
/// is dropped after it (drop it with the admission it was checked for).
pub(crate) struct Ticket {
    deadline_ms: u64,
    gate: Arc<Gate>,
}

impl Ticket {
    /// When the admission must have ended (the agent's clock, ms).
    pub(crate) fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// Whether the agent's step has passed the deadline: exactly when it fires the cut
    /// signals of this deadline (it stores its step's time before it fires them). One load,
    /// nothing registered: a run that only asks is cut as surely as one that waits.
    /// Only the LLM layer asks.
    #[cfg(feature = "llm")]
    #[inline]
    pub(crate) fn passed(&self) -> bool {
        self.arm().passed()
    }

    /// What registers a cut signal for this deadline later (it keeps the agent's state alive,
    /// and counts nothing when dropped).
    #[inline]
    pub(crate) fn arm(&self) -> CutArm {
        CutArm {
            deadline_ms: self.deadline_ms,
            gate: Arc::clone(&self.gate),
        }
    }

    /// A signal that fires at the deadline and wakes `waker` then (if given).
    pub(crate) fn cut_signal(&self, waker: Option<Waker>) -> CutSignal {
        self.arm().register(waker)
    }
}

/// Registers a cut signal for one admission's deadline when first needed (see
/// [`Ticket::arm`]): a run that ends before it waits registers nothing.
pub(crate) struct CutArm {
    deadline_ms: u64,
    gate: Arc<Gate>,
}

impl CutArm {
    /// As [`Ticket::passed`].
    #[cfg(feature = "llm")]
    #[inline]
    pub(crate) fn passed(&self) -> bool {
        self.gate.stepped.load(Ordering::Acquire) >= self.deadline_ms && !self.gate.no_cut
    }

    /// A signal that fires at the deadline and wakes `waker` then (if given). Takes the
    /// registry's lock once; the registry drops the entries of signals gone whenever it is
    /// full, so it stays within twice the live signals between the agent's steps.
    pub(crate) fn register(&self, waker: Option<Waker>) -> CutSignal {
        let state = Arc::new(CutState {
            deadline: self.deadline_ms,
            fired: AtomicBool::new(false),
            waker: Mutex::new(waker.filter(|_| !self.gate.no_cut)),
        });
        let mut cuts = lock(&self.gate.cuts);
        if cuts.len() == cuts.capacity() {
            cuts.retain(|w| w.strong_count() > 0);
        }
        cuts.push(Arc::downgrade(&state));
        drop(cuts);
        CutSignal(state)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // A release at or after the agent's first step past the deadline is overdue.
        if self.gate.stepped.load(Ordering::Acquire) >= self.deadline_ms {
            self.gate.overdue.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for ClusterBulkhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBulkhead")
            .field("until", &self.window.0.until())
            .finish_non_exhaustive()
    }
}

/// Why [`ClusterBulkhead::try_acquire`] refused.
///
/// ```
/// use llm_bulkhead::cluster::ClusterRejection;
/// assert!(ClusterRejection::ShareLapsed.to_string().contains("lapsed"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterRejection {
    /// The installed share's window had ended (the agent had not installed the next share
    /// yet): nothing admitted.
    ShareLapsed,
    /// The bulkhead refused, within the installed share. A token reservation whose
    /// [`Rejection::never_fits`] is set is here only when it is above the **global** limits
    /// too: do not retry it.
    Refused(Rejection),
    /// The installed share cannot hold this token reservation however much work ends, but
    /// the global limits can (the share is zero while the table learns or after the agent
    /// degraded, or small beside the request): retry after
    /// [`ShareTooSmall::retry_after_ms`], when the agent has renewed with the demand this
    /// refusal reported. Boxed: the detail is large.
    ShareTooSmall(Box<ShareTooSmall>),
}

impl std::fmt::Display for ClusterRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterRejection::ShareLapsed => f.write_str("the replica's cluster share lapsed"),
            ClusterRejection::Refused(r) => write!(f, "{r}"),
            ClusterRejection::ShareTooSmall(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for ClusterRejection {}

impl ClusterBulkhead {
    pub(super) fn new(bulkhead: Bulkhead, gate: Arc<Gate>) -> Self {
        ClusterBulkhead {
            bulkhead,
            window: ClusterWindow(gate),
        }
    }

    /// The managed bulkhead (its own admissions skip the window check: build the LLM or tower
    /// layer with `clustered` over this handle instead).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// assert_eq!(agent.handle().bulkhead().limits().max_concurrent, 0);
    /// ```
    #[must_use]
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// Admits `demand` now if the installed share has room and its window has not ended.
    /// Lock-free: the core's `try_acquire`, then one clock read.
    ///
    /// The read comes after the core's commit, so it bounds the commit from above: a thread
    /// paused anywhere before it (between its own decision to call and the commit, or inside
    /// the core) is caught, and the deadline it gives (`read + max_admission`) is inside
    /// `window end + max_admission`, the bound the quarantine is sized for. An admission found
    /// past the window is released at once, so the core's statistics count it as admitted
    /// and released.
    ///
    /// # Errors
    /// [`ClusterRejection::ShareLapsed`] if the share's window had ended at the commit;
    /// [`ClusterRejection::ShareTooSmall`] for a token reservation the installed share can
    /// never hold but the global limits can; else the core's refusal.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// assert!(agent.handle().try_acquire(llm_bulkhead::Demand::slot()).is_err());
    /// ```
    pub fn try_acquire(&self, demand: Demand) -> Result<ClusterAdmission, ClusterRejection> {
        let admission = self
            .bulkhead
            .try_acquire(demand)
            .map_err(|r| self.window.refused(&demand, r))?;
        // After the commit: the check's read bounds it, however long the thread was paused
        // before. Refused: the admission is given back at once.
        let ticket = self.window().check()?;
        Ok(ClusterAdmission { admission, ticket })
    }

    /// The window check and deadline alone, for the layers that admit on the bulkhead
    /// themselves (the LLM and tower layers built over this handle).
    pub(crate) fn window(&self) -> &ClusterWindow {
        &self.window
    }

    /// Admits `demand` and runs `work` until it ends or its admission deadline passes,
    /// whichever comes first; at the deadline the future is dropped (for an HTTP client
    /// future this closes the upstream request) and the admission released.
    ///
    /// # Errors
    /// [`ClusterRunError::Refused`] without running `work`; [`ClusterRunError::Cut`] when the
    /// deadline passed first.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` and releases the admission.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, ClusterRunError, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// let h = agent.handle();
    /// let f = h.run(llm_bulkhead::Demand::slot(), async { 42 });
    /// # let _ = f;
    /// ```
    pub async fn run<F: Future>(
        &self,
        demand: Demand,
        work: F,
    ) -> Result<F::Output, ClusterRunError> {
        let admission = self.try_acquire(demand).map_err(ClusterRunError::Refused)?;
        let mut cut = admission.cut_signal();
        let mut work = std::pin::pin!(work);
        let out = std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(v));
            }
            Pin::new(&mut cut)
                .poll(cx)
                .map(|()| Err(ClusterRunError::Cut))
        })
        .await;
        drop(admission);
        out
    }
}

/// Why [`ClusterBulkhead::run`] did not return the work's output.
///
/// ```
/// use llm_bulkhead::cluster::ClusterRunError;
/// assert!(ClusterRunError::Cut.to_string().contains("deadline"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterRunError {
    /// Not admitted; the work did not run.
    Refused(ClusterRejection),
    /// The admission deadline passed first: the work was dropped.
    Cut,
}

impl std::fmt::Display for ClusterRunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterRunError::Refused(r) => write!(f, "not admitted: {r}"),
            ClusterRunError::Cut => f.write_str("work cut at its admission deadline"),
        }
    }
}

impl std::error::Error for ClusterRunError {}

/// An admission taken through a [`ClusterBulkhead`]: the core's [`Admission`] plus its deadline.
/// Dropping it releases the capacity; a release after the agent's first step at or past the
/// deadline is counted as overdue (the agent steps at least every `ttl / 10`, and at every
/// deadline a [`CutSignal`] waits for).
///
/// ```
/// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
/// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
///     assert!(!a.is_overdue());
/// }
/// ```
pub struct ClusterAdmission {
    // Dropped first: the capacity is released, then the ticket counts an overdue release.
    admission: Admission,
    ticket: Ticket,
}

impl std::fmt::Debug for ClusterAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAdmission")
            .field("deadline_ms", &self.ticket.deadline_ms)
            .finish_non_exhaustive()
    }
}

impl ClusterAdmission {
    /// When this admission must have ended: `max_admission` after it, in the agent's clock
    /// (ms).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
    ///     let _ = a.deadline_ms();
    /// }
    /// ```
    #[must_use]
    pub fn deadline_ms(&self) -> u64 {
        self.ticket.deadline_ms()
    }

    /// Whether the deadline has passed (the work should have ended).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
    ///     assert!(!a.is_overdue());
    /// }
    /// ```
    #[must_use]
    pub fn is_overdue(&self) -> bool {
        self.ticket.gate.clock.now_ms() >= self.ticket.deadline_ms
    }

    /// The core's admission (its revision, reservation and usage reports).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
    ///     let _ = a.admission().revision();
    /// }
    /// ```
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// A signal that fires at this admission's deadline: poll it beside the work, or check
    /// [`CutSignal::is_cut`] between steps of blocking work, and stop the work when it fires.
    /// The agent's step fires it (on the agent's clock, at most one step late). Takes a lock
    /// once, to register.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
    ///     assert!(!a.cut_signal().is_cut());
    /// }
    /// ```
    #[must_use]
    pub fn cut_signal(&self) -> CutSignal {
        self.ticket.cut_signal(None)
    }
}

struct CutState {
    deadline: u64,
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl CutState {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }
}

/// Fires at an admission's deadline ([`ClusterAdmission::cut_signal`]); as a future, resolves
/// then.
///
/// ```
/// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
/// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
/// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
///     let cut = a.cut_signal();
///     assert!(!cut.is_cut());
/// }
/// ```
pub struct CutSignal(Arc<CutState>);

impl std::fmt::Debug for CutSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CutSignal")
            .field("cut", &self.is_cut())
            .finish()
    }
}

impl CutSignal {
    /// Whether the deadline passed (the agent fired the signal).
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// # let agent = ClusterAgent::new(llm_bulkhead::Bulkhead::new(4).unwrap(), Box::new(MemoryStore::new()), ClusterConfig::new("a", "b")).unwrap();
    /// if let Ok(a) = agent.handle().try_acquire(llm_bulkhead::Demand::slot()) {
    ///     assert!(!a.cut_signal().is_cut());
    /// }
    /// ```
    #[must_use]
    pub fn is_cut(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }
}

impl Future for CutSignal {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_cut() {
            return Poll::Ready(());
        }
        *lock(&self.0.waker) = Some(cx.waker().clone());
        // Checked again under the registration: a fire between the two reads takes the waker
        // after it was stored, or this read sees the flag.
        if self.is_cut() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}
