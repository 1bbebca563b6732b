//! The wait queue: an intrusive, bounded, strictly FIFO list of waiters, used only on the slow
//! path (CONTRACT.md §2 rows 6–7 and §3).
//!
//! # Layout and ownership
//!
//! A [`Waiter`] node lives inside the waiting future, or on the stack of the blocked thread;
//! the queue links nodes by raw pointers and allocates nothing. Every field a node shares with
//! other threads is touched only under the bulkhead's queue mutex, except `state`, which the
//! granter stores (`Release`) as its **last** access to the node and the owner loads
//! (`Acquire`) to learn that its outcome is written. A granter therefore takes the node's
//! waker (a `Waker`, or the blocked `Thread`) out of the node *before* that store and wakes it
//! after unlocking: once `state` says done, the owner may return and free the node at once.
//!
//! # The waiters flag
//!
//! The state word's `WAITERS` bit is set (by an enqueuer, with the CAS that proves there is no
//! free slot) and cleared (by whoever empties the queue) only under the queue mutex, so under
//! the mutex `WAITERS` is set exactly when the queue is non-empty. The fast path sees it in the
//! word it already loads and refuses to barge; a release sees it in the word its CAS replaces and
//! then hands its slot to the queue instead of returning it (`crate::wait::waiting`).
//!
//! With admission classes a release changes its class word, not the state word, so the queue
//! also raises `C_QUEUE` on every class word (before `WAITERS`, under the same mutex, and while
//! drainers wait); a class decrease that replaces a flagged word visits the queue
//! (`crate::wait::waiting`, "With admission classes"). [`Queue::class_flags`] records whether it is up.
//!
//! # Where wake-ups run
//!
//! Waking, cloning or dropping a `Waker` runs the user's code, which may block, take a long
//! time, call back into this bulkhead or another (`apply_limits`, a release) or panic. None of
//! it runs under the queue mutex, nor inside a grace-period operation (`crate::grace`), whose
//! marker may hold off an install of the bulkhead:
//!
//! * under the mutex a node's waker is only moved (into the node, out of it into a
//!   [`WakeList`]) or compared (`Waker::will_wake`, which calls nothing); the waits clone a
//!   new waker before they lock and drop a replaced one after they unlock
//!   ([`Waiter::replace_notify`]); a drainer, woken on every idle moment, is shared through
//!   an `Arc`, whose clone runs no user code ([`Queue::drainers`]);
//! * a [`WakeList`] is delivered after the unlock; one collected by a class pump that a
//!   decrease ran inside its operation (a release, an undo, an abandonment, a refund, a
//!   migration's help: `crate::protocol::class_pump::pump_classed`) is not delivered there
//!   but handed to the calling thread, which delivers it with [`deliver_deferred`] once it
//!   has left the operation: a class release after it left its operation and counted down
//!   (its shared-word update and the count-down are done, so a waker that panics
//!   finds the release complete and the state freed if it was the last owner), a decision or
//!   a return of capacity after its operation;
//! * a waker that panics does not keep the others from being woken: each runs on its own,
//!   and the first panic is resumed after the last wake-up (a list delivered during an
//!   unwind drops it).

use crate::sync::cell::UnsafeCell;
use crate::sync::{AtomicU32, Ordering};
use crate::vocab::class::{Resources, MAX_CLASSES};
use crate::vocab::demand::Priority;
use crate::vocab::rejection::{Constraint, RejectReason};
use std::marker::PhantomPinned;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr;
use std::sync::Arc;
use std::task::Waker;

/// Still queued.
const WAITING: u32 = 0;
/// Answered: `outcome` is written and the node is no longer linked.
const DONE: u32 = 1;

/// How a waiter was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not answered yet.
    Pending,
    /// A slot (and the tokens) were taken on its behalf under the limits of `revision`, with
    /// this attribution (classes only; default without classes).
    Granted { revision: u64, resources: Resources },
    /// Refused with this reason (a hand-off whose checks failed, or `shutdown`).
    Refused(RejectReason),
    /// Refused by a class hand-off whose checks failed, with the constraint that failed.
    RefusedAs(RejectReason, Option<Constraint>),
}

pub(crate) use crate::sync::notify::Notify;

/// How many wake-ups a critical section collects before its owner unlocks to deliver them
/// (tokio's `WakeList` uses the same number): long loops under the lock (`close` with a long
/// queue, a pump after a large raise) stop at this many, unlock, wake, and lock again.
pub(crate) const WAKE_BATCH: usize = 32;

/// Wake-ups collected under the queue mutex and delivered after it is released, without a
/// heap allocation for up to [`WAKE_BATCH`] of them. Nothing is ever woken under the mutex: a
/// list that is full takes more into a spill vector (only drainer wake-ups can get there,
/// whose number the loops do not bound), and the loops that produce many answers check
/// [`is_full`](Self::is_full) and deliver a batch before they go on.
///
/// A list made inside an operation ([`WakeList::in_operation`]: a class pump that a decrease
/// ran, module docs "Where wake-ups run") never wakes: [`wake_all`](Self::wake_all) moves
/// what it holds to the calling thread, which delivers it once it has left the operation
/// ([`deliver_deferred`]).
///
/// The batch is an array of uninitialised slots of which the first `len` hold a wake-up (as
/// tokio's `WakeList`): making an empty list writes only `len`, the mode and the empty spill
/// vector, and dropping one touches only the slots in use, which matters because every
/// hand-off makes and drops one (an array of 32 `Option<Notify>`s cost an async hand-off
/// about 290 of its 3,135 instructions to initialise and drop).
///
/// A waker that panics while the list is delivered does not strand the others: the unwind
/// drops the list, whose drop wakes the rest, each on its own (`wake_one`: a second panic is
/// dropped, not an abort). A batch delivered midway ([`wake_batch`](Self::wake_batch)) keeps
/// the panic until the final [`wake_all`](Self::wake_all), so the loop finishes its work (a
/// hand-off still returns its slot) before it unwinds. Measured: an async hand-off costs
/// 2,683 instructions with this (2,682 before; `benches/instructions.rs`, `handoff_async`).
pub(crate) struct WakeList {
    /// `items[..len]` are initialised and owned by the list; the rest are not.
    items: [MaybeUninit<Notify>; WAKE_BATCH],
    len: usize,
    /// [`DEFERRED`] (made inside an operation: `wake_all` hands the wake-ups to the thread)
    /// and [`KEPT`] (`kept` holds a panic): one byte, so that the common list pays one test.
    flags: u8,
    /// With [`KEPT`], the first panic of a waker this list woke, kept until
    /// [`wake_all`](Self::wake_all) (or the drop) resumes it: a batch delivered midway lets its
    /// caller finish first. Uninitialised otherwise (a list costs no store for it).
    kept: MaybeUninit<Panic>,
    /// Wake-ups past the batch. Dropped by hand (`wake_rest`) so that the list's drop glue is
    /// the three tests of its `Drop` and can be inlined; an empty vector owns no allocation.
    spill: ManuallyDrop<Vec<Notify>>,
}

impl WakeList {
    /// A list for a caller outside any operation: [`wake_all`](Self::wake_all) wakes.
    #[inline]
    pub(crate) fn new() -> WakeList {
        WakeList {
            items: [const { MaybeUninit::uninit() }; WAKE_BATCH],
            len: 0,
            flags: 0,
            kept: MaybeUninit::uninit(),
            spill: ManuallyDrop::new(Vec::new()),
        }
    }

    /// A list for a caller inside an operation: [`wake_all`](Self::wake_all) hands what it
    /// holds to the calling thread, which delivers it after the operation
    /// ([`deliver_deferred`]).
    pub(crate) fn in_operation() -> WakeList {
        let mut list = WakeList::new();
        list.flags = DEFERRED;
        list
    }

    /// Whether a batch is ready: the caller should unlock, [`wake_all`](Self::wake_all) and
    /// lock again before it answers more waiters.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len == WAKE_BATCH
    }

    #[inline]
    pub(crate) fn push(&mut self, n: Notify) {
        if let Some(slot) = self.items.get_mut(self.len) {
            slot.write(n);
            self.len += 1;
        } else {
            self.spill.push(n);
        }
    }

    /// Wakes everything collected (call after unlocking, as the caller's last step), or, for
    /// a list made inside an operation, hands it to the calling thread
    /// ([`deliver_deferred`]). A waker that panics does not keep the others from being woken:
    /// the unwind drops the list, which wakes the rest, each on its own (a second panic is
    /// dropped, not an abort), and a panic kept by an earlier [`wake_batch`](Self::wake_batch)
    /// is resumed here. Always inlined: a call costs a hand-off, which wakes one waiter, more
    /// than the loop does.
    #[inline(always)]
    pub(crate) fn wake_all(&mut self) {
        if self.flags != 0 {
            return self.wake_all_flagged();
        }
        self.check_outside_operation();
        while self.len > 0 {
            // Shrunk first: if the wake below panics, the slot is no longer the list's (the
            // value was moved out), so the unwind's `drop` wakes only the others.
            self.len -= 1;
            // SAFETY: `items[..len]` (before the decrement) are initialised; slot `len` is now
            // outside that range, so it is read exactly once and never dropped again.
            let n = unsafe { self.items[self.len].assume_init_read() };
            n.wake();
        }
        if !self.spill.is_empty() {
            self.wake_rest();
        }
    }

    /// [`wake_all`](Self::wake_all) of a list made inside an operation, or holding a kept
    /// panic.
    #[cold]
    #[inline(never)]
    fn wake_all_flagged(&mut self) {
        if self.flags & DEFERRED != 0 {
            return self.defer_all();
        }
        self.wake_rest();
    }

    /// Keeps `p` if it is the first panic of this list's wakers (a later one is dropped).
    fn keep(&mut self, p: Panic) {
        if self.flags & KEPT == 0 {
            self.kept.write(p);
            self.flags |= KEPT;
        }
    }

    /// A full batch, midway through a loop (after unlocking): wakes (or hands to the thread)
    /// what is collected, each wake-up on its own, and keeps a waker's panic for the final
    /// [`wake_all`](Self::wake_all), so that the loop still finishes its work (returns a slot,
    /// answers the rest).
    #[cold]
    #[inline(never)]
    pub(crate) fn wake_batch(&mut self) {
        if self.flags & DEFERRED != 0 {
            return self.defer_all();
        }
        self.check_outside_operation();
        let mut first = None;
        while self.len > 0 {
            self.len -= 1;
            // SAFETY: as in `wake_all`.
            let n = unsafe { self.items[self.len].assume_init_read() };
            wake_one(n, &mut first);
        }
        while let Some(n) = self.spill.pop() {
            wake_one(n, &mut first);
        }
        if let Some(p) = first {
            self.keep(p);
        }
    }

    /// Never inside an operation marked in the thread's cell (a decision's marker is not
    /// visible here): such a caller makes its list with [`in_operation`](Self::in_operation).
    #[inline(always)]
    fn check_outside_operation(&self) {
        #[cfg(all(debug_assertions, not(loom)))]
        debug_assert!(
            self.len == 0 || crate::grace::reader().load(crate::sync::Ordering::Relaxed) & 1 == 0,
            "wake-ups delivered inside a grace-period operation"
        );
    }

    /// [`wake_all`](Self::wake_all) of a list made inside an operation.
    #[cold]
    #[inline(never)]
    fn defer_all(&mut self) {
        while self.len > 0 {
            self.len -= 1;
            // SAFETY: as in `wake_all`.
            let n = unsafe { self.items[self.len].assume_init_read() };
            crate::sync::notify::defer(n);
        }
        while let Some(n) = self.spill.pop() {
            crate::sync::notify::defer(n);
        }
    }
}

/// [`WakeList::flags`]: the list was made inside an operation.
const DEFERRED: u8 = 1;
/// [`WakeList::flags`]: `kept` holds a panic.
const KEPT: u8 = 2;

/// A panic caught while waking, resumed once every wake-up was made.
type Panic = Box<dyn std::any::Any + Send + 'static>;

/// Wakes `n`; a panic of its waker is kept in `first` (if it is the first) instead of
/// unwinding past the other wake-ups.
#[inline(always)]
fn wake_one(n: Notify, first: &mut Option<Panic>) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| n.wake())) {
        first.get_or_insert(p);
    }
}

/// Resumes a waker's panic, unless the thread is unwinding already (a list delivered by a
/// drop during an unwind): then it is dropped, as a second panic would abort.
#[cold]
#[inline(never)]
fn resume(p: Panic) {
    if !std::thread::panicking() {
        std::panic::resume_unwind(p);
    }
}

/// Delivers the wake-ups the calling thread kept while it was inside operations (module docs,
/// "Where wake-ups run"). Called where the thread is known to be outside every operation,
/// after the step that ends its own use of the bulkhead: a class release after its last step
/// (a panicking waker then finds the release complete), a decision or a return of capacity
/// after it left its operation. A load and a branch when nothing is kept.
#[inline(always)]
pub(crate) fn deliver_deferred() {
    if crate::sync::notify::pending() {
        deliver_deferred_now();
    }
}

#[cold]
#[inline(never)]
fn deliver_deferred_now() {
    // Under loom, `LLM_BULKHEAD_LOOM_LOSE_DEFERRED_WAKES=1` drops the kept wake-ups unwoken:
    // the deliberately broken variant that `loom-tests/tests/waiting_classes.rs` is shown to
    // fail on (a class release's pump answers a waiter, or wakes a drainer, that is then never
    // woken: models 1, 2 and 4 report a deadlock; `.ci/run` checks 1 and 4).
    #[cfg(loom)]
    if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_LOSE_DEFERRED_WAKES") {
        drop(crate::sync::notify::take());
        return;
    }
    let mut panic = None;
    // A waker may run code that defers again (it releases an admission, say): delivered too.
    loop {
        let kept = crate::sync::notify::take();
        if kept.is_empty() {
            break;
        }
        for n in kept {
            wake_one(n, &mut panic);
        }
    }
    if let Some(p) = panic {
        resume(p);
    }
}

impl Drop for WakeList {
    // Inlined down to three tests: the list is normally empty when it goes (its owner
    // delivered it), and only an unwind (from a waker, or from elsewhere) leaves wake-ups in
    // it, a spill that allocated its memory, or a kept panic.
    #[inline(always)]
    fn drop(&mut self) {
        if self.len != 0 || self.spill.capacity() != 0 || self.flags & KEPT != 0 {
            self.wake_rest();
        }
    }
}

impl WakeList {
    /// The drop of a list that still holds wake-ups or a spill allocation: wakes (or defers)
    /// them and frees the spill vector. Leaves `len` at 0, so nothing initialised is left
    /// behind (`items` has no drop glue), and an empty, unallocated vector in `spill`.
    #[cold]
    #[inline(never)]
    fn wake_rest(&mut self) {
        self.wake_batch();
        drop(std::mem::take(&mut *self.spill));
        if self.flags & KEPT != 0 {
            self.flags &= !KEPT;
            // SAFETY: `KEPT` says `kept` was written; clearing it first makes this the one read.
            resume(unsafe { self.kept.assume_init_read() });
        }
    }
}

/// Queue links, under the queue mutex.
struct Links {
    prev: *const Waiter,
    next: *const Waiter,
    /// The queue this node is linked into (null while unlinked): what makes a lock token
    /// prove that *this* node's queue is the locked one.
    owner: *const Queue,
}

/// One waiter. Pinned while linked (it is `!Unpin`).
pub(crate) struct Waiter {
    /// Reservation tokens of the demand.
    pub(crate) r: u64,
    /// Class index of the demand (classes only).
    pub(crate) k: usize,
    /// Priority of the demand.
    pub(crate) priority: Priority,
    links: UnsafeCell<Links>,
    outcome: UnsafeCell<Outcome>,
    notify: UnsafeCell<Notify>,
    state: AtomicU32,
    _pinned: PhantomPinned,
}

// SAFETY: a `Waiter` is shared between its owner and the threads that hold the queue mutex.
// `links`, `outcome` and `notify` are accessed only under that mutex, or by the owner after it
// observed `state == DONE` with `Acquire` (the granter's last access is its `Release` store of
// `state`, after which nobody else touches the node). `Waker` and `Thread` are `Send + Sync`.
unsafe impl Sync for Waiter {}
// SAFETY: as above; the raw pointers in `links` are only dereferenced under the mutex.
unsafe impl Send for Waiter {}

impl Waiter {
    /// A node that is not linked yet, whose owner is woken through `notify` once it is.
    pub(crate) fn new(r: u64, k: usize, priority: Priority, notify: Notify) -> Waiter {
        Waiter {
            r,
            k,
            priority,
            links: UnsafeCell::new(Links {
                prev: ptr::null(),
                next: ptr::null(),
                owner: ptr::null(),
            }),
            outcome: UnsafeCell::new(Outcome::Pending),
            notify: UnsafeCell::new(notify),
            state: AtomicU32::new(WAITING),
            _pinned: PhantomPinned,
        }
    }

    /// Whether the waiter was answered (`Acquire`: its outcome is then readable).
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// The outcome.
    ///
    /// # Safety
    /// The caller observed [`is_done`](Self::is_done) return true on this thread (its
    /// `Acquire` load pairs with the granter's `Release` store, after which nobody writes the
    /// outcome), or holds the mutex of the queue the node was linked into.
    pub(crate) unsafe fn outcome(&self) -> Outcome {
        // SAFETY: by the caller's contract no write of `outcome` can run concurrently.
        self.outcome.with(|o| unsafe { *o })
    }

    /// Asserts that `q` is the queue this node is linked into (any locked queue will do
    /// while the node is not linked yet: nobody else can reach it then).
    fn check_owner(&self, q: &Queue) {
        // SAFETY: `links` are written only under the mutex of the node's queue; a node that
        // is not linked is reachable only by its owner, which is the caller.
        let owner = self.links.with(|l| unsafe { (*l).owner });
        assert!(
            owner.is_null() || ptr::eq(owner, q),
            "a lock token of another queue"
        );
    }

    /// Sets how to wake the owner, and returns how it was woken so far: the caller drops that
    /// after unlocking (dropping a `Waker` runs user code). `q` is the locked queue the node
    /// is (or will be) linked into: the lock token.
    #[must_use = "the old waker must be dropped after the unlock"]
    pub(crate) fn replace_notify(&self, q: &Queue, n: Notify) -> Notify {
        self.check_owner(q);
        // SAFETY: `notify` is accessed only under the node's queue mutex, which `q` proves is
        // held (`check_owner`), or before the node is linked.
        self.notify
            .with_mut(|p| unsafe { std::mem::replace(&mut *p, n) })
    }

    /// Whether a new waker would have to replace the stored one (`q`: as in `set_notify`).
    pub(crate) fn needs_waker(&self, q: &Queue, w: &Waker) -> bool {
        self.check_owner(q);
        // SAFETY: as in `set_notify`.
        self.notify.with(|p| match unsafe { &*p } {
            Notify::Waker(old) => !old.will_wake(w),
            _ => true,
        })
    }
}

/// The queue itself (inside the bulkhead's queue mutex; `&mut Queue` or `&Queue` obtained
/// through the locked guard is the lock token).
pub(crate) struct Queue {
    head: *const Waiter,
    tail: *const Waiter,
    len: usize,
    /// Waiters ever queued.
    pub(crate) queued_total: u64,
    /// Callers of `drain` waiting for the bulkhead to become idle, by registration id. Shared
    /// (`Arc`), so that waking one, which may happen many times, clones no `Waker` under the
    /// lock.
    drainers: Vec<(u64, Arc<Notify>)>,
    next_drainer: u64,
    /// Class mode: whether `C_QUEUE` is up on every class word (`crate::protocol::classed`).
    pub(crate) class_flags: bool,
    /// Queued waiters per class index (every waiter is class 0 without classes).
    class_counts: [u32; MAX_CLASSES],
    /// Bit `k` set exactly when `class_counts[k] > 0`.
    class_mask: u64,
    /// The mask last published in `Shared::queued_classes` (under this mutex); the unlock
    /// publishes [`Queue::class_mask`] when the two differ, with classes only
    /// (`crate::shared::QueueGuard`).
    pub(crate) published_classes: u64,
}

// SAFETY: the pointers name nodes that are pinned and outlive their link (a node unlinks itself,
// under the mutex, before it can be freed); the queue is only used under its mutex.
unsafe impl Send for Queue {}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            head: ptr::null(),
            tail: ptr::null(),
            len: 0,
            queued_total: 0,
            drainers: Vec::new(),
            next_drainer: 0,
            class_flags: false,
            class_counts: [0; MAX_CLASSES],
            class_mask: 0,
            published_classes: 0,
        }
    }
}

impl Queue {
    /// Live waiters.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the state word's `WAITERS` flag must be set: waiters queued or drainers
    /// registered.
    pub(crate) fn flag_needed(&self) -> bool {
        self.len > 0 || !self.drainers.is_empty()
    }

    /// The classes with a waiter queued, one bit per class index: what an in-floor newcomer
    /// checks before it bypasses the queue (`crate::protocol::classed`, "Bypass").
    pub(crate) fn class_mask(&self) -> u64 {
        self.class_mask
    }

    /// Whether a drainer is registered.
    pub(crate) fn has_drainers(&self) -> bool {
        !self.drainers.is_empty()
    }

    /// Registers a drainer; returns its id.
    pub(crate) fn add_drainer(&mut self, n: Arc<Notify>) -> u64 {
        let id = self.next_drainer;
        self.next_drainer += 1;
        self.drainers.push((id, n));
        id
    }

    /// Replaces a drainer's waker; returns the old one, which the caller drops after
    /// unlocking.
    #[must_use = "the old waker must be dropped after the unlock"]
    pub(crate) fn update_drainer(&mut self, id: u64, n: Arc<Notify>) -> Option<Arc<Notify>> {
        let d = self.drainers.iter_mut().find(|d| d.0 == id)?;
        Some(std::mem::replace(&mut d.1, n))
    }

    /// Unregisters a drainer; returns its waker, which the caller drops after unlocking.
    #[must_use = "the waker must be dropped after the unlock"]
    pub(crate) fn remove_drainer(&mut self, id: u64) -> Option<Arc<Notify>> {
        let i = self.drainers.iter().position(|d| d.0 == id)?;
        Some(self.drainers.swap_remove(i).1)
    }

    /// Wake-ups of every registered drainer (they re-check the state themselves): a shared
    /// reference each, so nothing of the user's is cloned here.
    pub(crate) fn drainers(&self) -> impl Iterator<Item = Notify> + '_ {
        self.drainers
            .iter()
            .map(|d| Notify::Shared(Arc::clone(&d.1)))
    }

    /// Appends `w`.
    ///
    /// # Safety
    /// `w` is pinned, not linked, and stays alive until it is unlinked (by `remove` or
    /// `answer_front`), all under this queue's mutex (which `&mut self` proves is held).
    pub(crate) unsafe fn push_back(&mut self, w: &Waiter) {
        let p: *const Waiter = w;
        let me: *const Queue = self;
        let tail = self.tail;
        // SAFETY: we hold the mutex (`&mut self`) and `w` is not linked, so its links are ours.
        w.links.with_mut(|l| unsafe {
            debug_assert!((*l).owner.is_null(), "push_back of a linked node");
            (*l).prev = tail;
            (*l).next = ptr::null();
            (*l).owner = me;
        });
        if tail.is_null() {
            self.head = p;
        } else {
            // SAFETY: `tail` is a linked, live node of this queue (push_back's contract).
            unsafe { (*tail).links.with_mut(|l| (*l).next = p) };
        }
        self.tail = p;
        self.len += 1;
        self.queued_total += 1;
        if let Some(c) = self.class_counts.get_mut(w.k) {
            *c += 1;
            self.class_mask |= 1 << w.k;
        }
    }

    /// The head waiter.
    pub(crate) fn front(&self) -> Option<&Waiter> {
        // SAFETY: a linked node is alive until unlinked under the mutex we hold.
        unsafe { self.head.as_ref() }
    }

    /// Unlinks `w` if it is linked into this queue; returns whether it was.
    ///
    /// # Safety
    /// `w` is alive, and is linked into this queue or into none (a node linked elsewhere
    /// would have its neighbours rewritten without their queue's lock; this is asserted).
    pub(crate) unsafe fn remove(&mut self, w: &Waiter) -> bool {
        let me: *const Queue = self;
        // SAFETY: links are accessed under the mutex (`&mut self`) of the node's queue.
        let (prev, next, owner) = w
            .links
            .with(|l| unsafe { ((*l).prev, (*l).next, (*l).owner) });
        if owner.is_null() {
            return false;
        }
        assert!(ptr::eq(owner, me), "remove from another queue");
        // SAFETY: neighbours are linked, live nodes of this queue.
        unsafe {
            if prev.is_null() {
                self.head = next;
            } else {
                (*prev).links.with_mut(|l| (*l).next = next);
            }
            if next.is_null() {
                self.tail = prev;
            } else {
                (*next).links.with_mut(|l| (*l).prev = prev);
            }
        }
        // SAFETY: as above.
        w.links.with_mut(|l| unsafe {
            (*l).prev = ptr::null();
            (*l).next = ptr::null();
            (*l).owner = ptr::null();
        });
        self.len -= 1;
        if let Some(c) = self.class_counts.get_mut(w.k) {
            *c -= 1;
            if *c == 0 {
                self.class_mask &= !(1 << w.k);
            }
        }
        true
    }

    /// Unlinks the head and answers it with `outcome`; returns how to wake its owner, which
    /// the caller does after unlocking. The node is not touched after this returns.
    pub(crate) fn answer_front(&mut self, outcome: Outcome) -> Notify {
        let w = self.head;
        assert!(!w.is_null(), "answer_front on an empty queue");
        // SAFETY: `w` is the linked head, alive until unlinked; we hold the mutex.
        let w = unsafe { &*w };
        self.answer(w, outcome)
    }
}

impl Queue {
    /// Answers, in FIFO order, every waiter for which `answer` gives an outcome (unlinking it),
    /// collecting the wake-ups into `wake`; stops once `wake` holds a full batch. Returns
    /// whether it stopped early (the caller unlocks, wakes and calls again). Used by the
    /// token-waiting sweep after a reconfiguration (`crate::protocol::token_wait::sweep_never_fit`).
    pub(crate) fn answer_matching(
        &mut self,
        wake: &mut WakeList,
        mut answer: impl FnMut(&Waiter) -> Option<Outcome>,
    ) -> bool {
        let mut cur = self.head;
        while !cur.is_null() {
            if wake.is_full() {
                return true;
            }
            // SAFETY: `cur` is a linked node of this queue, alive until unlinked under the mutex
            // we hold (`&mut self`); its `next` is read before it may be unlinked.
            let w = unsafe { &*cur };
            // SAFETY: as above: links are read under the mutex.
            let next = w.links.with(|l| unsafe { (*l).next });
            if let Some(outcome) = answer(w) {
                wake.push(self.answer(w, outcome));
            }
            cur = next;
        }
        false
    }

    /// Unlinks linked node `w` and answers it with `outcome` (as [`Queue::answer_front`]).
    fn answer(&mut self, w: &Waiter, outcome: Outcome) -> Notify {
        // SAFETY: `w` is alive and linked into this queue (the caller found it there).
        unsafe { self.remove(w) };
        // SAFETY: under the mutex; the owner reads these only after seeing `DONE`.
        w.outcome.with_mut(|o| unsafe { *o = outcome });
        // SAFETY: as above.
        let notify = w
            .notify
            .with_mut(|n| unsafe { std::mem::replace(&mut *n, Notify::None) });
        // Last access to the node: the owner may free it as soon as it sees this.
        w.state.store(DONE, Ordering::Release);
        notify
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node lives inside every acquire future and on every blocked thread's stack: keep it
    /// small (its size is reported in the issue notes and the README).
    #[test]
    fn a_waiter_node_stays_small() {
        let size = std::mem::size_of::<Waiter>();
        eprintln!("waiter node: {size} bytes");
        assert!(size <= 112, "waiter node grew to {size} bytes");
    }

    /// A waker that counts its wake-ups and panics on the first if `panics`.
    struct Counting {
        woken: crate::sync::AtomicUsize,
        panics: bool,
    }

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            let first = self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            assert!(!(first && self.panics), "a waker that panics");
        }
    }

    /// `n` wakers, the one at `bad` panicking, and a list holding them all.
    fn wakers(n: usize, bad: usize) -> (Vec<Arc<Counting>>, WakeList) {
        let all: Vec<_> = (0..n)
            .map(|i| {
                Arc::new(Counting {
                    woken: Default::default(),
                    panics: i == bad,
                })
            })
            .collect();
        let mut list = WakeList::new();
        for w in &all {
            list.push(Notify::Waker(Waker::from(Arc::clone(w))));
        }
        (all, list)
    }

    fn all_woken_once(all: &[Arc<Counting>]) {
        for w in all {
            assert_eq!(w.woken.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }

    /// A batch past `WAKE_BATCH` (so the spill is used) with a panicking waker in each part:
    /// `wake_batch` wakes every one and keeps the panic; the final `wake_all` resumes it.
    #[test]
    fn a_panicking_waker_in_a_batch_is_resumed_after_every_wake_up() {
        for bad in [3, WAKE_BATCH + 2] {
            let (all, mut list) = wakers(WAKE_BATCH + 5, bad);
            list.wake_batch();
            all_woken_once(&all);
            let end = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| list.wake_all()));
            assert!(end.is_err(), "the kept panic is resumed");
            drop(list);
        }
    }

    /// `wake_all` unwinds at the panicking waker; the list's drop wakes the rest.
    #[test]
    fn a_panicking_waker_in_wake_all_strands_nobody() {
        let (all, mut list) = wakers(WAKE_BATCH + 5, WAKE_BATCH - 3);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || list.wake_all()));
        assert!(r.is_err());
        all_woken_once(&all);
    }

    /// A list made inside an operation wakes nobody: the thread delivers its wake-ups later,
    /// the panicking one included, and resumes the panic after the others.
    #[test]
    fn a_list_made_inside_an_operation_defers_to_its_thread() {
        let (all, mut items) = wakers(4, 1);
        let mut list = WakeList::in_operation();
        while items.len > 0 {
            items.len -= 1;
            // SAFETY: `items[..len]` (before the decrement) are initialised; moved out once.
            list.push(unsafe { items.items[items.len].assume_init_read() });
        }
        list.wake_all();
        assert!(all
            .iter()
            .all(|w| w.woken.load(std::sync::atomic::Ordering::SeqCst) == 0));
        let r = std::panic::catch_unwind(deliver_deferred);
        assert!(r.is_err(), "the panic is resumed after the others");
        all_woken_once(&all);
        assert!(!crate::sync::notify::pending());
    }
}
