//! The pools against a plain sequential model: proptest drives both with the same random
//! operations (admissions with fallbacks, completions, retry charges and their attempts,
//! reconfiguration of partitions, providers and the guard) and demands identical decisions,
//! routes and counts after every step, and everything back to zero at rest.
//!
//! The pending queues are in the same model: waits (async futures polled by the test, on an
//! injected clock), their refusals at entry (queue full, deadline unmeetable), starts by the
//! releases and limit changes that free what they need (oldest first, a blocked waiter
//! blocking nobody behind it), expiry by queue age or the caller's deadline, and cancellation
//! before and after a start (a start that reached a dropped waiter goes to the next one).
//!
//! Also: no fallback loop for any configuration (random graphs, cyclic ones included: a cycle
//! is refused at build with a real cycle named; an acyclic one never routes a request to a
//! partition twice, whatever the sequence of refusals).

use llm_bulkhead::pools::*;
use llm_bulkhead::Priority;
use proptest::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

const PROVIDERS: [&str; 2] = ["a", "b"];
const CLASSES: [&str; 2] = ["x", "y"];

/// One partition of the model.
#[derive(Clone, Debug)]
struct MPart {
    provider: usize,
    overflow: Overflow,
    fallback: Vec<usize>,
    limit: u64,
    reserve: u64,
    budget: u64,
    pct: u64,
    min: u64,
    observe: bool,
    pending_limit: u64,
    age: u64,
    pending: u64,
    version: u64,
    active: u64,
    tokens: u64,
    retries: u64,
}

/// The sequential model: counts and limits, the rules written out plainly.
#[derive(Clone, Debug)]
struct Model {
    parts: Vec<MPart>,
    conns: Vec<(u64, u64)>,
    global: (u64, u64),
    max_attempts: u32,
    /// Every wait ever entered, in entry order (the queue is the `Queued` ones).
    waiters: Vec<MW>,
    /// The clock, in milliseconds.
    now: u64,
}

/// One wait of the model.
#[derive(Clone, Debug)]
struct MW {
    part: usize,
    high: bool,
    tokens: u64,
    enq: u64,
    deadline: u64,
    by_age: bool,
    /// The decision that queued it.
    queued: Step,
    state: MWState,
}

#[derive(Clone, Debug, PartialEq)]
enum MWState {
    Queued,
    /// Started (not yet collected): its permit, the version and reason of the start.
    Started(MPermit, u64, Reason),
    Left(Reason),
    Gone,
}

type Step = (usize, Decision, Reason, Option<usize>, u64);

#[derive(Clone, Copy, Debug, PartialEq)]
struct MPermit {
    part: usize,
    tokens: u64,
    retry: Option<usize>,
}

impl Model {
    fn new(c: &PoolsConfig) -> Model {
        let names: Vec<&String> = c.partitions.keys().collect();
        let provs: Vec<&String> = c.providers.keys().collect();
        let parts = c
            .partitions
            .values()
            .map(|p| MPart {
                provider: provs.iter().position(|n| **n == p.provider).unwrap(),
                overflow: c.classes[&p.traffic_class].overflow,
                fallback: p
                    .fallback
                    .iter()
                    .map(|f| names.iter().position(|n| *n == f).unwrap())
                    .collect(),
                limit: p.active_limit,
                reserve: p.high_priority_reserve,
                budget: p.token_budget.unwrap_or(0),
                pct: p.retry.percent,
                min: p.retry.min,
                observe: p.observe,
                pending_limit: p.pending_limit,
                age: p.queue_max_age_ms,
                pending: 0,
                version: 1,
                active: 0,
                tokens: 0,
                retries: 0,
            })
            .collect();
        Model {
            parts,
            conns: c
                .providers
                .values()
                .map(|p| (0, p.connection_limit))
                .collect(),
            global: (0, c.global.max_active),
            max_attempts: c.max_attempts,
            waiters: Vec::new(),
            now: 0,
        }
    }

    /// The start rule: every queued waiter that can start now starts, oldest first; a full
    /// global guard ends the scan.
    fn settle(&mut self) {
        for i in 0..self.waiters.len() {
            if self.waiters[i].state != MWState::Queued {
                continue;
            }
            let (part, high, tokens) = {
                let w = &self.waiters[i];
                (w.part, w.high, w.tokens)
            };
            let v = self.parts[part].version;
            match self.decide(part, high, tokens) {
                Ok((shadow, taken)) => {
                    let permit = MPermit {
                        part,
                        tokens: taken,
                        retry: None,
                    };
                    let r = if shadow {
                        Reason::ObservedOverLimit
                    } else {
                        Reason::CapacityAvailable
                    };
                    self.waiters[i].state = MWState::Started(permit, v, r);
                    self.parts[part].pending -= 1;
                }
                Err(Reason::GlobalLimitReached) => break,
                Err(_) => {}
            }
        }
    }

    /// Waiters whose deadline passed leave with the reason of that deadline.
    fn expire(&mut self) {
        for w in &mut self.waiters {
            if w.state == MWState::Queued && w.deadline <= self.now {
                let r = if w.by_age {
                    Reason::QueueAgeExceeded
                } else {
                    Reason::DeadlineExceeded
                };
                w.state = MWState::Left(r);
                self.parts[w.part].pending -= 1;
            }
        }
    }

    /// A wait on partition `i` (its class waits): started at once, refused at entry, or
    /// queued (the waiter's index).
    fn enter(
        &mut self,
        i: usize,
        high: bool,
        tokens: u64,
        within: Option<u64>,
    ) -> (Option<MPermit>, Vec<Step>, Option<usize>) {
        let v = self.parts[i].version;
        let reason = match self.decide(i, high, tokens) {
            Ok((shadow, taken)) => {
                let r = if shadow {
                    Reason::ObservedOverLimit
                } else {
                    Reason::CapacityAvailable
                };
                let permit = MPermit {
                    part: i,
                    tokens: taken,
                    retry: None,
                };
                return (
                    Some(permit),
                    vec![(i, Decision::Dispatch, r, None, v)],
                    None,
                );
            }
            Err(r) => r,
        };
        let p = &self.parts[i];
        let (deadline, by_age) = match within {
            Some(d) if d < p.age => (self.now + d, false),
            _ => (self.now + p.age, true),
        };
        let oldest = self
            .waiters
            .iter()
            .filter(|w| w.part == i && w.state == MWState::Queued)
            .map(|w| self.now - w.enq)
            .max();
        let left = deadline - self.now;
        let refusal = if p.budget != 0 && tokens > p.budget {
            Some(Reason::TokenBudgetReached)
        } else if p.pending >= p.pending_limit {
            Some(Reason::PendingLimitReached)
        } else if left == 0 || oldest.is_some_and(|a| a > left) {
            Some(Reason::DeadlineUnmeetable)
        } else {
            None
        };
        if let Some(r) = refusal {
            return (None, vec![(i, Decision::Reject, r, None, v)], None);
        }
        let queued = (i, Decision::Queue, reason, None, v);
        self.parts[i].pending += 1;
        self.waiters.push(MW {
            part: i,
            high,
            tokens,
            enq: self.now,
            deadline,
            by_age,
            queued,
            state: MWState::Queued,
        });
        (None, vec![queued], Some(self.waiters.len() - 1))
    }

    /// One decision: `Ok((shadow, tokens taken))` or the reason.
    fn decide(&mut self, i: usize, high: bool, tokens: u64) -> Result<(bool, u64), Reason> {
        let p = &self.parts[i];
        let cap = if high { p.limit } else { p.limit - p.reserve };
        let mut shadow = false;
        if p.active >= cap {
            if !p.observe {
                return Err(if p.active < p.limit {
                    Reason::HighPriorityReserve
                } else {
                    Reason::ActiveLimitReached
                });
            }
            shadow = true;
        }
        let take = p.budget != 0 && tokens != 0;
        if take && p.tokens + tokens > p.budget {
            if !p.observe {
                return Err(Reason::TokenBudgetReached);
            }
            shadow = true;
        }
        let (held, limit) = self.conns[p.provider];
        if held >= limit {
            return Err(Reason::ConnectionLimitReached);
        }
        if self.global.0 >= self.global.1 {
            return Err(Reason::GlobalLimitReached);
        }
        let p = &mut self.parts[i];
        p.active += 1;
        let taken = if take { tokens } else { 0 };
        p.tokens += taken;
        self.conns[p.provider].0 += 1;
        self.global.0 += 1;
        Ok((shadow, taken))
    }

    fn admit(
        &mut self,
        start: usize,
        high: bool,
        tokens: u64,
        allow: bool,
        retry: Option<usize>,
    ) -> (Option<MPermit>, Vec<Step>, Option<Reason>) {
        let mut steps: Vec<Step> = Vec::new();
        let mut at = start;
        loop {
            let v = self.parts[at].version;
            match self.decide(at, high, tokens) {
                Ok((shadow, taken)) => {
                    let r = if shadow {
                        Reason::ObservedOverLimit
                    } else {
                        Reason::CapacityAvailable
                    };
                    steps.push((at, Decision::Dispatch, r, None, v));
                    let permit = MPermit {
                        part: at,
                        tokens: taken,
                        retry,
                    };
                    return (Some(permit), steps, None);
                }
                Err(reason) => {
                    let p = &self.parts[at];
                    match p.overflow {
                        Overflow::Reject | Overflow::Wait => {
                            steps.push((at, Decision::Reject, reason, None, v));
                            return (None, steps, None);
                        }
                        Overflow::Degrade => {
                            steps.push((at, Decision::Degrade, reason, None, v));
                            return (None, steps, None);
                        }
                        _ => {}
                    }
                    let next = p
                        .fallback
                        .iter()
                        .copied()
                        .find(|f| *f != at && !steps.iter().any(|s| s.0 == *f));
                    let end = if !allow || next.is_none() {
                        Some(Reason::NoEligibleFallback)
                    } else if steps.len() as u32 + 1 >= self.max_attempts {
                        Some(Reason::AttemptBudgetSpent)
                    } else {
                        None
                    };
                    if end.is_some() {
                        steps.push((at, Decision::Reject, reason, None, v));
                        return (None, steps, end);
                    }
                    steps.push((at, Decision::Fallback, reason, next, v));
                    at = next.unwrap();
                }
            }
        }
    }

    fn release(&mut self, p: MPermit) {
        let part = &mut self.parts[p.part];
        part.active -= 1;
        part.tokens -= p.tokens;
        self.conns[part.provider].0 -= 1;
        self.global.0 -= 1;
        if let Some(r) = p.retry {
            self.parts[r].retries -= 1;
        }
    }

    fn charge(&mut self, i: usize) -> bool {
        let p = &mut self.parts[i];
        let limit = (p.pct * (p.active + p.pending) / 100).max(p.min);
        if p.retries >= limit && !p.observe {
            return false;
        }
        p.retries += 1;
        true
    }
}

#[derive(Clone, Debug)]
enum Op {
    Admit {
        part: usize,
        high: bool,
        tokens: u64,
        allow: bool,
    },
    Complete(usize),
    Charge(usize),
    DropCharge(usize),
    AdmitRetry {
        charge: usize,
        high: bool,
    },
    Apply {
        part: usize,
        limit: u64,
        reserve: u64,
        budget: u64,
        pct: u64,
        min: u64,
        observe: bool,
    },
    ApplyProvider(usize, u64),
    ApplyGlobal(u64),
    /// An async wait, polled once (then after every step).
    Wait {
        part: usize,
        high: bool,
        tokens: u64,
        within: Option<u64>,
    },
    /// A completion, then a dropped wait before anyone polls it (if it was started by the
    /// completion, its start goes back and on).
    CompleteThenCancel(usize, usize),
    /// The clock moves on, then the expired waiters leave.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4usize, any::<bool>(), 0..6u64, any::<bool>())
            .prop_map(|(part, high, tokens, allow)| Op::Admit { part, high, tokens, allow }),
        3 => (0..16usize).prop_map(Op::Complete),
        1 => (0..4usize).prop_map(Op::Charge),
        1 => (0..8usize).prop_map(Op::DropCharge),
        1 => (0..8usize, any::<bool>()).prop_map(|(charge, high)| Op::AdmitRetry { charge, high }),
        1 => (0..4usize, 0..5u64, 0..3u64, 0..8u64, 0..120u64, 0..3u64, prop::bool::weighted(0.2))
            .prop_map(|(part, limit, reserve, budget, pct, min, observe)| Op::Apply {
                part, limit, reserve, budget, pct, min, observe }),
        1 => (0..2usize, 0..7u64).prop_map(|(p, l)| Op::ApplyProvider(p, l)),
        1 => (0..12u64).prop_map(Op::ApplyGlobal),
        4 => (0..4usize, any::<bool>(), 0..6u64, prop_oneof![
                Just(None), Just(Some(0)), (2..12u64).prop_map(|k| Some(k * 10_000))])
            .prop_map(|(part, high, tokens, within)| Op::Wait { part, high, tokens, within }),
        2 => (0..16usize, 0..8usize).prop_map(|(k, j)| Op::CompleteThenCancel(k, j)),
        1 => (1..8u64).prop_map(|k| Op::Advance(k * 10_000)),
    ]
}

/// A configuration of 2 providers × 2 classes (partitions `a-x`, `a-y`, `b-x`, `b-y`), random
/// limits, overflow actions and fallbacks (to partitions later in name order: acyclic).
fn config() -> impl Strategy<Value = PoolsConfig> {
    (
        prop::collection::vec((1..4u64, 0..2u64, 0..6u64, 0..3u64), 4),
        prop::collection::vec(0..4u8, 2),
        prop::collection::vec(prop::collection::vec(any::<bool>(), 4), 4),
        (4..6u64, 4..6u64, 4..9u64, 1..5u32),
    )
        .prop_map(|(parts, overflow, edges, (ca, cb, g, attempts))| {
            let mut c = PoolsConfig {
                max_attempts: attempts,
                ..PoolsConfig::default()
            };
            c.global.max_active = g;
            c.providers.insert(
                "a".into(),
                ProviderConfig {
                    connection_limit: ca,
                },
            );
            c.providers.insert(
                "b".into(),
                ProviderConfig {
                    connection_limit: cb,
                },
            );
            for (k, o) in CLASSES.iter().zip(&overflow) {
                let overflow = [
                    Overflow::Reject,
                    Overflow::Fallback,
                    Overflow::Degrade,
                    Overflow::Wait,
                ][*o as usize];
                c.classes.insert((*k).into(), ClassConfig { overflow });
            }
            let names: Vec<String> = PROVIDERS
                .iter()
                .flat_map(|p| CLASSES.iter().map(move |k| format!("{p}-{k}")))
                .collect();
            for (i, (limit, reserve, budget, min)) in parts.into_iter().enumerate() {
                let (prov, class) = (PROVIDERS[i / 2], CLASSES[i % 2]);
                let mut p = PartitionConfig::new(prov, class, limit);
                p.high_priority_reserve = reserve.min(limit - 1);
                p.token_budget = (budget > 0).then_some(budget);
                p.retry = RetryConfig { percent: 50, min };
                // Ages far above a test's run time: only the injected clock ages a queue.
                (p.pending_limit, p.queue_max_age_ms) = (1 + min, 60_000);
                if c.classes[class].overflow == Overflow::Fallback {
                    p.fallback = (i + 1..4)
                        .filter(|j| edges[i][*j])
                        .map(|j| names[j].clone())
                        .collect();
                }
                c.partitions.insert(names[i].clone(), p);
            }
            c
        })
}

fn engine_steps(out: &PoolOutcome<'_>) -> (Vec<Step>, Option<Reason>) {
    let steps = out
        .route()
        .decisions()
        .iter()
        .map(|d| {
            (
                d.partition.index(),
                d.decision,
                d.reason,
                d.fallback.map(PartitionId::index),
                d.limit_version,
            )
        })
        .collect();
    (steps, out.route().ended_by)
}

fn assert_counts(pools: &Pools, m: &Model) {
    let s = pools.stats();
    for (p, mp) in s.partitions.iter().zip(&m.parts) {
        assert_eq!(
            (p.active, p.tentative, p.tokens, p.retries_in_flight),
            (mp.active, 0, mp.tokens, mp.retries),
            "{p:?}"
        );
        assert_eq!((p.active_limit, p.limit_version), (mp.limit, mp.version));
        let oldest = m
            .waiters
            .iter()
            .filter(|w| w.state == MWState::Queued && s.partitions[w.part].name == p.name)
            .map(|w| std::time::Duration::from_millis(m.now - w.enq))
            .max();
        assert_eq!((p.pending, p.oldest_wait), (mp.pending, oldest), "{p:?}");
    }
    for (p, (held, limit)) in s.providers.iter().zip(&m.conns) {
        assert_eq!((p.held, p.limit), (*held, *limit));
    }
    assert_eq!((s.global.held, s.global.limit), m.global);
}

fn prio(high: bool) -> Priority {
    if high {
        Priority::High
    } else {
        Priority::Normal
    }
}

type Wait<'p> = Pin<Box<dyn Future<Output = PoolOutcome<'p>> + Send + 'p>>;

/// Polls every wait once: each that ended must be one the model ended the same way (its
/// decisions, its permit); each still pending must be queued in the model.
fn poll_waits<'p>(
    waits: &mut Vec<(Wait<'p>, usize)>,
    m: &mut Model,
    held: &mut Vec<(PoolPermit<'p>, MPermit)>,
) {
    let mut cx = Context::from_waker(Waker::noop());
    waits.retain_mut(|(f, i)| {
        let Poll::Ready(out) = f.as_mut().poll(&mut cx) else {
            assert_eq!(
                m.waiters[*i].state,
                MWState::Queued,
                "engine waits, model not"
            );
            return true;
        };
        let w = &m.waiters[*i];
        let (second, permit) = match w.state.clone() {
            MWState::Started(mp, v, r) => ((w.part, Decision::Dispatch, r, None, v), Some(mp)),
            MWState::Left(r) => {
                let v = m.parts[w.part].version;
                ((w.part, Decision::Reject, r, None, v), None)
            }
            other => panic!("engine ended a wait the model has {other:?}"),
        };
        assert_eq!(engine_steps(&out), (vec![w.queued, second], None));
        match (out.into_permit(), permit) {
            (Some(p), Some(mp)) => held.push((p, mp)),
            (None, None) => {}
            _ => panic!("engine and model disagree on a wait's start"),
        }
        m.waiters[*i].state = MWState::Gone;
        false
    });
}

/// Drops a wait: a queued one leaves; a started one gives its units back and they go on.
fn cancel_model(m: &mut Model, i: usize) {
    match std::mem::replace(&mut m.waiters[i].state, MWState::Gone) {
        MWState::Queued => m.parts[m.waiters[i].part].pending -= 1,
        MWState::Started(mp, ..) => {
            m.release(mp);
            m.settle();
        }
        other => panic!("a dropped wait the model has {other:?}"),
    }
}

fn run(config: PoolsConfig, ops: Vec<Op>) {
    let base = Instant::now();
    let clock = Arc::new(AtomicU64::new(0));
    let c = clock.clone();
    let at = move |ms: u64| base + Duration::from_millis(ms);
    let pools = Pools::with_clock(&config, None, move || at(c.load(Ordering::SeqCst))).unwrap();
    let mut waits: Vec<(Wait<'_>, usize)> = Vec::new();
    let mut m = Model::new(&config);
    let ids: Vec<PartitionId> = config
        .partitions
        .keys()
        .map(|n| pools.partition(n).unwrap())
        .collect();
    let mut held: Vec<(PoolPermit<'_>, MPermit)> = Vec::new();
    let mut charges: Vec<(RetryCharge<'_>, usize)> = Vec::new();
    let names: Vec<String> = config.partitions.keys().cloned().collect();
    let mut current = config.clone();
    for (n, op) in ops.into_iter().enumerate() {
        let id = n as u64;
        match op {
            Op::Admit {
                part,
                high,
                tokens,
                allow,
            } => {
                let mut req = PoolRequest::new(id, ids[part]);
                req.priority = prio(high);
                req.tokens = tokens;
                req.allow_fallback = allow;
                let out = pools.admit(&req);
                let (mp, steps, end) = m.admit(part, high, tokens, allow, None);
                assert_eq!(engine_steps(&out), (steps, end));
                match (out.into_permit(), mp) {
                    (Some(p), Some(mp)) => held.push((p, mp)),
                    (None, None) => {}
                    _ => panic!("engine and model disagree on admission"),
                }
            }
            Op::Complete(k) if !held.is_empty() => {
                let (p, mp) = held.swap_remove(k % held.len());
                p.complete(None);
                m.release(mp);
                m.settle();
            }
            Op::CompleteThenCancel(k, j) => {
                if !held.is_empty() {
                    let (p, mp) = held.swap_remove(k % held.len());
                    p.complete(None);
                    m.release(mp);
                    m.settle();
                }
                if !waits.is_empty() {
                    let (f, i) = waits.swap_remove(j % waits.len());
                    drop(f);
                    cancel_model(&mut m, i);
                }
            }
            Op::Wait {
                part,
                high,
                tokens,
                within,
            } => {
                let mut req = PoolRequest::new(id, ids[part]);
                req.priority = prio(high);
                req.tokens = tokens;
                let deadline = within.map(|d| at(m.now + d));
                let mut f: Wait<'_> = Box::pin(pools.admit_async(req, deadline));
                let (mp, steps, end, queued) = if m.parts[part].overflow == Overflow::Wait {
                    let (mp, steps, q) = m.enter(part, high, tokens, within);
                    (mp, steps, None, q)
                } else {
                    let (mp, steps, end) = m.admit(part, high, tokens, true, None);
                    (mp, steps, end, None)
                };
                let mut cx = Context::from_waker(Waker::noop());
                match (f.as_mut().poll(&mut cx), queued) {
                    (Poll::Pending, Some(i)) => waits.push((f, i)),
                    (Poll::Ready(out), None) => {
                        assert_eq!(engine_steps(&out), (steps, end));
                        match (out.into_permit(), mp) {
                            (Some(p), Some(mp)) => held.push((p, mp)),
                            (None, None) => {}
                            _ => panic!("engine and model disagree on a wait's admission"),
                        }
                    }
                    (_, q) => panic!("engine and model disagree on queueing (model: {q:?})"),
                }
            }
            Op::Advance(ms) => {
                m.now += ms;
                clock.fetch_add(ms, Ordering::SeqCst);
                pools.expire_waiters();
                m.expire();
                m.settle();
            }
            Op::Charge(part) => {
                let got = pools.charge_retry(id, ids[part]);
                assert_eq!(got.is_ok(), m.charge(part));
                if let Ok(c) = got {
                    charges.push((c, part));
                }
            }
            Op::DropCharge(k) if !charges.is_empty() => {
                let (c, part) = charges.swap_remove(k % charges.len());
                drop(c);
                m.parts[part].retries -= 1;
            }
            Op::AdmitRetry { charge, high } if !charges.is_empty() => {
                let (c, part) = charges.swap_remove(charge % charges.len());
                let mut req = PoolRequest::new(id, ids[part]);
                req.priority = prio(high);
                let out = pools.admit_retry(&req, c);
                let (mp, steps, end) = m.admit(part, high, 0, true, Some(part));
                assert_eq!(engine_steps(&out), (steps, end));
                match (out.into_permit(), mp) {
                    (Some(p), Some(mp)) => held.push((p, mp)),
                    (None, None) => m.parts[part].retries -= 1,
                    _ => panic!("engine and model disagree on a retry's admission"),
                }
            }
            Op::Apply {
                part,
                limit,
                reserve,
                budget,
                pct,
                min,
                observe,
            } => {
                let mut next = current.partitions[&names[part]].clone();
                next.active_limit = limit;
                next.high_priority_reserve = reserve;
                next.token_budget = (budget > 0).then_some(budget);
                next.retry = RetryConfig { percent: pct, min };
                next.observe = observe;
                let mp = &m.parts[part];
                let ok = limit >= 1
                    && reserve < limit
                    && limit <= m.conns[mp.provider].1
                    && limit <= m.global.1
                    && pct <= 100;
                let got = pools.apply_partition(&names[part], &next);
                assert_eq!(got.is_ok(), ok, "{got:?}");
                if ok {
                    let mp = &mut m.parts[part];
                    (mp.limit, mp.reserve, mp.budget) = (limit, reserve, budget);
                    (mp.pct, mp.min, mp.observe) = (pct, min, observe);
                    mp.version += 1;
                    assert_eq!(got.unwrap(), mp.version);
                    current.partitions.insert(names[part].clone(), next);
                    m.settle();
                }
            }
            Op::ApplyProvider(v, limit) => {
                let ok = limit >= 1 && m.parts.iter().all(|p| p.provider != v || p.limit <= limit);
                let got = pools.apply_provider(PROVIDERS[v], limit);
                assert_eq!(got.is_ok(), ok, "{got:?}");
                if ok {
                    m.conns[v].1 = limit;
                    m.settle();
                }
            }
            Op::ApplyGlobal(limit) => {
                let ok = limit >= 1 && m.parts.iter().all(|p| p.limit <= limit);
                let got = pools.apply_global(limit);
                assert_eq!(got.is_ok(), ok, "{got:?}");
                if ok {
                    m.global.1 = limit;
                    m.settle();
                }
            }
            _ => {}
        }
        poll_waits(&mut waits, &mut m, &mut held);
        assert_counts(&pools, &m);
    }
    // At rest: everything back to zero.
    for (f, i) in waits.drain(..) {
        drop(f);
        cancel_model(&mut m, i);
    }
    poll_waits(&mut waits, &mut m, &mut held);
    for (p, mp) in held.drain(..) {
        p.complete(None);
        m.release(mp);
    }
    for (c, part) in charges.drain(..) {
        drop(c);
        m.parts[part].retries -= 1;
    }
    assert_counts(&pools, &m);
    let s = pools.stats();
    assert_eq!(s.global.held, 0);
    assert!(s.providers.iter().all(|p| p.held == 0));
    assert!(s
        .partitions
        .iter()
        .all(|p| p.active == 0 && p.tokens == 0 && p.retries_in_flight == 0 && p.pending == 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn engine_and_model_agree(config in config(), ops in prop::collection::vec(op(), 1..80)) {
        run(config, ops);
    }

    /// Any fallback graph over 5 partitions: a cyclic one is refused at build with a cycle
    /// that is one; an acyclic one routes every request, under any fill, without revisiting a
    /// partition, within the attempt budget, each fallback naming the next decider.
    #[test]
    fn no_fallback_loop_for_any_graph(
        edges in prop::collection::vec(prop::collection::vec(any::<bool>(), 5), 5),
        fills in prop::collection::vec(0..3u64, 5),
        attempts in 1..=MAX_ATTEMPTS,
        starts in prop::collection::vec(0..5usize, 1..20),
    ) {
        let names: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
        let mut c = PoolsConfig { max_attempts: attempts, ..PoolsConfig::default() };
        c.global.max_active = 100;
        c.classes.insert("k".into(), ClassConfig { overflow: Overflow::Fallback });
        for (i, name) in names.iter().enumerate() {
            c.providers.insert(name.clone(), ProviderConfig { connection_limit: 2 });
            let mut p = PartitionConfig::new(name, "k", 2);
            p.fallback = (0..5).filter(|j| *j != i && edges[i][*j]).map(|j| names[j].clone()).collect();
            c.partitions.insert(name.clone(), p);
        }
        // Reachability by Floyd–Warshall: a cycle exists iff some node reaches itself.
        let mut reach = [[false; 5]; 5];
        for i in 0..5 { for j in 0..5 { reach[i][j] = i != j && edges[i][j]; } }
        for k in 0..5 { for i in 0..5 { for j in 0..5 {
            reach[i][j] |= reach[i][k] && reach[k][j];
        } } }
        let cyclic = (0..5).any(|i| reach[i][i]);
        let pools = match Pools::new(&c) {
            Err(PoolsConfigError::FallbackCycle { cycle }) => {
                prop_assert!(cyclic);
                let idx: Vec<usize> = cycle.iter().map(|n| names.iter().position(|m| m == n).unwrap()).collect();
                for w in 0..idx.len() {
                    let (a, b) = (idx[w], idx[(w + 1) % idx.len()]);
                    prop_assert!(edges[a][b], "{cycle:?} is not a cycle");
                }
                return Ok(());
            }
            Err(e) => panic!("{e}"),
            Ok(p) => { prop_assert!(!cyclic); p }
        };
        let mut held = Vec::new();
        for (i, n) in fills.iter().enumerate() {
            for _ in 0..*n {
                if let Ok(p) = pools.try_admit(&PoolRequest::new(0, pools.partition(&names[i]).unwrap())) {
                    held.push(p);
                }
            }
        }
        for (r, s) in starts.iter().enumerate() {
            let out = pools.admit(&PoolRequest::new(r as u64, pools.partition(&names[*s]).unwrap()));
            let d = out.route().decisions();
            prop_assert!(d.len() as u32 <= attempts);
            let mut seen = std::collections::BTreeSet::new();
            for (k, x) in d.iter().enumerate() {
                prop_assert!(seen.insert(x.partition), "revisited {:?}", d);
                if x.decision == Decision::Fallback {
                    prop_assert_eq!(Some(d[k + 1].partition), x.fallback);
                }
            }
            if let Some(p) = out.into_permit() { held.push(p); }
        }
        drop(held);
        let s = pools.stats();
        prop_assert!(s.global.held == 0 && s.partitions.iter().all(|p| p.active == 0));
    }
}
