//! The asynchronous waits: the [`Acquire`] and [`AcquireTimed`] futures (`super`,
//! "Protocol").

use super::*;
use crate::record::events::{decision_start, set_queued, Interest, TimingScope};

/// The future of [`Bulkhead::acquire`].
///
/// # Panics
/// If the process-wide deadline timer thread (started by the first wait with a deadline)
/// cannot be spawned, because the OS refuses a thread: a resource failure, not bad input.
///
/// # Cancel safety
/// Dropping it removes its waiter from the queue; if it had already been handed a slot, the
/// slot is released at once and passes to the next waiter.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
/// let b = Bulkhead::builder().max_concurrent(1).max_queue(2).build().unwrap();
/// let held = b.try_acquire(Demand::slot()).unwrap();
/// let fut = b.acquire(Demand::slot(), WaitOptions::default());
/// drop(fut); // never polled: nothing was queued
/// drop(held);
/// assert_eq!(b.stats().pending, 0);
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a> {
    pub(super) bulkhead: &'a Bulkhead,
    pub(super) demand: Demand,
    pub(super) options: WaitOptions,
    /// It entered the queue (`wait` is then `Some`).
    pub(super) queued: bool,
    /// It returned `Ready`. A future that queued sets it only once its timer entry and its
    /// cancellation registration are gone (so its drop has nothing left to do).
    pub(super) finished: bool,
    /// Timing requested ([`Bulkhead::acquire_timed`]): the queue wait is measured.
    pub(super) timed: bool,
    /// The waiter and its registrations: built only when the first poll's fast decision says
    /// the demand must wait (a demand answered at once never builds a node).
    pub(super) wait: Option<Wait>,
}

/// A queued [`Acquire`]'s state (structurally pinned: `node` is linked by address).
pub(super) struct Wait {
    node: Waiter,
    /// When the wait times out (`options.timeout` from when it queued).
    deadline: Option<Instant>,
    /// The timer entry that wakes this future at its deadline.
    timer: Option<u64>,
    /// Its waker's registration with `options.cancel`, while queued.
    cancel_reg: Option<u64>,
    /// When it joined the queue (if measured).
    since: Option<Instant>,
    /// How long it was queued, once it finished (measured only if `timed` or the bulkhead
    /// measures queue waits).
    pub(super) queue_wait: Option<Duration>,
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("queued", &self.queued)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Future for Acquire<'_> {
    type Output = Result<Admission, Rejection>;

    // Always inlined, as `try_acquire` is, and for the same reason: every path ends in the few
    // scalars of a `Granted` (the out-of-line paths return those, not an admission) and the
    // admission is built once, here, so the awaiting code can keep it in registers. Built in
    // an out-of-line `poll` and returned through memory, the awaiting code read it back with
    // loads wider than the stores that wrote it, which stalled on store forwarding.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `wait` (the node) is never moved out of the pinned future (it is written in
        // place, once, while `None`); the other fields are plain data, not structurally pinned.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(!this.finished, "Acquire polled after completion");
        let b = this.bulkhead;
        let _timing = this.timing();
        let (g, priority, reservation) = 'granted: {
            let slow = if this.queued {
                this.poll_queued(cx)
            } else {
                if this
                    .options
                    .cancel
                    .as_ref()
                    .is_some_and(CancelToken::is_cancelled)
                {
                    this.finished = true;
                    return Poll::Ready(Err(b.waiter_refusal(RejectReason::Aborted, &this.demand)));
                }
                // The first poll: `try_acquire`'s decision, and nothing else unless it must wait.
                match b.decide_fast(&this.demand) {
                    Some(Ok(fast)) => {
                        this.finished = true;
                        break 'granted fast;
                    }
                    Some(Err(rej)) => {
                        this.finished = true;
                        return Poll::Ready(Err(rej));
                    }
                    None => this.start_waiting(cx),
                }
            };
            match slow {
                Poll::Ready(Ok(g)) => {
                    let (priority, reservation) = b.admission_parts(&this.demand);
                    (g, priority, reservation)
                }
                Poll::Ready(Err(rej)) => return Poll::Ready(Err(rej)),
                Poll::Pending => return Poll::Pending,
            }
        };
        Poll::Ready(Ok(b.admission_from(g, priority, reservation)))
    }
}

#[cfg(feature = "llm")]
impl Acquire<'_> {
    /// Whether the demand entered the queue (the LLM layer's timed runs, its one user, read
    /// it once the future is answered).
    pub(crate) fn was_queued(&self) -> bool {
        self.queued
    }
}

impl Acquire<'_> {
    /// The decision timing of this poll (`Interest::DECISION_TIMING`): the first poll reads
    /// the clock only if a subscriber asked (one relaxed load otherwise). A queued waiter's
    /// later polls resume from when it joined the queue (the node keeps no other instant, to
    /// keep the future's size), so its `decision_ns` counts the deciding done after the
    /// queue, not the first poll's (a fast decision, well under a microsecond).
    #[inline(always)]
    fn timing(&self) -> TimingScope {
        match &self.wait {
            Some(w) if self.queued => {
                let on = self.bulkhead.shared.events.wants(Interest::DECISION_TIMING);
                TimingScope::resume(w.since.filter(|_| on))
            }
            _ => self.bulkhead.shared.events.time_decision(),
        }
    }

    /// The first poll found no free slot: builds the node (in place) and enters the queue,
    /// which decides again under the mutex. `self` is pinned (called from `poll` only).
    #[inline(never)]
    fn start_waiting(&mut self, cx: &mut Context<'_>) -> Poll<Result<Granted, Rejection>> {
        let b = self.bulkhead;
        let (r, k, priority, _) = b.demand_parts(&self.demand);
        // The node is built, with its clone of the waker, before the queue lock (a clone runs
        // the user's code, `crate::wait::list`, "Where wake-ups run"); the enqueue only links
        // it under the lock. If the demand is answered there instead, the node is never
        // linked, and its waker goes with the future.
        let w = self.wait.insert(Wait {
            node: Waiter::new(r, k, priority, Notify::Waker(cx.waker().clone())),
            deadline: None,
            timer: None,
            cancel_reg: None,
            since: None,
            queue_wait: None,
        });
        // SAFETY: the future is pinned, so `wait` is too; it was `None`, so nothing pinned was
        // moved or dropped by this write.
        let node = unsafe { Pin::new_unchecked(&w.node) };
        let make = node_maker(move || node);
        match b.enter_after_fast(k, r, priority, make) {
            Enter::Granted(g) => {
                self.finished = true;
                Poll::Ready(Ok(g))
            }
            Enter::Refused(rej) => {
                self.finished = true;
                Poll::Ready(Err(rej))
            }
            Enter::Queued => {
                self.queued = true;
                let Some(w) = self.wait.as_mut() else {
                    unreachable!("a queued waiter has its node")
                };
                w.since = if self.timed || decision_start().is_some() {
                    Some(Instant::now())
                } else {
                    wait_started(b)
                };
                w.deadline = deadline_after(self.options.timeout.resolve(b.shared.default_timeout));
                if let Some(at) = w.deadline {
                    w.timer = Some(crate::wait::timer::register(at, cx.waker().clone()));
                }
                if let Some(tok) = &self.options.cancel {
                    w.cancel_reg = Some(tok.register_waker(None, cx.waker()));
                    if tok.is_cancelled() {
                        // Cancelled before the registration: look again at once.
                        cx.waker().wake_by_ref();
                    }
                }
                Poll::Pending
            }
        }
    }

    /// A later poll of a queued waiter. `self` is pinned (called from `poll` only).
    #[inline(never)]
    fn poll_queued(&mut self, cx: &mut Context<'_>) -> Poll<Result<Granted, Rejection>> {
        let b = self.bulkhead;
        let Some(Wait {
            node,
            deadline,
            timer,
            cancel_reg,
            since,
            queue_wait,
            ..
        }) = self.wait.as_mut()
        else {
            unreachable!("a queued waiter has its node")
        };
        // SAFETY: the future is pinned, so `wait.node` is too.
        let node = unsafe { Pin::new_unchecked(&*node) };
        let (_, _, priority, reservation) = b.demand_parts(&self.demand);
        if !node.is_done() {
            let cancelled = self
                .options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled);
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if cancelled || timed_out {
                let reason = if cancelled {
                    RejectReason::Aborted
                } else {
                    RejectReason::Timeout
                };
                let outcome = b.leave(node, reason);
                end_registrations(timer, self.options.cancel.as_ref(), cancel_reg);
                self.finished = true;
                *queue_wait = since.map(|s| s.elapsed());
                if let Some(q) = *queue_wait {
                    set_queued(q);
                }
                return Poll::Ready(b.finish_wait(
                    outcome,
                    *since,
                    &self.demand,
                    priority,
                    reservation,
                ));
            }
            if let Some(t) = *timer {
                crate::wait::timer::update(t, cx.waker());
            }
            if let (Some(tok), Some(id)) = (&self.options.cancel, *cancel_reg) {
                tok.register_waker(Some(id), cx.waker());
            }
            let guard = b.shared.slow_path();
            let q = guard.lock_queue();
            if !node.is_done() {
                if !node.needs_waker(&q, cx.waker()) {
                    return Poll::Pending;
                }
                // A new waker: cloned outside the lock, and the old one dropped outside it
                // (both run the user's code, `crate::wait::list`, "Where wake-ups run").
                drop(q);
                let fresh = Notify::Waker(cx.waker().clone());
                let q = guard.lock_queue();
                if !node.is_done() {
                    let old = node.replace_notify(&q, fresh);
                    drop(q);
                    drop(old);
                    return Poll::Pending;
                }
                drop(q);
                drop(fresh);
            }
        }
        end_registrations(timer, self.options.cancel.as_ref(), cancel_reg);
        self.finished = true;
        *queue_wait = since.map(|s| s.elapsed());
        if let Some(q) = *queue_wait {
            set_queued(q);
        }
        // SAFETY: `is_done` returned true on this thread (the branch above, or the check
        // under the lock).
        let outcome = unsafe { node.outcome() };
        Poll::Ready(b.finish_wait(outcome, *since, &self.demand, priority, reservation))
    }
}

/// Pins down a node-making closure's type as `FnOnce` (it returns a borrow of what it owns).
fn node_maker<'n, F: FnOnce() -> Pin<&'n Waiter>>(f: F) -> F {
    f
}

/// Ends a waiter's timer entry and its cancellation registration (the wait is over).
fn end_registrations(timer: &mut Option<u64>, cancel: Option<&CancelToken>, reg: &mut Option<u64>) {
    if let Some(t) = timer.take() {
        crate::wait::timer::cancel(t);
    }
    if let (Some(tok), Some(id)) = (cancel, reg.take()) {
        tok.unregister_waker(id);
    }
}

impl Drop for Acquire<'_> {
    #[inline]
    fn drop(&mut self) {
        // A future that finished after it queued ended its registrations before it set
        // `finished` (`poll_queued`): nothing is left to do, and the common drop (of a future
        // that was answered) costs two flag tests.
        if self.queued && !self.finished {
            self.drop_queued();
        }
    }
}

impl Acquire<'_> {
    /// The drop of a future that is still queued: ends its registrations and leaves the queue
    /// (releasing a slot handed to it meanwhile).
    #[cold]
    #[inline(never)]
    fn drop_queued(&mut self) {
        let b = self.bulkhead;
        let Some(w) = self.wait.as_mut() else {
            return;
        };
        end_registrations(
            &mut w.timer,
            self.options.cancel.as_ref(),
            &mut w.cancel_reg,
        );
        // SAFETY: the future is being dropped in place: `node` has not moved since it was
        // pinned and is still alive here.
        let node = unsafe { Pin::new_unchecked(&w.node) };
        let outcome = b.leave(node, RejectReason::Aborted);
        book_wait(b, w.since);
        if let Outcome::Granted { .. } = outcome {
            // Handed a slot after it stopped waiting: take it and release it at once, which
            // passes it to the next waiter.
            let (_, _, priority, reservation) = b.demand_parts(&self.demand);
            drop(b.finish(outcome, &self.demand, priority, reservation));
        }
    }
}

/// The future of [`Bulkhead::acquire_timed`]: an [`Acquire`] that also reports its timing.
///
/// # Panics
/// If the process-wide deadline timer thread (started by the first wait with a deadline)
/// cannot be spawned, because the OS refuses a thread: a resource failure, not bad input.
///
/// # Cancel safety
/// As [`Acquire`]: dropping it removes its waiter; a slot granted meanwhile passes on.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, WaitOptions};
/// let b = Bulkhead::new(1).unwrap();
/// let f = b.acquire_timed(Demand::slot(), WaitOptions::default());
/// let t = futures_lite::future::block_on(f);
/// assert!(t.value.is_ok());
/// ```
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct AcquireTimed<'a> {
    pub(super) inner: Acquire<'a>,
    /// The first poll (the decision's start).
    pub(super) start: Option<Instant>,
}

impl Future for AcquireTimed<'_> {
    type Output = Timed<Result<Admission, Rejection>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `inner` is structurally pinned (never moved out of the pinned future);
        // `start` is plain data.
        let this = unsafe { self.get_unchecked_mut() };
        let start = *this.start.get_or_insert_with(Instant::now);
        // SAFETY: `this` is pinned, so `inner` is too.
        let inner = unsafe { Pin::new_unchecked(&mut this.inner) };
        match inner.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(value) => {
                let total = start.elapsed();
                let wait = (this.inner.wait.as_ref())
                    .and_then(|w| w.queue_wait)
                    .unwrap_or_default();
                Poll::Ready(Timed {
                    value,
                    timing: Timing {
                        decision_ns: nanos(total.saturating_sub(wait)),
                        queue_wait_ns: nanos(wait),
                    },
                })
            }
        }
    }
}
