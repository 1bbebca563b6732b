//! [`RunId`]: the id of a run's work, an admission's or (observe mode) a *shadow id*.
//!
//! A bypass holds no admission, so it has no admission id; it gets an id in the core's
//! reserved space instead (variant bits `11`, which no admission id has: see
//! `crate::vocab::id`), numbered by the bulkhead's bypass counter
//! ([`ObserveCounters`](super::stats::ObserveCounters)). So a shadow id never equals an
//! admission id, and is unique within its bulkhead as admission ids are. It displays as
//! `shadow-` followed by the UUID with the RFC variant restored (the reference's
//! `"shadow-" + uuid`).

use crate::AdmissionId;
use std::fmt;

/// The id of a run's work: its admission's id, or the shadow id of bypassed work (observe
/// mode, [`Mode`](super::Mode)), which never equals an admission id and displays as
/// `shadow-<uuid>`. [`RunContext::admission_id`](crate::llm::RunContext::admission_id)
/// returns it; it compares equal to the [`AdmissionId`] it wraps.
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::Bulkhead;
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() };
/// let id = llm.run_blocking(&LlmRequest::default(), observe, |ctx| Ok::<_, ()>(ctx.admission_id())).unwrap();
/// assert!(id.is_shadow());
/// assert_eq!(id.admission_id(), None);
/// assert!(id.to_string().starts_with("shadow-"));
/// assert_eq!(id.to_string().len(), 7 + 36);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(AdmissionId);

impl RunId {
    /// The shadow id numbered `counter` of the bulkhead whose id prefix is `prefix`.
    pub(crate) fn shadow(prefix: u128, counter: u64) -> RunId {
        // The core's reserved space is ours: its ids display as `shadow-<uuid>` wherever they
        // go (a `UsageReport`'s `admission_id` too).
        crate::vocab::id::name_reserved_space("shadow");
        RunId(AdmissionId::reserved(prefix, counter))
    }

    /// Whether this is the shadow id of bypassed work (displayed `shadow-…`) rather than an
    /// admission's id.
    ///
    /// ```
    /// # use llm_bulkhead::llm::*; use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
    /// let id = llm.run_blocking(&LlmRequest::default(), RunOptions::default(), |ctx| Ok::<_, ()>(ctx.admission_id())).unwrap();
    /// assert!(!id.is_shadow());
    /// ```
    #[must_use]
    pub fn is_shadow(self) -> bool {
        self.0.is_reserved()
    }

    /// The admission's id (`None` for a shadow id).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// use llm_bulkhead::llm::RunId;
    /// let b = Bulkhead::new(1).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(RunId::from(a.id()).admission_id(), Some(a.id()));
    /// ```
    #[must_use]
    pub fn admission_id(self) -> Option<AdmissionId> {
        (!self.is_shadow()).then_some(self.0)
    }

    /// The id as a 128-bit integer (a shadow id's has the reserved variant bits `11`).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand};
    /// use llm_bulkhead::llm::RunId;
    /// let a = Bulkhead::new(1).unwrap().try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(RunId::from(a.id()).as_u128(), a.id().as_u128());
    /// ```
    #[must_use]
    pub fn as_u128(self) -> u128 {
        self.0.as_u128()
    }
}

impl From<AdmissionId> for RunId {
    /// The id of a run's work as an [`AdmissionId`] carries it (a bypass's
    /// [`UsageReport::admission_id`](crate::UsageReport::admission_id) is its shadow id's
    /// bits, which this names again).
    fn from(id: AdmissionId) -> RunId {
        RunId(id)
    }
}

impl From<RunId> for AdmissionId {
    /// The id's bits (for a shadow id, an id of the core's reserved space).
    fn from(id: RunId) -> AdmissionId {
        id.0
    }
}

impl PartialEq<AdmissionId> for RunId {
    fn eq(&self, other: &AdmissionId) -> bool {
        self.0 == *other
    }
}

impl PartialEq<RunId> for AdmissionId {
    fn eq(&self, other: &RunId) -> bool {
        *self == other.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A shadow id's space is named "shadow" before its first id exists (`RunId::shadow`),
        // so the core displays it `shadow-<uuid>`, the UUID with the RFC variant restored.
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({self})")
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for RunId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn shadow_ids_never_equal_admission_ids_and_display_with_the_rfc_variant() {
        let prefix = crate::vocab::id::prefix();
        let admissions: Vec<AdmissionId> = [0, 1, 0xfff, 0xf_ffff]
            .into_iter()
            .flat_map(|key| [0, 1, (1 << 62) - 1].map(|n| AdmissionId::new(prefix, key, n)))
            .collect();
        let shadows: Vec<RunId> = [0, 1, 2, (1 << 62) - 1]
            .map(|n| RunId::shadow(prefix, n))
            .to_vec();
        for s in &shadows {
            assert!(s.is_shadow());
            assert_eq!(s.admission_id(), None);
            assert!(admissions.iter().all(|a| a != s));
            let text = s.to_string();
            let u = uuid::Uuid::parse_str(text.strip_prefix("shadow-").unwrap()).unwrap();
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(u.get_version_num(), 8);
        }
        for a in &admissions {
            let r = RunId::from(*a);
            assert!(!r.is_shadow());
            assert_eq!((r.admission_id(), r.to_string()), (Some(*a), a.to_string()));
        }
        let all: HashSet<u128> = admissions
            .iter()
            .map(|a| a.as_u128())
            .chain(shadows.iter().map(|s| s.as_u128()))
            .collect();
        assert_eq!(all.len(), admissions.len() + shadows.len());
    }
}
