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
//! Under loom the timer's lock and condition variable are loom's (through `crate::sync`), so
//! a model sees a waiter's register/update/cancel against everything else; the thread itself
//! is not started (a loom model must end, and this thread never does): a waiter always checks
//! its deadline at its own poll, and the models use zero deadlines.

use crate::sync::{lock, Condvar, Mutex};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::task::Waker;
use std::time::Instant;

struct Timer {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: HashMap<u64, Waker>,
    next: u64,
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
        while let Some(Reverse((at, id))) = st.heap.peek().copied() {
            if at > now {
                break;
            }
            st.heap.pop();
            if let Some(w) = st.wakers.remove(&id) {
                due.push(w);
            }
        }
        if !due.is_empty() {
            drop(st);
            for w in due {
                w.wake();
            }
            st = lock(&t.state);
            continue;
        }
        st = match st.heap.peek().copied() {
            Some(Reverse((at, _))) => {
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
    let earliest = st.heap.peek().is_none_or(|Reverse((first, _))| at < *first);
    st.heap.push(Reverse((at, id)));
    st.wakers.insert(id, waker);
    drop(st);
    if earliest {
        t.cv.notify_one();
    }
    id
}

/// Replaces the waker of entry `id` (if it has not fired).
pub(crate) fn update(id: u64, waker: &Waker) {
    let t = timer();
    let mut st = lock(&t.state);
    if let Some(w) = st.wakers.get_mut(&id) {
        if !w.will_wake(waker) {
            *w = waker.clone();
        }
    }
}

/// Cancels entry `id` (its heap slot is skipped when it comes up).
pub(crate) fn cancel(id: u64) {
    let t = timer();
    lock(&t.state).wakers.remove(&id);
}
