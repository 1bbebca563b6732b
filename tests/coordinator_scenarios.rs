//! Replays every `*.json` scenario of `tests/coordinator_scenarios/` (or of the directory in
//! `$COORDINATOR_SCENARIOS`) against the coordinator, in the format of
//! COORDINATOR-SCENARIOS.md: after every step it compares `result`, `started`, `removed`,
//! `events` (when given) and `state`; at the end `final`. A failure names the scenario, the
//! step and the field. A scenario whose `choices` names a choice this implementation does not
//! make as COORDINATOR.md §8 does is skipped with a line. Prints `N passed, N failed, N skipped`.

#[path = "coordinator_scenarios/driver.rs"]
mod driver;

use driver::Run;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The open choices of COORDINATOR.md §8, each made as written there.
const CHOICES: [&str; 17] = [
    "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "C10", "C11", "C12", "C13", "C14", "C15",
    "C16", "C17",
];

fn check(scn: &str, step: &str, field: &str, got: &Value, want: &Value) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{scn}: {step}: field `{field}`\n  expected {want}\n  got      {got}"
        ))
    }
}

fn replay(name: &str, scn: &Value) -> Result<(), String> {
    let mut run = Run::new(&scn["config"]);
    for (i, s) in scn["steps"].as_array().unwrap().iter().enumerate() {
        let label = format!("step {i} ({})", s["op"].as_str().unwrap_or("?"));
        let result = run.step(s);
        let (started, removed, events) = run.settle(s["op"] == "cancel");
        let e = &s["expect"];
        check(name, &label, "result", &result, &e["result"])?;
        check(name, &label, "started", &started, &e["started"])?;
        check(name, &label, "removed", &removed, &e["removed"])?;
        if !e["events"].is_null() {
            check(name, &label, "events", &events, &e["events"])?;
        }
        check(name, &label, "state", &run.state(), &e["state"])?;
    }
    let f = &scn["final"];
    check(name, "final", "tickets", &run.statuses(), &f["tickets"])?;
    check(name, "final", "state", &run.state(), &f["state"])?;
    Ok(())
}

#[test]
fn scenarios() {
    let dir = std::env::var_os("COORDINATOR_SCENARIOS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coordinator_scenarios")
        });
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut failures = Vec::new();
    for f in &files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).unwrap();
        let scn: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                failed += 1;
                failures.push(format!("{name}: not JSON: {e}"));
                continue;
            }
        };
        let other: Vec<&str> = scn["choices"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c.as_str()).collect())
            .unwrap_or_default();
        if let Some(c) = other.iter().find(|c| !CHOICES.contains(c)) {
            skipped += 1;
            println!(
                "skipped {name}: it depends on choice {c}, which this coordinator does not make"
            );
            continue;
        }
        match std::panic::catch_unwind(|| replay(&name, &scn)) {
            Ok(Ok(())) => passed += 1,
            Ok(Err(msg)) => {
                failed += 1;
                failures.push(msg);
            }
            Err(_) => {
                failed += 1;
                failures.push(format!("{name}: the replay panicked (see above)"));
            }
        }
    }
    for f in &failures {
        println!("FAILED {f}");
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    assert!(failures.is_empty(), "{} scenario(s) failed", failures.len());
    assert!(
        passed > 0 || std::env::var_os("COORDINATOR_SCENARIOS").is_some(),
        "no scenario ran"
    );
}
