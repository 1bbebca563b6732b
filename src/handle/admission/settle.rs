//! How an [`Admission`] settles: the release paths (booked, observed, other), usage checks
//! and hold growth.

use super::*;

/// What a release event says about its admission.
#[derive(Clone, Copy)]
pub(super) struct Described {
    pub(super) id: AdmissionId,
    pub(super) revision: u64,
    pub(super) class: ClassBits,
    pub(super) reservation: Option<Reservation>,
    pub(super) sequence: u64,
}

/// `settle_other` for an admission made while someone subscribed: settles, then reports
/// the release with a handle pinned first (the return may otherwise free the state).
#[cold]
#[inline(never)]
pub(super) fn settle_observed(
    slot: SlotRef,
    held: u64,
    usage: Option<Usage>,
    d: Described,
) -> Settled {
    let pin = slot.try_pin();
    let s = settle_unobserved(slot, d.class, held, usage, d.reservation.is_some());
    if let Some(shared) = pin {
        crate::handle::events::emit(&shared, || {
            Event::Release(ReleaseEvent {
                admission_id: d.id,
                revision: d.revision,
                priority: d.class.priority(),
                class: crate::handle::events::class_name(&shared, d.class.index()),
                reserved_tokens: d.reservation.map_or(0, |r| r.total()),
                resources: d.class.resources(),
                held_tokens: s.held,
                refunded_tokens: s.refunded,
                usage_sequence: d.sequence,
                usage: s.usage,
            })
        });
    }
    s
}

/// The out-of-line end of `Admission::settle_quietly` (a release whose result nobody reads):
/// a class admission with nothing to book, not abandoned and not observed, returns its class
/// slot and hold at once (`SlotRef::return_class_slot`); anything else is `settle_other`.
#[inline(never)]
pub(super) fn settle_quiet(slot: SlotRef, held: u64, usage: Option<Usage>, d: Described) {
    let kind = d.class.0
        & (ClassBits::HAS | ClassBits::ABANDONED | ClassBits::OBSERVED | ClassBits::BORROWED);
    if usage.is_none() {
        // Two copies of the release, each with its hint a constant: the protected one pays
        // nothing for the other.
        if kind == ClassBits::HAS {
            return slot.return_class_slot(d.class.class_index(), held, false);
        }
        if kind & !ClassBits::BORROWED == ClassBits::HAS {
            return slot.return_class_slot(d.class.class_index(), held, true);
        }
    }
    settle_other(slot, held, usage, d);
}

/// `to − from` as a signed token delta (saturating; token counts stay far below `i64::MAX`).
pub(super) fn signed_delta(from: u64, to: u64) -> i64 {
    if to >= from {
        i64::try_from(to - from).unwrap_or(i64::MAX)
    } else {
        i64::try_from(from - to).map_or(i64::MIN, |d| -d)
    }
}

/// Every other end of `Admission::settle`: with usage to book, or with a class (a drop's class
/// release with nothing to book goes through [`settle_quiet`] first). Out of line.
#[inline(never)]
pub(super) fn settle_other(
    slot: SlotRef,
    held: u64,
    usage: Option<Usage>,
    d: Described,
) -> Settled {
    if d.class.has(ClassBits::OBSERVED) {
        return settle_observed(slot, held, usage, d);
    }
    settle_unobserved(slot, d.class, held, usage, d.reservation.is_some())
}

/// `settle_other` without an event.
#[inline(always)]
pub(super) fn settle_unobserved(
    slot: SlotRef,
    class: ClassBits,
    held: u64,
    usage: Option<Usage>,
    has_reservation: bool,
) -> Settled {
    let consumed = usage.and_then(|u| u.total());
    let refunded = match consumed {
        Some(consumed) if has_reservation => held.saturating_sub(consumed),
        _ => 0,
    };
    if consumed.is_none() && !class.has(ClassBits::ABANDONED) {
        if let Some(k) = class.index() {
            slot.return_class_slot(k, held, class.borrowed());
            return Settled {
                held,
                consumed,
                refunded,
                usage,
            };
        }
    }
    settle_booked(slot, class, held, consumed, refunded);
    Settled {
        held,
        consumed,
        refunded,
        usage,
    }
}

/// The rest of `Admission::settle` when something is booked: consumption and refunds, class
/// statistics (class mode), then the slot (class mode: the class slot, or after abandonment
/// the tokens and the pin) goes back. Out of line.
#[inline(never)]
pub(super) fn settle_booked(
    slot: SlotRef,
    class: ClassBits,
    held: u64,
    consumed: Option<u64>,
    refunded: u64,
) {
    let shared = slot.get();
    let c = shared.counters.local(Counters::new);
    if let Some(consumed) = consumed {
        c.total_consumed.add(consumed);
        if refunded > 0 {
            c.total_refunded.add(refunded);
        }
    }
    match class.index() {
        None => slot.return_slot(held),
        Some(k) => {
            let cc = &c.classes[k];
            if let Some(consumed) = consumed {
                cc.consumed.add(consumed);
            }
            if refunded > 0 {
                cc.refunded.add(refunded);
            }
            if class.has(ClassBits::ABANDONED) {
                c.abandoned_settled.add(1);
                cc.abandoned_settled.add(1);
            }
            if class.has(ClassBits::PINNED) {
                // The slot went back at abandonment: return the tokens only, then let the pin
                // go (its drop frees the state if it was the last owner).
                crate::protocol::classed::return_tokens(shared, k, held);
                // SAFETY: `PINNED` is set only after `try_pin` counted a handle that was then
                // forgotten, and this runs once per admission (its slot was just taken).
                drop(unsafe { slot.into_pinned_handle() });
                // Its pump's wake-ups, after the decrease's operation and the pin's drop (a
                // waker that panics finds the state freed if this was the last owner).
                crate::protocol::class_pump::deliver_deferred();
            } else {
                slot.return_class_slot(k, held, class.borrowed());
            }
        }
    }
}

/// The checks every usage report makes before anything changes (an admission's, and those of
/// the layers above that validate usage as an admission would): sums that fit, the report
/// clamped so no field decreases, and a reconciliation within the output cap. Returns the
/// clamped usage and its total.
pub(crate) fn checked_report(
    usage: Usage,
    previous: Option<Usage>,
    reservation: Option<Reservation>,
    reconcile: Option<Reconcile>,
) -> Result<(Usage, u64), UsageError> {
    usage
        .total()
        .ok_or(UsageError::Overflow { field: "usage" })?;
    let clamped = usage.clamp_after(previous);
    let consumed = clamped
        .total()
        .ok_or(UsageError::Overflow { field: "usage" })?;
    if let (Some(res), Some(rc)) = (reservation, reconcile) {
        if rc.remaining_output > res.max_output() {
            return Err(UsageError::RemainingExceedsCap {
                remaining: rc.remaining_output,
                cap: res.max_output(),
            });
        }
    }
    Ok((clamped, consumed))
}

/// Class mode of [`grow_hold`] (see `crate::protocol::classed::grow_tokens`).
#[inline(never)]
pub(super) fn grow_class_hold(
    shared: &Shared,
    k: usize,
    delta: u64,
    new_hold: u64,
) -> Result<(), UsageError> {
    let grown = crate::protocol::classed::grow_tokens(shared, k, delta);
    // Its pump's wake-ups, after the growth's operation (`crate::wait::list`).
    crate::protocol::class_pump::deliver_deferred();
    grown.map_err(|()| UsageError::HoldTooLarge {
        hold: new_hold,
        max: crate::words::class_word::MAX_CLASSED_HOLD,
    })?;
    let c = shared.counters.local(Counters::new);
    c.total_overrun.add(delta);
    c.classes[k].overrun.add(delta);
    Ok(())
}

/// Adds `delta` to the tokens in flight, with no admission check, refusing only growth past
/// what the word can hold (`crate::protocol::plain::grow_tokens`). Lock-free.
pub(super) fn grow_hold(shared: &Shared, delta: u64, new_hold: u64) -> Result<(), UsageError> {
    crate::protocol::plain::grow_tokens(shared, delta).map_err(|()| UsageError::HoldTooLarge {
        hold: new_hold,
        max: MAX_TOKENS,
    })?;
    shared
        .counters
        .local(Counters::new)
        .total_overrun
        .add(delta);
    Ok(())
}
