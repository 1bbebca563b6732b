//! Class mode of the [`Bulkhead`]'s decisions: class resolution, the class decision and its
//! counting, the class refusals (`crate::protocol::classed`).

use super::*;
use crate::protocol::classed::{ShortRefusal, StopAt};

impl Bulkhead {
    /// The class path of `try_acquire` (the protocol of `crate::protocol::classed`): the fast
    /// attempt and the refusal at a class ceiling inline, in one operation; the rest out of
    /// line ([`try_acquire_classed_contended`], in the same operation). Inlined: out of
    /// line, its prologue, spills and `Result` written through memory were about 35
    /// instructions of a class pair (392 -> 357 for `pair_protected` in
    /// `benches/instructions.rs`), for about 2 more on the no-class pair beside it.
    ///
    /// [`try_acquire_classed_contended`]: Self::try_acquire_classed_contended
    #[inline(always)]
    pub(super) fn try_acquire_classed(
        &self,
        class: Option<ClassId>,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, Rejection> {
        let shared = &*self.shared;
        let Some(k) = self.class_index(class) else {
            return Err(unknown_class());
        };
        // One lookup of this thread's counters entry: the fast attempt's grace-period marker and
        // the admission's counts.
        let c = shared.counters.local(Counters::new);
        let op = crate::grace::enter_decision(c.reader(), shared.asymmetric);
        let past = match crate::protocol::classed::try_fast_in(&op, shared, k, r, priority) {
            Ok(a) => {
                drop(op);
                // A step the attempt took back may have pumped the queue: the waiters it answered
                // are woken now that it left its operation (`crate::wait::list`, "Where wake-ups
                // run"; the full protocol delivers its own).
                crate::protocol::class_pump::deliver_deferred();
                return Ok(self.count_class_in(c, k, r, a.revision, a.resources));
            }
            Err(past) => past,
        };
        // The hot paths under overload: a refusal at a class ceiling, or at the shared
        // remainder when the class's own borrowing explains it, decided in the attempt's
        // operation from the words it read, counted, and built straight in the result.
        let by_own_word = past.and_then(|p| {
            crate::protocol::classed::own_word_refusal(shared, c, k, r, priority, p, &op)
        });
        let Some(f) = by_own_word else {
            drop(op);
            return self.try_acquire_classed_contended(k, r, priority);
        };
        drop(op);
        // No wake-ups to deliver: the attempt stopped at its first checks, before any step it
        // could take back (and so before any pump).
        Err(self.short_refused(k, f, r, priority))
    }

    /// A refusal decided on a short path, after its operation left: its subscribers (if any),
    /// then the refusal, built in the caller's result.
    #[inline(always)]
    fn short_refused(&self, k: usize, f: ShortRefusal, r: u64, priority: Priority) -> Rejection {
        // Every wake-up a step taken back deferred was delivered before the refusal ends its
        // decision: kept, it would wait for this thread's next decision, which may never come.
        debug_assert!(
            !crate::sync::notify::pending(),
            "a short refusal returned with wake-ups still deferred"
        );
        if self
            .shared
            .events
            .wants(Interest::REJECT | Interest::DECISION_TIMING)
        {
            self.publish_short_refusal(k, f, r, priority);
        }
        f.rejection(r, priority)
    }

    /// Calls the reject subscribers of a refusal decided on the short path, with a copy of
    /// their own (built only for them), after the decision left its operation.
    #[cold]
    #[inline(never)]
    fn publish_short_refusal(&self, k: usize, f: ShortRefusal, r: u64, priority: Priority) {
        let rej = f.rejection(r, priority);
        crate::handle::events::rejected(&self.shared, Some(k), &rej);
    }

    /// The classed decision after the fast attempt gave up and its class's word refused
    /// nothing, out of line. First a refusal at the shared remainder that the class's own
    /// borrowing does not explain (other classes borrow too, or the stored amounts count
    /// steps in progress), in one operation: the words the attempt read, read again, and
    /// where it would stop on them without a step (`read_stopped`: row 1, or a borrower that
    /// the stored shared word refuses), then one read of the other class words decides
    /// (`shared_refusal`). When that does not refuse: the fast attempt's wake-ups, a second
    /// fast attempt (which decides a refusal at a ceiling or at the shared remainder in its
    /// own operation), then the full protocol, and the refusal if it refuses (its result
    /// carries the collect that explains it).
    ///
    /// The collect-decided refusal is decided here, out of line, and not beside the class
    /// word's in [`try_acquire_classed`](Self::try_acquire_classed): there, inlined or called,
    /// with the first attempt's words carried over or not, it cost the pairs 10 to 30
    /// instructions and the ceiling refusal 40 to 190 (`benches/instructions.rs`; measured
    /// again with a call that takes the stopped attempt and its operation over: this refusal
    /// 414 to 437, the ceiling refusal 254; with only the operation taken over: 441, the
    /// ceiling refusal 242). Two call sites, one for an attempt that stopped and one for an
    /// attempt that gave up, let the first skip the re-check of where it stopped (427
    /// instructions, the pairs unchanged), but the larger inlined caller moved the code of the
    /// no-class pair beside it in `benches/core.rs`, which then took 15-16 ns a pair instead
    /// of 12-13 with the same instructions. One call site, as here, leaves the caller as it
    /// was: 468 instructions (10 of them the delivery, before the refusal, of the wake-ups a
    /// step the first attempt took back may have deferred), against 485 through a second
    /// attempt and 900 through the full protocol; a refusal that the class's own borrowing
    /// explains, decided in the attempt's operation instead, takes 259. The first attempt's
    /// words cannot be carried over, since they were read in an operation that has left.
    #[inline(never)]
    fn try_acquire_classed_contended(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, Rejection> {
        let shared = &*self.shared;
        let c = shared.counters.local(Counters::new);
        let first = crate::grace::enter_decision(c.reader(), shared.asymmetric);
        let short = crate::protocol::classed::read_stopped(&first, shared, k, r, priority)
            .and_then(|p| {
                crate::protocol::classed::shared_refusal(shared, c, k, r, priority, p, &first)
            });
        drop(first);
        // The fast attempt's wake-ups (if it took a step back and pumped before giving up),
        // outside any operation, before this decision ends either way.
        if short.is_none() || !keeps_deferred_for_tests() {
            crate::protocol::class_pump::deliver_deferred();
        }
        if let Some(f) = short {
            return Err(self.short_refused(k, f, r, priority));
        }
        let op = crate::grace::enter_decision(c.reader(), shared.asymmetric);
        let short = match crate::protocol::classed::try_fast_in(&op, shared, k, r, priority) {
            Ok(a) => {
                drop(op);
                crate::protocol::class_pump::deliver_deferred();
                return Ok(self.count_class_in(c, k, r, a.revision, a.resources));
            }
            Err(Some(p)) => match p.at {
                StopAt::Shared => {
                    crate::protocol::classed::shared_refusal(shared, c, k, r, priority, p, &op)
                }
                _ => crate::protocol::classed::own_word_refusal(shared, c, k, r, priority, p, &op),
            },
            Err(None) => None,
        };
        drop(op);
        if let Some(f) = short {
            // Stopped before any step: no wake-ups to deliver.
            return Err(self.short_refused(k, f, r, priority));
        }
        crate::protocol::class_pump::deliver_deferred();
        self.try_acquire_classed_full(k, r, priority)
    }

    /// The full protocol (its own function, so that the short path's frame stays small).
    #[inline(always)]
    fn try_acquire_classed_full(
        &self,
        k: usize,
        r: u64,
        priority: Priority,
    ) -> Result<Granted, Rejection> {
        // The refusal is built inside the decision's grace-period operation (from the collect
        // that explained it, by reference), but its subscribers are called after the operation
        // left: no user code runs while an operation may hold off an install (`crate::grace`).
        // This decision's wake-ups are delivered after it.
        let refused = |f: &_| self.count_class_refusal(k, f, r, priority);
        let decided =
            crate::protocol::classed::acquire_after_fast(&self.shared, k, r, priority, refused);
        crate::protocol::class_pump::deliver_deferred();
        match decided {
            Ok(a) => Ok(self.count_class_admission(k, r, a.revision, a.resources)),
            Err(rej) => {
                crate::handle::events::rejected(&self.shared, Some(k), &rej);
                Err(rej)
            }
        }
    }

    /// The class index a demand's class resolves to on a bulkhead with classes: the default
    /// class when it names none, `None` for a class of another bulkhead (one compare; an id
    /// carrying this bulkhead's serial was made by [`class_id`](Self::class_id), so its index
    /// is in the table).
    #[inline]
    pub(crate) fn class_index(&self, class: Option<ClassId>) -> Option<usize> {
        let shared = &*self.shared;
        match class {
            None => Some(shared.default_class),
            Some(c) if c.is_of(shared.class_owner) => Some(c.index()),
            Some(_) => None,
        }
    }

    /// Whether `class` is a class this bulkhead can decide in: any on a bulkhead with classes
    /// resolves ([`class_index`](Self::class_index)), none on one without.
    #[inline]
    pub(crate) fn class_is_valid(&self, class: Option<ClassId>) -> bool {
        if self.shared.classed {
            self.class_index(class).is_some()
        } else {
            class.is_none()
        }
    }

    /// Counts a class admission of `r` tokens in class `k` (its attribution `resources`).
    pub(crate) fn count_class_admission(
        &self,
        k: usize,
        r: u64,
        revision: u64,
        resources: crate::vocab::class::Resources,
    ) -> Granted {
        let c = self.shared.counters.local(Counters::new);
        self.count_class_in(c, k, r, revision, resources)
    }

    /// [`count_class_admission`](Self::count_class_admission) into this thread's entry `c`.
    #[inline(always)]
    pub(crate) fn count_class_in(
        &self,
        c: &Counters,
        k: usize,
        r: u64,
        revision: u64,
        resources: crate::vocab::class::Resources,
    ) -> Granted {
        let shared = &*self.shared;
        let n = c.admitted.incr();
        let cc = &c.classes[k];
        cc.admitted.incr();
        if resources.borrowed_concurrency {
            cc.borrowed_admissions.incr();
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
        constraint: Option<crate::vocab::rejection::Constraint>,
        r: u64,
        priority: Priority,
    ) -> Rejection {
        let f = crate::protocol::classed::describe(&self.shared, k, priority, reason, constraint);
        self.class_refusal(k, &f, r, priority)
    }

    /// Counts and explains a class refusal from the collect that decided its reason, and calls
    /// its subscribers (so only outside a grace-period operation).
    #[cold]
    #[inline(never)]
    pub(crate) fn class_refusal(
        &self,
        k: usize,
        f: &crate::protocol::classed::Refused,
        r: u64,
        priority: Priority,
    ) -> Rejection {
        let rej = self.count_class_refusal(k, f, r, priority);
        crate::handle::events::rejected(&self.shared, Some(k), &rej);
        rej
    }

    /// [`class_refusal`](Self::class_refusal) without the subscribers: counts and explains.
    /// Runs no user code, so it may run inside a grace-period operation.
    #[cold]
    #[inline(never)]
    fn count_class_refusal(
        &self,
        k: usize,
        f: &crate::protocol::classed::Refused,
        r: u64,
        priority: Priority,
    ) -> Rejection {
        let shared = &*self.shared;
        let c = shared.counters.local(Counters::new);
        c.rejected[f.reason.index()].incr();
        c.classes[k].rejected[f.reason.index()].incr();
        let mut rej = plain::rejection(f.summary.g, f.summary.t, &f.lim, f.reason, r, priority);
        rej.constraint = f.constraint;
        if f.reason != RejectReason::Shutdown {
            rej.set_class(f.summary.counts(shared.class_ids[k], f.stored_shared));
        }
        rej
    }

    /// The class named `name`.
    ///
    /// # Errors
    /// [`UnknownClass`] when the table has no such class (classes are never created on use).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(1).class("batch", ClassLimits::default()).default_class("batch").build().unwrap();
    /// assert!(b.class_id("batch").is_ok());
    /// assert!(b.class_id("tenant-42").is_err());
    /// ```
    pub fn class_id(&self, name: &str) -> Result<ClassId, UnknownClass> {
        // Names are stored canonical (the builder trims and normalises them), so look them up
        // the same way (no allocation for a name already canonical).
        let key = crate::vocab::class_name::lookup_key(name);
        self.shared
            .class_names
            .iter()
            .position(|n| *n == key)
            .map(|i| ClassId::new(self.shared.class_owner, i))
            .ok_or_else(|| UnknownClass(name.to_owned()))
    }

    /// Whether a demand refused only for tokens waits in the queue
    /// ([`BulkheadBuilder::wait_for_tokens`](crate::BulkheadBuilder::wait_for_tokens)).
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// assert!(!Bulkhead::new(1).unwrap().waits_for_tokens());
    /// assert!(Bulkhead::builder().max_concurrent(1).wait_for_tokens(true).build().unwrap().waits_for_tokens());
    /// ```
    #[must_use]
    pub fn waits_for_tokens(&self) -> bool {
        self.shared.wait_for_tokens
    }

    /// Whether queue waits are timed for `stats().queue_waits`
    /// ([`BulkheadBuilder::measure_queue_waits`](crate::BulkheadBuilder::measure_queue_waits)).
    ///
    /// ```
    /// use llm_bulkhead::Bulkhead;
    /// assert!(!Bulkhead::new(1).unwrap().measures_queue_waits());
    /// assert!(Bulkhead::builder().max_concurrent(1).measure_queue_waits(true).build().unwrap().measures_queue_waits());
    /// ```
    #[must_use]
    pub fn measures_queue_waits(&self) -> bool {
        self.shared.measure_waits
    }

    /// The default time a waiter may stay queued (from the builder's `queue_timeout` or
    /// profile); `None`: no deadline.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::Bulkhead::new(1).unwrap().default_queue_timeout(), None);
    /// ```
    #[must_use]
    pub fn default_queue_timeout(&self) -> Option<Duration> {
        self.shared.default_timeout
    }

    /// The class names, in construction order (empty without classes).
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert!(Bulkhead::new(1).unwrap().class_names().is_empty());
    /// ```
    #[must_use]
    pub fn class_names(&self) -> &[String] {
        &self.shared.class_names
    }
}

/// The refusal of a demand whose class this bulkhead does not have (another bulkhead's, or any
/// class without classes): decided before anything changed, so nothing is counted or
/// published.
#[cold]
#[inline(never)]
pub(crate) fn unknown_class() -> Rejection {
    // Nothing is published for it, so a timed decision's clock ends here (`try_acquire`).
    crate::record::timing::end();
    Rejection::unknown_class()
}

/// The deliberately broken variant `LLM_BULKHEAD_SHORT_REFUSAL_KEEPS_DEFERRED=1` (feature
/// `testing`): a refusal at the shared remainder decided after the fast attempt took a step
/// back returns with that step's wake-ups still deferred to this thread (a waiter its pump
/// answered then waits for this thread's next decision). `short_refused`'s debug assertion
/// fails on it in `tests/over_admissions.rs`' bounded test (debug build), which `.ci/run`
/// requires.
#[inline(always)]
fn keeps_deferred_for_tests() -> bool {
    crate::sync::test_switch!("LLM_BULKHEAD_SHORT_REFUSAL_KEEPS_DEFERRED")
}
