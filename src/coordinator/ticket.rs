//! A submitted ticket ([`Ticket`]), its wait (blocking or [`TicketWait`]), and the running
//! invocation ([`Invocation`]) that holds the slots until the work completes.
//!
//! # Two words
//!
//! An invocation is a pointer to the coordinator's state and one word: its key's seat in the
//! running-key table, whose entry records everything else (ticket, provider, instants,
//! signal), and one bit saying whether the pointer is a reference of its own. A ticket started
//! at its submit *is* its invocation; a queued one is a box. So the uncontended path's values
//! (`Result<Ticket, _>`'s ticket, `Result<Invocation, AdmissionError>`) are two words, passed
//! in registers: nothing is copied through memory between submit, wait and completion (a
//! larger ticket was copied field by field and read back whole, and every such read stalled
//! on the store buffer).

use super::gates::{release_client, ClientBack};
use super::keys::{Running, Seat};
use super::state::{catch_up, Grant, State};
use super::{plan_wake, schedule_tick, AdmissionError, Shared, TicketId};
use crate::wait::cancel::CancelToken;
use crate::wait::multi::{Leave, MultiWait, Submitted, WaitFuture, Waited, WaiterId};
use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

/// An invocation's word: bit 0 says its pointer is a counted reference.
const COUNTED: u64 = 1;

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
pub struct Ticket<K: Hash + Eq + Clone + Send + 'static>(Repr<K>);

enum Repr<K: Hash + Eq + Clone + Send + 'static> {
    /// Started at its submit (dropping it completes the invocation).
    Started(Invocation<K>),
    /// Queued (dropping it leaves the queue).
    Queued(Box<Queued<K>>),
}

/// A queued ticket.
struct Queued<K: Hash + Eq + Clone + Send + 'static> {
    shared: Arc<Shared<K>>,
    id: TicketId,
    /// Its place in the wait (`None` once a wait took it over).
    waiter: Option<WaiterId>,
    received_at: SystemTime,
    attempt_timeout: Option<Duration>,
}

impl<K: Hash + Eq + Clone + Send + 'static> Ticket<K> {
    /// A ticket started at its submit.
    #[inline]
    pub(super) fn started(inv: Invocation<K>) -> Self {
        Ticket(Repr::Started(inv))
    }

    /// A queued ticket.
    pub(super) fn queued(
        shared: Arc<Shared<K>>,
        id: TicketId,
        waiter: WaiterId,
        received_at: SystemTime,
        attempt_timeout: Option<Duration>,
    ) -> Self {
        Ticket(Repr::Queued(Box::new(Queued {
            shared,
            id,
            waiter: Some(waiter),
            received_at,
            attempt_timeout,
        })))
    }

    /// Its id.
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert_eq!(c.submit("a", "k", SubmitOptions::default()).unwrap().id().get(), 0);
    /// ```
    pub fn id(&self) -> TicketId {
        match &self.0 {
            Repr::Started(inv) => inv.ticket(),
            Repr::Queued(q) => q.id,
        }
    }

    /// Whether it started at its submit (then it took no queue place).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.submit("a", "k", SubmitOptions::default()).unwrap().is_started());
    /// ```
    pub fn is_started(&self) -> bool {
        matches!(self.0, Repr::Started(_))
    }

    /// When it was received, on the wall clock (a stamp; no rule reads it).
    ///
    /// ```
    /// # use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
    /// # let c: Coordinator = Coordinator::builder().provider("a", ProviderLimits::default()).build().unwrap();
    /// assert!(c.submit("a", "k", SubmitOptions::default()).unwrap().received_at() > std::time::UNIX_EPOCH);
    /// ```
    pub fn received_at(&self) -> SystemTime {
        match &self.0 {
            Repr::Started(inv) => inv.received_at(),
            Repr::Queued(q) => q.received_at,
        }
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
        match &self.0 {
            Repr::Queued(q) if q.waiter.is_some() => q.cancel(),
            _ => false,
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
    pub fn wait_blocking(self) -> Result<Invocation<K>, AdmissionError> {
        match self.0 {
            Repr::Started(inv) => Ok(inv),
            Repr::Queued(mut q) => q.wait_blocking(),
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
    pub fn wait(self) -> TicketWait<K> {
        match self.0 {
            Repr::Started(inv) => TicketWait {
                queued: None,
                inner: WaitInner::Ready(Some(Ok(inv))),
            },
            Repr::Queued(mut q) => {
                let w = q.waiter.take().expect("a ticket is waited once");
                let inner = WaitInner::Queued(WaitFuture::new(WaitRef(q.shared.clone()), w));
                TicketWait {
                    queued: Some(q),
                    inner,
                }
            }
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Queued<K> {
    fn cancel(&self) -> bool {
        let now = self.shared.clocks.elapsed.elapsed();
        let (removed, wake) = self.shared.wait.transaction(|t| {
            catch_up(t, now);
            let removed = t.remove_where(|_, r| r.ticket == self.id, Leave::Cancelled);
            (!removed.is_empty(), plan_wake(t))
        });
        schedule_tick(&self.shared, wake);
        removed
    }

    fn wait_blocking(&mut self) -> Result<Invocation<K>, AdmissionError> {
        let w = self.waiter.take().expect("a ticket is waited once");
        let out = self.shared.wait.wait_blocking(w, None);
        self.outcome(out)
    }

    fn outcome(&self, w: Waited<Grant>) -> Result<Invocation<K>, AdmissionError> {
        match w {
            Waited::Started(g) => Ok(Invocation::counted(
                self.shared.clone(),
                g.seat,
                self.attempt_timeout,
            )),
            Waited::Left(Leave::TimedOut) => Err(AdmissionError::Timeout),
            Waited::Left(Leave::Closed) => Err(AdmissionError::Closed),
            Waited::Left(Leave::Cancelled) => Err(AdmissionError::Cancelled),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> Drop for Queued<K> {
    fn drop(&mut self) {
        // Dropped unwaited: it leaves the queue (or, started meanwhile, gives its grant back).
        if let Some(w) = self.waiter.take() {
            self.shared.wait.abandon(w);
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
    /// The queued ticket (its wait moved into `inner`); `None` for a started one.
    queued: Option<Box<Queued<K>>>,
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
                Poll::Ready(w) => Poll::Ready(
                    this.queued
                        .as_ref()
                        .expect("a queued wait keeps its ticket")
                        .outcome(w),
                ),
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
    /// The state, from `Arc::as_ptr`: a reference of its own when the word has `COUNTED`,
    /// else kept alive by the client slot this invocation holds (`Shared`, "Lifetime").
    shared: NonNull<Shared<K>>,
    /// `COUNTED`, and the key's seat ([`Seat::pack`]).
    word: u64,
    _owns: PhantomData<Arc<Shared<K>>>,
}

// SAFETY: an invocation is a way to reach a `Shared<K>`, like the `Arc` it stands for (its
// seat is a number); it is `Send`/`Sync` exactly when `Arc<Shared<K>>` is.
unsafe impl<K: Hash + Eq + Clone + Send + 'static> Send for Invocation<K> where Arc<Shared<K>>: Send {}
// SAFETY: as above.
unsafe impl<K: Hash + Eq + Clone + Send + 'static> Sync for Invocation<K> where Arc<Shared<K>>: Sync {}

impl<K: Hash + Eq + Clone + Send + 'static> Invocation<K> {
    /// The invocation of a start on the uncontended path: its client slot keeps the state
    /// alive (no reference count changes).
    ///
    /// # Safety
    ///
    /// The caller must hold a client slot of `shared`'s coordinator and hand it to this
    /// invocation, which gives it back when dropped, with the key and provider slot in
    /// `seat`.
    #[inline]
    pub(super) unsafe fn slot_held(shared: &Arc<Shared<K>>, seat: Seat) -> Self {
        // From `Arc::as_ptr`, not from a reference: the pointer must reach the whole `Arc`
        // allocation (its counts too), for [`arc`](Self::arc).
        let p = Arc::as_ptr(shared).cast_mut();
        Invocation {
            // SAFETY: an `Arc`'s pointer is never null.
            shared: unsafe { NonNull::new_unchecked(p) },
            word: seat.pack(),
            _owns: PhantomData,
        }
    }

    /// The invocation of a start on the queued path, holding `shared` as its reference;
    /// its attempt timeout armed.
    pub(super) fn counted(
        shared: Arc<Shared<K>>,
        seat: Seat,
        attempt_timeout: Option<Duration>,
    ) -> Self {
        let p = Arc::into_raw(shared).cast_mut();
        let inv = Invocation {
            // SAFETY: an `Arc`'s pointer is never null.
            shared: unsafe { NonNull::new_unchecked(p) },
            word: seat.pack() | COUNTED,
            _owns: PhantomData,
        };
        if let Some(d) = attempt_timeout {
            inv.arm_attempt_timeout(d);
        }
        inv
    }

    fn shared(&self) -> &Shared<K> {
        // SAFETY: the pointer came from an `Arc` of the state, which this invocation keeps
        // alive until it is dropped: by a reference of its own (`COUNTED`), or by the client
        // slot it holds (`slot_held`'s contract).
        unsafe { self.shared.as_ref() }
    }

    /// A new `Arc` of the state (called while the client slot is still held).
    fn arc(&self) -> Arc<Shared<K>> {
        let p = self.shared.as_ptr().cast_const();
        // SAFETY: the state is alive (see `shared`), and `p` came from an `Arc` of it:
        // adding a reference and making an `Arc` that owns it is sound.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    fn seat(&self) -> Seat {
        Seat::unpack(self.word)
    }

    /// Runs `f` on this invocation's entry in the key table.
    fn entry<R>(&self, f: impl FnOnce(&mut Running<K>) -> R) -> R {
        self.shared()
            .gates
            .keys
            .with(self.seat(), f)
            .expect("an invocation holds its seat")
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
        self.entry(|e| e.ticket)
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
        self.shared().gates.signal(self.seat())
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
        self.entry(|e| e.started_at)
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
        self.entry(|e| e.received_at)
    }

    /// Arms the attempt timeout of a start: it counts from the start, not from the submit (a
    /// start with an attempt timeout always read the clock). Out of line: most starts have
    /// none. If the scheduler (user code) panics, the caller's invocation is dropped, and
    /// its slots go back.
    #[cold]
    #[inline(never)]
    pub(super) fn arm_attempt_timeout(&self, d: Duration) {
        let signal = self.signal();
        if let Some(at) = self.started_at().and_then(|s| s.checked_add(d)) {
            self.shared()
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
        // Key and provider slot without the mutex, then the client slot while nobody waits;
        // else under the mutex, followed by the start rule (`gates` module docs).
        let gates = &*self.shared().gates;
        gates.give_back_fast(self.seat());
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
        drop(joint);
        if self.word & COUNTED != 0 {
            // SAFETY: `COUNTED` says the pointer came from `Arc::into_raw` and owns that
            // reference; this drop gives it up, once, after the last use above.
            drop(unsafe { Arc::from_raw(self.shared.as_ptr().cast_const()) });
        }
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
        let shared = self.arc();
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

/// What a submit made of its start: the ticket.
pub(super) fn submitted<K: Hash + Eq + Clone + Send + 'static>(
    shared: &Arc<Shared<K>>,
    id: TicketId,
    s: Submitted<Grant>,
    received_at: SystemTime,
    attempt_timeout: Option<Duration>,
) -> Ticket<K> {
    match s {
        Submitted::Started(g) => {
            Ticket::started(Invocation::counted(shared.clone(), g.seat, attempt_timeout))
        }
        Submitted::Queued(w) => Ticket::queued(shared.clone(), id, w, received_at, attempt_timeout),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// The uncontended path's values are two words (module docs, "Two words").
    #[test]
    fn a_ticket_and_an_invocation_are_two_words() {
        assert_eq!(size_of::<Invocation<String>>(), 16);
        assert_eq!(size_of::<Ticket<String>>(), 16);
        assert_eq!(size_of::<Result<Invocation<String>, AdmissionError>>(), 16);
    }
}
