//! Admission ids: UUID-formatted, unique within the process, made without a contended atomic.
//!
//! Each thread draws a 32-bit key once (one `fetch_add` on a global counter, at the thread's
//! first admission) and then numbers its admissions with a thread-local counter. The id packs
//! `(per-process random salt, thread key, counter)` into a UUID with version 8 ("custom") and
//! the RFC 9562 variant, so ids are unique for 2^62 admissions per thread and 2^32 threads.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

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
pub struct AdmissionId(u128);

impl AdmissionId {
    /// The id as a 128-bit integer (the UUID's big-endian value).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, Demand};
    /// # let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(a.id().as_u128() >> 76 & 0xf, 8);
    /// ```
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Used by the sequential model, whose ids are its handle numbers.
    pub(crate) fn from_u128(v: u128) -> AdmissionId {
        AdmissionId(v)
    }

    pub(crate) fn next() -> AdmissionId {
        thread_local! {
            static NEXT: Cell<(u64, u64)> = const { Cell::new((u64::MAX, 0)) };
        }
        static KEYS: AtomicU64 = AtomicU64::new(0);
        static SALT: OnceLock<u64> = OnceLock::new();
        let (mut key, counter) = NEXT.with(Cell::get);
        if key == u64::MAX {
            key = KEYS.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
        }
        NEXT.with(|c| c.set((key, counter + 1)));
        let salt = *SALT.get_or_init(|| {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        let counter = u128::from(counter) & ((1 << 62) - 1);
        let key = u128::from(key);
        let v = counter
            | (0b10 << 62)
            | ((key & 0xfff) << 64)
            | (0x8 << 76)
            | ((key >> 12) << 80)
            | (u128::from(salt & 0x0fff_ffff) << 100);
        AdmissionId(v)
    }
}

impl fmt::Display for AdmissionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&uuid::Uuid::from_u128(self.0).hyphenated(), f)
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
    fn ids_are_unique_across_threads_and_well_formed() {
        let all: Vec<AdmissionId> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..1000).map(|_| AdmissionId::next()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let set: HashSet<_> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len());
        for id in &all {
            let u = uuid::Uuid::from_u128(id.as_u128());
            assert_eq!(u.get_version_num(), 8);
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
        }
    }
}
