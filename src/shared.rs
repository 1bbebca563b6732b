//! The state every handle and admission of one bulkhead shares, and the reference count that
//! keeps it alive.
//!
//! The reference count lives on the same cache line as the state word. An admission must keep
//! the bulkhead alive (admissions are `Send + 'static`), and with a `std::sync::Arc` the count
//! would sit on a different, equally contended line: every admission would touch two contended
//! lines. Here the count's increment hits the line the admission CAS just took exclusively.

use crate::limits::{LimitsSnapshot, Ring};
use crate::stats::Counters;
use crate::sync::{fence, AtomicU64, AtomicUsize, Mutex, Ordering, Stripes};
use crossbeam_utils::CachePadded;
use std::ptr::NonNull;

/// The contended line: the state word and the reference count.
pub(crate) struct HotLine {
    /// The packed state word; see [`crate::state`].
    pub(crate) word: AtomicU64,
    refs: AtomicUsize,
}

/// The canonical limits, owned by the reconfiguration lock.
pub(crate) struct Canonical {
    pub(crate) current: LimitsSnapshot,
    /// The tag of `current` in the state word (only the lock holder changes the tag).
    pub(crate) tag: usize,
}

pub(crate) struct Shared {
    pub(crate) hot: CachePadded<HotLine>,
    pub(crate) ring: Ring,
    pub(crate) counters: Stripes<Counters>,
    pub(crate) reconfig: Mutex<Canonical>,
    pub(crate) has_budget: bool,
}

/// A counted reference to [`Shared`], like `Arc<Shared>` but with the count on the hot line.
pub(crate) struct SharedRef(NonNull<Shared>);

// SAFETY: `SharedRef` is an owning, reference-counted pointer to a `Shared`, which is itself
// `Send + Sync` (atomics, a mutex, and per-thread counters of `Send` data; checked below). As for
// `Arc<T: Send + Sync>`, moving or sharing the pointer across threads only moves or shares
// access to a `Sync` value, and the count is atomic.
unsafe impl Send for SharedRef {}
// SAFETY: as above: `&SharedRef` only gives `&Shared`, and `Shared: Sync`.
unsafe impl Sync for SharedRef {}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Shared>();
};

impl SharedRef {
    pub(crate) fn new(word: u64, ring: Ring, canonical: Canonical, has_budget: bool) -> SharedRef {
        let shared = Shared {
            hot: CachePadded::new(HotLine {
                word: AtomicU64::new(word),
                refs: AtomicUsize::new(1),
            }),
            ring,
            counters: Stripes::new(),
            reconfig: Mutex::new(canonical),
            has_budget,
        };
        SharedRef(NonNull::from(Box::leak(Box::new(shared))))
    }
}

impl std::ops::Deref for SharedRef {
    type Target = Shared;

    #[inline]
    fn deref(&self) -> &Shared {
        // SAFETY: the allocation is freed only when the last `SharedRef` is dropped, and `self`
        // is a live `SharedRef`, so the count is at least 1 and the pointee is alive.
        unsafe { self.0.as_ref() }
    }
}

impl Clone for SharedRef {
    #[inline]
    fn clone(&self) -> SharedRef {
        // Relaxed suffices for an increment from a live reference (as in `Arc::clone`): the new
        // reference is derived from one that already keeps the value alive.
        let old = self.hot.refs.fetch_add(1, Ordering::Relaxed);
        if old > isize::MAX as usize {
            // Only reachable by leaking more than isize::MAX references; aborting is what `Arc`
            // does, since continuing could overflow the count and free a live value.
            std::process::abort();
        }
        SharedRef(self.0)
    }
}

impl Drop for SharedRef {
    #[inline]
    fn drop(&mut self) {
        // Release: every use of the value through this reference happens-before the free.
        if self.hot.refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Acquire: pairs with the Release decrements of all other references.
        fence(Ordering::Acquire);
        // SAFETY: the count reached zero, so this was the last reference: nobody else can reach
        // the allocation, which `new` made with `Box::new` and leaked exactly once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}
