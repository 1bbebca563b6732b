//! The agent tests' configuration: TTL 1 s, admissions of at most 1 s, a floor of two slots
//! held 500 ms, a 2 s quarantine. So a lease renewed at `t` is valid until `t + 940` (1 s less
//! 1 % and the 50 ms margin), the floor lasts until `t + 1_440`, and a new table learns 3 s.

use llm_bulkhead::cluster::{Amounts, ClusterConfig};
use std::time::Duration;

pub fn agent_config(namespace: &str) -> ClusterConfig {
    ClusterConfig::new(namespace, "b")
        .ttl(Duration::from_millis(1_000))
        .max_admission(Duration::from_millis(1_000))
        .floor(Amounts::new(2, 0))
        .floor_hold(Duration::from_millis(500))
        .quarantine(Duration::from_millis(2_000))
}
