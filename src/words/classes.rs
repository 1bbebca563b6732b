//! Admission classes: a fixed table of policy buckets with protected floors and hard ceilings
//! (CONTRACT.md §4), enforced lock-free by the protocol in `crate::protocol::classed`.
//!
//! A class uses its floor first, then borrows from the shared remainder
//! (`max_concurrent − Σ floors`, and for tokens `eff(priority) − Σ token floors`). Floors are
//! strict: idle protected capacity is never lent.

use crate::vocab::class::{ClassId, MAX_CLASSES};

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
/// ```
/// use llm_bulkhead::{Bulkhead, ClassLimits};
/// let b = Bulkhead::builder().max_concurrent(4).class("a", ClassLimits::default())
///     .default_class("a").build().unwrap();
/// let t = b.limits().classes;
/// assert_eq!((t.len(), t.get(b.class_id("a").unwrap())), (1, Some(&ClassLimits::default())));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ClassTable {
    len: u8,
    entries: [ClassLimits; MAX_CLASSES],
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
    #[must_use]
    pub fn get(&self, id: ClassId) -> Option<&ClassLimits> {
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

    pub(crate) fn set(&mut self, id: ClassId, limits: ClassLimits) -> bool {
        let len = self.len();
        match self.entries[..len].get_mut(id.index()) {
            Some(e) => {
                *e = limits;
                true
            }
            None => false,
        }
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

#[cfg(feature = "serde")]
impl serde::Serialize for ClassTable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
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

    /// The refusal detail for this class (named `name`) and a demand of `r` tokens.
    /// The class numbers of a refusal of `r` tokens (kept raw: the refusal's `detail()`
    /// derives [`detail`](Self::detail)'s numbers from them), with the shared remainder in use
    /// raised to `stored` (slots, tokens) when the stored shared word explains the refusal.
    pub(crate) fn counts(
        &self,
        name: &'static str,
        r: u64,
        stored: Option<(u64, u64)>,
    ) -> crate::vocab::rejection::ClassCounts {
        use crate::vocab::rejection::n32;
        let ShareSums {
            sum_pc,
            sum_pt,
            prot_c,
            prot_t,
        } = self.sums;
        let (borrow_c, borrow_t) = self.borrow(r);
        let (stored_c, stored_t) = stored.unwrap_or((0, 0));
        let (i, t) = self.own;
        let l = &self.limits;
        crate::vocab::rejection::ClassCounts {
            name,
            shared_slots: n32(self.max_concurrent.saturating_sub(sum_pc)),
            shared_slots_in_use: n32(self.g.saturating_sub(prot_c).max(stored_c)),
            borrows_slot: borrow_c,
            in_flight: n32(i),
            protected_concurrent: n32(l.pc),
            max_concurrent: l.mc.map(n32),
            tokens: n32(t),
            protected_tokens: n32(l.pt),
            max_tokens: l.mt.map(n32),
            shared_tokens: n32(self.eff.unwrap_or(0).saturating_sub(sum_pt)),
            shared_tokens_in_use: self.t.saturating_sub(prot_t).max(stored_t),
            borrows_tokens: borrow_t,
        }
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
