//! Per-class shares as a simulated system: one store (the pure allocator on the store's
//! clock), three replicas on drifting clocks that renew with per-class use and demand, lose
//! replies, admit class work that lasts up to the admission deadline, crash, restart, get cut
//! off and healed, and a store that loses its data. After every step an independent tally of
//! the class work in flight across replicas (crashed replicas' work runs on to its deadline) is
//! checked against each class's global ceiling and the global limits, and the store's class
//! reservations against the class floors and ceilings (I2 per class).
//!
//! The checker can fail: with `LLM_BULKHEAD_CLUSTER_EARLY_CLASS_SHRINK=1` (feature `testing`)
//! the store counts another replica's class reservation as its grant alone, i.e. it applies a
//! class shrink before the replica confirmed it, and `class_work_stays_within_the_class_limits`
//! must fail (`.ci/run` checks that it does).

#[path = "support/cluster_sim.rs"]
mod cluster_sim;

use cluster_sim::{drifts, runner, DriftClock, REPLICAS};
use llm_bulkhead::cluster::{
    renew, reserved_class_totals, reserved_total, AllocError, Amounts, ClassParams, ClassShare,
    ClassUse, ClusterConfig, Lease, LeaseTable, RenewReply, RenewRequest, StoreParams,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::time::Duration;

const CLASSES: usize = 2;
const GLOBAL: Amounts = Amounts::new(10, 1_000);

/// Class `a`: floor 4 slots and 300 tokens, ceiling 6 and 600. Class `b`: floor 2 and 100, no
/// ceiling (the global limits).
fn classes() -> Vec<ClassParams> {
    vec![
        ClassParams {
            name: "a".into(),
            floor: Amounts::new(4, 300),
            ceiling: Amounts::new(6, 600),
            min: Amounts::new(0, 30),
        },
        ClassParams {
            name: "b".into(),
            floor: Amounts::new(2, 100),
            ceiling: GLOBAL,
            min: Amounts::new(0, 10),
        },
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Renew(usize),
    RenewLost(usize),
    Admit(usize, usize, u64, u64, u64),
    Wants(usize, usize, u64, u64),
    Crash(usize),
    Restart(usize),
    Cut(usize),
    Heal(usize),
    StoreLoss,
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS;
    let k = 0..CLASSES;
    prop_oneof![
        6 => (1u64..800).prop_map(Op::Advance),
        7 => r.clone().prop_map(Op::Renew),
        1 => r.clone().prop_map(Op::RenewLost),
        7 => (r.clone(), k.clone(), 1u64..3, 0u64..200, 1u64..=100)
            .prop_map(|(i, k, s, t, l)| Op::Admit(i, k, s, t, l)),
        3 => (r.clone(), k, 0u64..=10, 0u64..=1_000).prop_map(|(i, k, s, t)| Op::Wants(i, k, s, t)),
        1 => r.clone().prop_map(Op::Crash),
        1 => r.clone().prop_map(Op::Restart),
        1 => r.clone().prop_map(Op::Cut),
        1 => r.prop_map(Op::Heal),
        1 => Just(Op::StoreLoss),
    ]
}

fn config() -> ClusterConfig {
    let c = ClusterConfig::new("classes", "b")
        .ttl(Duration::from_millis(1_000))
        .max_admission(Duration::from_millis(1_500))
        .floor(Amounts::new(2, 100))
        .floor_hold(Duration::from_millis(300));
    let q = c.needed_quarantine_ms();
    c.quarantine(Duration::from_millis(q))
}

fn params(c: &ClusterConfig) -> StoreParams {
    StoreParams {
        classes: classes(),
        ..c.store_params(GLOBAL)
    }
}

struct Replica {
    id: String,
    generation: u32,
    alive: bool,
    connected: bool,
    lease: Lease,
    drift_ppm: i64,
    offset: u64,
    wants: [Amounts; CLASSES],
}

impl Replica {
    fn local(&self, t: u64) -> u64 {
        self.clock().local(t)
    }

    fn true_span(&self, local_ms: u64) -> u64 {
        self.clock().true_span(local_ms)
    }

    fn clock(&self) -> DriftClock {
        DriftClock {
            offset: self.offset,
            drift_ppm: self.drift_ppm,
        }
    }

    fn class_shares(&self, t: u64) -> Vec<ClassShare> {
        self.lease
            .class_shares_at(self.local(t))
            .expect("fail-closed configuration")
    }
}

/// One admission of the tally: raised when the replica admitted it, dropped at its end.
struct Work {
    replica: usize,
    generation: u32,
    class: usize,
    amount: Amounts,
    ends: u64,
}

struct Sim {
    c: ClusterConfig,
    p: StoreParams,
    t: u64,
    table: LeaseTable,
    replicas: Vec<Replica>,
    work: Vec<Work>,
    /// Whether renewals check the store's reservations (I2); off, only the tally checks.
    check_i2: bool,
}

fn sum<'a>(w: impl Iterator<Item = &'a Work>) -> Amounts {
    w.fold(Amounts::ZERO, |s, w| {
        Amounts::new(s.slots + w.amount.slots, s.tokens + w.amount.tokens)
    })
}

impl Sim {
    fn new(c: ClusterConfig, drifts: [i64; REPLICAS]) -> Self {
        let p = params(&c);
        let replicas = (0..REPLICAS)
            .map(|i| Replica {
                id: format!("r{i}-0"),
                generation: 0,
                alive: true,
                connected: true,
                lease: Lease::new(&c, GLOBAL),
                drift_ppm: drifts[i],
                offset: 1_000 * i as u64,
                wants: [Amounts::new(2, 200), Amounts::new(1, 100)],
            })
            .collect();
        Sim {
            c,
            p,
            t: 0,
            table: LeaseTable::default(),
            replicas,
            work: Vec::new(),
            check_i2: true,
        }
    }

    /// Replica `i`'s own work in flight (this generation), of class `k` or of all classes.
    fn held(&self, i: usize, k: Option<usize>) -> Amounts {
        let g = self.replicas[i].generation;
        sum(self
            .work
            .iter()
            .filter(|w| w.replica == i && w.generation == g && k.is_none_or(|k| w.class == k)))
    }

    fn request(&self, i: usize) -> RenewRequest {
        let r = &self.replicas[i];
        let sent = r.local(self.t);
        let installed = r.class_shares(self.t);
        let uses = self
            .p
            .classes
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let at = installed.get(k).copied().unwrap_or(ClassShare::ZERO);
                ClassUse::new(
                    &c.name,
                    at,
                    self.held(i, Some(k)),
                    r.wants[k].min(c.ceiling),
                )
            })
            .collect();
        let total = r.wants.iter().fold(Amounts::ZERO, |s, w| {
            Amounts::new(s.slots + w.slots, s.tokens + w.tokens)
        });
        r.lease
            .request(&r.id, r.lease.share_at(sent), self.held(i, None), total)
            .with_classes(uses)
    }

    fn renew(&mut self, i: usize, delivered: bool) -> Result<(), String> {
        let r = &self.replicas[i];
        if !r.alive || !r.connected {
            return Ok(());
        }
        let sent = r.local(self.t);
        let req = self.request(i);
        let reply: RenewReply =
            renew(&mut self.table, &self.p, &req, self.t).map_err(|e| e.to_string())?;
        if delivered {
            self.replicas[i].lease.on_reply(sent, &reply);
        }
        if !self.check_i2 {
            return Ok(());
        }
        self.check_store()
    }

    /// I2, whole and per class, on the store's table.
    fn check_store(&self) -> Result<(), String> {
        let total = reserved_total(&self.table, &self.p, self.t);
        if !total.fits_in(GLOBAL) {
            return Err(format!("I2: reserved {total:?} > {GLOBAL:?} at {}", self.t));
        }
        let per = reserved_class_totals(&self.table, &self.p, self.t);
        for (c, r) in self.p.classes.iter().zip(&per) {
            if !r.floor.fits_in(c.floor) {
                return Err(format!(
                    "I2 class {}: floors {:?} > {:?}",
                    c.name, r.floor, c.floor
                ));
            }
            let bounded = Amounts::new(
                if c.ceiling.slots < GLOBAL.slots {
                    r.ceiling.slots
                } else {
                    0
                },
                if c.ceiling.tokens < GLOBAL.tokens {
                    r.ceiling.tokens
                } else {
                    0
                },
            );
            if !bounded.fits_in(c.ceiling) {
                return Err(format!(
                    "I2 class {}: ceilings {:?} > {:?}",
                    c.name, r.ceiling, c.ceiling
                ));
            }
        }
        Ok(())
    }

    /// I3 on the tally, whole and per class.
    fn check_tally(&self, i: usize) -> Result<(), String> {
        let total = sum(self.work.iter());
        if !total.fits_in(GLOBAL) {
            return Err(format!(
                "I3: {total:?} in flight > {GLOBAL:?} at {} (replica {i})",
                self.t
            ));
        }
        for (k, c) in self.p.classes.iter().enumerate() {
            let n = sum(self.work.iter().filter(|w| w.class == k));
            if !n.fits_in(c.ceiling) {
                return Err(format!(
                    "I3 class {}: {n:?} in flight > ceiling {:?} at {} (replica {i})",
                    c.name, c.ceiling, self.t
                ));
            }
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Advance(d) => {
                self.t += d;
                let t = self.t;
                self.work.retain(|w| w.ends > t);
            }
            Op::Renew(i) => self.renew(i, true)?,
            Op::RenewLost(i) => self.renew(i, false)?,
            Op::Admit(i, k, slots, tokens, life_pct) => {
                let r = &self.replicas[i];
                if !r.alive {
                    return Ok(());
                }
                let amount = Amounts::new(slots, tokens);
                let add = |a: Amounts| Amounts::new(a.slots + slots, a.tokens + tokens);
                // The replica's own limits: its share, and its class ceiling (within the share,
                // as the agent installs it).
                let share = r.lease.share_at(r.local(self.t));
                let class = r
                    .class_shares(self.t)
                    .get(k)
                    .copied()
                    .unwrap_or(ClassShare::ZERO);
                if !add(self.held(i, None)).fits_in(share)
                    || !add(self.held(i, Some(k))).fits_in(class.ceiling.min(share))
                {
                    return Ok(());
                }
                let d = u64::try_from(self.c.max_admission.as_millis()).unwrap();
                let ends = self.t + r.true_span(d * life_pct / 100).max(1);
                self.work.push(Work {
                    replica: i,
                    generation: r.generation,
                    class: k,
                    amount,
                    ends,
                });
                self.check_tally(i)?;
            }
            Op::Wants(i, k, s, t) => self.replicas[i].wants[k] = Amounts::new(s, t),
            Op::Crash(i) => self.replicas[i].alive = false,
            Op::Restart(i) => {
                let r = &mut self.replicas[i];
                if !r.alive {
                    r.generation += 1;
                    r.id = format!("r{i}-{}", r.generation);
                    r.alive = true;
                    r.connected = true;
                    r.lease = Lease::new(&self.c, GLOBAL);
                }
            }
            Op::Cut(i) => self.replicas[i].connected = false,
            Op::Heal(i) => self.replicas[i].connected = true,
            Op::StoreLoss => self.table = LeaseTable::default(),
        }
        Ok(())
    }
}

fn run(drifts: [i64; REPLICAS], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(config(), drifts);
    for (n, op) in ops.iter().enumerate() {
        sim.step(op)
            .map_err(|e| TestCaseError::fail(format!("step {n} {op:?}: {e}")))?;
    }
    Ok(())
}

/// Bounded: 300 cases of up to 400 steps, a few seconds.
#[test]
fn class_work_stays_within_the_class_limits() {
    config().validate().unwrap();
    let strategy = (drifts(), prop::collection::vec(op(), 1..400));
    runner(300, 256)
        .run(&strategy, |(d, ops)| run(d, &ops))
        .unwrap();
}

/// Class shares follow class demand: with stable demand and everyone renewing, each replica's
/// class floor and ceiling converge to the class's demand-weighted fair share.
#[test]
fn class_shares_follow_class_demand() {
    let mut sim = Sim::new(config(), [0; REPLICAS]);
    // Class a: replica 0 wants 5 slots, the others 1; class b: replica 2 wants 4.
    sim.replicas[0].wants = [Amounts::new(5, 500), Amounts::ZERO];
    sim.replicas[1].wants = [Amounts::new(1, 100), Amounts::ZERO];
    sim.replicas[2].wants = [Amounts::new(1, 0), Amounts::new(4, 100)];
    sim.step(&Op::Renew(0)).unwrap();
    sim.step(&Op::Advance(sim.p.hold_ms() + 1)).unwrap();
    for _ in 0..3 {
        for i in 0..REPLICAS {
            sim.step(&Op::Renew(i)).unwrap();
        }
        sim.step(&Op::Advance(10)).unwrap();
    }
    let a: Vec<ClassShare> = (0..REPLICAS)
        .map(|i| sim.replicas[i].class_shares(sim.t)[0])
        .collect();
    // Class a, slots: floor 4, demands (per-replica floor 0) 5, 1, 1 = 7 > 4: max-min level
    // 2, so 2, 1, 1. Ceiling 6: 7 > 6, level 4, so 4, 1, 1. Tokens: floor 300, demands 500,
    // 100, 30 (0 raised to the per-replica floor 30): level 170, so 170, 100, 30; ceiling 600:
    // 630 > 600, level 470, so 470, 100, 30. Three rounds: the first grant shrinks only once
    // its replica reported the smaller share installed.
    assert_eq!(
        a.iter()
            .map(|s| (s.floor.slots, s.ceiling.slots))
            .collect::<Vec<_>>(),
        vec![(2, 4), (1, 1), (1, 1)],
        "{a:?}"
    );
    assert_eq!(
        a.iter()
            .map(|s| (s.floor.tokens, s.ceiling.tokens))
            .collect::<Vec<_>>(),
        vec![(170, 470), (100, 100), (30, 30)],
        "{a:?}"
    );
    // Class b: floor 2 slots, demands 0, 0, 4: 4 > 2, level 2 → 0, 0, 2.
    let b: Vec<u64> = (0..REPLICAS)
        .map(|i| sim.replicas[i].class_shares(sim.t)[1].floor.slots)
        .collect();
    assert_eq!(b, vec![0, 0, 2]);
    sim.check_store().unwrap();
}

/// Bad class input is refused with a typed error and changes nothing: a class the store does
/// not know, a class demand above the class ceiling, class limits that do not fit the global
/// ones, a table created with other classes.
#[test]
fn bad_class_input_is_refused_and_changes_nothing() {
    let c = config();
    let p = params(&c);
    let mut table = LeaseTable::default();
    let use_of =
        |name: &str, wants: Amounts| ClassUse::new(name, ClassShare::ZERO, Amounts::ZERO, wants);
    let good = || vec![use_of("a", Amounts::new(1, 0)), use_of("b", Amounts::ZERO)];
    let req = |classes: Vec<ClassUse>| {
        RenewRequest::new("r", Amounts::ZERO, Amounts::ZERO, Amounts::new(1, 0))
            .with_classes(classes)
    };
    renew(&mut table, &p, &req(good()), 0).unwrap();
    let before = table.clone();
    let cases: Vec<(&str, StoreParams, RenewRequest, AllocError)> = vec![
        (
            "an unknown class name",
            p.clone(),
            req(vec![
                use_of("a", Amounts::ZERO),
                use_of("zz", Amounts::ZERO),
            ]),
            AllocError::UnknownClass,
        ),
        (
            "a class missing",
            p.clone(),
            req(vec![use_of("a", Amounts::ZERO)]),
            AllocError::UnknownClass,
        ),
        (
            "classes out of order",
            p.clone(),
            req(vec![use_of("b", Amounts::ZERO), use_of("a", Amounts::ZERO)]),
            AllocError::UnknownClass,
        ),
        (
            "a class name the store cannot hold",
            StoreParams {
                classes: vec![ClassParams {
                    name: "a b".into(),
                    ..classes()[0].clone()
                }],
                ..p.clone()
            },
            req(vec![use_of("a b", Amounts::ZERO)]),
            AllocError::UnknownClass,
        ),
        (
            "a class demand above its ceiling",
            p.clone(),
            req(vec![
                use_of("a", Amounts::new(7, 0)),
                use_of("b", Amounts::ZERO),
            ]),
            AllocError::AboveClassLimit,
        ),
        (
            "a class ceiling above the global limit",
            StoreParams {
                classes: vec![ClassParams {
                    ceiling: Amounts::new(11, 0),
                    ..classes()[0].clone()
                }],
                ..p.clone()
            },
            req(vec![use_of("a", Amounts::ZERO)]),
            AllocError::AboveGlobal,
        ),
        (
            "class floors above the global limit",
            StoreParams {
                classes: vec![
                    ClassParams {
                        floor: Amounts::new(6, 0),
                        ceiling: GLOBAL,
                        min: Amounts::ZERO,
                        name: "a".into(),
                    },
                    ClassParams {
                        floor: Amounts::new(6, 0),
                        ceiling: GLOBAL,
                        min: Amounts::ZERO,
                        name: "b".into(),
                    },
                ],
                ..p.clone()
            },
            req(good()),
            AllocError::AboveGlobal,
        ),
        (
            "another class table",
            StoreParams {
                classes: vec![ClassParams {
                    name: "c".into(),
                    ..classes()[0].clone()
                }],
                ..p.clone()
            },
            req(vec![use_of("c", Amounts::ZERO)]),
            AllocError::UnknownClass,
        ),
        (
            "other class limits",
            StoreParams {
                classes: vec![
                    ClassParams {
                        floor: Amounts::new(3, 300),
                        ..classes()[0].clone()
                    },
                    classes()[1].clone(),
                ],
                ..p.clone()
            },
            req(good()),
            AllocError::ConfigMismatch,
        ),
    ];
    for (name, p, req, want) in cases {
        assert_eq!(renew(&mut table, &p, &req, 10), Err(want), "{name}");
        assert_eq!(table, before, "{name}: the table changed");
    }
}

/// A class shrink waits for the replica: replica 0 holds 2 slots of class `a` (ceiling 6) when
/// its class demand drops and the others' rises. The store keeps replica 0's class reservation
/// at its work in flight until it confirms, so the others' class ceilings sum to 4 and the
/// tally of class `a` stays at 6. Only the tally checks here (I2 off): with
/// `LLM_BULKHEAD_CLUSTER_EARLY_CLASS_SHRINK=1` the others get 3 each and admit 8 of 6.
#[test]
fn a_class_shrink_waits_for_the_replica() {
    let mut sim = Sim::new(config(), [0; REPLICAS]);
    sim.check_i2 = false;
    sim.step(&Op::Renew(0)).unwrap();
    sim.step(&Op::Advance(sim.p.hold_ms() + 1)).unwrap();
    let rounds = |sim: &mut Sim| {
        for _ in 0..3 {
            for i in 0..REPLICAS {
                sim.step(&Op::Renew(i)).unwrap();
            }
            sim.step(&Op::Advance(10)).unwrap();
        }
    };
    rounds(&mut sim);
    assert_eq!(sim.replicas[0].class_shares(sim.t)[0].ceiling.slots, 2);
    // Replica 0 fills its class-a ceiling with long work.
    sim.step(&Op::Admit(0, 0, 2, 0, 100)).unwrap();
    assert_eq!(sim.held(0, Some(0)).slots, 2);
    sim.replicas[0].wants = [Amounts::ZERO, Amounts::new(1, 0)];
    for i in 1..REPLICAS {
        sim.replicas[i].wants = [Amounts::new(6, 0), Amounts::new(1, 0)];
    }
    rounds(&mut sim);
    // The others admit class-a work while their leases allow it; each admission checks the
    // tally against the class ceiling.
    for i in 1..REPLICAS {
        for _ in 0..6 {
            sim.step(&Op::Admit(i, 0, 1, 0, 100)).unwrap();
        }
    }
    let a = sim
        .work
        .iter()
        .filter(|w| w.class == 0)
        .map(|w| w.amount.slots)
        .sum::<u64>();
    assert_eq!(a, 6, "the class ceiling is used, not exceeded");
}
