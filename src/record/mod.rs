//! What the layers above record (layer 3): events for subscribers (`events`) and the
//! per-thread statistics stripes (`stats`). Fed by the protocols, the waits and the handles;
//! they import none of them.

pub(crate) mod events;
pub(crate) mod stats;
