//! Observe mode's figures ([`ObserveStats`]) and the counters behind them
//! ([`ObserveCounters`]): one set per bulkhead, kept in the bulkhead's extension slot
//! (`crate::shared::Shared::extension`), so every `LlmBulkhead` and tower layer wrapping the
//! same bulkhead counts into it.
//!
//! # Why plain atomics
//!
//! The core's counters are striped per thread because they are on the admission's fast path.
//! A bypass is not: it follows a refusal, and already clones the bulkhead handle (a shared
//! read-modify-write) and boxes its state. Plain `Relaxed` atomics cost it two or three more
//! read-modify-writes and give the shadow ids a bulkhead-wide counter, with no per-thread
//! entry and no second per-thread lookup that would evict the core's one-entry cache
//! (`crate::sync::Stripes`).
//!
//! # Memory ordering
//!
//! `Relaxed`, as the core's statistics: a read racing with bypasses sees each counter at some
//! recent value; once the bypassing threads are joined, every count is exact.

use crate::sync::{AtomicU64, Ordering};
use crate::{RejectCounts, RejectReason};

/// Observe (shadow) mode figures (reference §10.3 `observe`): work that `LlmBulkhead::run`
/// or the tower layer ran without an admission because it was refused for one of its shadow
/// reasons. None of it is in the bulkhead's capacity figures (slots, tokens, `admitted`,
/// `released`). Read with [`LlmBulkhead::stats`](crate::llm::LlmBulkhead::stats) or
/// [`LlmStats::of`](crate::llm::LlmStats::of).
///
/// ```
/// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, NaiveEstimator, RunOptions};
/// use llm_bulkhead::{Bulkhead, Usage};
/// let llm = LlmBulkhead::new(Bulkhead::new(0).unwrap(), NaiveEstimator);
/// assert_eq!(llm.stats().observe, None);
/// let observe = RunOptions { mode: Mode::observe(), ..RunOptions::default() }
///     .with_usage(|u: &Usage| Some(*u));
/// llm.run_blocking(&LlmRequest::default(), observe, |_| Ok::<_, ()>(Usage::new(3, 2))).unwrap();
/// let o = llm.stats().observe.unwrap();
/// assert_eq!((o.bypassed, o.bypassed_by_reason.concurrency_limit, o.in_flight), (1, 1, 0));
/// assert_eq!((o.usage_reported, o.total_input_tokens, o.total_output_tokens), (1, 3, 2));
/// assert_eq!(llm.bulkhead().stats().admitted, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ObserveStats {
    /// Runs bypassed.
    pub bypassed: u64,
    /// Of which after the advisory check said "admit" and the real decision refused (a
    /// queue timeout, or capacity taken in between).
    pub race_bypassed: u64,
    /// Bypasses by reason (only `budget_limit`, `concurrency_limit`, `queue_limit` and
    /// `timeout` can be non-zero).
    pub bypassed_by_reason: RejectCounts,
    /// Bypassed runs still running (not in the reference: `bypassed` minus those finished).
    pub in_flight: u64,
    /// Bypassed runs that finished with usage (explicit, or the last report).
    pub usage_reported: u64,
    /// Input tokens of that usage.
    pub total_input_tokens: u64,
    /// Output tokens of that usage.
    pub total_output_tokens: u64,
}

/// One bulkhead's observe-mode counters (see the module documentation).
#[derive(Default)]
pub(crate) struct ObserveCounters {
    /// Bypasses; its value before the increment numbers the shadow id.
    bypassed: AtomicU64,
    race_bypassed: AtomicU64,
    /// By reason (only the four shadow reasons are ever written).
    by_reason: [AtomicU64; RejectReason::COUNTED.len()],
    /// Bypassed runs that finished (the rest are in flight).
    settled: AtomicU64,
    /// Bypassed runs that finished with usage, and the tokens of that usage.
    usage_reported: AtomicU64,
    input: AtomicU64,
    output: AtomicU64,
}

fn add(c: &AtomicU64, v: u64) -> u64 {
    c.fetch_add(v, Ordering::Relaxed)
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl ObserveCounters {
    /// The counters of `b` (made on first use; a lock: look them up once and keep them).
    pub(crate) fn of(b: &crate::Bulkhead) -> std::sync::Arc<ObserveCounters> {
        b.shared.extension()
    }

    /// Counts a bypass refused for `reason`; returns its number (for the shadow id).
    pub(crate) fn bypass(&self, reason: RejectReason, raced: bool) -> u64 {
        if raced {
            add(&self.race_bypassed, 1);
        }
        add(&self.by_reason[reason.index()], 1);
        add(&self.bypassed, 1)
    }

    /// Counts a bypassed run's end, with its final usage if it has one.
    pub(crate) fn settle(&self, usage: Option<crate::Usage>) {
        if let Some(u) = usage {
            add(&self.usage_reported, 1);
            add(&self.input, u.input);
            add(&self.output, u.output);
        }
        add(&self.settled, 1);
    }

    /// The figures: `None` before the first bypass (as in the reference).
    pub(crate) fn stats(&self) -> Option<ObserveStats> {
        // Separate `Relaxed` loads: a settlement seen before its bypass saturates at 0.
        let settled = get(&self.settled);
        let bypassed = get(&self.bypassed);
        if bypassed == 0 {
            return None;
        }
        let mut by_reason = RejectCounts::default();
        for r in RejectReason::COUNTED {
            *by_reason.slot(r) = get(&self.by_reason[r.index()]);
        }
        Some(ObserveStats {
            bypassed,
            race_bypassed: get(&self.race_bypassed),
            bypassed_by_reason: by_reason,
            in_flight: bypassed.saturating_sub(settled),
            usage_reported: get(&self.usage_reported),
            total_input_tokens: get(&self.input),
            total_output_tokens: get(&self.output),
        })
    }
}
