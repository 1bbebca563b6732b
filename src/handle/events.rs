//! The events' hooks on the paths of the handles (the subscriber list and the event types are
//! in `crate::record::events`, which imports nothing above it), and [`Subscription`].

use crate::record::events::{AdmitEvent, Event, RejectEvent};
use crate::shared::Shared;
use crate::vocab::demand::Priority;
use crate::vocab::id::AdmissionId;
use crate::vocab::rejection::Rejection;
use crate::Bulkhead;
use std::fmt;
use std::sync::Arc;

/// Emits to the subscribers of `shared` if there are any (the hook every core path uses).
#[inline(always)]
pub(crate) fn emit(shared: &Shared, make: impl FnOnce() -> Event) {
    if shared.events.on() {
        shared.events.emit(make);
    }
}

/// The `admit` hook (the caller checked the flag).
#[cold]
#[inline(never)]
pub(crate) fn admitted(
    shared: &Shared,
    id: AdmissionId,
    revision: u64,
    priority: Priority,
    reservation: Option<crate::Reservation>,
    class: crate::handle::admission::ClassCode,
) {
    shared.events.emit(|| {
        let (k, resources) = class.parts();
        Event::Admit(AdmitEvent {
            admission_id: id,
            revision,
            priority,
            class: class_name(shared, k),
            reserved_tokens: reservation.map_or(0, |r| r.total()),
            resources,
        })
    });
}

/// The `reject` hook: one relaxed load unless subscribed.
#[inline(always)]
pub(crate) fn rejected(shared: &Shared, class: Option<usize>, rejection: &Rejection) {
    if shared.events.on() {
        emit_rejected(shared, class, rejection);
    }
}

#[cold]
#[inline(never)]
fn emit_rejected(shared: &Shared, class: Option<usize>, rejection: &Rejection) {
    shared.events.emit(|| {
        let mut rejection = rejection.clone();
        if !shared.classed {
            // A refusal at queue entry gets its queue length from the caller after it is
            // built; report the queue as it is now (no caller holds the queue lock here).
            rejection.set_pending(crate::protocol::handoff::pending(shared) as u64);
        }
        Event::Reject(RejectEvent {
            class: class_name(shared, class),
            rejection,
        })
    });
}

/// The name of class `k` of `shared`, for an event.
pub(crate) fn class_name(shared: &Shared, k: Option<usize>) -> Option<String> {
    k.and_then(|k| shared.class_names.get(k).cloned())
}

/// A subscription: dropping it unsubscribes. It holds a handle to the bulkhead.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Event};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// let b = Bulkhead::new(1).unwrap();
/// let n = Arc::new(AtomicU64::new(0));
/// let m = n.clone();
/// let sub = b.subscribe(move |_: &Event| { m.fetch_add(1, Ordering::Relaxed); });
/// drop(b.try_acquire(Demand::slot()));
/// drop(sub);
/// drop(b.try_acquire(Demand::slot()));
/// assert_eq!(n.load(Ordering::Relaxed), 2); // admit + release, then nothing
/// ```
#[must_use = "dropping a Subscription unsubscribes at once"]
pub struct Subscription {
    bulkhead: Bulkhead,
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.bulkhead.shared.events.remove(self.id);
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Bulkhead {
    /// Subscribes `listener` to every event of this bulkhead until the returned
    /// [`Subscription`] is dropped (see `crate::record::events` for delivery and cost).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Event};
    /// let b = Bulkhead::new(1).unwrap();
    /// let sub = b.subscribe(|e: &Event| println!("{}", e.name()));
    /// drop(b.try_acquire(Demand::slot()));
    /// drop(sub);
    /// ```
    pub fn subscribe(&self, listener: impl Fn(&Event) + Send + Sync + 'static) -> Subscription {
        let id = self.shared.events.add(Arc::new(listener));
        Subscription {
            bulkhead: self.clone(),
            id,
        }
    }
}
