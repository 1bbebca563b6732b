//! The Redis lease store against a real server: the script agrees with the pure allocator on
//! random tables; foreign, corrupt and refused cases are typed errors that write nothing; a
//! password in the URL is never printed; several bulkheads with agents in one process share
//! one budget under an independent tally of the global in-flight sum.

#[path = "support/redis_server.rs"]
mod redis_server;

use llm_bulkhead::cluster::{
    renew, Amounts, ClassParams, ClassRecord, ClassShare, ClassUse, ClusterConfig, LeaseStore,
    LeaseTable, Meta, Record, RedisStore, RenewRequest, StoreError, StoreParams,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use redis_server::{namespace, Server};
use std::cell::{Cell, RefCell};
use std::time::Duration;

fn server_ms(c: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(c).unwrap();
    s * 1_000 + us / 1_000
}

fn params_str(p: &StoreParams) -> String {
    let classes: Vec<String> = p
        .classes
        .iter()
        .map(|c| {
            format!(
                "{},{},{},{},{},{},{}",
                c.name,
                c.floor.slots,
                c.floor.tokens,
                c.ceiling.slots,
                c.ceiling.tokens,
                c.min.slots,
                c.min.tokens
            )
        })
        .collect();
    format!(
        "{}:{}:{}:{}:{}:{}|{}",
        p.global.slots,
        p.global.tokens,
        p.floor.slots,
        p.floor.tokens,
        p.ttl_ms,
        p.quarantine_ms,
        classes.join(";")
    )
}

fn nums(a: &[Amounts]) -> String {
    let n: Vec<String> = a
        .iter()
        .flat_map(|x| [x.slots.to_string(), x.tokens.to_string()])
        .collect();
    n.join(":")
}

fn record_str(r: &Record) -> String {
    let mut s = format!(
        "{}:{}",
        nums(&[r.applied, r.granted, r.held, r.wants]),
        r.renewed_at
    );
    for c in &r.classes {
        let (a, g) = (c.applied, c.granted);
        s += ";";
        s += &nums(&[a.floor, a.ceiling, g.floor, g.ceiling, c.held, c.wants]);
    }
    s
}

fn parse_record(s: &str) -> Record {
    let mut parts = s.split(';');
    let n: Vec<u64> = parts
        .next()
        .unwrap()
        .split(':')
        .map(|x| x.parse().unwrap())
        .collect();
    let a = |n: &[u64], i: usize| Amounts::new(n[i], n[i + 1]);
    Record {
        applied: a(&n, 0),
        granted: a(&n, 2),
        held: a(&n, 4),
        wants: a(&n, 6),
        renewed_at: n[8],
        classes: parts
            .map(|p| {
                let n: Vec<u64> = p.split(':').map(|x| x.parse().unwrap()).collect();
                ClassRecord {
                    applied: ClassShare {
                        floor: a(&n, 0),
                        ceiling: a(&n, 2),
                    },
                    granted: ClassShare {
                        floor: a(&n, 4),
                        ceiling: a(&n, 6),
                    },
                    held: a(&n, 8),
                    wants: a(&n, 10),
                }
            })
            .collect(),
    }
}

fn parse_params(s: &str) -> StoreParams {
    let (base, classes) = s.split_once('|').unwrap();
    let n: Vec<u64> = base.split(':').map(|x| x.parse().unwrap()).collect();
    StoreParams {
        global: Amounts::new(n[0], n[1]),
        floor: Amounts::new(n[2], n[3]),
        ttl_ms: n[4],
        quarantine_ms: n[5],
        classes: classes
            .split(';')
            .filter(|c| !c.is_empty())
            .map(|c| {
                let f: Vec<&str> = c.split(',').collect();
                let n: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
                ClassParams {
                    name: f[0].to_string(),
                    floor: Amounts::new(n[0], n[1]),
                    ceiling: Amounts::new(n[2], n[3]),
                    min: Amounts::new(n[4], n[5]),
                }
            })
            .collect(),
    }
}

/// Writes `t` under `store`'s keys, replacing what was there.
fn write_table(c: &mut redis::Connection, keys: &[String; 2], t: &LeaseTable) {
    let _: () = redis::cmd("DEL")
        .arg(&keys[0])
        .arg(&keys[1])
        .query(c)
        .unwrap();
    if let Some(m) = &t.meta {
        let _: () = redis::cmd("HSET")
            .arg(&keys[0])
            .arg(&[
                ("format", "llm-bulkhead-lease/2".to_string()),
                ("epoch", m.epoch.to_string()),
                ("seq", m.seq.to_string()),
                ("learning_until", m.learning_until.to_string()),
                ("params", params_str(&m.params)),
            ])
            .query(c)
            .unwrap();
    }
    for (id, r) in &t.records {
        let _: () = redis::cmd("HSET")
            .arg(&keys[1])
            .arg(id)
            .arg(record_str(r))
            .query(c)
            .unwrap();
    }
}

fn read_table(c: &mut redis::Connection, keys: &[String; 2]) -> LeaseTable {
    let m: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&keys[0]).query(c).unwrap();
    let meta = (!m.is_empty()).then(|| Meta {
        epoch: m["epoch"].parse().unwrap(),
        seq: m["seq"].parse().unwrap(),
        learning_until: m["learning_until"].parse().unwrap(),
        params: parse_params(&m["params"]),
    });
    let r: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&keys[1]).query(c).unwrap();
    LeaseTable {
        meta,
        records: r
            .iter()
            .map(|(k, v)| (k.clone(), parse_record(v)))
            .collect(),
    }
}

fn amounts(max: Amounts) -> impl Strategy<Value = Amounts> {
    (0..=max.slots, 0..=max.tokens).prop_map(|(s, t)| Amounts::new(s, t))
}

/// A record: id, applied, granted, held, wants, age (ms), class records.
type CaseRecord = (
    u8,
    Amounts,
    Amounts,
    Amounts,
    Amounts,
    u64,
    Vec<ClassRecord>,
);

/// A random table and request, times relative to the server's clock (offsets in ms).
#[derive(Debug, Clone)]
struct Case {
    params: StoreParams,
    meta: Option<(u64, u64, i64)>, // (epoch, seq, learning_until offset)
    records: Vec<CaseRecord>,
    req: (u8, Amounts, Amounts, Amounts, u64, u64, Vec<ClassUse>),
    /// 0: the table's ttl differs; 1: the table's classes have other names; else the same.
    other_params: u8,
}

fn class_share(g: Amounts) -> impl Strategy<Value = ClassShare> {
    (amounts(g), amounts(g)).prop_map(|(floor, ceiling)| ClassShare { floor, ceiling })
}

fn class_record(g: Amounts) -> impl Strategy<Value = ClassRecord> {
    (class_share(g), class_share(g), amounts(g), amounts(g)).prop_map(
        |(applied, granted, held, wants)| ClassRecord {
            applied,
            granted,
            held,
            wants,
        },
    )
}

/// Up to two classes: a ceiling, a floor of at most half the global limit below it, and a
/// per-replica floor below that.
fn class_params(g: Amounts) -> impl Strategy<Value = Vec<ClassParams>> {
    prop::collection::vec((amounts(g), amounts(g), amounts(g), 0u8..3), 0..=2).prop_map(move |v| {
        v.into_iter()
            .enumerate()
            .map(|(k, (ceiling, f, m, wide))| {
                // A third of the classes have no ceiling (the global limit).
                let ceiling = if wide == 0 { g } else { ceiling };
                let floor = Amounts::new(f.slots / 2, f.tokens / 2).min(ceiling);
                ClassParams {
                    name: format!("c{k}"),
                    floor,
                    ceiling,
                    min: m.min(floor),
                }
            })
            .collect()
    })
}

fn case() -> impl Strategy<Value = Case> {
    let g = (1u64..20, 0u64..2_000).prop_map(|(s, t)| Amounts::new(s, t));
    g.prop_flat_map(|g| {
        let big = Amounts::new(g.slots + 3, g.tokens + 300);
        let params = (amounts(g), 50u64..500, 50u64..500, class_params(g)).prop_map(
            move |(floor, ttl, q, classes)| StoreParams {
                global: g,
                floor,
                ttl_ms: ttl,
                quarantine_ms: q,
                classes,
            },
        );
        let rec = (
            0u8..6,
            amounts(g),
            amounts(g),
            amounts(big),
            amounts(g),
            0u64..1_500,
            prop::collection::vec(class_record(g), 2),
        );
        let class_use = (class_share(g), amounts(g), amounts(big), 0u8..40).prop_map(
            |(applied, held, wants, odd)| {
                // One report in forty names a class nobody has; one in twenty may ask more than
                // its class ceiling.
                let name = match odd {
                    0 => "zz",
                    1 | 2 => "big",
                    _ => "",
                };
                ClassUse::new(name, applied, held, wants)
            },
        );
        let req = (
            0u8..6,
            amounts(g),
            amounts(big),
            amounts(big),
            0u64..3,
            0u64..40,
            prop::collection::vec(class_use, 2),
        );
        (
            params,
            proptest::option::of((1u64..4, 0u64..30, -600i64..600)),
            prop::collection::vec(rec, 0..6),
            req,
            0u8..40,
        )
            .prop_map(|(params, meta, mut records, mut req, other_params)| {
                // Records and reports line up with the classes; a report's empty name is its
                // class's.
                let n = params.classes.len();
                for r in &mut records {
                    r.6.truncate(n);
                }
                req.6.truncate(n);
                for (u, c) in req.6.iter_mut().zip(&params.classes) {
                    if u.name.is_empty() {
                        u.wants = u.wants.min(c.ceiling);
                    }
                    if u.name != "zz" {
                        u.name.clone_from(&c.name);
                    }
                }
                Case {
                    params,
                    meta,
                    records,
                    req,
                    other_params,
                }
            })
    })
}

#[test]
fn the_script_agrees_with_the_allocator() {
    let Some(server) = Server::get("agree") else {
        return;
    };
    let c = RefCell::new(server.conn());
    let config = ClusterConfig::new(&namespace("agree"), "b");
    let store = RefCell::new(RedisStore::open(&server.url, &config).unwrap());
    let keys = store.borrow().keys().clone();
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let (granted, refused, class_granted) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let seen = RefCell::new(std::collections::BTreeSet::new());
    runner
        .run(&case(), |k| {
            let c = &mut *c.borrow_mut();
            let now = server_ms(c);
            let mut table = LeaseTable::default();
            let mut epochs = vec![0];
            if let Some((e, seq, lu)) = k.meta {
                let epoch = now - e * 10_000;
                epochs.push(epoch);
                let mut params = k.params.clone();
                match k.other_params {
                    0 => params.ttl_ms += 1,
                    1 => {
                        for c in &mut params.classes {
                            c.name = format!("old{}", c.name);
                        }
                    }
                    _ => {}
                }
                table.meta = Some(Meta {
                    epoch,
                    seq,
                    learning_until: now.saturating_add_signed(lu),
                    params,
                });
            }
            for (id, applied, granted, held, wants, age, classes) in &k.records {
                table.records.insert(
                    format!("r{id}"),
                    Record {
                        applied: *applied,
                        granted: *granted,
                        held: *held,
                        wants: *wants,
                        renewed_at: now - age,
                        classes: classes.clone(),
                    },
                );
            }
            let (id, applied, held, wants, e, seq, classes) = k.req.clone();
            let req = RenewRequest {
                replica: format!("r{id}"),
                applied,
                held,
                wants,
                epoch: epochs[(e as usize) % epochs.len()],
                seq,
                classes,
            };
            write_table(c, &keys, &table);
            let got = store.borrow_mut().renew(&k.params, &req);
            let after = read_table(c, &keys);
            match got {
                Ok(reply) => {
                    granted.set(granted.get() + 1);
                    let mut expect = table.clone();
                    let want = renew(&mut expect, &k.params, &req, reply.now_ms).unwrap();
                    if !reply.classes.is_empty() {
                        class_granted.set(class_granted.get() + 1);
                    }
                    prop_assert_eq!(reply, want);
                    prop_assert_eq!(after, expect);
                }
                Err(StoreError::Refused(e)) => {
                    refused.set(refused.get() + 1);
                    let mut expect = table.clone();
                    let want = renew(&mut expect, &k.params, &req, now).unwrap_err();
                    prop_assert_eq!(e, want);
                    seen.borrow_mut().insert(format!("{e:?}"));
                    // Nothing written.
                    prop_assert_eq!(after, table);
                }
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
            Ok(())
        })
        .unwrap();
    // Both outcomes were exercised.
    let (granted, refused) = (granted.get(), refused.get());
    assert!(
        granted > 100 && refused > 5 && class_granted.get() > 50,
        "{granted} granted ({} with classes), {refused} refused",
        class_granted.get()
    );
    // The class refusals were exercised on both sides.
    let seen = seen.into_inner();
    for e in [
        "UnknownClass",
        "AboveClassLimit",
        "ConfigMismatch",
        "AboveGlobal",
    ] {
        assert!(seen.contains(e), "{e} never refused: {seen:?}");
    }
}

fn small() -> StoreParams {
    ClusterConfig::new("x", "b").store_params(Amounts::new(4, 100))
}

fn hello() -> RenewRequest {
    RenewRequest::new("r1", Amounts::ZERO, Amounts::ZERO, Amounts::new(2, 10))
}

/// Foreign and corrupt values under the crate's keys: typed errors, nothing written.
#[test]
fn foreign_and_corrupt_values_are_refused_and_left_alone() {
    let Some(server) = Server::get("corrupt") else {
        return;
    };
    let mut c = server.conn();
    let config = ClusterConfig::new(&namespace("corrupt"), "b");
    let mut store = RedisStore::open(&server.url, &config).unwrap();
    let [meta, leases] = store.keys().clone();
    let p = small();
    let dump = |c: &mut redis::Connection| -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (
            redis::cmd("DUMP").arg(&meta).query(c).unwrap(),
            redis::cmd("DUMP").arg(&leases).query(c).unwrap(),
        )
    };
    type Set<'a> = Box<dyn Fn(&mut redis::Connection) + 'a>;
    type Case<'a> = (&'a str, Set<'a>, fn(&StoreError) -> bool);
    let cases: Vec<Case<'_>> = vec![
        (
            "meta is a string",
            Box::new(|c| redis::cmd("SET").arg(&meta).arg("hello").exec(c).unwrap()),
            |e| matches!(e, StoreError::Foreign(_)),
        ),
        (
            "leases is a list",
            Box::new(|c| redis::cmd("RPUSH").arg(&leases).arg("x").exec(c).unwrap()),
            |e| matches!(e, StoreError::Foreign(_)),
        ),
        (
            "meta of another format",
            Box::new(|c| {
                redis::cmd("HSET")
                    .arg(&meta)
                    .arg("format")
                    .arg("other/9")
                    .exec(c)
                    .unwrap()
            }),
            |e| matches!(e, StoreError::Foreign(_)),
        ),
        (
            "meta with a bad number",
            Box::new(|c| {
                redis::cmd("HSET")
                    .arg(&meta)
                    .arg(&[
                        ("format", "llm-bulkhead-lease/2"),
                        ("epoch", "-1"),
                        ("seq", "1"),
                        ("learning_until", "0"),
                        ("params", "x"),
                    ])
                    .exec(c)
                    .unwrap()
            }),
            |e| matches!(e, StoreError::Corrupt(_)),
        ),
        (
            "a record that is not nine numbers",
            Box::new(|c| {
                redis::cmd("HSET")
                    .arg(&leases)
                    .arg("r2")
                    .arg("1:2:3")
                    .exec(c)
                    .unwrap()
            }),
            |e| matches!(e, StoreError::Corrupt(_)),
        ),
        (
            "a record with a float",
            Box::new(|c| {
                redis::cmd("HSET")
                    .arg(&leases)
                    .arg("r2")
                    .arg("1:2:3:4:5:6:7:8:1e3")
                    .exec(c)
                    .unwrap()
            }),
            |e| matches!(e, StoreError::Corrupt(_)),
        ),
    ];
    for (name, set, expected) in cases {
        redis::cmd("DEL")
            .arg(&meta)
            .arg(&leases)
            .exec(&mut c)
            .unwrap();
        set(&mut c);
        let before = dump(&mut c);
        let e = store.renew(&p, &hello()).unwrap_err();
        assert!(expected(&e), "{name}: {e:?}");
        assert_eq!(dump(&mut c), before, "{name}: the script wrote");
    }
    // A demand above the global limit and other parameters on a live table: refused.
    redis::cmd("DEL")
        .arg(&meta)
        .arg(&leases)
        .exec(&mut c)
        .unwrap();
    let mut big = hello();
    big.wants = Amounts::new(5, 0);
    assert_eq!(
        store.renew(&p, &big),
        Err(StoreError::Refused(
            llm_bulkhead::cluster::AllocError::AboveGlobal
        ))
    );
    store.renew(&p, &hello()).unwrap();
    let other = StoreParams {
        ttl_ms: p.ttl_ms + 1,
        ..p
    };
    assert_eq!(
        store.renew(&other, &hello()),
        Err(StoreError::Refused(
            llm_bulkhead::cluster::AllocError::ConfigMismatch
        ))
    );
}

/// A server that refuses the script (here: an ACL user without `EVALSHA`/`EVAL`), a wrong
/// password and an unreachable server are typed errors that never repeat the URL's password.
#[test]
fn refused_scripts_and_credentials_stay_private() {
    let Some(server) = Server::get("acl") else {
        return;
    };
    let mut c = server.conn();
    let user = namespace("u").replace('-', "_");
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            &user,
            "on",
            ">s3cr3t-pw",
            "~*",
            "+@all",
            "-eval",
            "-evalsha",
        ])
        .exec(&mut c)
        .unwrap();
    let with_user = |pass: &str| -> String {
        let sep = if server.url.contains('?') { '&' } else { '?' };
        if server.url.starts_with("redis+unix") {
            format!("{}{sep}user={user}&pass={pass}", server.url)
        } else {
            server
                .url
                .replacen("redis://", &format!("redis://{user}:{pass}@"), 1)
        }
    };
    let config = ClusterConfig::new(&namespace("acl"), "b");
    let p = small();
    for (pass, refused) in [("s3cr3t-pw", true), ("wr0ng-pw", false)] {
        let mut store = RedisStore::open(&with_user(pass), &config).unwrap();
        let e = store.renew(&p, &hello()).unwrap_err();
        if refused {
            assert!(matches!(e, StoreError::ScriptRefused(_)), "{e:?}");
        } else {
            assert!(matches!(e, StoreError::Unreachable(_)), "{e:?}");
        }
        for text in [e.to_string(), format!("{e:?}"), format!("{store:?}")] {
            assert!(!text.contains(pass) && !text.contains(&user), "{text}");
        }
    }
    let mut gone = RedisStore::open("redis://:hidden-pw@127.0.0.1:1/", &config)
        .unwrap()
        .with_timeout(std::time::Duration::from_millis(200));
    let e = gone.renew(&p, &hello()).unwrap_err();
    assert!(matches!(e, StoreError::Unreachable(_)), "{e:?}");
    assert!(!format!("{e} {e:?} {gone:?}").contains("hidden-pw"));
    redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .exec(&mut c)
        .unwrap();
}

mod agents {
    use super::*;
    use llm_bulkhead::cluster::{ClusterAgent, ClusterBulkhead, RunningAgent};
    use llm_bulkhead::{Bulkhead, Demand, Reservation};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    pub const G: Amounts = Amounts::new(6, 600);

    pub fn config(ns: &str) -> ClusterConfig {
        super::redis_server::quick_config(ns, 300)
    }

    /// The global in-flight tally: raised right after an admission, lowered right before its
    /// release; every raise is checked against the global limits, and a class admission's
    /// against its class's global ceiling.
    #[derive(Default)]
    pub struct Tally {
        slots: AtomicU64,
        tokens: AtomicU64,
        pub admitted: AtomicU64,
        pub peak_slots: AtomicU64,
        /// Per class: slots and tokens in flight, the global class ceiling, admissions.
        pub classes: Vec<(AtomicU64, AtomicU64, Amounts, AtomicU64)>,
    }

    impl Tally {
        /// A tally that also counts classes with these global ceilings.
        pub fn with_classes(ceilings: &[Amounts]) -> Self {
            Tally {
                classes: ceilings
                    .iter()
                    .map(|c| (AtomicU64::new(0), AtomicU64::new(0), *c, AtomicU64::new(0)))
                    .collect(),
                ..Tally::default()
            }
        }

        fn raise(&self, tokens: u64, class: Option<usize>) {
            if let Some((s, t, c, n)) = class.map(|k| &self.classes[k]) {
                let s = s.fetch_add(1, Ordering::SeqCst) + 1;
                let t = t.fetch_add(tokens, Ordering::SeqCst) + tokens;
                n.fetch_add(1, Ordering::Relaxed);
                assert!(
                    Amounts::new(s, t).fits_in(*c),
                    "class {class:?}: {s} slots, {t} tokens in flight across replicas > {c:?}"
                );
            }
            let s = self.slots.fetch_add(1, Ordering::SeqCst) + 1;
            let t = self.tokens.fetch_add(tokens, Ordering::SeqCst) + tokens;
            self.admitted.fetch_add(1, Ordering::Relaxed);
            self.peak_slots.fetch_max(s, Ordering::Relaxed);
            assert!(
                s <= G.slots,
                "{s} slots in flight across replicas > {}",
                G.slots
            );
            assert!(
                t <= G.tokens,
                "{t} tokens in flight across replicas > {}",
                G.tokens
            );
        }

        fn lower(&self, tokens: u64, class: Option<usize>) {
            if let Some((s, t, _, _)) = class.map(|k| &self.classes[k]) {
                s.fetch_sub(1, Ordering::SeqCst);
                t.fetch_sub(tokens, Ordering::SeqCst);
            }
            self.slots.fetch_sub(1, Ordering::SeqCst);
            self.tokens.fetch_sub(tokens, Ordering::SeqCst);
        }
    }

    pub fn bulkhead() -> Bulkhead {
        Bulkhead::builder()
            .max_concurrent(G.slots as u32)
            .token_budget(G.tokens)
            .build()
            .unwrap()
    }

    pub fn start(url: &str, c: &ClusterConfig, b: &Bulkhead) -> RunningAgent {
        let store = RedisStore::open(url, c).unwrap();
        ClusterAgent::new(b.clone(), Box::new(store), c.clone())
            .unwrap()
            .spawn()
            .unwrap()
    }

    /// `threads` workers on `b` until `stop`: admit through the cluster handle (the window
    /// checked on the admitting thread, as a gateway would), hold a little, release.
    pub fn load(
        b: &ClusterBulkhead,
        tally: &Arc<Tally>,
        stop: &Arc<AtomicBool>,
        threads: usize,
        hold: Duration,
    ) -> Vec<std::thread::JoinHandle<u64>> {
        load_class(b, tally, stop, threads, hold, None)
    }

    /// [`load`] in one class (its index in the tally, and its id), or the default.
    pub fn load_class(
        b: &ClusterBulkhead,
        tally: &Arc<Tally>,
        stop: &Arc<AtomicBool>,
        threads: usize,
        hold: Duration,
        class: Option<(usize, llm_bulkhead::ClassId)>,
    ) -> Vec<std::thread::JoinHandle<u64>> {
        (0..threads)
            .map(|k| {
                let (b, tally, stop) = (b.clone(), tally.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) && i < 2_000_000 {
                        i += 1;
                        let tokens = 20 + (i * 7 + k as u64 * 13) % 80;
                        let mut d = Demand::tokens(Reservation::new(tokens, 0).unwrap());
                        if let Some((_, id)) = class {
                            d = d.in_class(id);
                        }
                        let k = class.map(|(k, _)| k);
                        if let Ok(a) = b.try_acquire(d) {
                            tally.raise(tokens, k);
                            n += 1;
                            std::thread::sleep(hold);
                            tally.lower(tokens, k);
                            drop(a);
                        } else {
                            std::thread::sleep(Duration::from_micros(300));
                        }
                    }
                    n
                })
            })
            .collect()
    }

    /// Joins worker threads, re-raising a worker's own panic (the tally's message) rather
    /// than an unwrap of its opaque payload.
    pub fn join<T>(handles: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    }

    /// No admission through the handles outlived `max_admission` (A4 held for the test's own
    /// work, so the tally's bound is the one the docs state).
    pub fn no_overdue(running: &[RunningAgent]) {
        for (i, r) in running.iter().enumerate() {
            assert_eq!(
                r.status().overdue,
                0,
                "replica {i}: work held past max_admission"
            );
        }
    }

    pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
        let until = Instant::now() + limit;
        while !f() {
            assert!(Instant::now() < until, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Three bulkheads with agents against the real server, skewed load (8, 2 and 1 worker
/// threads): the independent tally of the global in-flight sum never passes the global limits,
/// every replica admits, and the loaded replica's share grows beyond an equal split.
#[test]
fn three_replicas_share_one_budget_under_a_global_tally() {
    use agents::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(server) = Server::get("three") else {
        return;
    };
    let c = config(&namespace("three"));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let running: Vec<_> = bs.iter().map(|b| start(&server.url, &c, b)).collect();
    let mut workers = Vec::new();
    for (r, threads) in running.iter().zip([8, 2, 1]) {
        workers.push(load(
            &r.handle(),
            &tally,
            &stop,
            threads,
            Duration::from_millis(2),
        ));
    }
    // Bounded: the learning period, then until the loaded replica holds more than 2 of 6 slots.
    wait_for("a grant after learning", Duration::from_secs(20), || {
        running
            .iter()
            .all(|r| r.status().renewals > 2 && !r.status().learning)
    });
    wait_for(
        "the loaded replica's share grows",
        Duration::from_secs(20),
        || running[0].status().installed.slots > 2,
    );
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let per: Vec<u64> = workers
        .into_iter()
        .map(|w| join(w).into_iter().sum())
        .collect();
    no_overdue(&running);
    for r in running {
        r.stop().unwrap();
    }
    assert!(
        per.iter().all(|&n| n > 0),
        "every replica admitted: {per:?}"
    );
    // Everyone left gracefully: the table is empty.
    let mut conn = server.conn();
    let left: usize = redis::cmd("HLEN")
        .arg(format!("llm-bulkhead:{{{}/b}}:v2:leases", c.namespace))
        .query(&mut conn)
        .unwrap();
    assert_eq!(left, 0);
}

/// The server restarts without its data while three replicas run under load: the tally holds
/// throughout, the table comes back in learning mode, and grants resume after it.
#[test]
fn a_redis_restart_that_loses_the_data_keeps_the_bound() {
    use agents::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(mut server) = Server::private("restart") else {
        return;
    };
    let c = config(&namespace("restart"));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let running: Vec<_> = bs.iter().map(|b| start(&server.url, &c, b)).collect();
    let workers: Vec<_> = running
        .iter()
        .map(|r| load(&r.handle(), &tally, &stop, 3, Duration::from_millis(2)))
        .collect();
    wait_for("grants", Duration::from_secs(20), || {
        running.iter().all(|r| r.status().installed.slots > 0)
    });
    let before = tally.admitted.load(Ordering::Relaxed);
    server.restart();
    wait_for(
        "learning after the restart",
        Duration::from_secs(20),
        || running.iter().any(|r| r.status().learning),
    );
    wait_for("grants after learning", Duration::from_secs(20), || {
        running
            .iter()
            .all(|r| !r.status().learning && r.status().installed.slots > 0)
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        join(w);
    }
    assert!(tally.admitted.load(Ordering::Relaxed) > before);
    no_overdue(&running);
    for r in running {
        r.stop().unwrap();
    }
}

/// A loopback TCP proxy to the server's Unix socket that can blackhole its traffic (bytes read
/// and dropped, nothing answered), as a network partition does.
mod proxy {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    pub struct Proxy {
        pub url: String,
        pub cut: Arc<AtomicBool>,
    }

    fn pump(mut from: impl Read, mut to: impl Write, cut: Arc<AtomicBool>) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }

    pub fn start(socket: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        let (socket, c) = (socket.to_string(), cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = UnixStream::connect(&socket) else {
                    continue;
                };
                let (c1, c2) = (c.clone(), c.clone());
                let (client2, server2): (TcpStream, UnixStream) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pump(client, server, c1));
                std::thread::spawn(move || pump(server2, client2, c2));
            }
        });
        Proxy { url, cut }
    }
}

/// An event callback that makes its agent's thread late at the floor's end, once: at the
/// first store failure past the middle of the floor, it sleeps until 800 ms after the floor's
/// end (the agent installs zero only then).
fn late_at_the_floors_end(
    floor: Amounts,
    hold: Duration,
    slept: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> impl FnMut(&llm_bulkhead::cluster::AgentEvent) + Send {
    use llm_bulkhead::cluster::AgentEvent;
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let mut floor_since: Option<Instant> = None;
    move |e| match e {
        AgentEvent::Installed { share, .. } if *share != Amounts::ZERO => {
            floor_since = (*share == share.min(floor)).then(Instant::now);
        }
        AgentEvent::StoreFailed(_) if !slept.load(Ordering::SeqCst) => {
            if let Some(t) = floor_since.filter(|t| t.elapsed() >= hold / 2) {
                slept.store(true, Ordering::SeqCst);
                std::thread::sleep((t + hold + Duration::from_millis(800)) - Instant::now());
            }
        }
        _ => {}
    }
}

/// Replica 0 reaches Redis through a proxy that blackholes it for a while: it falls to its
/// floor at its own deadline and then to zero (its store calls bounded by that deadline), the
/// others do not get its share before its quarantine, the tally holds throughout, and after
/// the heal it gets a share again.
///
/// Replica 0's agent thread is made late at the floor's end on purpose (its event callback
/// sleeps 500 ms there), as a loaded machine does now and then: a descheduled thread, or an
/// `apply_limits` waiting out a grace period behind preempted workers. That lateness once made
/// this test fail as an `unwrap` of a worker's panic: the workers admitted on the bare
/// bulkhead, whose floor stayed installed until the late agent replaced it, past the point
/// where the store handed the cut-off replica's reservation to the others (the tally's 7 of 6).
/// The workers now admit through the cluster handle, which closes the floor's window on their
/// own threads; with `LLM_BULKHEAD_CLUSTER_NO_WINDOW=1` (the handle as the bare bulkhead) the
/// tally fails again.
#[test]
fn a_replica_cut_off_by_a_blackhole_degrades_and_rejoins() {
    use agents::*;
    use llm_bulkhead::cluster::Phase;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(server) = Server::private("blackhole") else {
        return;
    };
    let socket = server.url.trim_start_matches("redis+unix://").to_string();
    let proxy = proxy::start(&socket);
    // A floor held for 1 s, and replica 0's client waiting up to 5 s for an answer: unless the
    // agent bounds each call by its own next deadline, the blackholed call outlasts the floor.
    // The shortest quarantine `validate` accepts: no allowance for a late agent thread.
    let c = config(&namespace("blackhole")).floor_hold(Duration::from_secs(1));
    let c = c
        .clone()
        .quarantine(Duration::from_millis(c.needed_quarantine_ms()));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicBool::new(false));
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let slow = RedisStore::open(&proxy.url, &c)
        .unwrap()
        .with_timeout(Duration::from_secs(5));
    let mut running =
        vec![
            llm_bulkhead::cluster::ClusterAgent::new(bs[0].clone(), Box::new(slow), c.clone())
                .unwrap()
                .on_event(late_at_the_floors_end(c.floor, c.floor_hold, late.clone()))
                .spawn()
                .unwrap(),
        ];
    running.extend(bs[1..].iter().map(|b| start(&server.url, &c, b)));
    let workers: Vec<_> = running
        .iter()
        .map(|r| load(&r.handle(), &tally, &stop, 3, Duration::from_millis(2)))
        .collect();
    wait_for("grants", Duration::from_secs(20), || {
        running
            .iter()
            .all(|r| r.status().installed.slots > 0 && !r.status().learning)
    });
    proxy.cut.store(true, Ordering::SeqCst);
    let mut phases = vec![running[0].status().phase];
    wait_for("replica 0 closed", Duration::from_secs(20), || {
        let p = running[0].status().phase;
        if phases.last() != Some(&p) {
            phases.push(p);
        }
        p == Phase::Closed
    });
    assert_eq!(bs[0].limits().max_concurrent, 0);
    // The floor came at the lease's end, not after a blocked call: the call was bounded.
    assert!(phases.contains(&Phase::Floor), "{phases:?}");
    proxy.cut.store(false, Ordering::SeqCst);
    wait_for("replica 0 rejoins", Duration::from_secs(20), || {
        running[0].status().installed.slots > 0
    });
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        join(w);
    }
    no_overdue(&running);
    // The agent was made late, and left the floor installed past its window: the handle
    // refused there.
    assert!(late.load(Ordering::SeqCst), "the agent was not made late");
    assert!(running[0].status().lapsed_refusals > 0);
    for r in running {
        let _ = r.stop();
    }
}

/// Classed bulkheads for the class tests: 6 slots, 600 tokens; class `a` with floor 2 slots and
/// 200 tokens and ceiling 4 and 400; class `b` (the default) with floor 1 and 100, no ceiling.
fn classed() -> llm_bulkhead::Bulkhead {
    use llm_bulkhead::ClassLimits;
    llm_bulkhead::Bulkhead::builder()
        .max_concurrent(agents::G.slots as u32)
        .token_budget(agents::G.tokens)
        .class(
            "a",
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(4),
                protected_tokens: 200,
                max_tokens: Some(400),
            },
        )
        .class(
            "b",
            ClassLimits {
                protected_concurrent: 1,
                protected_tokens: 100,
                ..ClassLimits::default()
            },
        )
        .default_class("b")
        .build()
        .unwrap()
}

/// Three classed bulkheads with agents against the real server, class `a` loaded on every
/// replica (four, two and two threads; replica 2 also one thread in `b`): an independent tally
/// per class checks every admission against the class's global ceiling (and the global
/// limits), and every worker group admits. Without the class split each replica would install
/// class `a`'s ceiling cut to its slot share (2 of 6 each), 6 in all against the global 4, and
/// the tally fails.
#[test]
fn classed_replicas_keep_each_class_within_its_global_ceiling() {
    use agents::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(server) = Server::get("classes") else {
        return;
    };
    let c = config(&namespace("classes"));
    let tally = Arc::new(Tally::with_classes(&[Amounts::new(4, 400), G]));
    let stop = Arc::new(AtomicBool::new(false));
    let bs: Vec<_> = (0..3).map(|_| classed()).collect();
    let running: Vec<_> = bs.iter().map(|b| start(&server.url, &c, b)).collect();
    let ids = |b: &llm_bulkhead::Bulkhead| [b.class_id("a").unwrap(), b.class_id("b").unwrap()];
    let mut workers = Vec::new();
    for (i, plan) in [[4, 0], [2, 0], [2, 1]].iter().enumerate() {
        for (k, &threads) in plan.iter().enumerate().filter(|&(_, &n)| n > 0) {
            let class = Some((k, ids(&bs[i])[k]));
            let h = running[i].handle();
            let hold = Duration::from_millis(2);
            workers.push(load_class(&h, &tally, &stop, threads, hold, class));
        }
    }
    let ceilings_a = || -> Vec<u64> {
        running
            .iter()
            .map(|r| {
                r.status()
                    .installed_classes
                    .first()
                    .map_or(0, |s| s.ceiling.slots)
            })
            .collect()
    };
    let mut seen = Vec::new();
    wait_for(
        "class-a ceilings on every replica",
        Duration::from_secs(20),
        || {
            let a = ceilings_a();
            // Each status is read at another instant: a sum a little above 4 would be a race
            // of the reads, but an installed class ceiling above the whole is a bug.
            assert!(a.iter().all(|&x| x <= 4), "{a:?}");
            if seen.last() != Some(&a) {
                seen.push(a.clone());
            }
            a.iter().all(|&x| x > 0)
                && running
                    .iter()
                    .all(|r| !r.status().learning && r.status().renewals > 10)
        },
    );
    eprintln!("class-a ceilings installed (replicas 0, 1, 2) as they changed: {seen:?}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let per: Vec<u64> = workers
        .into_iter()
        .map(|w| join(w).into_iter().sum())
        .collect();
    no_overdue(&running);
    for r in running {
        r.stop().unwrap();
    }
    assert!(
        per.iter().all(|&n| n > 0),
        "every worker group admitted: {per:?}"
    );
    let a = tally.classes[0].3.load(Ordering::Relaxed);
    let b = tally.classes[1].3.load(Ordering::Relaxed);
    assert!(a > 0 && b > 0, "class a {a}, class b {b} admissions");
}

/// The v2 lease script with one class, against a real server: bad class input and corrupt
/// per-class values are typed errors that write nothing.
#[test]
fn bad_class_input_and_corrupt_class_values_are_refused() {
    use llm_bulkhead::cluster::AllocError;
    let Some(server) = Server::get("classbad") else {
        return;
    };
    let mut c = server.conn();
    let config = ClusterConfig::new(&namespace("classbad"), "b");
    let mut store = RedisStore::open(&server.url, &config).unwrap();
    let [meta, leases] = store.keys().clone();
    let p = StoreParams {
        classes: vec![ClassParams {
            name: "a".into(),
            floor: Amounts::new(1, 10),
            ceiling: Amounts::new(2, 50),
            min: Amounts::ZERO,
        }],
        ..small()
    };
    let req = |name: &str, wants: Amounts| {
        hello().with_classes(vec![ClassUse::new(
            name,
            ClassShare::ZERO,
            Amounts::ZERO,
            wants,
        )])
    };
    let dump = |c: &mut redis::Connection| -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (
            redis::cmd("DUMP").arg(&meta).query(c).unwrap(),
            redis::cmd("DUMP").arg(&leases).query(c).unwrap(),
        )
    };
    let r = store.renew(&p, &req("a", Amounts::new(1, 0))).unwrap();
    assert_eq!(r.classes.len(), 1);
    let before = dump(&mut c);
    for (name, p2, rq, want) in [
        (
            "unknown class",
            p.clone(),
            req("zz", Amounts::ZERO),
            AllocError::UnknownClass,
        ),
        (
            "above the class ceiling",
            p.clone(),
            req("a", Amounts::new(3, 0)),
            AllocError::AboveClassLimit,
        ),
        (
            "no class report",
            p.clone(),
            hello(),
            AllocError::UnknownClass,
        ),
        (
            "another class table",
            StoreParams {
                classes: vec![ClassParams {
                    name: "c".into(),
                    ..p.classes[0].clone()
                }],
                ..p.clone()
            },
            req("c", Amounts::ZERO),
            AllocError::UnknownClass,
        ),
    ] {
        assert_eq!(
            store.renew(&p2, &rq),
            Err(StoreError::Refused(want)),
            "{name}"
        );
        assert_eq!(dump(&mut c), before, "{name}: the script wrote");
    }
    for (name, value) in [
        (
            "a class part with a word",
            "0:0:0:0:0:0:0:0:1;0:0:0:0:x:0:0:0:0:0:0:0",
        ),
        (
            "a class part of eleven numbers",
            "0:0:0:0:0:0:0:0:1;0:0:0:0:0:0:0:0:0:0:0",
        ),
        ("no class part", "0:0:0:0:0:0:0:0:1"),
        (
            "two class parts for one class",
            "0:0:0:0:0:0:0:0:1;0:0:0:0:0:0:0:0:0:0:0:0;0:0:0:0:0:0:0:0:0:0:0:0",
        ),
        (
            "a negative class number",
            "0:0:0:0:0:0:0:0:1;0:0:0:0:-1:0:0:0:0:0:0:0",
        ),
    ] {
        redis::cmd("HSET")
            .arg(&leases)
            .arg("r2")
            .arg(value)
            .exec(&mut c)
            .unwrap();
        let before = dump(&mut c);
        let e = store.renew(&p, &req("a", Amounts::ZERO)).unwrap_err();
        assert!(matches!(e, StoreError::Corrupt(_)), "{name}: {e:?}");
        assert_eq!(dump(&mut c), before, "{name}: the script wrote");
    }
}

/// A replica of the previous format (format 1, its keys under `v1`) and one of format 2 on the
/// same budget: the first format-2 renewal marks format 1's meta key, after which the format-1
/// script answers `LLMBH_FOREIGN` (its agent degrades fail-closed), whether its table existed
/// before or not; the new table learns first, so the format-2 replica grows only after
/// `ttl + quarantine`, when what a format-1 replica still held has ended.
#[test]
fn a_replica_of_the_old_format_meets_a_foreign_format() {
    let Some(server) = Server::get("oldformat") else {
        return;
    };
    let mut c = server.conn();
    let ns = namespace("oldformat");
    let config = ClusterConfig::new(&ns, "b");
    let mut store = RedisStore::open(&server.url, &config).unwrap();
    let old = redis::Script::new(include_str!("support/lease_v1.lua"));
    let v1 = |c: &mut redis::Connection| -> redis::RedisResult<redis::Value> {
        let base = format!("llm-bulkhead:{{{ns}/b}}:v1");
        old.key(format!("{base}:meta"))
            .key(format!("{base}:leases"))
            .arg("renew")
            .arg("llm-bulkhead-lease/1")
            .arg(&[
                "4", "100", "0", "0", "300", "300", "old", "0", "0", "0", "0", "2", "10", "0", "0",
            ])
            .invoke(c)
    };
    // The old replica's table exists and answers.
    assert!(v1(&mut c).is_ok());
    let p = small();
    let r = store.renew(&p, &hello()).unwrap();
    assert!(
        r.learning && r.granted == Amounts::ZERO,
        "a new table learns first: {r:?}"
    );
    let e = v1(&mut c).unwrap_err();
    assert_eq!(e.code(), Some("LLMBH_FOREIGN"), "{e:?}");
    // A format-1 replica that starts later meets the same.
    let base = format!("llm-bulkhead:{{{ns}/b}}:v1");
    redis::cmd("DEL")
        .arg(format!("{base}:leases"))
        .exec(&mut c)
        .unwrap();
    assert_eq!(v1(&mut c).unwrap_err().code(), Some("LLMBH_FOREIGN"));
    // Past learning, the format-2 table grants; then the mark is lost (an operator deleted the
    // key) and a format-1 replica creates its table: the format-2 table learns again, for
    // ttl + quarantine, and marks it.
    let [meta, _] = store.keys().clone();
    redis::cmd("HSET")
        .arg(&meta)
        .arg("learning_until")
        .arg(0)
        .exec(&mut c)
        .unwrap();
    assert!(!store.renew(&p, &hello()).unwrap().learning);
    redis::cmd("DEL")
        .arg(format!("{base}:meta"))
        .exec(&mut c)
        .unwrap();
    assert!(v1(&mut c).is_ok(), "format 1 creates its table again");
    let r = store.renew(&p, &hello()).unwrap();
    assert!(r.learning, "a format-1 table appeared: learn first");
    assert_eq!(v1(&mut c).unwrap_err().code(), Some("LLMBH_FOREIGN"));
}
