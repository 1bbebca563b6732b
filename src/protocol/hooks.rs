//! The events' hooks on the protocols' paths (the subscriber list and the event types are in
//! `crate::record::events`; the handles' hooks, which know the `Admission`, in
//! `crate::handle::events`). Each costs one relaxed load of the subscribed flag unless someone
//! subscribed.

use crate::record::events::{Event, Interest, RejectEvent};
use crate::shared::Shared;
use crate::vocab::rejection::Rejection;

/// Emits to the subscribers of `shared` if there are any (the hook every core path uses).
#[inline(always)]
pub(crate) fn emit(shared: &Shared, make: impl FnOnce() -> Event) {
    if shared.events.on() {
        shared.events.emit(make);
    }
}

/// The `reject` hook of a refusal in class `class` (`None` without classes). It also ends the
/// decision's clock when decision timing is asked for (`Bulkhead::try_acquire` times its
/// decision without a scope).
#[inline(always)]
pub(crate) fn rejected(shared: &Shared, class: Option<usize>, rejection: &Rejection) {
    if shared
        .events
        .wants(Interest::REJECT | Interest::DECISION_TIMING)
    {
        emit_rejected(shared, class, rejection);
    }
}

#[cold]
#[inline(never)]
fn emit_rejected(shared: &Shared, class: Option<usize>, rejection: &Rejection) {
    if shared.events.wants(Interest::REJECT) {
        deliver_rejected(shared, class, rejection);
    }
    crate::record::timing::end();
}

fn deliver_rejected(shared: &Shared, class: Option<usize>, rejection: &Rejection) {
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
            timing: None, // filled in by the delivery when asked for
        })
    });
}

/// The name of class `k` of `shared`, for an event.
pub(crate) fn class_name(shared: &Shared, k: Option<usize>) -> Option<String> {
    k.and_then(|k| shared.class_names.get(k).cloned())
}
