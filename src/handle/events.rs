//! The events' hooks on the paths of the handles (the subscriber list and the event types are
//! in `crate::record::events`, which imports nothing above it; the protocols' hooks, re-exported
//! here, in `crate::protocol::hooks`), and [`Subscription`].

pub(crate) use crate::protocol::hooks::{class_name, emit, rejected};
use crate::record::events::{AdmitEvent, Event, Interest};
use crate::shared::Shared;
use crate::vocab::demand::Priority;
use crate::vocab::id::AdmissionId;
use crate::Bulkhead;
use std::fmt;
use std::sync::Arc;

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
            timing: None, // filled in by the delivery when asked for
        })
    });
    // The decision's clock, if it was timed, has been read (`Bulkhead::try_acquire`).
    crate::record::timing::end();
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
        self.subscribe_to(Interest::ALL, listener)
    }

    /// Subscribes `listener` to the events of the kinds in `interest` only (see [`Interest`]):
    /// a decision builds and delivers an event only when someone asked for its kind, so a
    /// subscriber to refusals and reconfigurations costs the acquire + release pair nothing.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Event, Interest};
    /// let b = Bulkhead::new(1).unwrap();
    /// let sub = b.subscribe_to(Interest::RECONFIGURE, |e: &Event| assert_eq!(e.name(), "reconfigure"));
    /// drop(b.try_acquire(Demand::slot())); // not delivered, not built
    /// b.apply_limits(b.limits().with_revision(1)).unwrap();
    /// drop(sub);
    /// ```
    pub fn subscribe_to(
        &self,
        interest: Interest,
        listener: impl Fn(&Event) + Send + Sync + 'static,
    ) -> Subscription {
        let id = self.shared.events.add(interest, Arc::new(listener));
        Subscription {
            bulkhead: self.clone(),
            id,
        }
    }
}
