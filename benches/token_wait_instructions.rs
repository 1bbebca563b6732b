//! Instruction counts of a token hand-off (`BulkheadBuilder::wait_for_tokens`) beside tokio's
//! `Semaphore::acquire_many`, for callgrind (repeatable where criterion on a shared machine is
//! not). One thread, futures polled by hand with a no-op waker, so both sides run exactly the
//! same steps and no scheduler is measured. One iteration:
//!
//! * `handoff` (`_classed`: one class, no floors): 60 of 100 tokens are held; a waiter for 60
//!   is queued (first poll pending); the holder is dropped, which hands its tokens to the
//!   waiter; the waiter is polled to its admission, which is the next iteration's holder.
//! * `handoff_two` (`_classed`): the whole budget (100) is held; two waiters for 50 each are
//!   queued; the holder is dropped (the hand-off grants the head, then the second waiter fits
//!   too); both are polled to their admissions and dropped (no one waits: plain releases).
//! * `tokio_handoff`, `tokio_handoff_two`: the same steps with a 100-permit semaphore,
//!   `acquire_many` and its permits.
//!
//! ```text
//! cargo bench --bench token_wait_instructions --no-run
//! for n in 10000 20000; do valgrind --tool=callgrind --callgrind-out-file=cg.$n \
//!     target/release/deps/token_wait_instructions-* handoff $n; done
//! ```
//!
//! The per-iteration count is `(Ir(20000) - Ir(10000)) / 10000`.

use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Reservation, WaitOptions};
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use tokio::sync::Semaphore;

fn t(n: u64) -> Demand {
    Demand::tokens(Reservation::new(0, n).unwrap())
}

fn bulkhead(classed: bool) -> Bulkhead {
    let b = Bulkhead::builder()
        .max_concurrent(100)
        .max_queue(4)
        .token_budget(100)
        .wait_for_tokens(true);
    let b = if classed {
        b.class("only", ClassLimits::default())
            .default_class("only")
    } else {
        b
    };
    b.build().unwrap()
}

fn poll<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(op), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok())) else {
        // `cargo bench` runs every target with `--bench`: nothing to do without an operation.
        eprintln!("usage: token_wait_instructions OPERATION N");
        return;
    };
    let classed = op.ends_with("_classed");
    match op.as_str() {
        "handoff" | "handoff_classed" => {
            let b = bulkhead(classed);
            let mut held = b.try_acquire(t(60)).unwrap();
            for _ in 0..n {
                let mut w = pin!(b.acquire(black_box(t(60)), WaitOptions::default()));
                assert!(poll(w.as_mut()).is_pending());
                drop(held);
                let Poll::Ready(Ok(a)) = poll(w.as_mut()) else {
                    panic!("not handed off")
                };
                held = a;
            }
            drop(held);
            assert_eq!(b.stats().in_flight, 0);
        }
        "handoff_two" | "handoff_two_classed" => {
            let b = bulkhead(classed);
            for _ in 0..n {
                let held = b.try_acquire(t(100)).unwrap();
                let mut w1 = pin!(b.acquire(black_box(t(50)), WaitOptions::default()));
                let mut w2 = pin!(b.acquire(black_box(t(50)), WaitOptions::default()));
                assert!(poll(w1.as_mut()).is_pending());
                assert!(poll(w2.as_mut()).is_pending());
                drop(held);
                let (Poll::Ready(Ok(a1)), Poll::Ready(Ok(a2))) =
                    (poll(w1.as_mut()), poll(w2.as_mut()))
                else {
                    panic!("not handed off")
                };
                drop((a1, a2));
            }
            assert_eq!(b.stats().in_flight, 0);
        }
        "tokio_handoff" => {
            let sem = Semaphore::new(100);
            let mut held = sem.try_acquire_many(60).unwrap();
            for _ in 0..n {
                let mut w = pin!(sem.acquire_many(black_box(60)));
                assert!(poll(w.as_mut()).is_pending());
                drop(held);
                let Poll::Ready(Ok(p)) = poll(w.as_mut()) else {
                    panic!("not handed off")
                };
                held = p;
            }
            drop(held);
            assert_eq!(sem.available_permits(), 100);
        }
        "tokio_handoff_two" => {
            let sem = Semaphore::new(100);
            for _ in 0..n {
                let held = sem.try_acquire_many(100).unwrap();
                let mut w1 = pin!(sem.acquire_many(black_box(50)));
                let mut w2 = pin!(sem.acquire_many(black_box(50)));
                assert!(poll(w1.as_mut()).is_pending());
                assert!(poll(w2.as_mut()).is_pending());
                drop(held);
                let (Poll::Ready(Ok(p1)), Poll::Ready(Ok(p2))) =
                    (poll(w1.as_mut()), poll(w2.as_mut()))
                else {
                    panic!("not handed off")
                };
                drop((p1, p2));
            }
            assert_eq!(sem.available_permits(), 100);
        }
        other => panic!("unknown operation {other}"),
    }
}
