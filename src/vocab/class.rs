//! Class identities (vocabulary): [`ClassId`], [`UnknownClass`], [`Resources`] (how an
//! admission's capacity was attributed) and [`MAX_CLASSES`]. The class table and its limits
//! are in `crate::words::classes`.

use crate::vocab::error::{ConfigError, ConfigProblem};
use std::num::NonZeroU64;

/// The most classes a bulkhead can have.
pub const MAX_CLASSES: usize = 8;

/// A class of one bulkhead. Obtained only from
/// [`Bulkhead::class_id`](crate::Bulkhead::class_id) (or an admission's
/// [`class`](crate::Admission::class)): it carries its position in that bulkhead's table and the
/// bulkhead's identity, so it cannot be forged from an integer and does not deserialise.
///
/// A decision given a `ClassId` of another bulkhead (one built separately, even with the same
/// table), or any class on a bulkhead without classes, is refused with
/// [`RejectReason::UnknownClass`](crate::RejectReason::UnknownClass) before anything changes
/// (nothing is taken, counted or published). It serialises as its position.
///
/// ```
/// use llm_bulkhead::{Bulkhead, ClassLimits, Demand, RejectReason};
/// let build = || Bulkhead::builder().max_concurrent(4)
///     .class("premium", ClassLimits::default()).class("standard", ClassLimits::default())
///     .default_class("standard").build().unwrap();
/// let (b, other) = (build(), build());
/// assert_eq!(b.class_id("standard").unwrap().index(), 1);
/// assert!(b.class_id("raw-tenant-id").is_err());
/// // A class of another bulkhead is an error here, not the default class.
/// let foreign = Demand::slot().in_class(other.class_id("premium").unwrap());
/// assert_eq!(b.try_acquire(foreign).unwrap_err().reason, RejectReason::UnknownClass);
/// ```
///
/// # Identity
///
/// A `ClassId` is one 64-bit word, `[bulkhead serial:56][index:8]`, so `Option<ClassId>` is 8
/// bytes. Serials are drawn from a process-wide counter that is never reset and never wraps:
/// 2^56 − 1 of them (at one bulkhead built per nanosecond, more than two years of nothing but
/// builds). Once they are used up, building a bulkhead fails with a [`ConfigError`] on field
/// `"bulkheads"` ([`ConfigProblem::TooLarge`]); a serial is
/// never reused, so a foreign id can never be taken for one of this bulkhead's.
///
/// [`ConfigError`]: crate::ConfigError
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(NonZeroU64);

/// Bits of a [`ClassId`] that hold the class index.
const INDEX_BITS: u32 = 8;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// The largest class serial: serials fill the 56 bits above the index.
pub(crate) const MAX_OWNER: u64 = (1 << (64 - INDEX_BITS)) - 1;

/// The identity a bulkhead's [`ClassId`]s carry: its class serial, in place (shifted above the
/// index bits), never 0. Made only by [`next_owner`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ClassOwner(NonZeroU64);

impl ClassOwner {
    /// The identity of serial 1, for unit tests that need a fixed id.
    #[cfg(test)]
    pub(crate) const MIN: ClassOwner = match NonZeroU64::new(1 << INDEX_BITS) {
        Some(bits) => ClassOwner(bits),
        None => unreachable!(),
    };

    /// The identity as the bits of its ids above the index (never 0), as a class table
    /// records its provenance (`crate::words::classes`).
    #[inline]
    pub(crate) fn bits(self) -> u64 {
        self.0.get()
    }
}

impl ClassId {
    /// The class `index` of the bulkhead whose class serial is `owner`.
    #[inline]
    pub(crate) fn new(owner: ClassOwner, index: usize) -> ClassId {
        debug_assert!(index < MAX_CLASSES);
        ClassId(owner.0 | (index as u64 & INDEX_MASK))
    }

    /// Whether this is a class of the bulkhead whose identity is `owner` (one compare).
    #[inline]
    pub(crate) fn is_of(self, owner: ClassOwner) -> bool {
        self.0.get() & !INDEX_MASK == owner.0.get()
    }

    /// The serial of the bulkhead that issued it.
    #[inline]
    pub(crate) fn owner_serial(self) -> u64 {
        self.0.get() >> INDEX_BITS
    }

    /// The issuing bulkhead's identity bits ([`ClassOwner::bits`]).
    #[inline]
    pub(crate) fn owner_bits(self) -> u64 {
        self.0.get() & !INDEX_MASK
    }

    /// The position in the class table.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, ClassLimits};
    /// # let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// assert_eq!(b.class_id("a").unwrap().index(), 0);
    /// ```
    #[must_use]
    #[inline]
    pub fn index(self) -> usize {
        (self.0.get() & INDEX_MASK) as usize
    }
}

/// Shows the position and the issuing bulkhead's serial: `ClassId { index: 1, bulkhead: 7 }`.
///
/// ```
/// # use llm_bulkhead::{Bulkhead, ClassLimits};
/// # let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
/// assert!(format!("{:?}", b.class_id("a").unwrap()).starts_with("ClassId { index: 0, bulkhead: "));
/// ```
impl std::fmt::Debug for ClassId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassId")
            .field("index", &self.index())
            .field("bulkhead", &self.owner_serial())
            .finish()
    }
}

/// Serialises as its class's name (`"batch"`), as events name it, so that a report a gateway
/// forwards ([`UsageReport`](crate::UsageReport), [`ReleaseReport`](crate::ReleaseReport), the
/// LLM layer's deadline error) needs no lookup. There is no `Deserialize`: a class is named by
/// [`Bulkhead::class_id`](crate::Bulkhead::class_id).
///
/// ```
/// use llm_bulkhead::{Bulkhead, ClassLimits};
/// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default())
///     .default_class("batch").build().unwrap();
/// assert_eq!(serde_json::to_string(&b.class_id("batch").unwrap()).unwrap(), r#""batch""#);
/// ```
#[cfg(feature = "serde")]
impl serde::Serialize for ClassId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.name() {
            Some(name) => s.serialize_str(name),
            // Only ids made without a bulkhead (the crate's own unit tests) have no name.
            None => s.serialize_u8(self.index() as u8),
        }
    }
}

/// The class names of every bulkhead built with classes, by its identity bits
/// ([`ClassOwner::bits`]): read when a [`ClassId`] is serialised (never on a decision), so its
/// lock is plain `std` under loom too, as `crate::sync::intern`'s. An entry is a few words
/// (the names themselves are interned once per distinct name) and stays for the life of the
/// process, because ids are `Copy` and may be serialised after their bulkhead is gone.
#[cfg(feature = "serde")]
#[allow(clippy::disallowed_types)]
static NAMES: std::sync::Mutex<std::collections::BTreeMap<u64, Box<[&'static str]>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Records the class names of the bulkhead whose identity is `owner` (when it is built).
#[cfg(feature = "serde")]
pub(crate) fn register_names(owner: ClassOwner, names: &[&'static str]) {
    NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(owner.bits(), names.into());
}

#[cfg(feature = "serde")]
impl ClassId {
    /// The class's name, as its bulkhead was built with it.
    fn name(self) -> Option<&'static str> {
        let names = NAMES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        names
            .get(&(self.0.get() & !INDEX_MASK))
            .and_then(|n| n.get(self.index()).copied())
    }
}

/// The next class serial, distinct for every bulkhead (and sequential model) of the process:
/// a counter of its own that refuses to go past [`MAX_OWNER`] rather than wrap, so a serial is
/// never issued twice.
///
/// # Errors
/// [`ConfigProblem::TooLarge`] on field `"bulkheads"` once 2^56 − 1 serials were issued.
pub(crate) fn next_owner() -> Result<ClassOwner, ConfigError> {
    static SERIALS: crate::sync::SerialCounter = crate::sync::SerialCounter::new(1);
    next_owner_from(&SERIALS)
}

/// [`next_owner`] drawing from `serials` (the next serial to issue).
fn next_owner_from(serials: &crate::sync::SerialCounter) -> Result<ClassOwner, ConfigError> {
    let exhausted = |value| ConfigError {
        field: "bulkheads",
        problem: ConfigProblem::TooLarge {
            value,
            max: MAX_OWNER,
        },
    };
    let serial = serials.next(MAX_OWNER).map_err(exhausted)?;
    // Serials start at 1 and stay at most MAX_OWNER, so the shifted serial is never 0.
    NonZeroU64::new(serial << INDEX_BITS)
        .map(ClassOwner)
        .ok_or_else(|| exhausted(serial))
}

/// How an admission's capacity was attributed at its decision (immutable afterwards).
///
/// ```
/// use llm_bulkhead::Resources;
/// let r = Resources::default();
/// assert_eq!((r.borrowed_concurrency, r.borrowed_tokens), (false, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Resources {
    /// The slot came from the shared remainder (always true for a class without a floor).
    pub borrowed_concurrency: bool,
    /// Reservation tokens placed in the shared remainder.
    pub borrowed_tokens: u64,
}

/// A class name that the bulkhead's table does not contain.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let e = Bulkhead::new(1).unwrap().class_id("x").unwrap_err();
/// assert_eq!(e.to_string(), "unknown admission class \"x\"");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownClass(pub String);

impl std::fmt::Display for UnknownClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown admission class {:?}", self.0)
    }
}

impl std::error::Error for UnknownClass {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::SerialCounter;

    #[test]
    fn ids_pack_serial_and_index_and_compare_by_owner() {
        let (a, b) = (next_owner().unwrap(), next_owner().unwrap());
        assert_ne!(a, b);
        let id = ClassId::new(a, 7);
        assert_eq!(id.index(), 7);
        assert!(id.is_of(a) && !id.is_of(b));
        assert_eq!(id.owner_bits(), a.bits());
        assert_eq!(std::mem::size_of::<Option<ClassId>>(), 8);
    }

    #[test]
    fn serials_above_32_bits_keep_their_identity() {
        // The old 32-bit serial wrapped here and made this id equal to serial 1's.
        let high = next_owner_from(&SerialCounter::new((1 << 32) + 1)).unwrap();
        let low = next_owner_from(&SerialCounter::new(1)).unwrap();
        assert_eq!(ClassId::new(high, 0).owner_serial(), (1 << 32) + 1);
        assert!(!ClassId::new(high, 0).is_of(low));
        assert_ne!(ClassId::new(high, 0), ClassId::new(low, 0));
    }

    #[test]
    fn exhausted_serials_are_a_typed_error_never_a_reuse() {
        let serials = SerialCounter::new(MAX_OWNER);
        let last = next_owner_from(&serials).unwrap();
        assert_eq!(ClassId::new(last, 0).owner_serial(), MAX_OWNER);
        assert_eq!(ClassId::new(last, MAX_CLASSES - 1).index(), MAX_CLASSES - 1);
        for _ in 0..2 {
            let e = next_owner_from(&serials).unwrap_err();
            assert_eq!(e.field, "bulkheads");
            assert!(matches!(
                e.problem,
                ConfigProblem::TooLarge { max: MAX_OWNER, .. }
            ));
        }
    }
}
