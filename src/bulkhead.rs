//! The [`Bulkhead`]: construction, the lock-free decision, reconfiguration, close and stats.

use crate::admission::Admission;
use crate::classes::{ClassId, ClassLimits, ClassTable, UnknownClass, MAX_CLASSES};
use crate::demand::{Demand, Reservation};
use crate::error::{ApplyLimitsError, ConfigError, ConfigProblem};
use crate::id::AdmissionId;
use crate::limits::{BudgetLimits, Hot, LimitsSnapshot, Ring};
use crate::rejection::{CapacityDetail, RejectReason, Rejection, TokenCapacity};
use crate::shared::{Canonical, Handle, Shared};
use crate::state::{Word, CLOSED};
use crate::stats::{Counters, Stats, TokenStats, Totals};
use crate::sync::{lock, Ordering};
use crate::Priority;
use std::fmt;
use std::time::Duration;

/// Builds a [`Bulkhead`] from validated settings.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::builder()
///     .max_concurrent(20)
///     .token_budget(50_000)
///     .high_priority_reserve(5_000)
///     .initial_revision(1)
///     .build()
///     .unwrap();
/// assert_eq!(b.limits().revision, 1);
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct BulkheadBuilder {
    max_concurrent: u32,
    max_queue: Option<u32>,
    timeout: Option<Duration>,
    profile: Option<Profile>,
    measure_waits: bool,
    wait_for_tokens: bool,
    budget: Option<u64>,
    reserve: Option<u64>,
    initial_revision: u64,
    classes: Vec<(String, ClassLimits)>,
    default_class: Option<String>,
}

impl BulkheadBuilder {
    /// Global concurrency limit (default 0: a fail-closed start that admits nothing until a
    /// snapshot raises it). At most [`MAX_SLOTS`](crate::MAX_SLOTS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_concurrent(3).build().unwrap().limits().max_concurrent, 3);
    /// ```
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = n;
        self
    }

    /// Wait queue bound (default 0: fail-fast): how many demands `acquire_blocking` and
    /// `acquire` may keep waiting for a slot at once.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_queue(8).build().unwrap().limits().max_queue, 8);
    /// ```
    pub fn max_queue(mut self, n: u32) -> Self {
        self.max_queue = Some(n);
        self
    }

    /// Enables the in-flight token budget `B` (0 is legal: only 0-token demands fit).
    /// At most [`MAX_TOKENS`](crate::MAX_TOKENS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().token_budget(1_000).build().unwrap();
    /// assert_eq!(b.limits().token_budget.unwrap().budget, 1_000);
    /// ```
    pub fn token_budget(mut self, budget: u64) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Tokens reserved for high-priority demands (`H ≤ B` at construction; needs a budget).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::builder().high_priority_reserve(5).build().is_err());
    /// ```
    pub fn high_priority_reserve(mut self, reserve: u64) -> Self {
        self.reserve = Some(reserve);
        self
    }

    /// The revision of the initial limits (default 0).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().initial_revision(7).build().unwrap().limits().revision, 7);
    /// ```
    pub fn initial_revision(mut self, revision: u64) -> Self {
        self.initial_revision = revision;
        self
    }

    /// The default time a waiter stays queued before it gets `timeout` (reference §11's
    /// `timeoutMs`); a per-call [`WaitOptions::timeout`](crate::WaitOptions) wins. A timeout
    /// too large to add to the current instant (`Duration::MAX`) means no deadline.
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(4).timeout(Duration::from_secs(5)).build().unwrap();
    /// assert_eq!(b.default_timeout(), Some(Duration::from_secs(5)));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Times every queue wait for `stats().queue_waits` (total and longest, in ns). Off by
    /// default: two clock reads cost about a tenth of an async hand-off. Waits are counted
    /// either way.
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(2).measure_queue_waits(true).build().unwrap();
    /// assert_eq!(b.stats().queue_waits.total_ns, 0);
    /// ```
    pub fn measure_queue_waits(mut self, on: bool) -> Self {
        self.measure_waits = on;
        self
    }

    /// Lets a demand refused only for tokens wait (default off: fail-fast). With it,
    /// `acquire_blocking` and `acquire` queue a demand that does not fit the token budget, its
    /// class's token ceiling, the other classes' token floors or the high-priority reserve, in
    /// the same bounded FIFO queue as slot waiters, with the same timeout, cancellation, close
    /// and drain semantics, until its tokens and a slot fit. Strict FIFO: while anyone waits,
    /// newcomers queue behind (or, with `try_acquire`, are refused), so a large demand at the
    /// head is never starved by small ones, as with tokio's `Semaphore::acquire_many`.
    /// Releases, usage refunds and raised budgets hand their tokens to the head first. A demand
    /// that could not fit even with nothing held is still refused at once, and a
    /// reconfiguration that shrinks the budget below a waiter's demand answers it with
    /// `budget_limit`. `try_acquire` never waits. See `src/token_wait.rs` for the protocol.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation, WaitOptions};
    /// let b = Bulkhead::builder().max_concurrent(4).max_queue(4).token_budget(1_000)
    ///     .wait_for_tokens(true).build().unwrap();
    /// let big = b.try_acquire(Demand::tokens(Reservation::new(0, 800).unwrap())).unwrap();
    /// let b2 = b.clone();
    /// let waiter = std::thread::spawn(move || {
    ///     let d = Demand::tokens(Reservation::new(0, 500).unwrap());
    ///     b2.acquire_blocking(d, WaitOptions::default()).map(|a| a.held())
    /// });
    /// while b.stats().pending == 0 { std::thread::yield_now() } // it waits for tokens
    /// drop(big); // hands 500 of the 800 tokens to the waiter
    /// assert_eq!(waiter.join().unwrap(), Ok(500));
    /// ```
    pub fn wait_for_tokens(mut self, on: bool) -> Self {
        self.wait_for_tokens = on;
        self
    }

    /// Applies a profile (reference §11): [`Profile::Interactive`] is fail-fast (no queue),
    /// [`Profile::Batch`] queues 20 with a 30 s timeout. Explicit `max_queue` and `timeout`
    /// win, whatever the order of the calls.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Profile};
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(4).profile(Profile::Batch).build().unwrap();
    /// assert_eq!((b.limits().max_queue, b.default_timeout()), (20, Some(Duration::from_secs(30))));
    /// let b = Bulkhead::builder().max_queue(3).max_concurrent(4).profile(Profile::Batch).build().unwrap();
    /// assert_eq!(b.limits().max_queue, 3);
    /// ```
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Adds an admission class (in order; at most [`MAX_CLASSES`](crate::MAX_CLASSES)). With
    /// classes, [`default_class`](Self::default_class) is required.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(12).token_budget(24_000)
    ///     .class("premium", ClassLimits { protected_concurrent: 6, max_concurrent: Some(10), protected_tokens: 12_000, max_tokens: Some(20_000) })
    ///     .class("standard", ClassLimits { protected_concurrent: 2, max_concurrent: Some(6), protected_tokens: 4_000, max_tokens: Some(10_000) })
    ///     .default_class("standard")
    ///     .build().unwrap();
    /// assert_eq!(b.class_names(), ["premium", "standard"]);
    /// ```
    pub fn class(mut self, name: impl Into<String>, limits: ClassLimits) -> Self {
        self.classes.push((name.into(), limits));
        self
    }

    /// The class of demands that name none.
    ///
    /// ```
    /// # use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let e = Bulkhead::builder().class("a", ClassLimits::default()).default_class("missing").build().unwrap_err();
    /// assert_eq!(e.field, "default_class");
    /// ```
    pub fn default_class(mut self, name: impl Into<String>) -> Self {
        self.default_class = Some(name.into());
        self
    }

    /// Validates every field and builds the bulkhead.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first invalid field and the bound it broke. Nothing is
    /// built.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let err = Bulkhead::builder().token_budget(1 << 40).build().unwrap_err();
    /// assert_eq!(err.field, "token_budget.budget");
    /// ```
    pub fn build(self) -> Result<Bulkhead, ConfigError> {
        let token_budget = match (self.budget, self.reserve) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(ConfigError {
                    field: "token_budget.high_priority_reserve",
                    problem: ConfigProblem::NeedsTokenBudget,
                })
            }
            (Some(budget), reserve) => Some(BudgetLimits {
                budget,
                high_priority_reserve: reserve.unwrap_or(0),
            }),
        };
        let table_err = |field, why| {
            Err(ConfigError {
                field,
                problem: ConfigProblem::ClassTable(why),
            })
        };
        let mut table = ClassTable::default();
        let mut names = Vec::new();
        for (name, limits) in &self.classes {
            let name = name.trim();
            if name.is_empty() {
                return table_err("classes", "a class name must not be empty");
            }
            if names.iter().any(|n: &String| n == name) {
                return table_err("classes", "class names must be unique");
            }
            if !table.push(*limits) {
                return Err(ConfigError {
                    field: "classes",
                    problem: ConfigProblem::TooLarge {
                        value: self.classes.len() as u64,
                        max: MAX_CLASSES as u64,
                    },
                });
            }
            names.push(name.to_owned());
        }
        let default_class = match (&self.default_class, names.is_empty()) {
            (None, true) => 0,
            (Some(_), true) => return table_err("default_class", "needs admission classes"),
            (None, false) => {
                return table_err("default_class", "is required with admission classes")
            }
            (Some(d), false) => match names.iter().position(|n| n == d.trim()) {
                Some(i) => i,
                None => return table_err("default_class", "must name a configured class"),
            },
        };
        let first = LimitsSnapshot {
            revision: self.initial_revision,
            max_concurrent: self.max_concurrent,
            max_queue: self
                .max_queue
                .unwrap_or(self.profile.map_or(0, |p| p.max_queue())),
            token_budget,
            classes: table,
        };
        first.validate(token_budget.is_some(), &names)?;
        if let Some(b) = token_budget {
            if b.high_priority_reserve > b.budget {
                return Err(ConfigError {
                    field: "token_budget.high_priority_reserve",
                    problem: ConfigProblem::ReserveExceedsBudget {
                        reserve: b.high_priority_reserve,
                        budget: b.budget,
                    },
                });
            }
        }
        let shared = Handle::new(
            Ring::new(&first),
            Canonical {
                current: first,
                tag: 0,
            },
            token_budget.is_some(),
            names,
            default_class,
            crate::shared::WaitSettings {
                default_timeout: self.timeout.or(self.profile.and_then(Profile::timeout)),
                measure_waits: self.measure_waits,
                wait_for_tokens: self.wait_for_tokens,
            },
        );
        Ok(Bulkhead { shared })
    }
}

/// A preset of queueing behaviour (reference §11).
///
/// ```
/// use llm_bulkhead::Profile;
/// assert_eq!(Profile::Batch.max_queue(), 20);
/// assert_eq!(Profile::Interactive.max_queue(), 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Profile {
    /// Fail fast: no queue, no timeout.
    Interactive,
    /// Queue up to 20 waiters, each for at most 30 s.
    Batch,
}

impl Profile {
    /// The queue bound of the profile.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::Profile::Batch.max_queue(), 20);
    /// ```
    pub fn max_queue(self) -> u32 {
        match self {
            Profile::Interactive => 0,
            Profile::Batch => 20,
        }
    }

    /// The waiter timeout of the profile.
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(llm_bulkhead::Profile::Batch.timeout(), Some(Duration::from_secs(30)));
    /// ```
    pub fn timeout(self) -> Option<Duration> {
        match self {
            Profile::Interactive => None,
            Profile::Batch => Some(Duration::from_secs(30)),
        }
    }
}

/// What `apply_limits` replaced.
///
/// ```
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::new(2).unwrap();
/// let change = b.apply_limits(b.limits().with_revision(1).with_max_concurrent(5)).unwrap();
/// assert_eq!((change.previous.max_concurrent, change.current.max_concurrent), (2, 5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LimitsChange {
    /// The snapshot that was current before.
    pub previous: LimitsSnapshot,
    /// The snapshot now current.
    pub current: LimitsSnapshot,
}

/// A lock-free admission controller: global concurrency slots and an in-flight token budget.
///
/// Cloning a `Bulkhead` gives another handle to the same state. Every decision is one CAS on
/// one packed word (see [`crate::state`]); limits are read from a ring of snapshots named by a
/// tag in that word (see [`crate::limits`]).
///
/// ```
/// use llm_bulkhead::{Bulkhead, Demand, Reservation, RejectReason, Usage};
/// let b = Bulkhead::builder().max_concurrent(2).token_budget(2_400).high_priority_reserve(400)
///     .build().unwrap();
/// let d = Demand::tokens(Reservation::new(100, 1_000).unwrap());
/// let first = b.try_acquire(d).unwrap();                       // 1100 ≤ 2000
/// let refused = b.try_acquire(d).unwrap_err();                 // 2200 > 2000
/// assert_eq!(refused.reason, RejectReason::BudgetLimit);
/// let high = b.try_acquire(d.with_priority(llm_bulkhead::Priority::High)).unwrap(); // 2200 ≤ 2400
/// first.release(Some(Usage::new(90, 300))).unwrap();
/// drop(high);
/// assert_eq!(b.stats().in_flight, 0);
/// ```
///
/// # Memory ordering
///
/// A successful admission synchronises with the release whose capacity it reuses and with the
/// `apply_limits` that installed the limits it was decided under (the admission CAS is
/// `AcqRel`, and so are the release's CAS and a hand-off's). `close` is `SeqCst`: once it
/// returns, no admission can succeed. Statistics are `Relaxed` bookkeeping (see [`crate::stats`]).
#[derive(Clone)]
pub struct Bulkhead {
    pub(crate) shared: Handle,
}

enum Decision {
    Admit(Word),
    Refuse(RejectReason),
}

#[inline]
fn decide(w: Word, lim: &Hot, r: u64, priority: Priority) -> Decision {
    if w.closed() {
        return Decision::Refuse(RejectReason::Shutdown);
    }
    if let Some(eff) = lim.effective(priority) {
        if w.tokens().saturating_add(r) > eff {
            return Decision::Refuse(RejectReason::BudgetLimit);
        }
    }
    // Row 6 (and, for fail-fast callers, the no-barging rule while waiters are queued).
    if w.slots() >= lim.max_concurrent || w.waiters() {
        return Decision::Refuse(RejectReason::ConcurrencyLimit);
    }
    Decision::Admit(w.plus(r))
}

impl Bulkhead {
    /// A builder with every setting at its default.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().max_concurrent(1).build().unwrap();
    /// assert_eq!(b.limits().max_concurrent, 1);
    /// ```
    pub fn builder() -> BulkheadBuilder {
        BulkheadBuilder::default()
    }

    /// A bulkhead with `max_concurrent` slots, no queue and no token budget.
    ///
    /// # Errors
    /// [`ConfigError`] when `max_concurrent` exceeds [`MAX_SLOTS`](crate::MAX_SLOTS).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::new(70_000).is_err());
    /// ```
    pub fn new(max_concurrent: u32) -> Result<Bulkhead, ConfigError> {
        Bulkhead::builder().max_concurrent(max_concurrent).build()
    }

    /// Admits `demand` now or refuses it; never waits, never takes a lock.
    ///
    /// Checks, first failure wins (CONTRACT.md §2): closed → `shutdown`; budget configured and
    /// `T + r > eff(priority)` → `budget_limit`; with classes, the class's token and
    /// concurrency ceilings (`admission_class`) and the other classes' floors
    /// (`admission_class_protection`); no free slot (or waiters queued) → `concurrency_limit`.
    /// Without classes the slot and the reservation are taken in one CAS; with classes the
    /// decision is the multi-word protocol described in [`crate::classed`].
    ///
    /// # Errors
    /// A [`Rejection`] explained by the state the decision saw.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(1).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
    /// drop(a);
    /// assert!(b.try_acquire(Demand::slot()).is_ok());
    /// ```
    // Always inlined: callers then keep the admission in registers instead of writing the
    // whole `Result` to memory, which measured 15.5 → ~11 ns per pair. The refusal path is
    // out of line (`refuse`), so the inlined code is the decision, one CAS and the guard.
    #[inline(always)]
    pub fn try_acquire(&self, demand: Demand) -> Result<Admission, Rejection> {
        let shared = &*self.shared;
        let reservation = if shared.has_budget {
            Some(demand.reservation().unwrap_or(Reservation::ZERO))
        } else {
            None
        };
        let r = reservation.map_or(0, |x| x.total());
        let priority = demand.priority();
        // Both paths end in the few scalars of `Granted`, and the admission is built once, here:
        // merging two whole `Admission` values (one from an out-of-line call) made the compiler
        // move the admission through memory in a way that stalled on store forwarding.
        let g = if shared.classed {
            self.try_acquire_classed(demand.class(), r, priority)?
        } else {
            loop {
                match self.try_decide(r, priority) {
                    Ok(g) => break g,
                    Err((w, lim, reason)) => {
                        if reason == RejectReason::ConcurrencyLimit
                            && w.waiters()
                            && w.slots() < lim.max_concurrent
                        {
                            // The flag may be up only for `drain` callers.
                            if let Some(g) =
                                crate::waiting::admit_if_nobody_waits(self, r, priority)
                            {
                                break g;
                            }
                        }
                        if let Some(rejection) = self.refusal(w, &lim, reason, r, priority) {
                            return Err(rejection);
                        }
                    }
                }
            }
        };
        Ok(self.admission_from(g, priority, reservation))
    }

    /// Builds the admission of a successful decision.
    #[inline(always)]
    pub(crate) fn admission_from(
        &self,
        g: Granted,
        priority: Priority,
        reservation: Option<Reservation>,
    ) -> Admission {
        let id = AdmissionId::new(self.shared.id_prefix, g.key, g.n);
        // The only event cost on the fast path: one relaxed load (`crate::events`). The hook
        // gets copies, not the admission: taking its address would keep it in memory. The
        // admission remembers the answer, so its release reads no flag.
        let observed = self.shared.events.on();
        if observed {
            crate::events::admitted(&self.shared, id, g.revision, priority, reservation, g.class);
        }
        Admission::new(
            // SAFETY: `g` is a slot just taken (or handed over) for this admission alone.
            unsafe { self.shared.slot_ref() },
            id,
            g.revision,
            priority,
            reservation,
            g.class,
            observed,
        )
    }

    /// The no-class fast decision: rows 0, 1 and 6 in one CAS. `Err` carries the word and the
    /// limits that refused, for [`Bulkhead::refusal`] (which re-checks the tag).
    #[inline(always)]
    pub(crate) fn try_decide(
        &self,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, (Word, Hot, RejectReason)> {
        let shared = &*self.shared;
        let word = &*shared.word;
        // Before the first read of the tag (`crate::grace`): no install can bring the tag
        // back to `w`'s while this decision is in progress. The marker is in this thread's
        // counters entry, which the admission is counted in anyway (one lookup for both); the
        // handle behind `&self` keeps it alive for the whole decision.
        let c = shared.counters.local(Counters::new);
        let _op = crate::grace::enter_decision(c);
        let mut w = Word(word.load(Ordering::Acquire));
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            let lim = shared.ring.read(w.tag());
            match decide(w, &lim, r, priority) {
                Decision::Admit(next) => {
                    crate::sync::pause(crate::sync::PausePoint::DecisionCas);
                    match word.compare_exchange_weak(
                        w.0,
                        next.0,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Ok(self.count_admission_in(c, lim.revision, r)),
                        Err(actual) => {
                            backoff.spin();
                            w = Word(actual);
                        }
                    }
                }
                Decision::Refuse(reason) => return Err((w, lim, reason)),
            }
        }
    }

    /// Counts an admission (no class) and returns what builds it.
    #[inline(always)]
    pub(crate) fn count_admission(&self, revision: u64, r: u64) -> Granted {
        self.count_admission_in(self.shared.counters.local(Counters::new), revision, r)
    }

    /// [`count_admission`](Self::count_admission) into this thread's entry `c`.
    #[inline(always)]
    fn count_admission_in(&self, c: &Counters, revision: u64, r: u64) -> Granted {
        let shared = &*self.shared;
        let n = c.admitted.add(1);
        if shared.has_budget {
            c.total_reserved.add(r);
        }
        Granted {
            revision,
            key: c.key,
            n,
            class: Default::default(),
        }
    }

    /// Counts and explains a no-class refusal decided on `w`; `None` if the tag moved since
    /// (the limits may have been torn: decide again).
    #[inline(always)]
    pub(crate) fn refusal(
        &self,
        w: Word,
        lim: &Hot,
        reason: RejectReason,
        r: u64,
        priority: Priority,
    ) -> Option<Rejection> {
        refuse(&self.shared, w, lim, reason, r, priority).ok()
    }

    /// Counts and explains the refusal of a waiter (or of a request refused before it could
    /// wait: `aborted`), with the state as it is now.
    #[cold]
    pub(crate) fn waiter_refusal(&self, reason: RejectReason, demand: &Demand) -> Rejection {
        let shared = &*self.shared;
        let r = if shared.has_budget {
            demand.reservation().unwrap_or(Reservation::ZERO).total()
        } else {
            0
        };
        if shared.classed {
            let constraint = match reason {
                RejectReason::Shutdown | RejectReason::Aborted => None,
                _ => Some(crate::rejection::Constraint::Global),
            };
            let k = self.class_index(demand.class());
            let mut rej = self.class_answer_refusal(k, reason, constraint, r, demand.priority());
            rej.detail.pending = crate::waiting::pending(shared) as u64;
            return rej;
        }
        let w = Word(shared.word.load(Ordering::Acquire));
        let lim = shared.ring.read(w.tag());
        let c = shared.counters.local(Counters::new);
        c.rejected[reason.index()].add(1);
        let (slots, tokens) = if shared.classed {
            let (_, g, t) = crate::classed::collect(shared);
            (g, t)
        } else {
            (w.slots(), w.tokens())
        };
        let mut rej = rejection(slots, tokens, &lim, reason, r, demand.priority());
        rej.detail.pending = crate::waiting::pending(shared) as u64;
        if shared.classed && reason != RejectReason::Shutdown && reason != RejectReason::Aborted {
            rej.constraint = Some(crate::rejection::Constraint::Global);
        }
        let class = shared
            .classed
            .then(|| demand.class().map_or(shared.default_class, |c| c.index()));
        crate::events::rejected(shared, class, &rej);
        rej
    }

    /// Installs a newer limits snapshot atomically (CONTRACT.md §6).
    ///
    /// Order: a revision not newer than the current one is refused first, whatever else the
    /// snapshot holds; then every field is validated; then the snapshot is installed with one
    /// tag bump of the state word. Lower limits shrink by attrition (nothing in flight is
    /// revoked); `max_concurrent = 0` is a kill switch. Once this returns, no decision made
    /// against an older snapshot can succeed. It works after `close()` as well.
    ///
    /// # Errors
    /// [`ApplyLimitsError::StaleRevision`] or [`ApplyLimitsError::Invalid`]; nothing changed.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(2).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// b.apply_limits(b.limits().with_revision(1).with_max_concurrent(0)).unwrap(); // kill switch
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::ConcurrencyLimit);
    /// assert_eq!(a.revision(), 0); // admitted work keeps its revision
    /// ```
    pub fn apply_limits(&self, next: LimitsSnapshot) -> Result<LimitsChange, ApplyLimitsError> {
        let shared = &*self.shared;
        let mut canon = lock(&shared.reconfig);
        if next.revision <= canon.current.revision {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: next.revision,
                current: Box::new(canon.current),
            });
        }
        next.validate(shared.has_budget, &shared.class_names)?;
        let tag = canon.tag.wrapping_add(1);
        shared.ring.write(tag, &next);
        // With classes, the tag bump also advances U and V by every raise of a floor; the
        // classes then migrate to the new floors (`crate::classed`, "Reconfiguration").
        let advance = if shared.classed {
            crate::classed::floor_advance(&canon.current, &next)
        } else {
            0
        };
        let word = &*shared.word;
        let mut w = Word(word.load(Ordering::Acquire));
        loop {
            debug_assert_eq!(w.tag(), canon.tag % (1 << crate::state::TAG_BITS));
            match word.compare_exchange_weak(
                w.0,
                w.with_next_tag().0 + advance,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => w = Word(actual),
            }
        }
        canon.tag = tag;
        let mut visit = false;
        for k in 0..shared.class_words.len() {
            visit |= crate::classed::migrate(shared, k, tag);
        }
        // No operation that read the previous tag is still in progress once this returns, so
        // no tag value or ring slot is reused under anyone (`crate::grace`). Under the lock:
        // the next install waits for this one's grace period.
        crate::grace::grace_period(shared);
        let previous = std::mem::replace(&mut canon.current, next);
        drop(canon);
        // Token waiting: a waiter whose demand can no longer fit at all is answered now
        // (`crate::token_wait`); a no-op without the option.
        if Word(shared.word.load(Ordering::Acquire)).waiters() {
            crate::token_wait::sweep_never_fit(shared);
        }
        // A raised limit admits queued waiters at once (CONTRACT.md §6).
        let waiters = Word(shared.word.load(Ordering::Acquire)).waiters();
        if shared.classed {
            if waiters || visit {
                crate::waiting::pump_classed(shared);
            }
        } else if waiters {
            crate::waiting::pump(shared);
        }
        let change = LimitsChange {
            previous,
            current: next,
        };
        crate::events::emit(shared, || {
            crate::events::Event::Reconfigure(Box::new(change))
        });
        Ok(change)
    }

    /// Replaces the token budget, keeping every other limit (a new snapshot with revision + 1).
    ///
    /// # Errors
    /// [`ConfigProblem::MustBeOmitted`] without a budget; a range error above
    /// [`MAX_TOKENS`](crate::MAX_TOKENS); a range error on `revision` if the revision is already
    /// [`MAX_REVISION`](crate::MAX_REVISION).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().token_budget(100).initial_revision(7).build().unwrap();
    /// b.set_budget(50).unwrap();
    /// assert_eq!((b.limits().revision, b.limits().token_budget.unwrap().budget), (8, 50));
    /// ```
    pub fn set_budget(&self, budget: u64) -> Result<LimitsChange, ApplyLimitsError> {
        // Holding no lock between the read and the apply is fine: a concurrent apply makes this
        // one stale, which is reported, not lost.
        let cur = self.limits();
        let Some(b) = cur.token_budget else {
            return Err(ConfigError {
                field: "token_budget",
                problem: ConfigProblem::MustBeOmitted,
            }
            .into());
        };
        let Some(rev) = cur.revision.checked_add(1) else {
            return Err(ApplyLimitsError::StaleRevision {
                attempted: cur.revision,
                current: Box::new(cur),
            });
        };
        self.apply_limits(cur.with_revision(rev).with_token_budget(Some(BudgetLimits {
            budget,
            high_priority_reserve: b.high_priority_reserve,
        })))
    }

    /// Closes the bulkhead: idempotent and irreversible. Every later demand is refused with
    /// `shutdown`; admitted work may still report usage and release.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, RejectReason};
    /// let b = Bulkhead::new(1).unwrap();
    /// let a = b.try_acquire(Demand::slot()).unwrap();
    /// b.close();
    /// b.close();
    /// assert_eq!(b.try_acquire(Demand::slot()).unwrap_err().reason, RejectReason::Shutdown);
    /// drop(a);
    /// assert!(b.stats().closed);
    /// ```
    pub fn close(&self) {
        self.shared.word.fetch_or(CLOSED, Ordering::SeqCst);
        // With classes, a protected decision's class CAS and its final load of this word are
        // ordered against this RMW by the `SeqCst` total order (`crate::classed`).
        crate::sync::loom_sc_fence();
        crate::waiting::close_queue(&self.shared);
    }

    /// Whether `close()` was called.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::new(1).unwrap();
    /// assert!(!b.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        Word(self.shared.word.load(Ordering::Acquire)).closed()
    }

    /// The current limits snapshot.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::new(3).unwrap().limits().max_concurrent, 3);
    /// ```
    pub fn limits(&self) -> LimitsSnapshot {
        lock(&self.shared.reconfig).current
    }

    /// A snapshot of state and counters. State fields come from one read of the state word;
    /// counters are summed over threads (see [`crate::stats`] for what is exact when).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(4).token_budget(1_200).build().unwrap();
    /// let a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// let s = b.stats();
    /// assert_eq!((s.in_flight, s.token_budget.unwrap().available), (1, 100));
    /// # drop(a);
    /// ```
    pub fn stats(&self) -> Stats {
        let shared = &*self.shared;
        let limits = self.limits();
        let w = Word(shared.word.load(Ordering::Acquire));
        let mut t = Totals::default();
        let n = shared.class_words.len();
        shared.counters.for_each(|c| t.add(c, n));
        let rejected = t.rejected.total();
        let abandoned_open = t.abandoned.saturating_sub(t.abandoned_settled);
        // With classes the totals are the sums of the class words (`crate::classed`).
        let (state, slots, tokens) = if shared.classed {
            crate::classed::collect(shared)
        } else {
            (Vec::new(), w.slots(), w.tokens())
        };
        // A class release books nothing: released = admitted − in flight − abandoned and not
        // yet released.
        for (tt, &(n, _)) in t.classes.iter_mut().zip(&state) {
            let open = tt.abandoned.saturating_sub(tt.abandoned_settled);
            tt.released = tt.admitted.saturating_sub(n + open);
        }
        let classes = crate::stats::classes_stats(
            &limits,
            &shared.class_names,
            shared.default_class,
            &state,
            slots,
            tokens,
            &t.classes[..state.len()],
        );
        Stats {
            limits,
            closed: w.closed(),
            in_flight: slots,
            admissions_in_flight: slots + abandoned_open,
            pending: crate::waiting::pending(shared) as u64,
            queued_total: crate::waiting::queued_total(shared),
            queue_waits: t.waits,
            available_slots: u64::from(limits.max_concurrent).saturating_sub(slots),
            admitted: t.admitted,
            released: t.admitted.saturating_sub(slots + abandoned_open),
            rejected,
            rejected_by_reason: t.rejected,
            token_budget: limits.token_budget.map(|b| TokenStats {
                budget: b.budget,
                high_priority_reserve: b.high_priority_reserve,
                in_flight_tokens: tokens,
                available: b.budget.saturating_sub(tokens),
                total_reserved: t.total_reserved,
                total_consumed: t.total_consumed,
                total_refunded: t.total_refunded,
                total_overrun: t.total_overrun,
            }),
            borrowed_concurrency_abandoned: t.abandoned,
            borrowed_concurrency_abandoned_by_cause: crate::stats::AbandonCauses {
                manual: t.abandoned.saturating_sub(t.abandoned_deadline),
                deadline: t.abandoned_deadline,
            },
            classes,
            subscriber_panics: shared.events.panics(),
            observe: t.observe(),
        }
    }
}

/// The refusal path, out of line so that the inlined fast path stays small: re-checks that the
/// limits were untorn (the tag has not moved since `w`; see `crate::limits`), counts the
/// refusal and builds the rejection, or returns the new word to retry with.
#[cold]
#[inline(never)]
fn refuse(
    shared: &Shared,
    w: Word,
    lim: &Hot,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Result<Rejection, Word> {
    let now = Word(shared.word.load(Ordering::Acquire));
    if now.tag() != w.tag() {
        return Err(now);
    }
    shared.counters.local(Counters::new).rejected[reason.index()].add(1);
    // Built in the return value's place; the hook reads it there (only when subscribed).
    let out = Ok(rejection(w.slots(), w.tokens(), lim, reason, r, priority));
    if let Ok(rej) = &out {
        crate::events::rejected(shared, None, rej);
    }
    out
}

pub(crate) fn rejection(
    slots: u64,
    tokens: u64,
    lim: &Hot,
    reason: RejectReason,
    r: u64,
    priority: Priority,
) -> Rejection {
    Rejection {
        reason,
        constraint: None,
        revision: lim.revision,
        detail: CapacityDetail {
            in_flight: slots,
            pending: 0,
            max_concurrent: lim.max_concurrent,
            max_queue: lim.max_queue,
            token_budget: lim.budget.map(|budget| {
                let eff = lim.effective(priority).unwrap_or(budget);
                TokenCapacity {
                    budget,
                    in_flight_tokens: tokens,
                    effective_budget: eff,
                    available: eff.saturating_sub(tokens),
                    requested: r,
                }
            }),
            classes: None,
        },
    }
}

/// What a successful decision hands back, to build the admission from (see `try_acquire`).
pub(crate) struct Granted {
    revision: u64,
    key: u64,
    n: u64,
    class: crate::admission::ClassCode,
}

impl Bulkhead {
    /// The class path of `try_acquire` (the protocol of [`crate::classed`]). Out of line, so
    /// the no-class path does not carry it.
    #[inline(never)]
    fn try_acquire_classed(
        &self,
        class: Option<ClassId>,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, Rejection> {
        let shared = &*self.shared;
        let k = self.class_index(class);
        match crate::classed::try_fast(shared, k, r, priority) {
            Some(a) => Ok(self.count_class_admission(k, r, a.revision, a.resources)),
            None => self.try_acquire_classed_contended(k, r, priority),
        }
    }

    /// The classed decision after the fast attempt gave up: the full protocol, and the
    /// refusal if it refuses (out of line: its result carries the collect that explains it).
    #[inline(never)]
    fn try_acquire_classed_contended(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, Rejection> {
        match crate::classed::acquire_after_fast(&self.shared, k, r, priority) {
            Ok(a) => Ok(self.count_class_admission(k, r, a.revision, a.resources)),
            Err(f) => Err(self.class_refusal(k, f, r, priority)),
        }
    }

    /// The class index a demand's class resolves to (the default class when it names none;
    /// 0 without classes).
    #[inline]
    pub(crate) fn class_index(&self, class: Option<ClassId>) -> usize {
        let shared = &*self.shared;
        match class {
            Some(c) if c.index() < shared.class_words.len() => c.index(),
            _ => shared.default_class,
        }
    }

    /// Counts a class admission of `r` tokens in class `k` (its attribution `resources`).
    pub(crate) fn count_class_admission(
        &self,
        k: usize,
        r: u64,
        revision: u64,
        resources: crate::classes::Resources,
    ) -> Granted {
        let shared = &*self.shared;
        let c = shared.counters.local(Counters::new);
        let n = c.admitted.add(1);
        let cc = &c.classes[k];
        cc.admitted.add(1);
        if resources.borrowed_concurrency {
            cc.borrowed_admissions.add(1);
        }
        if shared.has_budget {
            c.total_reserved.add(r);
            cc.reserved.add(r);
            if resources.borrowed_tokens > 0 {
                cc.borrowed_tokens.add(resources.borrowed_tokens);
            }
        }
        Granted {
            revision,
            key: c.key,
            n,
            class: Admission::class_code(k, resources),
        }
    }

    /// Counts and explains the refusal of a class waiter (or of a class request refused while
    /// entering the queue) with `reason` and `constraint`, from a collect of the state now.
    /// `detail.pending` is left for the caller.
    #[cold]
    pub(crate) fn class_answer_refusal(
        &self,
        k: usize,
        reason: RejectReason,
        constraint: Option<crate::rejection::Constraint>,
        r: u64,
        priority: Priority,
    ) -> Rejection {
        let f = crate::classed::describe(&self.shared, k, priority, reason, constraint);
        self.class_refusal(k, f, r, priority)
    }

    /// Counts and explains a class refusal from the collect that decided its reason.
    #[cold]
    #[inline(never)]
    pub(crate) fn class_refusal(
        &self,
        k: usize,
        f: crate::classed::Refused,
        r: u64,
        priority: Priority,
    ) -> Rejection {
        let shared = &*self.shared;
        let c = shared.counters.local(Counters::new);
        c.rejected[f.reason.index()].add(1);
        c.classes[k].rejected[f.reason.index()].add(1);
        let mut rej = rejection(f.summary.g, f.summary.t, &f.lim, f.reason, r, priority);
        rej.constraint = f.constraint;
        if f.reason != RejectReason::Shutdown {
            let mut detail = f.summary.detail(&shared.class_names[k], r);
            if let Some((slots, tokens)) = f.stored_shared {
                let c = &mut detail.shared.concurrency;
                c.in_use = c.in_use.max(slots);
                c.available = c.capacity.saturating_sub(c.in_use);
                if let Some(t) = detail.shared.token_budget.as_mut() {
                    t.in_use = t.in_use.max(tokens);
                    t.available = t.capacity.saturating_sub(t.in_use);
                }
            }
            rej.detail.classes = Some(Box::new(detail));
        }
        crate::events::rejected(shared, Some(k), &rej);
        rej
    }

    /// The class named `name`.
    ///
    /// # Errors
    /// [`UnknownClass`] when the table has no such class (classes are never created on use).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().class("batch", ClassLimits::default()).default_class("batch").build().unwrap();
    /// assert!(b.class_id("batch").is_ok());
    /// assert!(b.class_id("tenant-42").is_err());
    /// ```
    pub fn class_id(&self, name: &str) -> Result<ClassId, UnknownClass> {
        // Names are stored trimmed (the builder trims them), so look them up trimmed too.
        let key = name.trim();
        self.shared
            .class_names
            .iter()
            .position(|n| n == key)
            .map(|i| ClassId(i as u8))
            .ok_or_else(|| UnknownClass(name.to_owned()))
    }

    /// Whether a demand refused only for tokens waits in the queue
    /// ([`BulkheadBuilder::wait_for_tokens`]).
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// assert!(!Bulkhead::new(1).unwrap().waits_for_tokens());
    /// assert!(Bulkhead::builder().max_concurrent(1).wait_for_tokens(true).build().unwrap().waits_for_tokens());
    /// ```
    pub fn waits_for_tokens(&self) -> bool {
        self.shared.wait_for_tokens
    }

    /// The default waiter timeout (from the builder's `timeout` or profile).
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::Bulkhead::new(1).unwrap().default_timeout(), None);
    /// ```
    pub fn default_timeout(&self) -> Option<Duration> {
        self.shared.default_timeout
    }

    /// The class names, in construction order (empty without classes).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::new(1).unwrap().class_names().is_empty());
    /// ```
    pub fn class_names(&self) -> &[String] {
        &self.shared.class_names
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        let w = Word(shared.word.load(Ordering::Relaxed));
        let (slots, tokens) = if shared.classed {
            let (_, g, t) = crate::classed::collect(shared);
            (g, t)
        } else {
            (w.slots(), w.tokens())
        };
        f.debug_struct("Bulkhead")
            .field("in_flight", &slots)
            .field("tokens_in_flight", &tokens)
            .field("closed", &w.closed())
            .finish_non_exhaustive()
    }
}
