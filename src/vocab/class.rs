//! Class identities (vocabulary): [`ClassId`], [`UnknownClass`], [`Resources`] (how an
//! admission's capacity was attributed) and [`MAX_CLASSES`]. The class table and its limits
//! are in `crate::words::classes`.

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId {
    /// The owning bulkhead's class serial (`Shared::class_owner`), never 0.
    pub(crate) owner: std::num::NonZeroU32,
    pub(crate) index: u8,
}

impl ClassId {
    /// The class `index` of the bulkhead whose class serial is `owner`.
    #[inline]
    pub(crate) fn new(owner: std::num::NonZeroU32, index: usize) -> ClassId {
        debug_assert!(index < MAX_CLASSES);
        ClassId {
            owner,
            index: index as u8,
        }
    }

    /// The position in the class table.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, ClassLimits};
    /// # let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// assert_eq!(b.class_id("a").unwrap().index(), 0);
    /// ```
    #[must_use]
    pub fn index(self) -> usize {
        usize::from(self.index)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for ClassId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.index)
    }
}

/// The next class serial: distinct for every bulkhead of the process (wrapping after 2^32 − 1
/// bulkheads, never 0).
pub(crate) fn next_owner() -> std::num::NonZeroU32 {
    loop {
        if let Some(n) = std::num::NonZeroU32::new(crate::sync::next_serial() as u32) {
            return n;
        }
    }
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
