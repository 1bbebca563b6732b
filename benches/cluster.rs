//! Cluster-mode figures against a real Redis (`LLM_BULKHEAD_REDIS_URL`, or a private
//! `redis-server` on a Unix socket):
//!
//! 1. the decision path: an admit + release pair on a bulkhead whose limits an agent manages
//!    (renewing in the background) beside the same pair on an unmanaged bulkhead, and the pair
//!    through the agent's `ClusterBulkhead` (window checks and deadline: three clock reads),
//!    alternating rounds in one run (`--pair-only` stops after this part);
//! 2. store traffic: commands the server processed per renewal (its own counter), and the
//!    latency of one renewal (`EVALSHA`); then bytes and commands per renewal of the previous
//!    lease format (1, no classes) against format 2 without classes and with two classes, on
//!    the same tables (`--traffic-only` runs only this comparison);
//! 3. demand to use, TTL 1 s: how long after one replica's load rises its work in flight
//!    reaches its fair share;
//! 4. utilisation of the global budget under skewed load across three replicas (8, 3 and 1
//!    busy workers for 8 slots), against the ideal and against a static split.
//!
//! ```sh
//! cargo bench --features cluster --bench cluster
//! ```

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use llm_bulkhead::cluster::{
    Amounts, ClusterAgent, ClusterBulkhead, ClusterConfig, RedisStore, RunningAgent,
};
use llm_bulkhead::cluster::{LeaseStore, RenewRequest};
use llm_bulkhead::{Bulkhead, Demand, Reservation};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const G: Amounts = Amounts::new(8, 8_000);

fn config(ns: &str, ttl_ms: u64) -> ClusterConfig {
    redis_server::quick_config(ns, ttl_ms)
}

fn bulkhead() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(G.slots as u32)
        .token_budget(G.tokens)
        .build()
        .unwrap()
}

fn agent(url: &str, c: &ClusterConfig, b: &Bulkhead) -> RunningAgent {
    let store = RedisStore::open(url, c).unwrap();
    ClusterAgent::new(b.clone(), Box::new(store), c.clone())
        .unwrap()
        .spawn()
        .unwrap()
}

fn wait(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// ns per call of `pair` (one admit + release of 100 tokens), over `n` calls.
fn per_pair(n: u32, mut pair: impl FnMut(Demand)) -> f64 {
    let d = Demand::tokens(Reservation::new(100, 0).unwrap());
    let t = Instant::now();
    for _ in 0..n {
        pair(black_box(d));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

fn pair_ns(b: &Bulkhead, n: u32) -> f64 {
    per_pair(n, |d| drop(black_box(b.try_acquire(d).unwrap())))
}

fn handle_pair_ns(h: &ClusterBulkhead, n: u32) -> f64 {
    per_pair(n, |d| drop(black_box(h.try_acquire(d).unwrap())))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Calls per command name at the server (`INFO commandstats`); commands a script runs count
/// under their own names.
fn commands(c: &mut redis::Connection) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Workers that keep `b` busy: admit, hold `hold`, release; until `stop`.
fn busy(
    b: &Bulkhead,
    n: usize,
    hold: Duration,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match b.try_acquire(Demand::tokens(Reservation::new(100, 0).unwrap())) {
                        Ok(a) => {
                            std::thread::sleep(hold);
                            drop(a);
                        }
                        Err(_) => std::thread::sleep(Duration::from_micros(200)),
                    }
                }
            })
        })
        .collect()
}

/// The server's byte counters (`INFO stats`): received, sent.
fn net_bytes(c: &mut redis::Connection) -> (u64, u64) {
    let info: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
    let get = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        get("total_net_input_bytes:"),
        get("total_net_output_bytes:"),
    )
}

/// Bytes (to and from the server) and commands inside the script per renewal: the previous
/// format (1, its script kept in `tests/support/lease_v1.lua`), and format 2 without and with
/// two classes; three replicas renewing in turn on one table, 600 renewals each.
fn format_traffic(url: &str, conn: &mut redis::Connection) {
    use llm_bulkhead::cluster::{ClassParams, ClassShare, ClassUse};
    const N: u64 = 600;
    let measure = |conn: &mut redis::Connection, f: &mut dyn FnMut(u64)| -> (f64, f64, f64) {
        let c0 = commands(conn);
        let (i0, o0) = net_bytes(conn);
        for i in 0..N {
            f(i);
        }
        let (i1, o1) = net_bytes(conn);
        let c1 = commands(conn);
        let inner: u64 = ["type", "hgetall", "hget", "time", "hset", "hdel"]
            .iter()
            .map(|k| c1.get(*k).copied().unwrap_or(0) - c0.get(*k).copied().unwrap_or(0))
            .sum();
        let per = |x: u64| x as f64 / N as f64;
        (per(i1 - i0), per(o1 - o0), per(inner))
    };
    // The byte counters' own INFO calls, to subtract.
    let (bi, bo, _) = measure(conn, &mut |_| {});
    let measure = |conn: &mut redis::Connection, f: &mut dyn FnMut(u64)| {
        let (i, o, c) = measure(conn, f);
        (i - bi, o - bo, c)
    };
    let mut c2 = redis::Client::open(url).unwrap().get_connection().unwrap();
    // Format 1: its script, called as its store did (EVALSHA after one SCRIPT LOAD).
    let old = redis::Script::new(include_str!("../tests/support/lease_v1.lua"));
    let base = format!("llm-bulkhead:{{{}/b}}:v1", redis_server::namespace("old"));
    let _ = old
        .key(format!("{base}:meta"))
        .key(format!("{base}:leases"))
        .arg("release")
        .arg("llm-bulkhead-lease/1")
        .arg(&[
            "8", "8000", "1", "100", "1000", "1000", "x", "0", "0", "0", "0", "0", "0", "0", "0",
        ])
        .invoke::<redis::Value>(&mut c2);
    let v1 = measure(conn, &mut |i| {
        let r = format!("r{}", i % 3);
        let args = [
            "8", "8000", "1", "100", "1000", "1000", &r, "2", "200", "1", "50", "2", "200", "0",
            "0",
        ];
        old.key(format!("{base}:meta"))
            .key(format!("{base}:leases"))
            .arg("renew")
            .arg("llm-bulkhead-lease/1")
            .arg(&args)
            .invoke::<redis::Value>(&mut c2)
            .unwrap();
    });
    let mut v2 = Vec::new();
    for classes in [0usize, 2] {
        let c = config(&redis_server::namespace(&format!("fmt{classes}")), 1_000);
        let mut store = RedisStore::open(url, &c).unwrap();
        let mut p = c.store_params(G);
        p.classes = ["interactive", "batch"][..classes]
            .iter()
            .map(|n| ClassParams {
                name: (*n).into(),
                floor: Amounts::new(2, 2_000),
                ceiling: Amounts::new(6, 6_000),
                min: Amounts::new(0, 250),
            })
            .collect();
        store
            .renew(
                &p,
                &RenewRequest::new("warm", Amounts::ZERO, Amounts::ZERO, Amounts::ZERO)
                    .with_classes(
                        p.classes
                            .iter()
                            .map(|k| {
                                ClassUse::new(
                                    &k.name,
                                    ClassShare::ZERO,
                                    Amounts::ZERO,
                                    Amounts::ZERO,
                                )
                            })
                            .collect(),
                    ),
            )
            .unwrap();
        v2.push(measure(conn, &mut |i| {
            let uses = p
                .classes
                .iter()
                .map(|k| {
                    let s = ClassShare {
                        floor: Amounts::new(1, 100),
                        ceiling: Amounts::new(2, 200),
                    };
                    ClassUse::new(&k.name, s, Amounts::new(1, 50), Amounts::new(2, 200))
                })
                .collect();
            let req = RenewRequest::new(
                &format!("r{}", i % 3),
                Amounts::new(2, 200),
                Amounts::new(1, 50),
                Amounts::new(2, 200),
            )
            .with_classes(uses);
            store.renew(&p, &req).unwrap();
        }));
    }
    println!("\n2b. bytes and commands per renewal, 3 replicas on one table, {N} renewals each:");
    for (name, (i, o, c)) in [
        ("format 1 (before)", v1),
        ("format 2, no classes", v2[0]),
        ("format 2, 2 classes", v2[1]),
    ] {
        println!("   {name:22} {i:6.0} B to the server, {o:5.0} B back, {c:4.1} commands inside the script");
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(server) = redis_server::Server::get("bench") else {
        return;
    };
    let url = server.url.clone();
    let mut conn = server.conn();
    println!("cluster-mode figures (noisy 2-core machine; Redis on a Unix socket, same host)\n");
    if std::env::args().any(|a| a == "--traffic-only") {
        format_traffic(&url, &mut conn);
        return;
    }

    // 1. The decision path, managed vs unmanaged, alternating rounds.
    let c = config(&redis_server::namespace("pair"), 1_000);
    let managed = bulkhead();
    let running = agent(&url, &c, &managed);
    wait("the first grant", || {
        managed.limits().max_concurrent == G.slots as u32
    });
    let plain = bulkhead();
    let handle = running.handle();
    // A second managed bulkhead, on a budget of its own, whose agent runs on the coarse clock.
    let ck = config(&redis_server::namespace("pair-coarse"), 1_000);
    let coarse_b = bulkhead();
    let coarse_agent = ClusterAgent::with_clock(
        coarse_b.clone(),
        Box::new(RedisStore::open(&url, &ck).unwrap()),
        ck,
        Arc::new(llm_bulkhead::cluster::CoarseClock::new()),
    )
    .unwrap()
    .spawn()
    .unwrap();
    wait("the coarse agent's grant", || {
        coarse_b.limits().max_concurrent > 0
    });
    let coarse = coarse_agent.handle();
    let (mut a, mut p, mut h, mut k) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..7 {
        p.push(pair_ns(&plain, 2_000_000));
        a.push(pair_ns(&managed, 2_000_000));
        h.push(handle_pair_ns(&handle, 2_000_000));
        k.push(handle_pair_ns(&coarse, 2_000_000));
    }
    coarse_agent.stop().unwrap();
    let (pm, am, hm, km) = (median(p), median(a), median(h), median(k));
    println!("1. admit + release pair (1 thread, median of 7 rounds of 2M):");
    println!("   unmanaged bulkhead      {pm:6.1} ns");
    println!(
        "   agent-managed bulkhead  {am:6.1} ns   ratio {:.2}",
        am / pm
    );
    println!(
        "   through ClusterBulkhead {hm:6.1} ns   ratio {:.2}",
        hm / pm
    );
    println!(
        "   the same, CoarseClock   {km:6.1} ns   ratio {:.2}",
        km / pm
    );
    let renewals = running.status().renewals;
    running.stop().unwrap();
    if std::env::args().any(|a| a == "--pair-only") {
        return;
    }

    // 2. Store traffic per renewal, and renewal latency.
    let c = config(&redis_server::namespace("traffic"), 1_000);
    let before = commands(&mut conn);
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let agents: Vec<_> = bs.iter().map(|b| agent(&url, &c, b)).collect();
    std::thread::sleep(Duration::from_secs(4));
    let n: u64 = agents.iter().map(|a| a.status().renewals).sum();
    let failures: u64 = agents.iter().map(|a| a.status().failures).sum();
    for a in agents {
        a.stop().unwrap();
    }
    let after = commands(&mut conn);
    let delta = |k: &str| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    let (evalsha, eval) = (delta("evalsha"), delta("eval"));
    let setup: u64 = ["info", "client|setinfo", "script|load", "hello", "ping"]
        .iter()
        .map(|k| delta(k))
        .sum::<u64>()
        - 1;
    let inner: u64 = ["type", "hgetall", "time", "hset", "hdel"]
        .iter()
        .map(|k| delta(k))
        .sum();
    println!(
        "\n2. store traffic: 3 replicas, TTL 1 s, 4 s: {n} renewals ({failures} failed), {:.1} per \
         replica per second",
        n as f64 / 3.0 / 4.0
    );
    println!(
        "   round trips: {evalsha} EVALSHA + {eval} EVAL (3 of them the releases at stop) = {:.2} \
         per renewal, plus {setup} set-up commands in all (INFO, CLIENT SETINFO, SCRIPT LOAD); \
         inside the script {:.1} commands per call",
        (evalsha + eval) as f64 / n as f64,
        inner as f64 / (evalsha + eval).max(1) as f64
    );
    let mut store =
        RedisStore::open(&url, &config(&redis_server::namespace("lat"), 1_000)).unwrap();
    let p = config("x", 1_000).store_params(G);
    let mut lat = Vec::new();
    for i in 0..2_000u64 {
        let req = RenewRequest::new(
            &format!("r{}", i % 3),
            Amounts::ZERO,
            Amounts::ZERO,
            Amounts::new(2, 100),
        );
        let t = Instant::now();
        store.renew(&p, &req).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    println!(
        "   one renewal (EVALSHA, 3 records): p50 {:.0} µs, p99 {:.0} µs",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    let _ = renewals;
    format_traffic(&url, &mut conn);

    // 3. Demand to use, TTL 1 s.
    let c = config(&redis_server::namespace("rise"), 1_000);
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let agents: Vec<_> = bs.iter().map(|b| agent(&url, &c, b)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for b in &bs {
        workers.extend(busy(b, 1, Duration::from_millis(3), &stop));
    }
    wait("learning over", || {
        agents
            .iter()
            .all(|a| a.status().renewals > 3 && !a.status().learning)
    });
    std::thread::sleep(Duration::from_millis(1_500));
    let before = bs[0].limits().max_concurrent;
    let t0 = Instant::now();
    workers.extend(busy(&bs[0], 10, Duration::from_millis(3), &stop));
    // Fair share for demands (≥ 8, 1, 1) with floors of 1: 6 slots.
    let mut reached = None;
    while t0.elapsed() < Duration::from_secs(10) {
        let s = bs[0].stats();
        if s.in_flight >= 6 {
            reached = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    println!("\n3. demand to use (TTL 1 s, renew every 333 ms, early renewals under refusals at most every 100 ms):");
    println!(
        "   replica 0's share before the rise: {before} slots; 6 slots in flight after {:?}",
        reached.map(|d| d.as_millis())
    );
    stop.store(true, Ordering::Relaxed);
    for w in workers.drain(..) {
        w.join().unwrap();
    }
    for a in agents {
        a.stop().unwrap();
    }

    // 4. Utilisation under skewed load.
    let c = config(&redis_server::namespace("skew"), 1_000);
    let bs: Vec<_> = (0..3).map(|_| bulkhead()).collect();
    let agents: Vec<_> = bs.iter().map(|b| agent(&url, &c, b)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    for (b, n) in bs.iter().zip([8, 3, 1]) {
        workers.extend(busy(b, n, Duration::from_millis(5), &stop));
    }
    wait("learning over", || {
        agents
            .iter()
            .all(|a| a.status().renewals > 3 && !a.status().learning)
    });
    std::thread::sleep(Duration::from_secs(2));
    let (mut sum, mut samples) = (0u64, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        sum += bs.iter().map(|b| b.stats().in_flight).sum::<u64>();
        samples += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let shares: Vec<u32> = bs.iter().map(|b| b.limits().max_concurrent).collect();
    stop.store(true, Ordering::Relaxed);
    for w in workers.drain(..) {
        w.join().unwrap();
    }
    for a in agents {
        a.stop().unwrap();
    }
    let used = sum as f64 / samples as f64 / G.slots as f64;
    println!(
        "\n4. utilisation, 3 replicas with 8, 3 and 1 busy workers (5 ms holds) for 8 slots, 5 s:"
    );
    println!("   leased shares: {:.1} % of the global slots in flight on average (final shares {shares:?})", used * 100.0);
    println!(
        "   ideal: 100 % (demand 12 > 8); a static split 3/3/2: (3 + 3 + 1) / 8 = 87.5 % at best"
    );
}
