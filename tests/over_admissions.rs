//! Over-admissions on real threads, checked against the contract's limits after the run
//! (README, "Never over-admits"): four threads acquire (one acquire in sixteen through the
//! queue, tokens waited for), release and report usage growth on one bulkhead with three
//! classes (floors and ceilings of slots and tokens) while installs alternate two limits
//! snapshots, and a pause hook yields at random pause points, so that steps in progress
//! stand for a while (feature `testing`).
//!
//! # What is checked
//!
//! One atomic clock stamps every call: a ticket just before and one just after each acquire,
//! release, usage report and install, so each call lies strictly between its two tickets. At
//! the ticket after an acquire returned, the admissions that hold **for certain** are those
//! whose acquire had returned and whose release had not begun, each with its tokens as of its
//! last usage report that had returned (a report still in progress counts the smaller of its
//! two holds).
//!
//! Among them, let `L` be the one whose admission took effect last. Each took effect inside
//! its own call, so `L` took effect after the latest start `s` of their acquires. There the
//! contract's rows held with all the others in: slots in use ≤ `max_concurrent`, tokens held
//! ≤ `L`'s effective budget (the budget for high priority, less the reserve for normal; one
//! demand in eight has high priority, and while none is held `L` had normal priority), and
//! the class ceilings for `L`'s class. Since then slots only went down, and tokens went up only by
//! usage reports, each of which returned after `s`. So, at every acquire's return:
//!
//! * slots held for certain ≤ `max_concurrent`;
//! * tokens held for certain ≤ the effective budget + the growth reported by calls that began
//!   before the check and returned after `s`;
//! * per class, the same with the class's own holds, latest start and ceilings,
//!
//! under the limits of the snapshot in force over `[s, now]`, or the looser of both when an
//! install began or returned in between. And every admission carries a revision in force at
//! some point of its call: none older than an install that returned before it began (the
//! contract of `apply_limits`), none newer than the last install begun by its end.
//!
//! **The floors** (no class borrows what another class's floor protects, rows 4 and 5): when
//! no install began or returned since the **earliest** start `s0` of the acquires of the
//! admissions held for certain, every one of them took effect under one snapshot, and then
//! `Σ_k max(n_k, pc_k) ≤ max_concurrent` and `Σ_k max(t_k, pt_k) ≤` the effective budget +
//! the growth reported since `s0`, over their classes' counts. Why: take the last of them to
//! borrow (a slot, or tokens, for each sum). Row 4 (row 5) held at its admission with all
//! those before it in, and every one after it took a slot (tokens) inside its class's floor,
//! which leaves its class's `max(n_k, pc_k)` (`max(t_k, pt_k)`) as it was; none borrowing,
//! each sum is the floors' own, within the limits. Once an install took effect in between,
//! the sums may pass the limits legitimately (a raised floor, a lowered `max_concurrent`),
//! and this check is skipped: in the measurements it applies at about half of the
//! admissions' returns.
//!
//! Sound: a linearizable bulkhead never fails it. And it sees what the per-call checks of
//! `tests/spurious_refusals.rs` cannot: two racing admissions that each fit without the other
//! and together pass a limit. It finds the over-admission of a borrower with tokens inside
//! its class's token floor (`tests/borrow_overtaken.rs`) with its broken variant on ("Result").
//!
//! # Result
//!
//! The bounded test runs 2 rounds of 4 threads × 40,000 operations (about 2 s in debug) and
//! asserts no violation. The measurements, 16 rounds of 250,000 operations each (about 15 s
//! in release: `cargo test --release --features testing --test over_admissions -- --ignored
//! --nocapture`), one with both priorities and one with normal priority only, on the 2-core
//! machine of this stop (2026-12-07):
//!
//! ```text
//! build                                    priorities   admissions a run   violations a run
//! main                                     both               3.4 M          0  0  0
//! main                                     normal             3.3 M          0
//! LLM_BULKHEAD_BORROW_FLOOR_UNVALIDATED=1  normal             3.4 M         11  9
//! LLM_BULKHEAD_EXACT_IGNORES_STORED=1      normal             3.4 M          9 13 12 10
//! LLM_BULKHEAD_BORROW_UNVALIDATED=1        normal             3.4 M         16 13
//! LLM_BULKHEAD_EXACT_IGNORES_STORED=1      both               3.4 M          5  0  9
//! ```
//!
//! Each broken variant over-admits (`tests/borrow_overtaken.rs`), and random schedules find
//! these three at a rate that `.ci/run` relies on: it runs both measurements on main (no
//! violation) and requires each variant to fail the one with normal priority only (at most
//! two tries each; with both priorities one variant's run found none). Before the queue and
//! the priorities were added, `LLM_BULKHEAD_KEEP_EXACT_UNCHECKED=1` (the kept step's exact
//! check skipped) was found once in 3.8 M admissions, and the rates were 6 to 31 a run; yields
//! at one pause point in four about double them. The checker also finds what it must: with
//! the bulkhead's reserve at 0 and its own at 300-400 tokens, 33,941 violations in a run; with
//! the bulkhead's floors of class `premium` a slot and 200 tokens below the checker's, 20,455,
//! all of them the floors' rule (normal priority).
//!
//! With the floors' rule added (later on 2026-12-07), main's measurements found none again
//! (3.2 M and 3.4 M admissions; the rule applied at 1.6 M of the 3.4 M), and the four broken
//! variants' violations in a run of the normal-priority measurement were all of the global
//! limits: `KEEP_EXACT_UNCHECKED` 6 and 2, `BORROW_FLOOR_UNVALIDATED` 12 and 11,
//! `EXACT_IGNORES_STORED` 13 and 15, `BORROW_UNVALIDATED` 9 and 14. `measured` prints them
//! by kind.

#![cfg(feature = "testing")]

use llm_bulkhead::testing::{clear_pause_hook, set_pause_hook};
use llm_bulkhead::{
    Bulkhead, ClassLimits, Demand, LimitsSnapshot, Priority, Reservation, Usage, WaitOptions,
};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

const THREADS: usize = 4;
const CLASSES: usize = 3;
const NAMES: [&str; CLASSES] = ["premium", "standard", "batch"];
/// Admissions one thread holds at most.
const HOLD: usize = 3;
/// Reservations and growth are multiples of this.
const UNIT: u64 = 100;
/// A reservation is up to this many units.
const MAX_UNITS: u64 = 8;
/// One demand in this many has high priority (in the runs with both priorities).
const HIGH_ONE_IN: u64 = 8;
/// Waiters the queue takes.
const QUEUE: u32 = 8;
/// One acquire in this many waits in the queue, for at most [`WAIT_MICROS`].
const WAIT_ONE_IN: u64 = 16;
/// How long a waiting acquire waits at most (a bound on the run, not a measured time).
const WAIT_MICROS: u64 = 100;
/// A decider yields at one pause point in this many.
const YIELD_ONE_IN: u64 = 4;

fn class(pc: u32, mc: Option<u32>, pt: u64, mt: Option<u64>) -> ClassLimits {
    ClassLimits {
        protected_concurrent: pc,
        max_concurrent: mc,
        protected_tokens: pt,
        max_tokens: mt,
    }
}

/// The high-priority reserve of configuration `which`: tokens normal demands leave alone.
fn reserve(which: usize) -> u64 {
    [400, 300][which]
}

/// The two alternating configurations: global slots, budget, class limits. The token floors
/// are a few demands wide, so that many demands straddle one, and the budget binds.
fn config(which: usize) -> (u32, u64, [ClassLimits; CLASSES]) {
    if which == 0 {
        (
            6,
            3_200,
            [
                class(2, Some(4), 1_000, Some(2_400)),
                class(1, None, 600, None),
                class(1, Some(3), 300, Some(1_600)),
            ],
        )
    } else {
        (
            7,
            2_800,
            [
                class(2, Some(3), 800, Some(2_000)),
                class(1, None, 800, None),
                class(1, Some(4), 400, Some(2_000)),
            ],
        )
    }
}

fn template(which: usize) -> Bulkhead {
    let (slots, budget, classes) = config(which);
    let b = Bulkhead::builder()
        .max_concurrent(slots)
        .max_queue(QUEUE)
        .wait_for_tokens(true)
        .token_budget(budget)
        .high_priority_reserve(reserve(which));
    classes
        .iter()
        .zip(NAMES)
        .fold(b, |b, (l, n)| b.class(n, *l))
        .default_class("standard")
        .build()
        .unwrap()
}

/// The bulkhead under test (configuration 0) and both configurations as its own snapshots.
fn setup() -> (Bulkhead, [LimitsSnapshot; 2]) {
    let b = template(0);
    let first = b.limits();
    b.apply_limits(template(1).limits().with_revision(1))
        .unwrap();
    let second = b.limits();
    b.apply_limits(first.with_revision(2)).unwrap();
    (b, [first, second])
}

/// The clock every call is stamped on, and the installs.
#[derive(Default)]
struct Clock {
    /// One atomic's modification order: ticket order is consistent with real time.
    ticks: AtomicU64,
    /// Serialises installs, so that revisions increase; counts them.
    installer: Mutex<u64>,
}

impl Clock {
    fn tick(&self) -> u64 {
        self.ticks.fetch_add(1, SeqCst)
    }
}

/// One admission, as the checker knows it.
struct Hold {
    class: usize,
    /// Tickets before and after the acquire call.
    start: u64,
    end: u64,
    /// Ticket before the release call.
    release: u64,
    /// The tokens it holds for certain from each ticket on (the first at `end`).
    tokens: Vec<(u64, u64)>,
    /// The limits revision it was admitted under.
    revision: u64,
    /// Of high priority (the whole budget); normal ones leave the reserve alone.
    high: bool,
}

/// One thread's record.
#[derive(Default)]
struct Log {
    holds: Vec<Hold>,
    /// Usage reports that grew a hold: class, tickets before and after, growth.
    growth: Vec<(usize, u64, u64, u64)>,
    /// Installs: number, ticket before, ticket after.
    installs: Vec<(u64, u64, u64)>,
    admitted: u64,
    refused: u64,
}

/// A held admission on its thread: the admission, its record's index, the reservation's
/// input and the output last reported.
struct Held {
    admission: llm_bulkhead::Admission,
    record: usize,
    input: u64,
    output: u64,
}

/// The pause hook: yields at one pause point in `one_in`, so that a step in progress stands
/// while other threads decide.
fn yield_sometimes(seed: u64, one_in: u64) {
    let rng = Cell::new(seed | 1);
    set_pause_hook(move |_| {
        let mut r = Rng(rng.get());
        if r.below(one_in) == 0 {
            std::thread::yield_now();
        }
        rng.set(r.0);
    });
}

/// One thread's operations: `ops` of them, a demand of high priority one in `high_one_in`
/// (none for 0).
fn worker(
    b: &Bulkhead,
    snaps: &[LimitsSnapshot; 2],
    clock: &Clock,
    (ops, high_one_in): (usize, u64),
    seed: u64,
) -> Log {
    let mut rng = Rng(seed);
    yield_sometimes(seed.rotate_left(17), YIELD_ONE_IN);
    let ids = NAMES.map(|n| b.class_id(n).unwrap());
    let mut held: Vec<Held> = Vec::new();
    let mut log = Log::default();
    for _ in 0..ops {
        let roll = rng.below(1_000);
        if roll < 20 {
            let mut n = clock.installer.lock().unwrap();
            *n += 1;
            let next = snaps[(*n % 2) as usize].with_revision(2 + *n);
            let start = clock.tick();
            b.apply_limits(next).unwrap();
            log.installs.push((*n, start, clock.tick()));
            continue;
        }
        if !held.is_empty() && (held.len() >= HOLD || rng.below(2) == 0) {
            let i = rng.below(held.len() as u64) as usize;
            if rng.below(3) == 0 {
                // Usage past the reservation: growth, with no admission check.
                let h = &mut held[i];
                let k = log.holds[h.record].class;
                let before = log.holds[h.record].tokens.last().unwrap().1;
                h.output += (1 + rng.below(3)) * UNIT;
                let start = clock.tick();
                let report = h
                    .admission
                    .report_usage(Usage::new(h.input, h.output))
                    .unwrap();
                let end = clock.tick();
                assert!(
                    report.held >= before,
                    "a report of more usage shrank the hold"
                );
                log.holds[h.record].tokens.push((end, report.held));
                log.growth.push((k, start, end, report.held - before));
                continue;
            }
            let h = held.swap_remove(i);
            let start = clock.tick();
            drop(h.admission);
            clock.tick();
            log.holds[h.record].release = start;
            continue;
        }
        let k = rng.below(CLASSES as u64) as usize;
        let r = (1 + rng.below(MAX_UNITS)) * UNIT;
        let input = r / 2;
        let high = high_one_in > 0 && rng.below(high_one_in) == 0;
        let priority = if high {
            Priority::High
        } else {
            Priority::Normal
        };
        let d = Demand::tokens(Reservation::new(input, r - input).unwrap())
            .in_class(ids[k])
            .with_priority(priority);
        let start = clock.tick();
        let outcome = if rng.below(WAIT_ONE_IN) == 0 {
            // Through the queue: a release may hand it its admission.
            let wait = WaitOptions::new().timeout(std::time::Duration::from_micros(WAIT_MICROS));
            b.acquire_blocking(d, wait)
        } else {
            b.try_acquire(d)
        };
        let end = clock.tick();
        match outcome {
            Ok(admission) => {
                log.admitted += 1;
                log.holds.push(Hold {
                    class: k,
                    start,
                    end,
                    release: u64::MAX,
                    tokens: vec![(end, r)],
                    revision: admission.revision(),
                    high,
                });
                held.push(Held {
                    admission,
                    record: log.holds.len() - 1,
                    input,
                    output: r - input,
                });
            }
            Err(_) => log.refused += 1,
        }
    }
    for h in held {
        let start = clock.tick();
        drop(h.admission);
        clock.tick();
        log.holds[h.record].release = start;
    }
    clear_pause_hook();
    log
}

/// Which configurations may have been in force at some point of `[from, to]`.
struct InForce {
    /// The last install begun, and the last returned, by each ticket.
    begun: Vec<u64>,
    returned: Vec<u64>,
}

impl InForce {
    fn configs(&self, from: u64, to: u64) -> &'static [usize] {
        let (from, to) = (from as usize, to as usize);
        if self.begun[to] > self.returned[from] {
            &[0, 1]
        } else if self.returned[from] % 2 == 0 {
            &[0]
        } else {
            &[1]
        }
    }
}

/// Limits the check applies: global slots and budget, and per class the ceilings of slots
/// and tokens (`None`: no ceiling).
type Limits = (u64, u64, [(Option<u64>, Option<u64>); CLASSES]);

/// The loosest of `configs`' limits (a class ceiling is `None` when one of them has none),
/// with the budget of high priority (`high`) or of normal priority (the reserve left out).
fn loosest(configs: &[usize], high: bool) -> Limits {
    let mut out = (0, 0, [(Some(0), Some(0)); CLASSES]);
    for &c in configs {
        let (slots, budget, classes) = config(c);
        let eff = if high { budget } else { budget - reserve(c) };
        out.0 = out.0.max(u64::from(slots));
        out.1 = out.1.max(eff);
        for (o, l) in out.2.iter_mut().zip(classes) {
            o.0 = o.0.zip(l.max_concurrent).map(|(a, b)| a.max(u64::from(b)));
            o.1 = o.1.zip(l.max_tokens).map(|(a, b)| a.max(b));
        }
    }
    out
}

/// A multiset of tickets.
#[derive(Default)]
struct Starts(BTreeMap<u64, u32>);

impl Starts {
    fn insert(&mut self, t: u64) {
        *self.0.entry(t).or_default() += 1;
    }
    fn remove(&mut self, t: u64) {
        let n = self.0.get_mut(&t).unwrap();
        *n -= 1;
        if *n == 0 {
            self.0.remove(&t);
        }
    }
    fn latest(&self) -> Option<u64> {
        self.0.keys().next_back().copied()
    }
    fn earliest(&self) -> Option<u64> {
        self.0.keys().next().copied()
    }
}

/// Cumulative growth by ticket: reported by calls begun by it, and by calls returned by it.
struct Growth {
    by_start: Vec<u64>,
    by_end: Vec<u64>,
}

impl Growth {
    fn new(ticks: usize, reports: impl Iterator<Item = (u64, u64, u64)>) -> Growth {
        let (mut by_start, mut by_end) = (vec![0u64; ticks], vec![0u64; ticks]);
        for (start, end, g) in reports {
            by_start[start as usize] += g;
            by_end[end as usize] += g;
        }
        for t in 1..ticks {
            by_start[t] += by_start[t - 1];
            by_end[t] += by_end[t - 1];
        }
        Growth { by_start, by_end }
    }

    /// Growth reported by calls that began by `now` and returned after `after`.
    fn since(&self, after: u64, now: u64) -> u64 {
        self.by_start[now as usize] - self.by_end[after as usize]
    }
}

/// The floors' sums of the holds `held` (per class: slots, tokens) under configuration `c`:
/// `Σ max(n_k, pc_k)` and `Σ max(t_k, pt_k)`, what no class's borrowing may take past the
/// global slots and the effective budget (CONTRACT.md §2 rows 4 and 5).
fn floored(held: &[(u64, u64); CLASSES], c: usize) -> (u64, u64) {
    let (_, _, classes) = config(c);
    held.iter().zip(classes).fold((0, 0), |(n, t), (h, l)| {
        (
            n + h.0.max(u64::from(l.protected_concurrent)),
            t + h.1.max(l.protected_tokens),
        )
    })
}

/// One violation, described.
type Violation = String;

/// Checks one round's logs (module docs, "What is checked"); returns the violations.
fn check(logs: &[Log], ticks: usize) -> Vec<Violation> {
    let mut force = InForce {
        begun: vec![0; ticks],
        returned: vec![0; ticks],
    };
    for log in logs {
        for &(n, from, to) in &log.installs {
            force.begun[from as usize] = n;
            force.returned[to as usize] = n;
        }
    }
    for t in 1..ticks {
        force.begun[t] = force.begun[t].max(force.begun[t - 1]);
        force.returned[t] = force.returned[t].max(force.returned[t - 1]);
    }
    let all = Growth::new(
        ticks,
        logs.iter()
            .flat_map(|l| l.growth.iter().map(|&(_, s, e, g)| (s, e, g))),
    );
    let per_class: Vec<Growth> = (0..CLASSES)
        .map(|k| {
            Growth::new(
                ticks,
                logs.iter().flat_map(|l| {
                    l.growth
                        .iter()
                        .filter(move |g| g.0 == k)
                        .map(|&(_, s, e, g)| (s, e, g))
                }),
            )
        })
        .collect();
    // Events by ticket: a hold enters at its acquire's return and leaves at its release's
    // start; its tokens change at its reports' returns. Tickets are unique, so each ticket
    // has at most one event.
    enum Event<'a> {
        Enter(&'a Hold),
        Tokens(usize, u64),
        Leave(&'a Hold),
    }
    let mut events: Vec<(u64, Event)> = Vec::new();
    let mut violations = Vec::new();
    for log in logs {
        for h in &log.holds {
            // Its revision was in force at some point of its call: install `n` applies
            // revision `2 + n`, so no older than the last install returned before the call,
            // no newer than the last one begun by its end.
            let (oldest, newest) = (
                2 + force.returned[h.start as usize],
                2 + force.begun[h.end as usize],
            );
            if !(oldest..=newest).contains(&h.revision) {
                violations.push(format!(
                    "revision: admitted under revision {} between tickets {} and {}, when {oldest} to \
                     {newest} were in force",
                    h.revision, h.start, h.end
                ));
            }
            events.push((h.end, Event::Enter(h)));
            let mut before = h.tokens[0].1;
            for &(t, tokens) in &h.tokens[1..] {
                events.push((t, Event::Tokens(h.class, tokens - before)));
                before = tokens;
            }
            events.push((h.release, Event::Leave(h)));
        }
    }
    events.sort_by_key(|e| e.0);
    let mut starts = Starts::default();
    // Holds of high priority among those held: while there is none, the last admission to
    // take effect was of normal priority, bounded by the budget less the reserve.
    let mut high_held = 0u64;
    let mut class_starts: [Starts; CLASSES] = Default::default();
    let (mut slots, mut tokens) = (0u64, 0u64);
    let mut class_held = [(0u64, 0u64); CLASSES];
    for (t, e) in events {
        match e {
            Event::Tokens(k, grew) => {
                tokens += grew;
                class_held[k].1 += grew;
            }
            Event::Leave(h) => {
                let held = h.tokens.iter().rfind(|x| x.0 < t).unwrap().1;
                slots -= 1;
                tokens -= held;
                class_held[h.class].0 -= 1;
                class_held[h.class].1 -= held;
                starts.remove(h.start);
                class_starts[h.class].remove(h.start);
                high_held -= u64::from(h.high);
            }
            Event::Enter(h) => {
                let r = h.tokens[0].1;
                slots += 1;
                tokens += r;
                class_held[h.class].0 += 1;
                class_held[h.class].1 += r;
                starts.insert(h.start);
                class_starts[h.class].insert(h.start);
                high_held += u64::from(h.high);
                let s = starts.latest().unwrap();
                let (mc, budget, _) = loosest(force.configs(s, t), high_held > 0);
                let room = budget + all.since(s, t);
                if slots > mc || tokens > room {
                    violations.push(format!(
                        "global limits: at ticket {t}: {slots} slots and {tokens} tokens held for certain, \
                         limits {mc} slots and {room} tokens (budget {budget} and growth) since \
                         ticket {s}"
                    ));
                }
                // The floors: under one configuration over the earliest start's window.
                let s0 = starts.earliest().unwrap();
                if let &[c] = force.configs(s0, t) {
                    let (slots_floored, tokens_floored) = floored(&class_held, c);
                    let (mc, budget, _) = loosest(&[c], high_held > 0);
                    let room = budget + all.since(s0, t);
                    if slots_floored > mc || tokens_floored > room {
                        violations.push(format!(
                            "floors: at ticket {t}: Σ max(n, pc) = {slots_floored} slots and \
                             Σ max(t, pt) = {tokens_floored} tokens held for certain, limits \
                             {mc} slots and {room} tokens (budget {budget} and growth) under \
                             configuration {c} since ticket {s0}"
                        ));
                    }
                }
                let k = h.class;
                let s = class_starts[k].latest().unwrap();
                let (_, _, ceilings) = loosest(force.configs(s, t), true);
                let (n, held) = class_held[k];
                let (mc, mt) = ceilings[k];
                let room = mt.map(|mt| mt + per_class[k].since(s, t));
                if mc.is_some_and(|mc| n > mc) || room.is_some_and(|room| held > room) {
                    violations.push(format!(
                        "class ceilings: at ticket {t}: class {} holds {n} slots and {held} tokens for certain, \
                         ceilings {mc:?} and {room:?} (with growth) since ticket {s}",
                        NAMES[k]
                    ));
                }
            }
        }
    }
    violations
}

/// One round: admissions, refusals, violations.
fn round(ops: (usize, u64), seed: u64) -> (u64, u64, Vec<Violation>) {
    let (b, snaps) = setup();
    let clock = Clock::default();
    let start = Barrier::new(THREADS);
    let logs: Vec<Log> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (b, snaps, clock, start) = (&b, &snaps, &clock, &start);
                let seed = seed ^ 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t as u64 + 1);
                s.spawn(move || {
                    start.wait();
                    worker(b, snaps, clock, ops, seed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = b.stats();
    assert_eq!(stats.in_flight, 0, "everything released");
    assert_eq!(stats.token_budget.unwrap().in_flight_tokens, 0);
    let ticks = clock.ticks.load(SeqCst) as usize + 1;
    let admitted = logs.iter().map(|l| l.admitted).sum();
    let refused = logs.iter().map(|l| l.refused).sum();
    (admitted, refused, check(&logs, ticks))
}

/// `rounds` rounds of `ops` operations per thread, a demand of high priority one in
/// `high_one_in` (none for 0).
fn run(rounds: u64, ops: usize, high_one_in: u64, seed: u64) -> (u64, u64, Vec<Violation>) {
    let (mut admitted, mut refused, mut violations) = (0, 0, Vec::new());
    for i in 0..rounds {
        let (a, r, v) = round((ops, high_one_in), seed.wrapping_add(i));
        admitted += a;
        refused += r;
        violations.extend(v);
    }
    (admitted, refused, violations)
}

/// The bounded run: no admission passes a limit.
#[test]
fn no_over_admission_under_reconfiguration_and_growth() {
    let (admitted, refused, violations) = run(2, 40_000, HIGH_ONE_IN, 0x0ad_0026);
    assert!(
        admitted > 1_000 && refused > 1_000,
        "{admitted} admitted, {refused} refused"
    );
    assert!(
        violations.is_empty(),
        "{} violations, the first: {}",
        violations.len(),
        violations[0]
    );
}

/// The measurement: more rounds, printed; both priorities.
#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn over_admissions_measured() {
    measured(HIGH_ONE_IN);
}

/// The measurement with normal priority only, where the broken variants' over-admissions
/// are met most often (`.ci/run` requires three of them to fail it).
#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn over_admissions_measured_normal_priority() {
    measured(0);
}

fn measured(high_one_in: u64) {
    let (admitted, refused, violations) = run(16, 250_000, high_one_in, 0x0ad_1026);
    println!(
        "{admitted} admitted, {refused} refused, {} violations",
        violations.len()
    );
    let mut kinds = BTreeMap::<&str, u64>::new();
    for v in &violations {
        *kinds.entry(v.split(':').next().unwrap()).or_default() += 1;
    }
    println!("by kind: {kinds:?}");
    for v in violations.iter().take(10) {
        println!("  {v}");
    }
    assert!(violations.is_empty());
}
