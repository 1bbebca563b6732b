//! The class-mode words (layouts only; the protocol that changes them is
//! `crate::protocol::classed`, whose module docs explain every field): one **class word** per
//! class, `[tokens t_k:32][in flight n_k:14 @32][ctag:14 @46][EPOCH @60][unused @61]
//! [DETACHED @62][QUEUE @63]`, and the **shared word**, `[V:32][U:16 @32][tag:14 @48][WAITERS @62][CLOSED
//! @63]` (tag and flags where the no-class word of `crate::words::state` has them).

// ---- class word ----

pub(crate) const CT_MASK: u64 = 0xffff_ffff;
pub(crate) const CN_SHIFT: u32 = 32;
pub(crate) const CN_MASK: u64 = ((1 << 14) - 1) << CN_SHIFT;
pub(crate) const CTAG_SHIFT: u32 = 46;
/// The class tag is the class's **version** modulo `CTAG_MOD`: the number of installs that
/// changed this class's own limits (floors or ceilings). An install that leaves a class's
/// limits as they were leaves its word alone, so the class tag comes back to a value only
/// after `CTAG_MOD` changes of that class. As wide as the limits tag (one bit under loom, so
/// that a model with two changes brings it back to the value an operation read): every
/// change is an install, so a class tag comes back no sooner than the limits tag, and the
/// grace period that keeps the limits tag from coming back under an operation keeps the class
/// tags from it too (`crate::grace`, "Class versions").
pub(crate) const CTAG_BITS: u32 = crate::words::state::TAG_BITS;
pub(crate) const CTAG_MOD: usize = 1 << CTAG_BITS;
pub(crate) const CTAG_MASK: u64 = ((CTAG_MOD - 1) as u64) << CTAG_SHIFT;
const _: () = assert!(CTAG_SHIFT + CTAG_BITS <= 62 && CN_SHIFT + 14 == CTAG_SHIFT);

/// The modulus class versions are taken in: [`CTAG_MOD`], except in the deliberately broken
/// variants that narrow it, where a class tag comes back long before the limits tag and the
/// grace period no longer covers it: `LLM_BULKHEAD_NARROW_CLASS_VERSION=1` (feature `testing`),
/// 4, the width class tags had when the grace period also waited for class operations. The
/// class regressions of `tests/tag_wrap.rs` are shown to fail on it. (Under loom the class tag
/// is already as narrow as it can be; its broken variant shortens the floors table instead,
/// `crate::words::floors`.)
#[inline(always)]
pub(crate) fn ctag_mod() -> usize {
    if crate::sync::test_switch!("LLM_BULKHEAD_NARROW_CLASS_VERSION") {
        return 4;
    }
    CTAG_MOD
}
/// The parity of the limits tag whose install last passed this word: every install sets it
/// on every class word to the parity of its new tag, after announcing that tag and before its
/// CAS of the state word's tag (`crate::protocol::install`). A borrower whose class CAS
/// replaced a word with its reservation's parity, and which then finds the next tag
/// announced, stepped before that install's CAS of the tag (`crate::protocol::classed`,
/// `moved`, "A borrower's step"). Every other writer keeps it.
pub(crate) const C_EPOCH: u64 = 1 << 60;
/// The [`C_EPOCH`] bit of every class word while the limits tag is `tag`.
#[inline(always)]
pub(crate) fn epoch_of(tag: usize) -> u64 {
    if tag & 1 == 1 {
        C_EPOCH
    } else {
        0
    }
}
/// Set on every class word once the last handle is gone.
pub(crate) const C_DETACHED: u64 = 1 << 62;
/// One class slot.
pub(crate) const C_ONE: u64 = 1 << CN_SHIFT;
/// Set on every class word while waiters are queued or drainers wait (under the queue mutex):
/// a decrease that replaces a word carrying it must visit the queue (`crate::wait::waiting`).
pub(crate) const C_QUEUE: u64 = 1 << 63;

/// A decoded class word.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct CWord(pub(crate) u64);

impl CWord {
    #[inline]
    pub(crate) fn tokens(self) -> u64 {
        self.0 & CT_MASK
    }
    #[inline]
    pub(crate) fn in_flight(self) -> u64 {
        (self.0 & CN_MASK) >> CN_SHIFT
    }
    /// The class version (mod [`ctag_mod`]) whose limits this class is accounted under.
    #[inline]
    pub(crate) fn ctag(self) -> usize {
        ((self.0 & CTAG_MASK) >> CTAG_SHIFT) as usize
    }
    /// Its [`C_EPOCH`] bit (compare with [`epoch_of`]).
    #[inline(always)]
    pub(crate) fn epoch(self) -> u64 {
        self.0 & C_EPOCH
    }
    #[inline]
    pub(crate) fn detached(self) -> bool {
        self.0 & C_DETACHED != 0
    }
    #[inline]
    pub(crate) fn with_ctag(self, version: usize) -> CWord {
        CWord((self.0 & !CTAG_MASK) | (((version % ctag_mod()) as u64) << CTAG_SHIFT))
    }
    /// Whether a decrease replacing this word must visit the queue.
    #[inline]
    pub(crate) fn queue(self) -> bool {
        self.0 & C_QUEUE != 0
    }
    /// Whether this word, after a return, leaves a detached class holding no slot.
    #[inline]
    pub(crate) fn emptied_detached(self) -> bool {
        self.detached() && self.in_flight() == 0
    }
}

/// The class word a class starts with at version `version`.
pub(crate) fn initial_class_word(version: usize) -> u64 {
    CWord(0).with_ctag(version).0
}

// ---- shared word ----

pub(crate) const V_MASK: u64 = 0xffff_ffff;
pub(crate) const U_SHIFT: u32 = 32;
pub(crate) const U_MASK: u64 = 0xffff << U_SHIFT;
/// One unit of `U`.
pub(crate) const G_ONE: u64 = 1 << U_SHIFT;

/// A decoded shared word (class mode).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct GWord(pub(crate) u64);

impl GWord {
    /// `V`, as stored (never below the true value).
    #[inline]
    pub(crate) fn v(self) -> u64 {
        self.0 & V_MASK
    }
    /// `U`, as stored (never below the true value).
    #[inline]
    pub(crate) fn u(self) -> u64 {
        (self.0 & U_MASK) >> U_SHIFT
    }
    #[inline]
    pub(crate) fn tag(self) -> usize {
        crate::words::state::Word(self.0).tag()
    }
    #[inline]
    pub(crate) fn closed(self) -> bool {
        crate::words::state::Word(self.0).closed()
    }
    #[inline]
    pub(crate) fn waiters(self) -> bool {
        crate::words::state::Word(self.0).waiters()
    }
}

impl std::fmt::Debug for GWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWord")
            .field("U", &self.u())
            .field("V", &self.v())
            .field("tag", &self.tag())
            .field("closed", &self.closed())
            .finish()
    }
}

/// The largest `max_concurrent` (and class concurrency limit) of a bulkhead with classes.
pub const MAX_CLASSED_SLOTS: u32 = (1 << 14) - 1;
/// The largest token budget (and class token limit) of a bulkhead with classes.
pub const MAX_CLASSED_TOKENS: u64 = (1 << 30) - 1;
/// Usage growth (`report_usage`) of a bulkhead with classes is refused once
/// `Σ_k max(tokens_k, protected_tokens_k)` would pass this; the rest of the 32-bit field is
/// room for a reconfiguration's advance on raised token floors (at most
/// [`MAX_CLASSED_TOKENS`]).
pub const MAX_CLASSED_HOLD: u64 = V_MASK - MAX_CLASSED_TOKENS;
pub(crate) const V_GROWTH_CAP: u64 = MAX_CLASSED_HOLD;

/// The shared word of a new bulkhead with limits `first`: `U = Σ pc`, `V = Σ pt`, tag 0.
pub(crate) fn initial_shared_word(first: &crate::LimitsSnapshot) -> u64 {
    let (u, v) = first.classes.floor_sums();
    (u << U_SHIFT) + v
}

/// The advance a reconfiguration adds to the shared word with its tag bump.
pub(crate) fn floor_advance(old: &crate::LimitsSnapshot, new: &crate::LimitsSnapshot) -> u64 {
    let (mut u, mut v) = (0u64, 0u64);
    for (a, b) in old.classes.iter().zip(new.classes.iter()) {
        u += u64::from(
            b.protected_concurrent
                .saturating_sub(a.protected_concurrent),
        );
        v += b.protected_tokens.saturating_sub(a.protected_tokens);
    }
    (u << U_SHIFT) + v
}
