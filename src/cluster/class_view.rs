//! The agent's view of the bulkhead's admission classes: the class parameters the store splits
//! (read once from the global snapshot), each class's use and demand at a renewal (from the
//! bulkhead's stats), and the class limits of a share (in the one snapshot the agent installs).

use super::allocator::{Amounts, MAX_CLASSES};
use super::classes::{good_name, ClassParams, ClassShare, ClassUse};
use super::lease::ClusterConfigError;
use crate::{Bulkhead, ClassLimits, LimitsSnapshot, Stats};

fn scale(x: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        0
    } else {
        (u128::from(x) * u128::from(part) / u128::from(whole)) as u64
    }
}

/// The class parameters of the global snapshot `base`, in the bulkhead's class order. A class
/// without a ceiling (per resource) gets the global limit, which the store does not split.
///
/// # Errors
/// `BadName("class")` for a name the store cannot hold, or more than [`MAX_CLASSES`] classes.
pub(super) fn params(
    bulkhead: &Bulkhead,
    base: &LimitsSnapshot,
    global: Amounts,
    floor: Amounts,
) -> Result<Vec<ClassParams>, ClusterConfigError> {
    let names = bulkhead.class_names();
    if names.len() > MAX_CLASSES {
        return Err(ClusterConfigError::BadName("class"));
    }
    names
        .iter()
        .map(|name| {
            let c = bulkhead
                .class_id(name)
                .ok()
                .and_then(|id| base.classes.get(id).copied())
                .filter(|_| good_name(name))
                .ok_or(ClusterConfigError::BadName("class"))?;
            let ceiling = Amounts::new(
                c.max_concurrent.map_or(global.slots, u64::from),
                c.max_tokens.unwrap_or(global.tokens),
            )
            .min(global);
            let class_floor =
                Amounts::new(u64::from(c.protected_concurrent), c.protected_tokens).min(ceiling);
            Ok(ClassParams {
                name: name.clone(),
                floor: class_floor,
                ceiling,
                min: Amounts::new(
                    scale(class_floor.slots, floor.slots, global.slots),
                    scale(class_floor.tokens, floor.tokens, global.tokens),
                ),
            })
        })
        .collect()
}

/// Each class's use and demand, and the per-class state the demand needs between renewals.
#[derive(Debug, Default)]
pub(super) struct ClassDemand {
    /// Peak class work in flight since the last renewal, sampled at every step.
    peak: Vec<Amounts>,
    /// Class refusals (without shutdown) seen at the last renewal.
    seen: Vec<u64>,
}

impl ClassDemand {
    /// The class reports for a renewal now: installed share, work in flight, and the demand,
    /// which is the peak in flight since the last renewal or, for a class under pressure
    /// (refused since the last renewal, or at its installed ceiling while the queue is not
    /// empty), twice its installed ceiling (at least one more slot), capped at the class's
    /// global ceiling. The core keeps no per-class queue length, hence the second test.
    pub(super) fn uses(
        &mut self,
        s: &Stats,
        params: &[ClassParams],
        installed: &[ClassShare],
    ) -> Vec<ClassUse> {
        let stats = s.classes.as_ref().map_or(&[][..], |c| &c.classes[..]);
        self.peak.resize(params.len(), Amounts::ZERO);
        self.seen.resize(params.len(), 0);
        params
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let cs = stats.get(k);
                let held = cs.map_or(Amounts::ZERO, |c| {
                    Amounts::new(c.in_flight, c.in_flight_tokens)
                });
                let refused = cs.map_or(0, refusals);
                let at = installed.get(k).copied().unwrap_or(ClassShare::ZERO);
                let pressed =
                    refused > self.seen[k] || (s.pending > 0 && held.slots >= at.ceiling.slots);
                self.peak[k] = self.peak[k].max(held);
                let mut wants = self.peak[k];
                if pressed {
                    wants = wants.max(Amounts::new(
                        (at.ceiling.slots * 2).max(held.slots + 1),
                        (at.ceiling.tokens * 2).max(held.tokens + 1),
                    ));
                }
                ClassUse::new(&p.name, at, held, wants.min(p.ceiling))
            })
            .collect()
    }

    /// Starts a new renewal period: the peak restarts at the work in flight now, the refusals
    /// seen are those counted now.
    pub(super) fn renewed(&mut self, uses: &[ClassUse], s: &Stats) {
        let stats = s.classes.as_ref().map_or(&[][..], |c| &c.classes[..]);
        for (k, u) in uses.iter().enumerate() {
            self.peak[k] = u.held;
            self.seen[k] = stats.get(k).map_or(0, refusals);
        }
    }
}

fn refusals(c: &crate::ClassStats) -> u64 {
    c.rejected.saturating_sub(c.rejected_by_reason.shutdown)
}

/// The snapshot for `share` and the class shares `classes` (`None`: the global class limits,
/// as fail-open installs them), and the class shares it really installs. A class keeps the
/// shape of its global limits (a ceiling stays absent where it was); its floor is cut to its
/// ceiling, and the floors, in class order, to what the share leaves (installing less than
/// granted is safe: the store keeps the grant reserved).
pub(super) fn snapshot(
    bulkhead: &Bulkhead,
    base: &LimitsSnapshot,
    global: Amounts,
    share: Amounts,
    classes: Option<&[ClassShare]>,
) -> (LimitsSnapshot, Vec<ClassShare>) {
    let share = share.min(global);
    let slots = u32::try_from(share.slots).unwrap_or(u32::MAX);
    let mut next = base
        .with_max_concurrent(slots)
        .with_token_budget(base.token_budget.map(|b| crate::BudgetLimits {
            budget: share.tokens,
            high_priority_reserve: scale(b.high_priority_reserve, share.tokens, global.tokens),
        }));
    let mut left = share;
    let mut installed = Vec::new();
    for (k, name) in bulkhead.class_names().iter().enumerate() {
        let Ok(id) = bulkhead.class_id(name) else {
            continue;
        };
        let Some(c) = base.classes.get(id).copied() else {
            continue;
        };
        let c = match classes {
            None => c,
            Some(g) => {
                let g = g.get(k).copied().unwrap_or(ClassShare::ZERO);
                let max_concurrent = c
                    .max_concurrent
                    .map(|_| u32::try_from(g.ceiling.slots.min(share.slots)).unwrap_or(0));
                let max_tokens = c.max_tokens.map(|_| g.ceiling.tokens.min(share.tokens));
                let floor_s = g
                    .floor
                    .slots
                    .min(max_concurrent.map_or(u64::MAX, u64::from))
                    .min(left.slots);
                let floor_t = g
                    .floor
                    .tokens
                    .min(max_tokens.unwrap_or(u64::MAX))
                    .min(left.tokens);
                left = Amounts::new(left.slots - floor_s, left.tokens - floor_t);
                ClassLimits {
                    protected_concurrent: u32::try_from(floor_s).unwrap_or(0),
                    max_concurrent,
                    protected_tokens: floor_t,
                    max_tokens,
                }
            }
        };
        installed.push(ClassShare {
            floor: Amounts::new(u64::from(c.protected_concurrent), c.protected_tokens),
            ceiling: Amounts::new(
                c.max_concurrent.map_or(share.slots, u64::from),
                c.max_tokens.unwrap_or(share.tokens),
            ),
        });
        next = next.with_class(id, c);
    }
    (next, installed)
}
