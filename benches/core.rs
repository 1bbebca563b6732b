//! Criterion benchmarks of the admission fast path against its baselines.
//!
//! The first three groups hold the same variants so that one run gives comparable numbers (the
//! `classes` group, below, holds its own):
//!
//! * `bare_atomic_floor`: an `AtomicU64` CAS-with-limit acquire and a `fetch_sub` release, the
//!   least any lock-free admission controller can do;
//! * `tokio_semaphore`: `tokio::sync::Semaphore::try_acquire` and dropping the permit (slots
//!   only, a permit borrowing the semaphore);
//! * `tokio_semaphore_owned` (context only, not in the committed targets): `try_acquire_owned`
//!   on an `Arc<Semaphore>`, whose permit is `'static` like our admission (an `Arc` clone and
//!   drop on top of the borrowed pair);
//! * `parking_lot_bulkhead`: a `parking_lot::Mutex` around `{in_flight, tokens}` that checks both
//!   limits and releases both;
//! * `ours_slots`: a [`Bulkhead`] without a token budget, `try_acquire(Demand::slot())` + drop;
//! * `ours_slots_tokens`: a [`Bulkhead`] with a token budget and a [`Reservation`].
//! * `ours_slots_tokens_id_read` (uncontended only): the same, reading the admission's id,
//!   revision and hold, so that no field of the admission can be optimised away.
//!
//! Groups:
//!
//! * `uncontended_pair`: one acquire + release pair per iteration on one thread;
//! * `two_threads`: two threads hammering one shared instance, `iters` pairs each; criterion's
//!   time is the wall time of one iteration (one pair on each thread, in parallel) and its
//!   throughput (`Elements(2)` per iteration) is the aggregate pairs per second;
//! * `refused`: the cost of a refusal, ours (`budget_limit`, and `concurrency_limit` for
//!   reference) beside tokio's `try_acquire` on a semaphore with no permits;
//! * `classes`: the admission-class path (`try_acquire_classed`) on a bulkhead with three
//!   classes, each with a concurrency floor of 8 and a token floor of 8 reservations
//!   (`max_concurrent` 64), beside the no-class `ours_slots_tokens` pair and the parking_lot
//!   bulkhead, in the same group so that one run compares them:
//!   * `ours_slots_tokens` (no classes) and `protected` (a class admitted inside its floors) and
//!     `borrowing` (a class whose floors are used up by 8 held admissions, so every pair
//!     borrows a slot and its whole reservation: one CAS on the shared word and one on the
//!     class word to acquire, and a `fetch_sub` on each to release): one pair per
//!     iteration on one thread;
//!   * `two_threads_parking_lot`, `two_threads_tokio`, `two_threads_ours_slots_tokens`,
//!     `two_threads_protected` (the two threads in different classes, each inside its floors),
//!     `two_threads_protected_same_class` (both inside the floors of one class),
//!     `two_threads_borrowing` (both threads borrow, in different classes) and
//!     `two_threads_borrowing_same_class` (both borrow in one class): as in `two_threads`, so
//!     that every pair kind runs on two threads beside both anchors in one group.
//!
//! Limits are large enough that no pair in the first two groups is ever refused; the two-thread
//! runs count refusals and assert that there were none. `scripts/perf-table` runs this target
//! with the others behind the README's figures and prints the README's tables (ratios to the
//! anchors of the same run, with their spread).

use criterion::{black_box, criterion_main, Criterion, Throughput};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, RejectReason, Reservation};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Concurrency limit for every variant: far above what two threads can hold at once.
const MAX_CONCURRENT: u32 = 1024;
/// Token budget for the variants with tokens: 1024 admissions of [`INPUT`] + [`MAX_OUTPUT`] fit.
const BUDGET: u64 = 1 << 30;
/// Reservation used by the token variants.
const INPUT: u64 = 1_200;
/// Reservation used by the token variants.
const MAX_OUTPUT: u64 = 800;

/// The floor: a slot counter with a limit, acquired by CAS and released by `fetch_sub`.
struct BareAtomic {
    in_flight: AtomicU64,
    max: u64,
}

impl BareAtomic {
    fn new(max: u64) -> Self {
        BareAtomic {
            in_flight: AtomicU64::new(0),
            max,
        }
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        let mut cur = self.in_flight.load(Ordering::Acquire);
        loop {
            if cur >= self.max {
                return false;
            }
            match self.in_flight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    #[inline]
    fn release(&self) {
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    #[inline(always)]
    fn pair(&self) -> bool {
        if self.try_acquire() {
            self.release();
            true
        } else {
            false
        }
    }
}

/// The lock-based baseline: both limits checked and both counters changed under one mutex.
struct LockedState {
    in_flight: u64,
    tokens: u64,
}

struct LockBulkhead {
    state: Mutex<LockedState>,
    max_concurrent: u64,
    budget: u64,
}

impl LockBulkhead {
    fn new(max_concurrent: u64, budget: u64) -> Self {
        LockBulkhead {
            state: Mutex::new(LockedState {
                in_flight: 0,
                tokens: 0,
            }),
            max_concurrent,
            budget,
        }
    }

    #[inline]
    fn try_acquire(&self, tokens: u64) -> bool {
        let mut s = self.state.lock();
        if s.tokens + tokens > self.budget || s.in_flight >= self.max_concurrent {
            return false;
        }
        s.in_flight += 1;
        s.tokens += tokens;
        true
    }

    #[inline]
    fn release(&self, tokens: u64) {
        let mut s = self.state.lock();
        s.in_flight -= 1;
        s.tokens -= tokens;
    }

    #[inline(always)]
    fn pair(&self, tokens: u64) -> bool {
        if self.try_acquire(tokens) {
            self.release(tokens);
            true
        } else {
            false
        }
    }
}

#[inline(always)]
fn tokio_pair(sem: &Semaphore) -> bool {
    // The permit is dropped in place (its drop has effects, so nothing is optimised away).
    sem.try_acquire().is_ok()
}

/// tokio's owned permit (`Arc` clone + drop), the counterpart of our `Send + 'static`
/// [`llm_bulkhead::Admission`]; not part of the committed targets, shown for context.
#[inline(always)]
fn tokio_owned_pair(sem: &Arc<Semaphore>) -> bool {
    Arc::clone(sem).try_acquire_owned().is_ok()
}

// `inline(always)` on every pair function: each measured pair sits in the timing loop itself,
// whatever the inliner's budget makes of the surrounding closures.
#[inline(always)]
fn ours_pair(b: &Bulkhead, demand: Demand) -> bool {
    // The result is checked and dropped in place, as a caller that only needs the decision
    // would: no `black_box(result)`, which would copy the 128-byte `Result` to a new stack slot
    // (dropping an admission has effects, and `try_acquire` is not inlined, so nothing is
    // optimised away).
    match b.try_acquire(black_box(demand)) {
        Ok(admission) => {
            drop(admission);
            true
        }
        Err(rejection) => {
            drop(rejection);
            false
        }
    }
}

fn slots_bulkhead() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .build()
        .expect("valid limits")
}

fn tokens_bulkhead() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .token_budget(BUDGET)
        .build()
        .expect("valid limits")
}

fn token_demand() -> Demand {
    Demand::tokens(Reservation::new(INPUT, MAX_OUTPUT).expect("no overflow"))
}

/// Short runs: this has to finish in a few minutes on a 2-core machine.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
}

fn uncontended_pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("uncontended_pair");

    let floor = BareAtomic::new(u64::from(MAX_CONCURRENT));
    g.bench_function("bare_atomic_floor", |b| {
        b.iter(|| black_box(black_box(&floor).pair()))
    });

    let sem = Semaphore::new(MAX_CONCURRENT as usize);
    g.bench_function("tokio_semaphore", |b| {
        b.iter(|| black_box(tokio_pair(black_box(&sem))))
    });

    let owned = Arc::new(Semaphore::new(MAX_CONCURRENT as usize));
    g.bench_function("tokio_semaphore_owned", |b| {
        b.iter(|| black_box(tokio_owned_pair(black_box(&owned))))
    });

    let locked = LockBulkhead::new(u64::from(MAX_CONCURRENT), BUDGET);
    let r = INPUT + MAX_OUTPUT;
    g.bench_function("parking_lot_bulkhead", |b| {
        b.iter(|| black_box(black_box(&locked).pair(black_box(r))))
    });

    let ours = slots_bulkhead();
    g.bench_function("ours_slots", |b| {
        b.iter(|| black_box(ours_pair(black_box(&ours), Demand::slot())))
    });

    let ours_t = tokens_bulkhead();
    let d = token_demand();
    g.bench_function("ours_slots_tokens", |b| {
        b.iter(|| black_box(ours_pair(black_box(&ours_t), d)))
    });

    // The same pair for a caller that also reads the admission's id and revision (so none of
    // the admission's fields can be optimised away). Context only, not part of the targets.
    g.bench_function("ours_slots_tokens_id_read", |b| {
        b.iter(|| match black_box(&ours_t).try_acquire(black_box(d)) {
            Ok(a) => {
                black_box((a.id(), a.revision(), a.held()));
                true
            }
            Err(_) => false,
        })
    });

    g.finish();
    let s = ours_t.stats();
    assert_eq!((s.rejected, s.in_flight), (0, 0));
}

/// Where the two threads of a two-thread run run, and whether they ran at once.
///
/// On a shared 2-core machine the scheduler may run both threads on one core in turn (another
/// process holds the other), which measures no contention at all. On Linux each thread is
/// pinned to its own CPU of the process's affinity set (unless `BENCH_NO_PIN` is set), and the
/// threads' CPU time over the wall time of the run is recorded: 2.00 means both threads ran
/// for the whole run, 1.00 that they took turns. Each two-thread benchmark prints it as
/// `two-thread parallelism GROUP/BENCH: X` (`scripts/perf-table` shows it beside the figure).
mod placement {
    use std::sync::atomic::{AtomicU64, Ordering};

    static CPU_NS: AtomicU64 = AtomicU64::new(0);
    static WALL_NS: AtomicU64 = AtomicU64::new(0);

    /// Pins the calling thread to the `i`-th CPU the process may use, when it may use two.
    #[cfg(target_os = "linux")]
    pub fn pin(i: usize) {
        if std::env::var_os("BENCH_NO_PIN").is_some() {
            return;
        }
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `cpu_set_t` is plain data for which all zeroes is the empty set; both calls
        // get a pointer to a live set of the size passed, and pid 0 is the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut set) != 0 {
                return;
            }
            let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect();
            if cpus.len() < 2 {
                return;
            }
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpus[i % cpus.len()], &mut one);
            libc::sched_setaffinity(0, size, &one);
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn pin(_: usize) {}

    /// CPU time of the calling thread, in ns (0 where it cannot be read).
    #[cfg(target_os = "linux")]
    pub fn thread_cpu_ns() -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a live, writable timespec.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
        if ok {
            t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
        } else {
            0
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn thread_cpu_ns() -> u64 {
        0
    }

    /// Adds one run: both threads' CPU time and its wall time.
    pub fn record(cpu_ns: u64, wall_ns: u64) {
        CPU_NS.fetch_add(cpu_ns, Ordering::Relaxed);
        WALL_NS.fetch_add(wall_ns, Ordering::Relaxed);
    }

    /// Prints the parallelism of the runs since the last report, if there were any.
    pub fn report(id: &str) {
        let (cpu, wall) = (
            CPU_NS.swap(0, Ordering::Relaxed),
            WALL_NS.swap(0, Ordering::Relaxed),
        );
        if cpu > 0 && wall > 0 {
            eprintln!(
                "two-thread parallelism {id}: {:.2}",
                cpu as f64 / wall as f64
            );
        }
    }
}

/// `g.bench_function(name, ...)` of a two-thread run, then its parallelism (see [`placement`]).
fn bench_two(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    group: &str,
    name: &str,
    mut run: impl FnMut(u64) -> Duration,
) {
    placement::report("(before)"); // drops anything left over
    g.bench_function(name, |b| b.iter_custom(&mut run));
    placement::report(&format!("{group}/{name}"));
}

/// Runs `iters` pairs on each of two threads against `shared` and returns the wall time from
/// the moment both threads are released by the barrier to the moment the last one finishes
/// (thread spawning and joining are not measured). Panics if any pair was refused.
fn two_thread_run<S: Sync>(shared: &S, iters: u64, pair: impl Fn(&S) -> bool + Sync) -> Duration {
    two_thread_run_indexed(shared, iters, |s, _| pair(s))
}

/// [`two_thread_run`] with the thread's index (0 or 1) passed to `pair`, so that the two
/// threads can make different demands (the `classes` group puts them in different classes).
fn two_thread_run_indexed<S: Sync>(
    shared: &S,
    iters: u64,
    pair: impl Fn(&S, usize) -> bool + Sync,
) -> Duration {
    let barrier = Barrier::new(2);
    let (barrier, pair) = (&barrier, &pair);
    let (spans, refused, cpu): (Vec<(Instant, Instant)>, u64, u64) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|i| {
                s.spawn(move || {
                    placement::pin(i);
                    let mut refused = 0u64;
                    barrier.wait();
                    let cpu = placement::thread_cpu_ns();
                    let start = Instant::now();
                    for _ in 0..iters {
                        if !pair(black_box(shared), i) {
                            refused += 1;
                        }
                    }
                    let end = Instant::now();
                    let cpu = placement::thread_cpu_ns().saturating_sub(cpu);
                    ((start, end), refused, cpu)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .fold((Vec::new(), 0, 0), |(mut v, n, c), (span, r, cpu)| {
                v.push(span);
                (v, n + r, c + cpu)
            })
    });
    assert_eq!(refused, 0, "a pair was refused; raise the limits");
    let start = spans.iter().map(|s| s.0).min().expect("two spans");
    let end = spans.iter().map(|s| s.1).max().expect("two spans");
    let wall = end - start;
    placement::record(cpu, u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX));
    wall
}

fn two_threads(c: &mut Criterion) {
    const GROUP: &str = "two_threads";
    let mut g = c.benchmark_group(GROUP);
    // One iteration = one pair on each of the two threads.
    g.throughput(Throughput::Elements(2));

    let floor = BareAtomic::new(u64::from(MAX_CONCURRENT));
    bench_two(&mut g, GROUP, "bare_atomic_floor", |iters| {
        two_thread_run(&floor, iters, BareAtomic::pair)
    });

    let sem = Semaphore::new(MAX_CONCURRENT as usize);
    bench_two(&mut g, GROUP, "tokio_semaphore", |iters| {
        two_thread_run(&sem, iters, tokio_pair)
    });

    let owned = Arc::new(Semaphore::new(MAX_CONCURRENT as usize));
    bench_two(&mut g, GROUP, "tokio_semaphore_owned", |iters| {
        two_thread_run(&owned, iters, tokio_owned_pair)
    });

    let locked = LockBulkhead::new(u64::from(MAX_CONCURRENT), BUDGET);
    let r = INPUT + MAX_OUTPUT;
    bench_two(&mut g, GROUP, "parking_lot_bulkhead", |iters| {
        two_thread_run(&locked, iters, |l| l.pair(black_box(r)))
    });

    let ours = slots_bulkhead();
    bench_two(&mut g, GROUP, "ours_slots", |iters| {
        two_thread_run(&ours, iters, |o| ours_pair(o, Demand::slot()))
    });

    let ours_t = tokens_bulkhead();
    let d = token_demand();
    bench_two(&mut g, GROUP, "ours_slots_tokens", |iters| {
        two_thread_run(&ours_t, iters, |o| ours_pair(o, d))
    });

    g.finish();
    for o in [&ours, &ours_t] {
        let s = o.stats();
        assert_eq!((s.rejected, s.in_flight), (0, 0));
        assert_eq!(s.admitted, s.released);
    }
}

fn refused(c: &mut Criterion) {
    let mut g = c.benchmark_group("refused");

    let sem = Semaphore::new(0);
    g.bench_function("tokio_no_permits", |b| {
        b.iter(|| black_box(!tokio_pair(black_box(&sem))))
    });

    let budget = Bulkhead::builder()
        .max_concurrent(MAX_CONCURRENT)
        .token_budget(1_000)
        .build()
        .expect("valid limits");
    let d = token_demand();
    let e = budget
        .try_acquire(d)
        .expect_err("reservation exceeds the budget");
    assert_eq!(e.reason, RejectReason::BudgetLimit);
    g.bench_function("ours_budget_limit", |b| {
        b.iter(|| black_box(!ours_pair(black_box(&budget), d)))
    });

    let full = Bulkhead::builder()
        .max_concurrent(0)
        .build()
        .expect("valid limits");
    let e = full.try_acquire(Demand::slot()).expect_err("no slots");
    assert_eq!(e.reason, RejectReason::ConcurrencyLimit);
    g.bench_function("ours_concurrency_limit", |b| {
        b.iter(|| black_box(!ours_pair(black_box(&full), Demand::slot())))
    });

    // With classes: a class at its ceiling (row 3, `admission_class`), and a borrower refused
    // because the other class's idle floor holds the rest (row 4, protection). Neither holds
    // anything during the measurement; the held admissions fill the state once.
    let classed = Bulkhead::builder()
        .max_concurrent(4)
        .class(
            "capped",
            ClassLimits {
                protected_concurrent: 0,
                max_concurrent: Some(1),
                ..ClassLimits::default()
            },
        )
        .class(
            "floored",
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        )
        .default_class("capped")
        .build()
        .expect("valid limits");
    let capped = classed.class_id("capped").unwrap();
    let held = classed
        .try_acquire(Demand::slot().in_class(capped))
        .unwrap();
    let at_ceiling = Demand::slot().in_class(capped);
    assert_eq!(
        classed.try_acquire(at_ceiling).unwrap_err().constraint,
        Some(llm_bulkhead::Constraint::AdmissionClass)
    );
    g.bench_function("ours_class_ceiling", |b| {
        b.iter(|| black_box(!ours_pair(black_box(&classed), at_ceiling)))
    });
    drop(held);

    let shared_full = Bulkhead::builder()
        .max_concurrent(3)
        .class("a", ClassLimits::default())
        .class(
            "b",
            ClassLimits {
                protected_concurrent: 2,
                ..ClassLimits::default()
            },
        )
        .default_class("a")
        .build()
        .expect("valid limits");
    let a = shared_full.class_id("a").unwrap();
    let held = shared_full.try_acquire(Demand::slot().in_class(a)).unwrap();
    let borrower = Demand::slot().in_class(a);
    assert_eq!(
        shared_full.try_acquire(borrower).unwrap_err().constraint,
        Some(llm_bulkhead::Constraint::AdmissionClassProtection)
    );
    g.bench_function("ours_class_protection", |b| {
        b.iter(|| black_box(!ours_pair(black_box(&shared_full), borrower)))
    });
    drop(held);

    g.finish();
    assert_eq!(budget.stats().admitted, 0);
    assert_eq!(full.stats().admitted, 0);
}

/// Global slots of the classed bulkhead of the `classes` group.
const CLASS_MAX_CONCURRENT: u32 = 64;
/// Concurrency floor of each of its three classes.
const CLASS_FLOOR: u32 = 8;
/// Token floor of each class: exactly [`CLASS_FLOOR`] reservations of the token demand.
const CLASS_TOKEN_FLOOR: u64 = CLASS_FLOOR as u64 * (INPUT + MAX_OUTPUT);
/// The classes, in construction order.
const CLASSES: [&str; 3] = ["premium", "standard", "batch"];
/// Token budget of the classed bulkhead (the largest a bulkhead with classes accepts).
const CLASS_BUDGET: u64 = llm_bulkhead::MAX_CLASSED_TOKENS;

/// Three classes with floors 8/8/8 (and token floors of 8 reservations each), ceilings of 48
/// slots and half the budget, on 64 global slots: 40 shared slots.
fn classes_bulkhead() -> Bulkhead {
    let limits = ClassLimits {
        protected_concurrent: CLASS_FLOOR,
        max_concurrent: Some(48),
        protected_tokens: CLASS_TOKEN_FLOOR,
        max_tokens: Some(CLASS_BUDGET / 2),
    };
    CLASSES
        .iter()
        .fold(
            Bulkhead::builder()
                .max_concurrent(CLASS_MAX_CONCURRENT)
                .token_budget(CLASS_BUDGET),
            |b, name| b.class(*name, limits),
        )
        .default_class("standard")
        .build()
        .expect("valid limits")
}

/// The token demand in class `name` of `b`.
fn class_demand(b: &Bulkhead, name: &str) -> Demand {
    token_demand().in_class(b.class_id(name).expect("configured class"))
}

/// Holds [`CLASS_FLOOR`] admissions of the token demand in class `name`, which uses up both of
/// its floors: every further admission in that class borrows a slot and its whole reservation.
fn use_up_floors(b: &Bulkhead, name: &str) -> Vec<llm_bulkhead::Admission> {
    let d = class_demand(b, name);
    let held: Vec<_> = (0..CLASS_FLOOR)
        .map(|_| b.try_acquire(d).expect("inside the floors"))
        .collect();
    assert!(held.iter().all(|a| {
        let r = a.resources();
        !r.borrowed_concurrency && r.borrowed_tokens == 0
    }));
    let probe = b.try_acquire(d).expect("the shared remainder is free");
    assert!(probe.resources().borrowed_concurrency);
    assert_eq!(probe.resources().borrowed_tokens, INPUT + MAX_OUTPUT);
    held
}

fn classes(c: &mut Criterion) {
    const GROUP: &str = "classes";
    let mut g = c.benchmark_group(GROUP);

    // One thread, one pair per iteration.
    g.throughput(Throughput::Elements(1));
    let ours_t = tokens_bulkhead();
    let d = token_demand();
    g.bench_function("ours_slots_tokens", |b| {
        b.iter(|| black_box(ours_pair(black_box(&ours_t), d)))
    });

    let protected = classes_bulkhead();
    let dp = class_demand(&protected, "premium");
    {
        let a = protected.try_acquire(dp).expect("free");
        assert!(!a.resources().borrowed_concurrency && a.resources().borrowed_tokens == 0);
    }
    g.bench_function("protected", |b| {
        b.iter(|| black_box(ours_pair(black_box(&protected), dp)))
    });

    let borrowing = classes_bulkhead();
    let held = use_up_floors(&borrowing, "batch");
    let db = class_demand(&borrowing, "batch");
    g.bench_function("borrowing", |b| {
        b.iter(|| black_box(ours_pair(black_box(&borrowing), db)))
    });

    // Two threads, one pair on each per iteration.
    g.throughput(Throughput::Elements(2));
    let locked = LockBulkhead::new(u64::from(CLASS_MAX_CONCURRENT), BUDGET);
    let r = INPUT + MAX_OUTPUT;
    bench_two(&mut g, GROUP, "two_threads_parking_lot", |iters| {
        two_thread_run(&locked, iters, |l| l.pair(black_box(r)))
    });

    let sem = Semaphore::new(MAX_CONCURRENT as usize);
    bench_two(&mut g, GROUP, "two_threads_tokio", |iters| {
        two_thread_run(&sem, iters, tokio_pair)
    });

    bench_two(&mut g, GROUP, "two_threads_ours_slots_tokens", |iters| {
        two_thread_run(&ours_t, iters, |o| ours_pair(o, d))
    });

    let two = [
        class_demand(&protected, "premium"),
        class_demand(&protected, "standard"),
    ];
    bench_two(&mut g, GROUP, "two_threads_protected", |iters| {
        two_thread_run_indexed(&protected, iters, |o, i| ours_pair(o, two[i]))
    });

    // Both threads in one class, inside its floors: one class word written by both.
    bench_two(&mut g, GROUP, "two_threads_protected_same_class", |iters| {
        two_thread_run(&protected, iters, |o| ours_pair(o, dp))
    });

    let held_two = [
        use_up_floors(&borrowing, "premium"),
        use_up_floors(&borrowing, "standard"),
    ];
    let two_b = [
        class_demand(&borrowing, "premium"),
        class_demand(&borrowing, "standard"),
    ];
    bench_two(&mut g, GROUP, "two_threads_borrowing", |iters| {
        two_thread_run_indexed(&borrowing, iters, |o, i| ours_pair(o, two_b[i]))
    });

    // Both threads borrow in one class (`batch`, whose floors `held` uses up): the shared word
    // and one class word written by both.
    bench_two(&mut g, GROUP, "two_threads_borrowing_same_class", |iters| {
        two_thread_run(&borrowing, iters, |o| ours_pair(o, db))
    });

    g.finish();
    let s = protected.stats();
    assert_eq!((s.rejected, s.in_flight), (0, 0));
    let cs = s.classes.expect("classes");
    assert!(cs.classes.iter().all(|c| c.total_borrowed_admissions == 0));
    let s = borrowing.stats();
    assert_eq!(s.rejected, 0);
    assert_eq!(s.in_flight, 3 * u64::from(CLASS_FLOOR));
    let cs = s.classes.expect("classes");
    // Every benchmarked pair borrowed; only the held admissions (and one probe per class) were
    // inside the floors.
    for c in &cs.classes {
        assert_eq!(
            c.admitted - c.total_borrowed_admissions,
            u64::from(CLASS_FLOOR)
        );
    }
    drop((held, held_two));
    assert_eq!(borrowing.stats().in_flight, 0);
    let s = ours_t.stats();
    assert_eq!((s.rejected, s.in_flight), (0, 0));
}

/// The criterion group of this target (in a module: the macro's function has no doc comment).
mod group {
    use super::{classes, config, refused, two_threads, uncontended_pair};
    criterion::criterion_group! {
        name = core_benches;
        config = config();
        targets = uncontended_pair, two_threads, refused, classes
    }
}
criterion_main!(group::core_benches);
