//! The waits (layer 6, and the waiter list at layer 3): the intrusive FIFO list of waiters
//! (`list`), blocking acquire, the `Acquire` future, drain, cancellation and the timer.

pub(crate) mod cancel;
pub(crate) mod list;
pub mod multi;
pub(crate) mod timer;
pub(crate) mod waiting;
