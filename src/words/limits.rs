//! Limits snapshots: the immutable, revisioned [`LimitsSnapshot`] users see, and the ring of
//! atomically readable copies the fast path decides against.
//!
//! # The ring
//!
//! Deciders must read the current limits without a lock and without a reference count (an
//! `Arc` clone would be a second contended cache line). The bulkhead therefore keeps
//! `RING` slots of packed limits; the state word's tag (see `crate::words::state`) names the slot
//! that is current, as `tag % RING`.
//!
//! `apply_limits` (serialised by the reconfiguration mutex) writes the *next* slot, `tag + 1`,
//! which no decider holding the current tag reads, and then bumps the tag with a CAS. A slot is
//! rewritten only `RING` installs later, when the tag has long moved on; a decider that still
//! holds such an old tag may read a torn mix, but its CAS expects the old tag and fails, and a
//! refusal re-reads the word and retries when the tag moved, so torn limits never decide
//! anything.
//!
//! # Class versions
//!
//! With classes, a slot also holds each class's limits and its **version** (mod
//! `CTAG_MOD`): how many installs changed that class's limits. A class word carries the
//! version it is accounted under (its `ctag`, `crate::words::class_word`), and the decreases
//! of the class protocol need that version's floors after the global slot may have been
//! rewritten, so each class also keeps a table of its limits at every version, indexed by
//! version (`crate::words::floors`, through `write_floors` and `floors`). An entry is
//! rewritten only when the class's limits change for the `CTAG_MOD`th time since, a whole tag
//! period of installs later, and never while an operation that may read it is in progress
//! (`crate::grace`, "Class versions").
//!
//! # Memory ordering
//!
//! The writer issues a `Release` fence before its `Relaxed` stores to a slot; readers load the
//! slot with `Acquire`. If a reader observes any value written for install `n + RING`, the fence
//! pairing makes the writer's earlier bump to tag `n + RING − 1` visible to everything the
//! reader does next, so its CAS (expecting tag `n`) fails. The tag bump itself is an `AcqRel`
//! CAS, and deciders load the word with `Acquire`, so the slot named by a tag is fully visible
//! to whoever reads that tag.

use crate::sync::{fence, AtomicU64, Ordering};
use crate::vocab::class::ClassId;
use crate::vocab::class::MAX_CLASSES;
use crate::vocab::error::{ConfigError, ConfigProblem};
use crate::vocab::rejection::n32;
use crate::words::class_word::{ctag_mod, MAX_CLASSED_SLOTS, MAX_CLASSED_TOKENS};
use crate::words::classes::{ClassLimits, ClassTable};
use crate::words::floors::Floors;
use crate::words::state::{MAX_SLOTS, MAX_TOKENS};
use crate::Priority;
use crossbeam_utils::CachePadded;

/// The token budget part of a limits snapshot.
///
/// ```
/// use llm_bulkhead::BudgetLimits;
/// let b = BudgetLimits { budget: 2_400, high_priority_reserve: 400 };
/// assert_eq!(b.effective(llm_bulkhead::Priority::Normal), 2_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BudgetLimits {
    /// The in-flight token budget `B`. At most [`MAX_TOKENS`].
    pub budget: u64,
    /// Tokens only high-priority demands may use (`H`). At construction it must not exceed
    /// the budget; a later snapshot may leave `H > B`, which refuses all normal-priority
    /// demands that need tokens.
    pub high_priority_reserve: u64,
}

impl BudgetLimits {
    /// `eff(priority)`: `B` for high priority, `max(0, B − H)` for normal.
    ///
    /// ```
    /// # use llm_bulkhead::{BudgetLimits, Priority};
    /// let b = BudgetLimits { budget: 100, high_priority_reserve: 300 };
    /// assert_eq!((b.effective(Priority::Normal), b.effective(Priority::High)), (0, 100));
    /// ```
    #[must_use]
    pub fn effective(&self, priority: Priority) -> u64 {
        match priority {
            Priority::High => self.budget,
            Priority::Normal => self.budget.saturating_sub(self.high_priority_reserve),
        }
    }
}

/// An immutable, revisioned set of limits.
///
/// `limits()` returns the current one; `apply_limits` installs a newer one atomically.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::builder().max_concurrent(4).token_budget(1_000).build().unwrap();
/// let next = b.limits().with_revision(1).with_max_concurrent(2);
/// b.apply_limits(next).unwrap();
/// assert_eq!(b.limits().max_concurrent, 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LimitsSnapshot {
    /// The revision. `apply_limits` accepts only strictly larger revisions.
    pub revision: u64,
    /// Global concurrency limit. 0 is legal: the bulkhead refuses all work (kill switch).
    pub max_concurrent: u32,
    /// Most waiters allowed in the wait queue at once (0: no queue, every demand is
    /// fail-fast).
    pub max_queue: u32,
    /// The token budget, present exactly when the bulkhead was built with one.
    pub token_budget: Option<BudgetLimits>,
    /// Per-class floors and ceilings, in construction order (empty without classes). Every
    /// snapshot must carry exactly the construction-time classes.
    pub classes: ClassTable,
}

impl LimitsSnapshot {
    /// The same snapshot with another revision.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().max_concurrent(1).build().unwrap().limits().with_revision(9);
    /// assert_eq!(s.revision, 9);
    /// ```
    #[must_use = "returns the changed snapshot; the original is moved"]
    pub fn with_revision(mut self, revision: u64) -> Self {
        self.revision = revision;
        self
    }

    /// The same snapshot with another `max_concurrent`.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().max_concurrent(1).build().unwrap().limits().with_max_concurrent(0);
    /// assert_eq!(s.max_concurrent, 0);
    /// ```
    #[must_use = "returns the changed snapshot; the original is moved"]
    pub fn with_max_concurrent(mut self, max_concurrent: u32) -> Self {
        self.max_concurrent = max_concurrent;
        self
    }

    /// The same snapshot with another `max_queue`.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().max_concurrent(1).build().unwrap().limits().with_max_queue(3);
    /// assert_eq!(s.max_queue, 3);
    /// ```
    #[must_use = "returns the changed snapshot; the original is moved"]
    pub fn with_max_queue(mut self, max_queue: u32) -> Self {
        self.max_queue = max_queue;
        self
    }

    /// The same snapshot with another token budget (`None` removes it, which only a bulkhead
    /// built without a budget accepts).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, BudgetLimits};
    /// let s = Bulkhead::builder().max_concurrent(1).token_budget(10).build().unwrap().limits()
    ///     .with_token_budget(Some(BudgetLimits { budget: 5, high_priority_reserve: 0 }));
    /// assert_eq!(s.token_budget.unwrap().budget, 5);
    /// ```
    #[must_use = "returns the changed snapshot; the original is moved"]
    pub fn with_token_budget(mut self, token_budget: Option<BudgetLimits>) -> Self {
        self.token_budget = token_budget;
        self
    }

    /// The same snapshot with other limits for one class.
    ///
    /// A [`ClassId`] the snapshot's table does not have (a class of another bulkhead than the
    /// one the snapshot was read from, or a position the table lacks) changes no limit, and
    /// the snapshot remembers it: [`Bulkhead::apply_limits`](crate::Bulkhead::apply_limits)
    /// then refuses the snapshot with [`ConfigProblem::UnknownClassId`] on field `classes`
    /// (after the stale-revision check, which comes first; nothing is installed), and it does
    /// not serialise. So a chain of `with_…` calls needs no error handling until it is applied;
    /// [`try_with_class`](Self::try_with_class) reports the id at once instead.
    ///
    /// ```
    /// use llm_bulkhead::{ApplyLimitsError, Bulkhead, ClassLimits, ConfigProblem};
    /// let build = || Bulkhead::builder().max_concurrent(4).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// let (b, other) = (build(), build());
    /// let a = b.class_id("a").unwrap();
    /// let one = ClassLimits { max_concurrent: Some(1), ..Default::default() };
    /// b.apply_limits(b.limits().with_revision(1).with_class(a, one)).unwrap();
    /// assert_eq!(b.limits().classes.get(a).unwrap().max_concurrent, Some(1));
    /// // Another bulkhead's id for the same name is not this bulkhead's class.
    /// let foreign = b.limits().with_revision(2).with_class(other.class_id("a").unwrap(), one);
    /// let Err(ApplyLimitsError::Invalid(e)) = b.apply_limits(foreign) else { panic!() };
    /// assert!(matches!(e.problem, ConfigProblem::UnknownClassId(_)));
    /// assert_eq!(b.limits().revision, 1); // nothing changed
    /// ```
    #[must_use = "returns the changed snapshot; the original is moved"]
    pub fn with_class(mut self, class: ClassId, limits: ClassLimits) -> Self {
        if let Err(id) = self.classes.set_checked(class, limits) {
            self.classes.refuse(id);
        }
        self
    }

    /// [`with_class`](Self::with_class), reporting a [`ClassId`] the table does not have at
    /// once.
    ///
    /// # Errors
    /// [`ConfigProblem::UnknownClassId`] on field `classes`, for a class of another bulkhead
    /// than the one the snapshot was read from or a position the table lacks (the snapshot is
    /// dropped; the caller still has nothing to undo).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits, ConfigProblem};
    /// let b = Bulkhead::builder().max_concurrent(4).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// let plain = Bulkhead::new(4).unwrap();
    /// let a = b.class_id("a").unwrap();
    /// assert!(b.limits().try_with_class(a, ClassLimits::default()).is_ok());
    /// let e = plain.limits().try_with_class(a, ClassLimits::default()).unwrap_err();
    /// assert_eq!((e.field, e.problem), ("classes", ConfigProblem::UnknownClassId(a)));
    /// ```
    pub fn try_with_class(
        mut self,
        class: ClassId,
        limits: ClassLimits,
    ) -> Result<Self, ConfigError> {
        self.classes
            .set_checked(class, limits)
            .map_err(crate::words::classes::unknown_class_id)?;
        Ok(self)
    }

    /// Validates everything but staleness: ranges, the budget's shape, and the class rules of
    /// CONTRACT.md §4 (`names` are the construction-time class names).
    pub(crate) fn validate(&self, has_budget: bool, names: &[String]) -> Result<(), ConfigError> {
        self.validate_ranges()?;
        let shape = |problem| {
            Err(ConfigError {
                field: "token_budget",
                problem,
            })
        };
        match (has_budget, self.token_budget.is_some()) {
            (true, false) => return shape(ConfigProblem::Required),
            (false, true) => return shape(ConfigProblem::MustBeOmitted),
            _ => {}
        }
        if !names.is_empty() {
            // The class-mode words are narrower (`crate::protocol::classed`).
            let mut bounds = vec![(
                "max_concurrent",
                u64::from(self.max_concurrent),
                u64::from(MAX_CLASSED_SLOTS),
            )];
            if let Some(b) = self.token_budget {
                bounds.push(("token_budget.budget", b.budget, MAX_CLASSED_TOKENS));
                bounds.push((
                    "token_budget.high_priority_reserve",
                    b.high_priority_reserve,
                    MAX_CLASSED_TOKENS,
                ));
            }
            for (field, value, max) in bounds {
                if value > max {
                    return Err(ConfigError {
                        field,
                        problem: ConfigProblem::TooLarge { value, max },
                    });
                }
            }
        }
        if let Some(id) = self.classes.refused() {
            return Err(crate::words::classes::unknown_class_id(id));
        }
        if self.classes.len() != names.len() {
            return Err(ConfigError {
                field: "classes",
                problem: ConfigProblem::ClassCount {
                    expected: names.len(),
                    got: self.classes.len(),
                },
            });
        }
        let class_err = |field, i: usize, problem| {
            Err(ConfigError {
                field,
                problem: ConfigProblem::Class {
                    class: names[i].clone(),
                    problem: Box::new(problem),
                },
            })
        };
        for (i, c) in self.classes.iter().enumerate() {
            for (field, value, max) in [
                (
                    "classes.protected_concurrent",
                    u64::from(c.protected_concurrent),
                    u64::from(MAX_CLASSED_SLOTS),
                ),
                (
                    "classes.max_concurrent",
                    c.max_concurrent.map_or(0, u64::from),
                    u64::from(MAX_CLASSED_SLOTS),
                ),
                (
                    "classes.protected_tokens",
                    c.protected_tokens,
                    MAX_CLASSED_TOKENS,
                ),
                (
                    "classes.max_tokens",
                    c.max_tokens.unwrap_or(0),
                    MAX_CLASSED_TOKENS,
                ),
            ] {
                if value > max {
                    return class_err(field, i, ConfigProblem::TooLarge { value, max });
                }
            }
            if let Some(m) = c.max_concurrent {
                if c.protected_concurrent > m {
                    return class_err(
                        "classes.protected_concurrent",
                        i,
                        ConfigProblem::FloorAboveCeiling {
                            floor: c.protected_concurrent.into(),
                            ceiling: m.into(),
                        },
                    );
                }
            }
            if let Some(m) = c.max_tokens {
                if c.protected_tokens > m {
                    return class_err(
                        "classes.protected_tokens",
                        i,
                        ConfigProblem::FloorAboveCeiling {
                            floor: c.protected_tokens,
                            ceiling: m,
                        },
                    );
                }
            }
            if !has_budget {
                if c.protected_tokens > 0 {
                    return class_err(
                        "classes.protected_tokens",
                        i,
                        ConfigProblem::NeedsTokenBudget,
                    );
                }
                if c.max_tokens.is_some() {
                    return class_err("classes.max_tokens", i, ConfigProblem::NeedsTokenBudget);
                }
            }
        }
        let (sum_c, sum_t) = self.classes.floor_sums();
        if sum_c > u64::from(self.max_concurrent) {
            return Err(ConfigError {
                field: "classes.protected_concurrent",
                problem: ConfigProblem::FloorsExceedLimit {
                    sum: sum_c,
                    limit: self.max_concurrent.into(),
                },
            });
        }
        if let Some(b) = self.token_budget {
            if sum_t > b.budget {
                return Err(ConfigError {
                    field: "classes.protected_tokens",
                    problem: ConfigProblem::FloorsExceedLimit {
                        sum: sum_t,
                        limit: b.budget,
                    },
                });
            }
        }
        Ok(())
    }

    /// Validates field ranges (everything except revision staleness and budget shape).
    pub(crate) fn validate_ranges(&self) -> Result<(), ConfigError> {
        if self.revision > MAX_REVISION {
            return Err(ConfigError {
                field: "revision",
                problem: ConfigProblem::TooLarge {
                    value: self.revision,
                    max: MAX_REVISION,
                },
            });
        }
        if self.max_concurrent > MAX_SLOTS {
            return Err(ConfigError {
                field: "max_concurrent",
                problem: ConfigProblem::TooLarge {
                    value: u64::from(self.max_concurrent),
                    max: u64::from(MAX_SLOTS),
                },
            });
        }
        if let Some(b) = self.token_budget {
            for (field, value) in [
                ("token_budget.budget", b.budget),
                (
                    "token_budget.high_priority_reserve",
                    b.high_priority_reserve,
                ),
            ] {
                if value > MAX_TOKENS {
                    return Err(ConfigError {
                        field,
                        problem: ConfigProblem::TooLarge {
                            value,
                            max: MAX_TOKENS,
                        },
                    });
                }
            }
        }
        Ok(())
    }
}

/// The largest revision a snapshot may carry: 2^53 − 1, the largest integer a JSON control plane
/// (an IEEE double) represents exactly. The reference refuses larger revisions; so do the
/// builder's `initial_revision`, `apply_limits` and `set_budget`, with
/// [`ConfigProblem::TooLarge`] on field `revision`.
///
/// ```
/// use llm_bulkhead::{Bulkhead, MAX_REVISION};
/// assert!(Bulkhead::builder().max_concurrent(1).initial_revision(MAX_REVISION + 1).build().is_err());
/// let b = Bulkhead::builder().max_concurrent(1).initial_revision(MAX_REVISION).build().unwrap();
/// assert!(b.apply_limits(b.limits().with_revision(MAX_REVISION + 1)).is_err());
/// ```
pub const MAX_REVISION: u64 = (1 << 53) - 1;

/// Number of ring slots. Under loom it is 2, so that two installs already reuse a slot and the
/// models explore torn reads of a slot being rewritten.
pub(crate) const RING: usize = if cfg!(loom) { 2 } else { 4 };

/// Limits as the fast path uses them, decoded from one ring slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hot {
    pub(crate) revision: u64,
    pub(crate) max_concurrent: u64,
    pub(crate) max_queue: u64,
    /// `None` without a token budget.
    pub(crate) budget: Option<u64>,
    pub(crate) eff_normal: u64,
}

impl Hot {
    #[inline]
    pub(crate) fn effective(&self, priority: Priority) -> Option<u64> {
        self.budget.map(|b| match priority {
            Priority::High => b,
            Priority::Normal => self.eff_normal,
        })
    }
}

const HAS_BUDGET: u64 = 1 << 16;
// A refusal keeps the `shape` word as read and decodes it itself (`Counts::detail`).
const _: () = assert!(HAS_BUDGET == crate::vocab::rejection::SHAPE_HAS_BUDGET);

#[derive(Default)]
struct Slot {
    /// `max_concurrent` (16 bits) | has-budget flag (bit 16) | `max_queue` (bits 32..64).
    shape: AtomicU64,
    /// budget (low 32 bits) | eff(normal) (high 32 bits).
    budget: AtomicU64,
    revision: AtomicU64,
    /// Σ protected_concurrent (16 bits) | Σ protected_tokens (bits 16..49).
    sums: AtomicU64,
    /// Per class: floor (16) | ceiling (bits 16..32) | has-ceiling (bit 32) | has-token-ceiling
    /// (bit 33) | version (bits 40..56); then token floor (32) | token ceiling (32).
    classes: [[AtomicU64; 2]; MAX_CLASSES],
}

const HAS_MAX_C: u64 = 1 << 32;
const HAS_MAX_T: u64 = 1 << 33;

/// One class's limits as the class path uses them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HotClass {
    pub(crate) pc: u64,
    pub(crate) mc: Option<u64>,
    pub(crate) pt: u64,
    pub(crate) mt: Option<u64>,
}

impl From<ClassLimits> for HotClass {
    fn from(c: ClassLimits) -> HotClass {
        HotClass {
            pc: c.protected_concurrent.into(),
            mc: c.max_concurrent.map(u64::from),
            pt: c.protected_tokens,
            mt: c.max_tokens,
        }
    }
}

/// One class's limits as a ring slot stores them ([`pack_class`]): `a` = floor (16 bits) |
/// ceiling (16 bits, from bit 16) | has-ceiling (bit 32) | has-token-ceiling (bit 33) | the
/// class's version (bits 40..56), `b` = token floor (32 bits) | token ceiling (32 bits). What a refusal at a class ceiling reads and packs without
/// decoding (`crate::protocol::classed::own_word_refusal`).
#[derive(Clone, Copy)]
pub(crate) struct ClassLimitWords {
    a: u64,
    b: u64,
}

impl ClassLimitWords {
    /// The concurrency floor.
    #[inline(always)]
    pub(crate) fn pc(self) -> u64 {
        self.a & 0xffff
    }

    /// The concurrency ceiling, 0 when there is none.
    #[inline(always)]
    pub(crate) fn mc_or_zero(self) -> u64 {
        (self.a >> 16) & 0xffff
    }

    /// The token floor.
    #[inline(always)]
    pub(crate) fn pt(self) -> u64 {
        self.b & 0xffff_ffff
    }

    /// The token ceiling, 0 when there is none.
    #[inline(always)]
    pub(crate) fn mt_or_zero(self) -> u64 {
        self.b >> 32
    }

    /// Which ceilings there are: bit 0 the concurrency ceiling, bit 1 the token ceiling.
    #[inline(always)]
    pub(crate) fn ceilings(self) -> u8 {
        ((self.a >> 32) & 3) as u8
    }

    /// The class's version (mod `CTAG_MOD`) under the slot's tag: the `ctag` its class word
    /// carries once migrated to that tag.
    #[inline(always)]
    pub(crate) fn version(self) -> usize {
        ((self.a >> VERSION_SHIFT) & VERSION_MASK) as usize
    }

    /// The limits these words store, decoded.
    #[inline(always)]
    pub(crate) fn hot(self) -> HotClass {
        let (a, b) = (self.a, self.b);
        HotClass {
            pc: a & 0xffff,
            mc: (a & HAS_MAX_C != 0).then_some((a >> 16) & 0xffff),
            pt: b & 0xffff_ffff,
            mt: (a & HAS_MAX_T != 0).then_some(b >> 32),
        }
    }
}

const _: () = assert!(HAS_MAX_C == 1 << 32 && HAS_MAX_T == 1 << 33);
/// A class's limits as one slot (or floors entry) stores them, with the class's version
/// (mod `CTAG_MOD`) at bits 40..56 of the first word.
fn pack_class(c: &ClassLimits, version: usize) -> (u64, u64) {
    let a = u64::from(c.protected_concurrent)
        | (u64::from(c.max_concurrent.unwrap_or(0)) << 16)
        | if c.max_concurrent.is_some() {
            HAS_MAX_C
        } else {
            0
        }
        | if c.max_tokens.is_some() { HAS_MAX_T } else { 0 }
        | (((version % ctag_mod()) as u64) << VERSION_SHIFT);
    let b = c.protected_tokens | (c.max_tokens.unwrap_or(0) << 32);
    (a, b)
}

/// The version and limits [`pack_class`] stored.
#[inline]
fn unpack_class(c: &[AtomicU64; 2]) -> (usize, HotClass) {
    let w = ClassLimitWords {
        a: c[0].load(Ordering::Acquire),
        b: c[1].load(Ordering::Acquire),
    };
    (w.version(), w.hot())
}

const VERSION_SHIFT: u32 = 40;
const VERSION_MASK: u64 = 0xffff;
const _: () = assert!(crate::words::class_word::CTAG_MOD as u64 - 1 <= VERSION_MASK);

/// The ring of packed limits. See the module docs.
pub(crate) struct Ring {
    slots: [CachePadded<Slot>; RING],
    /// Per class, its limits at each of its versions (indexed by version mod `CTAG_MOD`):
    /// what the decreases of the class protocol read for a class word's `ctag` (module docs,
    /// "Class versions").
    floors: [CachePadded<Floors>; MAX_CLASSES],
}

impl Ring {
    pub(crate) fn new(first: &LimitsSnapshot) -> Self {
        let ring = Ring {
            slots: Default::default(),
            floors: Default::default(),
        };
        for (k, c) in first.classes.iter().enumerate() {
            ring.write_floors(k, 0, c);
        }
        ring.write(0, first, &[0; MAX_CLASSES]);
        ring
    }

    /// Writes `snap` into the slot for `tag`, with `versions[k]` the version class `k` has
    /// under it. Only the reconfiguration-lock holder (or the constructor) calls this, and
    /// only for a tag that is not current.
    pub(crate) fn write(&self, tag: usize, snap: &LimitsSnapshot, versions: &[usize; MAX_CLASSES]) {
        let slot = &self.slots[tag % RING];
        let (has, budget, eff) = match snap.token_budget {
            Some(b) => (HAS_BUDGET, b.budget, b.effective(Priority::Normal)),
            None => (0, 0, 0),
        };
        // Pairs with the `Acquire` loads in `read`: see the module docs.
        fence(Ordering::Release);
        slot.shape.store(
            u64::from(snap.max_concurrent) | has | (u64::from(snap.max_queue) << 32),
            Ordering::Relaxed,
        );
        slot.budget.store(budget | (eff << 32), Ordering::Relaxed);
        slot.revision.store(snap.revision, Ordering::Relaxed);
        if !snap.classes.is_empty() {
            let (sum_c, sum_t) = snap.classes.floor_sums();
            slot.sums.store(sum_c | (sum_t << 16), Ordering::Relaxed);
        }
        for (i, c) in snap.classes.iter().enumerate() {
            let (a, b) = pack_class(c, versions[i]);
            slot.classes[i][0].store(a, Ordering::Relaxed);
            slot.classes[i][1].store(b, Ordering::Relaxed);
        }
    }

    /// Class `k`'s limits in the slot for `tag` as stored ([`ClassLimitWords`]; same caveat as
    /// [`Ring::read`]).
    #[inline]
    pub(crate) fn read_class_words(&self, tag: usize, k: usize) -> ClassLimitWords {
        let c = &self.slots[tag % RING].classes[k];
        ClassLimitWords {
            a: c[0].load(Ordering::Acquire),
            b: c[1].load(Ordering::Acquire),
        }
    }

    /// Writes class `k`'s limits `c` as its version `version` (mod `CTAG_MOD`) into the
    /// class's floors table, before the install that brings that version in writes its slot.
    /// Only the reconfiguration-lock holder (or the constructor) calls this: the entry it
    /// replaces is a whole tag period old, and the grace period made sure no operation may
    /// still read it (`crate::words::floors`).
    pub(crate) fn write_floors(&self, k: usize, version: usize, c: &ClassLimits) {
        let version = version % ctag_mod();
        self.floors[k].write(version, pack_class(c, version));
    }

    /// Reads class `k`'s limits from the slot for `tag` (same caveat as [`Ring::read`]).
    #[inline]
    pub(crate) fn read_class(&self, tag: usize, k: usize) -> HotClass {
        self.read_class_versioned(tag, k).1
    }

    /// [`read_class`](Self::read_class), with the version (mod `CTAG_MOD`) class `k` has
    /// under `tag`: the `ctag` its class word carries once it is migrated to `tag`.
    #[inline]
    pub(crate) fn read_class_versioned(&self, tag: usize, k: usize) -> (usize, HotClass) {
        unpack_class(&self.slots[tag % RING].classes[k])
    }

    /// Class `k`'s version (mod `CTAG_MOD`) under `tag` (same caveat as [`Ring::read`]).
    #[inline]
    pub(crate) fn version(&self, tag: usize, k: usize) -> usize {
        let a = self.slots[tag % RING].classes[k][0].load(Ordering::Acquire);
        ((a >> VERSION_SHIFT) & VERSION_MASK) as usize
    }

    /// The limits of class `k` at its version `version` (a class word's `ctag`): what the
    /// class word carrying it is accounted under. Stable while an operation that read that
    /// `ctag` is in progress (`crate::words::floors`).
    #[inline]
    pub(crate) fn floors(&self, k: usize, version: usize) -> HotClass {
        unpack_class(self.floors[k].entry(version)).1
    }

    /// Σ concurrency floors and Σ token floors of the slot for `tag`.
    #[inline]
    pub(crate) fn read_sums(&self, tag: usize) -> (u64, u64) {
        let s = self.slots[tag % RING].sums.load(Ordering::Acquire);
        (s & 0xffff, s >> 16)
    }

    /// Reads the slot for `tag`. The result is meaningful only if the tag is still current
    /// when the caller commits (its CAS) or re-checks (a refusal).
    #[inline]
    pub(crate) fn read(&self, tag: usize) -> Hot {
        self.read_packed(tag).hot()
    }

    /// [`read`](Self::read), the slot's words as they are stored (same caveat).
    #[inline]
    pub(crate) fn read_packed(&self, tag: usize) -> Packed {
        let slot = &self.slots[tag % RING];
        Packed {
            shape: slot.shape.load(Ordering::Acquire),
            budget: slot.budget.load(Ordering::Acquire),
            revision: slot.revision.load(Ordering::Acquire),
        }
    }
}

/// The words of one ring slot as read, three words where the decoded [`Hot`] is six: what a
/// no-class refusal carries to its out-of-line explanation, in registers
/// (`crate::protocol::plain::Refusal`). The decode is a few shifts and masks, which also show
/// the compiler that every field fits the refusal's 32-bit counts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed {
    /// `max_concurrent` | has-budget flag | `max_queue` (the slot's `shape`).
    pub(crate) shape: u64,
    /// budget | eff(normal).
    pub(crate) budget: u64,
    pub(crate) revision: u64,
}

impl Packed {
    /// The words of limits `max_concurrent`, `max_queue` and (`Some` with a budget) the
    /// budget with the effective budget `eff` in `eff(normal)`'s place (each saturating at
    /// its field; the engine's values fit).
    #[inline]
    pub(crate) fn pack(max_concurrent: u64, max_queue: u64, budget: Option<(u64, u64)>) -> Packed {
        let (has, budget) = match budget {
            Some((b, eff)) => (HAS_BUDGET, u64::from(n32(b)) | (u64::from(n32(eff)) << 32)),
            None => (0, 0),
        };
        Packed {
            shape: max_concurrent.min(0xffff) | has | (u64::from(n32(max_queue)) << 32),
            budget,
            revision: 0,
        }
    }

    /// The effective budget of a demand of `priority`, 0 without a budget: no class holds or
    /// asks for tokens then (a demand's tokens are 0, and token floors and ceilings need a
    /// budget), so every budget row is `0 > 0` and passes, as with no budget at all. One shift
    /// or mask where [`Hot::effective`] is a flag test and a choice.
    #[inline(always)]
    pub(crate) fn eff_or_zero(self, priority: Priority) -> u64 {
        match priority {
            Priority::High => self.budget & 0xffff_ffff,
            Priority::Normal => self.budget >> 32,
        }
    }

    /// The limits these words encode.
    #[inline(always)]
    pub(crate) fn hot(self) -> Hot {
        let (shape, budget) = (self.shape, self.budget);
        Hot {
            revision: self.revision,
            max_concurrent: shape & 0xffff,
            max_queue: shape >> 32,
            budget: (shape & HAS_BUDGET != 0).then_some(budget & 0xffff_ffff),
            eff_normal: budget >> 32,
        }
    }
}

/// Why `apply_limits` installed nothing.
///
/// ```
/// use llm_bulkhead::{ApplyLimitsError, Bulkhead};
/// let b = Bulkhead::builder().max_concurrent(4).initial_revision(7).build().unwrap();
/// let stale = b.limits().with_revision(7);
/// assert!(matches!(b.apply_limits(stale), Err(ApplyLimitsError::StaleRevision { .. })));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApplyLimitsError {
    /// The snapshot's revision is not newer than the current one. Checked first: a stale
    /// snapshot is refused whatever else it contains.
    StaleRevision {
        /// The revision the snapshot carried.
        attempted: u64,
        /// The snapshot that stays current (boxed: a snapshot carries the class table).
        current: Box<LimitsSnapshot>,
    },
    /// The snapshot is invalid.
    Invalid(ConfigError),
}

impl std::fmt::Display for ApplyLimitsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyLimitsError::StaleRevision { attempted, current } => write!(
                f,
                "stale limits revision {attempted}: the current revision is {}",
                current.revision
            ),
            ApplyLimitsError::Invalid(e) => write!(f, "invalid limits snapshot: {e}"),
        }
    }
}

impl std::error::Error for ApplyLimitsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ApplyLimitsError::Invalid(e) => Some(e),
            ApplyLimitsError::StaleRevision { .. } => None,
        }
    }
}

impl From<ConfigError> for ApplyLimitsError {
    fn from(e: ConfigError) -> Self {
        ApplyLimitsError::Invalid(e)
    }
}

/// What `apply_limits` replaced.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::new(2).unwrap();
/// let change = b.apply_limits(b.limits().with_revision(1).with_max_concurrent(5)).unwrap();
/// assert_eq!((change.previous.max_concurrent, change.current.max_concurrent), (2, 5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LimitsChange {
    /// The snapshot that was current before.
    pub previous: LimitsSnapshot,
    /// The snapshot now current.
    pub current: LimitsSnapshot,
}
