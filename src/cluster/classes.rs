//! Per-class shares, pure: each admission class's global floor and ceiling split across the
//! replicas by the class's own demand, as the global slots and tokens are.
//!
//! A replica's class reservation is `floor: max(applied, granted)` and
//! `ceiling: max(applied, granted, held)` (per resource). The floor carries no in-flight term:
//! the core counts a class's work as protected only up to the floor it has installed, so an
//! applied floor covers the protected work in flight. Every class grant is capped by the class
//! limit less the other replicas' class reservations, so after every write
//! `Σ reserved floors ≤ global class floor` and `Σ reserved ceilings ≤ global class ceiling`
//! (I2 per class). A class ceiling equal to the global limit of its resource bounds nothing the
//! global limit does not: it is not split (the replica's class ceiling is its share of the
//! resource) and not counted.

use super::allocator::{fair, Amounts};

/// One admission class's global limits, as the store splits them. [`ClusterConfig::store_params`]
/// reads them from the bulkhead's class table.
///
/// [`ClusterConfig::store_params`]: super::ClusterConfig::store_params
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClassParams};
/// let c = ClassParams { name: "chat".into(), floor: Amounts::new(4, 0), ceiling: Amounts::new(6, 0),
///                       min: Amounts::new(1, 0) };
/// assert!(c.min.fits_in(c.floor));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassParams {
    /// The class name (`[A-Za-z0-9_.-]`, at most 64 bytes).
    pub name: String,
    /// The global class floor: protected slots and protected tokens across all replicas.
    pub floor: Amounts,
    /// The global class ceiling; a resource at the global limit has none.
    pub ceiling: Amounts,
    /// The per-replica floor of the floor split (each live replica's class demand is raised to
    /// it): the class's part of the per-replica floor, `⌊floor · replica floor / global⌋`.
    pub min: Amounts,
}

/// A replica's share of one class: the floor and the ceiling it may install.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClassShare};
/// assert_eq!(ClassShare::ZERO.ceiling, Amounts::ZERO);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClassShare {
    /// Protected slots and tokens.
    pub floor: Amounts,
    /// The class's ceiling on this replica.
    pub ceiling: Amounts,
}

impl ClassShare {
    /// Nothing.
    pub const ZERO: ClassShare = ClassShare {
        floor: Amounts::ZERO,
        ceiling: Amounts::ZERO,
    };

    /// The smaller of each part.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClassShare};
    /// let a = ClassShare { floor: Amounts::new(2, 0), ceiling: Amounts::new(5, 0) };
    /// assert_eq!(a.min(ClassShare::ZERO), ClassShare::ZERO);
    /// ```
    #[must_use]
    pub fn min(self, o: ClassShare) -> ClassShare {
        ClassShare {
            floor: self.floor.min(o.floor),
            ceiling: self.ceiling.min(o.ceiling),
        }
    }
}

/// What a replica reports for one class at a renewal.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClassShare, ClassUse};
/// let u = ClassUse::new("chat", ClassShare::ZERO, Amounts::ZERO, Amounts::new(2, 0));
/// assert_eq!(u.wants.slots, 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassUse {
    /// The class, as named in the store's parameters.
    pub name: String,
    /// The class share installed now.
    pub applied: ClassShare,
    /// The class's work in flight now.
    pub held: Amounts,
    /// The class's demand (at most its global ceiling).
    pub wants: Amounts,
}

impl ClassUse {
    /// A report for class `name`.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClassShare, ClassUse};
    /// assert_eq!(ClassUse::new("a", ClassShare::ZERO, Amounts::ZERO, Amounts::ZERO).name, "a");
    /// ```
    #[must_use]
    pub fn new(name: &str, applied: ClassShare, held: Amounts, wants: Amounts) -> Self {
        ClassUse {
            name: name.to_owned(),
            applied,
            held,
            wants,
        }
    }
}

/// One replica's record for one class, in the order of the store's class parameters.
///
/// ```
/// use llm_bulkhead::cluster::{Amounts, ClassRecord, ClassShare};
/// let big = ClassShare { floor: Amounts::new(3, 0), ceiling: Amounts::new(5, 0) };
/// let r = ClassRecord { applied: big, granted: ClassShare::ZERO, held: Amounts::new(6, 0), wants: Amounts::ZERO };
/// assert_eq!(r.reserved(), ClassShare { floor: Amounts::new(3, 0), ceiling: Amounts::new(6, 0) });
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClassRecord {
    /// The class share installed at the last renewal.
    pub applied: ClassShare,
    /// The class share granted then.
    pub granted: ClassShare,
    /// The class's work in flight then.
    pub held: Amounts,
    /// The class's demand.
    pub wants: Amounts,
}

impl ClassRecord {
    /// What the store keeps reserved for this class on this replica: the larger of the applied
    /// and the granted floor; the larger of the applied and the granted ceiling and the work in
    /// flight. A smaller grant frees nothing until the replica reports it installed and its
    /// class work fits.
    ///
    /// ```
    /// # use llm_bulkhead::cluster::{Amounts, ClassRecord};
    /// assert_eq!(ClassRecord::default().reserved().floor, Amounts::ZERO);
    /// ```
    #[must_use]
    pub fn reserved(&self) -> ClassShare {
        ClassShare {
            floor: self.applied.floor.max(self.granted.floor),
            ceiling: self
                .applied
                .ceiling
                .max(self.granted.ceiling)
                .max(self.held),
        }
    }

    /// What [`renew`](super::renew) counts for another replica: [`reserved`](Self::reserved),
    /// or, in the deliberately broken variant (`LLM_BULKHEAD_CLUSTER_EARLY_CLASS_SHRINK=1` with
    /// the feature `testing`), only the grant, as if the store applied a class shrink before
    /// the replica confirmed it. `tests/cluster_classes.rs` must fail on it.
    fn counted(&self) -> ClassShare {
        if early_class_shrink() {
            return self.granted;
        }
        self.reserved()
    }
}

fn early_class_shrink() -> bool {
    cfg!(feature = "testing")
        && std::env::var_os("LLM_BULKHEAD_CLUSTER_EARLY_CLASS_SHRINK").is_some_and(|v| v == "1")
}

/// Whether `name` can be a class name in the store (it is written into its keys' values).
pub(crate) fn good_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The parts of a class's amounts, one resource at a time.
const SLOTS: fn(Amounts) -> u64 = |a| a.slots;
const TOKENS: fn(Amounts) -> u64 = |a| a.tokens;

/// Both resources of `f`.
fn each(f: impl Fn(fn(Amounts) -> u64) -> u64) -> Amounts {
    Amounts::new(f(SLOTS), f(TOKENS))
}

/// The class shares of the replica that sends `mine` (in class order), against `others` (each
/// live other replica's class records, in class order). `share` is the replica's global grant
/// (a class ceiling at the global limit becomes it); while `learning`, nobody grows.
pub(crate) fn split(
    classes: &[ClassParams],
    global: Amounts,
    others: &[&[ClassRecord]],
    mine: &[ClassUse],
    share: Amounts,
    learning: bool,
) -> Vec<ClassShare> {
    classes
        .iter()
        .zip(mine)
        .enumerate()
        .map(|(k, (c, m))| {
            let recs: Vec<ClassRecord> = others.iter().map(|r| r[k]).collect();
            // One limit of the class (`limit`, the others' reservations of it `reserved`),
            // one resource `r`: the fair target (while learning: what the replica keeps,
            // `kept`), capped by what the others leave.
            let grant = |r: fn(Amounts) -> u64,
                         limit: Amounts,
                         reserved: fn(&ClassShare) -> Amounts,
                         kept: u64| {
                let taken: u64 = recs.iter().map(|x| r(reserved(&x.counted()))).sum();
                let target = if learning {
                    kept
                } else {
                    let mine = r(m.wants).max(r(c.min));
                    let all: Vec<u64> = recs
                        .iter()
                        .map(|x| r(x.wants).max(r(c.min)))
                        .chain(std::iter::once(mine))
                        .collect();
                    fair(&all, mine, r(limit))
                };
                target.min(r(limit).saturating_sub(taken))
            };
            let floor = each(|r| grant(r, c.floor, |s| s.floor, r(m.applied.floor)));
            let ceiling = each(|r| {
                if r(c.ceiling) >= r(global) {
                    return r(share);
                }
                let kept = r(m.applied.ceiling).max(r(m.held));
                grant(r, c.ceiling, |s| s.ceiling, kept)
            });
            ClassShare { floor, ceiling }
        })
        .collect()
}

/// `Σ reserved` per class over `records` (each a replica's class records, in class order):
/// what I2 bounds per class by the global class floor and ceiling.
pub(crate) fn reserved_sums(n: usize, records: &[&[ClassRecord]]) -> Vec<ClassShare> {
    (0..n)
        .map(|k| {
            records.iter().fold(ClassShare::ZERO, |s, r| {
                let x = r[k].reserved();
                ClassShare {
                    floor: s.floor.add(x.floor),
                    ceiling: s.ceiling.add(x.ceiling),
                }
            })
        })
        .collect()
}
