//! The coordinator driven by scenario steps (COORDINATOR-SCENARIOS.md §3): shared by the
//! scenario replay and the model-based property test.

use llm_bulkhead::coordinator::testing::{ManualClock, ManualScheduler, ManualWallClock};
use llm_bulkhead::coordinator::{
    AdmissionError, Clocks, Coordinator, CoordinatorError, EventKind, Invocation, ProviderLimits,
    SubmitOptions, Ticket, TicketId,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

fn ms(v: &Value) -> u64 {
    v.as_u64().expect("a non-negative integer")
}

fn dur(d: Duration) -> Value {
    json!(d.as_millis() as u64)
}

pub enum Tk {
    Queued(Ticket<String>),
    Running(Invocation<String>),
    Ended(&'static str),
}

pub struct Run {
    pub c: Coordinator<String>,
    pub clock: Arc<ManualClock>,
    wall: Arc<ManualWallClock>,
    sched: Arc<ManualScheduler>,
    tickets: BTreeMap<String, Tk>,
    ids: HashMap<TicketId, String>,
    providers: Vec<String>,
}

impl Run {
    pub fn new(cfg: &Value) -> Run {
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

    pub fn step(&mut self, s: &Value) -> Value {
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
    pub fn settle(&mut self, cancelled: bool) -> (Value, Value, Value) {
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

    pub fn state(&self) -> Value {
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

    pub fn statuses(&self) -> Value {
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
