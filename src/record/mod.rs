//! What the layers above record (layer 3): events for subscribers (`events`), the per-thread
//! statistics stripes (`stats`) and the clock of a timed decision (`timing`). Fed by the
//! protocols, the waits and the handles; they import none of them.

pub(crate) mod events;
pub(crate) mod stats;
pub(crate) mod timing;
