//! Waiting for a slot: blocking and async acquire, hand-off, cancellation and timeouts
//! (CONTRACT.md §2 rows 6–7, §3 and §7).
//!
//! # Protocol
//!
//! * **Enter.** A demand first makes the ordinary fast decision. Only when that says "no free
//!   slot" and queueing is possible (`max_concurrent > 0`, `max_queue > 0`) does it take the
//!   queue mutex and decide again under it: a slot freed meanwhile is taken; budget refusals
//!   stay fail-fast (a request that does not fit is never queued); a full queue gives
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
//!   [`WAKE_BATCH`](crate::queue::WAKE_BATCH) (32): a long loop unlocks, wakes and locks again.
//! * **Drain.** A drainer raises `WAITERS` too, so that the release that leaves the bulkhead
//!   idle wakes it. While only drainers wait, the flag must not make the decision path a
//!   locked one: `Shared::queued` mirrors the queue's length (stored under the mutex at every
//!   unlock, and by an enqueuer *before* its queueing CAS). A decider that sees the flag with a
//!   free slot reads the mirror after the word and admits with a CAS if it is zero; a release
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
//! [`crate::queue`]). Timeouts of blocking waiters are timed parks against a deadline; async
//! waiters are woken through their `Waker`.
//!
//! # With admission classes
//!
//! The queue is the same single FIFO (CONTRACT.md §3: no per-class queues); only the word
//! protocol differs, because a class release changes its class word, not the shared word
//! (`crate::classed`).
//!
//! * **Flags.** While waiters are queued, `WAITERS` is up on the shared word (newcomers see it
//!   and do not barge), and `C_QUEUE` is up on **every class word**; while only drainers wait,
//!   only `C_QUEUE`. Both change only under the queue mutex, `C_QUEUE` first when raised.
//! * **Visiting the queue.** Every decrease (release, abandonment, token return, a decider's
//!   undo, a borrower's returned reservation, a migration) whose class-word CAS replaced a word
//!   carrying `C_QUEUE`, or whose shared-word `fetch_sub` replaced a word carrying `WAITERS`,
//!   pumps the queue afterwards. A release keeps the state alive meanwhile with a pending-return
//!   mark taken in the same CAS (`crate::classed`, "Lifetime"), so a protected release pays the
//!   mark only while the queue is flagged.
//! * **The pump** decides the head under the mutex with the full class protocol, `WAITERS`
//!   excepted: admitted → granted (with its attribution); no free global slot → it stays;
//!   checks 1–5 fail while a slot is free → answered with that reason and constraint, and the
//!   next is considered. A refusal the collects never confirmed (another decider's step in
//!   flight) leaves the head queued: that step's own undo or completion visits the queue again.
//! * **No lost wake-up.** An enqueuer raises the flags (RMWs on every class word and the
//!   shared word) and then decides; a decrease is an RMW on one of those words. Whichever comes
//!   first in that word's modification order, either the enqueuer's decision sees the decrease
//!   or the decrease sees the flag and pumps after the enqueuer has released the mutex.
//! * **Drain** raises only `C_QUEUE`, so class releases visit the queue and wake drainers once
//!   nothing is held, with no polling and nothing paid on the fast path when nobody drains.

use crate::admission::Admission;
use crate::bulkhead::{Bulkhead, Granted};
use crate::classed::Precheck;
use crate::demand::{Demand, Priority, Reservation};
use crate::queue::{Notify, Outcome, Queue, Waiter, WakeList};
use crate::rejection::{RejectReason, Rejection};
use crate::shared::{Shared, SlotRef, SlowPathRef};
use crate::state::{Word, ONE_SLOT, WAITERS};
use crate::sync::{lock, Arc, AtomicBool, Mutex, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

/// How long a decision took, in nanoseconds: deciding (without the queue), and waiting in the
/// queue (0 if it never queued).
///
/// ```
/// assert_eq!(llm_bulkhead::Timing::default().decision_ns, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Timing {
    /// Time spent deciding, outside the queue.
    pub decision_ns: u64,
    /// Time spent queued.
    pub queue_wait_ns: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Options of a waiting acquire.
///
/// ```
/// use llm_bulkhead::{CancelToken, WaitOptions};
/// use std::time::Duration;
/// let o = WaitOptions { timeout: Some(Duration::from_millis(250)), cancel: Some(CancelToken::new()) };
/// assert!(WaitOptions::default().timeout.is_none());
/// # let _ = o;
/// ```
#[derive(Clone, Debug, Default)]
pub struct WaitOptions {
    /// Give up with `timeout` after this long in the queue (the bulkhead's default timeout
    /// when `None`). A timeout too large to add to the current instant (`Duration::MAX`, say)
    /// means no deadline: the demand waits until it is answered or cancelled.
    pub timeout: Option<Duration>,
    /// Cancels the wait (`aborted`); a token already cancelled refuses at once.
    pub cancel: Option<CancelToken>,
}

/// Cancels waiting acquires from any thread. Cloning shares the token.
///
/// ```
/// use llm_bulkhead::CancelToken;
/// let t = CancelToken::new();
/// assert!(!t.is_cancelled());
/// t.clone().cancel();
/// assert!(t.is_cancelled());
/// ```
///
/// # Memory ordering
/// `cancel` stores the flag with `Release` before waking the waiters registered with the token;
/// a waiter registers, then re-reads the flag with `Acquire` before it sleeps, so a cancel is
/// never missed.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    sleepers: Mutex<Vec<crate::sync::thread::Thread>>,
    /// Async waiters' wakers, by registration id.
    wakers: Mutex<(u64, Vec<(u64, std::task::Waker)>)>,
}

impl CancelToken {
    /// A token that is not cancelled.
    ///
    /// ```
    /// assert!(!llm_bulkhead::CancelToken::new().is_cancelled());
    /// ```
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels: every acquire waiting with this token leaves with `aborted`.
    ///
    /// ```
    /// let t = llm_bulkhead::CancelToken::new();
    /// t.cancel();
    /// t.cancel(); // idempotent
    /// assert!(t.is_cancelled());
    /// ```
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        let sleepers = std::mem::take(&mut *lock(&self.0.sleepers));
        for t in sleepers {
            t.unpark();
        }
        let wakers = std::mem::take(&mut lock(&self.0.wakers).1);
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Whether [`cancel`](Self::cancel) was called.
    ///
    /// ```
    /// assert!(!llm_bulkhead::CancelToken::new().is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    fn register(&self, t: crate::sync::thread::Thread) {
        lock(&self.0.sleepers).push(t);
    }

    /// Registers (or, with `id`, refreshes) an async waiter's waker; returns its id.
    fn register_waker(&self, id: Option<u64>, w: &std::task::Waker) -> u64 {
        let mut g = lock(&self.0.wakers);
        if let Some(id) = id {
            if let Some(e) = g.1.iter_mut().find(|e| e.0 == id) {
                if !e.1.will_wake(w) {
                    e.1 = w.clone();
                }
                return id;
            }
        }
        let id = g.0;
        g.0 += 1;
        g.1.push((id, w.clone()));
        id
    }

    /// Forgets an async waiter's waker (its wait ended).
    fn unregister_waker(&self, id: u64) {
        lock(&self.0.wakers).1.retain(|e| e.0 != id);
    }

    /// A future that completes once [`cancel`](Self::cancel) has been called (at once if it
    /// already was). A cancellation wakes it: async work can `select!` on it.
    ///
    /// # Cancel safety
    /// Dropping it forgets its waker registration; nothing else changes.
    ///
    /// # Memory ordering
    /// As the token's: `cancel` stores the flag before it takes the registered wakers, and the
    /// future registers before it re-reads the flag, so a cancel is never missed.
    ///
    /// ```
    /// use futures_lite::future;
    /// let t = llm_bulkhead::CancelToken::new();
    /// let c = t.clone();
    /// let th = std::thread::spawn(move || c.cancel());
    /// future::block_on(t.cancelled());
    /// assert!(t.is_cancelled());
    /// th.join().unwrap();
    /// ```
    pub fn cancelled(&self) -> Cancelled {
        Cancelled(CancelWake::new(self.clone()))
    }

    /// Forgets the calling thread's registration (its wait ended), so a token reused for many
    /// waits keeps no stale entries.
    fn unregister_current(&self) {
        let me = crate::sync::thread::current().id();
        lock(&self.0.sleepers).retain(|t| t.id() != me);
    }
}

/// An async registration with a [`CancelToken`]: polled, it is ready once the token is
/// cancelled, and otherwise leaves the task's waker with the token; dropped, it forgets the
/// waker. Owned (it holds a clone of the token), so `'static` futures can embed it.
#[derive(Debug)]
pub(crate) struct CancelWake {
    token: CancelToken,
    id: Option<u64>,
}

impl CancelWake {
    pub(crate) fn new(token: CancelToken) -> CancelWake {
        CancelWake { token, id: None }
    }

    /// Ready once cancelled; otherwise registers (or refreshes) `cx`'s waker.
    pub(crate) fn poll_cancelled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.token.is_cancelled() {
            return Poll::Ready(());
        }
        self.id = Some(self.token.register_waker(self.id, cx.waker()));
        // Re-read after registering: `cancel` stores the flag before it takes the wakers.
        if self.token.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for CancelWake {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.token.unregister_waker(id);
        }
    }
}

/// The future of [`CancelToken::cancelled`].
///
/// # Cancel safety
/// Dropping it forgets its waker registration; nothing else changes.
///
/// ```
/// # use futures_lite::future;
/// let t = llm_bulkhead::CancelToken::new();
/// t.cancel();
/// future::block_on(t.cancelled()); // ready at once
/// ```
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Cancelled(CancelWake);

impl Future for Cancelled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_cancelled(cx)
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
    /// let zero = WaitOptions { timeout: Some(Duration::ZERO), ..Default::default() };
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

    /// The body of `acquire_blocking`; with `timing`, the time spent queued is written there.
    fn acquire_blocking_inner(
        &self,
        demand: Demand,
        options: WaitOptions,
        timing: Option<&mut Option<Duration>>,
    ) -> Result<Admission, Rejection> {
        let shared = &*self.shared;
        if options
            .cancel
            .as_ref()
            .is_some_and(CancelToken::is_cancelled)
        {
            return Err(self.waiter_refusal(RejectReason::Aborted, &demand));
        }
        let (r, k, priority, reservation) = self.demand_parts(&demand);
        let timeout = options.timeout.or(shared.default_timeout);
        let node = Waiter::new(r, k, priority);
        // SAFETY: `node` stays on this stack frame, unmoved, until it is answered or has
        // unlinked itself: every path below ends in one of the two before returning, and an
        // unwind does too (`linked` below is dropped before `node`).
        let node = unsafe { Pin::new_unchecked(&node) };
        let notify = || Notify::Thread(crate::sync::thread::current());
        match self.enter(node, notify) {
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
        let since = if timing.is_some() {
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
        if let (Some(t), Some(since)) = (timing, since) {
            *t = Some(since.elapsed());
        }
        book_wait(self, since);
        self.finish(outcome, &demand, priority, reservation)
    }

    /// Admits `demand`, waiting in the FIFO queue if no slot is free: the async counterpart of
    /// [`acquire_blocking`](Self::acquire_blocking). The future works on any executor; its
    /// timeout runs on the crate's own timer thread (started on first use, see
    /// `src/timer.rs`), so it needs no runtime either.
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
    pub fn acquire(&self, demand: Demand, options: WaitOptions) -> Acquire<'_> {
        let (r, k, priority, reservation) = self.demand_parts(&demand);
        Acquire {
            bulkhead: self,
            demand,
            options,
            reservation,
            node: Waiter::new(r, k, priority),
            queued: false,
            finished: false,
            deadline: None,
            timer: None,
            cancel_reg: None,
            since: None,
            timed: false,
            queue_wait: None,
        }
    }

    /// Tokens, class index (0 without classes), priority and reservation of `demand`.
    fn demand_parts(&self, demand: &Demand) -> (u64, usize, Priority, Option<Reservation>) {
        let reservation = self
            .shared
            .has_budget
            .then(|| demand.reservation().unwrap_or(Reservation::ZERO));
        (
            reservation.map_or(0, |x| x.total()),
            self.class_index(demand.class()),
            demand.priority(),
            reservation,
        )
    }

    /// The fast decision, then (if it found no free slot and queueing is possible) the decision
    /// under the queue mutex, which takes a slot, refuses, or queues `node`.
    fn enter(&self, node: Pin<&Waiter>, notify: impl FnOnce() -> Notify) -> Enter {
        let shared = &*self.shared;
        if shared.classed {
            return self.enter_classed(node, notify);
        }
        let (r, priority) = (node.r, node.priority);
        let (w, lim, reason) = match self.try_decide(r, priority) {
            Ok(g) => return Enter::Granted(g),
            Err(e) => e,
        };
        // Token waiting (`crate::token_wait`): a demand short only of tokens that fits once
        // nothing else is held decides again under the mutex, like one short of a slot.
        let waits_for_tokens = reason == RejectReason::BudgetLimit
            && shared.wait_for_tokens
            && crate::token_wait::fits_when_idle(&lim, r, priority);
        if !(reason == RejectReason::ConcurrencyLimit || waits_for_tokens)
            || lim.max_concurrent == 0
            || lim.max_queue == 0
        {
            return match self.refusal(w, &lim, reason, r, priority) {
                Some(rej) => Enter::Refused(rej),
                None => self.enter(node, notify),
            };
        }
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        let word = &*shared.word;
        let mut w = Word(word.load(Ordering::Acquire));
        loop {
            let lim = shared.ring.read(w.tag());
            let short = lim
                .effective(priority)
                .is_some_and(|e| w.tokens().saturating_add(r) > e);
            // Short of tokens but able to fit later: it queues under the option, as long as a
            // queue is possible (`crate::token_wait`).
            let waits_for_tokens = short
                && shared.wait_for_tokens
                && crate::token_wait::fits_when_idle(&lim, r, priority)
                && lim.max_concurrent > 0
                && lim.max_queue > 0;
            let reason = if w.closed() {
                Some(RejectReason::Shutdown)
            } else if short && !waits_for_tokens {
                Some(RejectReason::BudgetLimit)
            } else if !short && q.len() == 0 && w.slots() < lim.max_concurrent {
                // A slot freed meanwhile (or the flag is up only for drainers), and nobody is
                // queued: take it.
                match word.compare_exchange(w.0, w.plus(r).0, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        drop(q);
                        return Enter::Granted(self.count_admission(lim.revision, r));
                    }
                    Err(actual) => {
                        w = Word(actual);
                        continue;
                    }
                }
            } else if lim.max_concurrent == 0 || lim.max_queue == 0 {
                Some(RejectReason::ConcurrencyLimit)
            } else if q.len() as u64 >= lim.max_queue {
                Some(RejectReason::QueueLimit)
            } else {
                None
            };
            if let Some(reason) = reason {
                let pending = q.len();
                drop(q);
                return match self.refusal(w, &lim, reason, r, priority) {
                    Some(mut rej) => {
                        rej.detail.pending = pending as u64;
                        Enter::Refused(rej)
                    }
                    None => self.enter(node, notify),
                };
            }
            // Queue: the CAS proves, with the tag, that no slot is free (or that others wait).
            // The length mirror counts us first: a decider or a release that reads the word
            // after this CAS then sees us in the mirror (module docs, "Drain").
            shared.queued.store(q.len() + 1, Ordering::SeqCst);
            crate::sync::loom_sc_fence();
            match word.compare_exchange(w.0, w.0 | WAITERS, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => {
                    node.set_notify(&q, notify());
                    // SAFETY: `node` is pinned by the caller and unlinks (or is answered) before
                    // it is dropped; we hold the mutex.
                    unsafe { q.push_back(&node) };
                    return Enter::Queued;
                }
                Err(actual) => {
                    shared.queued.store(q.len(), Ordering::SeqCst);
                    w = Word(actual);
                }
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
        if shared.classed {
            sync_class_flags(shared, &mut q);
            wake_class_drainers_if_idle(shared, &q, &mut wake);
        } else {
            clear_waiters(shared, &q);
            wake_drainers_if_idle(Word(shared.word.load(Ordering::Acquire)), &q, &mut wake);
        }
        drop(q);
        wake.wake_all();
        if shared.wait_for_tokens {
            // Token waiting: the waiter behind may fit where this one did not
            // (`crate::token_wait`). `self` is a handle: the state stays alive.
            if shared.classed {
                pump_classed(shared);
            } else {
                pump(shared);
            }
        }
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
        let r = reservation.map_or(0, |x| x.total());
        match outcome {
            Outcome::Granted {
                revision,
                resources,
            } => {
                let g = if self.shared.classed {
                    let k = self.class_index(demand.class());
                    self.count_class_admission(k, r, revision, resources)
                } else {
                    self.count_admission(revision, r)
                };
                Ok(self.admission_from(g, priority, reservation))
            }
            Outcome::Refused(reason) => Err(self.waiter_refusal(reason, demand)),
            Outcome::RefusedAs(reason, constraint) => {
                let k = self.class_index(demand.class());
                let mut rej = self.class_answer_refusal(k, reason, constraint, r, priority);
                rej.detail.pending = pending(&self.shared) as u64;
                Err(rej)
            }
            Outcome::Pending => unreachable!("a finished waiter has an outcome"),
        }
    }
}

/// Clears `WAITERS` unless waiters or drainers still need it (caller holds the mutex, `q`
/// proves it).
pub(crate) fn clear_waiters(shared: &Shared, q: &Queue) {
    if !q.flag_needed() {
        shared.word.fetch_and(!WAITERS, Ordering::AcqRel);
    }
}

/// Wakes the drainers if the state `w` (no-class word) is idle and nobody is queued.
fn wake_drainers_if_idle(w: Word, q: &Queue, wake: &mut WakeList) {
    if q.has_drainers() && q.len() == 0 && w.slots() == 0 && w.tokens() == 0 {
        for n in q.drainers() {
            wake.push(n);
        }
    }
}

/// A release that found `WAITERS` set: hand the slot (with `held` tokens to give back) to the
/// head waiter whose checks pass, or return it if none does or the limit shrank below the
/// slots in use. The slot keeps the shared state alive until the final step.
#[cold]
#[inline(never)]
pub(crate) fn hand_off(slot: SlotRef, held: u64) {
    // Counted while the slot is still ours: the grant below gives the slot away, and the
    // granted waiter may then free everything the words count before we unlock.
    let guard = slot.into_slow_path();
    let shared = &*guard;
    let mut wake = WakeList::new();
    let mut q = guard.lock_queue();
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::Acquire));
    let last = loop {
        let lim = shared.ring.read(w.tag());
        let head = q.front().map(|h| (h.r, h.priority));
        match head {
            Some((r, priority)) if !w.closed() && w.slots() <= lim.max_concurrent => {
                let t = w.tokens() - held;
                let short = lim
                    .effective(priority)
                    .is_some_and(|e| t.saturating_add(r) > e);
                if short
                    && shared.wait_for_tokens
                    && crate::token_wait::fits_when_idle(&lim, r, priority)
                {
                    // Token waiting: the head keeps waiting for tokens; the slot and the
                    // tokens go back to the word below, with `WAITERS` still up, so no
                    // newcomer can take them before the head (`crate::token_wait`).
                    match return_to_word(word, &q, w, held, &mut wake) {
                        Ok(()) => break Some(w),
                        Err(actual) => {
                            w = actual;
                            continue;
                        }
                    }
                }
                if short {
                    // The head no longer fits: answered, not re-queued; next waiter.
                    // (With the queue now empty, the next turn returns the slot and clears
                    // the flag in one CAS.)
                    wake.push(q.answer_front(Outcome::Refused(RejectReason::BudgetLimit)));
                    if wake.is_full() {
                        // A batch: wake it outside the lock (the slot is still ours), then
                        // look again.
                        drop(q);
                        wake.wake_all();
                        q = guard.lock_queue();
                        w = Word(word.load(Ordering::Acquire));
                    }
                    continue;
                }
                // The slot passes on: its tokens become the waiter's reservation.
                match grant_head(word, &mut q, w, w.0 - held + r, lim.revision, &mut wake) {
                    Ok(_) => break None,
                    Err(actual) => w = actual,
                }
            }
            _ => {
                // Nobody to hand to (or shrunk, or closed): return the slot; clear the flag if
                // the queue is empty.
                match return_to_word(word, &q, w, held, &mut wake) {
                    Ok(()) => break Some(w),
                    Err(actual) => w = actual,
                }
            }
        }
    };
    // The slot is gone (to a waiter, or back to the word): from here only `guard` keeps the
    // state alive, while we still hold its queue.
    crate::sync::pause(crate::sync::PausePoint::HandOffGiven);
    if let Some(prev) = last {
        if prev.detached() && prev.slots() == 1 {
            // SAFETY: our CAS returned the last slot of a detached state (no handle, hence no
            // waiter, is left): we are the unique thread that saw the last owner leave. The
            // guard frees the state when it goes, after the unlock.
            unsafe { guard.owners_gone() }
        }
    }
    // Token waiting: slots may be free while waiters wait, so after a grant the next head may
    // fit too (`crate::token_wait`).
    let more = shared.wait_for_tokens && last.is_none() && q.len() > 0;
    drop(q);
    wake.wake_all();
    if more {
        // `guard` keeps the state alive, as in `release_while_draining`.
        pump(&guard);
    }
    // `guard` goes last: the free, if this was the last reference.
}

/// A hand-off's return of its slot and `held` tokens to the word with the CAS from `w`,
/// clearing `WAITERS` if nobody needs it; wakes the drainers if that left the bulkhead idle.
/// `Err`: the word moved.
fn return_to_word(
    word: &crate::sync::AtomicU64,
    q: &Queue,
    w: Word,
    held: u64,
    wake: &mut WakeList,
) -> Result<(), Word> {
    let mut next = w.0 - ONE_SLOT - held;
    if !q.flag_needed() {
        next &= !WAITERS;
    }
    match word.compare_exchange(w.0, next, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            wake_drainers_if_idle(Word(next), q, wake);
            Ok(())
        }
        Err(actual) => Err(Word(actual)),
    }
}

/// Grants the head waiter with the CAS `w → next` under the limits of `revision`, clearing
/// `WAITERS` if it was the last waiter and no drainer needs the flag. `Err`: the word moved.
fn grant_head(
    word: &crate::sync::AtomicU64,
    q: &mut Queue,
    w: Word,
    mut next: u64,
    revision: u64,
    wake: &mut WakeList,
) -> Result<u64, Word> {
    if q.len() == 1 && !q.has_drainers() {
        next &= !WAITERS;
    }
    match word.compare_exchange(w.0, next, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            wake.push(q.answer_front(Outcome::Granted {
                revision,
                resources: Default::default(),
            }));
            Ok(next)
        }
        Err(actual) => Err(Word(actual)),
    }
}

/// Pumps: free slots for head waiters while `slots < max_concurrent`, then wakes the drainers
/// if the bulkhead is idle. Called after `apply_limits` raised the limit (the caller holds a
/// handle), by a drain-time release that returned its slot to the word
/// ([`release_while_draining`], which holds a counted guard), and with token waiting by a usage
/// refund (its admission holds a slot) and a waiter that left (it holds a handle).
pub(crate) fn pump(shared: &Shared) {
    let mut wake = WakeList::new();
    // SAFETY: every caller is an owner for the whole call (a handle, a counted guard, or the
    // slot of the admission that refunds).
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let shared = &*guard;
    let mut q = guard.lock_queue();
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::Acquire));
    while let Some((r, priority)) = q.front().map(|h| (h.r, h.priority)) {
        if wake.is_full() {
            // A batch: wake it outside the lock, then look again.
            drop(q);
            wake.wake_all();
            q = guard.lock_queue();
            w = Word(word.load(Ordering::Acquire));
            continue;
        }
        let lim = shared.ring.read(w.tag());
        if w.closed() || w.slots() >= lim.max_concurrent {
            break;
        }
        if lim
            .effective(priority)
            .is_some_and(|e| w.tokens().saturating_add(r) > e)
        {
            if shared.wait_for_tokens && crate::token_wait::fits_when_idle(&lim, r, priority) {
                // Token waiting: the head keeps waiting; nobody behind it is considered.
                break;
            }
            wake.push(q.answer_front(Outcome::Refused(RejectReason::BudgetLimit)));
            continue;
        }
        match grant_head(word, &mut q, w, w.plus(r).0, lim.revision, &mut wake) {
            Ok(next) => w = Word(next),
            Err(actual) => w = actual,
        }
    }
    clear_waiters(shared, &q);
    wake_drainers_if_idle(Word(word.load(Ordering::Acquire)), &q, &mut wake);
    drop(q);
    wake.wake_all();
}

/// `close()`'s part: answers every waiter with `shutdown` and clears `WAITERS`.
pub(crate) fn close_queue(shared: &Shared) {
    let mut wake = WakeList::new();
    // SAFETY: the caller (`close`) holds a handle for the whole call.
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let shared = &*guard;
    let mut q = guard.lock_queue();
    while q.front().is_some() {
        if wake.is_full() {
            // A batch: wake it outside the lock (no newcomer queues: the word is closed).
            drop(q);
            wake.wake_all();
            q = guard.lock_queue();
            continue;
        }
        wake.push(q.answer_front(Outcome::Refused(RejectReason::Shutdown)));
    }
    if shared.classed {
        sync_class_flags(shared, &mut q);
    } else {
        clear_waiters(shared, &q);
    }
    drop(q);
    wake.wake_all();
}

/// A fail-fast decision found `WAITERS` set with a free slot: the flag may be up only for
/// drainers. Without the mutex: admit if the queue-length mirror says nobody is queued
/// (`None`: someone is, or the state changed; the caller refuses). Lock-free, so a drain does
/// not turn the decision path into a locked one (module docs, "Drain").
#[cold]
#[inline(never)]
pub(crate) fn admit_if_nobody_waits(b: &Bulkhead, r: u64, priority: Priority) -> Option<Granted> {
    let shared = &*b.shared;
    let word = &*shared.word;
    let mut w = Word(word.load(Ordering::SeqCst));
    loop {
        // After the word load: if `w` is from after an enqueuer's queueing CAS, its mirror
        // store (sequenced before that CAS) is visible here.
        crate::sync::loom_sc_fence();
        if shared.queued.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let lim = shared.ring.read(w.tag());
        if w.closed()
            || w.slots() >= lim.max_concurrent
            || lim
                .effective(priority)
                .is_some_and(|e| w.tokens().saturating_add(r) > e)
        {
            return None;
        }
        match word.compare_exchange(w.0, w.plus(r).0, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return Some(b.count_admission(lim.revision, r)),
            Err(actual) => w = Word(actual),
        }
    }
}

/// A release that found `WAITERS` set while the queue-length mirror said nobody is queued (the
/// flag is up for drainers): returns the slot to the word with a CAS, without the mutex, then
/// looks at the mirror again. Only if a waiter queued meanwhile, or this release left the
/// bulkhead idle (the drainers must be woken), does it lock the queue: it pumps (grants the
/// free slot to the head, wakes idle drainers). `guard` keeps the state alive throughout.
#[cold]
#[inline(never)]
pub(crate) fn release_while_draining(guard: SlowPathRef<'static>, held: u64) {
    let word = &*guard.word;
    let mut prev = Word(word.load(Ordering::SeqCst));
    loop {
        let next = prev.0 - ONE_SLOT - held;
        match word.compare_exchange(prev.0, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => {
                crate::sync::loom_sc_fence();
                let queued = guard.queued.load(Ordering::SeqCst);
                let idle = Word(next).slots() == 0 && Word(next).tokens() == 0;
                if prev.waiters() && (queued != 0 || idle) {
                    pump(&guard);
                }
                break;
            }
            Err(actual) => prev = Word(actual),
        }
    }
    if prev.detached() && prev.slots() == 1 {
        // SAFETY: our CAS returned the last slot of a detached state: we are the unique thread
        // that saw the last owner leave. `guard` frees the state when it goes.
        unsafe { guard.owners_gone() }
    }
}

/// Waiters ever queued (for statistics).
pub(crate) fn queued_total(shared: &Shared) -> u64 {
    shared.queued_total()
}

/// When a wait begins: `Some(now)` only if the bulkhead measures queue waits (a clock read
/// costs about a tenth of an async hand-off, so it is opt-in).
fn wait_started(b: &Bulkhead) -> Option<Instant> {
    b.shared.measure_waits.then(Instant::now)
}

/// Books one ended wait (and its duration, if it was measured).
fn book_wait(b: &Bulkhead, since: Option<Instant>) {
    let c = b.shared.counters.local(crate::stats::Counters::new);
    c.waits.add(1);
    if let Some(since) = since {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        c.wait_ns.add(ns);
        c.wait_max_ns.raise(ns);
    }
}

/// Live waiters (for statistics and refusal details), read under the queue mutex: exact.
/// (The queue-length mirror is not: an enqueuer counts itself in it before its queueing CAS,
/// which may fail and leave it taking the freed slot instead.)
pub(crate) fn pending(shared: &Shared) -> usize {
    shared.queue_len()
}

/// The future of [`Bulkhead::acquire`].
///
/// # Cancel safety
/// Dropping it removes its waiter from the queue; if it had already been handed a slot, the
/// slot is released at once and passes to the next waiter.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
/// let b = Bulkhead::builder().max_concurrent(1).max_queue(2).build().unwrap();
/// let held = b.try_acquire(Demand::slot()).unwrap();
/// let fut = b.acquire(Demand::slot(), WaitOptions::default());
/// drop(fut); // never polled: nothing was queued
/// drop(held);
/// assert_eq!(b.stats().pending, 0);
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a> {
    bulkhead: &'a Bulkhead,
    demand: Demand,
    options: WaitOptions,
    reservation: Option<Reservation>,
    node: Waiter,
    queued: bool,
    finished: bool,
    /// When the wait times out (`options.timeout` from the first poll).
    deadline: Option<Instant>,
    /// The timer entry that wakes this future at its deadline.
    timer: Option<u64>,
    /// Its waker's registration with `options.cancel`, while queued.
    cancel_reg: Option<u64>,
    /// When it joined the queue.
    since: Option<Instant>,
    /// Timing requested ([`Bulkhead::acquire_timed`]): the queue wait is measured.
    timed: bool,
    /// How long it was queued, once it finished (measured only if `timed` or the bulkhead
    /// measures queue waits).
    queue_wait: Option<Duration>,
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("queued", &self.queued)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Future for Acquire<'_> {
    type Output = Result<Admission, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `node` is never moved out of the pinned future; the other fields are plain
        // data that are not structurally pinned.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(!this.finished, "Acquire polled after completion");
        let b = this.bulkhead;
        // SAFETY: `this` is pinned, so `node` is too.
        let node = unsafe { Pin::new_unchecked(&this.node) };
        let priority = node.priority;
        if !this.queued {
            if this
                .options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled)
            {
                this.finished = true;
                return Poll::Ready(Err(b.waiter_refusal(RejectReason::Aborted, &this.demand)));
            }
            // The waker is cloned only if the demand queues.
            match b.enter(node, || Notify::Waker(cx.waker().clone())) {
                Enter::Granted(g) => {
                    this.finished = true;
                    return Poll::Ready(Ok(b.admission_from(g, priority, this.reservation)));
                }
                Enter::Refused(rej) => {
                    this.finished = true;
                    return Poll::Ready(Err(rej));
                }
                Enter::Queued => {
                    this.queued = true;
                    this.since = if this.timed {
                        Some(Instant::now())
                    } else {
                        wait_started(b)
                    };
                    this.deadline =
                        deadline_after(this.options.timeout.or(b.shared.default_timeout));
                    if let Some(at) = this.deadline {
                        this.timer = Some(crate::timer::register(at, cx.waker().clone()));
                    }
                    if let Some(tok) = &this.options.cancel {
                        this.cancel_reg = Some(tok.register_waker(None, cx.waker()));
                        if tok.is_cancelled() {
                            // Cancelled before the registration: look again at once.
                            cx.waker().wake_by_ref();
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
        if !node.is_done() {
            let cancelled = this
                .options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled);
            let timed_out = this.deadline.is_some_and(|d| Instant::now() >= d);
            if cancelled || timed_out {
                let reason = if cancelled {
                    RejectReason::Aborted
                } else {
                    RejectReason::Timeout
                };
                let outcome = b.leave(node, reason);
                this.finished = true;
                end_registrations(
                    &mut this.timer,
                    this.options.cancel.as_ref(),
                    &mut this.cancel_reg,
                );
                this.queue_wait = this.since.map(|s| s.elapsed());
                book_wait(b, this.since);
                return Poll::Ready(b.finish(outcome, &this.demand, priority, this.reservation));
            }
            if let Some(t) = this.timer {
                crate::timer::update(t, cx.waker());
            }
            if let (Some(tok), Some(id)) = (&this.options.cancel, this.cancel_reg) {
                tok.register_waker(Some(id), cx.waker());
            }
            let guard = b.shared.slow_path();
            let q = guard.lock_queue();
            if !node.is_done() {
                if node.needs_waker(&q, cx.waker()) {
                    node.set_notify(&q, Notify::Waker(cx.waker().clone()));
                }
                return Poll::Pending;
            }
        }
        this.finished = true;
        end_registrations(
            &mut this.timer,
            this.options.cancel.as_ref(),
            &mut this.cancel_reg,
        );
        this.queue_wait = this.since.map(|s| s.elapsed());
        book_wait(b, this.since);
        // SAFETY: `is_done` returned true on this thread (the branch above, or the check
        // under the lock).
        let outcome = unsafe { node.outcome() };
        Poll::Ready(b.finish(outcome, &this.demand, priority, this.reservation))
    }
}

/// Ends a waiter's timer entry and its cancellation registration (the wait is over).
fn end_registrations(timer: &mut Option<u64>, cancel: Option<&CancelToken>, reg: &mut Option<u64>) {
    if let Some(t) = timer.take() {
        crate::timer::cancel(t);
    }
    if let (Some(tok), Some(id)) = (cancel, reg.take()) {
        tok.unregister_waker(id);
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        end_registrations(
            &mut self.timer,
            self.options.cancel.as_ref(),
            &mut self.cancel_reg,
        );
        if !self.queued || self.finished {
            return;
        }
        let b = self.bulkhead;
        // SAFETY: the future is being dropped in place: `node` has not moved since it was
        // pinned and is still alive here.
        let node = unsafe { Pin::new_unchecked(&self.node) };
        let outcome = b.leave(node, RejectReason::Aborted);
        book_wait(b, self.since);
        if let Outcome::Granted { .. } = outcome {
            // Handed a slot after it stopped waiting: take it and release it at once, which
            // passes it to the next waiter.
            let priority = node.priority;
            drop(b.finish(outcome, &self.demand, priority, self.reservation));
        }
    }
}

/// The future of [`Bulkhead::acquire_timed`]: an [`Acquire`] that also reports its timing.
///
/// # Cancel safety
/// As [`Acquire`]: dropping it removes its waiter; a slot granted meanwhile passes on.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
/// let b = Bulkhead::new(1).unwrap();
/// let f = b.acquire_timed(Demand::slot(), WaitOptions::default());
/// let t = futures_lite::future::block_on(f);
/// assert!(t.value.is_ok());
/// ```
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct AcquireTimed<'a> {
    inner: Acquire<'a>,
    /// The first poll (the decision's start).
    start: Option<Instant>,
}

impl Future for AcquireTimed<'_> {
    type Output = Timed<Result<Admission, Rejection>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `inner` is structurally pinned (never moved out of the pinned future);
        // `start` is plain data.
        let this = unsafe { self.get_unchecked_mut() };
        let start = *this.start.get_or_insert_with(Instant::now);
        // SAFETY: `this` is pinned, so `inner` is too.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        match inner.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(value) => {
                let total = start.elapsed();
                let wait = this.inner.queue_wait.unwrap_or_default();
                Poll::Ready(Timed {
                    value,
                    timing: Timing {
                        decision_ns: nanos(total.saturating_sub(wait)),
                        queue_wait_ns: nanos(wait),
                    },
                })
            }
        }
    }
}

/// What [`Bulkhead::drain_blocking`] and [`Bulkhead::drain`] found.
///
/// ```
/// use llm_bulkhead::{Bulkhead, DrainReport};
/// let r = Bulkhead::new(1).unwrap().drain_blocking(None);
/// assert_eq!(r, DrainReport { drained: true, in_flight: 0, pending: 0 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DrainReport {
    /// Nothing in flight, nobody queued, no token hold left.
    pub drained: bool,
    /// Admissions not yet released (abandoned ones count until released).
    pub in_flight: u64,
    /// Waiters queued.
    pub pending: u64,
}

impl Bulkhead {
    /// Waits until nothing is in flight, nobody is queued and no token hold is left
    /// (CONTRACT.md §7), or until `deadline` passes; cancels nothing and does not close. A zero
    /// deadline is a snapshot; one too large to add to the current instant (`Duration::MAX`)
    /// is no deadline. It never hangs once the state is idle, however the last waiter
    /// left.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// let r = b.drain_blocking(Some(Duration::ZERO));
    /// assert_eq!((r.drained, r.in_flight, r.pending), (false, 1, 0));
    /// let t = std::thread::spawn(move || drop(a));
    /// assert!(b.drain_blocking(None).drained);
    /// t.join().unwrap();
    /// ```
    pub fn drain_blocking(&self, deadline: Option<Duration>) -> DrainReport {
        let until = deadline_after(deadline);
        let report = self.drain_report();
        if report.drained || deadline == Some(Duration::ZERO) {
            return report;
        }
        let id = self.register_drainer(Notify::Thread(crate::sync::thread::current()));
        // Unregisters on every way out, an unwind included (a registration left behind would
        // keep `WAITERS` up for good).
        struct Registered<'a>(&'a Bulkhead, u64);
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.0.unregister_drainer(self.1);
            }
        }
        let registered = Registered(self, id);
        let report = loop {
            let report = self.drain_report();
            if report.drained {
                break report;
            }
            match until {
                Some(u) => {
                    let now = Instant::now();
                    if now >= u {
                        break report;
                    }
                    crate::sync::thread::park_timeout(u - now);
                }
                None => crate::sync::thread::park(),
            }
        };
        drop(registered);
        report
    }

    /// The async counterpart of [`drain_blocking`](Self::drain_blocking); its deadline runs on
    /// the crate's timer thread, so it works on any executor.
    ///
    /// # Cancel safety
    /// Dropping the future unregisters it; nothing else changes.
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::new(1).unwrap();
    /// assert!(futures_lite::future::block_on(b.drain(None)).drained);
    /// ```
    pub fn drain(&self, deadline: Option<Duration>) -> Drain<'_> {
        Drain {
            bulkhead: self,
            zero: deadline == Some(Duration::ZERO),
            until: deadline_after(deadline),
            drainer: None,
            timer: None,
        }
    }

    fn drain_report(&self) -> DrainReport {
        let s = self.stats();
        let tokens = s.token_budget.map_or(0, |t| t.in_flight_tokens);
        DrainReport {
            drained: s.admissions_in_flight == 0 && s.pending == 0 && tokens == 0,
            in_flight: s.admissions_in_flight,
            pending: s.pending,
        }
    }

    /// Registers a drainer and raises `WAITERS` (with classes: `C_QUEUE` on the class words),
    /// so releases take the slow path that wakes it.
    fn register_drainer(&self, n: Notify) -> u64 {
        let shared = &*self.shared;
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        let id = q.add_drainer(n);
        if shared.classed {
            sync_class_flags(shared, &mut q);
        } else {
            shared.word.fetch_or(WAITERS, Ordering::AcqRel);
        }
        id
    }

    fn unregister_drainer(&self, id: u64) {
        let shared = &*self.shared;
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        q.remove_drainer(id);
        if shared.classed {
            sync_class_flags(shared, &mut q);
        } else {
            clear_waiters(shared, &q);
        }
    }
}

/// The future of [`Bulkhead::drain`].
///
/// # Cancel safety
/// Dropping it unregisters it; nothing else changes.
///
/// ```
/// let b = llm_bulkhead::Bulkhead::new(1).unwrap();
/// let f = b.drain(None);
/// drop(f);
/// ```
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Drain<'a> {
    bulkhead: &'a Bulkhead,
    zero: bool,
    until: Option<Instant>,
    drainer: Option<u64>,
    timer: Option<u64>,
}

impl Future for Drain<'_> {
    type Output = DrainReport;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DrainReport> {
        let this = &mut *self;
        let b = this.bulkhead;
        let report = b.drain_report();
        let expired = this.until.is_some_and(|u| Instant::now() >= u);
        if report.drained || this.zero || expired {
            this.release();
            return Poll::Ready(report);
        }
        match this.drainer {
            None => {
                this.drainer = Some(b.register_drainer(Notify::Waker(cx.waker().clone())));
                // The state may have become idle before the registration: look again.
                let report = b.drain_report();
                if report.drained {
                    this.release();
                    return Poll::Ready(report);
                }
            }
            Some(id) => b
                .shared
                .slow_path()
                .lock_queue()
                .update_drainer(id, Notify::Waker(cx.waker().clone())),
        }
        // The deadline runs on the timer thread.
        if let Some(at) = this.until {
            if let Some(t) = this.timer.take() {
                crate::timer::cancel(t);
            }
            this.timer = Some(crate::timer::register(at, cx.waker().clone()));
        }
        Poll::Pending
    }
}

impl Drain<'_> {
    fn release(&mut self) {
        if let Some(id) = self.drainer.take() {
            self.bulkhead.unregister_drainer(id);
        }
        if let Some(t) = self.timer.take() {
            crate::timer::cancel(t);
        }
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

// ---- class mode (module docs, "With admission classes") ----

/// Whether a class refusal lets the demand wait: no free global slot, or a refusal no collect
/// confirmed (another decider's step was in flight; it visits the queue when it lands or is
/// taken back).
fn may_wait(f: &crate::classed::Refused) -> bool {
    waits_for_slot(f) || f.stored_shared.is_some()
}

/// Whether a class refusal means "no free global slot" (row 6), the one refusal that waits.
fn waits_for_slot(f: &crate::classed::Refused) -> bool {
    f.reason == RejectReason::ConcurrencyLimit
        && f.constraint == Some(crate::rejection::Constraint::Global)
}

impl Bulkhead {
    /// Class mode of `enter`: the fast class decision, then under the mutex (raising the flags
    /// first when the queue is empty) a decision for the would-be head, or a place at the tail.
    #[inline(never)]
    fn enter_classed(&self, node: Pin<&Waiter>, notify: impl FnOnce() -> Notify) -> Enter {
        let shared = &*self.shared;
        let (k, r, priority) = (node.k, node.r, node.priority);
        // Rows 1–5 pass and there is no free slot, or waiters are queued: straight to the
        // queue (a decision of our own would only be refused, and explained at a cost).
        let w = Word(shared.word.load(Ordering::SeqCst));
        let lim = shared.ring.read(w.tag());
        let pre = crate::classed::precheck(shared, k, r, priority);
        let to_queue = lim.max_concurrent > 0
            && lim.max_queue > 0
            && (pre == Precheck::NoSlot || (pre == Precheck::Fits && w.waiters()));
        if !to_queue {
            match crate::classed::acquire(shared, k, r, priority) {
                Ok(a) => {
                    return Enter::Granted(self.count_class_admission(
                        k,
                        r,
                        a.revision,
                        a.resources,
                    ))
                }
                // No free slot, or a refusal no collect confirmed (another decider's step was
                // in flight): decide again under the mutex, and wait if need be.
                Err(f)
                    if (may_wait(&f)
                        || crate::token_wait::classed_waits_for_tokens(
                            shared, &f, k, r, priority,
                        ))
                        && f.lim.max_concurrent > 0
                        && f.lim.max_queue > 0 => {}
                Err(f) => return Enter::Refused(self.class_refusal(k, f, r, priority)),
            }
        }
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        if q.len() == 0 {
            // Become the head: flags up first, then decide (no lost wake-up). A collect after
            // the flags that finds no free slot is that decision: any release it missed comes
            // later in its word's order, sees the flags and pumps.
            set_class_flags(shared, &mut q, true, true);
            if crate::classed::precheck(shared, k, r, priority) != Precheck::NoSlot {
                match crate::classed::acquire_in_queue(shared, k, r, priority) {
                    Ok(a) => {
                        sync_class_flags(shared, &mut q);
                        drop(q);
                        return Enter::Granted(self.count_class_admission(
                            k,
                            r,
                            a.revision,
                            a.resources,
                        ));
                    }
                    // An unconfirmed refusal waits too: the step that caused it visits the
                    // queue when it lands or is taken back, and the flags are already up.
                    Err(f)
                        if may_wait(&f)
                            || crate::token_wait::classed_waits_for_tokens(
                                shared, &f, k, r, priority,
                            ) => {}
                    Err(f) => {
                        sync_class_flags(shared, &mut q);
                        drop(q);
                        return Enter::Refused(self.class_refusal(k, f, r, priority));
                    }
                }
            }
        }
        let w = Word(shared.word.load(Ordering::SeqCst));
        let lim = shared.ring.read(w.tag());
        let refuse = if w.closed() {
            Some((RejectReason::Shutdown, None))
        } else if lim.max_concurrent == 0 || lim.max_queue == 0 {
            Some((
                RejectReason::ConcurrencyLimit,
                Some(crate::rejection::Constraint::Global),
            ))
        } else if q.len() as u64 >= lim.max_queue {
            Some((
                RejectReason::QueueLimit,
                Some(crate::rejection::Constraint::Global),
            ))
        } else {
            None
        };
        if let Some((reason, constraint)) = refuse {
            let pending = q.len() as u64;
            sync_class_flags(shared, &mut q);
            drop(q);
            let mut rej = self.class_answer_refusal(k, reason, constraint, r, priority);
            rej.detail.pending = pending;
            return Enter::Refused(rej);
        }
        node.set_notify(&q, notify());
        // SAFETY: `node` is pinned by the caller and unlinks (or is answered) before it is
        // dropped; we hold the mutex.
        unsafe { q.push_back(&node) };
        sync_class_flags(shared, &mut q);
        Enter::Queued
    }
}

/// Raises or lowers `C_QUEUE` on every class word (`queue_flag`) and `WAITERS` on the shared
/// word (`waiters`). Caller holds the mutex (`q`); `C_QUEUE` goes up before `WAITERS`.
fn set_class_flags(shared: &Shared, q: &mut Queue, queue_flag: bool, waiters: bool) {
    use crate::classed::C_QUEUE;
    if queue_flag && !q.class_flags {
        for cw in shared.class_words.iter() {
            cw.fetch_or(C_QUEUE, Ordering::SeqCst);
        }
        q.class_flags = true;
    }
    let up = Word(shared.word.load(Ordering::SeqCst)).waiters();
    if waiters && !up {
        shared.word.fetch_or(WAITERS, Ordering::SeqCst);
    } else if !waiters && up {
        shared.word.fetch_and(!WAITERS, Ordering::SeqCst);
    }
    if !queue_flag && q.class_flags {
        for cw in shared.class_words.iter() {
            cw.fetch_and(!C_QUEUE, Ordering::SeqCst);
        }
        q.class_flags = false;
    }
}

/// The flags the queue needs now: both while waiters are queued, `C_QUEUE` alone while only
/// drainers wait, neither otherwise.
pub(crate) fn sync_class_flags(shared: &Shared, q: &mut Queue) {
    let waiters = q.len() > 0;
    set_class_flags(shared, q, waiters || q.has_drainers(), waiters);
}

/// Wakes the drainers if nobody is queued and the class words hold nothing.
fn wake_class_drainers_if_idle(shared: &Shared, q: &Queue, wake: &mut WakeList) {
    if q.has_drainers() && q.len() == 0 {
        let (_, g, t) = crate::classed::collect(shared);
        if g == 0 && t == 0 {
            for n in q.drainers() {
                wake.push(n);
            }
        }
    }
}

/// Class mode's hand-off: a decrease found the queue flagged. Decides head waiters under the
/// mutex until one has to keep waiting (module docs, "With admission classes"), then wakes
/// drainers if the bulkhead is idle. The caller keeps the shared state alive (a handle, or a
/// release's pending-return mark).
#[cold]
#[inline(never)]
pub(crate) fn pump_classed(shared: &Shared) {
    let mut wake = WakeList::new();
    // SAFETY: every caller is an owner for the whole call: a handle (`apply_limits`, a
    // decider's undo, an abandonment's pin) or a slot or pending-return mark that a release
    // gives back only after this returns (`crate::classed::release_pending`).
    let guard = unsafe { SlowPathRef::borrowed(shared) };
    let shared = &*guard;
    let mut q = guard.lock_queue();
    while let Some((k, r, priority)) = q.front().map(|h| (h.k, h.r, h.priority)) {
        if wake.is_full() {
            // A batch: wake it outside the lock, then decide the head again.
            drop(q);
            wake.wake_all();
            q = guard.lock_queue();
            continue;
        }
        match crate::classed::acquire_in_queue(shared, k, r, priority) {
            Ok(a) => wake.push(q.answer_front(Outcome::Granted {
                revision: a.revision,
                resources: a.resources,
            })),
            Err(f) => {
                // Token waiting: a head short only of tokens that fits once nothing else is
                // held stays too (`crate::token_wait`).
                let stays = f.reason != RejectReason::Shutdown
                    && (may_wait(&f)
                        || f.summary.g >= f.lim.max_concurrent
                        || crate::token_wait::classed_waits_for_tokens(shared, &f, k, r, priority));
                if stays {
                    break;
                }
                wake.push(q.answer_front(Outcome::RefusedAs(f.reason, f.constraint)));
            }
        }
    }
    sync_class_flags(shared, &mut q);
    wake_class_drainers_if_idle(shared, &q, &mut wake);
    drop(q);
    wake.wake_all();
}
