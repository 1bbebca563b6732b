//! A client-side admission coordinator (seed 002; semantics: `COORDINATOR.md`, the choices in
//! [`contract`](crate::contract)): a client-wide concurrency limit, per-provider limits with
//! pacing (`min_interval`) and extend-only cooldowns, at most one running invocation per key,
//! and one finite queue served in **eligibility-ordered FIFO**: among the queued tickets that
//! can start, the oldest starts first; a ticket blocked by its provider or its key blocks
//! nobody behind it.
//!
//! Built on the wait layer's [`multi_wait`](crate::multi_wait): a ticket is a waiter that
//! holds out for a client slot, a provider slot, its key and its provider's time gate at
//! once, started inside the operation that made it eligible (a completion, a cooldown or
//! pacing deadline passing), so a freed slot never goes to a newcomer racing a queued ticket.
//!
//! Time comes from injected clocks and a scheduler ([`MonotonicClock`], [`WallClock`],
//! [`Scheduler`]); [`testing`] ships manual ones, so a test drives every instant by hand.
//!
//! ```
//! use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
//! use llm_bulkhead::coordinator::testing::ManualClocks;
//! use std::time::Duration;
//!
//! let clocks = ManualClocks::new(Duration::from_millis(1000));
//! let c: Coordinator = Coordinator::builder()
//!     .client_limit(2)
//!     .queue_cap(8)
//!     .provider("a", ProviderLimits { limit: Some(1), min_interval: Duration::from_millis(100) })
//!     .clocks(clocks.clocks())
//!     .build()
//!     .unwrap();
//! let first = c.submit("a", "k1", SubmitOptions::default()).unwrap();
//! assert!(first.is_started());
//! let second = c.submit("a", "k2", SubmitOptions::default()).unwrap();
//! assert!(!second.is_started()); // provider `a` is full
//! drop(first.wait_blocking().unwrap()); // the first invocation completes...
//! clocks.scheduler.advance(Duration::from_millis(100)); // ...and pacing lets the second start
//! assert!(second.wait_blocking().is_ok());
//! ```

mod clock;
mod error;
mod gates;
mod keys;
mod names;
mod retry_after;
mod state;
pub mod testing;
mod ticket;

#[cfg(not(loom))]
pub use clock::ThreadScheduler;
pub use clock::{MonotonicClock, Scheduler, SystemClock, Task, WallClock};
pub use error::{AdmissionError, CoordinatorError};
pub use retry_after::{parse_retry_after, RetryAfterError};
pub use ticket::{Invocation, Ticket, TicketWait};

use crate::wait::multi::{Admit, MultiWait, Refused, Start, Submitted, Txn};
use gates::{Gates, NotFast, ProviderGate};
use names::Names;
use state::{catch_up, next_instant, Provider, Request, State};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

/// The longest admission timeout a ticket may carry on the uncontended path (2^32 s).
const FAST_TIMEOUT: Duration = Duration::from_secs(1 << 32);

/// A ticket's id, unique in its coordinator, in submit order.
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let t = c.submit("a", "k", SubmitOptions::default()).unwrap();
/// assert_eq!(t.id().get(), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TicketId(u64);

impl TicketId {
    /// The number (submit order, from 0).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert_eq!(c.submit("a", "k", SubmitOptions::default()).unwrap().id().get(), 0);
    /// ```
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A provider's limits.
///
/// ```
/// use llm_bulkhead::coordinator::ProviderLimits;
/// let l = ProviderLimits { limit: Some(4), min_interval: std::time::Duration::from_millis(50) };
/// assert_eq!(ProviderLimits::default().limit, None);
/// # let _ = l;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProviderLimits {
    /// At most this many running invocations of the provider (`None`: no provider limit).
    pub limit: Option<u32>,
    /// The least gap between two starts of the provider, on the monotonic clock (zero: no
    /// pacing). The first start is never paced; completions do not count.
    pub min_interval: Duration,
}

/// Per-ticket options.
///
/// ```
/// use llm_bulkhead::coordinator::SubmitOptions;
/// let o = SubmitOptions { admission_timeout: Some(std::time::Duration::from_secs(5)), ..Default::default() };
/// # let _ = o;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// How long the ticket may wait in the queue (`None`: no limit; zero is refused, C4).
    /// Time after the start never counts.
    pub admission_timeout: Option<Duration>,
    /// The attempt's timeout, counted from the start (not from the submit): when it passes,
    /// the invocation's signal is cancelled (its slots stay held until it completes).
    pub attempt_timeout: Option<Duration>,
}

/// What happened to a ticket, in an [`Event`].
///
/// ```
/// use llm_bulkhead::coordinator::EventKind;
/// assert_ne!(EventKind::Start, EventKind::Timeout);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// It started (took its slots and key).
    Start,
    /// It left the queue at its admission timeout.
    Timeout,
    /// It left the queue because the coordinator closed.
    Closed,
    /// Its owner cancelled it while queued.
    Cancelled,
}

/// A start or a removal, at its monotonic instant (recorded with
/// [`CoordinatorBuilder::record_events`]).
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, EventKind, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default())
///     .record_events(true).build().unwrap();
/// let _t = c.submit("a", "k", SubmitOptions::default()).unwrap();
/// assert_eq!(c.drain_events()[0].kind, EventKind::Start);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The monotonic instant.
    pub at: Duration,
    /// The ticket.
    pub ticket: TicketId,
    /// What happened.
    pub kind: EventKind,
}

/// One provider in a [`Snapshot`].
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// assert_eq!(c.snapshot().providers[0].name, "a");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSnapshot {
    /// Its name.
    pub name: String,
    /// Its running invocations.
    pub in_flight: u32,
    /// Its cooldown's not-before instant while it is later than `now`, else `None` (C17).
    pub cooling_until: Option<Duration>,
    /// Its last start plus `min_interval` while that is later than `now`, else `None` (C17).
    pub paced_until: Option<Duration>,
}

/// The coordinator's state at one instant, read in one operation under the coordinator's
/// mutex: queued operations cannot race it. An uncontended start or completion on another
/// thread at the same moment takes no mutex, so its counters may be read half changed; with
/// no other thread running (a test driving fake clocks), the snapshot is exact.
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let _t = c.submit("a", "k", SubmitOptions::default()).unwrap();
/// let s = c.snapshot();
/// assert_eq!((s.client_in_flight, s.running.len(), s.queue.len()), (1, 1, 0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<K> {
    /// The monotonic clock's reading (the instant of this snapshot).
    pub now: Duration,
    /// Whether the coordinator is closed.
    pub closed: bool,
    /// Running invocations, all providers.
    pub client_in_flight: u32,
    /// Every provider, in configuration order.
    pub providers: Vec<ProviderSnapshot>,
    /// Every key with a running invocation and that invocation's ticket, keys sorted.
    pub running: Vec<(K, TicketId)>,
    /// Queued tickets, head first.
    pub queue: Vec<TicketId>,
}

/// The clocks and scheduler a coordinator uses.
///
/// ```
/// let c = llm_bulkhead::coordinator::Clocks::system();
/// # let _ = c;
/// ```
#[derive(Clone)]
pub struct Clocks {
    /// The monotonic clock (pacing, cooldowns, admission timeouts).
    pub elapsed: Arc<dyn MonotonicClock>,
    /// The wall clock (received-at stamps only).
    pub now: Arc<dyn WallClock>,
    /// The scheduler that wakes the coordinator at not-before instants and deadlines.
    pub scheduler: Arc<dyn Scheduler>,
}

impl Clocks {
    /// The real ones: [`SystemClock`] and a [`ThreadScheduler`] (one thread).
    ///
    /// ```
    /// let _ = llm_bulkhead::coordinator::Clocks::system();
    /// ```
    #[cfg(not(loom))]
    pub fn system() -> Self {
        let c = SystemClock::new();
        Clocks {
            elapsed: Arc::new(c),
            now: Arc::new(c),
            scheduler: Arc::new(ThreadScheduler::new(c)),
        }
    }
}

/// Builds a [`Coordinator`]; see [`Coordinator::builder`].
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, CoordinatorError, ProviderLimits};
/// let e = Coordinator::<String>::builder().client_limit(0).provider("a", ProviderLimits::default()).build();
/// assert_eq!(e.err(), Some(CoordinatorError::ZeroClientLimit));
/// ```
pub struct CoordinatorBuilder<K> {
    client_limit: u32,
    queue_cap: usize,
    providers: Vec<(String, ProviderLimits)>,
    clocks: Option<Clocks>,
    record: bool,
    _keys: std::marker::PhantomData<fn(K)>,
}

impl<K: Hash + Eq + Clone + Ord + Send + 'static> CoordinatorBuilder<K> {
    /// The client-wide concurrency limit (default 1; zero is an error).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().client_limit(8).provider("a", ProviderLimits::default()).build().unwrap();
    /// # let _ = c;
    /// ```
    pub fn client_limit(mut self, n: u32) -> Self {
        self.client_limit = n;
        self
    }

    /// The queue cap: how many tickets may wait (running ones do not count; 0 allowed: start
    /// now or overflow). Default 0.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().queue_cap(100).provider("a", ProviderLimits::default()).build().unwrap();
    /// # let _ = c;
    /// ```
    pub fn queue_cap(mut self, n: usize) -> Self {
        self.queue_cap = n;
        self
    }

    /// Adds a provider (providers are fixed once built).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits { limit: Some(2), ..Default::default() }).build().unwrap();
    /// # let _ = c;
    /// ```
    pub fn provider(mut self, name: impl Into<String>, limits: ProviderLimits) -> Self {
        self.providers.push((name.into(), limits));
        self
    }

    /// The clocks and scheduler (default: [`Clocks::system`]).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Clocks, Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().clocks(Clocks::system()).provider("a", ProviderLimits::default()).build().unwrap();
    /// # let _ = c;
    /// ```
    pub fn clocks(mut self, clocks: Clocks) -> Self {
        self.clocks = Some(clocks);
        self
    }

    /// Records starts and removals for [`Coordinator::drain_events`] (default off; the
    /// record grows until drained).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().record_events(true).provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.drain_events().is_empty());
    /// ```
    pub fn record_events(mut self, on: bool) -> Self {
        self.record = on;
        self
    }

    /// Validates and builds (typed errors: zero limits, no or duplicate providers).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, CoordinatorError};
    /// assert_eq!(Coordinator::<String>::builder().build().err(), Some(CoordinatorError::NoProviders));
    /// ```
    pub fn build(self) -> Result<Coordinator<K>, CoordinatorError> {
        if self.client_limit == 0 {
            return Err(CoordinatorError::ZeroClientLimit);
        }
        if self.providers.is_empty() {
            return Err(CoordinatorError::NoProviders);
        }
        let mut names = foldhash::HashMap::default();
        let mut providers = Vec::with_capacity(self.providers.len());
        let mut provider_gates = Vec::with_capacity(self.providers.len());
        for (i, (name, l)) in self.providers.into_iter().enumerate() {
            if l.limit == Some(0) {
                return Err(CoordinatorError::ZeroProviderLimit(name));
            }
            if names.insert(name.clone(), i).is_some() {
                return Err(CoordinatorError::DuplicateProvider(name));
            }
            provider_gates.push(ProviderGate::new(l.limit, l.min_interval));
            providers.push(Provider {
                name,
                not_before: None,
            });
        }
        #[cfg(not(loom))]
        let clocks = self.clocks.unwrap_or_else(Clocks::system);
        // Under loom the real scheduler's thread would run outside the model.
        #[cfg(loom)]
        let clocks = self.clocks.expect("loom models pass fake clocks");
        let now = clocks.elapsed.elapsed();
        let n_providers = providers.len();
        let gates = Gates::new(self.client_limit, provider_gates.into_boxed_slice());
        let state = State {
            now,
            clock_now: now,
            queue_cap: self.queue_cap,
            providers,
            gates: gates.clone(),
            queued: 0,
            events: self.record.then(Vec::new),
            scheduled: None,
            blocked: state::Blocked::new(n_providers),
        };
        let shared = Arc::new(Shared {
            wait: MultiWait::new(state),
            gates,
            names: Names::new(names),
            clocks,
            record: self.record,
            handles: crate::sync::AtomicUsize::new(1),
        });
        shared.gates.hold_joint(shared.clone());
        Ok(Coordinator { shared })
    }
}

/// The state every handle, ticket and invocation of one coordinator shares.
///
/// # Lifetime
///
/// Handles ([`Coordinator`] clones), queued tickets and tickets started on the queued path
/// hold it with an `Arc`. A ticket started on the uncontended path holds a plain pointer
/// instead (an `Arc` clone and drop would be two more locked instructions on every admit and
/// release): **its client slot is its reference**, as in the core (`crate::shared`). The
/// handles and the client slots together hold one *joint* `Arc` (kept in [`Gates`]):
///
/// * the last handle to go sets `DETACHED` in the client word; if no client slot was held,
///   it gives the joint reference up;
/// * every RMW that gives a client slot back reads the word it leaves: `DETACHED` and no
///   slot held means the last owner left, and a `fetch_or` of `FREED` picks exactly one
///   thread (a start on the queued path after `DETACHED`, e.g. by a timer, holds an `Arc`
///   and can bring the count back up and down again) to give the joint reference up.
///
/// A slot-held pointer is used only while the slot is held: the uncontended completion's
/// closing RMW is its last touch, and the completion on the queued path first turns the
/// pointer into an `Arc` (one more reference, on that slower path only). Every other place
/// that may see the last owner leave runs inside a call that holds an `Arc` of its own, so
/// giving the joint reference up there never frees the state under it.
pub(crate) struct Shared<K: Hash + Eq + Clone> {
    /// Live [`Coordinator`] handles (not tickets or invocations).
    handles: crate::sync::AtomicUsize,
    pub(crate) wait: MultiWait<State<K>>,
    /// The slots and keys as atomics: the uncontended path admits and releases with them
    /// alone (`gates` module docs).
    pub(crate) gates: crate::sync::Arc<Gates<K>>,
    /// Events are recorded: a fast start records its own under the mutex.
    record: bool,
    /// Provider name → index (looked up on every submit and cooldown; fixed at build).
    names: Names,
    pub(crate) clocks: Clocks,
}

/// The coordinator (module docs). Cheap to clone: clones share one state.
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
/// inv.complete();
/// assert_eq!(c.snapshot().client_in_flight, 0);
/// ```
pub struct Coordinator<K: Hash + Eq + Clone = String> {
    shared: Arc<Shared<K>>,
}

impl<K: Hash + Eq + Clone> Clone for Coordinator<K> {
    fn clone(&self) -> Self {
        self.shared
            .handles
            .fetch_add(1, crate::sync::Ordering::Relaxed);
        Coordinator {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> Drop for Coordinator<K> {
    fn drop(&mut self) {
        if self
            .shared
            .handles
            .fetch_sub(1, crate::sync::Ordering::AcqRel)
            == 1
        {
            // This handle's own `Arc` keeps the state alive past the joint reference.
            drop(self.shared.gates.detach());
        }
    }
}

impl<K: Hash + Eq + Clone + Ord + Send + 'static> Coordinator<K> {
    /// A builder: client limit 1, queue cap 0, no providers, the system clocks.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator<u64> = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// # let _ = c;
    /// ```
    pub fn builder() -> CoordinatorBuilder<K> {
        CoordinatorBuilder {
            client_limit: 1,
            queue_cap: 0,
            providers: Vec::new(),
            clocks: None,
            record: false,
            _keys: std::marker::PhantomData,
        }
    }

    fn provider_index(&self, name: &str) -> Result<usize, CoordinatorError> {
        self.shared
            .names
            .get(name)
            .ok_or_else(|| CoordinatorError::UnknownProvider(name.to_owned()))
    }

    /// Submits a ticket for `provider` and `key` (COORDINATOR.md §5 `submit`): it starts now
    /// if it is eligible (then it takes no queue place), else it queues if the queue has room.
    /// Errors, checked in this order, each changing nothing: an unknown provider (C7), a zero
    /// admission timeout (C4), a deadline past the clock's end, closed (C8), overflow (C14).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{AdmissionError, Coordinator, CoordinatorError, ProviderLimits, SubmitOptions};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let _running = c.submit("a", "k", SubmitOptions::default()).unwrap();
    /// // Queue cap 0 and the one client slot is taken: overflow.
    /// let e = c.submit("a", "k2", SubmitOptions::default()).err().unwrap();
    /// assert_eq!(e, CoordinatorError::Admission(AdmissionError::Overflow));
    /// assert!(matches!(c.submit("zz", "k", SubmitOptions::default()), Err(CoordinatorError::UnknownProvider(_))));
    /// ```
    pub fn submit(
        &self,
        provider: &str,
        key: impl Into<K>,
        options: SubmitOptions,
    ) -> Result<Ticket<K>, CoordinatorError> {
        let provider = self.provider_index(provider)?;
        if options.admission_timeout == Some(Duration::ZERO) {
            return Err(CoordinatorError::ZeroAdmissionTimeout);
        }
        let key = key.into();
        let received_at = self.shared.clocks.now.now();
        match self.try_fast(provider, key, options, received_at) {
            Ok(ticket) => Ok(ticket),
            Err(NotFast(key)) => self.submit_queued(provider, key, options, received_at),
        }
    }

    /// The queued path of [`submit`](Self::submit): the ticket is judged under the mutex.
    /// Out of line, so the uncontended submit stays small.
    #[cold]
    #[inline(never)]
    fn submit_queued(
        &self,
        provider: usize,
        key: K,
        options: SubmitOptions,
        received_at: std::time::SystemTime,
    ) -> Result<Ticket<K>, CoordinatorError> {
        let now = self.shared.clocks.elapsed.elapsed();
        let (out, wake) = self.shared.wait.transaction(|t| {
            catch_up(t, now);
            let now = t.state().now;
            let deadline = match options.admission_timeout {
                None => None,
                Some(d) => Some(
                    now.checked_add(d)
                        .ok_or(CoordinatorError::DeadlineOverflow)?,
                ),
            };
            if t.is_closed() {
                return Err(CoordinatorError::Admission(AdmissionError::Closed));
            }
            let s = t.state();
            let ticket = s.gates.next_ticket();
            let r = Request {
                ticket,
                provider,
                key,
                deadline,
                received_at,
            };
            if s.queued == 0 {
                // Nobody is queued, so starting now jumps nobody: try without raising
                // `WAITERS`.
                if let Start::Now(g) = s.try_start(&r) {
                    return Ok((Ok((ticket, Submitted::Started(g))), plan_wake(t)));
                }
                // It may have to queue: `WAITERS` up before it is judged again (`gates`
                // module docs); from here no uncontended operation takes or gives back a
                // client slot. (With a ticket queued, `WAITERS` is up already.)
                s.raise_waiters();
            }
            let submitted = t.submit(r);
            let s = t.state();
            if matches!(submitted, Ok(Submitted::Queued(_))) {
                s.queued += 1;
            } else if s.queued == 0 {
                s.lower_waiters();
            }
            let out = match submitted {
                Ok(s) => Ok((ticket, s)),
                Err(Refused::Full) => Err(CoordinatorError::Admission(AdmissionError::Overflow)),
                Err(Refused::Closed) => Err(CoordinatorError::Admission(AdmissionError::Closed)),
            };
            Ok((out, plan_wake(t)))
        })?;
        self.schedule(wake);
        let (id, submitted) = out?;
        Ok(ticket::submitted(
            &self.shared,
            id,
            submitted,
            received_at,
            options.attempt_timeout,
        ))
    }

    /// The uncontended start (`gates` module docs): no mutex unless events are recorded.
    /// A ticket with an admission timeout takes it only when the timeout is below
    /// [`FAST_TIMEOUT`]: its deadline is never computed (it starts now), and a shorter one
    /// cannot overflow any clock reading below 2^63 seconds, so the queued path's overflow
    /// error is not skipped.
    #[inline]
    fn try_fast(
        &self,
        provider: usize,
        key: K,
        options: SubmitOptions,
        received_at: std::time::SystemTime,
    ) -> Result<Ticket<K>, NotFast<K>> {
        if options.admission_timeout.is_some_and(|d| d >= FAST_TIMEOUT) {
            return Err(NotFast(key));
        }
        let shared = &self.shared;
        let need_now = shared.record || options.attempt_timeout.is_some();
        let clock = || shared.clocks.elapsed.elapsed();
        let started = shared
            .gates
            .try_admit(provider, key, need_now, received_at, clock)?;
        if shared.record {
            // The event at the coordinator's instant, as the queued path would record it.
            let (ticket, at) = (started.ticket, started.now.unwrap_or_default());
            let wake = shared.wait.transaction(|t| {
                catch_up(t, at);
                t.state().record(ticket, EventKind::Start);
                plan_wake(t)
            });
            self.schedule(wake);
        }
        // SAFETY: the client slot taken above goes to the invocation, which gives it back
        // when dropped; it keeps the joint reference, and with it the state, alive until
        // then (`Shared`, "Lifetime").
        let inv = unsafe { Invocation::slot_held(shared, started.seat) };
        if let Some(d) = options.attempt_timeout {
            inv.arm_attempt_timeout(d);
        }
        Ok(Ticket::started(inv))
    }

    /// Extends `provider`'s not-before instant to now + `delay` (never shortens it: C11, I7);
    /// its queued tickets start when it is ready again. Accepted after close. Errors change
    /// nothing: an unknown provider, a deadline past the clock's end.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// # use llm_bulkhead::coordinator::testing::ManualClocks;
    /// use std::time::Duration;
    /// let clocks = ManualClocks::new(Duration::ZERO);
    /// let c: Coordinator = Coordinator::builder().clocks(clocks.clocks()).provider("a", ProviderLimits::default()).build().unwrap();
    /// c.cooldown("a", Duration::from_secs(30)).unwrap();
    /// c.cooldown("a", Duration::from_secs(5)).unwrap(); // shorter: changes nothing
    /// assert_eq!(c.snapshot().providers[0].cooling_until, Some(Duration::from_secs(30)));
    /// ```
    pub fn cooldown(&self, provider: &str, delay: Duration) -> Result<(), CoordinatorError> {
        let provider = self.provider_index(provider)?;
        let now = self.shared.clocks.elapsed.elapsed();
        // A cooldown that ends no later than the provider's not-before changes nothing
        // (extend-only): one load, no mutex. (The mutex side's instant is never later than
        // this reading of the monotonic clock, so its deadline would be no later either.)
        if now
            .checked_add(delay)
            .is_some_and(|until| self.shared.gates.providers[provider].covers(until))
        {
            return Ok(());
        }
        let wake = self.shared.wait.transaction(|t| {
            catch_up(t, now);
            let s = t.state();
            let until = s
                .now
                .checked_add(delay)
                .ok_or(CoordinatorError::DeadlineOverflow)?;
            s.cool(provider, until);
            Ok(plan_wake(t))
        })?;
        self.schedule(wake);
        Ok(())
    }

    /// Closes (dispose): later submits get [`AdmissionError::Closed`]; every queued ticket
    /// leaves with it; every running invocation's signal is cancelled, but its slots stay held
    /// until it completes (a close does not pretend the work stopped). Idempotent (C9).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
    /// c.close();
    /// c.close();
    /// assert!(inv.signal().is_cancelled());
    /// assert_eq!(c.snapshot().client_in_flight, 1);
    /// ```
    pub fn close(&self) {
        let now = self.shared.clocks.elapsed.elapsed();
        self.shared.wait.transaction(|t| {
            catch_up(t, now);
            // Before the scan of the signals: a signal made after it is made cancelled.
            t.state().gates.close();
            t.close();
        });
        // Cancelling wakes the signal's waiters (user code): after the mutex.
        for s in self.shared.gates.signals() {
            s.cancel();
        }
    }

    /// The state now, read in one operation (COORDINATOR.md C17; see [`Snapshot`] for what
    /// concurrent uncontended starts do to it).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(!c.snapshot().closed);
    /// ```
    pub fn snapshot(&self) -> Snapshot<K> {
        let now = self.shared.clocks.elapsed.elapsed();
        let (snap, wake) = self.shared.wait.transaction(|t| {
            catch_up(t, now);
            let snap = t.read(|s, queue| {
                let later = |x: Option<Duration>| x.filter(|&at| at > s.now);
                let mut running = s.gates.keys.running();
                running.sort();
                Snapshot {
                    now: s.now,
                    closed: s.gates.is_closed(),
                    client_in_flight: s.gates.client_in_flight(),
                    providers: s
                        .providers
                        .iter()
                        .zip(s.gates.providers.iter())
                        .map(|(p, g)| ProviderSnapshot {
                            name: p.name.clone(),
                            in_flight: g.in_flight(),
                            cooling_until: later(p.not_before),
                            paced_until: later(g.paced_until()),
                        })
                        .collect(),
                    running,
                    queue: queue.map(|r| r.ticket).collect(),
                }
            });
            (snap, plan_wake(t))
        });
        self.schedule(wake);
        snap
    }

    /// Takes the events recorded since the last call (empty unless built with
    /// [`record_events`](CoordinatorBuilder::record_events)).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.drain_events().is_empty());
    /// ```
    pub fn drain_events(&self) -> Vec<Event> {
        self.shared
            .wait
            .update(|s| s.events.as_mut().map(std::mem::take).unwrap_or_default())
    }

    /// The capacity of the running-keys table (feature `testing`): it follows the number of
    /// keys running at once, not the number of keys ever seen.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.key_table_capacity() < 64);
    /// ```
    #[cfg(feature = "testing")]
    pub fn key_table_capacity(&self) -> usize {
        self.shared.gates.keys.capacity()
    }

    fn schedule(&self, wake: Option<Duration>) {
        schedule_tick(&self.shared, wake);
    }
}

/// The instant the scheduler should wake the coordinator at, if it must be (re)armed: the
/// next deadline or ready instant after now, when it is earlier than the armed one or none
/// is armed.
pub(crate) fn plan_wake<K: Hash + Eq + Clone>(t: &mut Txn<'_, State<K>>) -> Option<Duration> {
    let now = t.state().now;
    let n = next_instant(t, now, None)?;
    let s = t.state();
    if s.scheduled.is_some_and(|armed| armed > now && armed <= n) {
        return None;
    }
    s.scheduled = Some(n);
    Some(n)
}

/// Arms the scheduler (outside the mutex: a scheduler is user code) to catch the
/// coordinator up at `wake`. The task holds a weak reference: a dropped coordinator's
/// timers do nothing.
pub(crate) fn schedule_tick<K: Hash + Eq + Clone + Send + 'static>(
    shared: &Arc<Shared<K>>,
    wake: Option<Duration>,
) {
    let Some(at) = wake else { return };
    let weak = Arc::downgrade(shared);
    shared.clocks.scheduler.schedule(
        at,
        Box::new(move || {
            if let Some(shared) = weak.upgrade() {
                tick(&shared, at);
            }
        }),
    );
}

fn tick<K: Hash + Eq + Clone + Send + 'static>(shared: &Arc<Shared<K>>, at: Duration) {
    let now = shared.clocks.elapsed.elapsed();
    let wake = shared.wait.transaction(|t| {
        let s = t.state();
        if s.scheduled == Some(at) {
            s.scheduled = None;
        }
        catch_up(t, now);
        plan_wake(t)
    });
    schedule_tick(shared, wake);
}
