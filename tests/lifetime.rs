//! The lifetime protocol and the per-thread counter cache on real threads: admissions that
//! outlive every `Bulkhead` handle, handles dropped concurrently with releases, and one thread
//! switching between bulkheads (which exercises the one-entry counter cache).
//!
//! These tests are small on purpose: besides `cargo test`, they are run under Miri
//! (`cargo +nightly miri test --test lifetime`), which checks the unsafe code (the shared-state
//! free, the cached counter pointer) for use-after-free, double free and data races.

use llm_bulkhead::{Bulkhead, Demand, Reservation, Usage};
use std::collections::HashSet;

const N: usize = if cfg!(miri) { 3 } else { 50 };

#[test]
fn admissions_outlive_every_handle() {
    for round in 0..N {
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(1_000)
            .build()
            .unwrap();
        let b2 = b.clone();
        let held: Vec<_> = (0..3)
            .map(|i| {
                b.try_acquire(Demand::tokens(Reservation::new(10 * i, 5).unwrap()))
                    .unwrap()
            })
            .collect();
        let threads: Vec<_> = held
            .into_iter()
            .enumerate()
            .map(|(i, mut a)| {
                std::thread::spawn(move || {
                    a.report_usage(Usage::new(1, 1)).unwrap();
                    if (i + round) % 2 == 0 {
                        a.release(Some(Usage::new(2, 2))).unwrap();
                    } else {
                        drop(a);
                    }
                })
            })
            .collect();
        // Both handles go while the admissions may still be live on their threads.
        let observer = std::thread::spawn(move || {
            let s = b2.stats();
            assert!(s.in_flight <= 3);
        });
        drop(b);
        for t in threads {
            t.join().unwrap();
        }
        observer.join().unwrap();
    }
}

#[test]
fn admissions_settle_after_every_handle_is_gone() {
    // Deterministic order: every handle is dropped first, then the admissions settle, the last
    // one freeing the shared state. A premature free would be a use-after-free here.
    for _ in 0..N {
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(1_000)
            .build()
            .unwrap();
        let mut held: Vec<_> = (0..3)
            .map(|_| {
                b.try_acquire(Demand::tokens(Reservation::new(10, 5).unwrap()))
                    .unwrap()
            })
            .collect();
        drop(b);
        let last = held.pop().unwrap();
        let threads: Vec<_> = held
            .into_iter()
            .map(|mut a| {
                std::thread::spawn(move || {
                    a.report_usage(Usage::new(20, 1)).unwrap();
                    a.release(None).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(last.held(), 15);
        drop(last);
    }
}

#[test]
fn one_thread_switching_between_bulkheads_counts_each_separately() {
    let (x, y) = (Bulkhead::new(2).unwrap(), Bulkhead::new(2).unwrap());
    let mut ids = HashSet::new();
    for i in 0..N {
        let b = if i % 3 == 0 { &x } else { &y };
        let a = b.try_acquire(Demand::slot()).unwrap();
        assert!(ids.insert(a.id()), "duplicate admission id");
        let _ = Bulkhead::new(1)
            .unwrap()
            .try_acquire(Demand::slot())
            .unwrap(); // a third, short-lived
    }
    let (sx, sy) = (x.stats(), y.stats());
    assert_eq!(sx.admitted, N.div_ceil(3) as u64);
    assert_eq!(sx.admitted + sy.admitted, N as u64);
    assert_eq!((sx.in_flight, sy.in_flight), (0, 0));
}

#[test]
fn counters_from_many_threads_sum_exactly() {
    let b = Bulkhead::builder()
        .max_concurrent(8)
        .token_budget(10_000)
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..N {
                    let a = b
                        .try_acquire(Demand::tokens(Reservation::new(10, 10).unwrap()))
                        .unwrap();
                    a.release(Some(Usage::new(5, 5))).unwrap();
                }
            });
        }
    });
    let s = b.stats();
    let t = s.token_budget.unwrap();
    assert_eq!(
        (s.admitted, s.released, s.in_flight),
        (4 * N as u64, 4 * N as u64, 0)
    );
    assert_eq!(
        (t.total_reserved, t.total_consumed, t.total_refunded),
        (80 * N as u64, 40 * N as u64, 40 * N as u64)
    );
}

#[test]
fn class_admissions_pin_and_settle_after_every_handle_is_gone() {
    // With classes the class slots keep the shared state alive (`src/protocol/classed.rs`,
    // "Lifetime"): a borrowed release updates the shared word after its class step, inside an
    // operation the free waits for; abandonment pins a handle until release. Here handles disappear while
    // such admissions are live, on two threads.
    use llm_bulkhead::ClassLimits;
    for _ in 0..N {
        let b = Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(1_000)
            .class(
                "p",
                ClassLimits {
                    protected_concurrent: 1,
                    protected_tokens: 100,
                    ..Default::default()
                },
            )
            .class("q", ClassLimits::default())
            .default_class("q")
            .build()
            .unwrap();
        let p = b.class_id("p").unwrap();
        let mut borrowed = b
            .try_acquire(Demand::tokens(Reservation::new(10, 5).unwrap()))
            .unwrap();
        let protected = b
            .try_acquire(Demand::tokens(Reservation::new(10, 5).unwrap()).in_class(p))
            .unwrap();
        let other = b.try_acquire(Demand::slot()).unwrap();
        assert!(borrowed.abandon_borrowed_concurrency());
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            drop(other); // a borrowed release: the class word, then the shared word
            drop(b2);
        });
        drop(b);
        t.join().unwrap();
        drop(protected); // within its floors: one CAS on its class word
        borrowed.release(None).unwrap(); // the pin taken at abandonment goes last
    }
}
