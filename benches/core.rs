//! Criterion benchmarks (placeholder until written).
fn main() {}
