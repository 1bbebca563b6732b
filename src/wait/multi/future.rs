//! [`WaitFuture`]: an async waiter of a [`MultiWait`].

use super::{Admit, MultiWait, Notify, Polled, Waited, WaiterId};
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future that waits for a queued waiter (an owning or borrowing pointer `P` to the
/// [`MultiWait`]: `&MultiWait<A>`, `Arc<MultiWait<A>>`).
///
/// # Cancel safety
///
/// Dropping it before it completes cancels the waiter: removed from the queue if still
/// queued, its grant given back (and the start rule run) if it had started. Nothing leaks.
///
/// ```
/// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted, WaitFuture, Waited};
/// # struct Slots(u32);
/// # impl Admit for Slots { type Request = (); type Grant = ();
/// #   fn try_start(&mut self, _: &()) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
/// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
/// let w = MultiWait::new(Slots(0));
/// let Ok(Submitted::Queued(id)) = w.submit(()) else { panic!() };
/// w.update(|s| s.0 = 1);
/// let got = futures_lite::future::block_on(WaitFuture::new(&w, id));
/// assert_eq!(got, Waited::Started(()));
/// ```
pub struct WaitFuture<A: Admit, P: Deref<Target = MultiWait<A>>> {
    wait: P,
    id: WaiterId,
    done: bool,
}

impl<A: Admit, P: Deref<Target = MultiWait<A>>> WaitFuture<A, P> {
    /// A future for waiter `id` of `wait`.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start, Submitted, WaitFuture, Waited};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = std::sync::Arc::new(MultiWait::new(Never));
    /// let Ok(Submitted::Queued(id)) = w.submit(1) else { panic!() };
    /// let f = WaitFuture::new(w.clone(), id);
    /// drop(f); // cancels the waiter
    /// assert_eq!(w.queued(), 0);
    /// ```
    pub fn new(wait: P, id: WaiterId) -> Self {
        WaitFuture {
            wait,
            id,
            done: false,
        }
    }

    /// The waiter this future waits for.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted, WaitFuture};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(id)) = w.submit(1) else { panic!() };
    /// assert_eq!(WaitFuture::new(&w, id).id(), id);
    /// ```
    pub fn id(&self) -> WaiterId {
        self.id
    }
}

impl<A: Admit, P: Deref<Target = MultiWait<A>>> Unpin for WaitFuture<A, P> {}

impl<A: Admit, P: Deref<Target = MultiWait<A>>> Future for WaitFuture<A, P> {
    type Output = Waited<A::Grant>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        assert!(!this.done, "WaitFuture polled after completion");
        // First look: is it answered, and is the registered waker still the right one? The
        // comparison (`will_wake`) runs no user code.
        let w = cx.waker();
        let keep = |n: &Notify| matches!(n, Notify::Waker(old) if old.will_wake(w));
        let mut fresh = None;
        match this.wait.poll_outcome(this.id, &mut fresh, keep) {
            Polled::Done(out) => {
                this.done = true;
                return Poll::Ready(out);
            }
            Polled::Registered => return Poll::Pending,
            Polled::NeedNotify => {}
        }
        // A new waker is needed: clone it outside the mutex, register it, and drop the one it
        // replaces (now in `fresh`) outside the mutex too.
        let mut fresh = Some(Notify::Waker(w.clone()));
        let out = this.wait.poll_outcome(this.id, &mut fresh, |_| false);
        drop(fresh);
        match out {
            Polled::Done(out) => {
                this.done = true;
                Poll::Ready(out)
            }
            _ => Poll::Pending,
        }
    }
}

impl<A: Admit, P: Deref<Target = MultiWait<A>>> Drop for WaitFuture<A, P> {
    fn drop(&mut self) {
        if !self.done {
            self.wait.abandon(self.id);
        }
    }
}
