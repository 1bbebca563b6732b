//! The state every handle and admission of one bulkhead shares, and what keeps it alive.
//!
//! # Lifetime without a per-admission reference count
//!
//! Admissions are `Send + 'static`, so they must keep the shared state alive. A reference
//! count per admission (as `Arc` would give) costs two more locked instructions on every
//! acquire/release pair, on a contended line. Instead, **the slot an admission holds is its
//! reference**: the slots-in-use field of the state word already counts every admission.
//!
//! * [`Handle`]s (one per `Bulkhead` clone) are counted in `handles`, off the hot line.
//! * When the last handle goes, it sets the `DETACHED` bit of the state word with a
//!   `fetch_or`; if the word it replaced held no slot, the owners are all gone.
//! * An admission returns its slot with a CAS of the word (a CAS, so that the word it replaces
//!   can say whether waiters are queued); if that word had `DETACHED` set and exactly its own
//!   slot, the owners are all gone. With classes the class words and `alive` decide the same
//!   thing (`crate::protocol::classed`, "Lifetime").
//!
//! Both decisions read the same word, whose modifications are totally ordered, so exactly one
//! thread sees the last owner leave, and only after every other owner is done: the handle
//! count can never climb back from zero (a handle is only cloned from a live handle), and an
//! admission touches the shared state only before its slot-returning CAS (statistics are
//! written first), unless it holds a slow-path guard (below).
//!
//! # Slow paths
//!
//! A slow path can give its slot away *before* it is done with the state: a hand-off grants
//! its slot to the head waiter (or returns it to the word) and still has to unlock the queue's
//! mutex, which lives in the state; the granted waiter may meanwhile drop the last handle and
//! its admission. So the block is not freed by the owners' decision directly. A lifetime count
//! `refs` holds **one joint reference for all the owners** the words count, plus one per
//! counted [`SlowPathRef`]:
//!
//! * the thread that sees the last owner leave drops the joint reference;
//! * a slow path that may give its ownership away takes a counted `SlowPathRef` first, while
//!   it is still an owner (`refs ≥ 1` then), and drops it after its last touch;
//! * whoever takes `refs` to zero frees the block.
//!
//! The queue's lock is reachable only through a `SlowPathRef`, and the lock guard borrows it,
//! so the unlock cannot be written after the reference is given back. The fast paths never
//! touch `refs`: the no-class release pays one more `fetch_sub` only when it frees the state.
//!
//! # Class mode: a release's operation keeps the state alive
//!
//! With classes, a release returns its slot on its class word first and then updates the
//! shared word (and may visit the queue): after the class step the slot no longer counts, yet
//! the release still touches the state. The whole release runs inside a grace-period operation
//! on its thread's process-wide cell (`crate::grace`), which names the bulkhead. So the free
//! of a class-mode state first waits for every other thread's operation on it
//! (`crate::grace::wait_for_operations`): whoever frees decided so by an RMW that comes after
//! the release's class step on the same atomic, so it sees the release's marker. The wait is
//! for the crate's own steps only (no user code runs inside an operation), and only at the
//! free. Before, a release marked itself in its class word ("pending returns") for the time
//! of its shared-word update and removed the mark afterwards: a third RMW on the class word's
//! contended line in every borrowed release, which this wait replaces.
//!
//! # Memory ordering
//!
//! Every decrement (`handles.fetch_sub`, the slot-returning CAS, the `DETACHED` `fetch_or`,
//! the `refs.fetch_sub`s) is `AcqRel`. RMWs on one atomic extend each other's release
//! sequences, so the thread that sees the last owner leave synchronises with every earlier
//! owner's last write, and the thread that frees synchronises with every earlier `refs`
//! decrement: all uses of the state happen-before the free.
//!
//! Under `cfg(loom)` each block also has a liveness cell (`crate::sync::lifetime`) that every
//! touch reads and the free writes, so the loom models fail on any use after free.

use crate::record::stats::Counters;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering, Stripes};
use crate::words::class_word::{CWord, C_DETACHED};
use crate::words::limits::{LimitsSnapshot, Ring};
use crate::words::state::{Word, DETACHED};
use crossbeam_utils::CachePadded;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

/// The canonical limits, owned by the reconfiguration lock.
pub(crate) struct Canonical {
    pub(crate) current: LimitsSnapshot,
    /// The tag of `current` in the state word (only the lock holder changes the tag).
    pub(crate) tag: usize,
    /// What the installer remembers of the grace-period markers between installs
    /// (`crate::grace`, "The period a marker holds").
    pub(crate) periods: crate::grace::Periods,
}

pub(crate) struct Shared {
    /// The packed state word (see `crate::words::state`), alone on its cache line.
    pub(crate) word: CachePadded<AtomicU64>,
    /// Live `Bulkhead` handles (not admissions).
    handles: CachePadded<AtomicUsize>,
    /// The tag the latest install moves (or moved) the state word to, stored before its CAS
    /// (`crate::protocol::install`): a borrower whose load of it after its class step still
    /// shows its reservation's tag knows that no install came in between
    /// (`crate::protocol::classed`, `moved`, "A borrower's step"). On its own line, written
    /// only by installs: read where the state word, contended, would cost a line transfer.
    pub(crate) announced: CachePadded<AtomicUsize>,
    /// Lifetime references (module docs, "Slow paths"): one held jointly by every owner the
    /// words count (handles, slots, class slots), plus one per counted
    /// [`SlowPathRef`]. The block is freed when this reaches zero. Cold: the fast paths never
    /// touch it.
    refs: AtomicUsize,
    pub(crate) ring: Ring,
    pub(crate) counters: Stripes<Counters>,
    pub(crate) reconfig: Mutex<Canonical>,
    /// The current limits as readers see them (`limits()`, `stats()`, `would_admit()`): a copy
    /// of `Canonical::current` that an install replaces under this lock together with its tag
    /// bump and class migrations (`crate::protocol::install`), never while it waits out a grace
    /// period, so a reader never waits for one.
    pub(crate) published: Mutex<LimitsSnapshot>,
    /// The wait queue (`crate::wait::list`); touched only on the slow path.
    queue: Mutex<crate::wait::list::Queue>,
    /// A mirror of the queue's length, written only under the queue mutex (at every unlock,
    /// and by an enqueuer *before* its queueing CAS), read without it: while `WAITERS` is up
    /// only for drainers, it lets a decider admit and a release return its slot without the
    /// mutex (`crate::wait::waiting`, "Drain").
    pub(crate) queued: AtomicUsize,
    /// Class mode: the classes with a waiter queued, one bit per class index, written only
    /// under the queue mutex: raised by an enqueuer of class `k` (`fetch_or`) before it
    /// decides or joins the tail, and set to the queue's exact mask at every unlock. An
    /// in-floor newcomer that finds `WAITERS` up reads it after its class-word CAS and
    /// bypasses the queue only if its class's bit is clear (`crate::protocol::classed`,
    /// "Bypass").
    pub(crate) queued_classes: AtomicU64,
    pub(crate) has_budget: bool,
    /// The process's grace-period barrier mode (`crate::grace::asymmetric`), fixed before this
    /// block was made: a copy beside the flags the fast decision reads anyway, so that entering
    /// its grace-period marker loads no process-wide static.
    pub(crate) asymmetric: bool,
    /// This bulkhead's id in the process-wide grace-period markers (`crate::grace::GraceId`).
    pub(crate) grace_id: crate::grace::GraceId,
    /// The bits all admission ids of this bulkhead share (see `crate::vocab::id`).
    pub(crate) id_prefix: u128,
    /// One word per admission class (layout in `crate::protocol::classed`: queue flag, detached, class
    /// tag, class in flight, class tokens); empty without classes.
    pub(crate) class_words: Box<[CachePadded<AtomicU64>]>,
    /// Class names, in construction order.
    pub(crate) class_names: Box<[String]>,
    /// The same names, interned (`crate::sync::intern`): what a refusal names its class with.
    pub(crate) class_ids: Box<[&'static &'static str]>,
    /// The class of demands that name none.
    pub(crate) default_class: usize,
    /// This bulkhead's identity in its [`ClassId`](crate::ClassId)s (`crate::vocab::class`): a
    /// class id is valid here only if it carries it.
    pub(crate) class_owner: crate::vocab::class::ClassOwner,
    /// Whether the bulkhead has classes (then `word` is the shared word of
    /// `crate::protocol::classed` and class slots keep this state alive).
    pub(crate) classed: bool,
    /// Owners left once detached (class mode only, see `crate::protocol::classed`, "Lifetime").
    pub(crate) alive: AtomicUsize,
    /// The default waiter timeout (builder `timeout` or profile).
    pub(crate) default_timeout: Option<std::time::Duration>,
    /// Whether queue waits are timed (`BulkheadBuilder::measure_queue_waits`).
    pub(crate) measure_waits: bool,
    /// Whether a demand refused only for tokens waits in the queue
    /// (`BulkheadBuilder::wait_for_tokens`, `crate::protocol::token_wait`).
    pub(crate) wait_for_tokens: bool,
    /// Event subscribers (`crate::record::events`). Read-mostly: the hooks read only its flag, which
    /// is never on the state word's cache line (`word` is padded to a line of its own).
    pub(crate) events: crate::record::events::Subscribers,
    /// State of the layers above the core, one value per type ([`Shared::extension`]): made
    /// on first use, dropped with the block. No decision reads it.
    extensions: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Shared>();
};

/// Frees the shared state.
///
/// # Safety
/// `ptr` came from `Handle::new` and the caller is the unique thread that observed the last
/// owner leave (see the module docs); nothing can reach the state afterwards.
#[track_caller]
unsafe fn free(ptr: NonNull<Shared>) {
    // SAFETY: not yet freed (the caller's contract); two plain fields nobody writes any more.
    let (classed, id) = unsafe { (ptr.as_ref().classed, ptr.as_ref().grace_id) };
    if classed {
        // A class release may still be inside its operation after its class step, updating
        // the shared word (module docs, "Class mode: a release's operation keeps the state
        // alive").
        crate::grace::wait_for_operations(id);
    }
    crate::sync::lifetime::freed(ptr.as_ptr().cast());
    #[cfg(all(feature = "testing", not(loom)))]
    crate::sync::hooks::count_live_state(-1);
    // SAFETY: allocated by `Box::new` in `Handle::new`, leaked exactly once, and by the
    // caller's contract freed exactly once, after every other use.
    drop(unsafe { Box::from_raw(ptr.as_ptr()) });
}

/// The owners the words count are all gone (the caller's own atomic step showed it): drops
/// their joint lifetime reference, and frees the state unless a slow path still holds it.
///
/// # Safety
/// The caller is the unique thread that observed the last owner leave (module docs), and does
/// not touch the state afterwards (except through a [`SlowPathRef`] it holds).
#[cold]
#[inline(never)]
#[track_caller]
unsafe fn owners_gone(ptr: NonNull<Shared>) {
    // SAFETY: the joint reference is still counted, so the state is alive for this access.
    let refs = unsafe { &ptr.as_ref().refs };
    crate::sync::lifetime::touch(ptr.as_ptr().cast());
    if refs.fetch_sub(1, Ordering::AcqRel) == 1 {
        // SAFETY: that was the last lifetime reference: every owner and every slow path is
        // done (each gave its reference back with a release RMW on `refs`, which this
        // acquire RMW synchronises with).
        unsafe { free(ptr) }
    }
}

/// Waiting settings fixed at construction.
#[derive(Clone, Copy, Default)]
pub(crate) struct WaitSettings {
    pub(crate) default_timeout: Option<std::time::Duration>,
    pub(crate) measure_waits: bool,
    pub(crate) wait_for_tokens: bool,
}

/// A counted handle: what a `Bulkhead` holds.
pub(crate) struct Handle(NonNull<Shared>);

// SAFETY: a `Handle` is an owning, counted pointer to a `Shared`, which is `Send + Sync`
// (checked above). As for `Arc<T: Send + Sync>`, moving or sharing the pointer only moves or
// shares access to a `Sync` value, and the count is atomic.
unsafe impl Send for Handle {}
// SAFETY: `&Handle` only gives `&Shared`, and `Shared: Sync`.
unsafe impl Sync for Handle {}

impl Handle {
    pub(crate) fn new(
        ring: Ring,
        canonical: Canonical,
        has_budget: bool,
        class_names: Vec<String>,
        default_class: usize,
        class_owner: crate::vocab::class::ClassOwner,
        settings: WaitSettings,
    ) -> Handle {
        let class_words = class_names
            .iter()
            .map(|_| {
                CachePadded::new(AtomicU64::new(
                    crate::words::class_word::initial_class_word(0),
                ))
            })
            .collect();
        let classed = !class_names.is_empty();
        let class_ids: Box<[&'static &'static str]> =
            class_names.iter().map(|n| crate::sync::intern(n)).collect();
        #[cfg(feature = "serde")]
        if classed {
            // So that an id serialises as its name (`ClassId`'s `Serialize`).
            let names: Vec<&'static str> = class_ids.iter().map(|n| **n).collect();
            crate::vocab::class::register_names(class_owner, &names);
        }
        // With classes the word holds U and V, which start at the floor sums.
        let first_word = if classed {
            crate::words::class_word::initial_shared_word(&canonical.current)
        } else {
            0
        };
        // Before the state is published: every thread that reaches it sees the barrier mode
        // (and this block keeps a copy of it).
        crate::grace::init();
        let shared = Shared {
            word: CachePadded::new(AtomicU64::new(first_word)),
            handles: CachePadded::new(AtomicUsize::new(1)),
            // The state word's first tag, as `Canonical::tag` starts (0).
            announced: CachePadded::new(AtomicUsize::new(0)),
            refs: AtomicUsize::new(1),
            ring,
            counters: Stripes::new(),
            published: Mutex::new(canonical.current),
            reconfig: Mutex::new(canonical),
            queue: Mutex::new(crate::wait::list::Queue::default()),
            queued: AtomicUsize::new(0),
            queued_classes: AtomicU64::new(0),
            has_budget,
            asymmetric: crate::grace::asymmetric(),
            grace_id: crate::grace::new_id(),
            id_prefix: crate::vocab::id::prefix(),
            class_words,
            class_ids,
            class_names: class_names.into_boxed_slice(),
            default_class,
            class_owner,
            classed,
            alive: AtomicUsize::new(0),
            default_timeout: settings.default_timeout,
            measure_waits: settings.measure_waits,
            wait_for_tokens: settings.wait_for_tokens,
            events: crate::record::events::Subscribers::new(),
            extensions: Mutex::new(Vec::new()),
        };
        let ptr = NonNull::from(Box::leak(Box::new(shared)));
        crate::sync::lifetime::born(ptr.as_ptr().cast());
        #[cfg(all(feature = "testing", not(loom)))]
        crate::sync::hooks::count_live_state(1);
        Handle(ptr)
    }

    /// A slow-path guard borrowed from this handle (no count: the handle outlives it).
    pub(crate) fn slow_path(&self) -> SlowPathRef<'_> {
        SlowPathRef {
            ptr: self.0,
            counted: false,
            _owner: std::marker::PhantomData,
        }
    }

    /// An uncounted pointer for an admission that has just taken a slot.
    ///
    /// # Safety
    /// The caller has just taken a slot (a global slot, or a class slot with classes) on this
    /// state's words, or had one handed to it, that no other `SlotRef` stands for: the
    /// `SlotRef` becomes that slot's owner and returns it exactly once.
    pub(crate) unsafe fn slot_ref(&self) -> SlotRef {
        SlotRef(self.0)
    }
}

impl std::ops::Deref for Handle {
    type Target = Shared;

    #[inline]
    #[track_caller]
    fn deref(&self) -> &Shared {
        crate::sync::lifetime::touch(self.0.as_ptr().cast());
        // SAFETY: a live handle keeps `handles ≥ 1`, so the state is not detached and cannot
        // have been freed (module docs).
        unsafe { self.0.as_ref() }
    }
}

impl Clone for Handle {
    #[inline]
    fn clone(&self) -> Handle {
        // Relaxed suffices for an increment from a live handle (as in `Arc::clone`).
        let old = self.handles.fetch_add(1, Ordering::Relaxed);
        if old > isize::MAX as usize {
            // Only reachable by leaking more than isize::MAX handles; aborting is what `Arc`
            // does, since continuing could overflow the count and free a live value.
            std::process::abort();
        }
        Handle(self.0)
    }
}

impl Drop for Handle {
    // Inlined down to the decrement: only the last handle goes on, out of line.
    #[inline]
    fn drop(&mut self) {
        if self.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.drop_last();
    }
}

impl Handle {
    /// The drop of the last handle (the count just reached zero): detaches the state, and
    /// frees it if no admission holds a slot.
    #[cold]
    #[inline(never)]
    fn drop_last(&mut self) {
        if self.classed {
            // SAFETY: this is the last handle, being dropped (the count above reached zero).
            if unsafe { crate::shared::detach(self.0) } {
                // SAFETY: the last handle is gone and every class word was empty (or emptied
                // and counted down); we are the unique thread that saw it (a release still in
                // its operation is waited for by the free: `crate::protocol::classed`,
                // "Lifetime").
                unsafe { owners_gone(self.0) }
            }
            return;
        }
        let prev = Word(self.word.fetch_or(DETACHED, Ordering::AcqRel));
        if prev.slots() == 0 {
            // SAFETY: the last handle is gone and no admission holds a slot; any admission
            // that comes later would need a handle. We are the unique thread that saw it
            // (module docs).
            unsafe { owners_gone(self.0) }
        }
    }
}

/// An admission's pointer to the shared state, valid while it holds its slot.
pub(crate) struct SlotRef(NonNull<Shared>);

// SAFETY: `SlotRef` is a pointer to a `Shared` (which is `Send + Sync`) kept alive by the
// slot its owner holds in the state word; moving it to another thread moves that ownership.
unsafe impl Send for SlotRef {}
// SAFETY: `&SlotRef` only gives `&Shared`, and `Shared: Sync`.
unsafe impl Sync for SlotRef {}

impl SlotRef {
    /// The shared state.
    ///
    /// Callers hold the slot this `SlotRef` was made for (it is returned only by
    /// [`SlotRef::return_slot`], which consumes it).
    #[inline]
    #[track_caller]
    pub(crate) fn get(&self) -> &Shared {
        crate::sync::lifetime::touch(self.0.as_ptr().cast());
        // SAFETY: the owner's slot is counted in the state word, so the state cannot be freed
        // (module docs); `return_slot` consumes `self`, so no use follows the return.
        unsafe { self.0.as_ref() }
    }

    /// A new handle, only while some handle is still alive (the count never climbs back from
    /// zero, which is what makes the `DETACHED` decision final).
    pub(crate) fn try_pin(&self) -> Option<Handle> {
        let handles = &self.get().handles;
        let mut n = handles.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None;
            }
            match handles.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(Handle(self.0)),
                Err(actual) => n = actual,
            }
        }
    }

    /// Ends the owners' joint lifetime reference (`owners_gone`) after the caller's return
    /// through this slot saw the last owner leave (class mode, `crate::protocol::class_pump`).
    ///
    /// # Safety
    /// As `owners_gone`: the caller is the unique thread that observed the last owner leave,
    /// and touches the state no more.
    pub(crate) unsafe fn owners_gone(self) {
        // SAFETY: the caller's contract is `owners_gone`'s.
        unsafe { owners_gone(self.0) }
    }

    /// Frees the shared state after the caller returned the last slot of a detached state
    /// (see [`SlotRef::return_slot`]).
    ///
    /// # Safety
    /// The caller's own atomic step returned the last slot while `DETACHED` was set, and
    /// nothing touches the state afterwards.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn free_last(self) {
        // SAFETY: the caller's contract is `owners_gone`'s.
        unsafe { owners_gone(self.0) }
    }

    /// Turns this admission's pointer into a counted [`SlowPathRef`], taken while the slot is
    /// still held: the state then stays alive until the guard is dropped, even if the slow
    /// path gives the slot away (to a waiter, or back to the word) on its way.
    #[cold]
    pub(crate) fn into_slow_path(self) -> SlowPathRef<'static> {
        // Relaxed, as `Arc::clone`: the slot we still hold keeps `refs ≥ 1`.
        self.get().refs.fetch_add(1, Ordering::Relaxed);
        // The block's own pointer (from `Box::leak`), not one derived from a `&Shared`: this
        // guard may be the one that frees the block.
        SlowPathRef {
            ptr: self.0,
            counted: true,
            _owner: std::marker::PhantomData,
        }
    }

    /// The handle that a successful [`SlotRef::try_pin`] counted for this admission and that
    /// was forgotten at abandonment.
    ///
    /// # Safety
    /// Such a counted, forgotten handle exists and has not been turned back yet.
    pub(crate) unsafe fn into_pinned_handle(self) -> Handle {
        Handle(self.0)
    }
}

impl Shared {
    /// Locks the wait queue. Private: the slow paths lock it through a [`SlowPathRef`], whose
    /// borrow then outlives the unlock.
    fn lock_queue(&self) -> QueueGuard<'_> {
        #[cfg(all(feature = "testing", not(loom)))]
        crate::sync::hooks::count_queue_lock();
        // Every decision made under the queue lock (a hand-off's grant, a pump, an enqueue's
        // proof that no slot is free) reads the limits tag and commits on it: the lock guard is
        // also a grace-period operation (`crate::grace`), entered before the first read.
        let op = crate::grace::op(self.grace_id);
        QueueGuard {
            q: crate::sync::lock(&self.queue),
            shared: self,
            _op: op,
        }
    }

    /// Live waiters, under the queue mutex (for statistics and refusal details; gives no
    /// ownership away).
    pub(crate) fn queue_len(&self) -> usize {
        self.lock_queue().len()
    }

    /// Waiters ever queued (for statistics).
    pub(crate) fn queued_total(&self) -> u64 {
        self.lock_queue().queued_total
    }

    /// This bulkhead's one `T`, made with `T::default()` on first use: the hook through which
    /// a layer above the core keeps state per bulkhead (its counters, say), shared by every
    /// front end wrapping the same bulkhead. A cold path (a lock and a scan of a short list):
    /// a layer looks its value up once and keeps the `Arc`. The value must not hold a handle
    /// to the bulkhead, which would keep the block alive.
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    pub(crate) fn extension<T: Any + Default + Send + Sync>(&self) -> Arc<T> {
        let mut list = crate::sync::lock(&self.extensions);
        if let Some(t) = list.iter().find_map(|e| Arc::clone(e).downcast::<T>().ok()) {
            return t;
        }
        let t = Arc::new(T::default());
        list.push(t.clone());
        t
    }
}

/// The one way a slow path reaches the shared state: a guard that keeps it alive until the
/// guard is dropped, so a path that gives its slot away midway (a hand-off, a class release's
/// pump) can still unlock the queue and finish (module docs, "Slow paths").
///
/// * From a handle ([`Handle::slow_path`]): a borrow, with no count; the borrow checker keeps
///   the handle alive for the guard's lifetime. From another owner that stays one for the
///   guard's whole life ([`SlowPathRef::borrowed`], unsafe): the same.
/// * From an admission that may give its slot away on the way ([`SlotRef::into_slow_path`]):
///   a counted reference in `refs`, taken while the slot is still held and returned at drop,
///   which frees the state if it was the last. It keeps the block's own pointer, so the free
///   has the allocation's full provenance.
///
/// The queue lock is reachable only through [`SlowPathRef::lock_queue`], whose guard borrows
/// the `SlowPathRef`: the unlock cannot be written after the reference is given back.
pub(crate) struct SlowPathRef<'a> {
    ptr: NonNull<Shared>,
    counted: bool,
    _owner: std::marker::PhantomData<&'a Shared>,
}

impl SlowPathRef<'_> {
    /// An uncounted guard for a caller that stays an owner for all of `'a` (it holds a handle,
    /// or a slot or a class release's operation that it gives back or leaves only after the
    /// guard is gone).
    ///
    /// # Safety
    /// The caller is an owner of `shared` for all of `'a`: the state cannot be freed while the
    /// guard lives (so this guard never frees it either).
    pub(crate) unsafe fn borrowed(shared: &Shared) -> SlowPathRef<'_> {
        SlowPathRef {
            ptr: NonNull::from(shared),
            counted: false,
            _owner: std::marker::PhantomData,
        }
    }

    /// Locks the wait queue; the guard borrows `self`, so it unlocks before `self` can go.
    pub(crate) fn lock_queue(&self) -> QueueGuard<'_> {
        self.get().lock_queue()
    }

    /// The shared state.
    #[inline]
    #[track_caller]
    pub(crate) fn get(&self) -> &Shared {
        crate::sync::lifetime::touch(self.ptr.as_ptr().cast());
        // SAFETY: a counted guard holds a lifetime reference; an uncounted one borrows a live
        // handle (`'a`). Either keeps the block allocated.
        unsafe { self.ptr.as_ref() }
    }

    /// The caller's own atomic step, made through this guard, showed that the last owner the
    /// words count is gone (it returned the last slot of a detached state): drops the owners'
    /// joint reference. This guard's own reference keeps the state alive until it is dropped,
    /// which then frees it.
    ///
    /// # Safety
    /// As [`owners_gone`]: the caller is the unique thread that observed the last owner leave.
    pub(crate) unsafe fn owners_gone(&self) {
        debug_assert!(self.counted, "only a counted guard outlives the last owner");
        let prev = self.get().refs.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev >= 2, "the guard's own reference is still counted");
    }
}

impl std::ops::Deref for SlowPathRef<'_> {
    type Target = Shared;

    #[inline]
    #[track_caller]
    fn deref(&self) -> &Shared {
        self.get()
    }
}

impl Drop for SlowPathRef<'_> {
    fn drop(&mut self) {
        if self.counted && self.get().refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: the last lifetime reference: every owner (their joint reference is
            // gone) and every other slow path is done; the acquire RMW synchronises with all
            // of their releases of `refs`.
            unsafe { free(self.ptr) }
        }
    }
}

// SAFETY: a `SlowPathRef` is a pointer to a `Shared` (`Send + Sync`) kept alive by a counted
// reference or a borrowed handle; moving or sharing it only moves or shares access to a
// `Sync` value, and the count is atomic.
unsafe impl Send for SlowPathRef<'_> {}
// SAFETY: `&SlowPathRef` only gives `&Shared`, and `Shared: Sync`.
unsafe impl Sync for SlowPathRef<'_> {}

/// The locked wait queue of one shared state. Its holder is inside a grace-period operation
/// (`crate::grace`), so nothing of the user's runs while it is held: wakers are moved in and
/// out of nodes under it, never cloned, dropped or woken (`crate::wait::list`, "Where wake-ups
/// run").
pub(crate) struct QueueGuard<'a> {
    q: crate::sync::MutexGuard<'a, crate::wait::list::Queue>,
    shared: &'a Shared,
    /// Left after the unlock (fields drop in order): no tag this holder read can come back
    /// while it holds the lock. Process-wide, so leaving it touches no shared state.
    _op: crate::grace::Op<'static>,
}

impl<'a> QueueGuard<'a> {
    /// The shared block whose queue this guard holds locked.
    #[inline]
    pub(crate) fn shared(&self) -> &'a Shared {
        self.shared
    }
}

impl std::ops::Deref for QueueGuard<'_> {
    type Target = crate::wait::list::Queue;
    fn deref(&self) -> &crate::wait::list::Queue {
        &self.q
    }
}

impl std::ops::DerefMut for QueueGuard<'_> {
    fn deref_mut(&mut self) -> &mut crate::wait::list::Queue {
        &mut self.q
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        // The unlock that follows writes the mutex inside the state.
        crate::sync::lifetime::touch((self.shared as *const Shared).cast());
        // Still under the mutex: the mirror is exact at every unlock.
        self.shared.queued.store(self.q.len(), Ordering::SeqCst);
        // So is the mask of queued classes (a bit raised for an enqueuer that was then
        // admitted or refused comes down here). Only the class bypass reads it: without
        // classes it is never published (each no-class enqueue and hand-off would otherwise
        // pay a `SeqCst` store for bit 0).
        let mask = self.q.class_mask();
        if self.shared.classed && mask != self.q.published_classes {
            self.shared.queued_classes.store(mask, Ordering::SeqCst);
            self.q.published_classes = mask;
        }
    }
}

// ---- class mode: the owners' lifetime over the class words (`crate::protocol::classed`, "Lifetime") ----

/// The last handle is gone: detach every class word (module docs, "Lifetime"). Returns
/// whether the caller must free the state now.
///
/// Takes the pointer, not a `&Shared`: a reference argument would have to stay valid until this
/// returns, and once the last `count_down` below gives this thread's count away, a releaser on
/// another thread may free the state before it does (Stacked Borrows protects a function's
/// reference arguments for the whole call; Miri found this in `release`).
///
/// # Safety
/// `ptr` is the state of the last handle, which is being dropped: its count in `alive` (set
/// below) keeps the state allocated until the last `count_down` here, and nothing here touches
/// it after that.
pub(crate) unsafe fn detach(ptr: NonNull<Shared>) -> bool {
    // SAFETY: the caller's handle keeps the state alive until our own count goes (doc above);
    // `shared` is a local reference, last used before that count-down.
    let shared = unsafe { ptr.as_ref() };
    let classes = shared.class_words.len();
    shared.alive.store(classes + 1, Ordering::Release);
    for cw in shared.class_words.iter() {
        let p = CWord(cw.fetch_or(C_DETACHED, Ordering::AcqRel));
        if p.in_flight() == 0 {
            // Cannot reach zero: this thread's own count is still in `alive`.
            let last = count_down(&shared.alive);
            debug_assert!(!last);
        }
    }
    count_down(&shared.alive)
}

/// Counts down `alive` (the state's `Shared::alive`); true for the thread that must free. It
/// takes the counter, not the `&Shared`: once this thread's count is given away, another may
/// free the state while this call returns, and a reference to interior-mutable data alone (as
/// in `Arc`'s drop) is allowed to dangle then.
pub(crate) fn count_down(alive: &AtomicUsize) -> bool {
    let last = alive.fetch_sub(1, Ordering::AcqRel) == 1;
    if !last {
        crate::sync::pause(crate::sync::PausePoint::CountedDown);
    }
    last
}
