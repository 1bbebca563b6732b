//! Replica *processes* against a real Redis: three copies of this test binary, each a bulkhead
//! with its agent and worker threads, log every admission (`S`, right after it is admitted)
//! and release (`E`, right before it is released) with `CLOCK_MONOTONIC` (one clock for every
//! process on the host), so each logged interval lies inside the true one and any logged
//! overlap above the global limits is a real overshoot. One replica is killed with `SIGKILL`
//! halfway (its open work ends when it dies), another is stopped with `SIGSTOP` for less than
//! the quarantine and continued. The sweep over all logs must stay within the global limits,
//! and the survivors must take over the killed replica's share once its quarantine passed.

#![cfg(target_os = "linux")]

#[path = "support/redis_server.rs"]
mod redis_server;

use llm_bulkhead::cluster::{Amounts, ClusterAgent, ClusterConfig, RedisStore};
use llm_bulkhead::{Bulkhead, Demand, Reservation};
use redis_server::{namespace, Server};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD: &str = "LLM_BULKHEAD_CLUSTER_CHILD";
const G: Amounts = Amounts::new(6, 600);

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn config(ns: &str) -> ClusterConfig {
    redis_server::quick_config(ns, 300)
}

/// The replica, when this binary runs as a child (`url|namespace|run_ms`); a no-op otherwise.
#[test]
fn replica_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (url, ns, run_ms) = (parts[0], parts[1], parts[2].parse::<u64>().unwrap());
    let c = config(ns);
    let b = Bulkhead::builder()
        .max_concurrent(G.slots as u32)
        .token_budget(G.tokens)
        .build()
        .unwrap();
    let store = RedisStore::open(url, &c).unwrap();
    let agent = ClusterAgent::new(b.clone(), Box::new(store), c)
        .unwrap()
        .on_event(|e| println!("@@ V {} {e:?}", monotonic_ns()))
        .spawn()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The workers admit through the cluster handle (the share's window checked on their own
    // threads), as a gateway would.
    let h = agent.handle();
    let workers: Vec<_> = (0..4u64)
        .map(|k| {
            let (b, stop) = (h.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) && i < 1_000_000 {
                    i += 1;
                    let tokens = 20 + (i * 7 + k * 13) % 80;
                    let d = Demand::tokens(Reservation::new(tokens, 0).unwrap());
                    if let Ok(a) = b.try_acquire(d) {
                        println!("@@ S {k}.{i} {} {tokens}", monotonic_ns());
                        std::thread::sleep(Duration::from_millis(2));
                        println!("@@ E {k}.{i} {} {tokens}", monotonic_ns());
                        drop(a);
                    } else {
                        std::thread::sleep(Duration::from_micros(500));
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(run_ms));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    println!("@@ X {}", monotonic_ns());
    agent.stop().unwrap();
    println!("@@ L {}", monotonic_ns());
    std::io::stdout().flush().unwrap();
}

struct Interval {
    replica: usize,
    start: u64,
    end: u64,
    tokens: u64,
}

/// Largest (slots, tokens) in flight at any instant. Ends before starts at equal stamps: a
/// release and the admission it made room for are stamped in that order (the end before the
/// release, the start after the admission), so an equal stamp is one clock tick both fell in,
/// not an overlap (with starts first, microsecond stamps made this sweep report 7 of 6).
/// Also returns, for the first instant of the slot peak, that instant and the slots each
/// replica had in flight then.
fn sweep(all: &[Interval]) -> (u64, u64, u64, [i64; 3]) {
    let mut ev: Vec<(u64, i8, u64, usize)> = Vec::new();
    for i in all {
        ev.push((i.start, 1, i.tokens, i.replica));
        ev.push((i.end, 0, i.tokens, i.replica));
    }
    ev.sort();
    let (mut s, mut t, mut ms, mut mt) = (0i64, 0i64, 0i64, 0i64);
    let (mut per, mut at, mut per_at) = ([0i64; 3], 0, [0i64; 3]);
    for (time, kind, tokens, r) in ev {
        let tokens = tokens as i64;
        if kind == 1 {
            s += 1;
            t += tokens;
            per[r] += 1;
        } else {
            s -= 1;
            t -= tokens;
            per[r] -= 1;
        }
        if s > ms {
            (ms, at, per_at) = (s, time, per);
        }
        mt = mt.max(t);
    }
    (ms as u64, mt as u64, at, per_at)
}

#[test]
fn replica_processes_killed_and_stopped_stay_within_the_global_limits() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(server) = Server::get("procs") else {
        return;
    };
    let ns = namespace("procs");
    let c = config(&ns);
    let run_ms = 4_000u64;
    let exe = std::env::current_exe().unwrap();
    let logs: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for n in 0..3 {
        let mut child = Command::new(&exe)
            .args([
                "replica_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, format!("{}|{ns}|{run_ms}", server.url))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let logs = logs.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("@@ ") {
                    logs.lock().unwrap().push((n, line));
                }
            }
        }));
        children.push(child);
    }
    let leases = format!("llm-bulkhead:{{{ns}/b}}:v2:leases");
    let mut conn = server.conn();
    let granted = |conn: &mut redis::Connection| -> Vec<u64> {
        let m: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(&leases).query(conn).unwrap();
        m.values()
            .map(|v| v.split(':').nth(2).unwrap().parse().unwrap())
            .collect()
    };
    let wait_for = |what: &str, f: &mut dyn FnMut() -> bool| {
        let until = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < until, "{what}: not within 20 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Three replicas with grants after the learning period.
    wait_for("three grants", &mut || {
        let g = granted(&mut conn);
        g.len() == 3 && g.iter().all(|&s| s > 0)
    });
    // SIGKILL replica 0: its work ends with it.
    let pid0 = children[0].id() as i32;
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(pid0, libc::SIGKILL) };
    children[0].wait().unwrap();
    let killed_at = monotonic_ns();
    // SIGSTOP replica 1 for 150 ms (less than the quarantine), then SIGCONT.
    let pid1 = children[1].id() as i32;
    // SAFETY: as above.
    unsafe { libc::kill(pid1, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(150));
    // SAFETY: as above.
    unsafe { libc::kill(pid1, libc::SIGCONT) };
    // The survivors take over the killed replica's share after its quarantine.
    wait_for("the killed replica's record reclaimed", &mut || {
        granted(&mut conn).len() == 2
    });
    wait_for("the survivors hold more than two thirds", &mut || {
        granted(&mut conn).iter().sum::<u64>() > 4
    });
    let took_over_at = monotonic_ns();
    for mut ch in children.into_iter().skip(1) {
        assert!(ch.wait().unwrap().success());
    }
    for r in readers {
        r.join().unwrap();
    }
    // Intervals per (replica, admission); replica 0's open ones end at its death.
    let logs = logs.lock().unwrap();
    let mut open: std::collections::HashMap<(usize, String), (u64, u64)> = Default::default();
    let mut all = Vec::new();
    for (n, line) in logs.iter() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if !matches!(f[1], "S" | "E") {
            continue;
        }
        let (kind, id, t, tokens) = (
            f[1],
            f[2].to_string(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        );
        if kind == "S" {
            open.insert((*n, id), (t, tokens));
        } else if let Some((start, tokens)) = open.remove(&(*n, id)) {
            all.push(Interval {
                replica: *n,
                start,
                end: t,
                tokens,
            });
        }
    }
    for ((n, _), (start, tokens)) in open {
        assert_eq!(n, 0, "only the killed replica leaves work open");
        all.push(Interval {
            replica: n,
            start,
            end: killed_at,
            tokens,
        });
    }
    let (slots, tokens, peak_at, per) = sweep(&all);
    if slots > G.slots {
        // The agents' events around the peak, for the failure message.
        for (n, line) in logs.iter() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let t: u64 = f[2].parse().unwrap_or(0);
            if matches!(f[1], "V" | "X" | "L")
                && t + 500_000_000 > peak_at
                && t < peak_at + 100_000_000
            {
                eprintln!(
                    "replica {n} at {} ms: {}",
                    (t as i64 - peak_at as i64) / 1_000_000,
                    f[1..].join(" ")
                );
            }
        }
    }
    eprintln!(
        "{} admissions logged; peak in flight across processes: {slots} slots, {tokens} tokens \
         (global {G:?}); take-over {} ms after the kill",
        all.len(),
        (took_over_at - killed_at) / 1_000_000
    );
    assert!(all.len() > 100);
    assert!(
        slots <= G.slots && tokens <= G.tokens,
        "overshoot: {slots} slots, {tokens} tokens; the slot peak {} ms after the kill, per \
         replica {per:?}",
        (peak_at as i64 - killed_at as i64) / 1_000_000
    );
    // The quarantine was respected: no take-over before ttl + quarantine after the kill
    // (the killed replica renewed less than a TTL before it).
    let hold_ms = c.store_params(G).hold_ms();
    assert!((took_over_at - killed_at) / 1_000_000 + c.ttl.as_millis() as u64 >= hold_ms);
}
