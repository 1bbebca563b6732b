//! The slow paths' lifetime on real threads (issue 12, item 4): waiters (blocking and async),
//! releases, cancellations and the drop of the last handle race on a bulkhead whose last
//! handle goes while they run, with and without classes.
//!
//! In every round two admissions are held and three waiters queue behind them, each on its
//! own thread with its own `Bulkhead` handle and cancel token; the main thread drops its
//! handle at once. A releaser thread returns the two slots (hand-offs) and then cancels every
//! token. Each waiter, as soon as its wait ends, drops its handle and *then* its admission, so
//! the last handle and the last slot go on whichever thread ends last, possibly while another
//! thread is still inside a hand-off or a cancellation. In odd rounds a witness handle stays
//! on the main thread and checks that nothing is left held or queued.
//!
//! Small on purpose: CI runs it under Miri (`.ci/run`, several `-Zmiri-seed`s), which checks
//! every access to the shared state and the waiter nodes for use after free and data races.
//! Natively it runs more rounds. Nothing here sleeps or times anything.

use llm_bulkhead::{Bulkhead, CancelToken, ClassLimits, Demand, QueueTimeout, WaitOptions};
use std::thread;

const ROUNDS: usize = if cfg!(miri) { 2 } else { 200 };

fn build(classes: bool) -> Bulkhead {
    let mut b = Bulkhead::builder().max_concurrent(2).max_queue(8);
    if classes {
        b = b
            .class(
                "protected",
                ClassLimits {
                    protected_concurrent: 1,
                    ..ClassLimits::default()
                },
            )
            .class("open", ClassLimits::default())
            .default_class("open");
    }
    b.build().unwrap()
}

fn demand(b: &Bulkhead, classes: bool, i: usize) -> Demand {
    if classes && i % 2 == 0 {
        Demand::slot().in_class(b.class_id("protected").unwrap())
    } else {
        Demand::slot()
    }
}

fn round(classes: bool, witness: bool, seed: usize) {
    let b = build(classes);
    let held: Vec<_> = (0..2)
        .map(|i| b.try_acquire(demand(&b, classes, i + seed)).unwrap())
        .collect();
    let tokens: Vec<_> = (0..3).map(|_| CancelToken::new()).collect();
    let mut threads = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let (h, token) = (b.clone(), token.clone());
        let d = demand(&b, classes, i + seed);
        threads.push(thread::spawn(move || {
            let options = WaitOptions {
                timeout: QueueTimeout::Default,
                cancel: Some(token),
            };
            let got = if (i + seed) % 3 == 0 {
                futures_lite::future::block_on(h.acquire(d, options))
            } else {
                h.acquire_blocking(d, options)
            };
            // The handle first, then the admission: the order of the hand-off's old bug.
            drop(h);
            drop(got);
        }));
    }
    let witness = witness.then(|| b.clone());
    drop(b);
    let releaser = thread::spawn(move || {
        for a in held {
            drop(a);
        }
        for t in &tokens {
            t.cancel();
        }
    });
    releaser.join().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    if let Some(w) = witness {
        let s = w.stats();
        assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
        assert_eq!(s.admissions_in_flight, 0, "{s:?}");
        drop(w.try_acquire(Demand::slot()).expect("the fast path admits"));
    }
}

#[test]
fn waiters_releases_cancellations_and_the_last_handle_race_without_classes() {
    for i in 0..ROUNDS {
        round(false, i % 2 == 1, i);
    }
}

#[test]
fn waiters_releases_cancellations_and_the_last_handle_race_with_classes() {
    for i in 0..ROUNDS {
        round(true, i % 2 == 1, i);
    }
}
