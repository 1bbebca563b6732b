//! Waiting for a slot: blocking and async acquire, hand-off, cancellation and timeouts
//! (CONTRACT.md §2 rows 6–7, §3 and §7).
//!
//! # Protocol
//!
//! * **Enter.** A demand first makes the ordinary fast decision. Only when that says "no free
//!   slot" and queueing is possible (`max_concurrent > 0`, `max_queue > 0`) does it take the
//!   queue mutex and decide again under it: a slot freed meanwhile is taken; budget refusals
//!   stay fail-fast (a request that does not fit is never queued) unless the bulkhead waits
//!   for tokens (`crate::protocol::token_wait`, opt-in); a full queue gives
//!   `queue_limit`; otherwise one CAS on the state word sets `WAITERS` (or re-validates it)
//!   while the word still shows every slot taken, and the node joins the tail.
//! * **Hand-off.** A release whose CAS finds `WAITERS` set (and the queue-length mirror
//!   non-zero) keeps its slot, counts a `SlowPathRef` while the slot still makes it an owner
//!   (the guard, not the slot, keeps the shared state alive until its unlock: the slot is given
//!   away midway, see `crate::shared`, "Slow paths"), takes the mutex and performs the head
//!   waiter's whole decision with
//!   that slot against the limits current at that moment: the budget check with the waiter's
//!   reservation in place of the leaver's hold, in the same CAS that moves the tokens. A head
//!   that no longer fits is answered with its reason and the next waiter is considered
//!   (CONTRACT.md §3, §9.4). If `max_concurrent` was lowered below the slots in use, the slot is
//!   returned instead (shrink by attrition) and the waiters keep waiting. Whoever empties the
//!   queue clears `WAITERS` in the same CAS.
//! * **No lost wake-up.** `WAITERS` changes only under the mutex. Either the release's CAS comes
//!   first in the word's modification order (then the enqueuer's CAS sees the free slot and
//!   takes it) or the enqueuer's comes first (then the release's CAS fails, it sees the flag and
//!   hands off).
//! * **Leaving.** A waiter that times out or is cancelled takes the mutex: if it was answered
//!   meanwhile it takes the answer (a granted slot is then its admission, or, for a dropped
//!   future, released at once, which hands it to the next waiter); otherwise it unlinks itself.
//!   Nothing leaks: a waiter holds nothing while it waits.
//! * **Close** answers every waiter with `shutdown` under the mutex and clears `WAITERS`.
//!   Wake-ups are collected under the mutex and delivered after it, in batches of
//!   [`WAKE_BATCH`](crate::wait::list::WAKE_BATCH) (32): a long loop unlocks, wakes and locks again.
//! * **Drain.** A drainer raises `WAITERS` too, so that the release that leaves the bulkhead
//!   idle wakes it. While only drainers wait, the flag must not make the decision path a
//!   locked one: `Shared::queued` mirrors the queue's length (stored under the mutex at every
//!   unlock, and by an enqueuer *before* its queueing CAS). A decider that sees the flag with a
//!   free slot reads the mirror after the word and admits with a CAS if it is zero
//!   (`crate::protocol::plain::admit_if_nobody_waits`); a release
//!   that sees the flag and a zero mirror returns its slot with a CAS and then reads the
//!   mirror again (the enqueuer writes the mirror then CASes the word, the release CASes the
//!   word then reads the mirror: `SeqCst` on both sides, so one of them sees the other), and
//!   locks only if a waiter queued meanwhile (it pumps: the free slot goes to the head) or the
//!   bulkhead is now idle (it wakes the drainers).
//! * **Unwinding.** Every deadline is computed with checked arithmetic before anything can
//!   unwind (a timeout too large to add to now is no deadline), and a blocked waiter's linked
//!   node is guarded: an unwind leaves the queue (and releases a slot granted meanwhile)
//!   before the frame goes.
//! * **A raised limit** (`apply_limits`) pumps: under the mutex, new slots go to head waiters
//!   while `slots < max_concurrent`.
//!
//! Blocked threads park (`std::thread::park`, a futex wait on Linux) and are unparked with an
//! owned `Thread` handle, so a granter never touches a node after answering it (see
//! `crate::wait::list`). Timeouts of blocking waiters are timed parks against a deadline; async
//! waiters are woken through their `Waker`, which is cloned before the queue lock is taken and
//! dropped (when a re-poll replaces it) after it is released: nothing of the user's runs under
//! the lock (`crate::wait::list`, "Where wake-ups run").
//!
//! # With admission classes
//!
//! The queue is the same single FIFO (CONTRACT.md §3: no per-class queues); only the word
//! protocol differs, because a class release changes its class word, not the shared word
//! (`crate::protocol::classed`).
//!
//! * **Flags.** While waiters are queued, `WAITERS` is up on the shared word (newcomers see it
//!   and do not barge, except an in-floor newcomer of a class with none queued, which bypasses:
//!   `crate::protocol::classed`, "Bypass"), and `C_QUEUE` is up on **every class word**; while
//!   only drainers wait, only `C_QUEUE`. Both change only under the queue mutex, `C_QUEUE`
//!   first when raised. So does `Shared::queued_classes`, the bypass's mask of classes with a
//!   waiter queued: an enqueuer raises its class's bit before it decides or joins the tail,
//!   every unlock stores the exact mask.
//! * **Visiting the queue.** Every decrease (release, abandonment, token return, a decider's
//!   undo, a borrower's returned reservation, a migration) whose class-word CAS replaced a word
//!   carrying `C_QUEUE`, or whose shared-word `fetch_sub` replaced a word carrying `WAITERS`,
//!   pumps the queue afterwards. A release keeps the state alive meanwhile with its
//!   grace-period operation, which a class-mode free waits for (`crate::protocol::classed`,
//!   "Lifetime").
//! * **The pump** decides the head under the mutex with the full class protocol, `WAITERS`
//!   excepted: admitted → granted (with its attribution); no free global slot → it stays;
//!   checks 1–5 fail while a slot is free → answered with that reason and constraint, and the
//!   next is considered. A refusal the collects never confirmed (another decider's step in
//!   flight) leaves the head queued: that step's own undo or completion visits the queue again.
//!   A pump run by a decrease is inside the decrease's grace-period operation: it wakes
//!   nobody there, the decreasing thread delivers its wake-ups after the operation (a release
//!   after its last step, `crate::wait::list::deliver_deferred`).
//! * **No lost wake-up.** An enqueuer raises the flags (RMWs on every class word and the
//!   shared word) and then decides; a decrease is an RMW on one of those words. Whichever comes
//!   first in that word's modification order, either the enqueuer's decision sees the decrease
//!   or the decrease sees the flag and pumps after the enqueuer has released the mutex.
//! * **Drain** raises only `C_QUEUE`, so class releases visit the queue and wake drainers once
//!   nothing is held, with no polling and nothing paid on the fast path when nobody drains.

use crate::handle::admission::Admission;
use crate::handle::bulkhead::{Bulkhead, Granted};
use crate::protocol::class_pump::{
    may_wait, pump_classed_locked, set_class_flags, sync_class_flags, wake_class_drainers_if_idle,
};
use crate::protocol::classed::Precheck;
use crate::protocol::handoff::{clear_waiters, pending, pump_locked, wake_drainers_if_idle};
use crate::protocol::plain::QueueStep;
use crate::protocol::token_wait::fits_when_idle;
use crate::sync::Ordering;
use crate::vocab::demand::{Demand, Priority, Reservation};
use crate::vocab::rejection::{RejectReason, Rejection};
use crate::wait::list::{Notify, Outcome, Waiter, WakeList};
use crate::words::state::{Word, WAITERS};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

mod classed;
mod drain;
mod fast;
mod future;
use crate::wait::cancel::CancelToken;
pub use drain::{Drain, DrainReport};
use fast::may_queue;
pub use future::{Acquire, AcquireTimed};

/// A result with the timing of the decision that produced it (see
/// [`Bulkhead::acquire_blocking_timed`]).
///
/// ```
/// use llm_bulkhead::{Timed, Timing};
/// let t = Timed { value: 1, timing: Timing::default() };
/// assert_eq!((t.value, t.timing.queue_wait_ns), (1, 0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed<T> {
    /// The admission or the rejection.
    pub value: T,
    /// How long the decision took.
    pub timing: Timing,
}

use crate::record::events::nanos;
pub use crate::record::events::Timing;

/// How long a waiting acquire may stay queued.
///
/// ```
/// use llm_bulkhead::QueueTimeout;
/// use std::time::Duration;
/// let default = Some(Duration::from_secs(30));
/// assert_eq!(QueueTimeout::Default.resolve(default), default);
/// assert_eq!(QueueTimeout::After(Duration::ZERO).resolve(default), Some(Duration::ZERO));
/// assert_eq!(QueueTimeout::Unbounded.resolve(default), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QueueTimeout {
    /// The bulkhead's default ([`BulkheadBuilder::queue_timeout`](crate::BulkheadBuilder::queue_timeout)
    /// or its profile's; no deadline if it has none).
    #[default]
    Default,
    /// Give up with `timeout` after this long in the queue. A duration too large to add to the
    /// current instant (`Duration::MAX`, say) means no deadline.
    After(Duration),
    /// No deadline, whatever the bulkhead's default: the demand waits until it is answered or
    /// cancelled.
    Unbounded,
}

impl QueueTimeout {
    /// The wait's limit given the bulkhead's default (`None`: no deadline).
    ///
    /// ```
    /// # use llm_bulkhead::QueueTimeout;
    /// assert_eq!(QueueTimeout::Default.resolve(None), None);
    /// ```
    #[must_use]
    pub fn resolve(self, default: Option<Duration>) -> Option<Duration> {
        match self {
            QueueTimeout::Default => default,
            QueueTimeout::After(d) => Some(d),
            QueueTimeout::Unbounded => None,
        }
    }
}

/// Options of a waiting acquire: how long it may stay queued ([`QueueTimeout`]) and what
/// cancels it. Build them with the methods, or with a literal and `..Default::default()`
/// (fields may be added; the default of a new field keeps today's behaviour).
///
/// ```
/// use llm_bulkhead::{CancelToken, QueueTimeout, WaitOptions};
/// use std::time::Duration;
/// let o = WaitOptions::new().timeout(Duration::from_millis(250)).cancel(CancelToken::new());
/// assert_eq!(o.timeout, QueueTimeout::After(Duration::from_millis(250)));
/// assert_eq!(WaitOptions::new().no_timeout().timeout, QueueTimeout::Unbounded);
/// assert_eq!(WaitOptions::default().timeout, QueueTimeout::Default);
/// ```
#[derive(Clone, Debug, Default)]
pub struct WaitOptions {
    /// How long the demand may stay queued (default: the bulkhead's default).
    pub timeout: QueueTimeout,
    /// Cancels the wait (`aborted`); a token already cancelled refuses at once.
    pub cancel: Option<CancelToken>,
}

impl WaitOptions {
    /// The defaults: the bulkhead's queue timeout, no cancellation.
    ///
    /// ```
    /// # use llm_bulkhead::WaitOptions;
    /// assert!(WaitOptions::new().cancel.is_none());
    /// ```
    #[must_use]
    pub fn new() -> WaitOptions {
        WaitOptions::default()
    }

    /// Give up with `timeout` after `timeout` in the queue ([`QueueTimeout::After`]).
    ///
    /// ```
    /// # use llm_bulkhead::{QueueTimeout, WaitOptions};
    /// # use std::time::Duration;
    /// assert_eq!(WaitOptions::new().timeout(Duration::ZERO).timeout, QueueTimeout::After(Duration::ZERO));
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> WaitOptions {
        self.timeout = QueueTimeout::After(timeout);
        self
    }

    /// Wait without a deadline, whatever the bulkhead's default ([`QueueTimeout::Unbounded`]).
    ///
    /// ```
    /// # use llm_bulkhead::{QueueTimeout, WaitOptions};
    /// assert_eq!(WaitOptions::new().no_timeout().timeout, QueueTimeout::Unbounded);
    /// ```
    #[must_use]
    pub fn no_timeout(mut self) -> WaitOptions {
        self.timeout = QueueTimeout::Unbounded;
        self
    }

    /// Cancelled by `token` (`aborted`).
    ///
    /// ```
    /// # use llm_bulkhead::{CancelToken, WaitOptions};
    /// assert!(WaitOptions::new().cancel(CancelToken::new()).cancel.is_some());
    /// ```
    #[must_use]
    pub fn cancel(mut self, token: CancelToken) -> WaitOptions {
        self.cancel = Some(token);
        self
    }
}

/// The deadline `timeout` from now: `None` (no deadline) without a timeout, or when the
/// timeout is too large to add to the current instant (`Duration::MAX`, say). Never panics:
/// every waiting call computes its deadline with this, so nothing a caller passes can unwind
/// out of a frame whose node is queued.
fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// A blocked waiter's node while it is linked: if the frame unwinds before the wait ends
/// (`armed`), its drop leaves the queue, and releases at once a slot granted meanwhile, so the
/// queue never keeps a pointer into a dead stack frame and no slot leaks.
struct Linked<'a> {
    bulkhead: &'a Bulkhead,
    node: Pin<&'a Waiter>,
    demand: &'a Demand,
    reservation: Option<Reservation>,
    armed: bool,
}

impl Drop for Linked<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let b = self.bulkhead;
        let outcome = b.leave(self.node, RejectReason::Aborted);
        if let Outcome::Granted { .. } = outcome {
            drop(b.finish(outcome, self.demand, self.node.priority, self.reservation));
        }
    }
}

/// How entering the queue ended.
pub(crate) enum Enter {
    Granted(Granted),
    Refused(Rejection),
    Queued,
}

impl Bulkhead {
    /// Admits `demand`, waiting in the FIFO queue (on this thread) if no slot is free and the
    /// queue has room. Budget and class refusals are fail-fast: a demand that does not fit is
    /// never queued.
    ///
    /// # Errors
    /// A [`Rejection`]: `shutdown`, `budget_limit`, `concurrency_limit` (no queue, or
    /// `max_concurrent` 0), `queue_limit`, `timeout` (after `options.timeout` in the queue),
    /// `aborted` (the token was or became cancelled), or the reason a hand-off's checks failed.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason, WaitOptions};
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(4).build().unwrap();
    /// let held = b.acquire_blocking(Demand::slot(), WaitOptions::default()).unwrap();
    /// let b2 = b.clone();
    /// let waiter = std::thread::spawn(move || b2.acquire_blocking(Demand::slot(), WaitOptions::default()).map(|a| a.revision()));
    /// while b.stats().pending == 0 { std::thread::yield_now() } // the waiter is queued
    /// drop(held); // hands the slot to the waiter
    /// assert_eq!(waiter.join().unwrap(), Ok(0));
    /// let zero = WaitOptions::new().timeout(Duration::ZERO);
    /// let _again = b.acquire_blocking(Demand::slot(), WaitOptions::default()).unwrap();
    /// assert_eq!(b.acquire_blocking(Demand::slot(), zero).unwrap_err().reason, RejectReason::Timeout);
    /// ```
    pub fn acquire_blocking(
        &self,
        demand: Demand,
        options: WaitOptions,
    ) -> Result<Admission, Rejection> {
        self.acquire_blocking_inner(demand, options, None)
    }

    /// [`acquire_blocking`](Self::acquire_blocking), also reporting how long the decision
    /// took and how long of that was spent in the queue. The clocks are read only for this
    /// call; `acquire_blocking` reads none on its fast path.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Self::acquire_blocking), inside [`Timed::value`].
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
    /// let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// let t = b.acquire_blocking_timed(Demand::slot(), WaitOptions::default());
    /// assert!(t.value.is_ok());
    /// assert_eq!(t.timing.queue_wait_ns, 0); // a free slot: no queue
    /// ```
    #[must_use = "dropping the result releases an admission at once"]
    pub fn acquire_blocking_timed(
        &self,
        demand: Demand,
        options: WaitOptions,
    ) -> Timed<Result<Admission, Rejection>> {
        let start = Instant::now();
        let mut queued = None;
        let value = self.acquire_blocking_inner(demand, options, Some(&mut queued));
        let total = start.elapsed();
        let wait = queued.unwrap_or_default();
        Timed {
            value,
            timing: Timing {
                decision_ns: nanos(total.saturating_sub(wait)),
                queue_wait_ns: nanos(wait),
            },
        }
    }

    /// [`try_acquire`](Self::try_acquire), also reporting how long the decision took (the
    /// clock is read only for this call; `try_acquire` reads none).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), inside [`Timed::value`].
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// let b = Bulkhead::new(1).unwrap();
    /// let t = b.try_acquire_timed(Demand::slot());
    /// assert!(t.value.is_ok());
    /// assert_eq!(t.timing.queue_wait_ns, 0); // try_acquire never queues
    /// ```
    #[must_use = "dropping the result releases an admission at once"]
    pub fn try_acquire_timed(&self, demand: Demand) -> Timed<Result<Admission, Rejection>> {
        let start = Instant::now();
        let value = self.try_acquire(demand);
        Timed {
            value,
            timing: Timing {
                decision_ns: nanos(start.elapsed()),
                queue_wait_ns: 0,
            },
        }
    }

    /// [`acquire`](Self::acquire), also reporting how long the decision took and how long of
    /// that was spent in the queue (clocks read only for this call). The decision starts at
    /// the first poll.
    ///
    /// # Panics
    /// If the process-wide deadline timer thread (started by the first wait with a deadline)
    /// cannot be spawned, because the OS refuses a thread: a resource failure, not bad input.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): dropping the future removes its waiter; a slot granted
    /// meanwhile passes on.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), inside [`Timed::value`].
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(1).build().unwrap();
    /// let t = futures_lite::future::block_on(b.acquire_timed(Demand::slot(), WaitOptions::default()));
    /// assert!(t.value.is_ok());
    /// assert_eq!(t.timing.queue_wait_ns, 0); // a free slot: no queue
    /// ```
    pub fn acquire_timed(&self, demand: Demand, options: WaitOptions) -> AcquireTimed<'_> {
        let mut inner = self.acquire(demand, options);
        inner.timed = true;
        AcquireTimed { inner, start: None }
    }

    /// [`acquire_blocking`](Self::acquire_blocking), also telling `queued` (when given)
    /// whether the demand waited in the queue: how the LLM layer's timed runs split their
    /// decision from their queue wait on their own clock (its one user, hence the feature).
    #[cfg(feature = "llm")]
    pub(crate) fn acquire_blocking_noting(
        &self,
        demand: Demand,
        options: WaitOptions,
        queued: Option<&mut bool>,
    ) -> Result<Admission, Rejection> {
        let Some(queued) = queued else {
            return self.acquire_blocking_inner(demand, options, None);
        };
        let mut wait = None;
        let out = self.acquire_blocking_inner(demand, options, Some(&mut wait));
        *queued = wait.is_some();
        out
    }

    /// The body of `acquire_blocking`; with `timing`, the time spent queued is written there.
    fn acquire_blocking_inner(
        &self,
        demand: Demand,
        options: WaitOptions,
        timing: Option<&mut Option<Duration>>,
    ) -> Result<Admission, Rejection> {
        let shared = &*self.shared;
        // Decision timing for the events, when a subscriber asked for it.
        let timing_scope = shared.events.time_decision();
        if options
            .cancel
            .as_ref()
            .is_some_and(CancelToken::is_cancelled)
        {
            return Err(self.waiter_refusal(RejectReason::Aborted, &demand));
        }
        // The fast decision first (`try_acquire`'s): the node is built only if it must wait.
        if let Some(answer) = self.decide_or_wait(&demand) {
            return answer;
        }
        let (r, k, priority, reservation) = self.demand_parts(&demand);
        let timeout = options.timeout.resolve(shared.default_timeout);
        let node = Waiter::new(
            r,
            k,
            priority,
            Notify::Thread(crate::sync::thread::current()),
        );
        // SAFETY: `node` stays on this stack frame, unmoved, until it is answered or has
        // unlinked itself: every path below ends in one of the two before returning, and an
        // unwind does too (`linked` below is dropped before `node`).
        let node = unsafe { Pin::new_unchecked(&node) };
        match self.enter_after_fast(k, r, priority, || node) {
            Enter::Granted(g) => return Ok(self.admission_from(g, priority, reservation)),
            Enter::Refused(rej) => return Err(rej),
            Enter::Queued => {}
        }
        // From here until the wait ends the node is linked: an unwind leaves the queue.
        let mut linked = Linked {
            bulkhead: self,
            node,
            demand: &demand,
            reservation,
            armed: true,
        };
        let since = if timing.is_some() || timing_scope.is_on() {
            Some(Instant::now())
        } else {
            wait_started(self)
        };
        let deadline = deadline_after(timeout);
        if let Some(token) = &options.cancel {
            token.register(crate::sync::thread::current());
        }
        let outcome = loop {
            if node.is_done() {
                // SAFETY: `is_done` returned true on this thread.
                break unsafe { node.outcome() };
            }
            if options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled)
            {
                break self.leave(node, RejectReason::Aborted);
            }
            match deadline {
                None => crate::sync::thread::park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break self.leave(node, RejectReason::Timeout);
                    }
                    crate::sync::thread::park_timeout(d - now);
                }
            }
        };
        linked.armed = false;
        if let Some(token) = &options.cancel {
            token.unregister_current();
        }
        if let Some(since) = since {
            let wait = since.elapsed();
            timing_scope.queued(wait);
            if let Some(t) = timing {
                *t = Some(wait);
            }
        }
        book_wait(self, since);
        self.finish(outcome, &demand, priority, reservation)
    }

    /// Admits `demand`, waiting in the FIFO queue if no slot is free: the async counterpart of
    /// [`acquire_blocking`](Self::acquire_blocking). The future works on any executor; its
    /// timeout runs on the crate's own timer thread (started on first use, see
    /// `src/wait/timer.rs`), so it needs no runtime either.
    ///
    /// # Panics
    /// If the process-wide deadline timer thread (started by the first wait with a deadline)
    /// cannot be spawned, because the OS refuses a thread: a resource failure, not bad input.
    ///
    /// # Cancel safety
    /// Dropping the future removes its waiter from the queue; if it was dropped after being
    /// handed a slot, that slot passes on to the next waiter. Nothing leaks either way.
    ///
    /// # Errors
    /// As [`acquire_blocking`](Self::acquire_blocking).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(1).build().unwrap();
    /// let a = futures_lite::future::block_on(b.acquire(Demand::slot(), WaitOptions::default())).unwrap();
    /// assert_eq!(a.revision(), 0);
    /// ```
    // Inlined: the future is then written in place (it is moved once more by `.await`).
    #[inline(always)]
    pub fn acquire(&self, demand: Demand, options: WaitOptions) -> Acquire<'_> {
        Acquire {
            bulkhead: self,
            demand,
            options,
            queued: false,
            finished: false,
            timed: false,
            wait: None,
        }
    }

    /// Tokens, class index (0 without classes; [`UNKNOWN_CLASS`] for a class this bulkhead
    /// does not have, which [`enter`](Self::enter) refuses), priority and reservation of
    /// `demand`.
    pub(super) fn demand_parts(
        &self,
        demand: &Demand,
    ) -> (u64, usize, Priority, Option<Reservation>) {
        let reservation = self
            .shared
            .has_budget
            .then(|| demand.reservation().unwrap_or(Reservation::ZERO));
        let k = if self.shared.classed {
            self.class_index(demand.class()).unwrap_or(UNKNOWN_CLASS)
        } else if demand.class().is_some() {
            UNKNOWN_CLASS
        } else {
            0
        };
        (
            reservation.map_or(0, |x| x.total()),
            k,
            demand.priority(),
            reservation,
        )
    }

    /// The fast decision, then (if it found no free slot and queueing is possible) the decision
    /// under the queue mutex, which takes a slot, refuses, or queues the node `node()` makes
    /// (called under the mutex, only when the demand queues: a demand answered at once never
    /// builds its node; the node carries how to wake its owner, [`Waiter::new`], made before
    /// the lock: `node()` only moves it in).
    pub(super) fn enter<'n>(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
        node: impl FnOnce() -> Pin<&'n Waiter>,
    ) -> Enter {
        let shared = &*self.shared;
        if k == UNKNOWN_CLASS {
            return Enter::Refused(crate::handle::bulkhead::unknown_class());
        }
        if shared.classed {
            return self.enter_classed(k, r, priority, node);
        }
        let f = match self.try_decide(r, priority) {
            Ok(g) => return Enter::Granted(g),
            Err(f) => f,
        };
        if !may_queue(shared, &f, r, priority) {
            return match self.refusal(&f, r, priority) {
                Some(rej) => Enter::Refused(rej),
                None => self.enter(k, r, priority, node),
            };
        }
        self.enter_queue(r, priority, node)
    }

    /// The no-class enqueue, after a fast decision found no free slot (or, under token
    /// waiting, too few tokens) with a queue possible: under the queue mutex, the protocol's
    /// decision (`crate::protocol::plain::decide_queued`) takes a slot freed meanwhile, refuses,
    /// or raises `WAITERS`, and then `node()` is linked at the tail.
    #[inline(never)]
    pub(super) fn enter_queue<'n>(
        &self,
        r: u64,
        priority: Priority,
        node: impl FnOnce() -> Pin<&'n Waiter>,
    ) -> Enter {
        crate::sync::pause(crate::sync::PausePoint::EnterQueue);
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        // The decision is the protocol's (`crate::protocol::plain::decide_queued`); linking the
        // node is ours, under the same lock.
        match crate::protocol::plain::decide_queued(&q, r, priority) {
            QueueStep::Granted(g) => Enter::Granted(g),
            QueueStep::Refused {
                w,
                lim,
                reason,
                pending,
            } => {
                drop(q);
                match self.refusal_of(w, &lim, reason, r, priority) {
                    Some(mut rej) => {
                        rej.set_pending(pending as u64);
                        Enter::Refused(rej)
                    }
                    // The tag moved: decide again from the start.
                    None => self.enter(0, r, priority, node),
                }
            }
            QueueStep::Queue => {
                let node = node();
                // SAFETY: `node` is pinned by the caller and unlinks (or is answered) before it
                // is dropped; we hold the mutex.
                unsafe { q.push_back(&node) };
                Enter::Queued
            }
        }
    }

    /// Leaves the queue (timeout or cancellation): the answer if one came meanwhile, otherwise
    /// `Refused(reason)` after unlinking.
    fn leave(&self, node: Pin<&Waiter>, reason: RejectReason) -> Outcome {
        let shared = &*self.shared;
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        if node.is_done() {
            // SAFETY: `is_done` returned true on this thread.
            return unsafe { node.outcome() };
        }
        // SAFETY: `node` is alive (pinned by the caller) and linked into this bulkhead's
        // queue, whose lock `q` is, or into none.
        unsafe { q.remove(&node) };
        let mut wake = WakeList::new();
        if shared.wait_for_tokens {
            // Token waiting: the waiter behind may fit where this one did not
            // (`crate::protocol::token_wait`): pumped under this lock, which the pump ends as
            // the branches below do (flags, drainers). `self` is a handle: the state stays
            // alive.
            q = if shared.classed {
                pump_classed_locked(&guard, q, &mut wake)
            } else {
                pump_locked(&guard, q, &mut wake)
            };
        } else if shared.classed {
            sync_class_flags(shared, &mut q);
            wake_class_drainers_if_idle(shared, &q, &mut wake);
        } else {
            clear_waiters(shared, &q);
            wake_drainers_if_idle(Word(shared.word.load(Ordering::Acquire)), &q, &mut wake);
        }
        drop(q);
        wake.wake_all();
        Outcome::Refused(reason)
    }

    /// Turns a waiter's outcome into its result.
    fn finish(
        &self,
        outcome: Outcome,
        demand: &Demand,
        priority: Priority,
        reservation: Option<Reservation>,
    ) -> Result<Admission, Rejection> {
        let g = self.finish_granted(outcome, demand, priority, reservation)?;
        Ok(self.admission_from(g, priority, reservation))
    }

    /// A queued [`Acquire`]'s end: books the ended wait (`book_wait`) and turns the outcome
    /// into what builds the admission, or the refusal, as [`finish_granted`](Self::finish_granted).
    /// A no-class grant (the common answer) books the wait and counts the admission in the same
    /// entry of this thread's counters, looked up once.
    #[inline(always)]
    fn finish_wait(
        &self,
        outcome: Outcome,
        since: Option<Instant>,
        demand: &Demand,
        priority: Priority,
        reservation: Option<Reservation>,
    ) -> Result<Granted, Rejection> {
        let c = self
            .shared
            .counters
            .local(crate::record::stats::Counters::new);
        book_wait_in(c, since);
        if let Outcome::Granted { revision, .. } = outcome {
            if !self.shared.classed {
                let r = reservation.map_or(0, |x| x.total());
                return Ok(crate::protocol::plain::count_in(
                    &self.shared,
                    c,
                    revision,
                    r,
                ));
            }
        }
        self.finish_granted(outcome, demand, priority, reservation)
    }

    /// [`finish`](Self::finish) up to the admission: what builds it, or the refusal (for
    /// [`Acquire`], which builds the admission itself, once, in its inlined `poll`).
    fn finish_granted(
        &self,
        outcome: Outcome,
        demand: &Demand,
        priority: Priority,
        reservation: Option<Reservation>,
    ) -> Result<Granted, Rejection> {
        let r = reservation.map_or(0, |x| x.total());
        match outcome {
            Outcome::Granted {
                revision,
                resources,
            } => Ok(if self.shared.classed {
                let k = self
                    .class_index(demand.class())
                    .unwrap_or(self.shared.default_class);
                self.count_class_admission(k, r, revision, resources)
            } else {
                self.count_admission(revision, r)
            }),
            Outcome::Refused(reason) => Err(self.waiter_refusal(reason, demand)),
            Outcome::RefusedAs(reason, constraint) => {
                let k = self
                    .class_index(demand.class())
                    .unwrap_or(self.shared.default_class);
                let mut rej = self.class_answer_refusal(k, reason, constraint, r, priority);
                rej.set_pending(pending(&self.shared) as u64);
                Err(rej)
            }
            Outcome::Pending => unreachable!("a finished waiter has an outcome"),
        }
    }
}

/// The class index of a waiter whose demand names a class this bulkhead does not have: it is
/// refused on entry, before it is queued or anything is counted.
pub(super) const UNKNOWN_CLASS: usize = usize::MAX;

/// When a wait begins: `Some(now)` only if the bulkhead measures queue waits (a clock read
/// costs about a tenth of an async hand-off, so it is opt-in).
fn wait_started(b: &Bulkhead) -> Option<Instant> {
    b.shared.measure_waits.then(Instant::now)
}

/// Books one ended wait (and its duration, if it was measured).
fn book_wait(b: &Bulkhead, since: Option<Instant>) {
    book_wait_in(
        b.shared.counters.local(crate::record::stats::Counters::new),
        since,
    );
}

/// [`book_wait`] into this thread's counters entry `c`.
#[inline(always)]
fn book_wait_in(c: &crate::record::stats::Counters, since: Option<Instant>) {
    c.waits.add(1);
    if let Some(since) = since {
        book_wait_duration(c, since);
    }
}

#[cold]
#[inline(never)]
fn book_wait_duration(c: &crate::record::stats::Counters, since: Instant) {
    let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    c.wait_ns.add(ns);
    c.wait_max_ns.raise(ns);
}
