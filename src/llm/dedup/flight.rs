//! One de-duplicated flight: its shared state, its waker, and the [`DedupRun`] future of the
//! leader and of each follower.
//!
//! A flight is **one allocation**: the state every participant shares and, beside it, the work
//! itself (not boxed), behind a trait object ([`Flight`]) so that the map and the participants
//! need not know the work's type. The work is polled in place: whoever *claims* it (turns
//! [`POLLING`] on in the flight's [`Head::flags`] while neither it nor [`DONE`] is on) is the
//! only one to touch it until it gives the claim back, and whoever turns `DONE` on while
//! nobody polls (the poller that saw it finish or panic, or the last participant to leave) is
//! the only one to drop it, in place, outside the lock.
//!
//! # The claim word
//!
//! `POLLING`, `DONE` and `WOKEN` live in one atomic word beside the state's mutex, so that a
//! participant with nothing else to check (a leader, or a follower with neither a timeout nor
//! a cancellation token) claims the work with **one compare-and-swap**, not a lock and an
//! unlock: a leader whose work completes on its first poll never takes the flight's lock. The
//! rules that keep the word and the mutex consistent:
//!
//! * The only change made **outside** the state lock is that claim: a compare-and-swap from a
//!   value with neither `POLLING` nor `DONE` (`WOKEN` or nothing) to `POLLING` alone. It is
//!   `Acquire`, and every give-back of the claim is `Release`, so the claimant's accesses to
//!   the work happen after the previous claimant's.
//! * Every other change is made **under** the state lock: giving the claim back (by its
//!   holder), turning `DONE` on (by the claimant, or by the last participant, which holds no
//!   claim), `WOKEN` (by a wake). A claim under the lock is the same compare-and-swap; if it
//!   fails, the only change that can have come between is another participant's claim, so the
//!   participant waits as it would have had it seen `POLLING` (the claimant wakes everyone
//!   when it stops, or the work's wake does).
//! * While `POLLING` is on, nothing outside the lock can change the word (a claim needs it
//!   off), so its holder may rewrite it under the lock; while `DONE` is on, nothing changes it
//!   but a wake's `WOKEN`, which nobody reads any more.

use super::*;
use crate::sync::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::task::{RawWaker, RawWakerVTable};

/// The claim word's bits (module docs): a participant polls the work.
pub(in crate::llm) const POLLING: u32 = 1;
/// The flight is settled (completed, panicked, or left by everyone): nobody polls it again.
pub(in crate::llm) const DONE: u32 = 2;
/// The flight was woken since the work was last claimed: the claimant, which registers its
/// own waker only after its poll returned `Pending`, wakes itself instead.
pub(in crate::llm) const WOKEN: u32 = 4;

/// What every participant of a flight shares, whatever its work's type.
pub(in crate::llm) struct Head<T> {
    /// The flight's reference count ([`Flight`]s and the work's wakers; `super::refs`).
    pub(in crate::llm) refs: AtomicUsize,
    /// [`POLLING`], [`DONE`], [`WOKEN`] (module docs: who changes them, and under which lock).
    pub(in crate::llm) flags: AtomicU32,
    /// The rest of the shared state.
    pub(in crate::llm) st: Mutex<FlightState<T>>,
}

/// A flight's operations, whatever its work's type.
pub(in crate::llm) trait Shared<T>: Send + Sync {
    /// The claim word and the state every participant shares.
    fn head(&self) -> &Head<T>;
    /// The state every participant shares.
    fn st(&self) -> &Mutex<FlightState<T>> {
        &self.head().st
    }
    /// Polls the work once, with the flight as its waker, catching a panic. The caller holds
    /// the claim (it turned [`POLLING`] on, the flight not being [`DONE`]).
    ///
    /// # Safety
    /// `this` is [`Flight::as_ptr`] of a live [`Flight`] whose value is `self`, cast to
    /// `*const ()`: the waker is made from it, and a pointer derived from `&self` would not
    /// carry the allocation's provenance, which a waker's clone may free through (Miri's
    /// Stacked Borrows refuses that).
    unsafe fn poll_work(&self, this: *const ()) -> std::thread::Result<Poll<T>>;
    /// Drops the work in place. The caller turned [`DONE`] on while nobody else polled, or
    /// holds the claim of a flight nobody else can reach any more (so nobody will touch the
    /// work again).
    fn drop_work(&self);
}

/// The one allocation of a flight: its state and its work `F`, made only inside a `Box`
/// ([`new_flight`]) and freed by its last counted reference (`super::refs`).
struct FlightCell<T, F> {
    head: Head<T>,
    /// The work, polled in place by the claimant; `None` once dropped.
    work: UnsafeCell<Option<F>>,
}

// SAFETY: the state is behind a mutex (`Sync` for `T: Send`) and the claim word is atomic;
// the work is touched by one thread at a time only (the claimant, or the one that turned
// `DONE` on, each decided by the claim word, whose `Acquire` claims and `Release` give-backs,
// or the state lock, order their accesses), so sharing the cell shares `F` the way a
// `Mutex<F>` would: `F: Send` suffices.
unsafe impl<T: Send, F: Send> Sync for FlightCell<T, F> {}

/// A new flight leading with `work`, with one participant (its leader).
pub(in crate::llm) fn new_flight<T, F>(work: F) -> Flight<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    // Written into its allocation field by field, the work moved once, from the argument to
    // its place (`Box::new`, or writing a whole `FlightCell`, builds it on the stack first
    // and copies it: a large work is copied twice).
    let mut cell = Box::<FlightCell<T, F>>::new_uninit();
    let place = cell.as_mut_ptr();
    // SAFETY: `place` points at the new allocation, sized and aligned for a
    // `FlightCell<T, F>`, and `cell` is its only reference: each field is written once,
    // without reading or dropping what was there, and both are written before
    // `assume_init`.
    let cell: Box<dyn Shared<T>> = unsafe {
        (&raw mut (*place).head).write(Head {
            refs: AtomicUsize::new(1),
            flags: AtomicU32::new(0),
            st: Mutex::new(FlightState {
                leader_present: true,
                leader_result: None,
                followers: Vec::new(),
                participants: 1,
                wakers: Wakers::default(),
            }),
        });
        (&raw mut (*place).work).write(UnsafeCell::new(Some(work)));
        cell.assume_init()
    };
    // SAFETY: the pointer is `Box::leak` of a new flight whose count is one (`Box::from_raw`
    // may take it back: `Box::leak`'s docs), and the returned reference owns that count.
    unsafe { Flight::adopt(NonNull::from(Box::leak(cell))) }
}

impl<T, F> Shared<T> for FlightCell<T, F>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    fn head(&self) -> &Head<T> {
        &self.head
    }

    unsafe fn poll_work(&self, this: *const ()) -> std::thread::Result<Poll<T>> {
        // The flight as the work's waker, without a reference count of its own: the caller's
        // `Flight` outlives this call. A work that keeps the waker clones it, and the clone
        // counts.
        // SAFETY: by the caller's contract `this` is the address of the live flight whose
        // value is `self`, a `FlightCell<T, F>`, with the allocation's provenance: what
        // `VTABLE`'s functions require. The waker is never dropped (`ManuallyDrop`), so the
        // count it did not take is never given back, and it is used only for this poll, while
        // the caller's reference lives.
        let waker =
            ManuallyDrop::new(unsafe { Waker::from_raw(RawWaker::new(this, &Self::VTABLE)) });
        let mut cx = Context::from_waker(&waker);
        catch_unwind(AssertUnwindSafe(|| {
            self.work.with_mut(|w| {
                // SAFETY: the caller holds the claim, so nothing else touches the work (module
                // docs), and `w` points into this live allocation.
                match unsafe { &mut *w } {
                    // SAFETY: the work never moves: it stays in this allocation until it is
                    // dropped in place (`drop_work`, or the allocation's own drop).
                    Some(f) => unsafe { Pin::new_unchecked(f) }.poll(&mut cx),
                    None => unreachable!("a flight that is not done has its work"),
                }
            })
        }))
    }

    fn drop_work(&self) {
        // SAFETY: the caller turned `DONE` on while nobody else polled (or holds the claim of
        // a flight nobody else can reach), so nobody claims the work again: this is the only
        // access left (module docs). Dropped where it lies (not moved out first: a large
        // future would be copied only to be dropped).
        self.work.with_mut(|w| unsafe { *w = None });
    }
}

/// The flight as a waker: the data pointer is the flight's address (with the allocation's
/// provenance) and holds one count, given back by `drop` and `wake`.
impl<T, F> FlightCell<T, F>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    const VTABLE: RawWakerVTable = RawWakerVTable::new(
        Self::waker_clone,
        Self::waker_wake,
        Self::waker_wake_by_ref,
        Self::waker_drop,
    );

    /// # Safety (all four)
    /// `p` is the address of a live `FlightCell<T, F>` made by `new_flight`, with its
    /// allocation's provenance, and (for `wake` and `drop`) the waker owns a count on it.
    unsafe fn waker_clone(p: *const ()) -> RawWaker {
        // SAFETY: live, by the contract above; the new waker owns the count taken here.
        retain(&unsafe { &*p.cast::<Self>() }.head);
        RawWaker::new(p, &Self::VTABLE)
    }

    unsafe fn waker_wake(p: *const ()) {
        // SAFETY: the contract above.
        unsafe {
            Self::waker_wake_by_ref(p);
            Self::waker_drop(p);
        }
    }

    unsafe fn waker_wake_by_ref(p: *const ()) {
        // SAFETY: live, by the contract above.
        wake_all(&unsafe { &*p.cast::<Self>() }.head);
    }

    unsafe fn waker_drop(p: *const ()) {
        // SAFETY: live, by the contract above; the reference is not used after `release`.
        if release(&unsafe { &*p.cast::<Self>() }.head) {
            // SAFETY: that was the last count, so nothing else refers to the flight; `p` is
            // its address with the allocation's provenance (`Box::leak`, `new_flight`).
            drop(unsafe { Box::from_raw(p.cast::<Self>().cast_mut()) });
        }
    }
}

/// A flight's state under its mutex (the claim word is beside it, [`Head`]).
pub(in crate::llm) struct FlightState<T> {
    pub(in crate::llm) leader_present: bool,
    /// The original result, for the leader.
    pub(in crate::llm) leader_result: Option<T>,
    /// Each follower's share, by follower id (its index; a solo leader allocates nothing).
    pub(in crate::llm) followers: Vec<Share<T>>,
    pub(in crate::llm) participants: usize,
    /// The participants' wakers, under the same lock as the state they wait on (one lock per
    /// poll, not two). Never woken with the lock held.
    pub(in crate::llm) wakers: Wakers,
}

/// A follower's place in a flight.
pub(in crate::llm) enum Share<T> {
    /// It left (or took its share, or the call panicked): nothing is made for it.
    Gone,
    /// It waits for the call.
    Waiting,
    /// Its share (`Err` if sharing panicked).
    Ready(Result<T, DedupError>),
}

impl<T> FlightState<T> {
    /// Follower `id` leaves: no share is made for it, and one made is dropped.
    pub(in crate::llm) fn forget(&mut self, id: usize) {
        if let Some(s) = self.followers.get_mut(id) {
            *s = Share::Gone;
        }
    }
}

/// The participants' wakers (the first inline: a flight usually has one participant).
#[derive(Default)]
pub(in crate::llm) struct Wakers {
    pub(in crate::llm) first: Option<Waker>,
    pub(in crate::llm) rest: Vec<Waker>,
}

impl Wakers {
    pub(in crate::llm) fn register(&mut self, w: &Waker) {
        match &self.first {
            Some(f) if f.will_wake(w) => {}
            Some(_) => {
                if !self.rest.iter().any(|x| x.will_wake(w)) {
                    self.rest.push(w.clone());
                }
            }
            None => self.first = Some(w.clone()),
        }
    }

    pub(in crate::llm) fn wake(self) {
        if let Some(w) = self.first {
            w.wake();
        }
        for w in self.rest {
            w.wake();
        }
    }
}

/// Wakes every registered participant of the flight whose head is `head` (outside the lock).
pub(in crate::llm) fn wake_all<T>(head: &Head<T>) {
    let wakers = {
        let mut st = lock(&head.st);
        // A read-modify-write, not a store: a claim outside the lock may race with it (module
        // docs). Relaxed: the claimant reads `WOKEN` under this same lock.
        head.flags.fetch_or(WOKEN, Ordering::Relaxed);
        std::mem::take(&mut st.wakers)
    };
    wakers.wake();
}

pub(in crate::llm) enum Role<T> {
    Solo(Option<Work<T>>),
    Leader {
        key: u128,
        flight: Flight<T>,
    },
    Follower {
        key: u128,
        flight: Flight<T>,
        id: usize,
    },
    Finished,
}

/// The future of [`Dedup::run`]: the caller's result, or (followers only) why it has none.
///
/// # Panics
/// If polled again after it returned `Ready` (the `Future` contract forbids it).
///
/// # Cancel safety
/// Dropping it leaves the flight; the shared call goes on while any participant remains.
///
/// ```
/// use llm_bulkhead::llm::{Dedup, FollowerOptions};
/// let d: Dedup<u8> = Dedup::new(8);
/// let f = d.run(None, FollowerOptions::default(), || async { 1 });
/// assert_eq!(futures_lite::future::block_on(f), Ok(1));
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct DedupRun<T> {
    pub(in crate::llm) inner: Arc<Inner<T>>,
    pub(in crate::llm) role: Role<T>,
    pub(in crate::llm) timeout: Option<Duration>,
    pub(in crate::llm) deadline: Option<Instant>,
    pub(in crate::llm) timer: Option<u64>,
    /// A follower's registration with its own cancellation token.
    pub(in crate::llm) cancel: Option<CancelWake>,
}

impl<T> std::fmt::Debug for DedupRun<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Solo(_) => "solo",
            Role::Leader { .. } => "leader",
            Role::Follower { .. } => "follower",
            Role::Finished => "finished",
        };
        f.debug_struct("DedupRun")
            .field("role", &role)
            .finish_non_exhaustive()
    }
}

// The state is only touched through `&mut self` or under the flight's mutex; nothing is
// structurally pinned (the work lives in the flight's allocation, or boxed for a solo call),
// so the future may move.
impl<T> Unpin for DedupRun<T> {}

impl<T> Dedup<T> {
    /// Counts a follower that got a result it could not use (the type-erased map of
    /// `LlmBulkhead::run_shared_with`, whose share function declined).
    pub(in crate::llm) fn count_unshareable(&self) {
        self.inner.unshareable.fetch_add(1, Ordering::Relaxed);
    }
}

impl<T> DedupRun<T> {
    pub(in crate::llm) fn solo(inner: Arc<Inner<T>>, work: Work<T>) -> DedupRun<T> {
        DedupRun {
            inner,
            role: Role::Solo(Some(work)),
            timeout: None,
            deadline: None,
            timer: None,
            cancel: None,
        }
    }

    /// Whether this call leads a flight (it runs the work), follows one, or runs on its own.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Dedup, DedupKey, FollowerOptions};
    /// let d: Dedup<u8> = Dedup::new(8);
    /// let k = DedupKey::of_bytes(b"k");
    /// let a = d.run(k, FollowerOptions::default(), || async { 1 });
    /// let b = d.run(k, FollowerOptions::default(), || async { 2 });
    /// assert!(a.is_leader() && b.is_follower());
    /// ```
    #[must_use]
    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader { .. })
    }

    /// Whether this call joined a flight in progress.
    ///
    /// ```
    /// use llm_bulkhead::llm::{Dedup, FollowerOptions};
    /// let d: Dedup<u8> = Dedup::new(8);
    /// assert!(!d.run(None, FollowerOptions::default(), || async { 1 }).is_follower());
    /// ```
    #[must_use]
    pub fn is_follower(&self) -> bool {
        matches!(self.role, Role::Follower { .. })
    }
}

impl<T: Send + 'static> Future for DedupRun<T> {
    type Output = Result<T, DedupError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.role {
            Role::Solo(work) => {
                let w = work.as_mut().expect("DedupRun polled after completion");
                let out = w.as_mut().poll(cx);
                if out.is_ready() {
                    this.role = Role::Finished;
                }
                out.map(Ok)
            }
            Role::Leader { .. } | Role::Follower { .. } => this.poll_flight(cx),
            Role::Finished => panic!("DedupRun polled after completion"),
        }
    }
}

/// A finished flight's result for the leader (`follower: None`) or a follower.
pub(in crate::llm) fn take_result<T>(
    st: &mut FlightState<T>,
    follower: Option<usize>,
) -> Result<T, DedupError> {
    match follower {
        None => Ok(st.leader_result.take().expect("the leader's result")),
        Some(id) => match st
            .followers
            .get_mut(id)
            .map(|s| std::mem::replace(s, Share::Gone))
        {
            Some(Share::Ready(r)) => r,
            _ => panic!("a share for every follower"),
        },
    }
}

impl<T: Send + 'static> DedupRun<T> {
    fn poll_flight(&mut self, cx: &mut Context<'_>) -> Poll<Result<T, DedupError>> {
        // The role is taken out (no reference-count traffic on the flight) and put back on
        // every `Pending`; nothing between can unwind (the work and the share functions run
        // under `catch_unwind`), and a `Ready` leaves it `Finished`.
        let (flight, key, follower) = match std::mem::replace(&mut self.role, Role::Finished) {
            Role::Leader { flight, key } => (flight, key, None),
            Role::Follower { flight, key, id } => (flight, key, Some(id)),
            _ => unreachable!("poll_flight is called for leaders and followers"),
        };
        let pending = |this: &mut Self, flight: Flight<T>| {
            this.role = match follower {
                None => Role::Leader { flight, key },
                Some(id) => Role::Follower { flight, key, id },
            };
            Poll::Pending
        };
        let flags = &flight.head().flags;
        // The claim without the lock (module docs, "The claim word"), for a participant with
        // nothing to check under it (a leader, or a follower with neither a timeout nor a
        // cancellation token): one compare-and-swap from a flight that nobody polls and that
        // is not done. A `WOKEN` it clears is a wake this poll sees. Acquire: the previous
        // claimant's accesses to the work (given back with `Release`) come before this one's.
        // A failure (the flight is claimed or done, or a wake came between) takes the lock.
        let claimed = self.cancel.is_none() && self.timeout.is_none() && {
            let f = flags.load(Ordering::Relaxed);
            f & (POLLING | DONE) == 0
                && flags
                    .compare_exchange(f, POLLING, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        };
        if !claimed {
            let mut st = lock(flight.st());
            // Relaxed: `DONE` is turned on under this lock, which orders what it publishes.
            let f = flags.load(Ordering::Relaxed);
            if f & DONE != 0 {
                let out = take_result(&mut st, follower);
                st.participants -= 1;
                drop(st);
                self.finish();
                return Poll::Ready(out);
            }
            if let Some(id) = follower {
                // A follower's own cancellation: registered with the token (a cancel wakes
                // this task), checked before it waits or drives the call.
                if let Some(c) = self.cancel.as_mut() {
                    if c.poll_cancelled(cx).is_ready() {
                        st.forget(id);
                        drop(st);
                        self.inner.cancelled.fetch_add(1, Ordering::Relaxed);
                        self.leave(&flight, key, false);
                        self.finish();
                        return Poll::Ready(Err(DedupError::Cancelled));
                    }
                }
                // A follower's own deadline, from its first poll.
                if let Some(t) = self.timeout {
                    // A timeout too large for an instant never expires (and never panics).
                    let now = Instant::now();
                    let at = *self
                        .deadline
                        .get_or_insert_with(|| now.checked_add(t).unwrap_or(now + FAR));
                    if now >= at {
                        st.forget(id);
                        drop(st);
                        self.inner.timeouts.fetch_add(1, Ordering::Relaxed);
                        self.leave(&flight, key, false);
                        self.finish();
                        return Poll::Ready(Err(DedupError::Timeout));
                    }
                    match self.timer {
                        Some(tm) => crate::wait::timer::update(tm, cx.waker()),
                        None => {
                            self.timer = Some(crate::wait::timer::register(at, cx.waker().clone()))
                        }
                    }
                }
            }
            // Claim the work under the lock: the same compare-and-swap. If `POLLING` is on,
            // or the swap fails (the only change that can come between the load and it, under
            // this lock, is another participant's claim outside it), another participant
            // drives the call: it wakes everyone when it stops, and the work's wake does.
            if f & POLLING != 0
                || flags
                    .compare_exchange(f, POLLING, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
            {
                st.wakers.register(cx.waker());
                drop(st);
                return pending(self, flight);
            }
            drop(st);
        }
        // This participant's waker is registered only if the poll is `Pending` (a call that
        // completes at once clones no waker); a wake meanwhile is remembered in `WOKEN`.
        // SAFETY: the pointer is the address of `flight`, which lives across the call, and
        // whose value is the receiver.
        let panic = match unsafe { flight.poll_work(flight.as_ptr().cast::<()>()) } {
            Ok(Poll::Ready(result)) => return self.end(flight, key, follower, result),
            Ok(Poll::Pending) => None,
            Err(panic) => Some(panic),
        };
        let mut st = lock(flight.st());
        let Some(panic) = panic else {
            st.wakers.register(cx.waker());
            // The claim back, and whether a wake came while this participant polled (it set
            // `WOKEN` under this lock: either it took this waker, or it is seen here). A load
            // and a store, not a read-modify-write: while `POLLING` is on nothing outside the
            // lock changes the word, and a wake waits for the lock. Release: the next
            // claimant's accesses to the work come after this poll's.
            let woken = flags.load(Ordering::Relaxed) & WOKEN != 0;
            flags.store(0, Ordering::Release);
            drop(st);
            if woken {
                // Woken while it polled, before its waker was there: poll again.
                cx.waker().wake_by_ref();
            }
            return pending(self, flight);
        };
        // The shared call panicked: nobody gets a result; the panic goes on in this
        // participant, the others are woken and find the flight gone. A store: this
        // participant holds the claim, so only this lock's holders change the word.
        flags.store(DONE, Ordering::Release);
        st.followers.iter_mut().for_each(|s| *s = Share::Gone);
        st.participants -= 1;
        drop(st);
        flight.drop_work();
        self.remove_key(&flight, key);
        wake_all(flight.head());
        self.finish();
        std::panic::resume_unwind(panic);
    }

    /// This participant's poll completed the call with `result`. A leader whose flight nobody
    /// ever joined removes the key under the map's lock alone and keeps the result as it is
    /// (nobody else can reach the flight any more: joining takes the map's lock, so the
    /// flight's state and claim word need no update); otherwise the shares are made under the
    /// flight's lock.
    fn end(
        &mut self,
        flight: Flight<T>,
        key: u128,
        follower: Option<usize>,
        result: T,
    ) -> Poll<Result<T, DedupError>> {
        if follower.is_none() {
            let solo = {
                let mut reg = lock(&self.inner.flights);
                match reg.map.entry(key) {
                    Entry::Occupied(e) if e.get().flight.is(&flight) && !e.get().joined => {
                        e.remove();
                        true
                    }
                    _ => false,
                }
            };
            if solo {
                // The claim is this leader's and nobody else is left: the work is its alone.
                flight.drop_work();
                self.finish();
                return Poll::Ready(Ok(result));
            }
        }
        let mut st = lock(flight.st());
        // A store: this participant holds the claim, so only this lock's holders change the
        // word (module docs). Release: it gives the claim back, for good.
        flight.head().flags.store(DONE, Ordering::Release);
        self.complete(&mut st, result);
        let out = take_result(&mut st, follower);
        st.participants -= 1;
        let others = st.participants > 0;
        drop(st);
        flight.drop_work();
        self.remove_key(&flight, key);
        if others {
            wake_all(flight.head());
        }
        self.finish();
        Poll::Ready(out)
    }

    /// The call completed with `result`: shares for the followers, the original for the
    /// leader (or dropped if the leader left).
    fn complete(&self, st: &mut FlightState<T>, result: T) {
        let share = &self.inner.share;
        for slot in st.followers.iter_mut() {
            if !matches!(slot, Share::Waiting) {
                continue;
            }
            let shared = catch_unwind(AssertUnwindSafe(|| share(&result)));
            if shared.is_err() {
                self.inner.unshareable.fetch_add(1, Ordering::Relaxed);
            }
            *slot = Share::Ready(shared.map_err(|_| DedupError::Unshareable));
        }
        if st.leader_present {
            st.leader_result = Some(result);
        }
    }

    /// Removes `key` from the map if it still names `flight` (which the caller holds, so the
    /// map's entry for the key, if it names this flight, names a live one).
    fn remove_key(&self, flight: &Flight<T>, key: u128) {
        remove_key(&self.inner, flight, key);
    }

    /// A participant leaves before completion: the last one drops the work and frees the key;
    /// otherwise the others are woken in case this one was driving.
    fn leave(&self, flight: &Flight<T>, key: u128, leader: bool) {
        let mut st = lock(flight.st());
        let flags = &flight.head().flags;
        // Relaxed: `DONE` is turned on under this lock.
        if flags.load(Ordering::Relaxed) & DONE != 0 {
            st.participants -= 1;
            return;
        }
        st.participants -= 1;
        if leader {
            st.leader_present = false;
        }
        let last = st.participants == 0;
        if last {
            // This participant holds no claim (a read-modify-write, then, although with no
            // participant left nobody can claim). The claimants' accesses to the work come
            // before the drop below: each gave its claim back under this lock.
            flags.fetch_or(DONE, Ordering::Relaxed);
        }
        drop(st);
        if last {
            flight.drop_work();
            self.remove_key(flight, key);
        } else {
            wake_all(flight.head());
        }
    }

    fn finish(&mut self) {
        if let Some(t) = self.timer.take() {
            crate::wait::timer::cancel(t);
        }
        self.cancel = None;
        self.role = Role::Finished;
    }
}

/// Removes `key` from `inner`'s map if it still names `flight` (held by the caller).
fn remove_key<T>(inner: &Inner<T>, flight: &Flight<T>, key: u128) {
    let mut reg = lock(&inner.flights);
    if let Entry::Occupied(e) = reg.map.entry(key) {
        if e.get().flight.is(flight) {
            e.remove();
        }
    }
}

impl<T> Drop for DedupRun<T> {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            crate::wait::timer::cancel(t);
        }
        let (flight, key, follower) = match std::mem::replace(&mut self.role, Role::Finished) {
            Role::Leader { flight, key } => (flight, key, None),
            Role::Follower { flight, key, id } => (flight, key, Some(id)),
            _ => return,
        };
        let mut st = lock(flight.st());
        let flags = &flight.head().flags;
        if let Some(id) = follower {
            st.forget(id);
        } else {
            st.leader_present = false;
            st.leader_result = None;
        }
        st.participants -= 1;
        // Relaxed: `DONE` is turned on under this lock.
        let done = flags.load(Ordering::Relaxed) & DONE != 0;
        let last = st.participants == 0 && !done;
        if last {
            // As in `leave`: no claim is held, and the claimants gave theirs back under this
            // lock, before the drop below.
            flags.fetch_or(DONE, Ordering::Relaxed);
        }
        drop(st);
        if last {
            flight.drop_work();
            remove_key(&self.inner, &flight, key);
        } else if !done {
            // This participant may have been the one driving the call: let another take over.
            wake_all(flight.head());
        }
    }
}
