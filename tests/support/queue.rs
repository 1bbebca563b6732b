//! Test support for the wait queue: waiting for waiters without sleeping, and checking that a
//! bulkhead is back at rest.

use llm_bulkhead::{Bulkhead, Demand};

/// Waits (without sleeping) until `n` waiters are queued on `b`.
pub fn until_pending(b: &Bulkhead, n: u64) {
    while b.stats().pending != n {
        std::thread::yield_now();
    }
}

/// Nothing held, nobody queued, the fast path admits again.
pub fn settled(b: &Bulkhead) {
    let s = b.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0), "{s:?}");
    drop(b.try_acquire(Demand::slot()).expect("the fast path admits"));
}
