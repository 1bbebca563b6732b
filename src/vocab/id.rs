//! Admission ids: UUID-formatted, unique, made without a contended atomic and without a
//! second thread-local lookup.
//!
//! An admission already bumps its thread's `admitted` counter (see `crate::record::stats`); the value
//! it replaced numbers the admission within that per-thread entry. The id packs
//!
//! ```text
//! [salt:16][bulkhead serial:24][key hi:8][version 8:4][key lo:12][variant:2][counter:62]
//! ```
//!
//! where the salt is random per process, the serial numbers bulkheads within the process, and
//! the key numbers the per-thread entries of one bulkhead (entries are reused by later threads,
//! so keys stay below the peak number of threads). Ids are therefore unique within a process
//! for 2^24 bulkheads, 2^20 concurrent threads per bulkhead and 2^62 admissions per entry, and
//! the random salt separates processes. The result is a version-8 ("custom") RFC 9562 UUID.
//!
//! # The reserved space
//!
//! Admission ids always have the variant bits `10` (RFC 9562). Ids with the variant bits `11`
//! form a *reserved space* that the core never mints for an admission: a layer above that
//! needs ids for work the core did not admit mints them with `AdmissionId::reserved` (the
//! bulkhead's prefix and a counter of its own), so they can never equal an admission id of
//! any bulkhead. The core gives them no meaning. The layer that mints them names the space
//! once (`name_reserved_space`, a process-wide name, first caller wins), and every reserved
//! id then displays as `<name>-<uuid>` with the RFC variant restored, wherever it travels (a
//! report, an event); without a name, as the UUID of its bits. `AdmissionId::is_reserved`
//! tells them apart.

use std::fmt;

/// The identity of one admission.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand};
/// let b = Bulkhead::builder().max_concurrent(2).build().unwrap();
/// let (x, y) = (b.try_acquire(Demand::slot()).unwrap(), b.try_acquire(Demand::slot()).unwrap());
/// assert_ne!(x.id(), y.id());
/// let s = x.id().to_string();
/// assert_eq!((s.len(), &s[14..15]), (36, "8")); // a version-8 UUID
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdmissionId([u64; 2]);

impl AdmissionId {
    /// The id as a 128-bit integer (the UUID's big-endian value).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// # let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(a.id().as_u128() >> 76 & 0xf, 8);
    /// ```
    #[must_use]
    pub fn as_u128(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }

    /// Whether the id is in the reserved space (variant bits `11`, see the module
    /// documentation): never an admission's.
    pub(crate) fn is_reserved(self) -> bool {
        self.0[1] >> 62 == 0b11
    }

    /// The id in the reserved space numbered `counter` (62 bits) for the bulkhead whose
    /// [`prefix`] is `prefix`: its layer keeps the counter, one per bulkhead, so the ids it
    /// mints are unique within a bulkhead and never equal an admission id.
    // Only layers above the core mint them (the `llm` layer's).
    #[cfg_attr(not(feature = "llm"), allow(dead_code))]
    pub(crate) fn reserved(prefix: u128, counter: u64) -> AdmissionId {
        let mut id = AdmissionId::new(prefix, 0, counter);
        id.0[1] |= 0b11 << 62;
        id
    }

    /// The id's bits with the RFC variant (`10`) restored: for a reserved id, the UUID it
    /// displays after its space's name (so that it cannot be read as an admission's); for an
    /// admission id, the id itself.
    fn rfc_uuid(self) -> uuid::Uuid {
        uuid::Uuid::from_u128(self.as_u128() & !(1 << 62))
    }

    /// Used by the sequential model, whose ids are its handle numbers.
    pub(crate) fn from_u128(v: u128) -> AdmissionId {
        AdmissionId([(v >> 64) as u64, v as u64])
    }

    /// The id of admission number `counter` of per-thread entry `key` of the bulkhead whose
    /// [`prefix`] is `prefix`.
    #[inline]
    pub(crate) fn new(prefix: u128, key: u64, counter: u64) -> AdmissionId {
        AdmissionId::from_key_bits(prefix, AdmissionId::key_bits(key), counter)
    }

    /// Entry `key`'s bits in place in the id's high word (12 bits at 0, 8 at 16): what a
    /// counters entry keeps (`crate::record::stats::Counters::key`), so that minting an id
    /// does not spread the key again each time.
    #[inline]
    pub(crate) fn key_bits(key: u64) -> u64 {
        (key & 0xfff) | (((key >> 12) & 0xff) << 16)
    }

    /// [`new`](Self::new) with the key already spread ([`key_bits`](Self::key_bits)).
    #[inline]
    pub(crate) fn from_key_bits(prefix: u128, key_bits: u64, counter: u64) -> AdmissionId {
        // Stored as two words (8-byte alignment keeps `Admission` small).
        AdmissionId::from_u128(
            prefix | (u128::from(counter) & ((1 << 62) - 1)) | (u128::from(key_bits) << 64),
        )
    }
}

/// The bits every id of one bulkhead shares: salt, serial, version and variant.
pub(crate) fn prefix() -> u128 {
    static SALT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let salt = *SALT.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let serial = crate::sync::next_serial();
    (u128::from(salt & 0xffff) << 112)
        | (u128::from(serial & 0xff_ffff) << 88)
        | (0x8 << 76)
        | (0b10 << 62)
}

/// The name reserved ids display with (module docs, "The reserved space").
static RESERVED_NAME: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the reserved space for display: every reserved id displays as `<name>-<uuid>` from
/// now on. Process-wide and set once: the first name stays (only one layer mints them).
#[cfg_attr(not(feature = "llm"), allow(dead_code))]
pub(crate) fn name_reserved_space(name: &'static str) {
    let _ = RESERVED_NAME.set(name);
}

/// Numbers the per-thread counter entries of bulkheads (once per thread and bulkhead).
pub(crate) fn next_key() -> u64 {
    crate::sync::next_serial() & 0xf_ffff
}

impl fmt::Display for AdmissionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_reserved() {
            if let Some(name) = RESERVED_NAME.get() {
                return write!(f, "{name}-{}", self.rfc_uuid().hyphenated());
            }
        }
        fmt::Display::fmt(&uuid::Uuid::from_u128(self.as_u128()).hyphenated(), f)
    }
}

impl fmt::Debug for AdmissionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdmissionId({self})")
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for AdmissionId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_and_well_formed() {
        let (p, q) = (prefix(), prefix());
        let mut all = Vec::new();
        for prefix in [p, q] {
            for key in [0, 1, 0xfff, 0x1000, 0xf_ffff] {
                for counter in [0, 1, (1 << 62) - 1] {
                    all.push(AdmissionId::new(prefix, key, counter));
                }
            }
        }
        let normal = all.len();
        for prefix in [p, q] {
            for counter in [0, 1, 2, (1 << 62) - 1] {
                let id = AdmissionId::reserved(prefix, counter);
                assert!(id.is_reserved());
                assert_eq!(id.rfc_uuid().get_variant(), uuid::Variant::RFC4122);
                assert_ne!(id.to_string(), id.rfc_uuid().to_string());
                all.push(id);
            }
        }
        assert!(all[..normal].iter().all(|id| !id.is_reserved()));
        assert!(all[..normal]
            .iter()
            .all(|id| id.rfc_uuid() == uuid::Uuid::from_u128(id.as_u128())));
        let set: HashSet<_> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len());
        for id in &all[..normal] {
            let u = uuid::Uuid::from_u128(id.as_u128());
            assert_eq!(u.get_version_num(), 8);
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
        }
    }
}
