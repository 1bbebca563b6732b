//! The cluster allocator and the replica-side lease as a simulated system: one store (the pure
//! allocator on the store's clock), three replicas on drifting clocks that renew, lose replies,
//! get replies late, admit work that lasts up to the admission deadline, crash, restart, get
//! cut off and healed, and a store that loses all its data. An independent tally of the work
//! admitted across replicas (crashed replicas' work runs on to its deadline) is checked against
//! the global limits after every step, and so is the store's reserved total (I2).
//!
//! The checker can fail: a quarantine shorter than the longest admission must make it find an
//! overshoot (`a_quarantine_shorter_than_an_admission_is_caught`).

#[path = "support/cluster_config.rs"]
mod cluster_config;
#[path = "support/cluster_sim.rs"]
mod cluster_sim;

use cluster_sim::{drifts, runner, DriftClock, REPLICAS};

use llm_bulkhead::cluster::{
    renew, reserved_total, Amounts, ClusterConfig, Lease, LeaseTable, StoreParams,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::time::Duration;

const GLOBAL: Amounts = Amounts::new(10, 1_000);

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Renew(usize),
    RenewLost(usize),
    RenewLate(usize, u64),
    Admit(usize, u64, u64, u64),
    Wants(usize, u64, u64),
    Crash(usize),
    Restart(usize),
    Cut(usize),
    Heal(usize),
    StoreLoss,
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..REPLICAS;
    prop_oneof![
        6 => (1u64..800).prop_map(Op::Advance),
        6 => r.clone().prop_map(Op::Renew),
        1 => r.clone().prop_map(Op::RenewLost),
        1 => (r.clone(), 1u64..300).prop_map(|(i, d)| Op::RenewLate(i, d)),
        6 => (r.clone(), 1u64..4, 0u64..300, 1u64..=100).prop_map(|(i, s, t, l)| Op::Admit(i, s, t, l)),
        2 => (r.clone(), 0u64..=10, 0u64..=1_000).prop_map(|(i, s, t)| Op::Wants(i, s, t)),
        1 => r.clone().prop_map(Op::Crash),
        1 => r.clone().prop_map(Op::Restart),
        1 => r.clone().prop_map(Op::Cut),
        1 => r.prop_map(Op::Heal),
        1 => Just(Op::StoreLoss),
    ]
}

fn config() -> ClusterConfig {
    ClusterConfig::new("model", "b")
        .ttl(Duration::from_millis(1_000))
        .max_admission(Duration::from_millis(1_500))
        .floor(Amounts::new(2, 100))
        .floor_hold(Duration::from_millis(300))
}

/// A valid configuration: the shortest quarantine `validate` accepts.
fn good() -> ClusterConfig {
    let c = config();
    let q = c.needed_quarantine_ms();
    let c = c.quarantine(Duration::from_millis(q));
    c.validate().unwrap();
    c
}

struct Replica {
    id: String,
    generation: u32,
    alive: bool,
    connected: bool,
    lease: Lease,
    drift_ppm: i64,
    offset: u64,
    wants: Amounts,
    /// A reply on its way: (delivery at store time, local send time, reply).
    late: Option<(u64, u64, llm_bulkhead::cluster::RenewReply)>,
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
}

struct Work {
    replica: usize,
    generation: u32,
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
}

impl Sim {
    fn new(c: ClusterConfig, drifts: [i64; REPLICAS]) -> Self {
        let p = c.store_params(GLOBAL);
        let replicas = (0..REPLICAS)
            .map(|i| Replica {
                id: format!("r{i}-0"),
                generation: 0,
                alive: true,
                connected: true,
                lease: Lease::new(&c, GLOBAL),
                drift_ppm: drifts[i],
                offset: 1_000 * i as u64,
                wants: Amounts::new(4, 400),
                late: None,
            })
            .collect();
        Sim {
            c,
            p,
            t: 0,
            table: LeaseTable::default(),
            replicas,
            work: Vec::new(),
        }
    }

    fn held(&self, i: usize) -> Amounts {
        let r = &self.replicas[i];
        self.work
            .iter()
            .filter(|w| w.replica == i && w.generation == r.generation)
            .fold(Amounts::ZERO, |s, w| {
                Amounts::new(s.slots + w.amount.slots, s.tokens + w.amount.tokens)
            })
    }

    fn in_flight(&self) -> Amounts {
        self.work.iter().fold(Amounts::ZERO, |s, w| {
            Amounts::new(s.slots + w.amount.slots, s.tokens + w.amount.tokens)
        })
    }

    /// Sends a renewal; `delivery`: None = lost, Some(d) = after `d` ms.
    fn renew(&mut self, i: usize, delivery: Option<u64>) -> Result<(), String> {
        let held = self.held(i);
        let r = &mut self.replicas[i];
        if !r.alive || !r.connected || r.late.is_some() {
            return Ok(());
        }
        let sent = r.local(self.t);
        let req = r
            .lease
            .request(&r.id, r.lease.share_at(sent), held, r.wants);
        let reply = renew(&mut self.table, &self.p, &req, self.t).map_err(|e| e.to_string())?;
        match delivery {
            Some(0) => r.lease.on_reply(sent, &reply),
            Some(d) => r.late = Some((self.t + d, sent, reply)),
            None => {}
        }
        let total = reserved_total(&self.table, &self.p, self.t);
        if !total.fits_in(GLOBAL) {
            return Err(format!("I2: reserved {total:?} > {GLOBAL:?} at {}", self.t));
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Advance(d) => {
                self.t += d;
                let t = self.t;
                for r in &mut self.replicas {
                    if let Some((at, sent, reply)) = r.late.clone() {
                        if at <= t {
                            r.late = None;
                            if r.alive {
                                r.lease.on_reply(sent, &reply);
                            }
                        }
                    }
                }
                self.work.retain(|w| w.ends > t);
            }
            Op::Renew(i) => self.renew(i, Some(0))?,
            Op::RenewLost(i) => self.renew(i, None)?,
            Op::RenewLate(i, d) => self.renew(i, Some(d))?,
            Op::Admit(i, slots, tokens, life_pct) => {
                let held = self.held(i);
                let r = &self.replicas[i];
                if !r.alive {
                    return Ok(());
                }
                let share = r.lease.share_at(r.local(self.t));
                let amount = Amounts::new(slots, tokens);
                let after = Amounts::new(held.slots + slots, held.tokens + tokens);
                if !after.fits_in(share) {
                    return Ok(());
                }
                // The admission deadline, on the replica's clock.
                let d = u64::try_from(self.c.max_admission.as_millis()).unwrap();
                let ends = self.t + r.true_span(d * life_pct / 100).max(1);
                self.work.push(Work {
                    replica: i,
                    generation: r.generation,
                    amount,
                    ends,
                });
                let total = self.in_flight();
                if !total.fits_in(GLOBAL) {
                    return Err(format!(
                        "I3: {total:?} in flight > {GLOBAL:?} at {} (replica {i})",
                        self.t
                    ));
                }
            }
            Op::Wants(i, s, t) => self.replicas[i].wants = Amounts::new(s, t),
            Op::Crash(i) => {
                let r = &mut self.replicas[i];
                r.alive = false;
                r.late = None;
            }
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

fn run(c: &ClusterConfig, drifts: [i64; REPLICAS], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(c.clone(), drifts);
    for (n, op) in ops.iter().enumerate() {
        sim.step(op)
            .map_err(|e| TestCaseError::fail(format!("step {n} {op:?}: {e}")))?;
    }
    Ok(())
}

#[test]
fn shares_never_sum_above_the_global_limits() {
    let c = good();
    let mut r = runner(400, 1_024);
    let strategy = (drifts(), prop::collection::vec(op(), 1..400));
    r.run(&strategy, |(d, ops)| run(&c, d, &ops)).unwrap();
}

#[test]
fn a_quarantine_shorter_than_an_admission_is_caught() {
    // The same system with a quarantine of a third of the longest admission: a replica cut
    // off with long work in flight has its share handed out while that work runs.
    let c = config().quarantine(Duration::from_millis(500));
    assert!(c.validate().is_err(), "validate must refuse it too");
    // Found within the first cases; a short shrink keeps the test quick.
    let mut r = runner(2_000, 16);
    let strategy = (drifts(), prop::collection::vec(op(), 1..400));
    let cases = std::cell::Cell::new(0u32);
    let found = r.run(&strategy, |(d, ops)| {
        cases.set(cases.get() + 1);
        run(&c, d, &ops)
    });
    eprintln!("{} cases run (with shrinking)", cases.get());
    let Err(e) = found else {
        panic!("the checker did not find the overshoot of a short quarantine");
    };
    let e = e.to_string();
    assert!(e.contains("I3") || e.contains("I2"), "{e}");
}

/// Demand moves the share: with stable demand and everyone renewing, each replica converges to
/// its max-min fair share within two rounds after learning ends.
#[test]
fn shares_follow_demand() {
    let c = good();
    let mut sim = Sim::new(c.clone(), [0; REPLICAS]);
    let wants = [
        Amounts::new(8, 100),
        Amounts::new(1, 100),
        Amounts::new(1, 800),
    ];
    for (i, w) in wants.iter().enumerate() {
        sim.replicas[i].wants = *w;
    }
    // The first renewal creates the table, which learns for ttl + quarantine.
    sim.step(&Op::Renew(0)).unwrap();
    sim.step(&Op::Advance(c.store_params(GLOBAL).hold_ms() + 1))
        .unwrap();
    for _ in 0..3 {
        for i in 0..REPLICAS {
            sim.step(&Op::Renew(i)).unwrap();
        }
        sim.step(&Op::Advance(10)).unwrap();
    }
    let shares: Vec<Amounts> = (0..REPLICAS)
        .map(|i| sim.replicas[i].lease.share_at(sim.replicas[i].local(sim.t)))
        .collect();
    // Slots: demands (floor 2) 8, 2, 2 = 12 > 10: level 6. Tokens: 100, 100, 800 fit:
    // each demand plus 0 spare.
    assert_eq!(
        shares,
        vec![
            Amounts::new(6, 100),
            Amounts::new(2, 100),
            Amounts::new(2, 800)
        ]
    );
}

/// After the store loses its data nobody grows until `ttl + quarantine` passed, and a replica
/// that had a share keeps what it has installed.
#[test]
fn a_store_that_lost_its_data_lets_nobody_grow() {
    let c = good();
    let hold = c.store_params(GLOBAL).hold_ms();
    let mut sim = Sim::new(c, [0; REPLICAS]);
    sim.step(&Op::Renew(0)).unwrap();
    sim.step(&Op::Advance(hold + 1)).unwrap();
    for i in 0..2 {
        sim.step(&Op::Renew(i)).unwrap();
    }
    let before = sim.replicas[0].lease.grant();
    assert!(before.slots > 0);
    sim.step(&Op::StoreLoss).unwrap();
    sim.replicas[0].wants = GLOBAL;
    sim.step(&Op::Renew(0)).unwrap();
    sim.step(&Op::Renew(2)).unwrap();
    assert_eq!(
        sim.replicas[0].lease.grant(),
        before,
        "re-asserted, not grown"
    );
    assert_eq!(
        sim.replicas[2].lease.grant(),
        Amounts::ZERO,
        "new: nothing while learning"
    );
    sim.step(&Op::Advance(hold)).unwrap();
    sim.step(&Op::Renew(2)).unwrap();
    assert!(sim.replicas[2].lease.grant().slots > 0);
}

mod agent {
    use llm_bulkhead::cluster::{Amounts, Clock, ClusterAgent, ClusterConfig, MemoryStore, Phase};
    use llm_bulkhead::{Bulkhead, ClassLimits, Demand};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// One clock for the store and the replica (ms), moved by the test.
    #[derive(Clone, Default)]
    struct Manual(Arc<AtomicU64>);

    impl Clock for Manual {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl Manual {
        fn set(&self, t: u64) {
            self.0.store(t, Ordering::SeqCst);
        }
    }

    fn config() -> ClusterConfig {
        super::cluster_config::agent_config("agent")
    }

    fn setup(b: &Bulkhead) -> (Manual, MemoryStore, ClusterAgent) {
        let clock = Manual::default();
        let c2 = clock.clone();
        let store = MemoryStore::with_clock(move || c2.now_ms());
        let agent = on(b, &store, &clock);
        (clock, store, agent)
    }

    /// Another agent on the same store and clock.
    fn on(b: &Bulkhead, store: &MemoryStore, clock: &Manual) -> ClusterAgent {
        let clock = Arc::new(clock.clone());
        ClusterAgent::with_clock(b.clone(), Box::new(store.clone()), config(), clock).unwrap()
    }

    /// Lease, cut-off, floor, zero, heal: the bulkhead's limits follow the lease on the
    /// injected clock, with strictly increasing revisions.
    #[test]
    fn the_agent_degrades_on_its_own_deadline() {
        let b = Bulkhead::new(8).unwrap();
        let (clock, store, mut agent) = setup(&b);
        assert_eq!(b.limits().max_concurrent, 0, "zero until the first grant");
        agent.tick();
        assert!(agent.status().learning);
        assert_eq!(b.limits().max_concurrent, 0, "a new table learns first");
        clock.set(3_001);
        agent.tick();
        assert_eq!(
            b.limits().max_concurrent,
            8,
            "alone: the floor and all the spare"
        );
        let renewed = 3_001;
        store.set_reachable(false);
        let mut revisions = vec![b.limits().revision];
        let mut seen = Vec::new();
        // Valid until 1000 − 1% − 50 ms after the send; then the floor for 500 ms; then zero.
        for t in (renewed..renewed + 2_000).step_by(10) {
            clock.set(t);
            agent.tick();
            let l = b.limits();
            if revisions.last() != Some(&l.revision) {
                revisions.push(l.revision);
                seen.push((t, l.max_concurrent, agent.status().phase));
            }
        }
        assert_eq!(
            seen,
            vec![
                (renewed + 940, 2, Phase::Floor),
                (renewed + 1_440, 0, Phase::Closed)
            ]
        );
        assert!(agent.status().failures > 0);
        store.set_reachable(true);
        clock.set(renewed + 2_100);
        agent.tick();
        assert_eq!(b.limits().max_concurrent, 8);
        revisions.push(b.limits().revision);
        assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
    }

    /// Class floors and ceilings are split across the replicas like the share: two idle
    /// replicas each get their per-replica class floor plus an equal part of the spare.
    #[test]
    fn class_floors_and_ceilings_split_across_replicas() {
        let classed = || {
            Bulkhead::builder()
                .max_concurrent(8)
                .class(
                    "a",
                    ClassLimits {
                        protected_concurrent: 4,
                        max_concurrent: Some(6),
                        ..Default::default()
                    },
                )
                .class(
                    "b",
                    ClassLimits {
                        protected_concurrent: 3,
                        ..Default::default()
                    },
                )
                .default_class("a")
                .build()
                .unwrap()
        };
        let b = classed();
        let (clock, store, mut agent) = setup(&b);
        // A second replica takes half the budget.
        let mut other = on(&classed(), &store, &clock);
        // Both renew during the learning period (records stay live), then after it.
        for t in [0, 2_000, 3_001] {
            clock.set(t);
            agent.tick();
            other.tick();
        }
        let l = b.limits();
        assert_eq!(l.max_concurrent, 4, "an equal split of 8");
        let a = l.classes.get(b.class_id("a").unwrap()).unwrap();
        let bb = l.classes.get(b.class_id("b").unwrap()).unwrap();
        // Class a: floor 4 (per-replica floor ⌊4·2/8⌋ = 1): 1 + (4 − 2)/2 = 2 each; ceiling 6:
        // 1 + (6 − 2)/2 = 3 each, so the two ceilings sum to the global 6.
        assert_eq!((a.protected_concurrent, a.max_concurrent), (2, Some(3)));
        // Class b: floor 3 (per-replica floor 0): 3/2 = 1 each; no ceiling, none installed.
        assert_eq!((bb.protected_concurrent, bb.max_concurrent), (1, None));
    }

    /// Refusals raise a replica's demand and it renews early; an idle replica's share shrinks
    /// toward the floor; the loaded one gets the rest (after the idle one confirmed).
    #[test]
    fn refusals_move_the_share() {
        let (busy, idle) = (Bulkhead::new(8).unwrap(), Bulkhead::new(8).unwrap());
        let (clock, store, mut a) = setup(&busy);
        let mut b = on(&idle, &store, &clock);
        for t in [0, 2_000] {
            clock.set(t);
            a.tick();
            b.tick();
        }
        let mut t = 3_001;
        for _ in 0..20 {
            clock.set(t);
            // The busy replica takes everything it may, is refused once more, and finishes.
            let mut held = Vec::new();
            while let Ok(x) = busy.try_acquire(Demand::slot()) {
                held.push(x);
            }
            drop(held);
            a.tick();
            b.tick();
            t += 100;
        }
        assert_eq!(
            idle.limits().max_concurrent,
            2,
            "the idle replica keeps its floor"
        );
        assert_eq!(
            busy.limits().max_concurrent,
            6,
            "the busy one gets the rest"
        );
        let total = llm_bulkhead::cluster::reserved_total(
            &store.table(),
            &config().store_params(Amounts::new(8, 0)),
            t,
        );
        assert!(total.slots <= 8);
    }
}

/// Fail-open is explicit and does what its name says: once the lease lapsed, the replica
/// installs the whole global limits (up to R× the global limit across R replicas), and its
/// configuration is exempt from the quarantine rule. The default and fail-closed never do.
#[test]
fn fail_open_is_explicit_and_installs_the_global_limits() {
    use llm_bulkhead::cluster::{Degrade, Phase, RenewReply};
    let reply = RenewReply {
        granted: Amounts::new(3, 300),
        epoch: 1,
        seq: 1,
        now_ms: 0,
        learning: false,
        classes: vec![],
    };
    let lapsed = 10_000;
    for (degrade, after) in [
        (Degrade::FailOpen, GLOBAL),
        (Degrade::FailClosed, Amounts::ZERO),
        (Degrade::FloorThenClosed, Amounts::ZERO),
    ] {
        let c = config().degrade(degrade).quarantine(Duration::ZERO);
        assert_eq!(
            c.validate().is_ok(),
            degrade == Degrade::FailOpen,
            "{degrade:?}"
        );
        let mut l = Lease::new(&c, GLOBAL);
        l.on_reply(0, &reply);
        assert_eq!(l.share_at(1), reply.granted);
        assert_eq!(
            (l.phase_at(lapsed), l.share_at(lapsed)),
            (Phase::Closed, after)
        );
    }
}
