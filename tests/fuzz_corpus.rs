//! Replays the cargo-fuzz corpus of the `engine_vs_model` target on the stable toolchain.
//!
//! Every file in `fuzz/corpus/engine_vs_model/` is decoded with
//! [`llm_bulkhead::conformance::decode`] and driven through the engine and the sequential model
//! with [`llm_bulkhead::conformance::run`]. The test fails listing each file that diverges (or
//! panics), and also fails when the corpus directory is missing or empty, so it can never pass
//! on nothing.
//!
//! Inputs of failures the fuzzer once found (`model_consumed_overflow_*`: the model's token
//! totals overflowed where the engine's wrap) are kept in the corpus as regressions.

use llm_bulkhead::conformance::{decode, run};
use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

/// The files of `fuzz/<sub>/engine_vs_model/`, sorted; panics if the directory is missing,
/// unreadable or holds no files.
fn inputs(sub: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(sub)
        .join("engine_vs_model");
    let entries = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("directory {} is unreadable: {e}", dir.display()));
    let mut files: Vec<_> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "directory {} holds no files",
        dir.display()
    );
    files
}

/// Replays every file and fails listing each divergence or panic.
fn replay(files: &[PathBuf]) {
    let mut failures = Vec::new();
    for path in files {
        let bytes =
            fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let (setup, ops) = decode(&bytes);
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let outcome = match panic::catch_unwind(|| run(&setup, &ops)) {
            Ok(Ok(())) => continue,
            Ok(Err(d)) => d.to_string(),
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!("panicked: {msg}")
            }
        };
        failures.push(format!(
            "{name}: {outcome}\n  setup: {setup:?}\n  ops: {ops:?}"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} inputs fail:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn fuzz_corpus_replays_without_divergence() {
    replay(&inputs("corpus"));
}
