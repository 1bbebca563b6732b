//! Limits snapshots for a control plane, keyed by class name.

use super::{is_zero, named_classes, ClassMap, LoadError};
use crate::{BudgetLimits, Bulkhead, LimitsChange, LimitsSnapshot};
use serde::{Deserialize, Serialize};

/// A limits snapshot for a control plane: the whole snapshot, with classes keyed by name.
///
/// Every field is required except the budget (required exactly when the bulkhead has one) and
/// the classes (required exactly when it has classes, and then every construction-time class
/// must be named; a class's absent floors are 0 and absent ceilings are none). A snapshot is
/// complete on purpose: a partial one applied over the current limits could silently undo a
/// concurrent change with a lower revision.
///
/// ```
/// use llm_bulkhead::config::{BulkheadConfig, LimitsConfig};
/// let b = BulkheadConfig::from_json(r#"{"max_concurrent": 8, "admission_classes":
///     {"default_class": "std", "classes": {"vip": {"protectedConcurrent": 2}, "std": {}}}}"#)?.build()?;
/// // The kill switch: everything else as it is, max_concurrent 0.
/// let kill = LimitsConfig::from_json(r#"{"revision": 1, "maxConcurrent": 0, "maxQueue": 0,
///     "admissionClasses": {"std": {}, "vip": {}}}"#)?;
/// kill.apply(&b)?;
/// assert_eq!(b.limits().max_concurrent, 0);
/// assert!(b.try_acquire(llm_bulkhead::Demand::slot()).is_err());
/// // A control plane can start from the current snapshot.
/// let current = LimitsConfig::of(&b);
/// assert_eq!(current.admission_classes.unwrap().names().collect::<Vec<_>>(), ["vip", "std"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// The snapshot's revision: it must be larger than the current one.
    pub revision: u64,
    /// Global concurrency limit (0 is the kill switch).
    #[serde(alias = "maxConcurrent")]
    pub max_concurrent: u32,
    /// Queue bound.
    #[serde(alias = "maxQueue")]
    pub max_queue: u32,
    /// The token budget (exactly when the bulkhead was built with one).
    #[serde(
        default,
        alias = "tokenBudget",
        skip_serializing_if = "Option::is_none"
    )]
    pub token_budget: Option<BudgetConfig>,
    /// Every class's limits, by name (exactly when the bulkhead has classes).
    #[serde(
        default,
        alias = "admissionClasses",
        alias = "classes",
        skip_serializing_if = "Option::is_none"
    )]
    pub admission_classes: Option<ClassMap>,
}

/// The budget part of a [`LimitsConfig`].
///
/// ```
/// use llm_bulkhead::config::BudgetConfig;
/// let b: BudgetConfig = serde_json::from_str(r#"{"budget": 10, "highPriorityReserve": 20}"#).unwrap();
/// assert_eq!(b.high_priority_reserve, 20);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// The budget `B`.
    pub budget: u64,
    /// The high-priority reserve `H` (default 0; a snapshot may leave `H > B`, which refuses
    /// normal-priority token demands).
    #[serde(
        default,
        alias = "highPriorityReserve",
        skip_serializing_if = "is_zero"
    )]
    pub high_priority_reserve: u64,
}

impl LimitsConfig {
    /// The current limits of `bulkhead`, classes by name.
    ///
    /// ```
    /// use llm_bulkhead::{config::LimitsConfig, Bulkhead};
    /// let b = Bulkhead::builder().max_concurrent(4).token_budget(100).build().unwrap();
    /// let l = LimitsConfig::of(&b);
    /// assert_eq!((l.max_concurrent, l.token_budget.unwrap().budget), (4, 100));
    /// ```
    #[must_use]
    pub fn of(bulkhead: &Bulkhead) -> LimitsConfig {
        let l = bulkhead.limits();
        LimitsConfig {
            revision: l.revision,
            max_concurrent: l.max_concurrent,
            max_queue: l.max_queue,
            token_budget: l.token_budget.map(|t| BudgetConfig {
                budget: t.budget,
                high_priority_reserve: t.high_priority_reserve,
            }),
            admission_classes: (!bulkhead.class_names().is_empty())
                .then(|| named_classes(bulkhead, &l)),
        }
    }

    /// The positional snapshot for `bulkhead`: classes are looked up by name.
    ///
    /// # Errors
    /// [`LoadError::UnknownClass`] for a name the bulkhead does not have,
    /// [`LoadError::MissingClass`] for a class the snapshot does not name, and
    /// [`LoadError::UnexpectedClasses`] for classes on a bulkhead without any.
    ///
    /// ```
    /// use llm_bulkhead::config::{LimitsConfig, LoadError};
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(2).class("a", ClassLimits::default()).default_class("a").build().unwrap();
    /// let bad = LimitsConfig::from_json(r#"{"revision": 1, "max_concurrent": 2, "max_queue": 0, "classes": {"tenant-42": {}}}"#).unwrap();
    /// assert!(matches!(bad.snapshot(&b), Err(LoadError::UnknownClass { ref class, .. }) if class == "tenant-42"));
    /// ```
    pub fn snapshot(&self, bulkhead: &Bulkhead) -> Result<LimitsSnapshot, LoadError> {
        let mut s = bulkhead
            .limits()
            .with_revision(self.revision)
            .with_max_concurrent(self.max_concurrent)
            .with_max_queue(self.max_queue)
            .with_token_budget(self.token_budget.map(|t| BudgetLimits {
                budget: t.budget,
                high_priority_reserve: t.high_priority_reserve,
            }));
        let names = bulkhead.class_names();
        match &self.admission_classes {
            None if names.is_empty() => {}
            None => {
                return Err(LoadError::MissingClass {
                    class: names[0].clone(),
                })
            }
            Some(m) if names.is_empty() && !m.is_empty() => {
                return Err(LoadError::UnexpectedClasses)
            }
            Some(m) => {
                for (name, limits) in m.iter() {
                    let id = bulkhead
                        .class_id(name)
                        .map_err(|_| LoadError::UnknownClass {
                            class: name.to_owned(),
                            known: names.to_vec(),
                        })?;
                    s = s.with_class(id, (*limits).into());
                }
                if let Some(missing) = names.iter().find(|n| m.get(n).is_none()) {
                    return Err(LoadError::MissingClass {
                        class: missing.clone(),
                    });
                }
            }
        }
        Ok(s)
    }

    /// Resolves the names and applies the snapshot ([`Bulkhead::apply_limits`]).
    ///
    /// # Errors
    /// As [`snapshot`](Self::snapshot), and [`LoadError::Apply`] for a stale revision or an
    /// invalid snapshot (nothing installed).
    ///
    /// ```
    /// use llm_bulkhead::{config::LimitsConfig, Bulkhead};
    /// let b = Bulkhead::new(4).unwrap();
    /// let next = LimitsConfig { revision: 1, max_concurrent: 2, ..Default::default() };
    /// assert_eq!(next.apply(&b).unwrap().current.max_concurrent, 2);
    /// assert!(next.apply(&b).is_err()); // revision 1 is no longer newer
    /// ```
    pub fn apply(&self, bulkhead: &Bulkhead) -> Result<LimitsChange, LoadError> {
        let s = self.snapshot(bulkhead)?;
        bulkhead.apply_limits(s).map_err(LoadError::Apply)
    }
}
