//! The explanation of a refusal whose demand could never be admitted under the limits it saw
//! ([`Rejection::never_fits`](crate::Rejection::never_fits)).

/// A token demand the limits a refusal saw could never admit, however much capacity is freed:
/// its reservation is above a bound that holds even on an idle bulkhead
/// ([`Rejection::never_fits`]). Retrying it is useless until the limits change.
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, FitLimit, Reservation};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(1_000).build().unwrap();
/// let r = b.try_acquire(Demand::tokens(Reservation::new(900, 200).unwrap())).unwrap_err();
/// let n = r.never_fits().unwrap();
/// assert_eq!((n.limit, n.requested, n.most), (FitLimit::EffectiveBudget, 1_100, 1_000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct NeverFits {
    /// The tightest bound the reservation is above.
    pub limit: FitLimit,
    /// The reservation.
    pub requested: u64,
    /// The most tokens that bound admits (`requested > most`).
    pub most: u64,
}

/// The bound a [`NeverFits`] reservation is above.
///
/// ```
/// assert_eq!(llm_bulkhead::FitLimit::ClassMaxTokens.as_str(), "class_max_tokens");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum FitLimit {
    /// The budget for the demand's priority (`B`, or `B − H` for normal priority).
    EffectiveBudget,
    /// The class's token ceiling.
    ClassMaxTokens,
    /// The class's token floor plus the whole shared remainder: the most a class can hold.
    ClassReach,
}

impl FitLimit {
    /// The wire name.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::FitLimit::EffectiveBudget.as_str(), "effective_budget");
    /// ```
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            FitLimit::EffectiveBudget => "effective_budget",
            FitLimit::ClassMaxTokens => "class_max_tokens",
            FitLimit::ClassReach => "class_reach",
        }
    }

    /// The tightest of `bounds` that `requested` is above.
    pub(crate) fn tightest(
        requested: u64,
        bounds: impl IntoIterator<Item = (FitLimit, Option<u64>)>,
    ) -> Option<NeverFits> {
        bounds
            .into_iter()
            .filter_map(|(limit, most)| Some((limit, most?)))
            .filter(|&(_, most)| requested > most)
            .min_by_key(|&(_, most)| most)
            .map(|(limit, most)| NeverFits {
                limit,
                requested,
                most,
            })
    }
}
