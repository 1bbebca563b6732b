//! Class identities (vocabulary): [`ClassId`], [`UnknownClass`], [`Resources`] (how an
//! admission's capacity was attributed) and [`MAX_CLASSES`]. The class table and its limits
//! are in `crate::words::classes`.

/// The most classes a bulkhead can have.
pub const MAX_CLASSES: usize = 8;

/// A class of a bulkhead, by position in its construction-time table. Obtained from
/// [`Bulkhead::class_id`](crate::Bulkhead::class_id).
///
/// ```
/// use llm_bulkhead::{Bulkhead, ClassLimits};
/// let b = Bulkhead::builder().max_concurrent(4)
///     .class("premium", ClassLimits::default()).class("standard", ClassLimits::default())
///     .default_class("standard").build().unwrap();
/// assert_eq!(b.class_id("standard").unwrap().index(), 1);
/// assert!(b.class_id("raw-tenant-id").is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassId(pub(crate) u8);

impl ClassId {
    /// The position in the class table.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, ClassLimits};
    /// # let b = Bulkhead::builder().class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// assert_eq!(b.class_id("a").unwrap().index(), 0);
    /// ```
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// How an admission's capacity was attributed at its decision (immutable afterwards).
///
/// ```
/// use llm_bulkhead::Resources;
/// assert_eq!(Resources::default(), Resources { borrowed_concurrency: false, borrowed_tokens: 0 });
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
