//! The protocols (layer 5): how a decision changes the words. The class protocol (`classed`)
//! with its enter, return, pump and refusal code. They do not reach up into the waits
//! (`crate::wait`) nor the handles.

pub(crate) mod class_pump;
pub(crate) mod classed;
pub(crate) mod handoff;
