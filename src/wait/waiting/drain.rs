//! Drain: waiting until nothing is in flight or queued ([`Bulkhead::drain_blocking`],
//! [`Bulkhead::drain`]).

use super::*;

/// What [`Bulkhead::drain_blocking`] and [`Bulkhead::drain`] found.
///
/// ```
/// use llm_bulkhead::{Bulkhead, DrainReport};
/// let r = Bulkhead::new(1).unwrap().drain_blocking(None);
/// let r: DrainReport = r;
/// assert_eq!((r.drained, r.in_flight, r.pending), (true, 0, 0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct DrainReport {
    /// Nothing in flight, nobody queued, no token hold left.
    pub drained: bool,
    /// Admissions not yet released (abandoned ones count until released).
    pub in_flight: u64,
    /// Waiters queued.
    pub pending: u64,
}

impl Bulkhead {
    /// Waits until nothing is in flight, nobody is queued and no token hold is left
    /// (CONTRACT.md §7), or until `deadline` passes; cancels nothing and does not close. A zero
    /// deadline is a snapshot; one too large to add to the current instant (`Duration::MAX`)
    /// is no deadline. It never hangs once the state is idle, however the last waiter
    /// left.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// let r = b.drain_blocking(Some(Duration::ZERO));
    /// assert_eq!((r.drained, r.in_flight, r.pending), (false, 1, 0));
    /// let t = std::thread::spawn(move || drop(a));
    /// assert!(b.drain_blocking(None).drained);
    /// t.join().unwrap();
    /// ```
    pub fn drain_blocking(&self, timeout: Option<Duration>) -> DrainReport {
        let until = deadline_after(timeout);
        let report = self.drain_report();
        if report.drained || timeout == Some(Duration::ZERO) {
            return report;
        }
        let id = self.register_drainer(Notify::Thread(crate::sync::thread::current()).into());
        // Unregisters on every way out, an unwind included (a registration left behind would
        // keep `WAITERS` up for good).
        struct Registered<'a>(&'a Bulkhead, u64);
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.0.unregister_drainer(self.1);
            }
        }
        let registered = Registered(self, id);
        let report = loop {
            let report = self.drain_report();
            if report.drained {
                break report;
            }
            match until {
                Some(u) => {
                    let now = Instant::now();
                    if now >= u {
                        break report;
                    }
                    crate::sync::thread::park_timeout(u - now);
                }
                None => crate::sync::thread::park(),
            }
        };
        drop(registered);
        report
    }

    /// The async counterpart of [`drain_blocking`](Self::drain_blocking); its deadline runs on
    /// the crate's timer thread, so it works on any executor.
    ///
    /// # Panics
    /// With a timeout, if the process-wide deadline timer thread cannot be spawned (the OS
    /// refuses a thread: a resource failure, not bad input).
    ///
    /// # Cancel safety
    /// Dropping the future unregisters it; nothing else changes.
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::new(1).unwrap();
    /// assert!(futures_lite::future::block_on(b.drain(None)).drained);
    /// ```
    pub fn drain(&self, timeout: Option<Duration>) -> Drain<'_> {
        Drain {
            bulkhead: self,
            zero: timeout == Some(Duration::ZERO),
            until: deadline_after(timeout),
            drainer: None,
            timer: None,
        }
    }

    fn drain_report(&self) -> DrainReport {
        let s = self.stats();
        let tokens = s.token_budget.map_or(0, |t| t.in_flight_tokens);
        DrainReport {
            drained: s.admissions_in_flight == 0 && s.pending == 0 && tokens == 0,
            in_flight: s.admissions_in_flight,
            pending: s.pending,
        }
    }

    /// Registers a drainer and raises `WAITERS` (with classes: `C_QUEUE` on the class words),
    /// so releases take the slow path that wakes it.
    fn register_drainer(&self, n: std::sync::Arc<Notify>) -> u64 {
        let shared = &*self.shared;
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        let id = q.add_drainer(n);
        if shared.classed {
            sync_class_flags(shared, &mut q);
        } else {
            shared.word.fetch_or(WAITERS, Ordering::AcqRel);
        }
        id
    }

    fn unregister_drainer(&self, id: u64) {
        let shared = &*self.shared;
        let guard = self.shared.slow_path();
        let mut q = guard.lock_queue();
        let gone = q.remove_drainer(id);
        if shared.classed {
            sync_class_flags(shared, &mut q);
        } else {
            clear_waiters(shared, &q);
        }
        // Its waker goes after the unlock (a drop runs the user's code).
        drop(q);
        drop(gone);
    }

    /// Gives drainer `id` a new waker (cloned by the caller, before this locks); the old one
    /// is dropped after the unlock.
    fn update_drainer(&self, id: u64, n: std::sync::Arc<Notify>) {
        let guard = self.shared.slow_path();
        let old = guard.lock_queue().update_drainer(id, n);
        drop(old);
    }
}

/// The future of [`Bulkhead::drain`].
///
/// # Panics
/// With a timeout, if the process-wide deadline timer thread cannot be spawned (the OS
/// refuses a thread: a resource failure, not bad input).
///
/// # Cancel safety
/// Dropping it unregisters it; nothing else changes.
///
/// ```
/// let b = llm_bulkhead::Bulkhead::new(1).unwrap();
/// let f = b.drain(None);
/// drop(f);
/// ```
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Drain<'a> {
    pub(super) bulkhead: &'a Bulkhead,
    pub(super) zero: bool,
    pub(super) until: Option<Instant>,
    pub(super) drainer: Option<u64>,
    pub(super) timer: Option<u64>,
}

impl Future for Drain<'_> {
    type Output = DrainReport;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DrainReport> {
        let this = &mut *self;
        let b = this.bulkhead;
        let report = b.drain_report();
        let expired = this.until.is_some_and(|u| Instant::now() >= u);
        if report.drained || this.zero || expired {
            this.release();
            return Poll::Ready(report);
        }
        match this.drainer {
            None => {
                this.drainer = Some(b.register_drainer(Notify::Waker(cx.waker().clone()).into()));
                // The state may have become idle before the registration: look again.
                let report = b.drain_report();
                if report.drained {
                    this.release();
                    return Poll::Ready(report);
                }
            }
            Some(id) => b.update_drainer(id, Notify::Waker(cx.waker().clone()).into()),
        }
        // The deadline runs on the timer thread.
        if let Some(at) = this.until {
            if let Some(t) = this.timer.take() {
                crate::wait::timer::cancel(t);
            }
            this.timer = Some(crate::wait::timer::register(at, cx.waker().clone()));
        }
        Poll::Pending
    }
}

impl Drain<'_> {
    fn release(&mut self) {
        if let Some(id) = self.drainer.take() {
            self.bulkhead.unregister_drainer(id);
        }
        if let Some(t) = self.timer.take() {
            crate::wait::timer::cancel(t);
        }
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
