//! The partitions' pending queues, on the wait layer's
//! [`multi_wait`](crate::multi_wait): a class whose overflow is [`Overflow::Wait`] waits in
//! its partition's queue, bounded in length (`pending_limit`) and in age
//! (`queue_max_age_ms`).
//!
//! ## One queue over every partition
//!
//! Every waiter of every partition is in one [`MultiWait`], in arrival order. Its start rule
//! judges each waiter with the pools' own decision ([`Engine::decide`]): a waiter starts only
//! when its partition unit, its provider's connection and a global-guard unit are all free for
//! it, taken in one decision. A waiter whose partition is full is skipped and blocks nobody
//! behind it (another partition's waiter may start); a full global guard ends the scan, since
//! nobody can start then. The pending limit of each partition is counted under the queue's
//! mutex ([`Admit::may_queue`], [`Admit::left_queue`]), so it is never passed.
//!
//! ## The hand-off
//!
//! A release gives its units back with SeqCst read-modify-writes, then reads how many wait
//! (`Engine::queued`, SeqCst). Zero: nobody to start, no lock taken. Otherwise it runs the
//! start rule under the queue's mutex: the freed units go to the oldest waiters that can use
//! them, inside that release. A newcomer counts itself in `queued` before the start rule runs
//! once more at the end of its entry (its own judgment included). So either the release sees
//! the newcomer counted, and runs the start rule after its entry, or the newcomer's last
//! judgment sees the units given back: no waiter stays queued with its units free (Dekker's
//! pattern over one total order of SeqCst operations). A decision that took units and gave
//! them back (a later step refused it) needs no hand-off: its units were tentative until
//! then, and a waiter's judgment that meets tentative units waits for them instead of
//! refusing (`engine.rs`, "No spurious refusal"), so no judgment ever counted them.
//! `loom-tests/tests/pools_queue.rs` models the hand-off and shows the undo needs none.
//!
//! ## Fairness
//!
//! A unit a release frees goes to the oldest queued waiter that can start with it, never to a
//! newcomer racing with that release (as in the core and the coordinator). A newcomer whose
//! partition has waiters goes through the queue, behind them. Any other newcomer (a decision
//! of [`Pools::try_admit`], [`Pools::admit`], or the entry of an idle waiting partition)
//! decides without the lock, then, holding its units tentatively, reads how many wait
//! (`Engine::queued`, SeqCst, after its steps). If some wait and its units may be theirs (its
//! partition has waiters, or its provider's connections or the global guard have fewer free
//! units left than there are waiters), it gives them back and decides again under the
//! queue's mutex, after the start rule has started every waiter that can start. A release
//! gives its units back before it reads the count, and a waiter counts itself before its
//! last judgment, so a newcomer that took a freed unit a waiter was owed sees that waiter
//! counted (one total order of SeqCst operations). With nobody waiting it costs one load.
//! `tests/pools_races.rs` pins the race: a newcomer to an idle partition comes between a
//! release's give-back and its hand-off, and the other partition's waiter still starts.
//!
//! ## Events
//!
//! A waiter's decisions are a [`Decision::Queue`], then a dispatch or a rejection (its age,
//! its deadline). A waiter that is cancelled (its future dropped) while queued makes no
//! further decision: its queue decision is its last event, and the partition's `pending`
//! count drops. One started by a release and dropped before it collected the start has its
//! dispatch event and a completion event ([`FailureClass::Cancelled`](super::FailureClass)),
//! and its units go back to the next waiter.
//!
//! ## Age and deadlines
//!
//! A waiter's deadline is the nearer of its arrival plus the partition's `queue_max_age_ms`
//! and the caller's deadline, on the pools' clock. On the default clock it leaves at that
//! deadline (its own wait times out); on an injected clock ([`Pools::with_clock`]) the pools'
//! operations on that clock end it: every release and every entry removes the waiters whose
//! deadline passed before it starts anyone, and so does [`Pools::expire_waiters`]. A waiter
//! older than its partition's max age is refused with [`Reason::QueueAgeExceeded`] even when
//! the queue is short. At entry a caller is refused with [`Reason::DeadlineUnmeetable`] when
//! its deadline has passed or is nearer than the age of its partition's oldest waiter, and
//! with [`Reason::PendingLimitReached`] when the queue is full. An async waiter that a release
//! starts just before it reads its passed deadline leaves with its age as the reason and gives
//! the start back, once, to the next waiter (`tests/pools_races.rs`).

use super::config::Overflow;
use super::engine::{Engine, Granted, Refused, MAX_AGE_MS, PENDING_LIMIT, TOKEN_BUDGET};
use super::events::{Decision, Reason};
use super::route::{PoolOutcome, PoolRequest, Route};
use super::{PartitionId, Pools};
use crate::sync::{Arc, Ordering};
use crate::wait::multi::{
    Admit, Leave, MultiWait, Start, Submitted, Txn, WaitFuture, Waited, WaiterId,
};
use crate::Priority;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// One waiter of a pending queue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiter {
    partition: usize,
    priority: Priority,
    tokens: u64,
    enqueued: Instant,
    deadline: Instant,
    /// Its deadline is its queue age (else the caller's own).
    by_age: bool,
    /// Unique among the waiters (ties of `enqueued`).
    ticket: u64,
}

/// The queue's state: the engine it decides with and each partition's waiters by age.
pub(crate) struct Pending {
    engine: Arc<Engine>,
    /// Per partition, its waiters by (arrival, ticket): the oldest first.
    oldest: Box<[BTreeSet<(Instant, u64)>]>,
    tickets: u64,
    /// The clock read of the operation in progress (set before a newcomer is judged).
    now: Instant,
    /// Why the last judgment under the mutex refused (for the newcomer's event).
    last: Reason,
    last_version: u64,
}

impl Pending {
    pub(crate) fn new(engine: Arc<Engine>) -> Pending {
        let n = engine.partitions.len();
        let now = engine.now();
        Pending {
            engine,
            oldest: (0..n).map(|_| BTreeSet::new()).collect(),
            tickets: 0,
            now,
            last: Reason::CapacityAvailable,
            last_version: 0,
        }
    }

    /// How long each partition's oldest waiter has waited at `now`.
    pub(crate) fn oldest_waits(&self, now: Instant) -> Vec<Option<Duration>> {
        let age = |s: &BTreeSet<(Instant, u64)>| s.first().map(|(t, _)| now.duration_since(*t));
        self.oldest.iter().map(age).collect()
    }

    fn refuse(&mut self, w: &Waiter, reason: Reason) -> bool {
        self.last = reason;
        let p = &self.engine.partitions[w.partition];
        super::engine::bump(&p.hot.counters.queue_refusals);
        false
    }
}

impl Admit for Pending {
    type Request = Waiter;
    /// The partition and what its decision granted.
    type Grant = (usize, Granted);

    fn try_start(&mut self, w: &Waiter) -> Start<(usize, Granted)> {
        match self
            .engine
            .decide::<false, false>(w.partition, w.priority, w.tokens)
        {
            Ok(g) => Start::Now((w.partition, g)),
            Err(Refused {
                reason, version, ..
            }) => {
                self.last = reason;
                self.last_version = version;
                // The global guard is every request's: nobody behind can start either.
                if reason == Reason::GlobalLimitReached {
                    Start::Nobody
                } else {
                    Start::NotYet
                }
            }
        }
    }

    fn give_back(&mut self, (pi, g): (usize, Granted)) {
        // A waiter that gave up after its start: its units go back, and the start rule that
        // `MultiWait` runs next passes them on.
        self.engine.release(pi, g.tokens, false);
    }

    fn may_queue(&mut self, w: &Waiter, _queued: usize) -> bool {
        let p = &self.engine.partitions[w.partition];
        let (_, pl) = p.limits.read();
        let budget = pl[TOKEN_BUDGET];
        if budget != 0 && w.tokens > budget {
            // It could never start: more tokens than the whole budget.
            return self.refuse(w, Reason::TokenBudgetReached);
        }
        if p.hot.pending.load(Ordering::SeqCst) >= pl[PENDING_LIMIT] {
            return self.refuse(w, Reason::PendingLimitReached);
        }
        let now = self.now;
        let left = w.deadline.saturating_duration_since(now);
        let oldest = self.oldest[w.partition].first().map(|(t, _)| now - *t);
        if left.is_zero() || oldest.is_some_and(|age| age > left) {
            return self.refuse(w, Reason::DeadlineUnmeetable);
        }
        self.oldest[w.partition].insert((w.enqueued, w.ticket));
        p.hot.pending.fetch_add(1, Ordering::SeqCst);
        // Counted before the start rule judges it again (module docs, "The hand-off").
        self.engine.queued.fetch_add(1, Ordering::SeqCst);
        crate::sync::loom_sc_fence();
        super::engine::bump(&p.hot.counters.queued);
        true
    }

    fn left_queue(&mut self, w: &Waiter, why: Option<Leave>) {
        let p = &self.engine.partitions[w.partition];
        self.oldest[w.partition].remove(&(w.enqueued, w.ticket));
        p.hot.pending.fetch_sub(1, Ordering::SeqCst);
        self.engine.queued.fetch_sub(1, Ordering::SeqCst);
        if why == Some(Leave::TimedOut) {
            super::engine::bump(&p.hot.counters.timed_out);
        }
    }
}

/// Removes the waiters whose deadline passed at `now` (before the start rule runs).
fn expire(t: &mut Txn<'_, Pending>, now: Instant) {
    t.state().now = now;
    t.remove_where(|_, w| w.deadline <= now, Leave::TimedOut);
}

/// How a newcomer entered.
enum Entry<'p> {
    /// Decided at once (admitted, or refused with its partition's overflow action).
    Done(PoolOutcome<'p>),
    /// Waits: its id, its record, the route so far.
    Queued(WaiterId, Waiter, Route),
}

impl Pools {
    /// Runs the start rule if anyone waits (module docs, "The hand-off"): after every
    /// release, every undone decision and every change of limits.
    #[inline]
    pub(crate) fn kick(&self) {
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_POOLS_NO_HANDOFF") {
            // Broken on purpose: a release starts nobody (`loom-tests/tests/pools_queue.rs`
            // finds a waiter left queued with its units free).
            return;
        }
        // The release's SeqCst RMWs, then this load (loom needs the fence to see the total
        // order: `sync::loom_sc_fence`).
        crate::sync::loom_sc_fence();
        if self.engine.queued.load(Ordering::SeqCst) != 0 {
            self.kick_slow();
        }
    }

    /// A newcomer's decision outside the queue (`try_admit`, `admit`, each attempt of a
    /// route): lock-free, unless its units may be what queued waiters wait for; then it
    /// decides behind them (module docs, "Fairness").
    #[inline]
    pub(crate) fn decide_newcomer(
        &self,
        pi: usize,
        priority: Priority,
        tokens: u64,
    ) -> Result<Granted, Refused> {
        match self.engine.decide::<true, true>(pi, priority, tokens) {
            Err(r) if r.behind => self.decide_behind_waiters(pi, priority, tokens),
            d => d,
        }
    }

    /// Under the queue's mutex: the eligible waiters start first (oldest first), then the
    /// newcomer is decided on what they leave.
    #[cold]
    fn decide_behind_waiters(
        &self,
        pi: usize,
        priority: Priority,
        tokens: u64,
    ) -> Result<Granted, Refused> {
        let now = self.engine.now();
        self.queue.transaction(|t| {
            expire(t, now);
            t.start_eligible();
            self.engine.decide::<true, false>(pi, priority, tokens)
        })
    }

    #[cold]
    fn kick_slow(&self) {
        let now = self.engine.now();
        self.queue.transaction(|t| expire(t, now));
    }

    /// Gives back an admission's units, then hands them to the waiters (module docs).
    #[inline]
    pub(crate) fn release(&self, pi: usize, tokens: u64, retry: bool) {
        self.engine.release(pi, tokens, retry);
        crate::sync::pause(crate::sync::PausePoint::PoolsReleased);
        self.kick();
    }

    /// As [`admit`](Self::admit), and a partition whose class overflow is
    /// [`Overflow::Wait`] lets the request wait in its pending queue, blocking this thread,
    /// until it starts (a release frees what it needs), its queue age or `deadline` passes,
    /// or it is refused at entry (queue full, deadline unmeetable). Other overflow actions
    /// apply as in `admit`. One decision event per decision: a [`Decision::Queue`], then a
    /// dispatch or a rejection.
    ///
    /// # Cancel safety
    ///
    /// Blocking; it returns only with an outcome, which is the caller's.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut config = PoolsConfig::single("p", "c", 1);
    /// config.classes.get_mut("c").unwrap().overflow = Overflow::Wait;
    /// let part = config.partitions.get_mut("p-c").unwrap();
    /// (part.pending_limit, part.queue_max_age_ms) = (1, 60_000);
    /// let pools = Pools::new(&config)?;
    /// let id = pools.partition("p-c")?;
    /// let held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    /// std::thread::scope(|s| {
    ///     let waiter = s.spawn(|| pools.admit_blocking(&PoolRequest::new(2, id), None));
    ///     while pools.stats().partitions[0].pending == 0 { std::thread::yield_now(); }
    ///     // The queue is full: a third request is refused at entry.
    ///     let third = pools.admit_blocking(&PoolRequest::new(3, id), None);
    ///     assert_eq!(third.route().decisions()[0].reason, Reason::PendingLimitReached);
    ///     held.complete(None); // the release starts the waiter
    ///     let started = waiter.join().unwrap();
    ///     let d = started.route().decisions();
    ///     assert_eq!((d[0].decision, d[1].decision), (Decision::Queue, Decision::Dispatch));
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_blocking(&self, req: &PoolRequest, deadline: Option<Instant>) -> PoolOutcome<'_> {
        match self.enter(req, deadline) {
            Entry::Done(out) => out,
            Entry::Queued(id, w, route) => {
                // On an injected clock the deadline is that clock's: releases, entries and
                // `expire_waiters` end the wait (module docs, "Age and deadlines").
                let own = self.engine.clock.is_none().then_some(w.deadline);
                let out = self.queue.wait_blocking(id, own);
                self.waited(req, w, out, route)
            }
        }
    }

    /// As [`admit_blocking`](Self::admit_blocking), waiting asynchronously (any executor;
    /// deadlines on the crate's timer thread).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes leaves the queue: a waiter still queued is
    /// removed; one that was started meanwhile gives its units back, and the start rule
    /// passes them on to the next waiter. Nothing leaks.
    ///
    /// ```
    /// use llm_bulkhead::pools::*;
    /// let mut config = PoolsConfig::single("p", "c", 1);
    /// config.classes.get_mut("c").unwrap().overflow = Overflow::Wait;
    /// let part = config.partitions.get_mut("p-c").unwrap();
    /// (part.pending_limit, part.queue_max_age_ms) = (4, 60_000);
    /// let pools = Pools::new(&config)?;
    /// let id = pools.partition("p-c")?;
    /// let held = pools.admit(&PoolRequest::new(1, id)).into_permit().unwrap();
    /// let mut wait = Box::pin(pools.admit_async(PoolRequest::new(2, id), None));
    /// let waker = std::task::Waker::noop();
    /// let mut cx = std::task::Context::from_waker(&waker);
    /// assert!(wait.as_mut().poll(&mut cx).is_pending());
    /// assert_eq!(pools.stats().partitions[0].pending, 1);
    /// drop(wait); // cancelled: it leaves the queue
    /// assert_eq!(pools.stats().partitions[0].pending, 0);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_async(
        &self,
        req: PoolRequest,
        deadline: Option<Instant>,
    ) -> impl Future<Output = PoolOutcome<'_>> + Send + '_ {
        let entry = self.enter(&req, deadline);
        async move {
            match entry {
                Entry::Done(out) => out,
                Entry::Queued(id, w, route) => {
                    let out = Deadline {
                        wait: WaitFuture::new(&self.queue, id),
                        pools: self,
                        id,
                        at: w.deadline,
                        timer: None,
                        req,
                        route,
                        done: false,
                    }
                    .await;
                    self.waited(&req, w, out, route)
                }
            }
        }
    }

    /// A newcomer: decided at once, or queued (module docs).
    fn enter(&self, req: &PoolRequest, deadline: Option<Instant>) -> Entry<'_> {
        let e = &self.engine;
        let pi = req.partition.index();
        let p = &e.partitions[pi];
        if p.overflow != Overflow::Wait {
            return Entry::Done(self.admit(req));
        }
        let mut route = Route::new();
        // Nobody waits here: decide without the lock.
        if p.hot.pending.load(Ordering::SeqCst) == 0 {
            // Refused, or behind waiters (the transaction below starts them first): the
            // queue judges it.
            if let Ok(g) = e.decide::<true, true>(pi, req.priority, req.tokens) {
                return Entry::Done(self.dispatched(req, req.partition, g, route, None));
            }
        }
        let now = e.now();
        let (_, pl) = p.limits.read();
        let by_age = now + Duration::from_millis(pl[MAX_AGE_MS]);
        let (deadline, by_age) = match deadline {
            Some(d) if d < by_age => (d, false),
            _ => (by_age, true),
        };
        let submitted = self.queue.transaction(|t| {
            expire(t, now);
            // A release may have given units back and not handed them on yet: the waiters
            // get them before this newcomer is judged (module docs, "Fairness").
            t.start_eligible();
            let s = t.state();
            s.tickets += 1;
            let w = Waiter {
                partition: pi,
                priority: req.priority,
                tokens: req.tokens,
                enqueued: now,
                deadline,
                by_age,
                ticket: s.tickets,
            };
            let out = t.submit(w);
            let s = t.state();
            (out, w, s.last, s.last_version)
        });
        match submitted {
            (Ok(Submitted::Started((_, g))), ..) => {
                Entry::Done(self.dispatched(req, req.partition, g, route, None))
            }
            (Ok(Submitted::Queued(id)), w, reason, version) => {
                let at = req.partition;
                self.record(&mut route, req, at, Decision::Queue, reason, None, version);
                Entry::Queued(id, w, route)
            }
            (Err(_), _, reason, _) => {
                let version = p.limits.read().0 / 2;
                let at = req.partition;
                self.record(&mut route, req, at, Decision::Reject, reason, None, version);
                Entry::Done(PoolOutcome::Rejected { route })
            }
        }
    }

    /// The end of a wait: a start, or a refusal with the reason of the deadline that passed.
    fn waited(
        &self,
        req: &PoolRequest,
        w: Waiter,
        out: Waited<(usize, Granted)>,
        mut route: Route,
    ) -> PoolOutcome<'_> {
        match out {
            Waited::Started((_, g)) => self.dispatched(req, req.partition, g, route, None),
            Waited::Left(why) => {
                let reason = match (why, w.by_age) {
                    (Leave::TimedOut, true) => Reason::QueueAgeExceeded,
                    _ => Reason::DeadlineExceeded,
                };
                let at = PartitionId(w.partition as u32);
                let version = self.engine.partitions[w.partition].limits.read().0 / 2;
                self.record(&mut route, req, at, Decision::Reject, reason, None, version);
                PoolOutcome::Rejected { route }
            }
        }
    }
}

/// A queued waiter's future with its deadline: at the deadline it leaves the queue (a start
/// that raced with it is given back once, by `MultiWait::cancel`, and passed on). Its
/// deadline is read on the pools' clock; on the default clock a timer wakes it then, on an
/// injected one the pools' own operations do (`expire_waiters`).
struct Deadline<'p> {
    wait: WaitFuture<Pending, &'p MultiWait<Pending>>,
    pools: &'p Pools,
    id: WaiterId,
    at: Instant,
    timer: Option<u64>,
    /// The request and its route so far, for the events of a start it never collects.
    req: PoolRequest,
    route: Route,
    done: bool,
}

impl Future for Deadline<'_> {
    type Output = Waited<(usize, Granted)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Poll::Ready(out) = Pin::new(&mut this.wait).poll(cx) {
            this.done = true;
            return Poll::Ready(out);
        }
        let queue = &this.pools.queue;
        crate::sync::pause(crate::sync::PausePoint::PoolsWaiterDeadline);
        if this.pools.engine.now() >= this.at {
            // Its outcome becomes `Left(TimedOut)`; the future below collects it. A start
            // that came meanwhile is given back here, once, and passed on.
            queue.cancel(this.id, Leave::TimedOut);
            let out = Pin::new(&mut this.wait).poll(cx);
            this.done = out.is_ready();
            return out;
        }
        if this.pools.engine.clock.is_some() {
            // The injected clock's deadline: `expire_waiters` and releases end the wait.
            return Poll::Pending;
        }
        match this.timer {
            Some(t) => crate::wait::timer::update(t, cx.waker()),
            None => this.timer = Some(crate::wait::timer::register(this.at, cx.waker().clone())),
        }
        Poll::Pending
    }
}

impl Drop for Deadline<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            crate::wait::timer::cancel(t);
        }
        if self.done {
            return;
        }
        // Dropped before its outcome was collected. Still queued: it leaves (its queue
        // decision was its last event). Started meanwhile: the start was a decision, so it
        // gets its dispatch event, and its completion (cancelled) gives the units back.
        let (id, pools) = (self.id, self.pools);
        let out = pools
            .queue
            .transaction(|t| t.withdraw(id, Leave::Cancelled));
        if let Some(Waited::Started((_, g))) = out {
            let (req, at) = (&self.req, self.req.partition);
            let started = pools.dispatched(req, at, g, self.route, None);
            if let Some(permit) = started.into_permit() {
                permit.complete(Some(super::FailureClass::Cancelled));
            }
        }
    }
}
