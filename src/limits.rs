//! Limits snapshots: the immutable, revisioned [`LimitsSnapshot`] users see, and the ring of
//! atomically readable copies the fast path decides against.
//!
//! # The ring
//!
//! Deciders must read the current limits without a lock and without a reference count (an
//! `Arc` clone would be a second contended cache line). The bulkhead therefore keeps
//! `RING` slots of packed limits; the state word's tag (see [`crate::state`]) names the slot
//! that is current, as `tag % RING`.
//!
//! `apply_limits` (serialised by the reconfiguration mutex) writes the *next* slot, `tag + 1`,
//! which no decider holding the current tag reads, and then bumps the tag with a CAS. A slot is
//! rewritten only `RING` installs later, when the tag has long moved on; a decider that still
//! holds such an old tag may read a torn mix, but its CAS expects the old tag and fails, and a
//! refusal re-reads the word and retries when the tag moved, so torn limits never decide
//! anything.
//!
//! # Memory ordering
//!
//! The writer issues a `Release` fence before its `Relaxed` stores to a slot; readers load the
//! slot with `Acquire`. If a reader observes any value written for install `n + RING`, the fence
//! pairing makes the writer's earlier bump to tag `n + RING − 1` visible to everything the
//! reader does next, so its CAS (expecting tag `n`) fails. The tag bump itself is an `AcqRel`
//! CAS, and deciders load the word with `Acquire`, so the slot named by a tag is fully visible
//! to whoever reads that tag.

use crate::error::{ConfigError, ConfigProblem};
use crate::state::{MAX_SLOTS, MAX_TOKENS};
use crate::sync::{fence, AtomicU64, Ordering};
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
    /// Most waiters allowed in the queue (the waiting layer uses it).
    pub max_queue: u32,
    /// The token budget, present exactly when the bulkhead was built with one.
    pub token_budget: Option<BudgetLimits>,
}

impl LimitsSnapshot {
    /// The same snapshot with another revision.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().build().unwrap().limits().with_revision(9);
    /// assert_eq!(s.revision, 9);
    /// ```
    pub fn with_revision(mut self, revision: u64) -> Self {
        self.revision = revision;
        self
    }

    /// The same snapshot with another `max_concurrent`.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().build().unwrap().limits().with_max_concurrent(0);
    /// assert_eq!(s.max_concurrent, 0);
    /// ```
    pub fn with_max_concurrent(mut self, max_concurrent: u32) -> Self {
        self.max_concurrent = max_concurrent;
        self
    }

    /// The same snapshot with another `max_queue`.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let s = Bulkhead::builder().build().unwrap().limits().with_max_queue(3);
    /// assert_eq!(s.max_queue, 3);
    /// ```
    pub fn with_max_queue(mut self, max_queue: u32) -> Self {
        self.max_queue = max_queue;
        self
    }

    /// The same snapshot with another token budget (`None` removes it, which only a bulkhead
    /// built without a budget accepts).
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, BudgetLimits};
    /// let s = Bulkhead::builder().token_budget(10).build().unwrap().limits()
    ///     .with_token_budget(Some(BudgetLimits { budget: 5, high_priority_reserve: 0 }));
    /// assert_eq!(s.token_budget.unwrap().budget, 5);
    /// ```
    pub fn with_token_budget(mut self, token_budget: Option<BudgetLimits>) -> Self {
        self.token_budget = token_budget;
        self
    }

    /// Validates field ranges (everything except revision staleness and budget shape).
    pub(crate) fn validate_ranges(&self) -> Result<(), ConfigError> {
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

#[derive(Default)]
struct Slot {
    /// `max_concurrent` (16 bits) | has-budget flag (bit 16) | `max_queue` (bits 32..64).
    shape: AtomicU64,
    /// budget (low 32 bits) | eff(normal) (high 32 bits).
    budget: AtomicU64,
    revision: AtomicU64,
}

/// The ring of packed limits. See the module docs.
pub(crate) struct Ring {
    slots: [CachePadded<Slot>; RING],
}

impl Ring {
    pub(crate) fn new(first: &LimitsSnapshot) -> Self {
        let ring = Ring {
            slots: Default::default(),
        };
        ring.write(0, first);
        ring
    }

    /// Writes `snap` into the slot for `tag`. Only the reconfiguration-lock holder (or the
    /// constructor) calls this, and only for a tag that is not current.
    pub(crate) fn write(&self, tag: usize, snap: &LimitsSnapshot) {
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
    }

    /// Reads the slot for `tag`. The result is meaningful only if the tag is still current
    /// when the caller commits (its CAS) or re-checks (a refusal).
    #[inline]
    pub(crate) fn read(&self, tag: usize) -> Hot {
        let slot = &self.slots[tag % RING];
        let shape = slot.shape.load(Ordering::Acquire);
        let budget = slot.budget.load(Ordering::Acquire);
        let revision = slot.revision.load(Ordering::Acquire);
        Hot {
            revision,
            max_concurrent: shape & 0xffff,
            max_queue: shape >> 32,
            budget: (shape & HAS_BUDGET != 0).then_some(budget & 0xffff_ffff),
            eff_normal: budget >> 32,
        }
    }
}
