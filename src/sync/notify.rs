//! How to wake a waiter's owner, and the wake-ups a thread keeps until it has left its
//! operation (`crate::wait::list`, "Where wake-ups run"). Here because the deferred list is a
//! thread-local, and the crate's thread-locals live in this facade.

use crate::sync::thread::Thread;
use std::cell::{Cell, RefCell};
use std::task::Waker;

/// How to wake a waiter's owner. Not `Clone`: cloning a `Waker` runs user code, which must
/// not run under the queue lock; a drainer, woken more than once, shares its `Notify`
/// through an `Arc` instead (`Shared`), whose clone runs no user code.
pub(crate) enum Notify {
    None,
    Thread(Thread),
    Waker(Waker),
    Shared(std::sync::Arc<Notify>),
}

impl Notify {
    /// Wakes the owner. Owns what it wakes, so it needs no access to the node.
    #[inline(always)]
    pub(crate) fn wake(self) {
        match self {
            Notify::None => {}
            Notify::Thread(t) => t.unpark(),
            Notify::Waker(w) => w.wake(),
            Notify::Shared(n) => n.wake_by_ref(),
        }
    }

    fn wake_by_ref(&self) {
        match self {
            Notify::None => {}
            Notify::Thread(t) => t.unpark(),
            Notify::Waker(w) => w.wake_by_ref(),
            Notify::Shared(n) => n.wake_by_ref(),
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    /// Whether `DEFERRED` holds anything: a plain flag, so the check costs one load.
    static PENDING: Cell<bool> = const { Cell::new(false) };
    static DEFERRED: RefCell<Vec<Notify>> = const { RefCell::new(Vec::new()) };
}
#[cfg(loom)]
loom::thread_local! {
    static PENDING: Cell<bool> = Cell::new(false);
    static DEFERRED: RefCell<Vec<Notify>> = RefCell::new(Vec::new());
}

/// Keeps `n` on the calling thread until it delivers its deferred wake-ups.
pub(crate) fn defer(n: Notify) {
    DEFERRED.with(|d| d.borrow_mut().push(n));
    PENDING.with(|p| p.set(true));
}

/// Whether the calling thread keeps deferred wake-ups.
#[inline(always)]
pub(crate) fn pending() -> bool {
    PENDING.with(Cell::get)
}

/// Takes the calling thread's deferred wake-ups (the list is empty afterwards).
pub(crate) fn take() -> Vec<Notify> {
    PENDING.with(|p| p.set(false));
    DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()))
}
