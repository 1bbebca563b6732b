//! Helpers shared by the loom models: the model runner and small constructors.
//!
//! Not a model itself; every `tests/*.rs` file includes it with `mod common;`.
#![allow(dead_code)]

use llm_bulkhead::{Bulkhead, Demand, Reservation, Stats, TokenStats};

/// The preemption bound used when `LOOM_MAX_PREEMPTIONS` is not set.
pub const DEFAULT_PREEMPTIONS: usize = 3;

/// Runs `f` under loom with a preemption bound (`LOOM_MAX_PREEMPTIONS`, else
/// [`DEFAULT_PREEMPTIONS`]). Every other knob comes from loom's own environment variables
/// (`LOOM_LOG`, `LOOM_LOCATION`, `LOOM_MAX_BRANCHES`, ...).
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    builder.check(f);
}

/// A token demand of `input + max_output` tokens, normal priority.
pub fn tokens(input: u64, max_output: u64) -> Demand {
    Demand::tokens(Reservation::new(input, max_output).unwrap())
}

/// The token part of the stats (the bulkheads of these models all have a budget).
pub fn token_stats(s: &Stats) -> TokenStats {
    s.token_budget.expect("the bulkhead has a token budget")
}

/// What must hold once every thread is joined and every admission is settled: nothing in
/// flight, no tokens held, and the event counters exact.
pub fn assert_quiescent(b: &Bulkhead, admitted: u64, rejected: u64) {
    let s = b.stats();
    assert_eq!(s.in_flight, 0, "slots leaked: {s:?}");
    assert_eq!(s.admissions_in_flight, 0, "admissions leaked: {s:?}");
    assert_eq!(s.admitted, admitted, "admitted count: {s:?}");
    assert_eq!(s.released, admitted, "released count: {s:?}");
    assert_eq!(s.rejected, rejected, "rejected count: {s:?}");
    assert_eq!(s.rejected_by_reason.total(), rejected, "{s:?}");
    assert_eq!(
        s.available_slots,
        u64::from(s.limits.max_concurrent),
        "{s:?}"
    );
    if let Some(t) = s.token_budget {
        assert_eq!(t.in_flight_tokens, 0, "tokens leaked: {s:?}");
        assert_eq!(t.available, t.budget, "{s:?}");
    }
}
