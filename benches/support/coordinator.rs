//! The coordinator the benches measure, and one admit + release on it (shared by
//! `benches/coordinator.rs` and `benches/instructions.rs`).

use llm_bulkhead::coordinator::{Coordinator, ProviderLimits, SubmitOptions};
use std::hint::black_box;
use std::time::Duration;

/// Client limit 64, queue cap 64, one provider `a` with limit 32 and `min_interval`, the real
/// clocks, `u64` keys.
pub fn coordinator(min_interval: Duration) -> Coordinator<u64> {
    Coordinator::builder()
        .client_limit(64)
        .queue_cap(64)
        .provider(
            "a",
            ProviderLimits {
                limit: Some(32),
                min_interval,
            },
        )
        .build()
        .unwrap()
}

/// An eligible ticket for `key`, submitted, started and completed; whether it started.
pub fn pair(c: &Coordinator<u64>, key: u64) -> bool {
    match c.submit("a", black_box(key), SubmitOptions::default()) {
        Ok(t) => match t.wait_blocking() {
            Ok(inv) => {
                inv.complete();
                true
            }
            Err(_) => false,
        },
        Err(_) => false,
    }
}
