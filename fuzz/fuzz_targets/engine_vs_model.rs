//! Fuzz target: decodes the input into a [`Setup`] and an [`Op`] sequence with
//! [`llm_bulkhead::conformance::decode`], drives them through the lock-free engine and the
//! sequential model with [`llm_bulkhead::conformance::run`], and panics with the first
//! [`Divergence`](llm_bulkhead::conformance::Divergence) if the two disagree.
//!
//! Run with `cargo +nightly fuzz run engine_vs_model` from the `fuzz/` directory. The corpus
//! in `fuzz/corpus/engine_vs_model/` is replayed on stable by `tests/fuzz_corpus.rs`.
//!
//! [`Setup`]: llm_bulkhead::conformance::Setup
//! [`Op`]: llm_bulkhead::conformance::Op

#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_bulkhead::conformance::{decode, run};

fuzz_target!(|data: &[u8]| {
    let (setup, ops) = decode(data);
    if let Err(divergence) = run(&setup, &ops) {
        panic!("engine and model diverged: {divergence}\nsetup: {setup:?}\nops: {ops:?}");
    }
});
