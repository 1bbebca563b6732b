//! The coordinator against a plain sequential model of COORDINATOR.md (§2–§6), written
//! independently of the engine: proptest drives both with the same random schedules
//! (submits, completions, cancels, cooldowns, advances, wall-clock jumps, close) and demands
//! identical results, starts, removals and snapshots after every step, and checks the
//! invariants on the model's ticket table and start log: no key runs twice, the client and
//! provider limits hold, FIFO among eligible tickets, no queued ticket is eligible after a
//! step, pacing and cooldown respected, and everything back to zero at rest.

#[path = "coordinator_scenarios/driver.rs"]
mod driver;

use driver::Run;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
struct MProv {
    name: String,
    limit: Option<u32>,
    min: u64,
    inflight: u32,
    last: Option<u64>,
    nb: Option<u64>,
}

#[derive(Clone, Debug)]
struct MTicket {
    id: String,
    p: usize,
    key: String,
    deadline: Option<u64>,
}

/// The sequential model: COORDINATOR.md read literally.
#[derive(Clone, Debug)]
struct Model {
    t: u64,
    closed: bool,
    c: u32,
    q: usize,
    provs: Vec<MProv>,
    inflight: u32,
    running: BTreeMap<String, (String, usize)>,
    queue: Vec<MTicket>,
    status: BTreeMap<String, &'static str>,
    /// (ticket, provider, instant) of every start, for the invariants.
    starts: Vec<(String, usize, u64)>,
}

impl Model {
    fn new(cfg: &Value) -> Model {
        Model {
            t: cfg["elapsedStart"].as_u64().unwrap(),
            closed: false,
            c: cfg["clientLimit"].as_u64().unwrap() as u32,
            q: cfg["queueCap"].as_u64().unwrap() as usize,
            provs: cfg["providers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| MProv {
                    name: p["name"].as_str().unwrap().into(),
                    limit: p["limit"].as_u64().map(|l| l as u32),
                    min: p["minInterval"].as_u64().unwrap(),
                    inflight: 0,
                    last: None,
                    nb: None,
                })
                .collect(),
            inflight: 0,
            running: BTreeMap::new(),
            queue: vec![],
            status: BTreeMap::new(),
            starts: vec![],
        }
    }

    fn ready_at(&self, p: usize) -> Option<u64> {
        let p = &self.provs[p];
        let paced = if p.min > 0 {
            p.last.map(|l| l + p.min)
        } else {
            None
        };
        [p.nb, paced].into_iter().flatten().max()
    }

    fn eligible(&self, p: usize, key: &str) -> bool {
        let pr = &self.provs[p];
        self.inflight < self.c
            && pr.limit.is_none_or(|l| pr.inflight < l)
            && self.ready_at(p).is_none_or(|r| self.t >= r)
            && !self.running.contains_key(key)
    }

    fn start(&mut self, x: MTicket, started: &mut Vec<String>) {
        self.inflight += 1;
        self.provs[x.p].inflight += 1;
        self.provs[x.p].last = Some(self.t);
        self.running.insert(x.key.clone(), (x.id.clone(), x.p));
        self.status.insert(x.id.clone(), "running");
        self.starts.push((x.id.clone(), x.p, self.t));
        started.push(x.id);
    }

    fn settle(&mut self, started: &mut Vec<String>, removed: &mut Vec<Value>) {
        let mut i = 0;
        while i < self.queue.len() {
            if self.eligible(self.queue[i].p, &self.queue[i].key) {
                // I6: every ticket ahead of it is ineligible now.
                for ahead in &self.queue[..i] {
                    assert!(!self.eligible(ahead.p, &ahead.key), "FIFO among eligible");
                }
                let x = self.queue.remove(i);
                self.start(x, started);
            } else {
                i += 1;
            }
        }
        let t = self.t;
        let (gone, stay): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|x| x.deadline.is_some_and(|d| d <= t));
        self.queue = stay;
        for x in gone {
            self.status.insert(x.id.clone(), "timeout");
            removed.push(json!({"id": x.id, "reason": "timeout"}));
        }
    }

    fn prov(&self, name: &str) -> Option<usize> {
        self.provs.iter().position(|p| p.name == name)
    }

    fn step(&mut self, s: &Value) -> (Value, Vec<String>, Vec<Value>) {
        let (mut st, mut rm) = (vec![], vec![]);
        let r = match s["op"].as_str().unwrap() {
            "submit" => {
                let id = s["id"].as_str().unwrap().to_owned();
                let key = s["key"].as_str().unwrap().to_owned();
                match self.prov(s["provider"].as_str().unwrap()) {
                    None => {
                        self.status.insert(id, "unknown_provider");
                        "unknown_provider"
                    }
                    Some(_) if self.closed => {
                        self.status.insert(id, "closed");
                        "closed"
                    }
                    Some(p) => {
                        self.settle(&mut st, &mut rm);
                        assert!(
                            st.is_empty() && rm.is_empty(),
                            "C1: settled between operations"
                        );
                        let deadline = s["admissionTimeout"].as_u64().map(|d| self.t + d);
                        let x = MTicket {
                            id: id.clone(),
                            p,
                            key,
                            deadline,
                        };
                        if self.eligible(p, &x.key) {
                            self.start(x, &mut st);
                            "started"
                        } else if self.queue.len() < self.q {
                            self.queue.push(x);
                            self.status.insert(id, "queued");
                            "queued"
                        } else {
                            self.status.insert(id, "overflow");
                            "overflow"
                        }
                    }
                }
            }
            "complete" => {
                let id = s["id"].as_str().unwrap();
                let key = self
                    .running
                    .iter()
                    .find(|(_, v)| v.0 == id)
                    .map(|(k, _)| k.clone())
                    .expect("complete names a running ticket");
                let (_, p) = self.running.remove(&key).unwrap();
                self.inflight -= 1;
                self.provs[p].inflight -= 1;
                self.status.insert(id.to_owned(), "completed");
                self.settle(&mut st, &mut rm);
                "ok"
            }
            "cancel" => {
                let id = s["id"].as_str().unwrap();
                match self.status.get(id).copied() {
                    Some("queued") => {
                        self.queue.retain(|x| x.id != id);
                        self.status.insert(id.to_owned(), "cancelled");
                        "cancelled"
                    }
                    Some("running") => "running",
                    _ => "noop",
                }
            }
            "cooldown" => match self.prov(s["provider"].as_str().unwrap()) {
                None => "unknown_provider",
                Some(p) => {
                    let until = self.t + s["delay"].as_u64().unwrap();
                    let pr = &mut self.provs[p];
                    pr.nb = Some(pr.nb.map_or(until, |nb| nb.max(until)));
                    self.settle(&mut st, &mut rm);
                    "ok"
                }
            },
            "advance" => {
                let end = self.t + s["ms"].as_u64().unwrap();
                loop {
                    let mut next: Option<u64> = None;
                    for x in &self.queue {
                        for at in [x.deadline, self.ready_at(x.p)].into_iter().flatten() {
                            if at > self.t && at <= end && next.is_none_or(|n| at < n) {
                                next = Some(at);
                            }
                        }
                    }
                    let Some(n) = next else { break };
                    self.t = n;
                    self.settle(&mut st, &mut rm);
                }
                self.t = end;
                self.settle(&mut st, &mut rm);
                "ok"
            }
            "wall" => "ok",
            "close" => {
                self.closed = true;
                for x in std::mem::take(&mut self.queue) {
                    self.status.insert(x.id.clone(), "closed");
                    rm.push(json!({"id": x.id, "reason": "closed"}));
                }
                "ok"
            }
            op => panic!("{op}"),
        };
        self.check();
        (json!(r), st, rm)
    }

    /// §6, counted from the ticket table and the start log as well as the counters.
    fn check(&self) {
        let running: Vec<&String> = self
            .status
            .iter()
            .filter(|(_, s)| **s == "running")
            .map(|(k, _)| k)
            .collect();
        assert_eq!(running.len() as u32, self.inflight, "I1");
        assert!(self.inflight <= self.c, "I1");
        assert_eq!(self.running.len(), running.len(), "I3");
        for (i, p) in self.provs.iter().enumerate() {
            let n = self.running.values().filter(|v| v.1 == i).count() as u32;
            assert_eq!(n, p.inflight, "I2");
            assert!(p.limit.is_none_or(|l| n <= l), "I2");
        }
        assert!(self.queue.len() <= self.q, "I4");
        for x in &self.queue {
            assert!(
                !self.eligible(x.p, &x.key),
                "I5: {} is eligible and queued",
                x.id
            );
        }
        assert!(!self.closed || self.queue.is_empty(), "I10");
        for (i, p) in self.provs.iter().enumerate() {
            let times: Vec<u64> = self
                .starts
                .iter()
                .filter(|s| s.1 == i)
                .map(|s| s.2)
                .collect();
            for w in times.windows(2) {
                assert!(w[1] - w[0] >= p.min, "I8");
            }
        }
    }

    fn snapshot(&self) -> Value {
        let mut providers = Map::new();
        for (i, p) in self.provs.iter().enumerate() {
            let later = |x: Option<u64>| x.filter(|&a| a > self.t);
            let paced = if p.min > 0 {
                p.last.map(|l| l + p.min)
            } else {
                None
            };
            let _ = i;
            providers.insert(
                p.name.clone(),
                json!({"inFlight": p.inflight, "coolingUntil": later(p.nb), "pacedUntil": later(paced)}),
            );
        }
        let running: Map<String, Value> = self
            .running
            .iter()
            .map(|(k, v)| (k.clone(), json!(v.0)))
            .collect();
        json!({"now": self.t, "closed": self.closed, "clientInFlight": self.inflight,
               "providers": providers, "running": running,
               "queue": self.queue.iter().map(|x| json!(x.id)).collect::<Vec<_>>()})
    }
}

/// One random operation, resolved against the model's state when it names a ticket.
#[derive(Clone, Debug)]
enum Op {
    Submit { p: u8, key: u8, timeout: Option<u8> },
    Complete(u8),
    Cancel(u8),
    Cooldown { p: u8, delay: u8 },
    Advance(u8),
    Wall(i16),
    Close,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, 0..4u8, prop::option::of(prop_oneof![1..60u8, (1..6u8).prop_map(|x| x * 10)])).prop_map(|(p, key, timeout)| Op::Submit { p, key, timeout }),
        4 => any::<u8>().prop_map(Op::Complete),
        1 => any::<u8>().prop_map(Op::Cancel),
        1 => (0..3u8, prop_oneof![0..80u8, (0..8u8).prop_map(|x| x * 10)]).prop_map(|(p, delay)| Op::Cooldown { p, delay }),
        3 => prop_oneof![0..60u8, (0..6u8).prop_map(|x| x * 10)].prop_map(Op::Advance),
        1 => any::<i16>().prop_map(Op::Wall),
        1 => Just(Op::Close).prop_filter("close is rare", |_| true),
    ]
}

fn config() -> impl Strategy<Value = Value> {
    (1..4u32, 0..4u32, prop::option::of(1..3u32), 0..3u64, 0..1000u64).prop_map(
        |(c, q, la, pace, e0)| {
            json!({"clientLimit": c, "queueCap": q, "elapsedStart": e0, "wallStart": 1_700_000_000_000u64,
                   "providers": [
                       {"name": "a", "limit": la, "minInterval": 0},
                       {"name": "b", "limit": 1, "minInterval": pace * 10},
                   ]})
        },
    )
}

fn to_step(op: &Op, m: &Model, n: &mut u32) -> Value {
    let names = ["a", "b", "zz"];
    match op {
        Op::Submit { p, key, timeout } => {
            *n += 1;
            json!({"op": "submit", "id": format!("t{n}"), "provider": names[*p as usize],
                   "key": format!("k{key}"), "admissionTimeout": timeout})
        }
        Op::Complete(i) => {
            let running: Vec<&String> = m.running.values().map(|v| &v.0).collect();
            if running.is_empty() {
                return json!({"op": "advance", "ms": 0});
            }
            json!({"op": "complete", "id": running[*i as usize % running.len()]})
        }
        Op::Cancel(i) => {
            let ids: Vec<&String> = m.status.keys().collect();
            if ids.is_empty() {
                return json!({"op": "wall", "delta": 5});
            }
            json!({"op": "cancel", "id": ids[*i as usize % ids.len()]})
        }
        Op::Cooldown { p, delay } => {
            json!({"op": "cooldown", "provider": names[*p as usize], "delay": delay})
        }
        Op::Advance(ms) => json!({"op": "advance", "ms": ms}),
        Op::Wall(d) => json!({"op": "wall", "delta": d}),
        Op::Close => json!({"op": "close"}),
    }
}

/// One step on the model and the coordinator, outcomes compared by the final checks only.
fn both(m: &mut Model, run: &mut Run, s: Value) {
    m.step(&s);
    run.step(&s);
    run.settle(false);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_coordinator_makes_the_models_decisions(cfg in config(), ops in prop::collection::vec(op(), 1..60)) {
        let mut m = Model::new(&cfg);
        let mut run = Run::new(&cfg);
        let mut n = 0;
        for (i, o) in ops.iter().enumerate() {
            // Close rarely: only as one of the last few operations.
            if matches!(o, Op::Close) && i + 5 < ops.len() {
                continue;
            }
            let s = to_step(o, &m, &mut n);
            let (want_r, want_st, want_rm) = m.step(&s);
            let got_r = run.step(&s);
            let (got_st, got_rm, _) = run.settle(s["op"] == "cancel");
            prop_assert_eq!(&got_r, &want_r, "step {} {}: result", i, s);
            prop_assert_eq!(&got_st, &json!(want_st), "step {} {}: started", i, s);
            prop_assert_eq!(&got_rm, &json!(want_rm), "step {} {}: removed", i, s);
            prop_assert_eq!(run.state(), m.snapshot(), "step {} {}: state", i, s);
        }
        // At rest: complete everything running, let every deadline pass (queued tickets
        // start or time out), complete again; the client is back to zero.
        for round in 0..4 {
            if round > 0 {
                both(&mut m, &mut run, json!({"op": "advance", "ms": 200}));
            }
            let running: Vec<String> = m.running.values().map(|v| v.0.clone()).collect();
            for id in running {
                both(&mut m, &mut run, json!({"op": "complete", "id": id}));
            }
        }
        let snap = run.state();
        prop_assert_eq!(&snap, &m.snapshot());
        prop_assert_eq!(&snap["clientInFlight"], &json!(0));
        prop_assert_eq!(&snap["running"], &json!({}));
        prop_assert_eq!(run.statuses(), json!(m.status.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<Map<String, Value>>()));
    }
}
