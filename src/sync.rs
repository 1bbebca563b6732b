//! The crate-private synchronisation facade: **the only way in** to atomics, fences, locks,
//! condition variables, reference-counted sharing of synchronisation state, interior
//! mutability shared across threads, thread parking and thread-locals.
//!
//! Building with `RUSTFLAGS="--cfg loom"` swaps every item here for [loom]'s model-checked
//! version, so the loom suite in `loom-tests/` explores every interleaving of the real
//! protocols (the wait queue's node cells, `CancelToken`'s lists and the timer's lock
//! included), not of a copy. `clippy.toml` forbids the `std` originals everywhere else in the
//! library (`clippy::disallowed_types` and `disallowed_methods`, enabled in `lib.rs`), so CI
//! keeps it that way; this module, which must name them, is exempt (`lib.rs`). Re-exports are
//! flagged like direct uses, hence the aliases and wrapper functions below.
//!
//! Differences under loom, all for reasons of the checker rather than of the protocol:
//!
//! * [`Stripe`] counters are updated with a read-modify-write instead of the single-writer
//!   `load` + `store` used in normal builds, because loom has no per-thread storage that is
//!   also iterable from another thread. Statistics are bookkeeping only; no admission decision
//!   reads them.
//! * [`Stripes`] is a single shared cell under loom instead of one cell per thread.
//! * The shared state's deallocation is made visible ([`lifetime`]).
//! * [`next_serial`] is a `std` atomic in every build: loom atomics cannot be `static`s, and
//!   a process-wide serial is no protocol.
//! * Timed parks are yields ([`thread::park_timeout`]); models use zero deadlines.
//!
//! ## Why blocking waits park the thread and do not use `atomic-wait`
//!
//! A blocked `acquire_blocking` or `drain_blocking` parks its thread (`std::thread::park`,
//! itself a futex wait on Linux) and is woken by `Thread::unpark` from the waker side. The
//! `atomic-wait` crate (a futex/`WaitOnAddress`/`ulock` wait on an `AtomicU32`) was considered
//! and is not used, for four reasons:
//!
//! * **No timed wait.** Its `wait(&AtomicU32, value)` has no timeout, and every blocking wait
//!   here has one (the queue timeout, a drain's deadline); `park_timeout` has.
//! * **32-bit words.** It waits on an `AtomicU32`; the state words that change when capacity
//!   returns are 64-bit, so a waiter would need a word of its own anyway, which is what a
//!   thread's parker already is.
//! * **A node its owner may already have freed.** A waker that wakes a word inside a waiter's
//!   node races with that waiter returning and freeing the node (the hazard the wait layer's
//!   hand-off protocol is built around, `crate::wait::list`). `unpark` goes through a cloned
//!   `Thread` handle, which keeps the parker alive by reference count, so the waker never
//!   touches the node after the grant; with a futex word in the node, the wake would have to
//!   be ordered before the grant becomes visible or rely on waking a possibly-freed address.
//! * **Model checking.** loom models `park`/`unpark` ([`thread`]), not futex waits, so the
//!   loom suite would not see the blocking path.
//!
//! The cost is one `Thread` clone (a reference-count increment) per blocking waiter; the
//! fast path never blocks, so this touches only waiters.
//!
//! [loom]: https://docs.rs/loom

// Type aliases and wrapper functions rather than re-exports: `clippy::disallowed_types`
// resolves a re-export to the `std` item it names (and would flag every use), but not an
// alias, so the rule forbids exactly the direct uses outside this module.
#[cfg(loom)]
mod imp {
    pub(crate) type AtomicBool = loom::sync::atomic::AtomicBool;
    pub(crate) type AtomicU32 = loom::sync::atomic::AtomicU32;
    pub(crate) type AtomicU64 = loom::sync::atomic::AtomicU64;
    pub(crate) type AtomicUsize = loom::sync::atomic::AtomicUsize;
    pub(crate) type Mutex<T> = loom::sync::Mutex<T>;
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
    pub(crate) type Condvar = loom::sync::Condvar;
    pub(crate) use loom::sync::atomic::fence as raw_fence;
    pub(crate) use loom::sync::Arc;
}

#[cfg(not(loom))]
mod imp {
    pub(crate) type AtomicBool = std::sync::atomic::AtomicBool;
    pub(crate) type AtomicU32 = std::sync::atomic::AtomicU32;
    pub(crate) type AtomicU64 = std::sync::atomic::AtomicU64;
    pub(crate) type AtomicUsize = std::sync::atomic::AtomicUsize;
    pub(crate) type Mutex<T> = std::sync::Mutex<T>;
    pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
    pub(crate) type Condvar = std::sync::Condvar;
    pub(crate) use std::sync::atomic::fence as raw_fence;
    pub(crate) use std::sync::Arc;
}

pub(crate) use imp::{
    Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard,
};

/// A memory fence (loom's under loom).
#[inline(always)]
pub(crate) fn fence(order: Ordering) {
    imp::raw_fence(order)
}

pub(crate) use std::sync::atomic::Ordering;

/// An atomically replaceable `Arc` (the `arc-swap` crate): readers load it without a lock and
/// without touching a shared reference count. Used for the event subscriber list, which no
/// protocol reads (so it is plain `arc-swap` under loom too, outside the models).
pub(crate) type ArcSwap<T> = arc_swap::ArcSwap<T>;

/// `name` interned process-wide, behind a thin pointer (one word, where a `&'static str` is
/// two): a refusal names its class with this pointer, so that refusing allocates nothing and
/// the refusal stays small. Called only when a bulkhead is built (never on a decision), so its
/// lock is plain `std` under loom too (it is no part of any protocol). Each distinct class name
/// is kept once for the life of the process, however many bulkheads use it (class names are
/// configuration, at most `MAX_CLASSES` per bulkhead).
pub(crate) fn intern(name: &str) -> &'static &'static str {
    #[allow(clippy::disallowed_types)]
    static NAMES: std::sync::Mutex<Vec<&'static &'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&n) = names.iter().find(|&&n| *n == name) {
        return n;
    }
    let n: &'static &'static str =
        Box::leak(Box::new(&*Box::leak(name.to_owned().into_boxed_str())));
    names.push(n);
    n
}

/// A process-wide serial (never reused): numbers `Stripes` and admission-id prefixes.
pub(crate) fn next_serial() -> u64 {
    static SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SERIALS.fetch_add(1, Ordering::Relaxed)
}

/// A counter of serials that stops instead of wrapping: [`next`](Self::next) hands out each
/// value at most once. A `std` atomic in every build, as [`next_serial`] (it may be a
/// `static`); it numbers bulkheads' class identities (`crate::vocab::class::next_owner`).
pub(crate) struct SerialCounter(std::sync::atomic::AtomicU64);

impl SerialCounter {
    /// A counter whose first serial is `first`.
    pub(crate) const fn new(first: u64) -> SerialCounter {
        SerialCounter(std::sync::atomic::AtomicU64::new(first))
    }

    /// The next serial if it is at most `max`; `Err(next)` once they are used up (and from
    /// then on), never a serial handed out before.
    pub(crate) fn next(&self, max: u64) -> Result<u64, u64> {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n <= max).then_some(n + 1)
            })
    }
}

/// Interior mutability shared between threads, with loom's closure API in every build (as
/// tokio's `loom::cell`): [`with`](cell::UnsafeCell::with) for reads and
/// [`with_mut`](cell::UnsafeCell::with_mut) for writes, so that under loom every access is
/// checked against every other for a data race.
pub(crate) mod cell {
    #[cfg(loom)]
    pub(crate) use loom::cell::UnsafeCell;

    /// `std::cell::UnsafeCell` with loom's access API.
    #[cfg(not(loom))]
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        /// A cell holding `value`.
        #[inline(always)]
        pub(crate) const fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a pointer for reading; the caller's protocol excludes a concurrent
        /// write for as long as `f` runs.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with a pointer for writing; the caller's protocol excludes any concurrent
        /// access for as long as `f` runs.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// Thread parking for blocked waiters, and the timer's thread (loom's model-checked
/// versions under loom).
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::Thread;
    #[cfg(not(loom))]
    pub(crate) use std::thread::{Builder, Thread};

    /// The calling thread's handle.
    #[inline]
    pub(crate) fn current() -> Thread {
        #[cfg(loom)]
        return loom::thread::current();
        #[cfg(not(loom))]
        return std::thread::current();
    }

    /// Blocks until unparked (or spuriously).
    #[inline]
    pub(crate) fn park() {
        #[cfg(loom)]
        loom::thread::park();
        #[cfg(not(loom))]
        std::thread::park();
    }

    /// Yields the processor (to loom's scheduler under loom).
    #[inline]
    pub(crate) fn yield_now() {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        std::thread::yield_now();
    }

    /// Parks for at most `d` (under loom, a yield: models use zero deadlines).
    pub(crate) fn park_timeout(d: std::time::Duration) {
        #[cfg(not(loom))]
        std::thread::park_timeout(d);
        #[cfg(loom)]
        {
            let _ = d;
            loom::thread::yield_now();
        }
    }
}

/// How to wake a waiter's owner, and the wake-ups a thread keeps until it has left its
/// operation (`crate::wait::list`, "Where wake-ups run"). Here because the deferred list is a
/// thread-local, and the crate's thread-locals live in this facade.
pub(crate) mod notify;

/// A `SeqCst` fence in the loom build only.
///
/// Some steps of the class protocol (`crate::protocol::classed`) are store→load patterns across two
/// words (a CAS of a class word, then a load of the shared word) that are correct because all
/// of them are `SeqCst`: the language's single total order of `SeqCst` operations orders them.
/// loom models `SeqCst` loads and RMWs as `AcqRel` and only `SeqCst` *fences* faithfully
/// (tokio-rs/loom#180), so the loom build puts a fence exactly where the argument needs the
/// total order, which makes loom check the same guarantee. Normal builds need no fence (and on
/// x86-64 a locked RMW is a full barrier anyway).
#[inline(always)]
pub(crate) fn loom_sc_fence() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// Locks a facade mutex, ignoring poisoning: every critical section in this crate leaves the
/// protected data consistent before it can panic, so a poisoned lock carries no broken state.
#[cfg(not(loom))]
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks a facade mutex (loom flavour).
#[cfg(loom)]
pub(crate) fn lock<T>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deallocation, as loom sees it.
///
/// loom does not model frees: its atomics and locks keep their state outside the allocation,
/// so a touch of a freed block looks like any other access. Under `cfg(loom)` each shared
/// state therefore gets a **liveness cell** (a loom `UnsafeCell<bool>` in a side allocation,
/// found by the state's address, so that reading it is never itself a use after free):
/// [`born`](lifetime::born) makes it, every touch of the state ([`touch`](lifetime::touch): the
/// derefs of its owning pointers and the unlock of its queue) *reads* it, and the free
/// ([`freed`](lifetime::freed)) *writes* it. loom's causality checker then fails the model
/// whenever a touch is not ordered before the free by happens-before (a use after free that
/// some schedule reaches), and a touch that comes after the free finds the cell set. Normal
/// builds compile all of this to nothing.
pub(crate) mod lifetime {
    #[cfg(loom)]
    use std::cell::RefCell;

    #[cfg(loom)]
    type Cell = &'static loom::cell::UnsafeCell<bool>;

    #[cfg(loom)]
    std::thread_local! {
        /// `(address, liveness cell)` of every state made on this OS thread (loom runs all of
        /// a model's threads on one). A new state at a reused address replaces the entry.
        static BLOCKS: RefCell<Vec<(usize, Cell)>> = const { RefCell::new(Vec::new()) };
    }

    #[cfg(loom)]
    fn cell(addr: usize) -> Option<Cell> {
        BLOCKS.with(|b| b.borrow().iter().find(|e| e.0 == addr).map(|e| e.1))
    }

    /// A state was allocated at `addr`.
    #[inline(always)]
    pub(crate) fn born(addr: *const ()) {
        #[cfg(loom)]
        {
            // Leaked on purpose: the cell must outlive the block it watches.
            let c: Cell = Box::leak(Box::new(loom::cell::UnsafeCell::new(false)));
            BLOCKS.with(|b| {
                let mut b = b.borrow_mut();
                b.retain(|e| e.0 != addr as usize);
                b.push((addr as usize, c));
            });
        }
        #[cfg(not(loom))]
        let _ = addr;
    }

    /// The state at `addr` is about to be used: it must not have been freed, and (checked by
    /// loom) this use must happen-before its free.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn touch(addr: *const ()) {
        #[cfg(loom)]
        if let Some(c) = cell(addr as usize) {
            // SAFETY: a plain read of the leaked cell's flag; loom checks the access.
            let dead = c.with(|p| unsafe { *p });
            assert!(!dead, "use after free of the shared state at {addr:p}");
        }
        #[cfg(not(loom))]
        let _ = addr;
    }

    /// The state at `addr` is being freed.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn freed(addr: *const ()) {
        #[cfg(loom)]
        if let Some(c) = cell(addr as usize) {
            // SAFETY: a plain write of the leaked cell's flag; loom checks the access.
            let twice = c.with_mut(|p| unsafe { std::mem::replace(&mut *p, true) });
            assert!(!twice, "double free of the shared state at {addr:p}");
        }
        #[cfg(not(loom))]
        let _ = addr;
    }
}

/// A statistics counter.
///
/// In normal builds each counter has exactly one writing thread (it lives in that thread's
/// [`Stripes`] entry), so an increment is a plain `load` + `store`: no locked instruction and no
/// shared cache line on the hot path. Readers on other threads see a value that is at worst a
/// few increments old, never a torn one.
#[derive(Default)]
pub(crate) struct Stripe(AtomicU64);

impl Stripe {
    /// Adds `delta`, saturating at `u64::MAX` (a statistic never wraps back to a small
    /// number, whatever a caller reports), and returns the previous value.
    #[inline]
    pub(crate) fn add(&self, delta: u64) -> u64 {
        #[cfg(not(loom))]
        {
            let v = self.0.load(Ordering::Relaxed);
            self.0.store(v.saturating_add(delta), Ordering::Relaxed);
            v
        }
        // Under loom every thread shares one entry, so the add is one atomic step; the models
        // never come near `u64::MAX`, and a saturating CAS loop would only add interleavings.
        #[cfg(loom)]
        {
            self.0.fetch_add(delta, Ordering::Relaxed)
        }
    }

    /// Adds one and returns the previous value: [`add`](Self::add)`(1)` without the saturation,
    /// which counting by ones cannot need (a thread counting one a nanosecond would take 584
    /// years to reach `u64::MAX`), and which costs a decision two instructions.
    #[inline]
    pub(crate) fn incr(&self) -> u64 {
        #[cfg(not(loom))]
        {
            let v = self.0.load(Ordering::Relaxed);
            self.0.store(v.wrapping_add(1), Ordering::Relaxed);
            v
        }
        #[cfg(loom)]
        {
            self.0.fetch_add(1, Ordering::Relaxed)
        }
    }

    /// Raises the value to at least `v` (single writer; a CAS loop under loom).
    pub(crate) fn raise(&self, v: u64) {
        #[cfg(not(loom))]
        {
            if self.0.load(Ordering::Relaxed) < v {
                self.0.store(v, Ordering::Relaxed);
            }
        }
        #[cfg(loom)]
        {
            self.0.fetch_max(v, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Per-thread storage for statistics counters, summed when statistics are read.
///
/// Entries live in a [`thread_local::ThreadLocal`]. In front of it sits a one-entry cache per
/// thread, `(serial of the Stripes, pointer to this thread's entry)`, so the common case (a
/// thread using the same bulkhead again) costs one thread-local read and a compare.
#[cfg(not(loom))]
pub(crate) struct Stripes<T: Send> {
    entries: thread_local::ThreadLocal<crossbeam_utils::CachePadded<T>>,
    /// Unique among all `Stripes` ever made in this process (never reused).
    serial: u64,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The calling thread's last `(Stripes serial, entry)` pair.
    static LAST: std::cell::Cell<(u64, *const ())> = const { std::cell::Cell::new((u64::MAX, std::ptr::null())) };
}

#[cfg(not(loom))]
impl<T: Send + Sync> Stripes<T> {
    pub(crate) fn new() -> Self {
        Stripes {
            entries: thread_local::ThreadLocal::new(),
            serial: next_serial(),
        }
    }

    /// The calling thread's entry, made by `init` on the thread's first use.
    #[inline]
    pub(crate) fn local(&self, init: impl FnOnce() -> T) -> &T {
        let (serial, entry) = LAST.with(std::cell::Cell::get);
        if serial == self.serial {
            // SAFETY: the cache names this `Stripes` (serials are unique and never reused),
            // which is alive because `&self` is; the pointer was taken from this thread's entry
            // of `self.entries`, and `ThreadLocal` entries keep their address until the
            // `ThreadLocal` is dropped. It is this thread's entry because the cache is
            // thread-local, so the single-writer rule of `Stripe` still holds.
            return unsafe { &*entry.cast::<T>() };
        }
        self.local_slow(init)
    }

    /// A thread's first use of this `Stripes`, or its first after using another one. Out of
    /// line so the hot path does not carry the cache-padded value on its stack frame.
    #[cold]
    #[inline(never)]
    fn local_slow(&self, init: impl FnOnce() -> T) -> &T {
        // A thread's one-time per-thread state is made together, here, on its first use of a
        // bulkhead: its process-wide cell (`per_thread`, the grace-period marker of its slow
        // paths) too, so no later path (a queued waiter, say) allocates it.
        let _ = per_thread::local();
        let entry: &T = self
            .entries
            .get_or(|| crossbeam_utils::CachePadded::new(init()));
        LAST.with(|c| c.set((self.serial, (entry as *const T).cast())));
        entry
    }

    /// Visits every thread's entry.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        for t in self.entries.iter() {
            f(t)
        }
    }
}

/// Per-thread storage for statistics counters (loom flavour: one shared entry, made eagerly:
/// a lazily initialised cell could block one loom thread on another's initialisation, and
/// loom runs every thread of a model on one OS thread).
#[cfg(loom)]
pub(crate) struct Stripes<T: Send>(T);

#[cfg(loom)]
impl<T: Send + Sync + Default> Stripes<T> {
    pub(crate) fn new() -> Self {
        Stripes(T::default())
    }

    #[inline]
    pub(crate) fn local(&self, _init: impl FnOnce() -> T) -> &T {
        &self.0
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        f(&self.0)
    }
}

mod switch;
#[cfg(loom)]
pub(crate) use switch::broken_variant;
pub(crate) use switch::loom_broken;
pub(crate) use switch::test_switch;

/// A place in a protocol where a test may stop the calling thread (feature `testing`).
///
/// Each point sits between a read that a decision depends on and the atomic step that commits
/// it, or at a step of a slow path whose order matters; a deterministic race test installs a
/// per-thread hook (`testing::set_pause_hook`) that blocks at one point until the test lets it go.
/// Without the `testing` feature the calls compile to nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PausePoint {
    /// A no-class decision has read the word and its limits and is about to CAS it.
    DecisionCas,
    /// A class-word operation (decision, release, decrease, growth) has read its class word
    /// and the floors of its class tag (the class's version) and is about to CAS it.
    ClassCas,
    /// `apply_limits` is about to wait for an operation of its bulkhead that may hold a tag a
    /// whole tag period old, before it bumps the tag (the grace period, `crate::grace`).
    GracePeriod,
    /// A no-class hand-off has given its slot away (granted it to the head waiter, or
    /// returned it to the word) and still holds the queue lock.
    HandOffGiven,
    /// A waiting acquire (`acquire_blocking`, `acquire`) found no place by its fast decision
    /// and is about to take the queue lock to decide again (and perhaps queue).
    EnterQueue,
    /// A borrowed class release has returned its slot and hold (a `fetch_sub`) and is about to
    /// read the floors of its shared decrease; only its operation keeps the state allocated.
    ClassReturned,
    /// A class release has left its operation (both words updated) and not yet returned: the
    /// last handle, on another thread, may free the state now (`protocol::classed`, "Lifetime").
    ClassReleaseGiven,
    /// A class-mode free waits for another thread's operation (`grace::wait_for_operations`).
    FreeWaits,
    /// A count-down of `alive` (class mode) has given this thread's count away without
    /// reaching zero and has not yet returned: the thread that reaches zero may free the state
    /// now. The last handle's detach reaches it for every class word it counts down, the last
    /// of which is its own count; a release, when its class word emptied after the detach.
    CountedDown,
    /// `apply_limits` has bumped the tag (with classes, adding every raise of a floor to the
    /// stored `U`, `V`) and is about to migrate the classes whose limits changed.
    InstallMigrating,
    /// A class refusal is about to be reported although its collects said the demand fits,
    /// after its bounded retries (a step of another decider stayed in progress).
    RefusedAfterRetries,
    /// The fast attempt's protected step is in its class word, not yet validated by its
    /// load of the shared word (an install landing here moves the tag under it).
    ProtectedStepTaken,
    /// The collect-checked path's step is in its class word, before the collect that checks
    /// it (`crate::protocol::classed`, "Rare paths").
    SlowStepTaken,
    /// A borrower has added its reservation to the shared word and is about to take its step
    /// on the class word (the CAS that may find the class moved, and then take the reservation
    /// back): the tentative step other decisions can see.
    BorrowReserved,
    /// A borrower has taken its step on the class word, after its reservation, and is about
    /// to read the tag again to learn whether an install came in between
    /// (`crate::protocol::classed`, `moved`, "A borrower's step").
    BorrowStepped,
    /// A pools decision has taken its partition's active unit, still tentative, and is about
    /// to take its next step (tokens, connection, guard), any of which may refuse it and undo
    /// the unit (`crate::pools`, "Spurious refusals").
    #[cfg(feature = "serde")]
    PoolsTentativeTaken,
    /// A pools step found its count full only with units of decisions still in progress (the
    /// committed units alone leave room) and is about to wait for them to be confirmed or
    /// undone, instead of refusing.
    #[cfg(feature = "serde")]
    PoolsMetTentative,
    /// A pools release has given its units back and is about to hand them to the partitions'
    /// queued waiters (`crate::pools`, the queue's "Fairness").
    #[cfg(feature = "serde")]
    PoolsReleased,
    /// An async pools waiter found no outcome yet and is about to read its deadline: a
    /// release may start it now, and the deadline then pass (its start is given back, once).
    #[cfg(feature = "serde")]
    PoolsWaiterDeadline,
}

/// Stops here if the calling thread installed a pause hook (feature `testing` only).
#[inline(always)]
pub(crate) fn pause(point: PausePoint) {
    #[cfg(all(feature = "testing", not(loom)))]
    hooks::fire(point);
    #[cfg(not(all(feature = "testing", not(loom))))]
    let _ = point;
}

#[cfg(all(feature = "testing", not(loom)))]
pub(crate) mod hooks {
    use super::PausePoint;
    use std::cell::RefCell;

    type Hook = Box<dyn FnMut(PausePoint)>;

    std::thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    std::thread_local! {
        static QUEUE_LOCKS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    static LIVE_STATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// A shared state was allocated (`+1`) or freed (`-1`).
    pub(crate) fn count_live_state(delta: i64) {
        LIVE_STATES.fetch_add(delta as u64, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many bulkheads' shared states are allocated in this process right now (made and
    /// not yet freed), for tests of the lifetime protocol.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// use llm_bulkhead::testing::live_states;
    /// let b = llm_bulkhead::Bulkhead::new(1).unwrap();
    /// assert!(live_states() >= 1);
    /// drop(b);
    /// # }
    /// ```
    pub fn live_states() -> u64 {
        LIVE_STATES.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts one acquisition of a wait-queue lock by the calling thread.
    pub(crate) fn count_queue_lock() {
        QUEUE_LOCKS.with(|c| c.set(c.get() + 1));
    }

    /// How many times the calling thread has locked a wait queue (any bulkhead's), for tests
    /// that prove a path lock-free.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// use llm_bulkhead::testing::queue_locks;
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// let b = Bulkhead::new(1).unwrap();
    /// let before = queue_locks();
    /// drop(b.try_acquire(Demand::slot()).unwrap());
    /// assert_eq!(queue_locks(), before); // the fast path takes no lock
    /// # }
    /// ```
    pub fn queue_locks() -> u64 {
        QUEUE_LOCKS.with(std::cell::Cell::get)
    }

    std::thread_local! {
        static SKIP_GRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Whether the calling thread's `apply_limits` skip the grace period's wait
    /// ([`skip_grace_period_on_this_thread`]).
    pub(crate) fn grace_skipped() -> bool {
        SKIP_GRACE.with(std::cell::Cell::get)
    }

    /// Makes every `apply_limits` of the calling thread skip the grace period's wait (`true`)
    /// or wait again (`false`): the deliberately broken variant the deterministic tag-wrap
    /// regressions (`tests/tag_wrap.rs`) show they fail on. Per thread, so tests running in
    /// parallel in one process are unaffected. Never for production: without the wait, a tag
    /// can come back to the value a stopped operation read.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// use llm_bulkhead::testing::skip_grace_period_on_this_thread;
    /// skip_grace_period_on_this_thread(true);
    /// skip_grace_period_on_this_thread(false);
    /// # }
    /// ```
    pub fn skip_grace_period_on_this_thread(skip: bool) {
        SKIP_GRACE.with(|c| c.set(skip));
    }

    pub(crate) fn fire(point: PausePoint) {
        // Taken out while it runs, so a hook that calls into the crate does not re-enter itself.
        let Some(mut hook) = HOOK.with(|h| h.borrow_mut().take()) else {
            return;
        };
        hook(point);
        HOOK.with(|h| {
            let mut slot = h.borrow_mut();
            if slot.is_none() {
                *slot = Some(hook);
            }
        });
    }

    /// Installs `hook` for the calling thread: every [`PausePoint`] this thread reaches calls
    /// it (it may block, to hold the thread at that point). Replaces any earlier hook.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// use llm_bulkhead::testing::{set_pause_hook, clear_pause_hook, PausePoint};
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// let seen = std::rc::Rc::new(std::cell::Cell::new(0));
    /// let s = seen.clone();
    /// set_pause_hook(move |p| if p == PausePoint::DecisionCas { s.set(s.get() + 1) });
    /// let b = Bulkhead::new(1).unwrap();
    /// drop(b.try_acquire(Demand::slot()).unwrap());
    /// clear_pause_hook();
    /// assert_eq!(seen.get(), 1);
    /// # }
    /// ```
    pub fn set_pause_hook(hook: impl FnMut(PausePoint) + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    /// Removes the calling thread's pause hook.
    ///
    /// ```
    /// # #[cfg(feature = "testing")]
    /// llm_bulkhead::testing::clear_pause_hook();
    /// ```
    pub fn clear_pause_hook() {
        HOOK.with(|h| *h.borrow_mut() = None);
    }
}

/// Process-wide per-thread cells: one `AtomicU64` per thread for the life of the process, on a
/// cache line of its own, written by its thread and readable by every other (the reader markers
/// of the grace period, `crate::grace`). Unlike [`Stripes`] they belong to no bulkhead, so a
/// thread may still write its cell after the last reference to a bulkhead is gone.
///
/// A thread's first use takes `thread_local`'s global thread-id lock once (then a thread-local
/// pointer read). Under loom: a few slots claimed by each loom thread on first use, reset with
/// every execution (loom has no iterable per-thread storage).
pub(crate) mod per_thread {
    use super::AtomicU64;
    #[cfg(loom)]
    use super::Ordering;

    #[cfg(not(loom))]
    #[allow(clippy::disallowed_types)]
    static CELLS: thread_local::ThreadLocal<crossbeam_utils::CachePadded<AtomicU64>> =
        thread_local::ThreadLocal::new();

    #[cfg(not(loom))]
    std::thread_local! {
        /// This thread's entry of `CELLS` (null until its first use).
        static MINE: std::cell::Cell<*const AtomicU64> = const { std::cell::Cell::new(std::ptr::null()) };
    }

    /// The calling thread's cell.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn local() -> &'static AtomicU64 {
        let p = MINE.with(std::cell::Cell::get);
        if !p.is_null() {
            // SAFETY: `p` was taken from this thread's entry of the static `CELLS`, whose
            // entries keep their address for the life of the process.
            return unsafe { &*p };
        }
        local_slow()
    }

    #[cfg(not(loom))]
    #[cold]
    #[inline(never)]
    fn local_slow() -> &'static AtomicU64 {
        let r: &'static AtomicU64 = CELLS.get_or(Default::default);
        MINE.with(|m| m.set(r as *const AtomicU64));
        r
    }

    /// Visits every thread's cell (those made after the call started may be missed: their
    /// first write comes after the caller's barrier, see `crate::grace`).
    #[cfg(not(loom))]
    pub(crate) fn for_each(f: &mut dyn FnMut(&AtomicU64)) {
        for c in CELLS.iter() {
            f(c)
        }
    }

    /// How many threads a loom model may use (each claims a cell, [`index`]).
    #[cfg(loom)]
    pub(crate) const LOOM_THREADS: usize = 4;

    #[cfg(loom)]
    struct LoomCells {
        slots: [AtomicU64; LOOM_THREADS],
        next: super::AtomicUsize,
    }

    #[cfg(loom)]
    loom::lazy_static! {
        static ref CELLS: LoomCells = LoomCells {
            slots: Default::default(),
            next: super::AtomicUsize::new(0),
        };
    }

    #[cfg(loom)]
    loom::thread_local! {
        static SLOT: std::cell::Cell<Option<usize>> = std::cell::Cell::new(None);
    }

    /// The calling thread's cell (loom flavour).
    #[cfg(loom)]
    pub(crate) fn local() -> &'static AtomicU64 {
        let cells: &'static LoomCells = &CELLS;
        &cells.slots[index()]
    }

    /// The calling loom thread's index, below [`LOOM_THREADS`], claimed on its first call
    /// (loom flavour; the per-thread slots of other loom-only per-thread state use it too).
    #[cfg(loom)]
    pub(crate) fn index() -> usize {
        let cells: &'static LoomCells = &CELLS;
        SLOT.with(|s| match s.get() {
            Some(i) => i,
            None => {
                let i = cells.next.fetch_add(1, Ordering::Relaxed);
                assert!(i < LOOM_THREADS, "loom models use at most 4 threads");
                s.set(Some(i));
                i
            }
        })
    }

    /// Visits every thread's cell (loom flavour).
    #[cfg(loom)]
    pub(crate) fn for_each(f: &mut dyn FnMut(&AtomicU64)) {
        let n = CELLS.next.load(Ordering::Acquire).min(CELLS.slots.len());
        for c in &CELLS.slots[..n] {
            f(c)
        }
    }
}
