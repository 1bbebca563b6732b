//! Deadlines for async waiters, without any runtime: one timer thread, started lazily on the
//! first async deadline and shared by every bulkhead of the process.
//!
//! Why a thread of our own rather than a runtime's timer: the async `acquire` and `drain`
//! futures must work on any executor (tokio, smol, futures-lite, a hand-written one), and the
//! well-kept runtime-agnostic timer crates either bring an executor along or need one. A
//! single thread that sleeps on a condition variable until the earliest deadline costs nothing
//! until the first deadline is used, and one thread after that. A future registers its
//! deadline and `Waker` when it first returns `Pending`, refreshes the waker on later polls,
//! and cancels the entry when it completes or is dropped; the thread wakes each waker once its
//! deadline passes, and the future then sees the deadline itself (it never trusts the wake-up
//! alone, so a spurious or early wake is harmless).
//!
//! A cancelled entry is removed at once, not left to its deadline: the entries are a
//! `BTreeMap` ordered by `(deadline, key)` plus a key → deadline map, both of which free their
//! memory as entries go, so a million waits that time out of a 30 s deadline by being
//! cancelled (dropped futures, answered waiters) leave nothing behind (`tests/timer_memory.rs`).
//! Register, update and cancel are `O(log n)` under the timer's lock.

//!
//! Under loom the timer's lock and condition variable are loom's (through `crate::sync`), so
//! a model sees a waiter's register/update/cancel against everything else; the thread itself
//! is not started (a loom model must end, and this thread never does): a waiter always checks
//! its deadline at its own poll, and the models use zero deadlines.

use crate::sync::{lock, Condvar, Mutex};
use std::collections::BTreeMap;
use std::task::Waker;
use std::time::Instant;

struct Timer {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// The pending entries in deadline order (ties by key, so keys are unique).
    by_deadline: BTreeMap<(Instant, u64), Waker>,
    /// Each pending entry's deadline, to find it by key.
    deadline_of: BTreeMap<u64, Instant>,
    next: u64,
}

impl State {
    /// The waker of pending entry `id`.
    fn entry(&mut self, id: u64) -> Option<&mut Waker> {
        let at = *self.deadline_of.get(&id)?;
        self.by_deadline.get_mut(&(at, id))
    }

    fn remove(&mut self, id: u64) -> Option<Waker> {
        let at = self.deadline_of.remove(&id)?;
        self.by_deadline.remove(&(at, id))
    }
}

#[cfg(loom)]
fn timer() -> &'static Timer {
    loom::lazy_static! {
        static ref TIMER: Timer = Timer {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        };
    }
    &TIMER
}

#[cfg(not(loom))]
fn timer() -> &'static Timer {
    static TIMER: std::sync::OnceLock<&'static Timer> = std::sync::OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }));
        crate::sync::thread::Builder::new()
            .name("llm-bulkhead-timer".into())
            .spawn(move || run(t))
            .expect("failed to start the llm-bulkhead timer thread");
        t
    })
}

#[cfg(not(loom))]
fn run(t: &'static Timer) {
    use std::sync::PoisonError;
    let mut st = lock(&t.state);
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(entry) = st.by_deadline.first_entry() {
            let (at, id) = *entry.key();
            if at > now {
                break;
            }
            due.push(entry.remove());
            st.deadline_of.remove(&id);
        }
        if !due.is_empty() {
            drop(st);
            for w in due {
                w.wake();
            }
            st = lock(&t.state);
            continue;
        }
        st = match st.by_deadline.first_key_value().map(|(&(at, _), _)| at) {
            Some(at) => {
                t.cv.wait_timeout(st, at.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => t.cv.wait(st).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// Wakes `waker` at `at` (or soon after); returns the entry's key.
pub(crate) fn register(at: Instant, waker: Waker) -> u64 {
    let t = timer();
    let mut st = lock(&t.state);
    let id = st.next;
    st.next += 1;
    let earliest = st
        .by_deadline
        .first_key_value()
        .is_none_or(|(&(first, _), _)| at < first);
    st.by_deadline.insert((at, id), waker);
    st.deadline_of.insert(id, at);
    drop(st);
    if earliest {
        t.cv.notify_one();
    }
    id
}

/// Replaces the waker of entry `id` (if it has not fired). The new waker is cloned, and the
/// old one dropped, outside the timer's lock (both run the user's code, which must not stall
/// every deadline of the process).
pub(crate) fn update(id: u64, waker: &Waker) {
    let t = timer();
    match lock(&t.state).entry(id) {
        Some(w) if !w.will_wake(waker) => {}
        _ => return,
    }
    let fresh = waker.clone();
    let mut st = lock(&t.state);
    let old = match st.entry(id) {
        Some(w) => std::mem::replace(w, fresh),
        None => fresh,
    };
    drop(st);
    drop(old);
}

/// Cancels entry `id`: it is removed at once (nothing is kept until its deadline). The
/// waker, if the entry had not fired, is dropped after the lock is released.
pub(crate) fn cancel(id: u64) {
    let t = timer();
    let waker = lock(&t.state).remove(id);
    drop(waker);
}

/// The number of pending entries (test support: `llm_bulkhead::testing::timer_entries`).
#[cfg(all(feature = "testing", not(loom)))]
pub(crate) fn entries() -> usize {
    let st = lock(&timer().state);
    debug_assert_eq!(st.by_deadline.len(), st.deadline_of.len());
    st.by_deadline.len()
}
