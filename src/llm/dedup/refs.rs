//! The references to a flight: [`Flight`], the counted one every participant (and every waker
//! the work keeps) holds, and [`FlightPtr`], the map's uncounted address.
//!
//! A flight is one `Box` allocation with a single reference count ([`Head::refs`]), not an
//! `Arc`: an `Arc` keeps a weak count beside the strong one, and the drop of its last strong
//! reference decrements that weak count too, a second locked read-modify-write that a flight
//! (never referenced weakly) does not need. The count follows `Arc`'s protocol otherwise: a
//! new reference is a `Relaxed` increment made from an existing one; a reference given up is
//! a `Release` decrement, and the one that takes the count to zero frees the flight after an
//! `Acquire` fence (every other holder's accesses happen before the free).

use super::*;
use crate::sync::fence;
use std::ptr::NonNull;

/// A counted reference to a flight (see the module docs). Dereferences to its operations.
pub(in crate::llm) struct Flight<T> {
    ptr: NonNull<dyn Shared<T>>,
}

// SAFETY: a `Flight` is a shared reference to a `dyn Shared<T>`, which is `Send + Sync`, and
// its count is atomic: sending or sharing it is what sending or sharing an `Arc` of it is.
unsafe impl<T> Send for Flight<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Flight<T> {}

impl<T> Flight<T> {
    /// The first reference to a new flight.
    ///
    /// # Safety
    /// `ptr` is `Box::leak` (or `Box::into_raw`) of a flight whose count ([`Head::refs`]) is
    /// one, and this
    /// reference becomes its owner.
    pub(in crate::llm) unsafe fn adopt(ptr: NonNull<dyn Shared<T>>) -> Flight<T> {
        Flight { ptr }
    }

    /// The flight's address, with its allocation's provenance (what a waker is made from).
    pub(in crate::llm) fn as_ptr(&self) -> *const dyn Shared<T> {
        self.ptr.as_ptr()
    }
}

impl<T> std::ops::Deref for Flight<T> {
    type Target = dyn Shared<T>;
    fn deref(&self) -> &(dyn Shared<T> + 'static) {
        // SAFETY: this reference holds a count, so the flight is live; only shared
        // references to it are ever made.
        unsafe { self.ptr.as_ref() }
    }
}

/// Takes one more count on the flight whose head is `head`, as `Arc::clone` does: `Relaxed`,
/// as the caller's own reference keeps the flight live and orders nothing, and an abort
/// before the count could overflow.
pub(in crate::llm) fn retain<T>(head: &Head<T>) {
    if head.refs.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
        std::process::abort();
    }
}

/// Gives one count back on the flight whose head is `head`; `true` if it was the last (the
/// caller then frees the flight, nobody else referring to it).
pub(in crate::llm) fn release<T>(head: &Head<T>) -> bool {
    // Release: this holder's accesses to the flight happen before its free. The Acquire
    // fence of the last one makes every holder's accesses happen before it.
    if head.refs.fetch_sub(1, Ordering::Release) != 1 {
        return false;
    }
    fence(Ordering::Acquire);
    true
}

impl<T> Drop for Flight<T> {
    fn drop(&mut self) {
        if release(self.head()) {
            // SAFETY: that was the last count, so nothing else refers to the flight; `ptr` is
            // `Box::leak` of it (`adopt`), with the allocation's provenance, and the `Box`
            // frees it with its concrete type's drop and layout.
            drop(unsafe { Box::from_raw(self.ptr.as_ptr()) });
        }
    }
}

/// A flight as the map holds it: its address, **not** a counted reference, so that entering a
/// flight in the map and removing it cost no reference-count traffic (two locked
/// read-modify-writes of a leader's path).
///
/// It stays valid by this invariant: *an entry naming a flight is removed (or overwritten)
/// before the last counted reference to the flight is dropped.* Until the flight is settled
/// ([`DONE`] turned on, at the latest by the last participant to leave) a participant is
/// left, and every participant holds a counted `Flight` until it has left. The participant
/// that settles it (its completer, the one whose poll panicked, or the last to leave) removes
/// the key, if the entry still names this flight, before it drops its own reference; a leader
/// whose flight nobody joined removes it, under the map's lock, before it drops its own. An
/// entry is read, overwritten or removed only under the map's lock.
pub(in crate::llm) struct FlightPtr<T>(NonNull<dyn Shared<T>>);

// SAFETY: a `FlightPtr` stands for a reference to a live flight (the invariant above), shared
// the way `&Flight<T>` would be, and only read under the map's lock; `dyn Shared<T>` is
// `Send + Sync`, so sending or sharing the address is sending or sharing such a reference.
unsafe impl<T> Send for FlightPtr<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for FlightPtr<T> {}

impl<T> FlightPtr<T> {
    /// The address of `flight`, for the map.
    pub(in crate::llm) fn of(flight: &Flight<T>) -> FlightPtr<T> {
        FlightPtr(flight.ptr)
    }

    /// Whether this is `flight` (a comparison of addresses: `flight` is live, and a live
    /// allocation has an address of its own).
    pub(in crate::llm) fn is(&self, flight: &Flight<T>) -> bool {
        std::ptr::addr_eq(self.0.as_ptr(), flight.ptr.as_ptr())
    }

    /// The flight, borrowed.
    ///
    /// # Safety
    /// The entry holding this pointer is in the map, read under the map's lock (the invariant
    /// above makes the flight live for as long as that lock is held).
    pub(in crate::llm) unsafe fn get(&self) -> &dyn Shared<T> {
        // SAFETY: live by the caller's contract; only shared references are ever made.
        unsafe { self.0.as_ref() }
    }

    /// A counted reference to the flight, for a follower that joins it.
    ///
    /// # Safety
    /// As for [`get`](Self::get).
    pub(in crate::llm) unsafe fn counted(&self) -> Flight<T> {
        // SAFETY: live by the caller's contract, with a count of at least one (a participant's,
        // by the invariant above), so one more may be taken and owned by the new reference;
        // the pointer is the one `adopt` was given, with the allocation's provenance.
        retain(unsafe { self.get() }.head());
        Flight { ptr: self.0 }
    }
}
