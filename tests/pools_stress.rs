//! The pools on real threads, under reconfiguration: an independent tally of every limit
//! (each partition's active units and tokens, each provider's connections, the global guard,
//! each partition's retries in flight), raised only after an admission or a charge returns and
//! lowered before it is given back, is checked against the limits after every raise. Limits
//! move between two sets while the threads run, so a tally is checked against the larger of the
//! two (units admitted under a larger limit stay until released). At rest everything is zero.
//!
//! Class `y` waits (a pending queue of two per partition): a worker that holds nothing waits
//! for a `y` partition, blocking or async (an async wait is polled once and, if it has to
//! wait, dropped at once: a cancellation that races with the releases that may start it). A
//! started waiter is tallied as any admission; the pending counts never pass their limit
//! (read by the reconfiguring thread after every change) and are zero at rest.
//!
//! It prints the refusals that first waited for another decision's tentative unit
//! (`contended_refusals`) beside all refusals.
//!
//! `every_refusal_is_explained_by_its_holders` classifies each refusal of a run on real
//! threads against an upper bound of the holders of the limit that refused it: every admission
//! is counted as holding its units from the moment its call began to the moment its release
//! returned (one logical clock, a shared counter, orders the calls). A refusal during which
//! that upper bound left room for the request at every instant is one no serial order makes
//! (the request was refused for units nobody held: a tentative unit that was then undone). It
//! must never happen. Before the pools waited for tentative units (`src/pools/words.rs`,
//! `step`), one of three runs of this test found 134 such refusals among 45,760 (0.29%; the
//! other two none) on a shared 2-core
//! machine; the reconfiguring run below counted 144 refusals out of 16,350 (0.88%) that met a
//! tentative unit.

use llm_bulkhead::pools::*;
use llm_bulkhead::Priority;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

const PARTS: [&str; 4] = ["a-x", "a-y", "b-x", "b-y"];
/// Larger and smaller active limits, per partition.
const BIG: [u64; 4] = [4, 3, 4, 3];
const SMALL: [u64; 4] = [2, 1, 3, 2];
const CONN: [(u64, u64); 2] = [(6, 4), (5, 4)];
const GLOBAL: (u64, u64) = (8, 6);
const BUDGET: u64 = 20;
const RETRY_MIN: u64 = 1;
const RETRY_PERCENT: u64 = 50;
const PENDING: u64 = 2;

fn config() -> PoolsConfig {
    let mut c = PoolsConfig::default();
    c.global.max_active = GLOBAL.0;
    for (name, (limit, _)) in ["a", "b"].iter().zip(CONN) {
        c.providers.insert(
            (*name).into(),
            ProviderConfig {
                connection_limit: limit,
            },
        );
    }
    c.classes.insert(
        "x".into(),
        ClassConfig {
            overflow: Overflow::Fallback,
        },
    );
    c.classes.insert(
        "y".into(),
        ClassConfig {
            overflow: Overflow::Wait,
        },
    );
    for (i, name) in PARTS.iter().enumerate() {
        let mut p = PartitionConfig::new(&name[..1], &name[2..], BIG[i]);
        p.high_priority_reserve = 1;
        (p.pending_limit, p.queue_max_age_ms) = (PENDING, 60_000);
        p.token_budget = Some(BUDGET);
        p.retry = RetryConfig {
            percent: RETRY_PERCENT,
            min: RETRY_MIN,
        };
        c.partitions.insert((*name).into(), p);
    }
    c.partitions.get_mut("a-x").unwrap().fallback = vec!["b-x".into()];
    c
}

#[derive(Default)]
struct Tally {
    active: [AtomicU64; 4],
    tokens: [AtomicU64; 4],
    retries: [AtomicU64; 4],
    conns: [AtomicU64; 2],
    global: AtomicU64,
}

fn raise(c: &AtomicU64, n: u64, limit: u64, what: &str) {
    let now = c.fetch_add(n, Ordering::SeqCst) + n;
    assert!(now <= limit, "{what}: {now} > {limit}");
}

fn lower(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Ordering::SeqCst);
}

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

/// One admitted request of a worker: permit, partition, tokens, the partition of its retry.
type Held<'p> = (PoolPermit<'p>, usize, u64, Option<usize>);

fn give_back(tally: &Tally, (permit, at, tokens, retry): Held<'_>) {
    lower(&tally.global, 1);
    lower(&tally.conns[at / 2], 1);
    lower(&tally.tokens[at], tokens);
    lower(&tally.active[at], 1);
    if let Some(r) = retry {
        lower(&tally.retries[r], 1);
    }
    permit.complete(None);
}

/// Each worker holds up to three admissions at a time, so the threads together can reach
/// every limit (the guard, connections, tokens).
fn worker(pools: &Pools, tally: &Tally, seed: u64, rounds: u32) {
    let mut rng = Rng(seed);
    let ids: Vec<PartitionId> = PARTS.iter().map(|n| pools.partition(n).unwrap()).collect();
    let retry_cap = (RETRY_PERCENT * BIG.iter().max().unwrap() / 100).max(RETRY_MIN);
    let mut held: Vec<Held<'_>> = Vec::new();
    for n in 0..rounds {
        if held.len() == 3 || !held.is_empty() && rng.below(3) == 0 {
            let k = rng.below(held.len() as u64) as usize;
            give_back(tally, held.swap_remove(k));
            continue;
        }
        let part = rng.below(4) as usize;
        let mut req = PoolRequest::new(u64::from(n), ids[part]);
        req.tokens = rng.below(7);
        req.priority = if rng.below(3) == 0 {
            Priority::High
        } else {
            Priority::Normal
        };
        let charge = if rng.below(4) == 0 {
            match pools.charge_retry(u64::from(n), ids[part]) {
                Ok(c) => {
                    raise(&tally.retries[part], 1, retry_cap, "retries");
                    Some(c)
                }
                Err(_) => continue,
            }
        } else {
            None
        };
        let retry = charge.is_some().then_some(part);
        let out = match charge {
            Some(c) if rng.below(3) == 0 => {
                // The retry is abandoned during its back-off.
                lower(&tally.retries[part], 1);
                drop(c);
                continue;
            }
            Some(c) => pools.admit_retry(&req, c),
            // A worker that holds nothing may wait: the holders never wait, so they release.
            None if held.is_empty() && part % 2 == 1 => {
                if rng.below(2) == 0 {
                    pools.admit_blocking(&req, None)
                } else {
                    let mut wait = Box::pin(pools.admit_async(req, None));
                    let mut cx = Context::from_waker(Waker::noop());
                    match wait.as_mut().poll(&mut cx) {
                        Poll::Ready(out) => out,
                        Poll::Pending => continue, // dropped: cancelled
                    }
                }
            }
            None => pools.admit(&req),
        };
        let Some(permit) = out.into_permit() else {
            if retry.is_some() {
                lower(&tally.retries[part], 1);
            }
            continue;
        };
        let at = permit.partition().index();
        raise(&tally.active[at], 1, BIG[at], PARTS[at]);
        raise(&tally.tokens[at], req.tokens, BUDGET, "tokens");
        raise(&tally.conns[at / 2], 1, CONN[at / 2].0, "connections");
        raise(&tally.global, 1, GLOBAL.0, "global");
        held.push((permit, at, req.tokens, retry));
    }
    for h in held {
        give_back(tally, h);
    }
}

#[test]
fn every_limit_holds_on_real_threads_under_reconfiguration() {
    let config = config();
    let pools = Arc::new(Pools::new(&config).unwrap());
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let reconfigurer = {
        let (pools, stop, config) = (pools.clone(), stop.clone(), config.clone());
        std::thread::spawn(move || {
            let mut small = false;
            let mut changes = 0u64;
            while !stop.load(Ordering::SeqCst) && changes < 20_000 {
                small = !small;
                let pick = |(b, s): (u64, u64)| if small { s } else { b };
                // Shrink partitions before their providers and the guard; grow them after.
                let parts = |pools: &Pools| {
                    for (i, name) in PARTS.iter().enumerate() {
                        let mut p = config.partitions[*name].clone();
                        p.active_limit = pick((BIG[i], SMALL[i]));
                        p.high_priority_reserve = 1.min(p.active_limit - 1);
                        pools.apply_partition(name, &p).unwrap();
                    }
                };
                if small {
                    parts(&pools);
                }
                pools.apply_provider("a", pick(CONN[0])).unwrap();
                pools.apply_provider("b", pick(CONN[1])).unwrap();
                pools.apply_global(pick(GLOBAL)).unwrap();
                if !small {
                    parts(&pools);
                }
                changes += 1;
                for p in pools.stats().partitions {
                    assert!(p.pending <= p.pending_limit, "{p:?}");
                }
                std::thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (pools, tally) = (pools.clone(), tally.clone());
            std::thread::spawn(move || worker(&pools, &tally, 0x9e37_79b9 + t, 40_000))
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    reconfigurer.join().unwrap();

    let s = pools.stats();
    assert_eq!(s.global.held, 0, "{s:?}");
    assert!(s.providers.iter().all(|p| p.held == 0), "{s:?}");
    for p in &s.partitions {
        assert_eq!(
            (
                p.active,
                p.tentative,
                p.tokens,
                p.retries_in_flight,
                p.pending
            ),
            (0, 0, 0, 0, 0),
            "{p:?}"
        );
        assert_eq!(p.admitted, p.completed);
    }
    let refused: u64 = s
        .partitions
        .iter()
        .map(|p| {
            p.refused_active
                + p.refused_reserve
                + p.refused_tokens
                + p.refused_connection
                + p.refused_global
        })
        .sum();
    let contended: u64 = s.partitions.iter().map(|p| p.contended_refusals).sum();
    let reconfig: u64 = s.partitions.iter().map(|p| p.reconfig_retries).sum();
    let admitted: u64 = s.partitions.iter().map(|p| p.admitted).sum();
    let queued: u64 = s.partitions.iter().map(|p| p.queued).sum();
    let queue_refusals: u64 = s.partitions.iter().map(|p| p.queue_refusals).sum();
    let timed_out: u64 = s.partitions.iter().map(|p| p.timed_out).sum();
    println!(
        "admitted {admitted}, refused {refused}, contended refusals {contended} ({:.3}% of refusals), decisions redone after a reconfiguration {reconfig}; queued {queued}, refused at the queue's entry {queue_refusals}, timed out {timed_out}",
        100.0 * contended as f64 / refused.max(1) as f64
    );
    assert!(queued > 0, "no request waited: the queue was not exercised");
}

/// One call of the classifying run, on the logical clock.
enum Call {
    /// Admitted at `from` (the call's start), released by `to` (the release's return).
    Held {
        part: usize,
        tokens: u64,
        from: u64,
        to: u64,
    },
    /// Refused during `(from, to)`.
    Refused {
        part: usize,
        high: bool,
        tokens: u64,
        reason: Reason,
        from: u64,
        to: u64,
    },
}

/// Completes an admission of the classifying run and logs it, held from its call's start to
/// its release's return.
fn release(
    (permit, part, tokens, from): (PoolPermit<'_>, usize, u64, u64),
    tick: &impl Fn() -> u64,
) -> Call {
    permit.complete(None);
    Call::Held {
        part,
        tokens,
        from,
        to: tick(),
    }
}

/// The most any one limit's holders can have held at an instant of `(from, to)`: `events` are
/// `(time, +/-weight)` sorted by time, `sums[i]` the total after event `i`.
fn most_held(events: &[(u64, i64)], sums: &[i64], from: u64, to: u64) -> i64 {
    let first = events.partition_point(|e| e.0 <= from);
    let at_from = if first == 0 { 0 } else { sums[first - 1] };
    let last = events.partition_point(|e| e.0 < to);
    sums[first..last].iter().copied().fold(at_from, i64::max)
}

#[test]
fn every_refusal_is_explained_by_its_holders() {
    let pools = Pools::new(&config()).unwrap();
    let ids: Vec<PartitionId> = PARTS.iter().map(|n| pools.partition(n).unwrap()).collect();
    let clock = AtomicU64::new(0);
    let tick = || clock.fetch_add(1, Ordering::SeqCst);
    let logs: Vec<Vec<Call>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let (pools, ids, tick) = (&pools, &ids, &tick);
                s.spawn(move || {
                    let mut rng = Rng(0x2545_f491 + t);
                    let mut log = Vec::new();
                    let mut held: Vec<(PoolPermit<'_>, usize, u64, u64)> = Vec::new();
                    for n in 0..20_000u64 {
                        if held.len() == 3 || !held.is_empty() && rng.below(3) == 0 {
                            let k = rng.below(held.len() as u64) as usize;
                            log.push(release(held.swap_remove(k), tick));
                            continue;
                        }
                        let part = rng.below(4) as usize;
                        let mut req = PoolRequest::new(n, ids[part]);
                        req.tokens = rng.below(7);
                        let high = rng.below(3) == 0;
                        if high {
                            req.priority = Priority::High;
                        }
                        let from = tick();
                        match pools.try_admit(&req) {
                            Ok(permit) => held.push((permit, part, req.tokens, from)),
                            Err(r) => log.push(Call::Refused {
                                part,
                                high,
                                tokens: req.tokens,
                                reason: r.reason,
                                from,
                                to: tick(),
                            }),
                        }
                    }
                    log.extend(held.into_iter().map(|h| release(h, tick)));
                    log
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });

    // Each limit's upper-bound holders over time: partitions' active units and tokens, the
    // providers' connections, the global guard.
    let (active, tokens, conn, global) = (0, 4, 8, 10);
    let mut events: Vec<Vec<(u64, i64)>> = vec![Vec::new(); 11];
    for call in logs.iter().flatten() {
        if let Call::Held {
            part,
            tokens: n,
            from,
            to,
        } = *call
        {
            let n = n as i64;
            for (k, w) in [(active + part, 1), (tokens + part, n)]
                .into_iter()
                .chain([(conn + part / 2, 1), (global, 1)])
            {
                events[k].extend([(from, w), (to, -w)]);
            }
        }
    }
    let sums: Vec<Vec<i64>> = events
        .iter_mut()
        .map(|e| {
            e.sort_unstable();
            e.iter()
                .scan(0, |sum, (_, w)| {
                    *sum += w;
                    Some(*sum)
                })
                .collect()
        })
        .collect();
    let (mut refusals, mut spurious) = (0u64, Vec::new());
    for call in logs.iter().flatten() {
        let Call::Refused {
            part,
            high,
            tokens: n,
            reason,
            from,
            to,
        } = *call
        else {
            continue;
        };
        refusals += 1;
        // The limit that refused it, and how much of it the request needed.
        let (k, limit, need) = match reason {
            Reason::ActiveLimitReached | Reason::HighPriorityReserve => {
                let cap = if high { BIG[part] } else { BIG[part] - 1 };
                (active + part, cap, 1)
            }
            Reason::TokenBudgetReached => (tokens + part, BUDGET, n),
            Reason::ConnectionLimitReached => (conn + part / 2, CONN[part / 2].0, 1),
            Reason::GlobalLimitReached => (global, GLOBAL.0, 1),
            other => panic!("unexpected refusal {other:?}"),
        };
        let most = most_held(&events[k], &sums[k], from, to);
        if most + need as i64 <= limit as i64 {
            spurious.push((PARTS[part], reason, most, limit));
        }
    }
    println!(
        "{refusals} refusals, {} with room for the request at every instant of the call",
        spurious.len()
    );
    assert!(refusals > 1_000, "too few refusals to classify: {refusals}");
    assert!(
        spurious.is_empty(),
        "refusals no serial order makes: {spurious:?}"
    );
}
