//! [`Txn`]: one operation on a [`MultiWait`](super::MultiWait), under its mutex.

use super::{Admit, Inner, Leave, Refused, Submitted, Waited, WaiterId, Wakes};

/// One operation on a [`MultiWait`](super::MultiWait) (see
/// [`transaction`](super::MultiWait::transaction)): the state, the start rule, removals and
/// newcomers, all under one hold of the mutex. Wakes are made after the mutex is released.
///
/// ```
/// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
/// # struct Slots(u32);
/// # impl Admit for Slots { type Request = u8; type Grant = ();
/// #   fn try_start(&mut self, _: &u8) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
/// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
/// let w = MultiWait::new(Slots(1));
/// let first = w.transaction(|t| t.submit(1));
/// assert_eq!(first, Ok(Submitted::Started(())));
/// ```
pub struct Txn<'a, A: Admit> {
    pub(super) inner: &'a mut Inner<A>,
    pub(super) wakes: &'a mut Wakes,
}

impl<A: Admit> Txn<'_, A> {
    /// The guarded state.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Slots(1));
    /// assert_eq!(w.transaction(|t| { t.state().0 += 1; t.state().0 }), 2);
    /// ```
    pub fn state(&mut self) -> &mut A {
        &mut self.inner.admit
    }

    /// Runs the start rule now (module docs of [`multi_wait`](super)).
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Slots(u32);
    /// # impl Admit for Slots { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { if self.0 == 0 { Start::Nobody } else { self.0 -= 1; Start::Now(()) } }
    /// #   fn give_back(&mut self, _: ()) { self.0 += 1; } }
    /// let w = MultiWait::new(Slots(0));
    /// w.submit(1).unwrap();
    /// let left = w.transaction(|t| { t.state().0 = 1; t.start_eligible(); t.queued() });
    /// assert_eq!(left, 0);
    /// ```
    pub fn start_eligible(&mut self) {
        self.inner.settle(self.wakes);
    }

    /// Judges a newcomer, as [`MultiWait::submit`](super::MultiWait::submit) does.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start, Submitted};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// assert!(matches!(w.transaction(|t| t.submit(3)), Ok(Submitted::Queued(_))));
    /// ```
    pub fn submit(&mut self, request: A::Request) -> Result<Submitted<A::Grant>, Refused> {
        self.inner.submit(request)
    }

    /// Ends waiter `id` for an owner that gives up and wants its outcome: removed if queued
    /// (`Some(Left(why))`), or its recorded outcome taken (a grant is the caller's to give
    /// back, unlike [`MultiWait::cancel`](super::MultiWait::cancel)); `None` if unknown.
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start, Submitted, Waited};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// let Ok(Submitted::Queued(id)) = w.submit(1) else { panic!() };
    /// let out = w.transaction(|t| t.withdraw(id, Leave::Cancelled));
    /// assert_eq!(out, Some(Waited::Left(Leave::Cancelled)));
    /// assert_eq!(w.transaction(|t| t.withdraw(id, Leave::Cancelled)), None);
    /// ```
    pub fn withdraw(&mut self, id: WaiterId, why: Leave) -> Option<Waited<A::Grant>> {
        if self.inner.remove(id.0, why, self.wakes).is_some() {
            return Some(Waited::Left(why));
        }
        self.inner.done.remove(&id.0)
    }

    /// Removes the queued waiters that match, oldest first, as
    /// [`MultiWait::remove_where`](super::MultiWait::remove_where) does.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, Leave, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.submit(1).unwrap();
    /// assert_eq!(w.transaction(|t| t.remove_where(|_, r| *r == 1, Leave::TimedOut)).len(), 1);
    /// ```
    pub fn remove_where(
        &mut self,
        pred: impl FnMut(&A, &A::Request) -> bool,
        why: Leave,
    ) -> Vec<(WaiterId, A::Request)> {
        self.inner.remove_where(pred, why, self.wakes)
    }

    /// Reads the state and the queued requests, oldest first.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.submit(4).unwrap();
    /// assert_eq!(w.transaction(|t| t.read(|_, q| q.copied().max())), Some(4));
    /// ```
    pub fn read<T>(&self, f: impl FnOnce(&A, &mut dyn Iterator<Item = &A::Request>) -> T) -> T {
        let mut it = self.inner.queue.values().map(|q| &q.request);
        f(&self.inner.admit, &mut it)
    }

    /// The number of queued waiters.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// assert_eq!(w.transaction(|t| t.queued()), 0);
    /// ```
    pub fn queued(&self) -> usize {
        self.inner.queue.len()
    }

    /// Whether the `MultiWait` is closed.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// assert!(!w.transaction(|t| t.is_closed()));
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.closed
    }

    /// Closes, as [`MultiWait::close`](super::MultiWait::close) does, inside this operation.
    ///
    /// ```
    /// # use llm_bulkhead::multi_wait::{Admit, MultiWait, Start};
    /// # struct Never;
    /// # impl Admit for Never { type Request = u8; type Grant = ();
    /// #   fn try_start(&mut self, _: &u8) -> Start<()> { Start::NotYet }
    /// #   fn give_back(&mut self, _: ()) {} }
    /// let w = MultiWait::new(Never);
    /// w.submit(1).unwrap();
    /// assert_eq!(w.transaction(|t| t.close()).len(), 1);
    /// assert!(w.is_closed());
    /// ```
    pub fn close(&mut self) -> Vec<(WaiterId, A::Request)> {
        self.inner.closed = true;
        self.inner
            .remove_where(|_, _| true, Leave::Closed, self.wakes)
    }
}
