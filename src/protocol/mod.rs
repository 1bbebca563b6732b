//! The protocols (layer 5): how a decision changes the words. The no-class protocol (`plain`:
//! its enter, refusal and returns; its hand-off, pump and close in `handoff`), the class
//! protocol (`classed`) with its enter, return, pump and refusal code, the token-waiting rules
//! both share (`token_wait`), the wait of a CAS that lost before it tries again (`backoff`) and
//! the events' hooks on their paths (`hooks`). They do not reach
//! up into the waits (`crate::wait`) nor the handles.

pub(crate) mod backoff;
pub(crate) mod class_pump;
pub(crate) mod classed;
pub(crate) mod handoff;
pub(crate) mod hooks;
pub(crate) mod install;
pub(crate) mod plain;
pub(crate) mod token_wait;

/// What a successful decision of either protocol hands to the handle that builds the
/// admission: the revision it was decided under, what numbers its id (the thread's counters
/// entry `key`, spread as the id holds it, and that entry's admission number `n`) and its class code. A few scalars: the
/// admission is built once, by the caller, from them.
pub(crate) struct Granted {
    pub(crate) revision: u64,
    pub(crate) key: u64,
    pub(crate) n: u64,
    pub(crate) class: ClassCode,
}

/// An admission's class and attribution as one plain word (0 without classes; the bits are
/// the admission's, `crate::handle::admission`), which is how a decision hands it over: a word
/// written and read whole (a multi-field value written by one function and read by its caller
/// made the reads stall on store forwarding).
#[derive(Clone, Copy, Default)]
pub(crate) struct ClassCode(pub(crate) u64);
