//! Cancellation of waits: [`CancelToken`] and its [`Cancelled`] future, and the waker
//! registration a future keeps while it waits (`CancelWake`).

use crate::sync::{lock, Arc, AtomicBool, Mutex, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Cancels waiting acquires from any thread. Cloning shares the token.
///
/// ```
/// use llm_bulkhead::CancelToken;
/// let t = CancelToken::new();
/// assert!(!t.is_cancelled());
/// t.clone().cancel();
/// assert!(t.is_cancelled());
/// ```
///
/// # Memory ordering
/// `cancel` stores the flag with `Release` before waking the waiters registered with the token;
/// a waiter registers, then re-reads the flag with `Acquire` before it sleeps, so a cancel is
/// never missed.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<CancelInner>);

#[derive(Debug, Default)]
struct CancelInner {
    cancelled: AtomicBool,
    sleepers: Mutex<Vec<crate::sync::thread::Thread>>,
    /// Async waiters' wakers, by registration id.
    wakers: Mutex<(u64, Vec<(u64, std::task::Waker)>)>,
}

impl CancelToken {
    /// A token that is not cancelled.
    ///
    /// ```
    /// assert!(!llm_bulkhead::CancelToken::new().is_cancelled());
    /// ```
    #[must_use]
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Cancels: every acquire waiting with this token leaves with `aborted`.
    ///
    /// ```
    /// let t = llm_bulkhead::CancelToken::new();
    /// t.cancel();
    /// t.cancel(); // idempotent
    /// assert!(t.is_cancelled());
    /// ```
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
        let sleepers = std::mem::take(&mut *lock(&self.0.sleepers));
        for t in sleepers {
            t.unpark();
        }
        let wakers = std::mem::take(&mut lock(&self.0.wakers).1);
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Whether [`cancel`](Self::cancel) was called.
    ///
    /// ```
    /// assert!(!llm_bulkhead::CancelToken::new().is_cancelled());
    /// ```
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    pub(crate) fn register(&self, t: crate::sync::thread::Thread) {
        lock(&self.0.sleepers).push(t);
    }

    /// Registers (or, with `id`, refreshes) an async waiter's waker; returns its id. The waker
    /// is cloned, and a replaced one dropped, outside the token's lock (both run the user's
    /// code).
    pub(crate) fn register_waker(&self, id: Option<u64>, w: &std::task::Waker) -> u64 {
        if let Some(id) = id {
            let g = lock(&self.0.wakers);
            if g.1.iter().any(|e| e.0 == id && e.1.will_wake(w)) {
                return id;
            }
        }
        let fresh = w.clone();
        let mut g = lock(&self.0.wakers);
        if let Some(e) = id.and_then(|id| g.1.iter_mut().find(|e| e.0 == id)) {
            let old = std::mem::replace(&mut e.1, fresh);
            let id = e.0;
            drop(g);
            drop(old);
            return id;
        }
        let id = g.0;
        g.0 += 1;
        g.1.push((id, fresh));
        id
    }

    /// Forgets an async waiter's waker (its wait ended); the waker is dropped after the
    /// unlock.
    pub(crate) fn unregister_waker(&self, id: u64) {
        let mut g = lock(&self.0.wakers);
        let gone =
            g.1.iter()
                .position(|e| e.0 == id)
                .map(|i| g.1.swap_remove(i));
        drop(g);
        drop(gone);
    }

    /// A future that completes once [`cancel`](Self::cancel) has been called (at once if it
    /// already was). A cancellation wakes it: async work can `select!` on it.
    ///
    /// # Cancel safety
    /// Dropping it forgets its waker registration; nothing else changes.
    ///
    /// # Memory ordering
    /// As the token's: `cancel` stores the flag before it takes the registered wakers, and the
    /// future registers before it re-reads the flag, so a cancel is never missed.
    ///
    /// ```
    /// use futures_lite::future;
    /// let t = llm_bulkhead::CancelToken::new();
    /// let c = t.clone();
    /// let th = std::thread::spawn(move || c.cancel());
    /// future::block_on(t.cancelled());
    /// assert!(t.is_cancelled());
    /// th.join().unwrap();
    /// ```
    pub fn cancelled(&self) -> Cancelled {
        Cancelled(CancelWake::new(self.clone()))
    }

    /// Forgets the calling thread's registration (its wait ended), so a token reused for many
    /// waits keeps no stale entries.
    pub(crate) fn unregister_current(&self) {
        let me = crate::sync::thread::current().id();
        lock(&self.0.sleepers).retain(|t| t.id() != me);
    }
}

/// An async registration with a [`CancelToken`]: polled, it is ready once the token is
/// cancelled, and otherwise leaves the task's waker with the token; dropped, it forgets the
/// waker. Owned (it holds a clone of the token), so `'static` futures can embed it.
#[derive(Debug)]
pub(crate) struct CancelWake {
    token: CancelToken,
    id: Option<u64>,
}

impl CancelWake {
    pub(crate) fn new(token: CancelToken) -> CancelWake {
        CancelWake { token, id: None }
    }

    /// Ready once cancelled; otherwise registers (or refreshes) `cx`'s waker.
    pub(crate) fn poll_cancelled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.token.is_cancelled() {
            return Poll::Ready(());
        }
        self.id = Some(self.token.register_waker(self.id, cx.waker()));
        // Re-read after registering: `cancel` stores the flag before it takes the wakers.
        if self.token.is_cancelled() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for CancelWake {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.token.unregister_waker(id);
        }
    }
}

/// The future of [`CancelToken::cancelled`].
///
/// # Cancel safety
/// Dropping it forgets its waker registration; nothing else changes.
///
/// ```
/// # use futures_lite::future;
/// let t = llm_bulkhead::CancelToken::new();
/// t.cancel();
/// future::block_on(t.cancelled()); // ready at once
/// ```
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Cancelled(CancelWake);

impl Future for Cancelled {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.poll_cancelled(cx)
    }
}
