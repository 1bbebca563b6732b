//! Admission classes: a fixed table of policy buckets with protected floors and hard ceilings
//! (CONTRACT.md §4), enforced lock-free by the protocol in `crate::protocol::classed`.
//!
//! A class uses its floor first, then borrows from the shared remainder
//! (`max_concurrent − Σ floors`, and for tokens `eff(priority) − Σ token floors`). Floors are
//! strict: idle protected capacity is never lent.

use crate::vocab::class::{ClassId, ClassOwner, MAX_CLASSES};
use crate::vocab::error::{ConfigError, ConfigProblem};

/// One class's floors and ceilings. Every field may be 0; an absent ceiling means only the
/// global limits apply.
///
/// ```
/// use llm_bulkhead::ClassLimits;
/// let premium = ClassLimits { protected_concurrent: 6, max_concurrent: Some(10), protected_tokens: 12_000, max_tokens: Some(20_000) };
/// assert_eq!(ClassLimits::default().max_concurrent, None);
/// # let _ = premium;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClassLimits {
    /// Slots reserved for this class (its concurrency floor).
    pub protected_concurrent: u32,
    /// The class's concurrency ceiling.
    pub max_concurrent: Option<u32>,
    /// Tokens reserved for this class (its token floor); needs a token budget.
    pub protected_tokens: u64,
    /// The class's token ceiling; needs a token budget.
    pub max_tokens: Option<u64>,
}

/// The per-class limits of a snapshot, in construction order.
///
/// A table read from a bulkhead ([`Bulkhead::limits`](crate::Bulkhead::limits)) remembers
/// where it came from: that bulkhead's identity (so [`get`](Self::get) and
/// [`LimitsSnapshot::with_class`](crate::LimitsSnapshot::with_class) tell its
/// [`ClassId`]s from another bulkhead's) and a fingerprint of its class names, in order (so
/// `apply_limits` can accept a snapshot taken from another bulkhead with the same classes,
/// CONTRACT.md §4: the key set is fixed and every snapshot names exactly those keys, and refuse
/// one taken from a bulkhead with other classes). A deserialised table has no provenance and is
/// positional: its entries are the classes in construction order. Provenance is not part of
/// equality or hashing; an id refused by `with_class` is.
///
/// ```
/// use llm_bulkhead::{Bulkhead, ClassLimits};
/// let b = Bulkhead::builder().max_concurrent(4).class("a", ClassLimits::default())
///     .default_class("a").build().unwrap();
/// let t = b.limits().classes;
/// assert_eq!((t.len(), t.get(b.class_id("a").unwrap())), (1, Some(&ClassLimits::default())));
/// ```
#[derive(Clone, Copy, Default)]
pub struct ClassTable {
    len: u8,
    entries: [ClassLimits; MAX_CLASSES],
    /// The identity bits of the bulkhead whose ids this table takes (`ClassOwner::bits`): the
    /// bulkhead it was read from, or, for a table without provenance, the issuer of the first
    /// id `with_class` accepted; 0 if neither.
    owner: u64,
    /// The fingerprint of the class names of the bulkhead it was read from ([`keys_of`]).
    keys: Option<u64>,
    /// The first id `with_class` was given that this table does not have.
    refused: Option<ClassId>,
}

impl PartialEq for ClassTable {
    fn eq(&self, other: &Self) -> bool {
        self.entries[..self.len()] == other.entries[..other.len()] && self.refused == other.refused
    }
}

impl Eq for ClassTable {}

impl std::hash::Hash for ClassTable {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.entries[..self.len()].hash(state);
        self.refused.hash(state);
    }
}

/// A fingerprint of a bulkhead's class names, in order (64-bit FNV-1a over the names, each
/// ended by a byte no UTF-8 text contains): the key set a snapshot's table must have.
pub(crate) fn keys_of(names: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for name in names {
        for &b in name.as_bytes().iter().chain(&[0xff]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The error of a class id a table does not have (`with_class`, `apply_limits`).
pub(crate) fn unknown_class_id(id: ClassId) -> ConfigError {
    ConfigError {
        field: "classes",
        problem: ConfigProblem::UnknownClassId(id),
    }
}

/// Lists the classes in use only (none without classes), not the table's spare room.
///
/// ```
/// assert_eq!(format!("{:?}", llm_bulkhead::ClassTable::default()), "[]");
/// ```
impl std::fmt::Debug for ClassTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl ClassTable {
    /// Number of classes (0 when the bulkhead has none).
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::ClassTable::default().len(), 0);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether the bulkhead has no classes.
    ///
    /// ```
    /// assert!(llm_bulkhead::ClassTable::default().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A class's limits.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, ClassLimits};
    /// # let b = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// assert!(b.limits().classes.get(b.class_id("a").unwrap()).is_some());
    /// ```
    ///
    /// `None` for a class of another bulkhead than the one the table was read from, and for a
    /// position the table does not have.
    #[must_use]
    pub fn get(&self, id: ClassId) -> Option<&ClassLimits> {
        if self.owner != 0 && id.owner_bits() != self.owner {
            return None;
        }
        self.entries[..self.len()].get(id.index())
    }

    /// Every class's limits, in construction order.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::ClassTable::default().iter().count(), 0);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = &ClassLimits> {
        self.entries[..self.len()].iter()
    }

    pub(crate) fn push(&mut self, limits: ClassLimits) -> bool {
        if self.len() == MAX_CLASSES {
            return false;
        }
        self.entries[self.len()] = limits;
        self.len += 1;
        true
    }

    /// Records where the table comes from: the bulkhead `owner` whose class names have the
    /// fingerprint `keys` ([`keys_of`]).
    pub(crate) fn stamp(&mut self, owner: ClassOwner, keys: u64) {
        self.owner = owner.bits();
        self.keys = Some(keys);
    }

    /// Sets class `id`'s limits if the table has that class: `Err(id)`, and nothing changed,
    /// for an id of another bulkhead than the one whose ids the table takes, or a position it
    /// lacks. A table without provenance takes the ids of the first id's bulkhead from then on.
    pub(crate) fn set_checked(&mut self, id: ClassId, limits: ClassLimits) -> Result<(), ClassId> {
        if (self.owner != 0 && id.owner_bits() != self.owner) || id.index() >= self.len() {
            return Err(id);
        }
        self.owner = id.owner_bits();
        self.entries[id.index()] = limits;
        Ok(())
    }

    /// Remembers the first id [`set_checked`](Self::set_checked) refused; validation then
    /// refuses the snapshot.
    pub(crate) fn refuse(&mut self, id: ClassId) {
        self.refused.get_or_insert(id);
    }

    /// The id `with_class` refused, if any.
    pub(crate) fn refused(&self) -> Option<ClassId> {
        self.refused
    }

    /// Whether a snapshot with this table may be applied to the bulkhead whose current table
    /// is `current`: a table read from a bulkhead with the same class names in the same order
    /// (another bulkhead's too), or one without provenance whose ids (if it was given any) are
    /// the current bulkhead's.
    ///
    /// # Errors
    /// [`ConfigProblem::ForeignClassTable`] on field `classes` otherwise.
    pub(crate) fn check_origin(&self, current: &ClassTable) -> Result<(), ConfigError> {
        let fits = match self.keys {
            Some(keys) => Some(keys) == current.keys,
            None => self.owner == 0 || self.owner == current.owner,
        };
        if fits {
            Ok(())
        } else {
            Err(ConfigError {
                field: "classes",
                problem: ConfigProblem::ForeignClassTable,
            })
        }
    }

    /// The same limits, with the provenance of `current` (what an installed snapshot carries).
    pub(crate) fn with_origin_of(mut self, current: &ClassTable) -> ClassTable {
        self.owner = current.owner;
        self.keys = current.keys;
        self
    }

    /// `Σ protected_concurrent`, `Σ protected_tokens`.
    pub(crate) fn floor_sums(&self) -> (u64, u64) {
        self.iter().fold((0, 0), |(c, t), l| {
            (
                c + u64::from(l.protected_concurrent),
                t.saturating_add(l.protected_tokens),
            )
        })
    }
}

/// Serialises as the list of class limits, in construction order; a table that was given a
/// class id it does not have ([`LimitsSnapshot::with_class`](crate::LimitsSnapshot::with_class))
/// does not serialise (the id would be lost).
#[cfg(feature = "serde")]
impl serde::Serialize for ClassTable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if let Some(id) = self.refused {
            return Err(serde::ser::Error::custom(unknown_class_id(id)));
        }
        s.collect_seq(self.iter())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for ClassTable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v: Vec<ClassLimits> = serde::Deserialize::deserialize(d)?;
        let mut t = ClassTable::default();
        for l in v {
            if !t.push(l) {
                return Err(serde::de::Error::custom(format_args!(
                    "at most {MAX_CLASSES} admission classes"
                )));
            }
        }
        Ok(t)
    }
}

/// Σ floors and protected capacity in use, over every class.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct ShareSums {
    pub(crate) sum_pc: u64,
    pub(crate) sum_pt: u64,
    pub(crate) prot_c: u64,
    pub(crate) prot_t: u64,
}

impl ShareSums {
    /// Adds class `(i, t)` under limits `l`.
    #[inline]
    pub(crate) fn add(&mut self, (i, t): (u64, u64), l: &crate::words::limits::HotClass) {
        self.sum_pc += l.pc;
        self.sum_pt = self.sum_pt.saturating_add(l.pt);
        self.prot_c += i.min(l.pc);
        self.prot_t += t.min(l.pt);
    }
}

/// Everything a class decision (and its refusal detail) reads of the state, for one class: the
/// global totals, the sums over every class, and the class's own numbers. A few words, so a
/// refusal carries it by value and allocates nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Summary {
    /// Global slots in use and tokens held.
    pub(crate) g: u64,
    pub(crate) t: u64,
    pub(crate) sums: ShareSums,
    /// The class's `(in flight, tokens)` and limits.
    pub(crate) own: (u64, u64),
    pub(crate) limits: crate::words::limits::HotClass,
    pub(crate) max_concurrent: u64,
    /// The demand's effective budget (`None` without a budget).
    pub(crate) eff: Option<u64>,
}

impl Summary {
    /// What the class would borrow for a demand of `r` tokens: `(slot?, tokens)`.
    pub(crate) fn borrow(&self, r: u64) -> (bool, u64) {
        let (i, t) = self.own;
        let l = &self.limits;
        let tokens = if r == 0 {
            0
        } else {
            r - r.min(l.pt.saturating_sub(t))
        };
        (i >= l.pc, tokens)
    }

    /// The sequential decision for a demand of `r` tokens in this state, rows 1–6 (shutdown is
    /// the caller's): `None` when it fits. The same formulas as the model's (`src/model.rs`,
    /// the reference's §4.3).
    pub(crate) fn decide(
        &self,
        r: u64,
    ) -> Option<(
        crate::vocab::rejection::RejectReason,
        crate::vocab::rejection::Constraint,
    )> {
        use crate::vocab::rejection::{Constraint, RejectReason};
        if self.eff.is_some_and(|e| self.t.saturating_add(r) > e) {
            return Some((RejectReason::BudgetLimit, Constraint::Global));
        }
        let (i, t) = self.own;
        let l = &self.limits;
        if l.mt.is_some_and(|mt| t.saturating_add(r) > mt) {
            return Some((RejectReason::BudgetLimit, Constraint::AdmissionClass));
        }
        if l.mc.is_some_and(|mc| i >= mc) {
            return Some((RejectReason::ConcurrencyLimit, Constraint::AdmissionClass));
        }
        let ShareSums {
            sum_pc,
            sum_pt,
            prot_c,
            prot_t,
        } = self.sums;
        let (borrow_c, borrow_t) = self.borrow(r);
        let sc = self.max_concurrent.saturating_sub(sum_pc);
        if sum_pc > 0 && borrow_c && self.g.saturating_sub(prot_c) + 1 > sc {
            return Some((
                RejectReason::ConcurrencyLimit,
                Constraint::AdmissionClassProtection,
            ));
        }
        if let Some(e) = self.eff {
            let st = e.saturating_sub(sum_pt);
            let used = self.t.saturating_sub(prot_t);
            if sum_pt > 0 && borrow_t > 0 && used.saturating_add(borrow_t) > st {
                return Some((
                    RejectReason::BudgetLimit,
                    Constraint::AdmissionClassProtection,
                ));
            }
        }
        if self.g >= self.max_concurrent {
            return Some((RejectReason::ConcurrencyLimit, Constraint::Global));
        }
        None
    }

    /// The class numbers of a refusal (kept raw: the refusal's `detail()` derives
    /// [`detail`](Self::detail)'s numbers from them), with the shared remainder in use
    /// raised to `stored` (slots, tokens) when the stored shared word explains the refusal.
    pub(crate) fn counts(
        &self,
        name: &'static &'static str,
        stored: Option<(u64, u64)>,
    ) -> crate::vocab::rejection::ClassCounts {
        let ShareSums {
            sum_pc,
            sum_pt,
            prot_c,
            prot_t,
        } = self.sums;
        let (stored_c, stored_t) = stored.unwrap_or((0, 0));
        let (i, t) = self.own;
        let l = &self.limits;
        crate::vocab::rejection::ClassCounts::new(
            name,
            crate::vocab::rejection::ClassNumbers {
                in_flight: i,
                tokens: t,
                protected_concurrent: l.pc,
                max_concurrent: l.mc,
                protected_tokens: l.pt,
                max_tokens: l.mt,
                sum_pc,
                sum_pt,
                shared_slots_in_use: self.g.saturating_sub(prot_c).max(stored_c),
                shared_tokens_in_use: self.t.saturating_sub(prot_t).max(stored_t),
            },
        )
    }

    pub(crate) fn detail(&self, name: &str, r: u64) -> crate::vocab::rejection::ClassDetail {
        use crate::vocab::rejection::{
            ClassCapacity, ClassDetail, ClassTokenCapacity, SharedAmount, SharedCapacity,
        };
        let ShareSums {
            sum_pc,
            sum_pt,
            prot_c,
            prot_t,
        } = self.sums;
        let (borrow_c, borrow_t) = self.borrow(r);
        let amount = |capacity: u64, in_use: u64, requested_borrowed: u64| SharedAmount {
            capacity,
            in_use,
            available: capacity.saturating_sub(in_use),
            requested_borrowed,
        };
        let (i, t) = self.own;
        let l = &self.limits;
        ClassDetail {
            shared: SharedCapacity {
                concurrency: amount(
                    self.max_concurrent.saturating_sub(sum_pc),
                    self.g.saturating_sub(prot_c),
                    u64::from(borrow_c),
                ),
                token_budget: self.eff.map(|eff| {
                    amount(
                        eff.saturating_sub(sum_pt),
                        self.t.saturating_sub(prot_t),
                        borrow_t,
                    )
                }),
            },
            class: ClassCapacity {
                id: name.to_owned(),
                in_flight: i,
                protected_concurrent: l.pc,
                protected_concurrent_in_use: i.min(l.pc),
                borrowed_concurrent: i - i.min(l.pc),
                available_protected_concurrent: l.pc.saturating_sub(i),
                max_concurrent: l.mc,
                available_concurrent: l.mc.map(|m| m.saturating_sub(i)),
                token_budget: self.eff.map(|_| ClassTokenCapacity {
                    in_flight_tokens: t,
                    protected_tokens: l.pt,
                    protected_tokens_in_use: t.min(l.pt),
                    borrowed_tokens: t - t.min(l.pt),
                    available_protected_tokens: l.pt.saturating_sub(t),
                    max_tokens: l.mt,
                    available: l.mt.map(|m| m.saturating_sub(t)),
                    requested: r,
                }),
            },
        }
    }
}

/// The state that explains a class decision.
pub(crate) struct ClassView<'a> {
    /// Global slots in use and tokens held.
    pub(crate) g: u64,
    pub(crate) t: u64,
    /// `(in flight, tokens)` per class.
    pub(crate) classes: &'a [(u64, u64)],
    /// Limits per class.
    pub(crate) limits: &'a [crate::words::limits::HotClass],
    pub(crate) max_concurrent: u64,
    /// The demand's effective budget (`None` without a budget).
    pub(crate) eff: Option<u64>,
}

impl ClassView<'_> {
    /// The [`Summary`] of class `k`.
    pub(crate) fn summary(&self, k: usize) -> Summary {
        let mut sums = ShareSums::default();
        for (&c, l) in self.classes.iter().zip(self.limits) {
            sums.add(c, l);
        }
        Summary {
            g: self.g,
            t: self.t,
            sums,
            own: self.classes[k],
            limits: self.limits[k],
            max_concurrent: self.max_concurrent,
            eff: self.eff,
        }
    }

    /// [`Summary::decide`] for class `k`.
    pub(crate) fn decide(
        &self,
        k: usize,
        r: u64,
    ) -> Option<(
        crate::vocab::rejection::RejectReason,
        crate::vocab::rejection::Constraint,
    )> {
        self.summary(k).decide(r)
    }

    /// [`Summary::detail`] for class `k` (named `name`).
    pub(crate) fn detail(
        &self,
        k: usize,
        name: &str,
        r: u64,
    ) -> crate::vocab::rejection::ClassDetail {
        self.summary(k).detail(name, r)
    }
}
