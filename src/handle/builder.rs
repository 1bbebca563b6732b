//! [`BulkheadBuilder`] and [`Profile`]: a bulkhead's validated construction settings.

use crate::handle::bulkhead::Bulkhead;
use crate::shared::{Canonical, Handle};
use crate::vocab::class::MAX_CLASSES;
use crate::vocab::class_name;
use crate::vocab::error::{ConfigError, ConfigProblem};
use crate::words::classes::{ClassLimits, ClassTable};
use crate::words::limits::{BudgetLimits, LimitsSnapshot, Ring};
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
    max_concurrent: Option<u32>,
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
    /// Global concurrency limit: required (as in the reference, a forgotten limit is an
    /// error, not a bulkhead that refuses everything). An explicit 0 is the fail-closed start,
    /// admitting nothing until a snapshot raises it. At most [`MAX_SLOTS`](crate::MAX_SLOTS).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ConfigProblem};
    /// assert_eq!(Bulkhead::builder().max_concurrent(3).build().unwrap().limits().max_concurrent, 3);
    /// assert_eq!(Bulkhead::builder().max_concurrent(0).build().unwrap().limits().max_concurrent, 0);
    /// let e = Bulkhead::builder().max_queue(4).build().unwrap_err();
    /// assert_eq!((e.field, &e.problem), ("max_concurrent", &ConfigProblem::Missing));
    /// ```
    pub fn max_concurrent(mut self, n: u32) -> Self {
        self.max_concurrent = Some(n);
        self
    }

    /// Wait queue bound (default 0: fail-fast): how many demands `acquire_blocking` and
    /// `acquire` may keep waiting for a slot at once.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_concurrent(1).max_queue(8).build().unwrap().limits().max_queue, 8);
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
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(1_000).build().unwrap();
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
    /// assert!(Bulkhead::builder().max_concurrent(1).high_priority_reserve(5).build().is_err());
    /// ```
    pub fn high_priority_reserve(mut self, reserve: u64) -> Self {
        self.reserve = Some(reserve);
        self
    }

    /// The revision of the initial limits (default 0).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::builder().max_concurrent(1).initial_revision(7).build().unwrap().limits().revision, 7);
    /// ```
    pub fn initial_revision(mut self, revision: u64) -> Self {
        self.initial_revision = revision;
        self
    }

    /// The default time a waiter stays queued before it is refused with `timeout`
    /// (reference §11's `timeoutMs`). It bounds the wait in the queue only, not the call that
    /// runs once admitted. A per-call [`WaitOptions::timeout`](crate::WaitOptions) wins. A
    /// timeout too large to add to the current instant (`Duration::MAX`) means no deadline.
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let b = Bulkhead::builder().max_concurrent(1).max_queue(4).queue_timeout(Duration::from_secs(5)).build().unwrap();
    /// assert_eq!(b.default_queue_timeout(), Some(Duration::from_secs(5)));
    /// ```
    pub fn queue_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The old name of [`queue_timeout`](Self::queue_timeout), which it calls.
    ///
    /// ```
    /// # #![allow(deprecated)]
    /// # use std::time::Duration;
    /// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(1).queue_timeout(Duration::from_secs(1)).build().unwrap();
    /// assert_eq!(b.default_queue_timeout(), Some(Duration::from_secs(1)));
    /// ```
    #[deprecated(note = "it is the queue wait, not a call timeout: use `queue_timeout`")]
    pub fn timeout(self, timeout: Duration) -> Self {
        self.queue_timeout(timeout)
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
    /// `budget_limit`. `try_acquire` never waits. See `src/protocol/token_wait.rs` for the
    /// protocol.
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
    /// assert_eq!((b.limits().max_queue, b.default_queue_timeout()), (20, Some(Duration::from_secs(30))));
    /// let b = Bulkhead::builder().max_queue(3).max_concurrent(4).profile(Profile::Batch).build().unwrap();
    /// assert_eq!(b.limits().max_queue, 3);
    /// ```
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Adds an admission class (in order; at most [`MAX_CLASSES`]). With
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
    /// let e = Bulkhead::builder().max_concurrent(1).class("a", ClassLimits::default()).default_class("missing").build().unwrap_err();
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
    /// let err = Bulkhead::builder().max_concurrent(1).token_budget(1 << 40).build().unwrap_err();
    /// assert_eq!(err.field, "token_budget.budget");
    /// ```
    pub fn build(self) -> Result<Bulkhead, ConfigError> {
        let Some(max_concurrent) = self.max_concurrent else {
            return Err(ConfigError {
                field: "max_concurrent",
                problem: ConfigProblem::Missing,
            });
        };
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
            // One spelling per name: `"a"`, `"a "` and `"a\u{a0}"` are one class, and so are
            // two Unicode spellings of one text.
            let name = match class_name::canonical(name) {
                Ok(n) => n,
                Err(why) => return table_err("classes", why),
            };
            if names.iter().any(|n: &String| *n == name) {
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
            names.push(name.into_owned());
        }
        let default_class = match (&self.default_class, names.is_empty()) {
            (None, true) => 0,
            (Some(_), true) => return table_err("default_class", "needs admission classes"),
            (None, false) => {
                return table_err("default_class", "is required with admission classes")
            }
            (Some(d), false) => match names.iter().position(|n| *n == class_name::lookup_key(d)) {
                Some(i) => i,
                None => return table_err("default_class", "must name a configured class"),
            },
        };
        let mut first = LimitsSnapshot {
            revision: self.initial_revision,
            max_concurrent,
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
        // Drawn once the settings are valid: a failed build uses no serial.
        let owner = crate::vocab::class::next_owner()?;
        first
            .classes
            .stamp(owner, crate::words::classes::keys_of(&names));
        let shared = Handle::new(
            Ring::new(&first),
            Canonical {
                current: first,
                tag: 0,
                periods: crate::grace::Periods::new(0),
            },
            token_budget.is_some(),
            names,
            default_class,
            owner,
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
#[non_exhaustive]
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
    #[must_use]
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
    #[must_use]
    pub fn timeout(self) -> Option<Duration> {
        match self {
            Profile::Interactive => None,
            Profile::Batch => Some(Duration::from_secs(30)),
        }
    }
}
