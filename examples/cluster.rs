//! Three replica processes on loopback share one global budget (6 slots, 600 tokens) through
//! Redis; replica 0 is killed with SIGKILL halfway, and the others take over its share once its
//! quarantine (`ttl + quarantine` after its last renewal) has passed.
//!
//! ```sh
//! cargo run --release --features cluster --example cluster
//! ```
//!
//! It uses the server named by `LLM_BULKHEAD_REDIS_URL`, or starts a private `redis-server`
//! (on a Unix socket in a temporary directory, no persistence) if one is on PATH. Each replica
//! prints, every 250 ms, the share its agent installed and its work in flight; the parent
//! prints them side by side.

#[path = "../tests/support/redis_server.rs"]
mod redis_server;

use llm_bulkhead::cluster::{Amounts, ClusterAgent, ClusterConfig, RedisStore};
use llm_bulkhead::{Bulkhead, Demand, Reservation};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const GLOBAL: Amounts = Amounts::new(6, 600);
const RUN: Duration = Duration::from_secs(6);

fn config(ns: &str) -> ClusterConfig {
    ClusterConfig::new(ns, "provider")
        .ttl(Duration::from_millis(600))
        .max_admission(Duration::from_millis(300))
        .floor(Amounts::new(1, 50))
        .floor_hold(Duration::from_millis(200))
        .quarantine(Duration::from_millis(600))
}

/// One replica: a bulkhead built with the global limits, its agent, four busy workers.
fn replica(url: &str, ns: &str) {
    let b = Bulkhead::builder()
        .max_concurrent(GLOBAL.slots as u32)
        .token_budget(GLOBAL.tokens)
        .build()
        .unwrap();
    let store = RedisStore::open(url, &config(ns)).unwrap();
    let agent = ClusterAgent::new(b.clone(), Box::new(store), config(ns))
        .unwrap()
        .spawn()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let d = Demand::tokens(Reservation::new(60, 40).unwrap());
                    match b.try_acquire(d) {
                        Ok(a) => {
                            std::thread::sleep(Duration::from_millis(5)); // the provider call
                            drop(a);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })
        })
        .collect();
    let start = Instant::now();
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_millis(250));
        let (s, st) = (b.stats(), agent.status());
        let phase = if st.learning {
            "learning".to_string()
        } else {
            format!("{:?}", st.phase)
        };
        println!(
            "{} {} {} {phase}",
            st.installed.slots, s.in_flight, st.installed.tokens
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    agent.stop().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--replica" {
        return replica(&args[2], &args[3]);
    }
    let Some(server) = redis_server::Server::get("example") else {
        eprintln!("no Redis: set LLM_BULKHEAD_REDIS_URL or install redis-server");
        std::process::exit(2);
    };
    let ns = redis_server::namespace("example");
    let c = config(&ns);
    println!(
        "global {GLOBAL:?}; ttl {:?}, quarantine {:?}: a dead replica's share is reusable \
         {} ms after its last renewal",
        c.ttl,
        c.quarantine,
        c.store_params(GLOBAL).hold_ms()
    );
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<_> = (0..3)
        .map(|n| {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--replica", &server.url, &ns])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((n, line));
                }
            });
            child
        })
        .collect();
    drop(tx);
    println!("  t(s)  replica 0 share/in flight   replica 1           replica 2");
    let start = Instant::now();
    let mut row = [String::from("-"), String::from("-"), String::from("-")];
    let mut killed = false;
    for (n, line) in rx {
        let f: Vec<&str> = line.split_whitespace().collect();
        row[n] = format!("{}/{} {}", f[0], f[1], f[3]);
        if n == 2 {
            println!(
                "{:6.2}  {:26}  {:18}  {}",
                start.elapsed().as_secs_f64(),
                row[0],
                row[1],
                row[2]
            );
        }
        if !killed && start.elapsed() > RUN / 2 {
            killed = true;
            let _ = children[0].kill(); // SIGKILL: no goodbye to the store
            let _ = children[0].wait();
            row[0] = "killed".into();
            println!("------  replica 0 killed with SIGKILL; its share stays reserved for the quarantine");
        }
    }
    for c in children.iter_mut().skip(1) {
        let _ = c.wait();
    }
}
