//! Bounded stress tests of admission classes on real threads, with an independent tally, and a
//! measurement of spurious protection refusals (CONTRACT.md §10, "precision").
//!
//! # Safety
//!
//! Four threads hammer one classed bulkhead (three classes with concurrency and token floors),
//! each holding a few admissions at a time; every thread keeps going until all of them have
//! made their share of attempts, so the threads overlap. The tally is one packed `AtomicU64`
//! holding every class's slots and tokens, raised with one `fetch_add` *after* an admission and
//! lowered with one `fetch_sub` *before* its release, so each value it takes is one exact
//! instant of a lower bound of the true state. Every raise checks, on the value it produced:
//!
//! * no class above its ceilings, the global limits respected;
//! * borrowed slots `Σ max(0, in_flight_k − floor_k)` within the shared capacity
//!   `max_concurrent − Σ floors`, and borrowed tokens within `budget − Σ token floors`
//!   (CONTRACT.md §4: `U ≤ max_concurrent`, `V ≤ eff`).
//!
//! Each quantity is monotone in the tally, so an admission that pushed the true state over a
//! limit pushes the tally over it too. At the end everything is back to zero and the per-class
//! statistics equal the tally (admissions, releases, refusals by reason, reserved tokens,
//! borrowed admissions and borrowed tokens as the admissions' `resources()` reported them).
//!
//! # Precision
//!
//! The class protocol (`src/protocol/classed.rs`) has steps that others can see before they are final: a
//! protected admission's class CAS before its validating load, a borrower's increase of the
//! shared `U`/`V` before its class CAS, a release's class step before its decrease of `U`/`V`.
//! Only a step that is later undone can cause a refusal no serial order explains. The tests
//! estimate how often a refusal with constraint `admission_class_protection` is spurious: the sequential model, in the committed state at the decision, would have admitted
//! it. No observer can read that state, so it is bracketed. Each thread publishes a status word
//! (idle; attempting class `k` with `r` tokens, attempt number `n`; releasing class `k`, `r`
//! tokens), and a refusing thread reads the tally together with every status, once just before
//! its attempt and once just after it (a read counts only if no status moved across it). After
//! the run every attempt's outcome is known, so at each read the committed state `C` lies
//! between
//!
//! * `min` = the tally (admissions whose raise is pending, and releases in progress, may or
//!   may not be committed: leave them out), and
//! * `max` = the tally plus every other attempt in progress that was admitted, plus every
//!   release in progress (refused attempts in progress contribute only tentative steps, which
//!   the sequential model never sees).
//!
//! The model's "admit" is antitone in the state, so a refusal is **definitely spurious** when
//! the model (put in that state by replaying admissions) admits the same demand in `max` at
//! both reads, and **possibly spurious** when it admits in `min` at both reads (otherwise some
//! instant of the attempt explains the refusal). The two counts bracket the rate. What the
//! reads cannot see is an admission made and released entirely between them.
//!
//! A simpler measure is printed too: **detail** counts protection refusals that the
//! state reported in their own `Rejection` does not explain (`shared.concurrency.available ≥
//! requested_borrowed`, the token equivalent, or a reported `requested_borrowed` of 0). It is
//! not a measure of spurious decisions: the engine builds that report from the global word read
//! at the start of the decision and class words re-read after its tentative step was undone.
//!
//! The same classification is applied to class-ceiling refusals (the ceiling check reads the
//! class word, tentative steps included) and to global refusals (decided on the global word,
//! which holds no tentative step: their "definitely spurious" count checks the method). The
//! counts are printed (`--nocapture`); the tests assert only generous bounds, so that they
//! cannot flake. No test sleeps or measures time.

use llm_bulkhead::model::Model;
use llm_bulkhead::{
    Admission, Bulkhead, ClassLimits, Constraint, Demand, RejectReason, Rejection, Reservation,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};

const THREADS: usize = 4;
/// Attempts (or releases) each thread makes at least.
const ITERS: usize = 50_000;
/// Admissions one thread holds at most.
const HOLD: usize = 3;
const CLASSES: usize = 3;
const NAMES: [&str; CLASSES] = ["premium", "standard", "batch"];
/// Reservations are multiples of this, up to [`MAX_UNITS`] of them.
const UNIT: u64 = 200;
const MAX_UNITS: u64 = 6;
/// The bound (percent) asserted on the spurious-refusal estimate, a safety net and not a
/// target: the rate is heavy-tailed (two running borrowers can refuse each other in lock step
/// for a while), and one run in a few hundred on a two-core machine went past 35%.
const SPURIOUS_BOUND: f64 = 50.0;
/// A thread whose attempt status has not moved while another thread read it this many times
/// in a row is taken to be descheduled (see [`Attempt::stalled`]).
const STALL: u32 = 64;

/// The tally: per class, 6 bits of slots and 15 bits of tokens, packed in one word.
const FIELD: u32 = 21;
const SLOT_FIELD: u32 = 6;

fn pack(k: usize, slots: u64, tokens: u64) -> u64 {
    (slots | (tokens << SLOT_FIELD)) << (FIELD * k as u32)
}

fn unpack(s: u64) -> [(u64, u64); CLASSES] {
    std::array::from_fn(|k| {
        let f = s >> (FIELD * k as u32);
        (
            f & ((1 << SLOT_FIELD) - 1),
            (f >> SLOT_FIELD) & ((1 << (FIELD - SLOT_FIELD)) - 1),
        )
    })
}

/// Thread status words: phase (2 bits), class (2 bits), reservation in units (3 bits), then
/// the number of attempts the thread had started (the attempt's index while attempting).
const IDLE: u64 = 0;
const ATTEMPTING: u64 = 1;
const RELEASING: u64 = 2;

fn status(phase: u64, k: usize, r: u64, attempts: usize) -> u64 {
    phase | (k as u64) << 2 | (r / UNIT) << 4 | (attempts as u64) << 8
}

/// `(phase, class, reservation, attempt)` of a status word.
fn unstatus(s: u64) -> (u64, usize, u64, usize) {
    (
        s & 3,
        ((s >> 2) & 3) as usize,
        ((s >> 4) & 7) * UNIT,
        (s >> 8) as usize,
    )
}

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

/// One test's limits (normal priority only, no high-priority reserve: `eff = budget`).
#[derive(Clone, Copy)]
struct Config {
    max_concurrent: u32,
    budget: u64,
    classes: [ClassLimits; CLASSES],
}

impl Config {
    fn build(&self) -> Bulkhead {
        self.classes
            .iter()
            .zip(NAMES)
            .fold(
                Bulkhead::builder()
                    .max_concurrent(self.max_concurrent)
                    .token_budget(self.budget),
                |b, (l, n)| b.class(n, *l),
            )
            .default_class("standard")
            .build()
            .unwrap()
    }

    fn floors(&self) -> (u64, u64) {
        self.classes.iter().fold((0, 0), |(c, t), l| {
            (
                c + u64::from(l.protected_concurrent),
                t + l.protected_tokens,
            )
        })
    }

    /// What is wrong with tally state `s`, if anything.
    fn violation(&self, s: u64) -> Option<String> {
        let st = unpack(s);
        let (sum_pc, sum_pt) = self.floors();
        let (mut g, mut t, mut bc, mut bt) = (0, 0, 0, 0);
        for (k, (&(i, tok), l)) in st.iter().zip(&self.classes).enumerate() {
            if l.max_concurrent.is_some_and(|m| i > u64::from(m)) {
                return Some(format!("class {k} above its concurrency ceiling: {st:?}"));
            }
            if l.max_tokens.is_some_and(|m| tok > m) {
                return Some(format!("class {k} above its token ceiling: {st:?}"));
            }
            g += i;
            t += tok;
            bc += i.saturating_sub(u64::from(l.protected_concurrent));
            bt += tok.saturating_sub(l.protected_tokens);
        }
        if g > u64::from(self.max_concurrent) || t > self.budget {
            return Some(format!("global limit exceeded: {st:?}"));
        }
        if bc > u64::from(self.max_concurrent) - sum_pc {
            return Some(format!(
                "{bc} borrowed slots over the shared capacity: {st:?}"
            ));
        }
        if bt > self.budget - sum_pt {
            return Some(format!(
                "{bt} borrowed tokens over the shared budget: {st:?}"
            ));
        }
        None
    }
}

/// The tally with every thread's status, read together (see [`Shared::sample`]).
#[derive(Clone, Copy)]
struct Sample {
    tally: u64,
    /// How many times the tally had changed.
    changes: u64,
    status: [u64; THREADS],
}

/// What thread `t` in status `s` may have committed that the tally does not show, leaving
/// out thread `me`; `outcomes[t][n]` says whether thread `t`'s attempt `n` was admitted.
fn pending(t: usize, s: u64, me: usize, outcomes: &[Vec<bool>]) -> u64 {
    let (phase, k, r, n) = unstatus(s);
    match phase {
        ATTEMPTING if t != me && outcomes[t][n] => pack(k, 1, r),
        RELEASING => pack(k, 1, r),
        _ => 0,
    }
}

/// `(min, max)` bounds of the committed state over an attempt by thread `me` with reads `x`
/// and `y`, when both reads were stable. `min` holds at the two reads; `max` holds at every
/// instant in between only if the tally did not change (otherwise it is `None`): it is the
/// tally plus whatever either read saw pending, once.
fn bounds(
    x: &Option<Sample>,
    y: &Option<Sample>,
    me: usize,
    outcomes: &[Vec<bool>],
) -> Option<([u64; 2], Option<u64>)> {
    let (x, y) = (x.as_ref()?, y.as_ref()?);
    let max = (x.changes == y.changes).then(|| {
        (0..THREADS).fold(x.tally, |m, t| {
            let (a, b) = (x.status[t], y.status[t]);
            let both = pending(t, a, me, outcomes) + pending(t, b, me, outcomes);
            m + if a == b { both / 2 } else { both }
        })
    });
    Some(([x.tally, y.tally], max))
}

/// An attempt with the reads around it (`None`: no stable read was obtained).
struct Attempt {
    samples: [Option<Sample>; 2],
    thread: usize,
    class: usize,
    r: u64,
    /// Another thread was in the middle of an attempt, and had not moved for [`STALL`] of this
    /// thread's reads: most likely descheduled, possibly holding a tentative class step for its
    /// whole time slice.
    stalled: bool,
}

/// A refusal.
struct Refusal {
    attempt: Attempt,
    reason: RejectReason,
    constraint: Option<Constraint>,
    /// Not explained by the state its own detail reports (protection refusals only).
    unexplained: bool,
}

/// One thread's counts, per class.
#[derive(Default)]
struct Counts {
    admitted: [u64; CLASSES],
    released: [u64; CLASSES],
    rejected: [[u64; RejectReason::COUNTED.len()]; CLASSES],
    reserved: [u64; CLASSES],
    borrowed_admissions: [u64; CLASSES],
    borrowed_tokens: [u64; CLASSES],
    refusals: Vec<Refusal>,
    /// Admissions attributed a borrowed slot, with the reads around them.
    borrowed: Vec<Attempt>,
    /// Per attempt, in order: whether it was admitted.
    outcomes: Vec<bool>,
}

impl Counts {
    fn merge(&mut self, o: Counts) {
        for k in 0..CLASSES {
            self.admitted[k] += o.admitted[k];
            self.released[k] += o.released[k];
            self.reserved[k] += o.reserved[k];
            self.borrowed_admissions[k] += o.borrowed_admissions[k];
            self.borrowed_tokens[k] += o.borrowed_tokens[k];
            for j in 0..6 {
                self.rejected[k][j] += o.rejected[k][j];
            }
        }
        self.refusals.extend(o.refusals);
        self.borrowed.extend(o.borrowed);
    }
}

fn reason_index(r: RejectReason) -> usize {
    RejectReason::COUNTED.iter().position(|&x| x == r).unwrap()
}

fn demand(b: &Bulkhead, class: usize, r: u64) -> Demand {
    let input = r / 2;
    Demand::tokens(Reservation::new(input, r - input).unwrap())
        .in_class(b.class_id(NAMES[class]).unwrap())
}

/// Whether a protection refusal is explained by the state its own detail reports.
fn explained(rej: &Rejection) -> bool {
    let detail = rej.detail();
    let d = detail.classes.as_ref().expect("class detail");
    let amount = match rej.reason {
        RejectReason::ConcurrencyLimit => d.shared.concurrency,
        RejectReason::BudgetLimit => d.shared.token_budget.expect("a budget"),
        other => panic!("protection refusal with reason {other:?}"),
    };
    amount.requested_borrowed > 0 && amount.available < amount.requested_borrowed
}

/// What the threads share besides the bulkhead.
#[derive(Default)]
struct Shared {
    /// Raised after an admission, lowered before its release.
    tally: AtomicU64,
    /// Incremented after every change of the tally.
    changes: AtomicU64,
    /// Each thread's status word.
    status: [AtomicU64; THREADS],
    /// Threads that made [`ITERS`] steps.
    finished: AtomicUsize,
    violations: AtomicU64,
    first_violation: Mutex<Option<String>>,
}

impl Shared {
    /// The tally with every status read before and after it, when no status moved in between
    /// (a few tries).
    fn sample(&self) -> Option<Sample> {
        (0..8).find_map(|_| {
            let status: [u64; THREADS] = std::array::from_fn(|t| self.status[t].load(SeqCst));
            let changes = self.changes.load(SeqCst);
            let tally = self.tally.load(SeqCst);
            let again: [u64; THREADS] = std::array::from_fn(|t| self.status[t].load(SeqCst));
            let stable = status == again && changes == self.changes.load(SeqCst);
            stable.then_some(Sample {
                tally,
                changes,
                status,
            })
        })
    }

    fn check(&self, cfg: &Config, state: u64) {
        if let Some(v) = cfg.violation(state) {
            self.violations.fetch_add(1, SeqCst);
            self.first_violation.lock().unwrap().get_or_insert(v);
        }
    }
}

/// One thread's work: attempts in random classes with random reservations, and releases.
fn worker(cfg: &Config, b: &Bulkhead, sh: &Shared, me: usize, mut rng: Rng) -> Counts {
    let my_status = &sh.status[me];
    let mut c = Counts::default();
    let mut held: Vec<(Admission, usize, u64)> = Vec::new();
    let settle = |c: &mut Counts, (a, k, r): (Admission, usize, u64)| {
        my_status.store(status(RELEASING, k, r, c.outcomes.len()), SeqCst);
        sh.tally.fetch_sub(pack(k, 1, r), SeqCst);
        sh.changes.fetch_add(1, SeqCst);
        drop(a);
        my_status.store(status(IDLE, 0, 0, c.outcomes.len()), SeqCst);
        c.released[k] += 1;
    };
    // Per thread: the status last read, and how many reads in a row returned it.
    let mut seen = [(IDLE, 0u32); THREADS];
    let mut steps = 0;
    while steps < ITERS || sh.finished.load(SeqCst) < THREADS {
        steps += 1;
        if steps == ITERS {
            sh.finished.fetch_add(1, SeqCst);
        }
        if !held.is_empty() && (held.len() >= HOLD || rng.below(2) == 0) {
            let j = rng.below(held.len() as u64) as usize;
            settle(&mut c, held.swap_remove(j));
            continue;
        }
        let k = rng.below(CLASSES as u64) as usize;
        let r = rng.below(MAX_UNITS + 1) * UNIT;
        let n = c.outcomes.len();
        my_status.store(status(ATTEMPTING, k, r, n), SeqCst);
        let before = sh.sample();
        let mut stalled = false;
        if let Some(x) = &before {
            for (t, (last, n)) in seen.iter_mut().enumerate() {
                *n = if x.status[t] == *last { *n + 1 } else { 0 };
                *last = x.status[t];
                stalled |= t != me && *last & 3 == ATTEMPTING && *n >= STALL;
            }
        }
        let outcome = b.try_acquire(demand(b, k, r));
        let after = sh.sample();
        c.outcomes.push(outcome.is_ok());
        let attempt = Attempt {
            samples: [before, after],
            thread: me,
            class: k,
            r,
            stalled,
        };
        match outcome {
            Ok(a) => {
                let now = sh.tally.fetch_add(pack(k, 1, r), SeqCst) + pack(k, 1, r);
                sh.changes.fetch_add(1, SeqCst);
                my_status.store(status(IDLE, 0, 0, n + 1), SeqCst);
                sh.check(cfg, now);
                assert_eq!(a.held(), r);
                assert_eq!(a.class().map(|c| c.index()), Some(k));
                let res = a.resources();
                c.admitted[k] += 1;
                c.reserved[k] += r;
                c.borrowed_admissions[k] += u64::from(res.borrowed_concurrency);
                c.borrowed_tokens[k] += res.borrowed_tokens;
                if res.borrowed_concurrency {
                    c.borrowed.push(attempt);
                }
                held.push((a, k, r));
            }
            Err(rej) => {
                my_status.store(status(IDLE, 0, 0, n + 1), SeqCst);
                assert_ne!(rej.reason, RejectReason::Shutdown);
                assert!(rej.constraint.is_some(), "{rej:?}");
                let protection = rej.constraint == Some(Constraint::AdmissionClassProtection);
                c.rejected[k][reason_index(rej.reason)] += 1;
                c.refusals.push(Refusal {
                    attempt,
                    reason: rej.reason,
                    constraint: rej.constraint,
                    unexplained: protection && !explained(&rej),
                });
            }
        }
    }
    for h in held.drain(..) {
        settle(&mut c, h);
    }
    c
}

/// Runs the stress on `cfg`; returns the bulkhead (settled), the merged counts and every
/// thread's outcomes.
fn hammer(cfg: &Config, seed: u64) -> (Bulkhead, Counts, Vec<Vec<bool>>) {
    let b = cfg.build();
    let sh = Shared::default();
    let done = AtomicBool::new(false);
    let start = Barrier::new(THREADS + 1);
    let mut total = Counts::default();
    let mut outcomes = vec![Vec::new(); THREADS];
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (b, sh, start) = (&b, &sh, &start);
                let rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t as u64 + 1));
                s.spawn(move || {
                    start.wait();
                    worker(cfg, b, sh, t, rng)
                })
            })
            .collect();
        // An observer checks the bulkhead's own view against the hard limits while work runs,
        // each check on one read of one word: a class word never passes a ceiling, even with
        // tentative steps in it; the stored shared totals `U` and `V` (one read of the shared
        // word) never pass `max_concurrent` and the budget, and they bound the true totals from
        // above (`G ≤ U`, `T ≤ V`), so the global limits hold at that instant. The sums that
        // `stats()` reports are not checked against the global limits: they add class words
        // read one after another, and an admission in a class read later with a release in a
        // class read earlier made them pass `max_concurrent` in about 5% of runs (7 of 6, with
        // no tally violation). The workers' independent tally checks the global limits too.
        let (b, done) = (&b, &done);
        let observer = s.spawn(move || {
            let mut samples = 0u64;
            loop {
                let last = done.load(SeqCst);
                let (u, v) = llm_bulkhead::testing::stored_shared(b).unwrap();
                assert!(
                    u <= u64::from(cfg.max_concurrent),
                    "stored U {u}: {:?}",
                    b.stats()
                );
                assert!(v <= cfg.budget, "stored V {v}: {:?}", b.stats());
                let st = b.stats();
                for (c, l) in st
                    .classes
                    .as_ref()
                    .unwrap()
                    .classes
                    .iter()
                    .zip(&cfg.classes)
                {
                    assert!(l.max_concurrent.is_none_or(|m| c.in_flight <= u64::from(m)));
                    assert!(l.max_tokens.is_none_or(|m| c.in_flight_tokens <= m));
                }
                samples += 1;
                if last {
                    break;
                }
            }
            samples
        });
        start.wait();
        for (t, w) in workers.into_iter().enumerate() {
            let mut c = w.join().unwrap();
            outcomes[t] = std::mem::take(&mut c.outcomes);
            total.merge(c);
        }
        done.store(true, SeqCst);
        assert!(observer.join().unwrap() > 0);
    });
    assert_eq!(
        sh.violations.load(SeqCst),
        0,
        "first violation: {:?}",
        sh.first_violation.lock().unwrap()
    );
    assert_eq!(sh.tally.load(SeqCst), 0);
    (b, total, outcomes)
}

/// Everything is back to zero and the statistics equal the tally, class by class.
fn check_settled(b: &Bulkhead, c: &Counts) {
    let s = b.stats();
    let t = s.token_budget.unwrap();
    assert_eq!(
        (s.in_flight, s.admissions_in_flight, t.in_flight_tokens),
        (0, 0, 0)
    );
    assert_eq!(s.admitted, c.admitted.iter().sum::<u64>());
    assert_eq!(s.released, s.admitted);
    assert_eq!(s.rejected, c.refusals.len() as u64);
    assert_eq!(t.total_reserved, c.reserved.iter().sum::<u64>());
    let cs = s.classes.unwrap();
    assert_eq!(
        (
            cs.shared.in_flight,
            cs.shared.token_budget.unwrap().in_flight_tokens
        ),
        (0, 0)
    );
    for (k, st) in cs.classes.iter().enumerate() {
        assert_eq!(st.name, NAMES[k]);
        assert_eq!((st.in_flight, st.in_flight_tokens), (0, 0), "{st:?}");
        assert_eq!(
            (st.borrowed_concurrent, st.borrowed_in_flight_tokens),
            (0, 0)
        );
        assert_eq!(st.admitted, c.admitted[k], "{st:?}");
        assert_eq!(st.released, c.released[k], "{st:?}");
        assert_eq!(st.total_reserved, c.reserved[k], "{st:?}");
        assert_eq!(st.total_borrowed_admissions, c.borrowed_admissions[k]);
        assert_eq!(st.total_borrowed_tokens_reserved, c.borrowed_tokens[k]);
        assert_eq!(st.rejected, c.rejected[k].iter().sum::<u64>(), "{st:?}");
        for (j, reason) in RejectReason::COUNTED.into_iter().enumerate() {
            assert_eq!(
                st.rejected_by_reason.get(reason),
                c.rejected[k][j],
                "{st:?}"
            );
        }
    }
}

/// Whether the sequential model, put in state `s`, admits `r` tokens in `class`; `false` when
/// `s` itself is beyond the limits (a `max` bound can be).
fn model_admits(b: &Bulkhead, s: u64, class: usize, r: u64) -> bool {
    let mut m = Model::with_classes(b.limits(), &NAMES, 1).unwrap();
    for (k, &(slots, tokens)) in unpack(s).iter().enumerate() {
        // All of the class's tokens on its first admission. The model's "admit" is antitone
        // in the state, so a state within every limit is reached whatever the order.
        for i in 0..slots {
            let t = if i == 0 { tokens } else { 0 };
            if m.try_acquire(demand(b, k, t)).is_err() {
                return false;
            }
        }
    }
    m.try_acquire(demand(b, class, r)).is_ok()
}

/// Counts of one kind of refusal.
#[derive(Default)]
struct Rate {
    total: u64,
    /// Not explained by the refusal's own detail.
    unexplained: u64,
    /// The model admits in the `max` bound at both reads.
    definitely: u64,
    /// The model admits in the `min` bound at both reads.
    possibly: u64,
    /// Refusals while no other thread was stalled, and those definitely spurious.
    running: u64,
    running_definitely: u64,
}

fn pct(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        100.0 * n as f64 / d as f64
    }
}

impl Rate {
    fn add(&mut self, o: &Rate) {
        self.total += o.total;
        self.unexplained += o.unexplained;
        self.definitely += o.definitely;
        self.possibly += o.possibly;
        self.running += o.running;
        self.running_definitely += o.running_definitely;
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what:<24} {:>7} | spurious: definitely {:>5} ({:>6.3}%), possibly {:>5} ({:>6.3}%); no thread stalled: {:>5} of {:>7} ({:>6.3}%) | detail-unexplained {:>5} ({:>6.3}%)",
            self.total,
            self.definitely,
            pct(self.definitely, self.total),
            self.possibly,
            pct(self.possibly, self.total),
            self.running_definitely,
            self.running,
            pct(self.running_definitely, self.running),
            self.unexplained,
            pct(self.unexplained, self.total),
        )
    }
}

/// The sequential model's verdicts on the bounds of an attempt's reads.
struct Judge<'a> {
    b: &'a Bulkhead,
    outcomes: &'a [Vec<bool>],
    cache: HashMap<(u64, usize, u64), bool>,
}

impl Judge<'_> {
    fn admits(&mut self, s: u64, k: usize, r: u64) -> bool {
        let b = self.b;
        *self
            .cache
            .entry((s, k, r))
            .or_insert_with(|| model_admits(b, s, k, r))
    }

    /// `(definitely, possibly)`: the model admits `a`'s demand in the `max` bound, and in
    /// the `min` bound at both reads.
    fn verdict(&mut self, a: &Attempt) -> (bool, bool) {
        let Some((min, max)) = bounds(&a.samples[0], &a.samples[1], a.thread, self.outcomes) else {
            return (false, true);
        };
        let definitely = max.is_some_and(|m| self.admits(m, a.class, a.r));
        let possibly = min.iter().all(|&m| self.admits(m, a.class, a.r));
        (definitely, possibly)
    }
}

/// Classifies every refusal and prints the rates; returns the protection refusals' counts.
fn measure(name: &str, cfg: &Config, b: &Bulkhead, c: &Counts, outcomes: &[Vec<bool>]) -> Rate {
    let mut judge = Judge {
        b,
        outcomes,
        cache: HashMap::new(),
    };
    let (mut prot_c, mut prot_t, mut ceiling, mut global) = Default::default();
    for f in &c.refusals {
        let rate: &mut Rate = match (f.constraint, f.reason) {
            (Some(Constraint::AdmissionClassProtection), RejectReason::ConcurrencyLimit) => {
                &mut prot_c
            }
            (Some(Constraint::AdmissionClassProtection), _) => &mut prot_t,
            (Some(Constraint::AdmissionClass), _) => &mut ceiling,
            _ => &mut global,
        };
        let (definitely, possibly) = judge.verdict(&f.attempt);
        rate.total += 1;
        rate.unexplained += u64::from(f.unexplained);
        rate.definitely += u64::from(definitely);
        rate.possibly += u64::from(possibly);
        if !f.attempt.stalled {
            rate.running += 1;
            rate.running_definitely += u64::from(definitely);
        }
    }
    let mut prot = Rate::default();
    prot.add(&prot_c);
    prot.add(&prot_t);
    // A borrowed slot is definitely misattributed when its class was below its floor in the
    // `max` bound (without the admission itself) throughout the attempt.
    let mut misattributed = [0u64; CLASSES];
    for a in &c.borrowed {
        let floor = u64::from(cfg.classes[a.class].protected_concurrent);
        let max = bounds(&a.samples[0], &a.samples[1], a.thread, outcomes).and_then(|b| b.1);
        if max.is_some_and(|m| unpack(m)[a.class].0 < floor) {
            misattributed[a.class] += 1;
        }
    }
    let admitted: u64 = c.admitted.iter().sum();
    eprintln!(
        "\n[{name}] {} attempts, {admitted} admitted, {} refused",
        admitted + c.refusals.len() as u64,
        c.refusals.len()
    );
    eprintln!(
        "admissions attributed as borrowing: {:?} slots, {:?} tokens (per class); slots \
         definitely misattributed (class below its floor at both reads): {misattributed:?}",
        c.borrowed_admissions, c.borrowed_tokens
    );
    eprintln!("{}", prot.line("protection refusals"));
    eprintln!("{}", prot_c.line("  of which concurrency"));
    eprintln!("{}", prot_t.line("  of which tokens"));
    eprintln!("{}", ceiling.line("class-ceiling refusals"));
    eprintln!("{}", global.line("global refusals"));
    assert_eq!(global.definitely, 0, "a global refusal is never spurious");
    prot
}

/// Only the rate among running threads is bounded: with a thread descheduled between its
/// class CAS and its undo, every attempt that sees its tentative step for a whole time slice
/// may be refused, and on an oversubscribed machine that alone has reached half of a run's
/// protection refusals.
fn assert_rates(prot: &Rate) {
    assert!(prot.total > 0, "the test must exercise protection refusals");
    let definitely = pct(prot.running_definitely, prot.running);
    assert!(
        definitely < SPURIOUS_BOUND,
        "definitely spurious protection refusals, no thread stalled: {definitely:.2}%"
    );
}

/// Floors summing exactly to the global limits: there is no shared remainder, so every
/// borrowing attempt must be refused for protection, and no class ever passes its floors.
#[test]
fn floors_summing_to_the_limits() {
    let cfg = Config {
        max_concurrent: 6,
        budget: 3_000,
        classes: [
            ClassLimits {
                protected_concurrent: 3,
                max_concurrent: Some(3),
                protected_tokens: 1_500,
                max_tokens: Some(1_500),
            },
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(4),
                protected_tokens: 1_000,
                max_tokens: None,
            },
            ClassLimits {
                protected_concurrent: 1,
                max_concurrent: None,
                protected_tokens: 500,
                max_tokens: Some(2_000),
            },
        ],
    };
    let (b, c, outcomes) = hammer(&cfg, 0x5eed_0001);
    check_settled(&b, &c);
    let prot = measure("floors = limits", &cfg, &b, &c, &outcomes);
    assert!(c.admitted.iter().all(|&n| n > 0), "every class admitted");
    // Nothing can be borrowed here, so the sequential model never attributes a borrowed slot
    // or borrowed tokens; the engine computes the attribution from the class word its class
    // CAS replaced, which may hold other requests' tentative (later undone) steps or
    // admissions being released. Printed above, not asserted.
    assert_rates(&prot);
}

/// Floors leaving a shared remainder of slots and tokens that the classes borrow and race for.
#[test]
fn floors_with_a_shared_remainder() {
    let cfg = Config {
        max_concurrent: 6,
        budget: 4_800,
        classes: [
            ClassLimits {
                protected_concurrent: 2,
                max_concurrent: Some(4),
                protected_tokens: 1_200,
                max_tokens: Some(3_600),
            },
            ClassLimits {
                protected_concurrent: 1,
                max_concurrent: None,
                protected_tokens: 800,
                max_tokens: None,
            },
            ClassLimits {
                protected_concurrent: 1,
                max_concurrent: Some(3),
                protected_tokens: 400,
                max_tokens: Some(2_400),
            },
        ],
    };
    let (b, c, outcomes) = hammer(&cfg, 0x5eed_0002);
    check_settled(&b, &c);
    let prot = measure("shared remainder", &cfg, &b, &c, &outcomes);
    assert!(c.admitted.iter().all(|&n| n > 0), "every class admitted");
    assert!(
        c.borrowed_admissions.iter().sum::<u64>() > 0 && c.borrowed_tokens.iter().sum::<u64>() > 0,
        "the test must exercise borrowing"
    );
    assert_rates(&prot);
}
