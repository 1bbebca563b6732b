//! Models of a de-duplicated flight's claim word (`src/llm/dedup/flight.rs`, "The claim
//! word"): a participant with nothing to check under the flight's lock (a leader, or a follower
//! with neither a timeout nor a cancellation token) claims the work with one compare-and-swap
//! outside the lock; everything else changes the word under the lock.
//!
//! The work lives in a loom `UnsafeCell` (the crate's facade), so two participants polling it
//! at once, or a drop of the work not ordered after a poll, fails the model; a participant
//! left waiting with no wake to come is a loom deadlock.
//!
//! 1. a leader and a follower polled on two threads, the work ready at once: one poll of the
//!    work, both results, the key free;
//! 2. the same with a work that wakes itself and returns `Pending` on its first poll (the
//!    `WOKEN` path: the claimant wakes itself when the wake came before its waker was there);
//! 3. a work that returns `Pending` and is woken from a third thread, racing the claimant's
//!    give-back and the other participant's registration;
//! 4. a leader whose work completes at once against a follower that drops its future.
//!
//! Shown to fail on broken variants (patched in by hand, not kept behind a switch): the
//! claim outside the lock as a load and a store instead of a compare-and-swap (models 1-3:
//! "Concurrent write accesses to `UnsafeCell`"), that claim `Relaxed` instead of `Acquire`
//! (models 2 and 3, the same violation: the previous poll is not ordered before the next),
//! and a claimant that ignores `WOKEN` after a `Pending` poll (model 2: a deadlock).
#![cfg(loom)]

mod common;

use common::model;
use llm_bulkhead::llm::{Dedup, DedupKey, FollowerOptions};
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

fn key() -> Option<DedupKey> {
    DedupKey::of_bytes(b"k")
}

/// A work that counts its polls, returns `Pending` `pending` times (each time after
/// `on_pending` ran with its waker), then 7.
struct Work<P: FnMut(&Waker) + Send> {
    polls: Arc<AtomicUsize>,
    pending: usize,
    on_pending: P,
}

impl<P: FnMut(&Waker) + Send + Unpin> Future for Work<P> {
    type Output = u32;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        if self.pending == 0 {
            return Poll::Ready(7);
        }
        self.pending -= 1;
        (self.on_pending)(cx.waker());
        Poll::Pending
    }
}

/// Leader and follower of one flight whose work is `work`, each awaited on its own thread;
/// returns the number of polls of the work.
fn race<P>(work: Work<P>, polls: Arc<AtomicUsize>) -> usize
where
    P: FnMut(&Waker) + Send + Unpin + 'static,
{
    let d: Dedup<u32> = Dedup::new(8);
    let leader = d.run(key(), FollowerOptions::default(), move || work);
    let follower = d.run(key(), FollowerOptions::default(), || async { 0 });
    assert!(leader.is_leader() && follower.is_follower());
    let t = thread::spawn(move || block_on(follower));
    assert_eq!(block_on(leader), Ok(7));
    assert_eq!(t.join().unwrap(), Ok(7));
    assert_eq!(d.stats().active, 0);
    polls.load(Ordering::Relaxed)
}

#[test]
fn one_poll_of_a_work_ready_at_once_serves_leader_and_follower() {
    model(|| {
        let polls = Arc::new(AtomicUsize::new(0));
        let work = Work {
            polls: polls.clone(),
            pending: 0,
            on_pending: |_: &Waker| {},
        };
        assert_eq!(race(work, polls), 1);
    });
}

#[test]
fn a_work_that_wakes_itself_is_polled_again() {
    model(|| {
        let polls = Arc::new(AtomicUsize::new(0));
        let work = Work {
            polls: polls.clone(),
            pending: 1,
            on_pending: |w: &Waker| w.wake_by_ref(),
        };
        assert_eq!(race(work, polls), 2);
    });
}

#[test]
fn a_wake_from_another_thread_reaches_a_participant() {
    model(|| {
        let polls = Arc::new(AtomicUsize::new(0));
        let stored: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let s = stored.clone();
        let work = Work {
            polls: polls.clone(),
            pending: 1,
            on_pending: move |w: &Waker| *s.lock().unwrap() = Some(w.clone()),
        };
        let waker = thread::spawn(move || loop {
            if let Some(w) = stored.lock().unwrap().take() {
                w.wake();
                return;
            }
            thread::yield_now();
        });
        assert_eq!(race(work, polls), 2);
        waker.join().unwrap();
    });
}

#[test]
fn a_follower_leaving_while_the_leader_completes() {
    model(|| {
        let polls = Arc::new(AtomicUsize::new(0));
        let d: Dedup<u32> = Dedup::new(8);
        let p = polls.clone();
        let leader = d.run(key(), FollowerOptions::default(), move || Work {
            polls: p,
            pending: 0,
            on_pending: |_: &Waker| {},
        });
        let follower = d.run(key(), FollowerOptions::default(), || async { 0 });
        let t = thread::spawn(move || drop(follower));
        assert_eq!(block_on(leader), Ok(7));
        t.join().unwrap();
        assert_eq!(d.stats().active, 0);
        assert_eq!(polls.load(Ordering::Relaxed), 1);
    });
}
