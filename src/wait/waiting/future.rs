//! The asynchronous waits: the [`Acquire`] and [`AcquireTimed`] futures (`super`,
//! "Protocol").

use super::*;

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
    pub(super) reservation: Option<Reservation>,
    pub(super) node: Waiter,
    pub(super) queued: bool,
    pub(super) finished: bool,
    /// When the wait times out (`options.timeout` from the first poll).
    pub(super) deadline: Option<Instant>,
    /// The timer entry that wakes this future at its deadline.
    pub(super) timer: Option<u64>,
    /// Its waker's registration with `options.cancel`, while queued.
    pub(super) cancel_reg: Option<u64>,
    /// When it joined the queue.
    pub(super) since: Option<Instant>,
    /// Timing requested ([`Bulkhead::acquire_timed`]): the queue wait is measured.
    pub(super) timed: bool,
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `node` is never moved out of the pinned future; the other fields are plain
        // data that are not structurally pinned.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(!this.finished, "Acquire polled after completion");
        let b = this.bulkhead;
        // SAFETY: `this` is pinned, so `node` is too.
        let node = unsafe { Pin::new_unchecked(&this.node) };
        let priority = node.priority;
        if !this.queued {
            if this
                .options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled)
            {
                this.finished = true;
                return Poll::Ready(Err(b.waiter_refusal(RejectReason::Aborted, &this.demand)));
            }
            // The waker is cloned only if the demand queues.
            match b.enter(node, || Notify::Waker(cx.waker().clone())) {
                Enter::Granted(g) => {
                    this.finished = true;
                    return Poll::Ready(Ok(b.admission_from(g, priority, this.reservation)));
                }
                Enter::Refused(rej) => {
                    this.finished = true;
                    return Poll::Ready(Err(rej));
                }
                Enter::Queued => {
                    this.queued = true;
                    this.since = if this.timed {
                        Some(Instant::now())
                    } else {
                        wait_started(b)
                    };
                    this.deadline =
                        deadline_after(this.options.timeout.resolve(b.shared.default_timeout));
                    if let Some(at) = this.deadline {
                        this.timer = Some(crate::wait::timer::register(at, cx.waker().clone()));
                    }
                    if let Some(tok) = &this.options.cancel {
                        this.cancel_reg = Some(tok.register_waker(None, cx.waker()));
                        if tok.is_cancelled() {
                            // Cancelled before the registration: look again at once.
                            cx.waker().wake_by_ref();
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
        if !node.is_done() {
            let cancelled = this
                .options
                .cancel
                .as_ref()
                .is_some_and(CancelToken::is_cancelled);
            let timed_out = this.deadline.is_some_and(|d| Instant::now() >= d);
            if cancelled || timed_out {
                let reason = if cancelled {
                    RejectReason::Aborted
                } else {
                    RejectReason::Timeout
                };
                let outcome = b.leave(node, reason);
                this.finished = true;
                end_registrations(
                    &mut this.timer,
                    this.options.cancel.as_ref(),
                    &mut this.cancel_reg,
                );
                this.queue_wait = this.since.map(|s| s.elapsed());
                book_wait(b, this.since);
                return Poll::Ready(b.finish(outcome, &this.demand, priority, this.reservation));
            }
            if let Some(t) = this.timer {
                crate::wait::timer::update(t, cx.waker());
            }
            if let (Some(tok), Some(id)) = (&this.options.cancel, this.cancel_reg) {
                tok.register_waker(Some(id), cx.waker());
            }
            let guard = b.shared.slow_path();
            let q = guard.lock_queue();
            if !node.is_done() {
                if node.needs_waker(&q, cx.waker()) {
                    node.set_notify(&q, Notify::Waker(cx.waker().clone()));
                }
                return Poll::Pending;
            }
        }
        this.finished = true;
        end_registrations(
            &mut this.timer,
            this.options.cancel.as_ref(),
            &mut this.cancel_reg,
        );
        this.queue_wait = this.since.map(|s| s.elapsed());
        book_wait(b, this.since);
        // SAFETY: `is_done` returned true on this thread (the branch above, or the check
        // under the lock).
        let outcome = unsafe { node.outcome() };
        Poll::Ready(b.finish(outcome, &this.demand, priority, this.reservation))
    }
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
    fn drop(&mut self) {
        end_registrations(
            &mut self.timer,
            self.options.cancel.as_ref(),
            &mut self.cancel_reg,
        );
        if !self.queued || self.finished {
            return;
        }
        let b = self.bulkhead;
        // SAFETY: the future is being dropped in place: `node` has not moved since it was
        // pinned and is still alive here.
        let node = unsafe { Pin::new_unchecked(&self.node) };
        let outcome = b.leave(node, RejectReason::Aborted);
        book_wait(b, self.since);
        if let Outcome::Granted { .. } = outcome {
            // Handed a slot after it stopped waiting: take it and release it at once, which
            // passes it to the next waiter.
            let priority = node.priority;
            drop(b.finish(outcome, &self.demand, priority, self.reservation));
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
                let wait = this.inner.queue_wait.unwrap_or_default();
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
