//! One class's limits at every version an operation may still hold: the **floors table** the
//! decreases of the class protocol read for a class word's `ctag` (`crate::words::limits`,
//! "Class versions").
//!
//! # Why a whole tag period of entries
//!
//! A class word carries its class's version mod `CTAG_MOD`, which is the limits tag's period
//! (`crate::words::class_word`). The entry of version `v` is written by the install that brings
//! the class to `v`, before any word carries `v`, and rewritten only by the install that
//! brings it to `v + CTAG_MOD`. That install is at least a whole tag period of installs later
//! (every change of a class's limits is an install), so the grace period already made it wait
//! for every operation that may still hold `v` (`crate::grace`, "Class versions"). No entry
//! changes under a reader, and no install waits for a class operation more often than for the
//! limits tag.
//!
//! # Storage grown on demand
//!
//! `CTAG_MOD` entries of 16 bytes would be 256 KiB per class, for versions most bulkheads
//! never reach. The table holds the first [`FIRST`] inline and the rest in chunks of doubling
//! size (4, 8, … entries), each allocated by the first install that reaches it and kept until
//! the bulkhead is dropped: the memory follows the number of versions a class has had (up to
//! the period, after which versions come round again). A reader finds version `v` in the
//! inline part, or in chunk `ilog2(v) − FIRST_BITS` at `v − 2^ilog2(v)`.
//!
//! # Memory ordering
//!
//! The installer writes an entry (and allocates its chunk) before it writes the ring slot and
//! bumps the tag; a class word carries the version only after the install's migration, a
//! `SeqCst` CAS later in the installer's order, or a helper's that read the bumped tag. A reader
//! reads an entry for a version it loaded from a class word, so the entry's stores (and the
//! chunk's publication, a `OnceLock`) happen-before its loads.

use crate::sync::{fence, AtomicU64, Ordering};
use crate::words::class_word::{CTAG_BITS, CTAG_MOD};
use std::sync::OnceLock;

/// How many versions the inline part holds, as a power of two (two under loom, where the period
/// is two).
const FIRST_BITS: u32 = if CTAG_BITS < 2 { CTAG_BITS } else { 2 };
/// Versions `0..FIRST` live inline.
pub(crate) const FIRST: usize = 1 << FIRST_BITS;
/// The chunks after the inline part: chunk `i` holds versions `2^(i + FIRST_BITS)` up to twice
/// that (none under loom).
const CHUNKS: usize = (CTAG_BITS - FIRST_BITS) as usize;

/// One entry: a class's limits as `crate::words::limits` packs them.
pub(crate) type Entry = [AtomicU64; 2];

/// The floors table of one class (module docs).
#[derive(Default)]
pub(crate) struct Floors {
    first: [Entry; FIRST],
    rest: [OnceLock<Box<[Entry]>>; CHUNKS],
}

impl Floors {
    /// The entry of `version` (`< CTAG_MOD`), which an install wrote before any class word
    /// carried it (module docs).
    ///
    /// No call and no panic: a class word never carries a version no install wrote, and if one
    /// did (a broken invariant, which debug builds assert), the first entry would be read. With
    /// the chunks' lookup out of line (and a panic for a missing chunk), the class pairs kept
    /// more registers and cost 1 to 4 instructions more (`benches/instructions.rs`).
    #[inline(always)]
    pub(crate) fn entry(&self, version: usize) -> &Entry {
        debug_assert!(version < CTAG_MOD);
        let version = shortened_for_loom(version);
        if version < FIRST {
            return &self.first[version];
        }
        let (chunk, at) = chunk_of(version);
        let entry = self
            .rest
            .get(chunk)
            .and_then(OnceLock::get)
            .and_then(|c| c.get(at));
        debug_assert!(entry.is_some(), "no install wrote version {version}");
        entry.unwrap_or(&self.first[0])
    }

    /// Writes the packed limits `(a, b)` as the entry of `version` (`< CTAG_MOD`), allocating
    /// its chunk if this is the first version there. Only the reconfiguration-lock holder (or
    /// the constructor) calls this, for a version no operation may hold (module docs).
    pub(crate) fn write(&self, version: usize, (a, b): (u64, u64)) {
        debug_assert!(version < CTAG_MOD);
        let version = shortened_for_loom(version);
        let e = if version < FIRST {
            &self.first[version]
        } else {
            let (chunk, at) = chunk_of(version);
            // Chunk `i` holds `FIRST << i` versions, from `FIRST << i` on.
            let len = FIRST << chunk;
            let c = self.rest[chunk].get_or_init(|| (0..len).map(|_| Entry::default()).collect());
            &c[at]
        };
        fence(Ordering::Release);
        e[0].store(a, Ordering::Relaxed);
        e[1].store(b, Ordering::Relaxed);
    }

    /// How many versions have room (the inline part and every chunk allocated so far).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        FIRST
            + self
                .rest
                .iter()
                .filter_map(OnceLock::get)
                .map(|c| c.len())
                .sum::<usize>()
    }
}

/// Where `version` (`≥ FIRST`) lives: its chunk, and its place in it.
#[inline(always)]
fn chunk_of(version: usize) -> (usize, usize) {
    let bits = version.ilog2();
    ((bits - FIRST_BITS) as usize, version - (1 << bits))
}

/// Under loom, `LLM_BULKHEAD_LOOM_SHORT_FLOORS_TABLE=1` keeps one entry for every version, so
/// that an install rewrites the floors an operation in progress may still read (as a table
/// shorter than the tag period would): the deliberately broken variant the class release models
/// of `loom-tests/tests/tag_wrap.rs` are shown to fail on.
#[inline(always)]
fn shortened_for_loom(version: usize) -> usize {
    #[cfg(loom)]
    if crate::sync::broken_variant("LLM_BULKHEAD_LOOM_SHORT_FLOORS_TABLE") {
        return 0;
    }
    version
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_version_of_a_period_has_its_own_entry_and_chunks_grow_on_demand() {
        let f = Floors::default();
        assert_eq!(f.capacity(), FIRST);
        for v in 0..CTAG_MOD {
            f.write(v, (v as u64, !(v as u64)));
            if v == FIRST {
                assert_eq!(
                    f.capacity(),
                    2 * FIRST,
                    "the first chunk, allocated on demand"
                );
            }
        }
        assert_eq!(f.capacity(), CTAG_MOD);
        for v in 0..CTAG_MOD {
            let e = f.entry(v);
            let (a, b) = (e[0].load(Ordering::Relaxed), e[1].load(Ordering::Relaxed));
            assert_eq!((a, b), (v as u64, !(v as u64)), "version {v}");
        }
    }
}
