//! Replays every `*.json` scenario of `tests/coordinator_scenarios/` (or of the directory in
//! `$COORDINATOR_SCENARIOS`) against the coordinator, in the format of
//! COORDINATOR-SCENARIOS.md: after every step it compares `result`, `started`, `removed`,
//! `events` (when given) and `state`; at the end `final`. A failure names the scenario, the
//! step and the field. A scenario whose `choices` names a choice this implementation does not
//! make as COORDINATOR.md §8 does is skipped with a line. Prints `N passed, N failed, N skipped`.

use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler, ManualWallClock};
use llm_bulkhead::coordinator::{
    AdmissionError, Clocks, Coordinator, CoordinatorError, EventKind, Invocation, ProviderLimits,
    SubmitOptions, Ticket, TicketId,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The open choices of COORDINATOR.md §8, each made as written there.
const CHOICES: [&str; 17] = [
    "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "C10", "C11", "C12", "C13", "C14", "C15",
    "C16", "C17",
];

fn ms(v: &Value) -> u64 {
    v.as_u64().expect("a non-negative integer")
}

fn dur(d: Duration) -> Value {
    json!(d.as_millis() as u64)
}

enum Tk {
    Queued(Ticket<String>),
    Running(Invocation<String>),
    Ended(&'static str),
}

struct Run {
    c: Coordinator<String>,
    clock: Arc<ManualClock>,
    wall: Arc<ManualWallClock>,
    sched: Arc<ManualScheduler>,
    tickets: BTreeMap<String, Tk>,
    ids: HashMap<TicketId, String>,
    providers: Vec<String>,
}

impl Run {
    fn new(cfg: &Value) -> Run {
        let clock = Arc::new(ManualClock::new(Duration::from_millis(ms(
            &cfg["elapsedStart"]
        ))));
        let wall = Arc::new(ManualWallClock::new(
            UNIX_EPOCH + Duration::from_millis(cfg["wallStart"].as_u64().unwrap_or(0)),
        ));
        let sched = Arc::new(ManualScheduler::new(clock.clone()));
        let mut b = Coordinator::builder()
            .client_limit(cfg["clientLimit"].as_u64().unwrap() as u32)
            .queue_cap(cfg["queueCap"].as_u64().unwrap() as usize)
            .record_events(true)
            .clocks(Clocks {
                elapsed: clock.clone(),
                now: wall.clone(),
                scheduler: sched.clone(),
            });
        let mut providers = Vec::new();
        for p in cfg["providers"].as_array().unwrap() {
            let name = p["name"].as_str().unwrap().to_owned();
            providers.push(name.clone());
            b = b.provider(
                name,
                ProviderLimits {
                    limit: p["limit"].as_u64().map(|l| l as u32),
                    min_interval: Duration::from_millis(ms(&p["minInterval"])),
                },
            );
        }
        Run {
            c: b.build().expect("every scenario config is valid"),
            clock,
            wall,
            sched,
            tickets: BTreeMap::new(),
            ids: HashMap::new(),
            providers,
        }
    }

    fn step(&mut self, s: &Value) -> Value {
        let op = s["op"].as_str().unwrap();
        match op {
            "submit" => {
                let id = s["id"].as_str().unwrap().to_owned();
                let opts = SubmitOptions {
                    admission_timeout: s["admissionTimeout"].as_u64().map(Duration::from_millis),
                    attempt_timeout: None,
                };
                let key = s["key"].as_str().unwrap().to_owned();
                let (r, st) = match self.c.submit(s["provider"].as_str().unwrap(), key, opts) {
                    Ok(t) => {
                        self.ids.insert(t.id(), id.clone());
                        if t.is_started() {
                            let inv = t.wait_blocking().expect("started");
                            ("started", Tk::Running(inv))
                        } else {
                            ("queued", Tk::Queued(t))
                        }
                    }
                    Err(CoordinatorError::UnknownProvider(_)) => {
                        ("unknown_provider", Tk::Ended("unknown_provider"))
                    }
                    Err(CoordinatorError::Admission(AdmissionError::Overflow)) => {
                        ("overflow", Tk::Ended("overflow"))
                    }
                    Err(CoordinatorError::Admission(AdmissionError::Closed)) => {
                        ("closed", Tk::Ended("closed"))
                    }
                    Err(e) => panic!("unexpected submit error {e:?}"),
                };
                self.tickets.insert(id, st);
                json!(r)
            }
            "complete" => {
                let id = s["id"].as_str().unwrap();
                match self.tickets.insert(id.to_owned(), Tk::Ended("completed")) {
                    Some(Tk::Running(inv)) => inv.complete(),
                    _ => panic!("complete names a running ticket: {id}"),
                }
                json!("ok")
            }
            "cancel" => {
                let id = s["id"].as_str().unwrap();
                match self.tickets.get(id) {
                    Some(Tk::Queued(t)) => {
                        assert!(t.cancel(), "a queued ticket is removed by cancel");
                        json!("cancelled")
                    }
                    Some(Tk::Running(inv)) => {
                        inv.signal().cancel();
                        json!("running")
                    }
                    _ => json!("noop"),
                }
            }
            "cooldown" => {
                let d = Duration::from_millis(ms(&s["delay"]));
                match self.c.cooldown(s["provider"].as_str().unwrap(), d) {
                    Ok(()) => json!("ok"),
                    Err(CoordinatorError::UnknownProvider(_)) => json!("unknown_provider"),
                    Err(e) => panic!("unexpected cooldown error {e:?}"),
                }
            }
            "advance" => {
                self.sched.advance(Duration::from_millis(ms(&s["ms"])));
                json!("ok")
            }
            "wall" => {
                self.wall.jump(s["delta"].as_i64().unwrap());
                json!("ok")
            }
            "close" => {
                self.c.close();
                json!("ok")
            }
            other => panic!("unknown op {other}"),
        }
    }

    /// Collects the step's events; turns queued tickets that started or left into their new
    /// state. Returns (started, removed, events).
    fn settle(&mut self, cancelled: bool) -> (Value, Value, Value) {
        let (mut started, mut removed, mut events) = (vec![], vec![], vec![]);
        for e in self.c.drain_events() {
            let id = self.ids[&e.ticket].clone();
            let kind = match e.kind {
                EventKind::Start => "start",
                EventKind::Timeout => "timeout",
                EventKind::Closed => "closed",
                EventKind::Cancelled => {
                    assert!(cancelled, "a cancel event outside a cancel step");
                    self.tickets.insert(id, Tk::Ended("cancelled"));
                    continue;
                }
            };
            if kind == "start" {
                started.push(json!(id));
                if !matches!(self.tickets.get(&id), Some(Tk::Queued(_))) {
                    // A submit that started: its ticket is already an invocation.
                    events.push(json!({"at": dur(e.at), "kind": kind, "id": id}));
                    continue;
                }
                let Some(Tk::Queued(t)) = self.tickets.remove(&id) else {
                    unreachable!()
                };
                let inv = t.wait_blocking().expect("a started ticket's wait succeeds");
                self.tickets.insert(id.clone(), Tk::Running(inv));
            } else {
                removed.push(json!({"id": id, "reason": kind}));
                let Some(Tk::Queued(t)) = self.tickets.remove(&id) else {
                    panic!("{id} removed but not queued")
                };
                let want = if kind == "timeout" {
                    AdmissionError::Timeout
                } else {
                    AdmissionError::Closed
                };
                assert_eq!(t.wait_blocking().err(), Some(want));
                self.tickets.insert(
                    id.clone(),
                    Tk::Ended(if kind == "timeout" {
                        "timeout"
                    } else {
                        "closed"
                    }),
                );
            }
            events.push(json!({"at": dur(e.at), "kind": kind, "id": id}));
        }
        (json!(started), json!(removed), json!(events))
    }

    fn state(&self) -> Value {
        let s = self.c.snapshot();
        assert_eq!(
            s.now,
            llm_bulkhead::coordinator::MonotonicClock::elapsed(&*self.clock)
        );
        let mut providers = Map::new();
        for (p, name) in s.providers.iter().zip(&self.providers) {
            providers.insert(
                name.clone(),
                json!({"inFlight": p.in_flight,
                       "coolingUntil": p.cooling_until.map(dur),
                       "pacedUntil": p.paced_until.map(dur)}),
            );
        }
        let running: Map<String, Value> = s
            .running
            .iter()
            .map(|(k, t)| (k.clone(), json!(self.ids[t])))
            .collect();
        json!({"now": dur(s.now), "closed": s.closed, "clientInFlight": s.client_in_flight,
               "providers": providers, "running": running,
               "queue": s.queue.iter().map(|t| json!(self.ids[t])).collect::<Vec<_>>()})
    }

    fn statuses(&self) -> Value {
        let m: Map<String, Value> = self
            .tickets
            .iter()
            .map(|(id, t)| {
                let s = match t {
                    Tk::Queued(_) => "queued",
                    Tk::Running(_) => "running",
                    Tk::Ended(s) => s,
                };
                (id.clone(), json!(s))
            })
            .collect();
        Value::Object(m)
    }
}

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
    let _: SystemTime = UNIX_EPOCH;
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
