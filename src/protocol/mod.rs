//! The protocols (layer 5): how a decision changes the words. The class protocol (`classed`)
//! with its enter, return, pump and refusal code; the no-class hand-off (`handoff`) and the
//! token-waiting rules both share (`token_wait`). They do not reach up into the waits
//! (`crate::wait`) nor the handles.

pub(crate) mod class_pump;
pub(crate) mod classed;
pub(crate) mod handoff;
pub(crate) mod token_wait;
