//! The main demo: a simulated multi-tenant LLM gateway, running on this machine.
//!
//! One bulkhead (16 slots, a 48,000-token in-flight budget) guards a fake provider whose latency
//! and token usage are drawn per request from a small seeded generator, and which gets four
//! times slower for a while in the middle of the run. Three admission classes share it:
//!
//! * `interactive` (6 workers, chat with streaming): a floor of 4 slots and 4,400 tokens, which
//!   the control plane raises to 6 slots and 6,600 tokens mid-run with `apply_limits`;
//! * `standard` (3 workers, the default class): a floor of 2 slots and 3,000 tokens;
//! * `batch`, the noisy tenant (10 workers for at most 10 slots, long documents): no floor, so
//!   it only ever borrows the shared remainder. Its binding constraint is tokens (ten long
//!   documents want more than its 36,000-token ceiling), and it waits for them: the bulkhead
//!   has a queue and `wait_for_tokens(true)`, and batch calls `acquire_blocking` with a 50 ms
//!   timeout, so a batch demand short of tokens waits in the FIFO until releases and refunds
//!   feed it. Slot refusals stay fail-fast by contract (the protection of the other floors,
//!   row 4; with ten workers the class ceiling, row 3, never refuses), and batch retries those
//!   and its queue timeouts after 2 ms. The interactive and standard tenants are not held
//!   back by a batch waiter while they stay inside their floors: such newcomers bypass the
//!   queue (CONTRACT.md §2 as `src/contract.rs` states it).
//!
//! Requests are `LlmRequest`s built in code and estimated with `ModelAwareEstimator`; holds are
//! corrected midway for streamed calls (`report_usage` with `Reconcile`) and settled with the
//! real usage at release. A sampler thread reads the per-class statistics every few
//! milliseconds. The demo prints, per class, the decisions, the refusals by reason and
//! constraint, latency percentiles and how the interactive floor held while batch saturated,
//! then asserts its invariants (exit status 1 if one failed).
//!
//! Run: `cargo run --release --example demo` (about 6 s); add `-- --short` (or set
//! `DEMO_SHORT=1`) for a 1.5 s run, and `-- --plot FILE.svg` to draw slots and tokens in flight
//! per class over time.

use llm_bulkhead::llm::{LlmRequest, ModelAwareEstimator, TokenEstimator};
use llm_bulkhead::{
    Admission, Bulkhead, ClassId, ClassLimits, Demand, QueueTimeout, Reconcile, Rejection,
    Reservation, Stats, Usage, WaitOptions,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[path = "pools_gateway/slow_provider.rs"]
mod slow_provider;

// ---------------------------------------------------------------------------------------------
// The gateway's configuration
// ---------------------------------------------------------------------------------------------

const MAX_CONCURRENT: u32 = 16;
const TOKEN_BUDGET: u64 = 48_000;
/// Queue places: one per batch worker (the only tenant that waits).
const QUEUE: u32 = 10;

/// The run, as fractions of its duration: the provider is slow in `[SLOW_FROM, SLOW_UNTIL)`;
/// the control plane raises the interactive floor at `RAISE_AT` (revision 1) and restores it
/// at `RESTORE_AT` (revision 2).
const SLOW_FROM: f64 = 0.30;
const RAISE_AT: f64 = 0.45;
const SLOW_UNTIL: f64 = 0.65;
const RESTORE_AT: f64 = 0.80;
/// Provider latency multiplier during the slow phase.
const SLOW_FACTOR: u64 = 4;

const INTERACTIVE: usize = 0;
const STANDARD: usize = 1;
const BATCH: usize = 2;
const CLASSES: usize = 3;

/// How a class's workers ask for admission.
#[derive(Clone, Copy)]
enum Mode {
    /// `try_acquire`: a refusal goes straight back to the client (a 429).
    FailFast,
    /// `acquire_blocking` with this timeout: the demand waits in the queue for tokens
    /// (`wait_for_tokens`) or for a free slot; a refusal of any reason (a slot refusal for
    /// protection, `timeout`, `queue_limit`) is retried after the class's backoff.
    Wait(Duration),
}

/// One tenant class: its limits, its workers and the traffic they send.
struct ClassSpec {
    name: &'static str,
    limits: ClassLimits,
    /// The limits the control plane installs at `RAISE_AT`, if they differ (revision 1;
    /// revision 2 restores `limits`).
    raised: Option<ClassLimits>,
    workers: usize,
    mode: Mode,
    model: &'static str,
    /// Characters per prompt message, and messages per request.
    prompt_chars: (u64, u64),
    messages: usize,
    max_tokens: &'static [u64],
    /// The output the provider generates, in percent of `max_tokens`.
    output_percent: (u64, u64),
    /// Provider latency: time to first token, then per output token (µs, before the slow
    /// phase's factor).
    first_token_us: (u64, u64),
    per_token_us: u64,
    /// Percent of calls that stream (and report usage midway).
    stream_percent: u64,
    /// Pause after an admitted call, and after a refusal (µs).
    think_us: (u64, u64),
    retry_us: (u64, u64),
}

const SPECS: [ClassSpec; CLASSES] = [
    ClassSpec {
        name: "interactive",
        limits: ClassLimits {
            protected_concurrent: 4,
            max_concurrent: Some(8),
            protected_tokens: 4_400,
            max_tokens: Some(8_800),
        },
        raised: Some(ClassLimits {
            protected_concurrent: 6,
            max_concurrent: Some(8),
            protected_tokens: 6_600,
            max_tokens: Some(8_800),
        }),
        workers: 6,
        mode: Mode::FailFast,
        model: "claude-sonnet-4-5",
        prompt_chars: (200, 2_000),
        messages: 1,
        max_tokens: &[256, 384, 512],
        output_percent: (30, 100),
        first_token_us: (1_000, 3_000),
        per_token_us: 12,
        stream_percent: 100,
        think_us: (4_000, 12_000),
        retry_us: (4_000, 12_000),
    },
    ClassSpec {
        name: "standard",
        limits: ClassLimits {
            protected_concurrent: 2,
            max_concurrent: Some(4),
            protected_tokens: 3_000,
            max_tokens: Some(6_000),
        },
        raised: None,
        workers: 3,
        mode: Mode::FailFast,
        model: "gemini-2.5-flash",
        prompt_chars: (250, 1_000),
        messages: 2,
        max_tokens: &[512],
        output_percent: (20, 100),
        first_token_us: (2_000, 4_000),
        per_token_us: 12,
        stream_percent: 0,
        think_us: (5_000, 15_000),
        retry_us: (5_000, 15_000),
    },
    ClassSpec {
        name: "batch",
        limits: ClassLimits {
            protected_concurrent: 0,
            max_concurrent: Some(10),
            protected_tokens: 0,
            max_tokens: Some(36_000),
        },
        raised: None,
        workers: 10,
        mode: Mode::Wait(Duration::from_millis(50)),
        model: "gpt-4o-mini",
        prompt_chars: (6_000, 20_000),
        messages: 1,
        max_tokens: &[1_024],
        output_percent: (50, 100),
        first_token_us: (2_000, 6_000),
        per_token_us: 8,
        stream_percent: 50,
        think_us: (0, 0),
        retry_us: (2_000, 2_000),
    },
];

fn build_bulkhead() -> Bulkhead {
    let mut builder = Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .token_budget(TOKEN_BUDGET);
    for spec in &SPECS {
        builder = builder.class(spec.name, spec.limits);
    }
    // A queue, and token waiting: a batch demand short of tokens waits in the one FIFO instead
    // of retrying. The fail-fast tenants (`try_acquire`) never queue; while a batch demand
    // waits, their requests inside their floors bypass the queue, and those that would borrow
    // are refused (no barging). A slot refusal for protection (CONTRACT.md §2 row 4) stays
    // fail-fast, and batch retries it.
    builder
        .max_queue(QUEUE)
        .wait_for_tokens(true)
        .default_class(SPECS[STANDARD].name)
        .build()
        .expect("a valid configuration")
}

/// The floors a decision made under `revision` used.
fn limits_at(k: usize, revision: u64) -> ClassLimits {
    match (revision, SPECS[k].raised) {
        (1, Some(raised)) => raised,
        _ => SPECS[k].limits,
    }
}

// ---------------------------------------------------------------------------------------------
// A small deterministic generator (SplitMix64), one per worker
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

// ---------------------------------------------------------------------------------------------
// Requests, built in code as a gateway would receive them
// ---------------------------------------------------------------------------------------------

const WORDS: &str = "the quarterly report shows latency budget tenant gateway model summarise \
    customer ticket refund invoice contract clause translate résumé naïve über policy incident \
    timeline root cause action";

fn text(rng: &mut Rng, chars: u64) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut s = String::with_capacity(chars as usize + 16);
    while (s.len() as u64) < chars {
        s.push_str(words[rng.below(words.len())]);
        s.push(' ');
    }
    s
}

/// 32 requests per class, reused round-robin-at-random by its workers.
fn request_pool(k: usize) -> Vec<LlmRequest> {
    let spec = &SPECS[k];
    let mut rng = Rng::new(0xd1ce_0000 + k as u64);
    (0..32)
        .map(|_| {
            let messages: Vec<String> = (0..spec.messages)
                .map(|_| {
                    let n = rng.range(spec.prompt_chars);
                    text(&mut rng, n)
                })
                .collect();
            let refs: Vec<&str> = messages.iter().map(String::as_str).collect();
            let mut request = LlmRequest::new(spec.model, &refs);
            request.max_tokens = Some(spec.max_tokens[rng.below(spec.max_tokens.len())]);
            request
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The run's clock and the fake provider
// ---------------------------------------------------------------------------------------------

struct Timeline {
    start: Instant,
    total: Duration,
}

impl Timeline {
    fn at(&self, fraction: f64) -> Duration {
        self.total.mul_f64(fraction)
    }

    fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn is_slow(&self) -> bool {
        let t = self.start.elapsed();
        t >= self.at(SLOW_FROM) && t < self.at(SLOW_UNTIL)
    }

    /// The index in `PHASES`.
    fn phase(&self) -> usize {
        let t = self.start.elapsed();
        PHASE_STARTS[1..]
            .iter()
            .take_while(|&&f| t >= self.at(f))
            .count()
    }
}

const PHASES: [&str; 5] = [
    "normal",
    "provider slow",
    "slow, floor raised",
    "recovered, floor raised",
    "floor restored",
];
const PHASE_STARTS: [f64; 5] = [0.0, SLOW_FROM, RAISE_AT, SLOW_UNTIL, RESTORE_AT];

/// One call as the fake provider will serve it, drawn before the call.
struct Call {
    /// The real prompt size (the estimate is approximate: 90–105 % of it).
    input: u64,
    output: u64,
    latency: Duration,
    stream: bool,
}

fn draw_call(spec: &ClassSpec, rng: &mut Rng, reservation: Reservation, slow: bool) -> Call {
    let input = (reservation.input() * rng.range((90, 105)) / 100).max(1);
    let output = reservation.max_output() * rng.range(spec.output_percent) / 100;
    let mut us = rng.range(spec.first_token_us) + output * spec.per_token_us;
    if slow {
        us *= SLOW_FACTOR;
    }
    Call {
        input,
        output,
        latency: Duration::from_micros(us),
        stream: rng.percent(spec.stream_percent),
    }
}

// ---------------------------------------------------------------------------------------------
// Invariant checks
// ---------------------------------------------------------------------------------------------

/// Failed checks, kept (the first few) and counted; the demo exits 1 if there is any.
#[derive(Default)]
struct Checks {
    failed: AtomicU64,
    passed: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Checks {
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if ok {
            self.passed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first.lock().unwrap();
            if first.len() < 10 {
                first.push(what());
            }
        }
    }
}

/// Independent tallies, kept by the workers beside the bulkhead.
///
/// * **Lower bounds** of what the bulkhead holds (`held_*`): raised right after an admission or
///   a hold's growth, lowered right before a report shrinks a hold or a release. They never
///   exceed the truth, so one above a limit proves an over-admission.
/// * **Upper bounds** of what the interactive class holds (`upper_*`): raised before the class
///   asks, lowered after its refusal, report or release returns. Each packs
///   `[arrivals:32][present:32]` in one word, so a decider learns how many others were present
///   when it arrived plus how many arrived until its decision returned: an upper bound of the
///   class's state over the whole decision. When that bound is inside the floors, the contract
///   promises a protected admission.
#[derive(Default)]
struct Ledger {
    held_slots: [AtomicU64; CLASSES],
    held_tokens: [AtomicU64; CLASSES],
    all_slots: AtomicU64,
    all_tokens: AtomicU64,
    upper_slots: AtomicU64,
    upper_tokens: AtomicU64,
    /// The highest lower bounds seen (so at most the true peaks).
    peak_slots: AtomicU64,
    peak_tokens: AtomicU64,
}

const LOW32: u64 = 0xffff_ffff;

/// What an interactive decider saw when it arrived.
struct Arrival {
    slots: u64,
    tokens: u64,
}

impl Ledger {
    fn admitted(&self, checks: &Checks, k: usize, hold: u64) {
        let limits = SPECS[k].limits; // ceilings never change in this run
        let n = self.held_slots[k].fetch_add(1, Ordering::SeqCst) + 1;
        let t = self.held_tokens[k].fetch_add(hold, Ordering::SeqCst) + hold;
        let all_n = self.all_slots.fetch_add(1, Ordering::SeqCst) + 1;
        let all_t = self.all_tokens.fetch_add(hold, Ordering::SeqCst) + hold;
        self.peak_slots.fetch_max(all_n, Ordering::Relaxed);
        self.peak_tokens.fetch_max(all_t, Ordering::Relaxed);
        let name = SPECS[k].name;
        let ceiling = u64::from(limits.max_concurrent.unwrap_or(MAX_CONCURRENT));
        checks.check(n <= ceiling, || {
            format!("{name}: {n} slots held, ceiling {ceiling}")
        });
        let token_ceiling = limits.max_tokens.unwrap_or(TOKEN_BUDGET);
        checks.check(t <= token_ceiling, || {
            format!("{name}: {t} tokens held, ceiling {token_ceiling}")
        });
        checks.check(all_n <= u64::from(MAX_CONCURRENT), || {
            format!("{all_n} slots held, max_concurrent {MAX_CONCURRENT}")
        });
        checks.check(all_t <= TOKEN_BUDGET, || {
            format!("{all_t} tokens held, budget {TOKEN_BUDGET}")
        });
    }

    fn shrinking(&self, k: usize, by: u64) {
        self.held_tokens[k].fetch_sub(by, Ordering::SeqCst);
        self.all_tokens.fetch_sub(by, Ordering::SeqCst);
    }

    fn releasing(&self, k: usize, hold: u64) {
        self.held_slots[k].fetch_sub(1, Ordering::SeqCst);
        self.all_slots.fetch_sub(1, Ordering::SeqCst);
        self.shrinking(k, hold);
    }

    fn arrive(&self, r: u64) -> Arrival {
        Arrival {
            slots: self.upper_slots.fetch_add(1 | 1 << 32, Ordering::SeqCst),
            tokens: self.upper_tokens.fetch_add(r | r << 32, Ordering::SeqCst),
        }
    }

    /// The most slots and tokens the others of the class can have held during the decision
    /// that began with `a` (called once it returned).
    fn others_at_most(&self, a: &Arrival, r: u64) -> (u64, u64) {
        let arrived = |now: u64, then: u64, mine: u64| {
            ((now >> 32).wrapping_sub(then >> 32).wrapping_sub(mine)) & LOW32
        };
        let slots = self.upper_slots.load(Ordering::SeqCst);
        let tokens = self.upper_tokens.load(Ordering::SeqCst);
        (
            (a.slots & LOW32) + arrived(slots, a.slots, 1),
            (a.tokens & LOW32) + arrived(tokens, a.tokens, r),
        )
    }

    fn leave_upper(&self, slots: u64, tokens: u64) {
        self.upper_slots.fetch_sub(slots, Ordering::SeqCst);
        self.upper_tokens.fetch_sub(tokens, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

/// A decision's outcome, keyed for the tables.
type RefusalKey = (&'static str, &'static str);

fn refusal_key(r: &Rejection) -> RefusalKey {
    (r.reason.as_str(), r.constraint.map_or("-", |c| c.as_str()))
}

/// What one worker (then one class) saw.
#[derive(Default)]
struct Tally {
    decisions: u64,
    admitted: u64,
    borrowed_slot: u64,
    streamed: u64,
    refused: BTreeMap<RefusalKey, u64>,
    reserved: u64,
    consumed: u64,
    provider_us: Vec<u64>,
    decision_ns: Vec<u64>,
    queue_wait_ns: u64,
    /// Per phase: decisions, admitted.
    phases: [(u64, u64); PHASES.len()],
    /// Interactive decisions that were inside the floors of their revision by the upper-bound
    /// tally, admitted or refused (by key and revision).
    inside_floor: u64,
    inside_floor_admitted: u64,
    inside_floor_refused: BTreeMap<(RefusalKey, u64), u64>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.decisions += o.decisions;
        self.admitted += o.admitted;
        self.borrowed_slot += o.borrowed_slot;
        self.streamed += o.streamed;
        for (k, v) in o.refused {
            *self.refused.entry(k).or_default() += v;
        }
        self.reserved += o.reserved;
        self.consumed += o.consumed;
        self.provider_us.extend(o.provider_us);
        self.decision_ns.extend(o.decision_ns);
        self.queue_wait_ns += o.queue_wait_ns;
        for (a, b) in self.phases.iter_mut().zip(o.phases) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.inside_floor += o.inside_floor;
        self.inside_floor_admitted += o.inside_floor_admitted;
        for (k, v) in o.inside_floor_refused {
            *self.inside_floor_refused.entry(k).or_default() += v;
        }
    }

    fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }
}

struct Gateway {
    bulkhead: Bulkhead,
    ids: [ClassId; CLASSES],
    estimator: ModelAwareEstimator,
    pools: Vec<Vec<LlmRequest>>,
    timeline: Timeline,
    stop: AtomicBool,
    running: AtomicUsize,
    ledger: Ledger,
    checks: Checks,
}

fn sleep_us(us: u64) {
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

fn worker(gw: &Gateway, k: usize, w: usize) -> Tally {
    let spec = &SPECS[k];
    let mut rng = Rng::new(0x5eed_0000_0000 + ((k as u64) << 16) + w as u64);
    let mut tally = Tally::default();
    while !gw.stop.load(Ordering::Relaxed) {
        let request = &gw.pools[k][rng.below(gw.pools[k].len())];
        let reservation = gw.estimator.estimate(request).expect("small requests");
        let r = reservation.total();
        let demand = Demand::tokens(reservation).in_class(gw.ids[k]);
        let phase = gw.timeline.phase();
        let arrival = (k == INTERACTIVE).then(|| gw.ledger.arrive(r));
        let (decision, decision_ns, queue_ns) = match spec.mode {
            Mode::FailFast => {
                let t0 = Instant::now();
                let d = gw.bulkhead.try_acquire(demand);
                (d, t0.elapsed().as_nanos() as u64, 0)
            }
            Mode::Wait(timeout) => {
                let options = WaitOptions {
                    timeout: QueueTimeout::After(timeout),
                    cancel: None,
                };
                let t = gw.bulkhead.acquire_blocking_timed(demand, options);
                (t.value, t.timing.decision_ns, t.timing.queue_wait_ns)
            }
        };
        tally.decisions += 1;
        tally.phases[phase].0 += 1;
        tally.decision_ns.push(decision_ns);
        tally.queue_wait_ns += queue_ns;
        let revision = match &decision {
            Ok(a) => a.revision(),
            Err(rej) => rej.revision,
        };
        // Inside its floors (by the upper bound), an interactive request must be admitted on
        // protected capacity, and never refused for protection.
        let inside = arrival.as_ref().is_some_and(|a| {
            let (slots, tokens) = gw.ledger.others_at_most(a, r);
            let floor = limits_at(k, revision);
            slots < u64::from(floor.protected_concurrent) && tokens + r <= floor.protected_tokens
        });
        tally.inside_floor += u64::from(inside);
        match decision {
            Ok(mut admission) => {
                gw.ledger.admitted(&gw.checks, k, admission.held());
                tally.admitted += 1;
                tally.phases[phase].1 += 1;
                tally.reserved += r;
                let res = admission.resources();
                tally.borrowed_slot += u64::from(res.borrowed_concurrency);
                if inside {
                    tally.inside_floor_admitted += 1;
                    gw.checks.check(
                        !res.borrowed_concurrency && res.borrowed_tokens == 0,
                        || {
                            format!(
                                "{}: admitted inside its floors but borrowed: {res:?}",
                                spec.name
                            )
                        },
                    );
                }
                let call = draw_call(spec, &mut rng, reservation, gw.timeline.is_slow());
                let t0 = Instant::now();
                provider_call(gw, k, &mut admission, reservation, &call);
                tally.provider_us.push(t0.elapsed().as_micros() as u64);
                tally.streamed += u64::from(call.stream);
                let hold = admission.held();
                gw.ledger.releasing(k, hold);
                let report = admission
                    .release(Some(Usage::new(call.input, call.output)))
                    .expect("valid usage");
                if arrival.is_some() {
                    gw.ledger.leave_upper(1, hold);
                }
                tally.consumed += report.consumed.unwrap_or(0);
                sleep_us(rng.range(spec.think_us));
            }
            Err(rejection) => {
                if arrival.is_some() {
                    gw.ledger.leave_upper(1, r);
                }
                let key = refusal_key(&rejection);
                *tally.refused.entry(key).or_default() += 1;
                if inside {
                    *tally
                        .inside_floor_refused
                        .entry((key, rejection.revision))
                        .or_default() += 1;
                    gw.checks.check(key.1 != "admission_class_protection", || {
                        format!(
                            "{}: refused for protection inside its floors: {rejection}",
                            spec.name
                        )
                    });
                    // Under revision 0 no floor was ever raised, so the global limits have
                    // room for every floor (U ≤ max_concurrent): nothing may refuse it.
                    gw.checks.check(rejection.revision != 0, || {
                        format!(
                            "{}: refused inside its floors under revision 0: {rejection}",
                            spec.name
                        )
                    });
                }
                sleep_us(rng.range(spec.retry_us));
            }
        }
    }
    gw.running.fetch_sub(1, Ordering::SeqCst);
    tally
}

/// The provider serves `call`; a streamed call reports its usage halfway and gives back what
/// it will not need (the hold becomes the remaining output plus a margin, never more than it
/// was, so usage reports never push the budget past its limit in this demo).
fn provider_call(
    gw: &Gateway,
    k: usize,
    admission: &mut Admission,
    reservation: Reservation,
    call: &Call,
) {
    if !call.stream {
        std::thread::sleep(call.latency);
        return;
    }
    std::thread::sleep(call.latency / 2);
    let half = call.output / 2;
    let margin = 64.min(reservation.input() + half);
    let remaining_output = reservation.max_output() - half;
    let before = admission.held();
    let after = remaining_output + margin;
    gw.ledger.shrinking(k, before - after);
    let report = admission
        .report_usage_reconciled(
            Usage::new(call.input, half),
            Reconcile {
                remaining_output,
                safety_margin: margin,
            },
        )
        .expect("valid usage");
    if k == INTERACTIVE {
        gw.ledger.leave_upper(0, before - after);
    }
    gw.checks.check(report.held == after, || {
        format!("streaming report held {} instead of {after}", report.held)
    });
    std::thread::sleep(call.latency - call.latency / 2);
}

// ---------------------------------------------------------------------------------------------
// The sampler
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Sample {
    secs: f64,
    slots: [u64; CLASSES],
    tokens: [u64; CLASSES],
    interactive_floor: (u64, u64),
}

fn sample(gw: &Gateway) -> Sample {
    let s: Stats = gw.bulkhead.stats();
    let classes = &s.classes.as_ref().expect("classes").classes;
    let mut out = Sample {
        secs: gw.timeline.secs(),
        slots: [0; CLASSES],
        tokens: [0; CLASSES],
        interactive_floor: (0, 0),
    };
    for (k, c) in classes.iter().enumerate() {
        out.slots[k] = c.in_flight;
        out.tokens[k] = c.in_flight_tokens;
        // A class word is read in one load, so these are exact values of one instant.
        let cap = u64::from(c.limits.max_concurrent.unwrap_or(MAX_CONCURRENT));
        gw.checks.check(c.in_flight <= cap, || {
            format!(
                "sampled {}: {} in flight, ceiling {cap}",
                c.name, c.in_flight
            )
        });
        let cap = c.limits.max_tokens.unwrap_or(TOKEN_BUDGET);
        gw.checks.check(c.in_flight_tokens <= cap, || {
            format!(
                "sampled {}: {} tokens, ceiling {cap}",
                c.name, c.in_flight_tokens
            )
        });
    }
    let f = &classes[INTERACTIVE].limits;
    out.interactive_floor = (u64::from(f.protected_concurrent), f.protected_tokens);
    // The global totals of `stats()` add class words read one after another, not at one
    // instant, so the global limits are checked on the workers' lower-bound tally instead.
    let (n, t) = (
        gw.ledger.all_slots.load(Ordering::SeqCst),
        gw.ledger.all_tokens.load(Ordering::SeqCst),
    );
    gw.checks.check(n <= u64::from(MAX_CONCURRENT), || {
        format!("sampled tally: {n} slots held")
    });
    gw.checks.check(t <= TOKEN_BUDGET, || {
        format!("sampled tally: {t} tokens held")
    });
    out
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1_000.0)
}

fn ns(n: u64) -> String {
    if n < 10_000 {
        format!("{n} ns")
    } else {
        format!("{:.1} µs", n as f64 / 1_000.0)
    }
}

fn floors(l: &ClassLimits) -> String {
    if l.protected_concurrent == 0 && l.protected_tokens == 0 {
        "none".into()
    } else {
        format!("{} / {}", l.protected_concurrent, l.protected_tokens)
    }
}

fn ceilings(l: &ClassLimits) -> String {
    format!(
        "{} / {}",
        l.max_concurrent.map_or("-".into(), |c| c.to_string()),
        l.max_tokens.map_or("-".into(), |c| c.to_string())
    )
}

struct Options {
    duration: Duration,
    sample_every: Duration,
    plot: Option<String>,
}

fn options() -> Options {
    let mut short = std::env::var("DEMO_SHORT").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut plot = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--short" => short = true,
            "--plot" => plot = args.next(),
            _ if a.starts_with("--plot=") => plot = Some(a["--plot=".len()..].to_owned()),
            _ => {
                eprintln!("usage: demo [--short] [--plot FILE.svg]   (DEMO_SHORT=1 is --short)");
                std::process::exit(2);
            }
        }
    }
    if plot.as_deref() == Some("") {
        eprintln!("--plot needs a file name");
        std::process::exit(2);
    }
    Options {
        duration: Duration::from_millis(if short { 1_500 } else { 6_000 }),
        sample_every: Duration::from_millis(4),
        plot,
    }
}

fn main() {
    let opts = options();
    let bulkhead = build_bulkhead();
    let ids = SPECS.map(|s| bulkhead.class_id(s.name).expect("configured"));
    let estimator = ModelAwareEstimator::builder()
        .build()
        .expect("default estimator");
    let gw = Gateway {
        bulkhead,
        ids,
        estimator,
        pools: (0..CLASSES).map(request_pool).collect(),
        timeline: Timeline {
            start: Instant::now(),
            total: opts.duration,
        },
        stop: AtomicBool::new(false),
        running: AtomicUsize::new(SPECS.iter().map(|s| s.workers).sum()),
        ledger: Ledger::default(),
        checks: Checks::default(),
    };
    let t = &gw.timeline;
    let total_s = t.total.as_secs_f64();
    let at = |f: f64| t.at(f).as_secs_f64();
    println!(
        "llm-bulkhead gateway demo: {total_s:.1} s, {MAX_CONCURRENT} slots, {TOKEN_BUDGET}-token budget; \
         provider {SLOW_FACTOR}x slower from {:.2} s to {:.2} s; interactive floor raised at {:.2} s \
         (revision 1), restored at {:.2} s (revision 2)\n",
        at(SLOW_FROM),
        at(SLOW_UNTIL),
        at(RAISE_AT),
        at(RESTORE_AT),
    );
    println!(
        "| class | workers | admission | floors (slots / tokens) | ceilings | model, max_tokens |"
    );
    println!("|---|---:|---|---|---|---|");
    for s in &SPECS {
        let floor = match s.raised {
            None => floors(&s.limits),
            Some(r) => format!("{}, then {}", floors(&s.limits), floors(&r)),
        };
        let mode = match s.mode {
            Mode::FailFast => "try_acquire".to_owned(),
            Mode::Wait(d) => format!("acquire_blocking ({} ms), retry", d.as_millis()),
        };
        println!(
            "| {} | {} | {mode} | {floor} | {} | {}, {:?} |",
            s.name,
            s.workers,
            ceilings(&s.limits),
            s.model,
            s.max_tokens
        );
    }
    println!();

    let mut samples = Vec::new();
    let mut tallies: Vec<Tally> = (0..CLASSES).map(|_| Tally::default()).collect();
    // (seconds, revision) of each limits change.
    let mut changes: Vec<(f64, u64)> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLASSES)
            .flat_map(|k| (0..SPECS[k].workers).map(move |w| (k, w)))
            .map(|(k, w)| {
                let gw = &gw;
                (k, s.spawn(move || worker(gw, k, w)))
            })
            .collect();
        // The sampler and the control plane, on this thread.
        while gw.running.load(Ordering::SeqCst) > 0 {
            let elapsed = gw.timeline.start.elapsed();
            let due = [RAISE_AT, RESTORE_AT].get(changes.len());
            if due.is_some_and(|&f| elapsed >= gw.timeline.at(f)) {
                let revision = changes.len() as u64 + 1;
                let mut next = gw.bulkhead.limits().with_revision(revision);
                for k in 0..CLASSES {
                    next = next.with_class(gw.ids[k], limits_at(k, revision));
                }
                gw.bulkhead.apply_limits(next).expect("valid limits");
                changes.push((gw.timeline.secs(), revision));
            }
            if elapsed >= gw.timeline.total {
                gw.stop.store(true, Ordering::Relaxed);
            }
            samples.push(sample(&gw));
            std::thread::sleep(opts.sample_every);
        }
        for (k, h) in handles {
            tallies[k].merge(h.join().expect("worker"));
        }
    });
    let wall = gw.timeline.secs();
    samples.push(sample(&gw));

    report(&gw, &mut tallies, &samples, wall);
    let ok = final_checks(&gw, &tallies);
    // The seed's slow-provider scenario on gateway pools (`examples/pools_gateway`).
    let ok = slow_provider::run() && ok;
    if let Some(path) = &opts.plot {
        match plot::draw(path, &samples, &gw.timeline, &changes) {
            Ok(()) => println!("\nplot: {path}"),
            Err(e) => {
                eprintln!("plot failed: {e}");
                std::process::exit(1);
            }
        }
    }
    if !ok {
        std::process::exit(1);
    }
}

fn report(gw: &Gateway, tallies: &mut [Tally], samples: &[Sample], wall: f64) {
    println!("| class | decisions | admitted | borrowed slot | streamed | refused | refused by reason [constraint] |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for (k, t) in tallies.iter().enumerate() {
        let reasons: Vec<String> = t
            .refused
            .iter()
            .map(|((reason, constraint), n)| format!("{reason} [{constraint}] {n}"))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            SPECS[k].name,
            t.decisions,
            t.admitted,
            t.borrowed_slot,
            t.streamed,
            t.refused_total(),
            if reasons.is_empty() {
                "-".into()
            } else {
                reasons.join(", ")
            }
        );
    }

    println!("\n| class | provider call p50 | p90 | p99 | admission decision p50 | p90 | p99 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (k, t) in tallies.iter_mut().enumerate() {
        t.provider_us.sort_unstable();
        t.decision_ns.sort_unstable();
        let (p, d) = (&t.provider_us, &t.decision_ns);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            SPECS[k].name,
            ms(percentile(p, 0.5)),
            ms(percentile(p, 0.9)),
            ms(percentile(p, 0.99)),
            ns(percentile(d, 0.5)),
            ns(percentile(d, 0.9)),
            ns(percentile(d, 0.99)),
        );
    }
    let waited: u64 = tallies.iter().map(|t| t.queue_wait_ns).sum();
    if waited > 0 {
        println!("(time spent queued, all classes: {})", ns(waited));
    }

    // Per phase: mean and peak in flight from the samples, and the share admitted.
    println!("\n| phase | interactive in flight: mean / peak (floor) | interactive admitted | standard in flight | batch in flight | batch tokens (mean) | batch admitted |");
    println!("|---|---|---:|---|---|---:|---:|");
    let t = &gw.timeline;
    let mut bounds: Vec<f64> = PHASE_STARTS
        .iter()
        .map(|&f| t.at(f).as_secs_f64())
        .collect();
    bounds.push(f64::INFINITY); // the drain after the stop counts in the last phase
    for (ph, name) in PHASES.iter().enumerate() {
        let inside: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.secs >= bounds[ph] && s.secs < bounds[ph + 1])
            .collect();
        let n = inside.len().max(1) as f64;
        let mean = |k: usize| inside.iter().map(|s| s.slots[k]).sum::<u64>() as f64 / n;
        let peak = |k: usize| inside.iter().map(|s| s.slots[k]).max().unwrap_or(0);
        let floor = inside.last().map_or(0, |s| s.interactive_floor.0);
        let share = |k: usize| {
            let (d, a) = tallies[k].phases[ph];
            format!("{:.0} %", 100.0 * a as f64 / d.max(1) as f64)
        };
        let batch_tokens = inside.iter().map(|s| s.tokens[BATCH]).sum::<u64>() as f64 / n;
        println!(
            "| {name} | {:.1} / {} ({floor}) | {} | {:.1} / {} | {:.1} / {} | {:.0} | {} |",
            mean(INTERACTIVE),
            peak(INTERACTIVE),
            share(INTERACTIVE),
            mean(STANDARD),
            peak(STANDARD),
            mean(BATCH),
            peak(BATCH),
            batch_tokens,
            share(BATCH),
        );
    }

    let it = &tallies[INTERACTIVE];
    let refused_inside: u64 = it.inside_floor_refused.values().sum();
    println!(
        "\nthe floor: {} interactive decisions were inside their floors (by an independent upper-bound tally); \
         {} admitted on protected capacity, {} refused",
        it.inside_floor, it.inside_floor_admitted, refused_inside
    );
    for (((reason, constraint), revision), n) in &it.inside_floor_refused {
        let why = if *revision == 1 {
            " (raising a floor revokes nothing: batch's borrowed slots come back by attrition)"
        } else {
            ""
        };
        println!("  {n} refused {reason} [{constraint}] under revision {revision}{why}");
    }
    let peaks: Vec<String> = (0..CLASSES)
        .map(|k| {
            let ceiling = SPECS[k].limits.max_concurrent.unwrap_or(MAX_CONCURRENT);
            let peak = samples.iter().map(|s| s.slots[k]).max().unwrap_or(0);
            format!("{} {peak} of {ceiling}", SPECS[k].name)
        })
        .collect();
    println!(
        "peaks: {} slots (sampler, {} samples); all classes {} of {MAX_CONCURRENT} slots, {} of \
         {TOKEN_BUDGET} tokens (workers' tally)",
        peaks.join(", "),
        samples.len(),
        gw.ledger.peak_slots.load(Ordering::SeqCst),
        gw.ledger.peak_tokens.load(Ordering::SeqCst),
    );
    println!("wall time {wall:.2} s (the last calls finish after the stop)");
}

/// The checks at rest: every counter back to zero, and the bulkhead's statistics equal to
/// the workers' own tallies.
fn final_checks(gw: &Gateway, tallies: &[Tally]) -> bool {
    let c = &gw.checks;
    let s = gw.bulkhead.stats();
    let tok = s.token_budget.expect("a budget");
    let classes = s.classes.as_ref().expect("classes");
    c.check(s.in_flight == 0 && s.admissions_in_flight == 0, || {
        format!("{} slots still in flight", s.in_flight)
    });
    c.check(tok.in_flight_tokens == 0, || {
        format!("{} tokens still held", tok.in_flight_tokens)
    });
    c.check(s.pending == 0 && s.released == s.admitted, || {
        format!(
            "pending {}, released {} of {}",
            s.pending, s.released, s.admitted
        )
    });
    c.check(tok.total_overrun == 0, || {
        format!("overrun {}", tok.total_overrun)
    });
    c.check(
        classes.shared.in_flight == 0
            && classes
                .shared
                .token_budget
                .is_some_and(|t| t.in_flight_tokens == 0),
        || format!("shared remainder still in use: {:?}", classes.shared),
    );
    for (k, cs) in classes.classes.iter().enumerate() {
        let t = &tallies[k];
        c.check(cs.in_flight == 0 && cs.in_flight_tokens == 0, || {
            format!(
                "{}: {} in flight, {} tokens at rest",
                cs.name, cs.in_flight, cs.in_flight_tokens
            )
        });
        c.check(
            cs.admitted == t.admitted && cs.released == t.admitted,
            || {
                format!(
                    "{}: stats admitted {} released {}, workers saw {}",
                    cs.name, cs.admitted, cs.released, t.admitted
                )
            },
        );
        c.check(cs.rejected == t.refused_total(), || {
            format!(
                "{}: stats rejected {}, workers saw {}",
                cs.name,
                cs.rejected,
                t.refused_total()
            )
        });
        for reason in llm_bulkhead::RejectReason::COUNTED {
            let ours: u64 = t
                .refused
                .iter()
                .filter(|((r, _), _)| *r == reason.as_str())
                .map(|(_, n)| n)
                .sum();
            c.check(cs.rejected_by_reason.get(reason) == ours, || {
                format!(
                    "{}: {reason} counted {} by stats, {ours} by workers",
                    cs.name,
                    cs.rejected_by_reason.get(reason)
                )
            });
        }
        c.check(
            cs.total_reserved == t.reserved && cs.total_consumed == t.consumed,
            || {
                format!(
                    "{}: reserved {} / {}, consumed {} / {}",
                    cs.name, cs.total_reserved, t.reserved, cs.total_consumed, t.consumed
                )
            },
        );
        c.check(cs.total_borrowed_admissions == t.borrowed_slot, || {
            format!(
                "{}: {} borrowed admissions by stats, {} by workers",
                cs.name, cs.total_borrowed_admissions, t.borrowed_slot
            )
        });
    }
    let l = &gw.ledger;
    let zero = |a: &AtomicU64| a.load(Ordering::SeqCst) == 0;
    c.check(
        zero(&l.all_slots)
            && zero(&l.all_tokens)
            && l.held_slots.iter().all(zero)
            && l.held_tokens.iter().all(zero)
            && l.upper_slots.load(Ordering::SeqCst) & LOW32 == 0
            && l.upper_tokens.load(Ordering::SeqCst) & LOW32 == 0,
        || "the workers' tallies are not back to zero".into(),
    );
    c.check(tallies[INTERACTIVE].inside_floor > 0, || {
        "no interactive decision was inside its floors: the floor check checked nothing".into()
    });

    println!(
        "\nfinal stats: in flight {} slots / {} tokens; admitted {}, released {}, rejected {}; \
         tokens reserved {}, consumed {}, refunded {}, overrun {}",
        s.in_flight,
        tok.in_flight_tokens,
        s.admitted,
        s.released,
        s.rejected,
        tok.total_reserved,
        tok.total_consumed,
        tok.total_refunded,
        tok.total_overrun
    );
    let failed = c.failed.load(Ordering::Relaxed);
    println!(
        "invariants: {} checks, {failed} failed (class ceilings, global slots and budget, floors, \
         counters back to zero, stats equal to the workers' tallies)",
        c.passed.load(Ordering::Relaxed) + failed
    );
    for f in c.first.lock().unwrap().iter() {
        eprintln!("FAILED: {f}");
    }
    failed == 0
}

// ---------------------------------------------------------------------------------------------
// --plot: slots and tokens in flight per class over time (SVG)
// ---------------------------------------------------------------------------------------------

mod plot {
    use super::{Sample, Timeline, BATCH, CLASSES, INTERACTIVE, MAX_CONCURRENT, SLOW_FACTOR};
    use super::{SLOW_FROM, SLOW_UNTIL, SPECS, TOKEN_BUDGET};
    use plotters::coord::Shift;
    use plotters::prelude::*;

    type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
    type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

    const COLORS: [RGBColor; CLASSES] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
    ];
    const SLOW: RGBColor = RGBColor(255, 165, 0);
    const GREY: RGBColor = RGBColor(128, 128, 128);

    /// A dashed horizontal or stepped limit.
    struct Guide {
        points: Vec<(f64, f64)>,
        color: RGBColor,
    }

    /// Two panels (slots, then thousands of tokens) and one legend on the right.
    pub fn draw(
        path: &str,
        samples: &[Sample],
        t: &Timeline,
        changes: &[(f64, u64)],
    ) -> Result<()> {
        let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let (charts, legend) = root.split_horizontally(800);
        let (top, bottom) = charts.split_vertically(320);
        let end = samples.last().map_or(1.0, |s| s.secs);
        let slow = (
            t.at(SLOW_FROM).as_secs_f64(),
            t.at(SLOW_UNTIL).as_secs_f64(),
        );
        let flat = |y: f64, color| Guide {
            points: vec![(0.0, y), (end, y)],
            color,
        };
        // The interactive floor as a step function of the sampled limits.
        let floor = |f: fn(&Sample) -> f64| {
            let mut points: Vec<(f64, f64)> = Vec::new();
            for s in samples {
                if let Some(&(_, last)) = points.last() {
                    if last != f(s) {
                        points.push((s.secs, last));
                    }
                }
                points.push((s.secs, f(s)));
            }
            Guide {
                points,
                color: COLORS[INTERACTIVE],
            }
        };
        let batch = SPECS[BATCH].limits;
        let mc = f64::from(MAX_CONCURRENT);
        panel(
            &top,
            samples,
            "slots in flight, by class",
            (end, mc + 1.0),
            (slow, changes),
            &|s, k| s.slots[k] as f64,
            &[
                flat(mc, BLACK),
                floor(|s| s.interactive_floor.0 as f64),
                flat(f64::from(batch.max_concurrent.unwrap_or(0)), COLORS[BATCH]),
            ],
        )?;
        let k = |v: u64| v as f64 / 1_000.0;
        panel(
            &bottom,
            samples,
            "tokens in flight, by class (thousands)",
            (end, k(TOKEN_BUDGET) + 2.0),
            (slow, changes),
            &|s, c| k(s.tokens[c]),
            &[
                flat(k(TOKEN_BUDGET), BLACK),
                floor(|s| s.interactive_floor.1 as f64 / 1_000.0),
                flat(k(batch.max_tokens.unwrap_or(0)), COLORS[BATCH]),
            ],
        )?;
        draw_legend(&legend)?;
        root.present()?;
        Ok(())
    }

    fn panel(
        area: &Area<'_>,
        samples: &[Sample],
        title: &str,
        (x_end, y_end): (f64, f64),
        (slow, changes): ((f64, f64), &[(f64, u64)]),
        value: &dyn Fn(&Sample, usize) -> f64,
        guides: &[Guide],
    ) -> Result<()> {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 17))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..x_end, 0f64..y_end)?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .bold_line_style(BLACK.mix(0.08))
            .x_desc("seconds")
            .draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(slow.0, 0.0), (slow.1, y_end)],
            SLOW.mix(0.15).filled(),
        )))?;
        for &(x, revision) in changes {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_end)],
                GREY.stroke_width(1),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("rev {revision}"),
                (x, y_end),
                ("sans-serif", 12).into_font().color(&GREY),
            )))?;
        }
        for (k, color) in COLORS.iter().enumerate() {
            chart.draw_series(LineSeries::new(
                samples.iter().map(|s| (s.secs, value(s, k))),
                color.stroke_width(1),
            ))?;
        }
        for g in guides {
            chart.draw_series(DashedLineSeries::new(
                g.points.iter().copied(),
                6,
                4,
                g.color.stroke_width(2),
            ))?;
        }
        Ok(())
    }

    fn draw_legend(area: &Area<'_>) -> Result<()> {
        let font = ("sans-serif", 13).into_font();
        let mut y = 40;
        let mut entry = |area: &Area<'_>,
                         label: String,
                         mark: &dyn Fn(&Area<'_>, i32) -> Result<()>|
         -> Result<()> {
            mark(area, y)?;
            area.draw(&Text::new(label, (40, y - 7), font.clone()))?;
            y += 22;
            Ok(())
        };
        for (k, spec) in SPECS.iter().enumerate() {
            let c = COLORS[k];
            entry(area, spec.name.to_owned(), &move |a, y| {
                a.draw(&PathElement::new(vec![(6, y), (32, y)], c.stroke_width(2)))?;
                Ok(())
            })?;
        }
        let dashed = |c: RGBColor| {
            move |a: &Area<'_>, y: i32| -> Result<()> {
                for x in [6, 16, 26] {
                    a.draw(&PathElement::new(
                        vec![(x, y), (x + 6, y)],
                        c.stroke_width(2),
                    ))?;
                }
                Ok(())
            }
        };
        entry(area, "max_concurrent, budget".into(), &dashed(BLACK))?;
        entry(
            area,
            "interactive floor".into(),
            &dashed(COLORS[INTERACTIVE]),
        )?;
        entry(area, "batch ceiling".into(), &dashed(COLORS[BATCH]))?;
        entry(area, format!("provider {SLOW_FACTOR}x slower"), &|a, y| {
            a.draw(&Rectangle::new(
                [(6, y - 6), (32, y + 6)],
                SLOW.mix(0.3).filled(),
            ))?;
            Ok(())
        })?;
        entry(area, "limits revision".into(), &|a, y| {
            a.draw(&PathElement::new(
                vec![(19, y - 8), (19, y + 8)],
                GREY.stroke_width(1),
            ))?;
            Ok(())
        })?;
        let interactive = SPECS[INTERACTIVE].limits.protected_concurrent;
        let raised = SPECS[INTERACTIVE]
            .raised
            .map_or(interactive, |r| r.protected_concurrent);
        for line in [
            format!("rev 1: interactive floor {interactive} -> {raised}"),
            "rev 2: floor restored".to_owned(),
        ] {
            area.draw(&Text::new(line, (12, y - 7), font.clone().color(&GREY)))?;
            y += 18;
        }
        Ok(())
    }
}
