//! How a class-protocol CAS that lost to another thread's write waits before it tries again.
//!
//! Two threads deciding in one class write the same two cache lines, the class word and the
//! shared word, four times a borrowing pair (a CAS on each to admit, a `fetch_sub` on each to
//! release). A CAS that fails has already pulled the line away from the thread that won, and
//! one tried again at once pulls it away again, in the middle of that thread's pair. Waiting a
//! little first lets the winner finish its pair on lines it holds, as a thread holding a lock
//! would, before the loser takes them over.
//!
//! The wait is two steps of crossbeam's [`Backoff::spin`] per retry: 3 spin hints, then 12,
//! 48 and 128. Measured on the 2-core machine, with two threads borrowing in one class (`benches/core.rs`,
//! `classes/two_threads_borrowing_same_class`, and a paired run of each build, alternated):
//! about 150 ns a pair without a wait, 100 ns with one step per retry (1, 2, 4, 8 hints), 62
//! ns with two, and no better with three. Reloading the word after the wait, instead of trying
//! the CAS on the value the failed one returned, doubled the time again (a load then a CAS is
//! two transfers of the line). Only the retries wait: a first CAS that succeeds pays nothing.

use crossbeam_utils::Backoff;

/// The wait before each retry of a CAS that another thread's write beat (module docs): made
/// when the first CAS failed, waited on before each retry, which tries the CAS on the value
/// the failed one returned.
pub(super) struct Retry(Backoff);

impl Retry {
    /// A wait that starts at its shortest.
    #[inline(always)]
    pub(super) fn new() -> Self {
        Self(Backoff::new())
    }

    /// Waits before the next retry, longer each time (3, 12, 48, then 128 spin hints). Under
    /// loom the hints do nothing: the models explore the retries' interleavings.
    #[inline(always)]
    pub(super) fn wait(&self) {
        self.0.spin();
        self.0.spin();
    }
}
