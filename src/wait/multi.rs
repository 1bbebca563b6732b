//! A FIFO of waiters that each hold out for several resources at once (layer 3: it uses only
//! the sync facade).
//!
//! [`MultiWait`] keeps a user state `A` (any type implementing [`Admit`]: counters of slots,
//! permits, keys, time gates) and a queue of waiters under one mutex. A waiter carries a
//! request; [`Admit::try_start`] says whether that request can start with the current state
//! and, if so, takes what it needs and returns a grant. Every operation that changes the state
//! ([`MultiWait::update`], [`MultiWait::cancel`], a grant given back) runs the **start rule**
//! before it returns, inside the same critical section:
//!
//! * scan the queue from head to tail; start every waiter whose request can start now (in
//!   queue order, each judged after the starts before it); a waiter that cannot start is
//!   skipped and blocks nobody behind it ("eligibility-ordered FIFO");
//! * [`Start::Nobody`] from `try_start` ends the scan early (no later waiter can start either,
//!   e.g. no global slot is free).
//!
//! So a resource freed by an operation goes to the oldest waiter that can use it *before* any
//! later operation is observed: a newcomer judged by [`MultiWait::submit`] never finds an
//! eligible waiter queued, and starting it now jumps nobody.
//!
//! Only the waiters started (or removed) by an operation are woken, once each, after the mutex
//! is released: no thundering herd, and no user code (a `Waker`'s `wake`, `clone` or `drop`)
//! runs under the mutex. [`Admit`]'s methods do run under it; they are the embedding module's
//! own bookkeeping and must not block or call back into the `MultiWait`.
//!
//! A waiter leaves the queue by starting, by [`cancel`](MultiWait::cancel) (with a [`Leave`]
//! reason: cancelled or timed out), by [`remove_where`](MultiWait::remove_where) (e.g. the
//! deadlines a scheduler found expired) or by [`close`](MultiWait::close). A grant that
//! reached a waiter which then gave up (a cancel that lost the race with the start, a dropped
//! [`WaitFuture`]) goes back through [`Admit::give_back`] and the start rule runs again: no
//! resource leaks on any path.
//!
//! # Example
//!
//! ```
//! use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted, Waited};
//!
//! // Two kinds of resource: `a` and `b` slots. A request names how many of each it needs.
//! struct Pool { a: u32, b: u32 }
//! impl Admit for Pool {
//!     type Request = (u32, u32);
//!     type Grant = (u32, u32);
//!     fn try_start(&mut self, r: &(u32, u32)) -> Start<(u32, u32)> {
//!         if self.a >= r.0 && self.b >= r.1 {
//!             self.a -= r.0;
//!             self.b -= r.1;
//!             Start::Now(*r)
//!         } else {
//!             Start::NotYet
//!         }
//!     }
//!     fn give_back(&mut self, g: (u32, u32)) {
//!         self.a += g.0;
//!         self.b += g.1;
//!     }
//! }
//!
//! let w = MultiWait::new(Pool { a: 1, b: 1 });
//! let Ok(Submitted::Started(first)) = w.submit((1, 1)) else { panic!() };
//! let Ok(Submitted::Queued(id)) = w.submit((1, 0)) else { panic!() };
//! // Giving the first grant back starts the queued waiter inside the same call.
//! w.update(|p| p.give_back(first));
//! assert_eq!(w.wait_blocking(id, None), Waited::Started((1, 0)));
//! ```

mod future;
mod txn;

pub use future::WaitFuture;
pub use txn::Txn;

use crate::sync::thread::Thread;
use crate::sync::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::task::Waker;
use std::time::Instant;

/// What [`Admit::try_start`] decided for one request.
///
/// ```
/// use llm_bulkhead::multi_wait::Start;
/// let s: Start<u8> = Start::NotYet;
/// assert!(matches!(s, Start::NotYet));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start<G> {
    /// The request starts now; the state already took what it needs, recorded in the grant.
    Now(G),
    /// Not now (a resource of its own is busy); later waiters may still start.
    NotYet,
    /// Not now, and no other request can start either (a resource every request needs is
    /// busy): the scan stops here.
    Nobody,
}

/// Why a waiter left the queue without starting.
///
/// ```
/// use llm_bulkhead::multi_wait::Leave;
/// assert_ne!(Leave::Cancelled, Leave::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leave {
    /// Its owner gave up (an abort, a dropped future).
    Cancelled,
    /// Its deadline passed.
    TimedOut,
    /// The `MultiWait` was closed.
    Closed,
}

/// The state a [`MultiWait`] guards, and its rules.
///
/// Every method runs under the `MultiWait`'s mutex: keep them short, never block in them and
/// never call the `MultiWait` back from them.
///
/// ```
/// use llm_bulkhead::multi_wait::{Admit, Start};
/// struct Slots(u32);
/// impl Admit for Slots {
///     type Request = ();
///     type Grant = ();
///     fn try_start(&mut self, _: &()) -> Start<()> {
///         if self.0 == 0 { return Start::Nobody; }
///         self.0 -= 1;
///         Start::Now(())
///     }
///     fn give_back(&mut self, _: ()) { self.0 += 1; }
/// }
/// ```
pub trait Admit {
    /// What a waiter asks for.
    type Request;
    /// What a started request holds (given back through [`give_back`](Admit::give_back)).
    type Grant;

    /// Whether `request` can start with the current state; if so, take what it needs.
    fn try_start(&mut self, request: &Self::Request) -> Start<Self::Grant>;

    /// Returns a grant that nobody will use (its waiter gave up after it was started).
    fn give_back(&mut self, grant: Self::Grant);

    /// Whether `request`, which cannot start now, may join the queue, which holds `queued`
    /// waiters (a queue cap, a per-partition pending limit). `true` by default.
    fn may_queue(&mut self, request: &Self::Request, queued: usize) -> bool {
        let _ = (request, queued);
        true
    }

    /// A call on the wait took its mutex: every judgement until the mutex is released belongs
    /// to one transaction. Nothing by default (a state whose resources can also be given back
    /// without the mutex may reset what it remembered of the previous transaction here).
    ///
    /// ```
    /// use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// struct Counted { begun: u32 }
    /// impl Admit for Counted {
    ///     type Request = ();
    ///     type Grant = ();
    ///     fn try_start(&mut self, _: &()) -> Start<()> { Start::Now(()) }
    ///     fn give_back(&mut self, _: ()) {}
    ///     fn begin(&mut self) { self.begun += 1; }
    /// }
    /// let w = MultiWait::new(Counted { begun: 0 });
    /// w.submit(()).unwrap();
    /// assert_eq!(w.update(|s| s.begun), 2);
    /// ```
    fn begin(&mut self) {}

    /// A queued request left the queue: it started (`None`) or left for `Some(reason)`.
    /// Nothing by default (a per-partition pending count would go down here).
    fn left_queue(&mut self, request: &Self::Request, why: Option<Leave>) {
        let _ = (request, why);
    }
}

/// A waiter's place: its submit order (FIFO), unique in its `MultiWait`.
///
/// ```
/// use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
/// # struct Never;
/// # impl Admit for Never { type Request = (); type Grant = ();
/// #   fn try_start(&mut self, _: &()) -> Start<()> { Start::NotYet }
/// #   fn give_back(&mut self, _: ()) {} }
/// let w = MultiWait::new(Never);
/// let (Ok(Submitted::Queued(a)), Ok(Submitted::Queued(b))) = (w.submit(()), w.submit(())) else { panic!() };
/// assert!(a < b);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaiterId(u64);

impl WaiterId {
    /// The number behind the id (submit order, from 0).
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
    /// # struct Never;
    /// # impl Admit for Never { type Request = (); type Grant = ();
    /// #   fn try_start(&mut self, _: &()) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(a)) = w.submit(()) else { panic!() };
    /// assert_eq!(a.get(), 0);
    /// ```
    pub fn get(self) -> u64 {
        self.0
    }
}

/// What [`MultiWait::submit`] did.
///
/// ```
/// use llm_bulkhead::multi_wait::Submitted;
/// let s: Submitted<u8> = Submitted::Started(1);
/// assert!(matches!(s, Submitted::Started(1)));
/// ```
#[derive(Debug, PartialEq, Eq)]
pub enum Submitted<G> {
    /// It started at once (no queue place taken).
    Started(G),
    /// It waits in the queue: wait for it with [`MultiWait::wait_blocking`] or [`WaitFuture`].
    Queued(WaiterId),
}

/// Why [`MultiWait::submit`] refused a request (nothing changed).
///
/// ```
/// use llm_bulkhead::multi_wait::Refused;
/// assert_ne!(Refused::Full, Refused::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refused {
    /// It cannot start now and [`Admit::may_queue`] said no.
    Full,
    /// The `MultiWait` is closed.
    Closed,
}

/// How a wait ended.
///
/// ```
/// use llm_bulkhead::multi_wait::{Leave, Waited};
/// let w: Waited<u8> = Waited::Left(Leave::TimedOut);
/// assert_eq!(w, Waited::Left(Leave::TimedOut));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited<G> {
    /// The waiter started: the grant is the caller's now.
    Started(G),
    /// The waiter left the queue without starting.
    Left(Leave),
}

/// What [`MultiWait::cancel`] found.
///
/// ```
/// use llm_bulkhead::multi_wait::Cancel;
/// let c: Cancel<u8> = Cancel::Unknown;
/// assert_eq!(c, Cancel::Unknown);
/// ```
#[derive(Debug, PartialEq, Eq)]
pub enum Cancel<R> {
    /// It was queued and is removed (its request is returned); it held nothing.
    Removed(R),
    /// It had started but its grant was not collected yet: the grant went back through
    /// [`Admit::give_back`] (and the start rule ran).
    GaveBack,
    /// No such waiter (already collected, or never existed).
    Unknown,
}

enum Notify {
    None,
    Waker(Waker),
    Thread(Thread),
}

impl Notify {
    fn wake(self) {
        match self {
            Notify::None => {}
            Notify::Waker(w) => w.wake(),
            Notify::Thread(t) => t.unpark(),
        }
    }
}

struct Queued<R> {
    request: R,
    notify: Notify,
}

struct Inner<A: Admit> {
    admit: A,
    /// Queued waiters by submit order.
    queue: BTreeMap<u64, Queued<A::Request>>,
    /// Waiters that left the queue and whose outcome was not collected yet.
    done: HashMap<u64, Waited<A::Grant>>,
    next: u64,
    closed: bool,
    /// Wakes made by this `MultiWait` (for tests: no thundering herd).
    wakes: u64,
}

/// The waiters' queue and the state they wait on, under one mutex (module docs).
///
/// ```
/// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
/// # struct Slots(u32);
/// # impl Admit for Slots { type Request = (); type Grant = ();
/// #   fn try_start(&mut self, _: &()) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
/// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
/// let w = MultiWait::new(Slots(1));
/// assert_eq!(w.submit(()), Ok(Submitted::Started(())));
/// assert!(matches!(w.submit(()), Ok(Submitted::Queued(_))));
/// assert_eq!(w.queued(), 1);
/// ```
pub struct MultiWait<A: Admit> {
    inner: Mutex<Inner<A>>,
}

impl<A: Admit> fmt::Debug for MultiWait<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiWait")
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

/// What one look at a waiter found.
enum Polled<G> {
    Done(Waited<G>),
    Registered,
    NeedNotify,
}

/// Wakes collected under the mutex, made after it is released.
type Wakes = Vec<Notify>;

fn wake_all(wakes: Wakes) {
    for n in wakes {
        n.wake();
    }
}

impl<A: Admit> Inner<A> {
    /// The start rule (module docs): every queued waiter that can start now starts, oldest
    /// first; its wake is collected.
    fn settle(&mut self, wakes: &mut Wakes) {
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_MULTIWAIT_NO_START_RULE") {
            return;
        }
        // Nobody waits (the common, uncontended case): nothing to scan.
        if self.queue.is_empty() {
            return;
        }
        let mut started = Vec::new();
        for (&seq, q) in self.queue.iter() {
            match self.admit.try_start(&q.request) {
                Start::Now(g) => started.push((seq, g)),
                Start::NotYet => {}
                Start::Nobody => break,
            }
        }
        for (seq, g) in started {
            let q = self.queue.remove(&seq).expect("scanned waiter is queued");
            self.admit.left_queue(&q.request, None);
            self.done.insert(seq, Waited::Started(g));
            self.push_wake(q.notify, wakes);
        }
    }

    fn submit(&mut self, request: A::Request) -> Result<Submitted<A::Grant>, Refused> {
        if self.closed {
            return Err(Refused::Closed);
        }
        match self.admit.try_start(&request) {
            Start::Now(g) => Ok(Submitted::Started(g)),
            Start::NotYet | Start::Nobody => {
                if !self.admit.may_queue(&request, self.queue.len()) {
                    return Err(Refused::Full);
                }
                let seq = self.next;
                self.next += 1;
                let notify = Notify::None;
                self.queue.insert(seq, Queued { request, notify });
                Ok(Submitted::Queued(WaiterId(seq)))
            }
        }
    }

    fn remove_where(
        &mut self,
        mut pred: impl FnMut(&A, &A::Request) -> bool,
        why: Leave,
        wakes: &mut Wakes,
    ) -> Vec<(WaiterId, A::Request)> {
        if self.queue.is_empty() {
            return Vec::new();
        }
        let seqs: Vec<u64> = self
            .queue
            .iter()
            .filter(|(_, q)| pred(&self.admit, &q.request))
            .map(|(&seq, _)| seq)
            .collect();
        let mut out = Vec::with_capacity(seqs.len());
        for seq in seqs {
            if let Some(r) = self.remove(seq, why, wakes) {
                self.done.insert(seq, Waited::Left(why));
                out.push((WaiterId(seq), r));
            }
        }
        out
    }

    fn push_wake(&mut self, n: Notify, wakes: &mut Wakes) {
        if !matches!(n, Notify::None) {
            self.wakes += 1;
            wakes.push(n);
        }
    }

    /// A grant nobody will use goes back, and the start rule runs: the freed resources go
    /// to the oldest waiter that can use them.
    fn give_back(&mut self, g: A::Grant, wakes: &mut Wakes) {
        #[cfg(loom)]
        if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_MULTIWAIT_CANCEL_DROPS_GRANT") {
            std::mem::forget(g);
            return;
        }
        self.admit.give_back(g);
        self.settle(wakes);
    }

    fn remove(&mut self, seq: u64, why: Leave, wakes: &mut Wakes) -> Option<A::Request> {
        let q = self.queue.remove(&seq)?;
        self.admit.left_queue(&q.request, Some(why));
        self.push_wake(q.notify, wakes);
        Some(q.request)
    }
}

impl<A: Admit> MultiWait<A> {
    /// A `MultiWait` over `admit`, with an empty queue.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = (); type Grant = ();
    /// #   fn try_start(&mut self, _: &()) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Slots(2));
    /// assert_eq!(w.queued(), 0);
    /// ```
    pub fn new(admit: A) -> Self {
        MultiWait {
            inner: Mutex::new(Inner {
                admit,
                queue: BTreeMap::new(),
                done: HashMap::new(),
                next: 0,
                closed: false,
                wakes: 0,
            }),
        }
    }

    fn locked<T>(&self, f: impl FnOnce(&mut Inner<A>, &mut Wakes) -> T) -> T {
        let mut wakes = Wakes::new();
        let out = {
            let mut g = crate::sync::lock(&self.inner);
            g.admit.begin();
            f(&mut g, &mut wakes)
        };
        wake_all(wakes);
        out
    }

    /// Judges a newcomer: it starts now if [`Admit::try_start`] says so (every queued waiter
    /// is ineligible at this moment, so it jumps nobody); else it queues if
    /// [`Admit::may_queue`] agrees; else [`Refused::Full`]. After [`close`](Self::close),
    /// [`Refused::Closed`]. A refusal changes nothing.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Refused, Start, Submitted};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = (); type Grant = ();
    /// #   fn try_start(&mut self, _: &()) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
    /// #   fn give_back(&mut self, _: ()) { self.0 += 1; }
    /// #   fn may_queue(&mut self, _: &(), queued: usize) -> bool { queued < 1 } }
    /// let w = MultiWait::new(Slots(1));
    /// assert_eq!(w.submit(()), Ok(Submitted::Started(())));
    /// assert!(matches!(w.submit(()), Ok(Submitted::Queued(_))));
    /// assert_eq!(w.submit(()), Err(Refused::Full));
    /// ```
    pub fn submit(&self, request: A::Request) -> Result<Submitted<A::Grant>, Refused> {
        self.locked(|s, _| s.submit(request))
    }

    /// Runs `f` as one operation under the mutex, with a [`Txn`] that can change the state,
    /// run the start rule at intermediate points, remove waiters and judge newcomers; the
    /// start rule runs once more at the end. For operations that must be one step, e.g. a
    /// clock catching up instant by instant (starts, then timeouts, at each instant).
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start, Submitted};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
    /// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
    /// let w = MultiWait::new(Slots(0));
    /// w.submit(1).unwrap();
    /// w.submit(2).unwrap();
    /// // One slot freed and, in the same step, every waiter that did not start times out.
    /// let gone = w.transaction(|t| {
    ///     t.state().0 += 1;
    ///     t.start_eligible();
    ///     t.remove_where(|_, _| true, Leave::TimedOut).len()
    /// });
    /// assert_eq!((gone, w.queued()), (1, 0));
    /// ```
    pub fn transaction<T>(&self, f: impl FnOnce(&mut Txn<'_, A>) -> T) -> T {
        self.locked(|s, wakes| {
            let mut t = Txn { inner: s, wakes };
            let out = f(&mut t);
            t.start_eligible();
            out
        })
    }

    /// Changes the state (a release, a limit raised, a clock advanced, a cooldown) and runs
    /// the start rule before returning: every waiter the change made startable starts inside
    /// this call, oldest first, and only those are woken (after the mutex is released).
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted, Waited};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = (); type Grant = ();
    /// #   fn try_start(&mut self, _: &()) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
    /// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
    /// let w = MultiWait::new(Slots(0));
    /// let Ok(Submitted::Queued(id)) = w.submit(()) else { panic!() };
    /// w.update(|s| s.0 += 1);
    /// assert_eq!(w.wait_blocking(id, None), Waited::Started(()));
    /// ```
    pub fn update<T>(&self, f: impl FnOnce(&mut A) -> T) -> T {
        self.locked(|s, wakes| {
            let out = f(&mut s.admit);
            s.settle(wakes);
            out
        })
    }

    /// Reads the state (and the queued requests, oldest first) under the mutex.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Slots(3));
    /// w.submit(7).unwrap();
    /// let (slots, queue) = w.read(|s, q| (s.0, q.copied().collect::<Vec<_>>()));
    /// assert_eq!((slots, queue), (3, vec![7]));
    /// ```
    pub fn read<T>(&self, f: impl FnOnce(&A, &mut dyn Iterator<Item = &A::Request>) -> T) -> T {
        let g = crate::sync::lock(&self.inner);
        let mut it = g.queue.values().map(|q| &q.request);
        f(&g.admit, &mut it)
    }

    /// Removes a waiter that gives up (`why` is [`Leave::Cancelled`] or [`Leave::TimedOut`]).
    /// If it had already started and its grant was not collected, the grant goes back
    /// ([`Admit::give_back`]) and the start rule runs; nothing leaks either way.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Cancel, Leave, MultiWait, Start, Submitted};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(id)) = w.submit(5) else { panic!() };
    /// assert_eq!(w.cancel(id, Leave::Cancelled), Cancel::Removed(5));
    /// assert_eq!(w.cancel(id, Leave::Cancelled), Cancel::Unknown);
    /// ```
    pub fn cancel(&self, id: WaiterId, why: Leave) -> Cancel<A::Request> {
        self.locked(|s, wakes| {
            if let Some(r) = s.remove(id.0, why, wakes) {
                // Its owner collects this outcome (a thread blocked on it is woken).
                s.done.insert(id.0, Waited::Left(why));
                return Cancel::Removed(r);
            }
            match s.done.remove(&id.0) {
                Some(Waited::Started(g)) => {
                    s.give_back(g, wakes);
                    s.done.insert(id.0, Waited::Left(why));
                    Cancel::GaveBack
                }
                Some(left @ Waited::Left(_)) => {
                    s.done.insert(id.0, left);
                    Cancel::Unknown
                }
                None => Cancel::Unknown,
            }
        })
    }

    /// Ends waiter `id` for an owner that will not wait for it (a dropped future, an owner
    /// going away): removed if queued, its grant given back if it had started, its recorded
    /// outcome forgotten. Every waiter ends with exactly one of: its wait returning, or this.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(id)) = w.submit(1) else { panic!() };
    /// w.abandon(id);
    /// assert_eq!((w.queued(), w.uncollected()), (0, 0));
    /// ```
    pub fn abandon(&self, id: WaiterId) {
        self.locked(|s, wakes| {
            if s.remove(id.0, Leave::Cancelled, wakes).is_some() {
                return;
            }
            if let Some(Waited::Started(g)) = s.done.remove(&id.0) {
                s.give_back(g, wakes);
            }
        })
    }

    /// At a waiter's deadline: removes it with [`Leave::TimedOut`] if still queued; else
    /// returns the outcome it already has (a start that won the race is kept).
    fn time_out(&self, id: WaiterId) -> Waited<A::Grant> {
        self.locked(|s, wakes| {
            if s.remove(id.0, Leave::TimedOut, wakes).is_some() {
                return Waited::Left(Leave::TimedOut);
            }
            s.done
                .remove(&id.0)
                .unwrap_or(Waited::Left(Leave::Cancelled))
        })
    }

    /// Removes every queued waiter whose request matches `pred`, oldest first, each for
    /// `why` (e.g. [`Leave::TimedOut`] for the deadlines a scheduler found passed); returns
    /// their ids and requests in that order. Their waits end with `Waited::Left(why)`.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// for r in [1, 2, 3] { w.submit(r).unwrap(); }
    /// let gone = w.remove_where(|_, r| *r != 2, Leave::TimedOut);
    /// assert_eq!(gone.iter().map(|g| g.1).collect::<Vec<_>>(), vec![1, 3]);
    /// assert_eq!(w.queued(), 1);
    /// ```
    pub fn remove_where(
        &self,
        pred: impl FnMut(&A, &A::Request) -> bool,
        why: Leave,
    ) -> Vec<(WaiterId, A::Request)> {
        self.locked(|s, wakes| s.remove_where(pred, why, wakes))
    }

    /// Closes: later submits are refused with [`Refused::Closed`]; every queued waiter leaves
    /// with [`Leave::Closed`] (returned oldest first). Started grants are untouched. A second
    /// close returns nothing.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Refused, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.submit(1).unwrap();
    /// assert_eq!(w.close().len(), 1);
    /// assert_eq!(w.submit(2), Err(Refused::Closed));
    /// assert!(w.close().is_empty());
    /// ```
    pub fn close(&self) -> Vec<(WaiterId, A::Request)> {
        self.locked(|s, wakes| {
            s.closed = true;
            s.remove_where(|_, _| true, Leave::Closed, wakes)
        })
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.close();
    /// assert!(w.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        crate::sync::lock(&self.inner).closed
    }

    /// The number of queued waiters.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.submit(1).unwrap();
    /// assert_eq!(w.queued(), 1);
    /// ```
    pub fn queued(&self) -> usize {
        crate::sync::lock(&self.inner).queue.len()
    }

    /// The number of outcomes (started or left) not collected yet by their waiters. Zero at
    /// rest: a test checks that no path leaves one behind.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// assert_eq!(MultiWait::new(Never).uncollected(), 0);
    /// ```
    pub fn uncollected(&self) -> usize {
        crate::sync::lock(&self.inner).done.len()
    }

    /// The number of wakes this `MultiWait` has made (each started or removed waiter that was
    /// waiting is woken once; nobody else is).
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// assert_eq!(MultiWait::new(Never).wakes(), 0);
    /// ```
    pub fn wakes(&self) -> u64 {
        crate::sync::lock(&self.inner).wakes
    }

    /// Collects the outcome of waiter `id` if it has one. Else, if the registered notify
    /// passes `keep`, leaves it; else swaps in the one in `fresh` (which then holds the old
    /// one, for the caller to drop outside the mutex), or asks for one.
    fn poll_outcome(
        &self,
        id: WaiterId,
        fresh: &mut Option<Notify>,
        keep: impl FnOnce(&Notify) -> bool,
    ) -> Polled<A::Grant> {
        let mut g = crate::sync::lock(&self.inner);
        if let Some(w) = g.done.remove(&id.0) {
            return Polled::Done(w);
        }
        let Some(q) = g.queue.get_mut(&id.0) else {
            // Unknown id (or collected already): nothing will ever answer it.
            return Polled::Done(Waited::Left(Leave::Cancelled));
        };
        if keep(&q.notify) {
            return Polled::Registered;
        }
        match fresh {
            Some(n) => {
                std::mem::swap(&mut q.notify, n);
                Polled::Registered
            }
            None => Polled::NeedNotify,
        }
    }

    /// Blocks the calling thread until waiter `id` starts or leaves. With a `deadline`, a
    /// waiter still queued then is removed with [`Leave::TimedOut`] (a start that won the race
    /// is returned instead). An unknown id ends at once with `Left(Cancelled)`.
    ///
    /// # Cancel safety
    ///
    /// Blocking; the wait ends only with an outcome, which is the caller's to use.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start, Submitted, Waited};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(id)) = w.submit(1) else { panic!() };
    /// let past = std::time::Instant::now();
    /// assert_eq!(w.wait_blocking(id, Some(past)), Waited::Left(Leave::TimedOut));
    /// ```
    pub fn wait_blocking(&self, id: WaiterId, deadline: Option<Instant>) -> Waited<A::Grant> {
        loop {
            // The thread handle is taken outside the mutex; unpark is not user code, but a
            // handle registered once stays (keep).
            let mut me = Some(Notify::Thread(crate::sync::thread::current()));
            if let Polled::Done(w) =
                self.poll_outcome(id, &mut me, |n| matches!(n, Notify::Thread(_)))
            {
                return w;
            }
            drop(me);
            match deadline {
                None => crate::sync::thread::park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return self.time_out(id);
                    }
                    crate::sync::thread::park_timeout(d - now);
                }
            }
        }
    }
}
