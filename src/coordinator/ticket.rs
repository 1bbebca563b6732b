//! A submitted ticket ([`Ticket`]), its wait (blocking or [`TicketWait`]), and the running
//! invocation ([`Invocation`]) that holds the slots until the work completes.

use super::gates::{release_client, ClientBack};
use super::state::{catch_up, Grant, State};
use super::{plan_wake, schedule_tick, AdmissionError, Shared, TicketId};
use crate::wait::cancel::CancelToken;
use crate::wait::multi::{Leave, MultiWait, Submitted, WaitFuture, Waited, WaiterId};
use std::future::Future;
use std::hash::Hash;
use std::ops::Deref;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

/// How a ticket or invocation holds the coordinator's state (`Shared`, "Lifetime").
pub(crate) enum Owner<K: Hash + Eq + Clone> {
    /// A reference of its own.
    Counted(Arc<Shared<K>>),
    /// Kept alive by the client slot its holder holds (started on the uncontended path).
    Slot(NonNull<Shared<K>>),
}

// SAFETY: an `Owner` is a way to reach a `Shared<K>`, like the `Arc` it stands for; it is
// `Send`/`Sync` exactly when `Arc<Shared<K>>` is.
unsafe impl<K: Hash + Eq + Clone> Send for Owner<K> where Arc<Shared<K>>: Send {}
// SAFETY: as above.
unsafe impl<K: Hash + Eq + Clone> Sync for Owner<K> where Arc<Shared<K>>: Sync {}

impl<K: Hash + Eq + Clone> Owner<K> {
    /// A slot-held pointer to `shared`.
    ///
    /// # Safety
    ///
    /// The holder must hold a client slot of `shared`'s coordinator from now until it gives
    /// it back, and must not reach the state through this owner after that.
    pub(crate) unsafe fn slot(shared: &Arc<Shared<K>>) -> Self {
        // From `Arc::as_ptr`, not from a reference: the pointer must reach the whole `Arc`
        // allocation (its counts too), for [`counted`](Self::counted).
        let p = Arc::as_ptr(shared).cast_mut();
        // SAFETY: an `Arc`'s pointer is never null.
        Owner::Slot(unsafe { NonNull::new_unchecked(p) })
    }

    /// An `Arc` of the state (a new reference for a slot-held pointer; called while the
    /// slot is still held).
    fn counted(&self) -> Arc<Shared<K>> {
        match self {
            Owner::Counted(a) => a.clone(),
            Owner::Slot(p) => {
                let p = p.as_ptr().cast_const();
                // SAFETY: the slot is still held, so the joint `Arc` is alive (`Shared`,
                // "Lifetime") and `p` came from an `Arc` of it: adding a reference and making
                // an `Arc` that owns it is sound.
                unsafe {
                    Arc::increment_strong_count(p);
                    Arc::from_raw(p)
                }
            }
        }
    }
}

impl<K: Hash + Eq + Clone> Deref for Owner<K> {
    type Target = Shared<K>;
    fn deref(&self) -> &Shared<K> {
        match self {
            Owner::Counted(a) => a,
            // SAFETY: a slot-held pointer is only reached while its holder holds its client
            // slot (`Owner::slot`'s contract), which keeps the state alive.
            Owner::Slot(p) => unsafe { p.as_ref() },
        }
    }
}

enum Place<K> {
    Started(Grant<K>),
    Queued(WaiterId),
}

/// A submitted ticket: started already, or queued. Wait for it with
/// [`wait_blocking`](Ticket::wait_blocking) or [`wait`](Ticket::wait); dropping it unwaited
/// gives everything back (a queued ticket leaves the queue; a started one completes).
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let t = c.submit("a", "k", SubmitOptions::default()).unwrap();
/// assert!(t.is_started());
/// drop(t);
/// assert_eq!(c.snapshot().client_in_flight, 0);
/// ```
pub struct Ticket<K: Hash + Eq + Clone + Send + 'static> {
    /// The coordinator; moved into the invocation when the ticket starts (`None` after).
    shared: Option<Owner<K>>,
    id: TicketId,
    place: Option<Place<K>>,
    received_at: SystemTime,
    attempt_timeout: Option<Duration>,
}

impl<K: Hash + Eq + Clone + Send + 'static> Ticket<K> {
    pub(super) fn new(
        shared: Owner<K>,
        id: TicketId,
        s: Submitted<Grant<K>>,
        received_at: SystemTime,
        attempt_timeout: Option<Duration>,
    ) -> Self {
        let place = Some(match s {
            Submitted::Started(g) => Place::Started(g),
            Submitted::Queued(w) => Place::Queued(w),
        });
        Ticket {
            shared: Some(shared),
            id,
            place,
            received_at,
            attempt_timeout,
        }
    }

    /// Its id.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert_eq!(c.submit("a", "k", SubmitOptions::default()).unwrap().id().get(), 0);
    /// ```
    pub fn id(&self) -> TicketId {
        self.id
    }

    /// Whether it started at its submit (then it took no queue place).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.submit("a", "k", SubmitOptions::default()).unwrap().is_started());
    /// ```
    pub fn is_started(&self) -> bool {
        matches!(self.place, Some(Place::Started(_)))
    }

    /// When it was received, on the wall clock (a stamp; no rule reads it).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.submit("a", "k", SubmitOptions::default()).unwrap().received_at() > std::time::UNIX_EPOCH);
    /// ```
    pub fn received_at(&self) -> SystemTime {
        self.received_at
    }

    /// Cancels a queued ticket (it leaves the queue; its wait ends with
    /// [`AdmissionError::Cancelled`]). Returns whether it was queued; a ticket that already
    /// started is not affected (cancel its [`Invocation::signal`] instead).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{AdmissionError, Coordinator, ProviderLimits, SubmitOptions};
    /// let c: Coordinator = Coordinator::builder().queue_cap(1).provider("a", ProviderLimits::default()).build().unwrap();
    /// let _running = c.submit("a", "k", SubmitOptions::default()).unwrap();
    /// let queued = c.submit("a", "k", SubmitOptions::default()).unwrap();
    /// assert!(queued.cancel());
    /// assert_eq!(queued.wait_blocking().err(), Some(AdmissionError::Cancelled));
    /// ```
    pub fn cancel(&self) -> bool {
        match self.place {
            Some(Place::Queued(w)) => {
                let now = self.shared().clocks.elapsed.elapsed();
                let (removed, wake) = self.shared().wait.transaction(|t| {
                    catch_up(t, now);
                    let removed = t.remove_where(|_, r| r.ticket == self.id, Leave::Cancelled);
                    (!removed.is_empty(), plan_wake(t))
                });
                schedule_tick(&self.shared().counted(), wake);
                let _ = w;
                removed
            }
            _ => false,
        }
    }

    fn shared(&self) -> &Owner<K> {
        self.shared.as_ref().expect("held until the ticket starts")
    }

    /// The invocation of a start: the ticket's handle on the coordinator moves into it (no
    /// reference count changes hands).
    ///
    /// The invocation holds the slots from here: if arming its attempt timeout panics
    /// (the scheduler is user code), its drop gives them back.
    #[inline]
    fn invocation(&mut self, g: Grant<K>) -> Invocation<K> {
        let inv = self.invocation_no_timer(g);
        if let Some(d) = self.attempt_timeout {
            inv.arm_attempt_timeout(d);
        }
        inv
    }

    /// The invocation of a start, without arming its attempt timeout (a started ticket
    /// dropped unwaited completes at once).
    #[inline]
    fn invocation_no_timer(&mut self, g: Grant<K>) -> Invocation<K> {
        Invocation {
            shared: self.shared.take().expect("held until the ticket starts"),
            grant: Some(g),
            received_at: self.received_at,
        }
    }

    fn outcome(&mut self, w: Waited<Grant<K>>) -> Result<Invocation<K>, AdmissionError> {
        match w {
            Waited::Started(g) => Ok(self.invocation(g)),
            Waited::Left(Leave::TimedOut) => Err(AdmissionError::Timeout),
            Waited::Left(Leave::Closed) => Err(AdmissionError::Closed),
            Waited::Left(Leave::Cancelled) => Err(AdmissionError::Cancelled),
        }
    }

    /// Blocks until the ticket starts (its [`Invocation`]) or leaves the queue (timeout,
    /// close, cancel). Admission timeouts fire from the coordinator's scheduler.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
    /// inv.complete();
    /// ```
    #[inline]
    pub fn wait_blocking(mut self) -> Result<Invocation<K>, AdmissionError> {
        match self.place.take().expect("a ticket is waited once") {
            Place::Started(g) => {
                let inv = self.invocation(g);
                // The ticket holds nothing now (its handle moved into the invocation, its
                // place was taken): no drop to run.
                std::mem::forget(self);
                Ok(inv)
            }
            Place::Queued(w) => {
                let out = self.shared().wait.wait_blocking(w, None);
                self.outcome(out)
            }
        }
    }

    /// Waits asynchronously (any runtime). Dropping the future cancels the ticket; if it had
    /// started, its slots go back.
    ///
    /// # Cancel safety
    ///
    /// Dropping it loses nothing: the ticket leaves the queue, or its grant is given back.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let t = c.submit("a", "k", SubmitOptions::default()).unwrap();
    /// let inv = futures_lite::future::block_on(t.wait()).unwrap();
    /// inv.complete();
    /// ```
    pub fn wait(mut self) -> TicketWait<K> {
        let inner = match self.place.take().expect("a ticket is waited once") {
            Place::Started(g) => WaitInner::Ready(Some(Ok(self.invocation(g)))),
            Place::Queued(w) => {
                WaitInner::Queued(WaitFuture::new(WaitRef(self.shared().counted()), w))
            }
        };
        TicketWait {
            ticket: self,
            inner,
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Drop for Ticket<K> {
    #[inline]
    fn drop(&mut self) {
        if self.place.is_some() {
            self.give_up();
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Ticket<K> {
    /// A ticket dropped unwaited (its `Drop`): a started one completes, a queued one leaves
    /// the queue.
    #[cold]
    #[inline(never)]
    fn give_up(&mut self) {
        match self.place.take() {
            None => {}
            Some(Place::Started(g)) => drop(self.invocation_no_timer(g)),
            Some(Place::Queued(w)) => self.shared().wait.abandon(w),
        }
    }
}

/// A pointer to the coordinator's wait, for [`WaitFuture`].
pub(crate) struct WaitRef<K: Hash + Eq + Clone>(Arc<Shared<K>>);

impl<K: Hash + Eq + Clone> Deref for WaitRef<K> {
    type Target = MultiWait<State<K>>;
    fn deref(&self) -> &Self::Target {
        &self.0.wait
    }
}

enum WaitInner<K: Hash + Eq + Clone + Send + 'static> {
    Ready(Option<Result<Invocation<K>, AdmissionError>>),
    Queued(WaitFuture<State<K>, WaitRef<K>>),
}

/// The future of [`Ticket::wait`].
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let f = c.submit("a", "k", SubmitOptions::default()).unwrap().wait();
/// assert!(futures_lite::future::block_on(f).is_ok());
/// ```
pub struct TicketWait<K: Hash + Eq + Clone + Send + 'static> {
    ticket: Ticket<K>,
    inner: WaitInner<K>,
}

impl<K: Hash + Eq + Clone + Send + 'static> Unpin for TicketWait<K> {}

impl<K: Hash + Eq + Clone + Send + 'static> Future for TicketWait<K> {
    type Output = Result<Invocation<K>, AdmissionError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.inner {
            WaitInner::Ready(r) => Poll::Ready(r.take().expect("polled after completion")),
            WaitInner::Queued(f) => match Pin::new(f).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(w) => Poll::Ready(this.ticket.outcome(w)),
            },
        }
    }
}

/// A running invocation: it holds its client slot, provider slot and key until it
/// completes ([`complete`](Invocation::complete) or drop: the promise's `finally`).
/// Cancelling its [`signal`](Invocation::signal) (unsubscribe, close, attempt timeout) does
/// not release them: the work must end first.
///
/// ```
/// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
/// let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
/// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
/// inv.signal().cancel(); // unsubscribe: the slot stays held
/// assert_eq!(c.snapshot().client_in_flight, 1);
/// inv.complete();
/// assert_eq!(c.snapshot().client_in_flight, 0);
/// ```
pub struct Invocation<K: Hash + Eq + Clone + Send + 'static> {
    shared: Owner<K>,
    grant: Option<Grant<K>>,
    received_at: SystemTime,
}

impl<K: Hash + Eq + Clone + Send + 'static> Invocation<K> {
    fn grant(&self) -> &Grant<K> {
        self.grant.as_ref().expect("held until drop")
    }

    /// Its ticket.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
    /// assert_eq!(inv.ticket().get(), 0);
    /// ```
    pub fn ticket(&self) -> TicketId {
        self.grant().ticket
    }

    /// Its fresh cancellation signal (one per invocation; every call returns a handle to
    /// the same one), cancelled by close, by the attempt timeout, or by the caller
    /// (unsubscribe). It is made on the first call (an invocation nobody asks about costs no
    /// allocation); one made after the coordinator closed is cancelled already.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
    /// assert!(!inv.signal().is_cancelled());
    /// inv.signal().cancel();
    /// assert!(inv.signal().is_cancelled());
    /// ```
    pub fn signal(&self) -> CancelToken {
        let g = self.grant();
        self.shared.gates.signal(g.home, &g.key, g.ticket)
    }

    /// The monotonic instant it started (the attempt timeout counts from here), when the
    /// coordinator read its clock for the start: always for a ticket that waited in the
    /// queue, for a ticket with an attempt timeout, for a provider with pacing or a cooldown
    /// on record, and with events recorded. An uncontended start that needed none of these
    /// reads no clock and has `None`.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let o = SubmitOptions { attempt_timeout: Some(std::time::Duration::from_secs(9)), ..Default::default() };
    /// let inv = c.submit("a", "k", o).unwrap().wait_blocking().unwrap();
    /// assert!(inv.started_at().is_some());
    /// ```
    pub fn started_at(&self) -> Option<Duration> {
        self.grant().started_at
    }

    /// When its ticket was received, on the wall clock.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// let inv = c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap();
    /// assert!(inv.received_at() > std::time::UNIX_EPOCH);
    /// ```
    pub fn received_at(&self) -> SystemTime {
        self.received_at
    }

    /// Arms the attempt timeout of a start: it counts from the start, not from the submit (a
    /// start with an attempt timeout always read the clock). Out of line: most starts have
    /// none.
    #[cold]
    #[inline(never)]
    fn arm_attempt_timeout(&self, d: Duration) {
        let g = self.grant();
        let signal = self.shared.gates.signal(g.home, &g.key, g.ticket);
        if let Some(at) = g.started_at.and_then(|s| s.checked_add(d)) {
            self.shared
                .clocks
                .scheduler
                .schedule(at, Box::new(move || signal.cancel()));
        }
    }

    /// The work ended: its slots and key go back, and the queued tickets that this makes
    /// eligible start inside this call (the same as dropping it).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// c.submit("a", "k", SubmitOptions::default()).unwrap().wait_blocking().unwrap().complete();
    /// assert_eq!(c.snapshot().client_in_flight, 0);
    /// ```
    pub fn complete(self) {
        drop(self)
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Drop for Invocation<K> {
    #[inline]
    fn drop(&mut self) {
        // The grant stays in place (its key is dropped with the invocation's fields, after
        // this): no copy of it is made.
        let Some(g) = &self.grant else { return };
        // Key and provider slot without the mutex, then the client slot while nobody waits;
        // else under the mutex, followed by the start rule (`gates` module docs).
        let gates = &*self.shared.gates;
        let signal = gates.give_back_fast(g.provider, g.home, &g.key, g.ticket);
        // The last RMW: from here another thread may free the state (a slot-held pointer may
        // dangle), so nothing touches it again unless this was the last owner, whose joint
        // reference keeps it until dropped last, or somebody waits (the slot is still held).
        let joint = match release_client(gates.client_word()) {
            ClientBack::Given => None,
            ClientBack::Last => gates.take_joint(),
            ClientBack::Waiters => {
                self.release_queued();
                None
            }
        };
        drop((signal, joint));
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Invocation<K> {
    /// The completion while somebody waits (its key and provider slot went back already):
    /// the client slot goes back under the mutex, followed by the start rule. Out of line,
    /// so the uncontended completion stays small.
    #[cold]
    #[inline(never)]
    fn release_queued(&mut self) {
        // An `Arc` of its own before the slot goes back under the mutex (`Shared`,
        // "Lifetime"): the mutex and the scheduler are reached after.
        let shared = self.shared.counted();
        let clock = &shared.clocks.elapsed;
        let (joint, wake) = shared.wait.transaction(|t| {
            let joint = t.state().client_back();
            // With nobody queued there is no deadline or ready time to settle, and every other
            // operation catches up before it reads the state: the clock read is skipped.
            if t.queued() > 0 {
                catch_up(t, clock.elapsed());
            }
            // The start rule runs as the transaction ends; its wake plan must see those
            // starts, so run it here first.
            t.start_eligible();
            (joint, plan_wake(t))
        });
        // The joint reference is dropped after the mutex.
        drop(joint);
        schedule_tick(&shared, wake);
    }
}
