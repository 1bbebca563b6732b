//! How a CAS that lost to another thread's write waits before it tries again, in both
//! protocols: the no-class decision's CAS on the state word (`super::plain`), and the class
//! protocol's retries (`super::classed`: a borrower's shared and class CAS, a protected
//! step's class CAS, a contended release).
//!
//! Two threads deciding in one class write the same two cache lines, the class word and the
//! shared word, four times a borrowing pair (a CAS on each to admit, a `fetch_sub` on each to
//! release). A CAS that fails has already pulled the line away from the thread that won, and
//! one tried again at once pulls it away again, in the middle of that thread's pair. Waiting a
//! little first lets the winner finish its pair on lines it holds, as a thread holding a lock
//! would, before the loser takes them over.
//!
//! The wait is three steps of crossbeam's [`Backoff::spin`] per retry: 7 spin hints, then 56,
//! then 192 (a hint took about 25 ns on the 2-core EPYC machine this was tuned on, so the
//! first wait is about three pairs of the thread that won). Two threads, one build whose step
//! count was read from a variable for the runs, each count run for 9 rounds of 500,000 to
//! 1,000,000 pairs a thread, the counts alternated (the shapes of `benches/core.rs`'s
//! `classes` group), median ns a pair:
//!
//! | steps per retry | borrowing, one class | borrowing, two classes | protected, one class |
//! |---|---|---|---|
//! | none (before) | about 150 | about 75 | about 85 |
//! | 1 | 100-250 (two builds) | | |
//! | 2 | 70-74 | 66-67 | 63-65 |
//! | 3 | 58-65 | 54-55 | 52-53 |
//! | 4 | 54-72 | 54-57 | 50-64 |
//!
//! The no-class decision, one word, waited one step before: two threads on the slot pair took
//! 39.3 ns a pair with one step and 20.7 with three (one-round runs of `benches/core.rs`'s
//! `two_threads` group; 33-41 and 18-20 in paired runs of the two counts).
//!
//! Reloading the word after the wait, instead of trying the CAS on the value the failed one
//! returned, doubled the time (a load then a CAS is two transfers of the line). Only the
//! retries wait: a first CAS that succeeds pays nothing, and a thread pays at most the
//! waits of the retries it makes (the fast attempt's are bounded, and every failed CAS is
//! another thread's progress).

use crossbeam_utils::Backoff;

/// The wait before each retry of a CAS that another thread's write beat (module docs): made
/// when the first CAS failed, waited on before each retry, which tries the CAS on the value
/// the failed one returned.
pub(crate) struct Retry(Backoff);

impl Retry {
    /// A wait that starts at its shortest.
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Self(Backoff::new())
    }

    /// Waits before the next retry, longer each time (7, 56, then 192 spin hints). Under loom
    /// the hints do nothing: the models explore the retries' interleavings.
    ///
    /// Out of line and cold: the inlined decisions keep only a call on their retry path (the
    /// spin loops inlined there made the uncontended no-class pair 3-5% slower with the same
    /// instructions), and a call is nothing beside the wait.
    #[cold]
    #[inline(never)]
    pub(crate) fn wait(&self) {
        self.0.spin();
        self.0.spin();
        self.0.spin();
    }
}
