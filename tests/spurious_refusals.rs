//! Counts refusals that no linearization explains (issue 26 §5), under reconfiguration.
//!
//! Four threads make random acquires and releases on one bulkhead; with a given probability
//! per operation a thread installs the next of two alternating limits snapshots. Every refusal
//! is judged after the run against the sequential model (`llm_bulkhead::model::Model`, the
//! class-aware spec of CONTRACT.md §2/§4) in the largest state the bulkhead could have been in
//! during the refusal's call, under every snapshot that could have been in force during it.
//! A refusal is **spurious** when the model admits its demand in all of them: then no instant
//! of the call, and so no linearization, explains it.
//!
//! # The states a refusal could have met
//!
//! One atomic clock stamps every call: a ticket is drawn just before and one just after each
//! acquire, release and install. Tickets of one atomic follow real time, so each call lies
//! strictly between its two tickets. After the run, at a point between tickets `t` and
//! `t + 1`, an admission holds **for certain** when its acquire had returned and its release
//! had not begun; one whose acquire or release call was in progress in another thread may or
//! may not hold; refused attempts hold nothing (the sequential model never sees them). The
//! possible states at that point are the certain admissions plus any subset of the uncertain
//! ones (at most one per other thread), leaving out subsets beyond the loosest limits of both
//! snapshots (no real state is). A refusal is judged at every point of its call, in every
//! possible state, and counted spurious only when the model admits in all of them.
//!
//! The judgement is per refusal: each call in progress may take effect at whichever point
//! suits the refusal being judged. A full linearizability check, which places every operation
//! once for all refusals together, can find refusals that this one explains (for instance one
//! explained only by a release taking effect after an admission in the same class that needed
//! the released slot, which must have come after it); the counts here are lower bounds.
//!
//! # The limits in force
//!
//! Installs are numbered (one at a time); install `j` applies snapshot `j mod 2`. The
//! limits in force at a point are those of the last install returned by then and of any
//! install in progress. A model state beyond a
//! snapshot's limits (the bound can be, and so can a state after a lowering install) counts
//! as explaining the refusal.
//!
//! # Result
//!
//! One run on a 2-core machine shared with other builds (`cargo test --release
//! --all-features --test spurious_refusals -- --ignored --nocapture`; 8 rounds of 4 threads
//! × 250,000 operations per install rate, about 6 s):
//!
//! ```text
//! installs at 2% of operations, 4,589,033 attempts      refusals  spurious
//!   admission_class / BudgetLimit                          66,337         0
//!   admission_class / ConcurrencyLimit                    110,306         0
//!   admission_class_protection / BudgetLimit              197,248         0
//!   admission_class_protection / ConcurrencyLimit         636,820         0
//!   global / BudgetLimit                                  320,568         0
//!   global / ConcurrencyLimit                               6,810         0
//! installs at 30% of operations, 3,314,086 attempts
//!   admission_class / BudgetLimit                          52,899         0
//!   admission_class / ConcurrencyLimit                    103,857         0
//!   admission_class_protection / BudgetLimit              135,525         0
//!   admission_class_protection / ConcurrencyLimit         476,148         0
//!   global / BudgetLimit                                  253,092         0
//!   global / ConcurrencyLimit                               5,743         0
//! ```
//!
//! With 8 threads (`THREADS = 8`), 18.6 M attempts and 10.3 M refusals: none spurious either.
//!
//! Later runs on the same kind of machine did find some, in the protection rows: on
//! 2026-12-06, main before the short refusal at the shared remainder (f6bdfa5) flagged 3 of
//! 717,546 `admission_class_protection / ConcurrencyLimit` refusals (2% installs), and 7 and 5
//! with it. So the zero asserted below is the goal (issue 26 §5), not what every run meets.
//!
//! The counts depend on how fast installs are. Once an install that changes class limits no
//! longer scanned the markers or waited (the class floors table), an install took about 0.3 µs,
//! and 6 runs on an AMD EPYC guest flagged 12 spurious refusals at 2% installs and 387 at 30%
//! (362 in one run), against 3 in 8 runs of the build before; with a 20 µs spin added to every
//! install (an experiment), none in 6 runs. The tag moves more often during a decision, and
//! the steps in progress listed under "Where they came from" are met more often.
//!
//! Runs vary most with bursts: one run in four to six flags hundreds or thousands of
//! refusals at once, while one thread stands preempted (about 4 ms) with a step in its class
//! word that is then taken back. Twelve runs of each build, alternated (both install rates
//! each), on 2026-12-06:
//!
//! ```text
//!                                      after retries   not after retries
//! b6ef5da (16 retries)                           267   6,989 (6,978 in one burst)
//! this build                                       3   6,070 (1,376 and 4,419 in two bursts;
//!                                                         4 to 100 in each other run)
//! ```
//!
//! Three changes are in "this build": 256 retries instead of 16 (kind 3 below); the
//! collect-checked path's step kept across an install (kind 4); and a borrower that reads the
//! tag again after its class step (kind 5), which fixed an over-admission and made some of
//! the steps that used to stand (unsoundly) become steps taken back. With the first two
//! alone, 12 runs flagged 1 after retries and 16,729 not after retries in one burst, and 4 to
//! 50 in all (mostly 1 to 5) in the eleven other runs.
//!
//! # Where they came from
//!
//! Each row also counts apart the refusals reported **after retries**: those whose collects
//! said the demand fits while the stored shared word did not, reported after `FITS_RETRIES`
//! attempts (`PausePoint::RefusedAfterRetries`). Printing every spurious refusal with the
//! calls around it (a diagnostic not kept) showed that each one met a step of another decider
//! in progress, which the checker rightly does not count:
//!
//! 1. **A protected step taken back after an install overtook it** (the tag moved between
//!    the step and its validation): while it stood, it was a slot and tokens in its class word,
//!    which other refusals counted; taken back, its demand was often refused. The largest
//!    source, in bursts of 10 to 50 while the stepping thread was preempted. Such a step is
//!    now kept and decided under the new limits (`src/protocol/classed/moved.rs`, with the
//!    regression `moved::a_step_kept_across_an_install_refuses_no_one` below).
//! 2. **A step of the collect-checked path that its own collect refused.** That path now reads
//!    every class word before it steps and takes no step they already refuse (the regression
//!    `slow_path::a_step_its_own_collect_refuses_is_not_taken` below).
//! 3. **Reported after retries:** the stored shared word above the truth while a preempted
//!    thread owes it a decrease, a borrower's reservation larger than what its class needs by
//!    the time it steps (the class moved), or a release's or a migration's decrease between
//!    its two words. The collect says the demand fits, the stored word does not, and after its
//!    bounded retries the refusal is reported. The retries now wait for the owner: 256 of them
//!    (16 before), each after the seventh a yield, outside any operation
//!    (`src/protocol/classed/retries.rs` has the histogram that chose the count). Excluding
//!    these for good needs a refusal able to take such an amount back on the owner's behalf
//!    (helping), which the anonymous amounts in the shared word do not allow; see `tentative`
//!    below.
//! 4. **The collect-checked path's step taken back after an install overtook it**, the source
//!    of the largest bursts (timing every undo showed one such step standing about 4 ms in the
//!    run examined, 3,600 refusals flagged meanwhile). It is now kept and decided under the
//!    new limits, as kind 1 is (`moved::a_slow_step_kept_across_an_install_refuses_no_one`).
//! 5. **A kept step the new limits refuse** (left): after a quantum of installs, the limits
//!    in force may refuse a step that those of its tag admitted. Borrowers' steps overtaken by
//!    an install are among them now: they used to be admitted unchecked, which over-admitted
//!    (`tests/borrow_overtaken.rs`), and are decided under the current limits instead.
//!    Since then they are the largest source of bursts: on 2026-12-07, 22 runs printed every
//!    class step taken back more than 500 µs after it was taken (a diagnostic not kept). Of
//!    the 12 printed, 11 were borrowers, 7 of them kept across an install and refused 0.6 to
//!    4 ms after their reservation by the limits then in force. Five of the seven phases that
//!    flagged more than 500 refusals (609 to 3,584) had such a borrower; the other two (601,
//!    and 8,532, the largest) had no long take-back printed (the full protocol's protected
//!    step has no pause point after its CAS, so it was not seen).
//!
//!    The same diagnostic, timing also each borrower's class CAS, then showed two kinds of
//!    those borrowers: preempted after their class CAS (about half), and preempted between
//!    their reservation and their class CAS. Two changes answer them
//!    (`src/protocol/classed/moved.rs`, "A borrower's step"): a borrower reserved whole (its
//!    slot and all of its tokens borrowed) stands from its reservation, whatever install
//!    follows (`moved::a_reserved_borrower_overtaken_refuses_no_one`); one whose class CAS
//!    came before the install's CAS of the tag stands under its tag, which the install's mark
//!    on every class word (`EPOCH`) shows when one install came in between
//!    (`moved::a_borrower_stepped_before_an_install_refuses_no_one`). Left: borrowers with
//!    part of their demand inside their class's floors, overtaken by several installs (at 2%
//!    of operations, a preempted thread sees hundreds), and protected steps kept across an
//!    install.
//!
//! Measured with this file's run (4 threads, 2% and 30% installs, 2026-12-06): before 1 and 2,
//! 22 runs flagged 122 spurious refusals, 104 of them not after retries (about 2 in a million
//! refusals); with 2 only, 16 runs flagged 63 (40); with both, 16 runs flagged 25, of which 4
//! not after retries (about 0.6 in a million). Runs vary a lot, since one preempted thread
//! makes a burst.
//!
//! The self-test flags 70-100% of the admissions reported as refusals, so the checker does see
//! a refusal that no state of its call explains. Its zero is therefore a statement about
//! refusals explained one at a time; the spurious refusal exists all the same, as
//! `tentative::a_borrower_reservation_taken_back_refuses_no_one` shows deterministically: a
//! borrower's reservation on the shared word refuses another class's borrower while the
//! borrower is stopped for longer than the refusal's bounded retries (`FITS_RETRIES`), and is
//! then taken back. Random schedules on two cores seldom stop a thread that long at that step.
//!
//! The bounded test without classes asserts zero: there a decision is one CAS on one word and
//! holds no tentative step, so any refusal this checker flagged there would be a fault of the
//! checker. The classed measurement is `#[ignore]`d for its size (about 6 s in release): it
//! prints its counts and asserts zero (see "Result" for the runs that did not); the `tentative`
//! regression is `#[ignore]`d because it fails until the class protocol excludes the refusal
//! it pins (kind 3 above, see the lib.rs "Precision" paragraph). Neither runs in CI. The
//! `moved` and `slow_path` regressions run in CI, and `.ci/run` requires them to fail on
//! their broken variants, `LLM_BULKHEAD_UNDO_MOVED_STEP=1` and `LLM_BULKHEAD_SLOW_NO_PRECHECK=1`.

use llm_bulkhead::model::Model;
use llm_bulkhead::{
    Admission, Bulkhead, ClassLimits, Constraint, Demand, LimitsSnapshot, RejectReason, Reservation,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};

const THREADS: usize = 4;
const CLASSES: usize = 3;
const NAMES: [&str; CLASSES] = ["premium", "standard", "batch"];
/// Admissions one thread holds at most.
const HOLD: usize = 3;
/// Reservations are multiples of this, up to [`MAX_UNITS`] of them.
const UNIT: u64 = 200;
const MAX_UNITS: u64 = 6;

/// Per class: `(slots, tokens)`.
type Occupancy = [(u64, u64); CLASSES];

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

/// A decider on its own thread, stopped at pause points (feature `testing`): where `pick`
/// names an event, the thread reports it and waits for the returned sender's go. `decide` makes
/// its call; the hook is cleared, the call's `report` sent as the last event, and its result
/// handed back by `join`. The deterministic regressions below (`moved`, `slow_path`) use it.
fn stopped_thread<E: Send + 'static, R: Send + 'static>(
    mut pick: impl FnMut(llm_bulkhead::testing::PausePoint) -> Option<E> + Send + 'static,
    decide: impl FnOnce() -> R + Send + 'static,
    report: fn(&R) -> E,
) -> (
    std::thread::JoinHandle<R>,
    std::sync::mpsc::Receiver<E>,
    std::sync::mpsc::Sender<()>,
) {
    let (ev_tx, ev_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let events = ev_tx.clone();
        llm_bulkhead::testing::set_pause_hook(move |point| {
            if let Some(event) = pick(point) {
                events.send(event).unwrap();
                go_rx.recv().unwrap();
            }
        });
        let out = decide();
        llm_bulkhead::testing::clear_pause_hook();
        ev_tx.send(report(&out)).unwrap();
        out
    });
    (thread, ev_rx, go_tx)
}

/// Two slots, 100 tokens, classes `p` and `q`; `q` holds a slot and `q_tokens` tokens,
/// and then an install gives `p` floors of one slot and 50 tokens: the stored `V`
/// (`q_tokens + 50`) is past the budget, so a demand inside `p`'s floors takes the
/// collect-checked path.
fn stored_v_past_the_budget(q_tokens: u64) -> (Bulkhead, llm_bulkhead::Admission) {
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100)
        .class("p", ClassLimits::default())
        .class("q", ClassLimits::default())
        .default_class("q")
        .build()
        .unwrap();
    let q = b.class_id("q").unwrap();
    let held = b
        .try_acquire(Demand::tokens(Reservation::new(0, q_tokens).unwrap()).in_class(q))
        .expect("q borrows");
    let floors = ClassLimits {
        protected_concurrent: 1,
        protected_tokens: 50,
        ..ClassLimits::default()
    };
    let p = b.class_id("p").unwrap();
    b.apply_limits(b.limits().with_revision(1).with_class(p, floors))
        .unwrap();
    (b, held)
}

fn class(
    protected_concurrent: u32,
    max: Option<u32>,
    tokens: u64,
    max_tokens: Option<u64>,
) -> ClassLimits {
    ClassLimits {
        protected_concurrent,
        max_concurrent: max,
        protected_tokens: tokens,
        max_tokens,
    }
}

/// The limits of one configuration: global slots and budget, and per class limits.
type Config = (u32, u64, [ClassLimits; CLASSES]);

/// The two alternating configurations (both leave a shared remainder to borrow). Without
/// classes the class limits do not refuse, so tighter global limits do.
fn config(which: usize, classed: bool) -> Config {
    let (slots, budget, classes) = if which == 0 {
        (
            6,
            4_800,
            [
                class(2, Some(4), 1_200, Some(3_600)),
                class(1, None, 800, None),
                class(1, Some(3), 400, Some(2_400)),
            ],
        )
    } else {
        (
            7,
            4_000,
            [
                class(2, Some(3), 1_000, Some(3_000)),
                class(2, None, 1_000, None),
                class(1, Some(4), 400, Some(2_400)),
            ],
        )
    };
    if classed {
        (slots, budget, classes)
    } else {
        (slots / 3, budget / 3, classes)
    }
}

/// Whether occupancy `s` is within the loosest of both configurations' ceilings and global
/// limits. Every state the bulkhead is in passes: each admission kept within the limits in
/// force when it was made, and releases only lower the occupancy.
fn possible(s: &Occupancy, classed: bool) -> bool {
    let [a, b] = [config(0, classed), config(1, classed)];
    let (slots, tokens) = s.iter().fold((0, 0), |(n, t), &(k, r)| (n + k, t + r));
    let class_ok = (0..CLASSES).all(|k| {
        let most = |f: fn(&ClassLimits) -> Option<u64>| match (f(&a.2[k]), f(&b.2[k])) {
            (Some(x), Some(y)) => x.max(y),
            _ => u64::MAX,
        };
        !classed
            || (s[k].0 <= most(|l| l.max_concurrent.map(u64::from))
                && s[k].1 <= most(|l| l.max_tokens))
    });
    class_ok && slots <= u64::from(a.0.max(b.0)) && tokens <= a.1.max(b.1)
}

fn template(which: usize, classed: bool) -> Bulkhead {
    let (slots, budget, classes) = config(which, classed);
    let b = Bulkhead::builder()
        .max_concurrent(slots)
        .token_budget(budget);
    let b = if classed {
        classes
            .iter()
            .zip(NAMES)
            .fold(b, |b, (l, n)| b.class(n, *l))
            .default_class("standard")
    } else {
        b
    };
    b.build().unwrap()
}

/// The bulkhead under test (configuration 0) and both configurations as its own snapshots.
fn setup(classed: bool) -> (Bulkhead, [LimitsSnapshot; 2]) {
    let b = template(0, classed);
    let first = b.limits();
    b.apply_limits(template(1, classed).limits().with_revision(1))
        .unwrap();
    let second = b.limits();
    b.apply_limits(first.with_revision(2)).unwrap();
    (b, [first, second])
}

fn demand(b: &Bulkhead, classed: bool, k: usize, r: u64) -> Demand {
    let input = r / 2;
    let d = Demand::tokens(Reservation::new(input, r - input).unwrap());
    if classed {
        d.in_class(b.class_id(NAMES[k]).unwrap())
    } else {
        d
    }
}

/// The clock every call is stamped on, and the installs.
#[derive(Default)]
struct Shared {
    /// One ticket is drawn just before and one just after every call (acquire, release,
    /// install): one atomic's modification order, so ticket order is consistent with real
    /// time and each call lies strictly between its two tickets.
    clock: AtomicU64,
    /// Serialises installs, so that revisions increase; counts them.
    installer: Mutex<u64>,
}

impl Shared {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, SeqCst)
    }

    fn install(&self, b: &Bulkhead, snapshots: &[LimitsSnapshot; 2], log: &mut Log) {
        let mut n = self.installer.lock().unwrap();
        *n += 1;
        let next = snapshots[(*n % 2) as usize].with_revision(2 + *n);
        let start = self.tick();
        b.apply_limits(next).unwrap();
        log.installs.push((*n, start, self.tick()));
    }
}

/// A refusal with what the checker knows of its call.
struct Refusal {
    class: usize,
    r: u64,
    /// The tickets around the call.
    span: (u64, u64),
    /// `None`: an admission the test dropped at once and recorded as a refusal (see
    /// [`Run::fabricate_per_mille`]).
    kind: Option<(Option<Constraint>, RejectReason)>,
    /// Reported after its bounded retries, its collects having said the demand fits
    /// (`PausePoint::RefusedAfterRetries`).
    after_retries: bool,
}

/// One thread's record.
#[derive(Default)]
struct Log {
    attempts: u64,
    /// Admissions: class, tokens, and the tickets of the acquire's return and of the
    /// release's start (in force for certain in between).
    held: Vec<(usize, u64, u64, u64)>,
    /// The calls of admissions (acquires and releases), in this thread's order: the tickets
    /// around the call, class and tokens. In between the admission may or may not hold.
    calls: Vec<(u64, u64, usize, u64)>,
    refusals: Vec<Refusal>,
    /// Installs: number, ticket before, ticket after.
    installs: Vec<(u64, u64, u64)>,
}

/// One run's shape.
struct Run {
    classed: bool,
    /// Rounds, each on a fresh bulkhead (the checker's timeline is held in memory per round).
    rounds: u64,
    ops_per_thread: usize,
    /// Installs per 1,000 operations.
    installs_per_mille: u64,
    /// Admissions per 1,000 that the test drops at once and records as refusals: each one was
    /// admitted at some instant of its call, so the checker must find most of them spurious
    /// (this shows it can see a spurious refusal).
    fabricate_per_mille: u64,
    seed: u64,
}

fn worker(run: &Run, b: &Bulkhead, snaps: &[LimitsSnapshot; 2], sh: &Shared, mut rng: Rng) -> Log {
    let classes = if run.classed { CLASSES } else { 1 };
    let mut held: Vec<(Admission, usize, u64, u64)> = Vec::new();
    let mut log = Log::default();
    let after_retries = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let counter = after_retries.clone();
    llm_bulkhead::testing::set_pause_hook(move |p| {
        if p == llm_bulkhead::testing::PausePoint::RefusedAfterRetries {
            counter.set(counter.get() + 1);
        }
    });
    let release = |log: &mut Log, (a, k, r, t): (Admission, usize, u64, u64)| {
        let start = sh.tick();
        drop(a);
        log.calls.push((start, sh.tick(), k, r));
        log.held.push((k, r, t, start));
    };
    for _ in 0..run.ops_per_thread {
        if rng.below(1_000) < run.installs_per_mille {
            sh.install(b, snaps, &mut log);
            continue;
        }
        if !held.is_empty() && (held.len() >= HOLD || rng.below(2) == 0) {
            let h = held.swap_remove(rng.below(held.len() as u64) as usize);
            release(&mut log, h);
            continue;
        }
        let k = rng.below(classes as u64) as usize;
        let r = rng.below(MAX_UNITS + 1) * UNIT;
        let d = demand(b, run.classed, k, r);
        log.attempts += 1;
        let start = sh.tick();
        let retried_before = after_retries.get();
        let outcome = b.try_acquire(d);
        let retried = after_retries.get() != retried_before;
        match outcome {
            Ok(a) if rng.below(1_000) < run.fabricate_per_mille => {
                drop(a);
                let end = sh.tick();
                // A real admission somewhere in the span, for every other refusal's
                // judgement; the judgement of this one leaves it out (it is its own thread's).
                log.calls.push((start, end, k, r));
                log.refusals.push(Refusal {
                    class: k,
                    r,
                    span: (start, end),
                    kind: None,
                    after_retries: retried,
                });
            }
            Ok(a) => {
                let end = sh.tick();
                log.calls.push((start, end, k, r));
                held.push((a, k, r, end));
            }
            Err(rej) => log.refusals.push(Refusal {
                class: k,
                r,
                span: (start, sh.tick()),
                kind: Some((rej.constraint, rej.reason)),
                after_retries: retried,
            }),
        }
    }
    for h in held {
        release(&mut log, h);
    }
    llm_bulkhead::testing::clear_pause_hook();
    log
}

/// Whether the model, under `limits` and in occupancy `s`, admits `r` tokens in class `k`;
/// `false` when `s` itself is beyond the limits.
fn model_admits(
    b: &Bulkhead,
    classed: bool,
    limits: &LimitsSnapshot,
    s: &Occupancy,
    k: usize,
    r: u64,
) -> bool {
    let mut m = if classed {
        Model::with_classes(*limits, &NAMES, 1).unwrap()
    } else {
        Model::new(*limits).unwrap()
    };
    for (j, &(slots, tokens)) in s.iter().enumerate() {
        // All of the class's tokens on its first admission: "admit" is antitone in the
        // state, so a state within every limit is reached whatever the order.
        for i in 0..slots {
            let t = if i == 0 { tokens } else { 0 };
            if m.try_acquire(demand(b, classed, j, t)).is_err() {
                return false;
            }
        }
    }
    m.try_acquire(demand(b, classed, k, r)).is_ok()
}

/// Per kind of refusal: `(refusals, spurious)`.
type Table = Vec<(String, u64, u64)>;

fn row(rej: &Refusal) -> String {
    match rej.kind {
        Some((constraint, reason)) => {
            let constraint = constraint.map_or("none", |c| c.as_str());
            let retried = if rej.after_retries {
                " (after retries)"
            } else {
                ""
            };
            format!("{constraint} / {reason:?}{retried}")
        }
        None => FABRICATED.to_owned(),
    }
}

const FABRICATED: &str = "(fabricated: admitted, reported refused)";

/// Runs `run`; returns the attempts and the table of refusals by kind.
fn measure(run: &Run) -> (u64, Table) {
    let (mut attempts, mut table) = (0, Table::new());
    for round in 0..run.rounds {
        let (n, t) = round_of(run, run.seed.wrapping_add(round));
        attempts += n;
        for (name, n, spurious) in t {
            match table.iter_mut().find(|(m, _, _)| *m == name) {
                Some(row) => (row.1, row.2) = (row.1 + n, row.2 + spurious),
                None => table.push((name, n, spurious)),
            }
        }
    }
    table.sort();
    (attempts, table)
}

/// One round of `run` with `seed`.
fn round_of(run: &Run, seed: u64) -> (u64, Table) {
    let (b, snaps) = setup(run.classed);
    let sh = Shared::default();
    let start = Barrier::new(THREADS);
    let logs: Vec<Log> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (b, snaps, sh, start) = (&b, &snaps, &sh, &start);
                let rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t as u64 + 1));
                s.spawn(move || {
                    start.wait();
                    worker(run, b, snaps, sh, rng)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(b.stats().in_flight, 0, "everything released");
    let ticks = sh.clock.load(SeqCst) as usize + 1;
    // The occupancy for certain just after ticket `t`: every admission whose acquire had
    // returned and whose release had not begun.
    let mut occupancy: Vec<Occupancy> = vec![[(0, 0); CLASSES]; ticks];
    // Installs begun and returned by ticket `t`.
    let (mut begun, mut returned) = (vec![0u64; ticks], vec![0u64; ticks]);
    for log in &logs {
        for &(k, r, from, to) in &log.held {
            // Deltas, summed below (wrapping: a delta may be negative).
            let f = &mut occupancy[from as usize][k];
            *f = (f.0.wrapping_add(1), f.1.wrapping_add(r));
            let d = &mut occupancy[to as usize][k];
            *d = (d.0.wrapping_sub(1), d.1.wrapping_sub(r));
        }
        for &(n, from, to) in &log.installs {
            begun[from as usize] = n;
            returned[to as usize] = n;
        }
    }
    for t in 1..ticks {
        let before = occupancy[t - 1];
        for (now, was) in occupancy[t].iter_mut().zip(before) {
            *now = (was.0.wrapping_add(now.0), was.1.wrapping_add(now.1));
        }
        begun[t] = begun[t].max(begun[t - 1]);
        returned[t] = returned[t].max(returned[t - 1]);
    }
    let mut cache: HashMap<(usize, Occupancy, usize, u64), bool> = HashMap::new();
    let mut table: Table = Vec::new();
    let mut attempts = 0;
    for (me, log) in logs.iter().enumerate() {
        attempts += log.attempts;
        for rej in &log.refusals {
            // Spurious: at every point of the call, in every possible state (the certain
            // admissions, and any of the calls then in progress in other threads), under
            // every snapshot possibly in force there, the model admits (install `n` applies
            // snapshot `n mod 2`).
            let spurious = (rej.span.0..rej.span.1).all(|t| {
                let configs: &[usize] = if begun[t as usize] > returned[t as usize] {
                    &[0, 1]
                } else if returned[t as usize] % 2 == 0 {
                    &[0]
                } else {
                    &[1]
                };
                let open: Vec<(usize, u64)> = logs
                    .iter()
                    .enumerate()
                    .filter(|&(other, _)| other != me)
                    .filter_map(|(_, l)| {
                        let i = l.calls.partition_point(|c| c.0 <= t);
                        let &(_, to, k, r) = l.calls.get(i.checked_sub(1)?)?;
                        (to > t).then_some((k, r))
                    })
                    .collect();
                (0..1u32 << open.len()).all(|mask| {
                    let mut s = occupancy[t as usize];
                    for (i, &(k, r)) in open.iter().enumerate() {
                        if mask & (1 << i) != 0 {
                            s[k] = (s[k].0 + 1, s[k].1 + r);
                        }
                    }
                    !possible(&s, run.classed)
                        || configs.iter().all(|&c| {
                            *cache.entry((c, s, rej.class, rej.r)).or_insert_with(|| {
                                model_admits(&b, run.classed, &snaps[c], &s, rej.class, rej.r)
                            })
                        })
                })
            });
            let name = row(rej);
            let i = table
                .iter()
                .position(|(n, _, _)| *n == name)
                .unwrap_or_else(|| {
                    table.push((name, 0, 0));
                    table.len() - 1
                });
            table[i].1 += 1;
            table[i].2 += u64::from(spurious);
        }
    }
    (attempts, table)
}

fn report(what: &str, run: &Run, attempts: u64, table: &Table) {
    println!(
        "{what}: {} rounds of {} threads x {} operations, installs at {:.1}% of operations, {attempts} attempts",
        run.rounds,
        THREADS,
        run.ops_per_thread,
        run.installs_per_mille as f64 / 10.0
    );
    for (name, n, spurious) in table {
        println!(
            "  {name:<48} {n:>8} refusals, {spurious:>6} spurious ({:.4}%)",
            100.0 * *spurious as f64 / (*n).max(1) as f64
        );
    }
}

/// Spurious refusals among the engine's own (the fabricated ones left out).
fn spurious(table: &Table) -> u64 {
    table
        .iter()
        .filter(|(name, _, _)| name != FABRICATED)
        .map(|(_, _, s)| s)
        .sum()
}

/// Runs `rounds` rounds at installs on 2% and on 30% of operations, prints the tables;
/// returns the refusals and the spurious ones, in all.
fn both_rates(classed: bool, rounds: u64, ops_per_thread: usize) -> (u64, u64) {
    let (mut refusals, mut total) = (0, 0);
    for installs_per_mille in [20, 300] {
        let run = Run {
            classed,
            rounds,
            ops_per_thread,
            installs_per_mille,
            fabricate_per_mille: 0,
            seed: 0x5eed_0026,
        };
        let (attempts, table) = measure(&run);
        report(
            if classed { "classes" } else { "no classes" },
            &run,
            attempts,
            &table,
        );
        refusals += table.iter().map(|(_, n, _)| n).sum::<u64>();
        total += spurious(&table);
    }
    (refusals, total)
}

/// Without classes every refusal is decided on one word with no tentative step: the checker
/// must find none spurious (this checks the checker's soundness, and the plain path).
#[test]
fn no_spurious_refusal_without_classes() {
    let (refusals, spurious) = both_rates(false, 1, 20_000);
    assert!(refusals > 1_000, "the run must refuse");
    assert_eq!(spurious, 0);
}

/// The measurement with classes: prints the rate per kind of refusal.
#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn spurious_refusals_with_classes() {
    let (_, spurious) = both_rates(true, 8, 250_000);
    assert_eq!(spurious, 0, "spurious class refusals");
}

/// The checker sees a spurious refusal: admissions reported as refusals are flagged (most of
/// them; one whose call overlapped a moment of full occupancy is rightly explained), on both
/// kinds of bulkhead, while the engine's own refusals stay unflagged.
#[test]
fn the_checker_flags_admissions_reported_as_refusals() {
    for classed in [false, true] {
        let run = Run {
            classed,
            rounds: 1,
            ops_per_thread: 20_000,
            installs_per_mille: 100,
            fabricate_per_mille: 50,
            seed: 0x5eed_0027,
        };
        let (attempts, table) = measure(&run);
        report("fabricated refusals", &run, attempts, &table);
        let &(_, n, flagged) = table
            .iter()
            .find(|(name, _, _)| name == FABRICATED)
            .unwrap();
        assert!(n > 100 && flagged * 2 > n, "{flagged} of {n} flagged");
    }
}

/// A spurious refusal made deterministic with the pause hooks (feature `testing`): the
/// borrower's tentative step on the shared word refuses another class's borrower, then the
/// borrower's class moves, its reservation is taken back and it is refused itself.
mod tentative {
    use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook, PausePoint};
    use llm_bulkhead::{Bulkhead, ClassLimits, Constraint, Demand, Reservation};
    use std::sync::mpsc;

    /// Class `a`: one protected slot and its ceiling, no protected tokens, so a request with
    /// tokens borrows them. Class `b`: nothing protected. 1,000 tokens in all.
    fn bulkhead() -> Bulkhead {
        let a = ClassLimits {
            protected_concurrent: 1,
            max_concurrent: Some(1),
            ..ClassLimits::default()
        };
        Bulkhead::builder()
            .max_concurrent(4)
            .token_budget(1_000)
            .class("a", a)
            .class("b", ClassLimits::default())
            .default_class("b")
            .build()
            .unwrap()
    }

    fn tokens(b: &Bulkhead, class: &str, r: u64) -> Demand {
        Demand::tokens(Reservation::new(0, r).unwrap()).in_class(b.class_id(class).unwrap())
    }

    /// 1. `x` (class `a`, 600 tokens, borrowed) reserves them on the shared word and stops
    ///    before its class step.
    /// 2. `y` (class `b`, 600 tokens) meets `x`'s reservation: 1,200 > 1,000.
    /// 3. `z` (class `a`, a slot, no tokens) is admitted inside `a`'s floor.
    /// 4. `x` resumes, finds its class moved and at its ceiling, takes its reservation back
    ///    and is refused.
    ///
    /// No serial order refuses `y`: `x` never held anything and `z` holds no tokens. Today
    /// `y` is refused (after its bounded retries, since `x` stays stopped), which is the
    /// defect of issue 26 §5 this test pins; it passes once a refusal that meets a
    /// tentative step can no longer be reported.
    #[test]
    #[ignore = "the known spurious refusal of issue 26 §5: fails until the class protocol excludes it"]
    fn a_borrower_reservation_taken_back_refuses_no_one() {
        let b = bulkhead();
        let (at_tx, at_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let x = {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut first = Some((at_tx, go_rx));
                set_pause_hook(move |p| {
                    if p == PausePoint::BorrowReserved {
                        if let Some((at, go)) = first.take() {
                            at.send(()).unwrap();
                            go.recv().unwrap();
                        }
                    }
                });
                let out = b.try_acquire(tokens(&b, "a", 600)).map(drop);
                clear_pause_hook();
                out
            })
        };
        at_rx.recv().expect("x reserves its borrowed tokens");
        let y = b.try_acquire(tokens(&b, "b", 600));
        let z = b
            .try_acquire(Demand::slot().in_class(b.class_id("a").unwrap()))
            .expect("z fits inside a's floor");
        go_tx.send(()).unwrap();
        let x = x
            .join()
            .unwrap()
            .expect_err("x meets a's ceiling once z holds it");
        assert_eq!(x.constraint, Some(Constraint::AdmissionClass), "{x:?}");
        drop(z);
        // The sequential model admits y in every order of x (refused), y and z.
        let y = y.map_err(|rej| format!("spurious refusal: {rej:?}"));
        assert!(y.is_ok(), "{y:?}");
    }
}

/// A protected step that an install overtakes (`src/protocol/classed/moved.rs`), made
/// deterministic with the pause hooks (feature `testing`).
mod moved {
    use llm_bulkhead::testing::PausePoint;
    use llm_bulkhead::{BudgetLimits, Bulkhead, ClassLimits, Demand, Reservation};

    /// What the stopped thread reports.
    enum Event {
        /// Its protected step is in the class word, not yet validated.
        StepTaken,
        /// It is about to change its class word again (to take its step back, or to step
        /// again).
        Retrying,
        /// Its decision: admitted (with the revision), or refused.
        Decided(Result<u64, String>),
    }

    /// `x`: `b.try_acquire(d)` on a thread stopped where `pick` names an event
    /// (`super::stopped_thread`), its decision reported last.
    fn stopped_decider(
        b: &Bulkhead,
        d: Demand,
        pick: impl FnMut(PausePoint) -> Option<Event> + Send + 'static,
    ) -> (
        std::thread::JoinHandle<Result<llm_bulkhead::Admission, llm_bulkhead::Rejection>>,
        std::sync::mpsc::Receiver<Event>,
        std::sync::mpsc::Sender<()>,
    ) {
        let bx = b.clone();
        super::stopped_thread(
            pick,
            move || bx.try_acquire(d),
            |out| {
                Event::Decided(match out {
                    Ok(adm) => Ok(adm.revision()),
                    Err(rej) => Err(format!("{rej:?}")),
                })
            },
        )
    }

    /// A floor of one slot.
    fn one_slot_floor() -> ClassLimits {
        ClassLimits {
            protected_concurrent: 1,
            ..ClassLimits::default()
        }
    }

    /// One class `a`, the default, with `limits`, under `max_concurrent` and `budget`.
    fn only_a(max_concurrent: u32, budget: Option<u64>, limits: ClassLimits) -> Bulkhead {
        let mut builder = Bulkhead::builder()
            .max_concurrent(max_concurrent)
            .class("a", limits)
            .default_class("a");
        if let Some(budget) = budget {
            builder = builder.token_budget(budget);
        }
        builder.build().unwrap()
    }

    /// The race of both kept-step regressions: `x` (demand `d`) takes its step and stops at
    /// `stepped_at`; an install (the same limits, revision `revision`) moves the tag; `y`
    /// (demand `d` too) meets `x`'s step and must be refused; `x` resumes, and wherever it is
    /// about to change its class word again (to take its step back, or to step again), `z`
    /// (demand `d`) tries to take the capacity first. Returns `x`'s decision, with `x` and `z`
    /// released.
    fn kept_step_race(
        b: &Bulkhead,
        stepped_at: PausePoint,
        revision: u64,
        d: Demand,
    ) -> Result<u64, String> {
        let mut stepped = false;
        let pick = move |p| match p {
            p if p == stepped_at && !stepped => {
                stepped = true;
                Some(Event::StepTaken)
            }
            PausePoint::ClassCas if stepped => Some(Event::Retrying),
            _ => None,
        };
        let (x, ev_rx, go_tx) = stopped_decider(b, d, pick);
        assert!(matches!(ev_rx.recv().unwrap(), Event::StepTaken));
        b.apply_limits(b.limits().with_revision(revision)).unwrap();
        let y = b.try_acquire(d);
        assert!(y.is_err(), "y meets x's step in the floor: {y:?}");
        go_tx.send(()).unwrap();
        let mut z = None;
        let x_decided = loop {
            match ev_rx.recv().unwrap() {
                Event::Retrying => {
                    // Once x's step is back, z takes the floor before x steps again.
                    if z.is_none() {
                        z = b.try_acquire(d).ok();
                    }
                    go_tx.send(()).unwrap();
                }
                Event::StepTaken => unreachable!("one step is reported"),
                Event::Decided(d) => break d,
            }
        };
        drop(x.join().unwrap());
        drop(z);
        x_decided
    }

    /// 1. `x` (class `a`, inside `a`'s one protected slot) takes its step and stops before
    ///    validating it.
    /// 2. An install (the same limits, a new revision) moves the tag.
    /// 3. `y` (class `a` too) meets `x`'s step: `a`'s floor is in use, so `y` would borrow the
    ///    only slot, which the floor keeps. Refused.
    /// 4. `x` resumes and finds the tag moved.
    ///
    /// `y`'s refusal is explained only if `x` holds the slot. Taken back (as before), `x`
    /// decides again, and `z` (class `a`, let in where `x` is about to step again) takes the
    /// floor first: `x` is refused, and no serial order refuses `y`. Kept, `x` is admitted
    /// under the new revision and `z` never runs.
    #[test]
    fn a_step_kept_across_an_install_refuses_no_one() {
        let b = only_a(1, None, one_slot_floor());
        let x_decided = kept_step_race(&b, PausePoint::ProtectedStepTaken, 1, Demand::slot());
        // y was refused while x's step stood: only an admission of x explains it.
        assert_eq!(
            x_decided,
            Ok(1),
            "x's step refused y and was then taken back: y's refusal is spurious"
        );
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }

    /// The collect-checked path's step, overtaken by an install (`super::stored_v_past_the_budget`,
    /// `q` holding all 100 tokens: the stored `V` is 150):
    ///
    /// 1. `x` (`p`, a slot, no tokens: `G + 1 = 2`, `T = 100`, it fits) takes its step and
    ///    stops before its collect.
    /// 2. An install (the same limits, revision 2) moves the tag.
    /// 3. `y` (`p`, a slot) meets `x`'s step: `p`'s floor is in use, so `y` would borrow a
    ///    slot that the floor keeps. Refused.
    /// 4. `x` resumes and finds the tag moved.
    ///
    /// Taken back (as before), `x` decides again and `z` (`p`, a slot, let in where `x` is
    /// about to change its class word again) takes the floor first: `x` is refused, and no
    /// serial order refuses `y`. Kept, `x` is decided under revision 2, where the stored `V`
    /// still refuses it but the collect (`T = 100`) admits it: it borrows no tokens.
    #[test]
    fn a_slow_step_kept_across_an_install_refuses_no_one() {
        let (b, held) = super::stored_v_past_the_budget(100);
        let p = b.class_id("p").unwrap();
        let x_decided =
            kept_step_race(&b, PausePoint::SlowStepTaken, 2, Demand::slot().in_class(p));
        drop(held);
        assert_eq!(
            x_decided,
            Ok(2),
            "x's step refused y and was then taken back: y's refusal is spurious"
        );
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }

    /// The race of both overtaken-borrower regressions: `x` (demand `dx`) stops at `stop_at`
    /// (its first); `y` (demand `dy`) meets `x`'s reservation or step and must be refused; an
    /// install of `next` lands; `x` resumes. Returns `x`'s decision, with `x` released.
    fn overtaken_borrower_race(
        b: &Bulkhead,
        stop_at: PausePoint,
        dx: Demand,
        dy: Demand,
        next: llm_bulkhead::LimitsSnapshot,
    ) -> Result<u64, String> {
        let mut stopped = false;
        let pick = move |p| match p {
            p if p == stop_at && !stopped => {
                stopped = true;
                Some(Event::StepTaken)
            }
            _ => None,
        };
        let (x, ev_rx, go_tx) = stopped_decider(b, dx, pick);
        assert!(matches!(ev_rx.recv().unwrap(), Event::StepTaken));
        let y = b.try_acquire(dy);
        assert!(y.is_err(), "y meets x: {y:?}");
        b.apply_limits(next).unwrap();
        go_tx.send(()).unwrap();
        let Event::Decided(x_decided) = ev_rx.recv().unwrap() else {
            unreachable!("one stop is reported")
        };
        drop(x.join().unwrap());
        x_decided
    }

    /// A borrower whose class step came before an install's CAS of the tag
    /// (`src/protocol/classed/moved.rs`, "A borrower's step"), its slot inside its class's
    /// floor and its tokens borrowed:
    ///
    /// 1. `x` (class `a`, whose floor of one slot is idle, and all 100 tokens of the budget,
    ///    borrowed) reserves the tokens, takes its class step, and stops before it reads the
    ///    tag again.
    /// 2. `y` (class `a` too, 10 tokens) meets `x`'s tokens and is refused.
    /// 3. An install lowers the budget to 50.
    /// 4. `x` resumes and finds the install announced.
    ///
    /// `y`'s refusal is explained only if `x` holds the tokens. Decided again under the lower
    /// budget (as before, `LLM_BULKHEAD_BORROW_IGNORES_EPOCH=1`), `x` is taken back and
    /// refused, and no serial order refuses `y`. Its class CAS replaced a word the install
    /// had not marked (`EPOCH`), so it came before the install's CAS of the tag: `x` stands
    /// under the first revision, as a step before the install does.
    #[test]
    fn a_borrower_stepped_before_an_install_refuses_no_one() {
        let b = only_a(2, Some(100), one_slot_floor());
        let first = b.limits().revision;
        let tokens = |r| Demand::tokens(Reservation::new(0, r).unwrap());
        let next = budget_lowered(&b, 50);
        let x_decided =
            overtaken_borrower_race(&b, PausePoint::BorrowStepped, tokens(100), tokens(10), next);
        assert_eq!(
            x_decided,
            Ok(first),
            "x's step refused y and was then taken back: y's refusal is spurious"
        );
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }

    /// A borrower reserved whole (its slot and all of its tokens borrowed), overtaken by an
    /// install before its class step (`src/protocol/classed/moved.rs`, "A borrower's step"):
    ///
    /// 1. `x` (class `a`, no floors: it borrows the one slot) reserves it and stops before its
    ///    class step.
    /// 2. `y` (class `a` too) meets `x`'s reservation and is refused: the slot is taken.
    /// 3. An install closes the switch (`max_concurrent` 0).
    /// 4. `x` resumes, and its class CAS finds the word the install marked.
    ///
    /// Decided again under the kill switch (as before,
    /// `LLM_BULKHEAD_RESERVED_DECIDED_AGAIN=1`), `x` is taken back and refused, and no serial
    /// order refuses `y`. Reserved whole, `x` is counted by every decider from its
    /// reservation on, in the stored word or in the excess an exact check adds to its
    /// collect: it stands under the first revision.
    #[test]
    fn a_reserved_borrower_overtaken_refuses_no_one() {
        let b = only_a(1, None, ClassLimits::default());
        let first = b.limits().revision;
        let killed = b.limits().with_revision(first + 1).with_max_concurrent(0);
        let x_decided = overtaken_borrower_race(
            &b,
            PausePoint::BorrowReserved,
            Demand::slot(),
            Demand::slot(),
            killed,
        );
        assert_eq!(
            x_decided,
            Ok(first),
            "x's reservation refused y and was then taken back: y's refusal is spurious"
        );
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }

    /// A borrower whose class an install migrated between its reservation and its class step
    /// (`src/protocol/classed/reserve.rs`, `class_step_moved`):
    ///
    /// 1. `x` (class `a`, no floors: it borrows the one slot and 10 tokens) reserves them and
    ///    stops before its class step.
    /// 2. `y` (class `a` too, 95 tokens) meets `x`'s reservation and is refused.
    /// 3. An install gives `a` a token ceiling of 50 (a new version of the class: its word
    ///    migrates) and lowers the budget to 5.
    /// 4. `x` resumes, and its class CAS finds the migrated word.
    ///
    /// With its reservation taken back whenever the class migrated (as before,
    /// `LLM_BULKHEAD_MIGRATED_RESERVATION_TAKEN_BACK=1`), `x` decides again under the budget
    /// of 5 and is refused, and no serial order refuses `y`. Classified under the new
    /// version (within the ceiling of 50, and what it needs no more than it reserved), `x`
    /// steps on the migrated word; reserved whole, it stands under the first revision.
    #[test]
    fn a_borrower_whose_class_migrated_refuses_no_one() {
        let ceiling = ClassLimits {
            max_tokens: Some(50),
            ..ClassLimits::default()
        };
        assert_eq!(
            migrated_race(ceiling),
            (0, 0),
            "the shared word back to the floors"
        );
    }

    /// The same race, with the install also raising `a`'s floor to one slot: classified
    /// under the new version, `x`'s slot is inside the floor, and the slot it reserved goes
    /// back to the shared word after its step. Reserved whole, `x` still stands under the
    /// first revision (decided again instead, as with `LLM_BULKHEAD_RESERVED_DECIDED_AGAIN=1`,
    /// or taken back, as with `LLM_BULKHEAD_MIGRATED_RESERVATION_TAKEN_BACK=1`, it is refused
    /// under the budget of 5, and no serial order refuses `y`).
    #[test]
    fn a_borrower_whose_class_migrated_into_a_raised_floor_refuses_no_one() {
        assert_eq!(
            migrated_race(one_slot_floor()),
            (1, 0),
            "the shared word back to a's raised floor: the slot went back once"
        );
    }

    /// `b`'s limits with the next revision and the token budget lowered to `budget`.
    fn budget_lowered(b: &Bulkhead, budget: u64) -> llm_bulkhead::LimitsSnapshot {
        let lower = BudgetLimits {
            budget,
            ..b.limits().token_budget.unwrap()
        };
        b.limits()
            .with_revision(b.limits().revision + 1)
            .with_token_budget(Some(lower))
    }

    /// The race of both migrated-borrower regressions: class `a`, without floors, alone on
    /// one slot and 100 tokens; `x` (10 tokens) stops after its reservation; `y` (95 tokens)
    /// meets it; an install gives `a` the limits `migrated` and lowers the budget to 5; `x`
    /// must stand under the first revision. Returns the stored `(U, V)` once both are gone.
    fn migrated_race(migrated: ClassLimits) -> (u64, u64) {
        let b = only_a(1, Some(100), ClassLimits::default());
        let first = b.limits().revision;
        let tokens = |r| Demand::tokens(Reservation::new(0, r).unwrap());
        let next = budget_lowered(&b, 5).with_class(b.class_id("a").unwrap(), migrated);
        let x_decided =
            overtaken_borrower_race(&b, PausePoint::BorrowReserved, tokens(10), tokens(95), next);
        assert_eq!(
            x_decided,
            Ok(first),
            "x's reservation refused y and was then taken back: y's refusal is spurious"
        );
        assert_eq!(b.stats().in_flight, 0, "everything released");
        llm_bulkhead::testing::stored_shared(&b).unwrap()
    }

    /// The exact check of a kept step is a check (`super::stored_v_past_the_budget`, `q` holding 60
    /// tokens: `T = 60`, the stored `V` 110): `x` (`p`, a slot and 30 tokens, inside `p`'s
    /// floors: `T + 30 = 90`, it fits) takes its collect-checked step and stops before its
    /// collect; an install lowers the budget to 80; `x` resumes, finds the tag moved and is
    /// kept, but the collect shows `T = 90 > 80`: taken back, and refused. Admitted, the
    /// bulkhead would hold 90 tokens under a budget of 80.
    #[test]
    fn a_kept_step_the_collect_refuses_is_taken_back() {
        let (b, held) = super::stored_v_past_the_budget(60);
        let p = b.class_id("p").unwrap();
        let tokens = |r| Demand::tokens(Reservation::new(0, r).unwrap());
        assert_eq!(
            llm_bulkhead::testing::stored_shared(&b),
            Some((2, 110)),
            "stored V past the budget"
        );
        let (x, ev_rx, go_tx) = {
            let bx = b.clone();
            super::stopped_thread(
                |point| (point == PausePoint::SlowStepTaken).then_some(Event::StepTaken),
                move || bx.try_acquire(tokens(30).in_class(p)),
                |out| {
                    Event::Decided(match out {
                        Ok(adm) => Ok(adm.revision()),
                        Err(rej) => Err(format!("{rej:?}")),
                    })
                },
            )
        };
        assert!(matches!(ev_rx.recv().unwrap(), Event::StepTaken));
        let budget = BudgetLimits {
            budget: 80,
            high_priority_reserve: 0,
        };
        b.apply_limits(b.limits().with_revision(2).with_token_budget(Some(budget)))
            .unwrap();
        go_tx.send(()).unwrap();
        let x_decided = loop {
            match ev_rx.recv().unwrap() {
                Event::StepTaken => go_tx.send(()).unwrap(),
                Event::Retrying => unreachable!("not picked"),
                Event::Decided(d) => break d,
            }
        };
        let x = x.join().unwrap();
        assert!(
            x_decided.is_err(),
            "x admitted with 90 tokens in flight under a budget of 80: {x_decided:?}"
        );
        drop((x, held));
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }
}

/// The collect-checked path's step (`src/protocol/classed.rs`, "Rare paths"), made
/// deterministic with the pause hooks (feature `testing`).
mod slow_path {
    use llm_bulkhead::testing::PausePoint;
    use llm_bulkhead::{Demand, Reservation};

    /// What the demand on the collect-checked path reports.
    enum Event {
        /// Its step is in its class word, before the collect that checks it.
        Stepped,
        /// Its decision (admitted or not).
        Decided(bool),
    }

    /// Two slots, 100 tokens. Class `q` (no floors) holds one slot and all 100 tokens; then
    /// an install gives class `p` floors of one slot and 50 tokens, so the stored `V` (150)
    /// exceeds the budget and a demand inside `p`'s floors takes the collect-checked path.
    ///
    /// `x` (`p`, a slot and 50 tokens) cannot fit: `T` would be 150. `y` (`p`, a slot, no
    /// tokens) fits: `G + 1 = 2`, `T = 100`. If `x` steps before its collect refuses it, `y`
    /// meanwhile finds `p`'s floor in use, would borrow a slot that `p`'s floor keeps, and is
    /// refused: no serial order refuses `y` (`x` never holds anything). With the collect
    /// before the step, `x` never steps and `y` is admitted.
    #[test]
    fn a_step_its_own_collect_refuses_is_not_taken() {
        let (b, held) = super::stored_v_past_the_budget(100);
        let p = b.class_id("p").unwrap();
        let tokens = |r| Demand::tokens(Reservation::new(0, r).unwrap());
        let bx = b.clone();
        let (x, ev_rx, go_tx) = super::stopped_thread(
            |point| (point == PausePoint::SlowStepTaken).then_some(Event::Stepped),
            move || bx.try_acquire(tokens(50).in_class(p)),
            |out| Event::Decided(out.is_ok()),
        );
        let mut y = None;
        let x_admitted = loop {
            match ev_rx.recv().unwrap() {
                Event::Stepped => {
                    // x's step is in p's class word: y decides now.
                    y.get_or_insert_with(|| b.try_acquire(Demand::slot().in_class(p)));
                    go_tx.send(()).unwrap();
                }
                Event::Decided(admitted) => break admitted,
            }
        };
        drop(x.join().unwrap());
        assert!(!x_admitted, "x does not fit: T would pass the budget");
        let y = y.unwrap_or_else(|| b.try_acquire(Demand::slot().in_class(p)));
        assert!(y.is_ok(), "no serial order refuses y: {y:?}");
        drop((y, held));
        assert_eq!(b.stats().in_flight, 0, "everything released");
    }
}
