//! The [`Bulkhead`]: construction, the lock-free decision, reconfiguration, close and stats.

use crate::handle::admission::Admission;
use crate::protocol::plain;
use crate::record::events::Interest;
use crate::record::stats::{Counters, Stats, TokenStats, Totals};
use crate::shared::Handle;
use crate::sync::{lock, Ordering};
use crate::vocab::class::{ClassId, UnknownClass};
use crate::vocab::demand::{Demand, Reservation};
use crate::vocab::error::{ConfigError, ConfigProblem};
use crate::vocab::id::AdmissionId;
use crate::vocab::rejection::{RejectReason, Rejection};
use crate::words::limits::{ApplyLimitsError, LimitsChange};
use crate::words::limits::{BudgetLimits, Hot, LimitsSnapshot};
use crate::words::state::{Word, CLOSED};
use crate::Priority;
use std::fmt;
use std::time::Duration;

mod classed;
use crate::handle::builder::BulkheadBuilder;
pub(crate) use crate::protocol::plain::Refusal;
pub(crate) use crate::protocol::Granted;
pub(crate) use classed::unknown_class;

/// A lock-free admission controller: global concurrency slots and an in-flight token budget.
///
/// Cloning a `Bulkhead` gives another handle to the same state. Every decision is one CAS on
/// one packed word (see `crate::words::state`); limits are read from a ring of snapshots named by a
/// tag in that word (see `crate::words::limits`).
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
/// returns, no admission can succeed. Statistics are `Relaxed` bookkeeping (see `crate::record::stats`).
#[derive(Clone)]
pub struct Bulkhead {
    pub(crate) shared: Handle,
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
    /// Without classes the slot and the reservation are taken in one CAS (the protocol of
    /// `crate::protocol::plain`); with classes the decision is the multi-word protocol described
    /// in `crate::protocol::classed`.
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
    // whole `Result` to memory, which measured 15.5 → ~11 ns per pair. A no-class refusal is
    // inline too (`crate::protocol::plain::try_admit`: a tag re-check and one increment) and
    // comes back as a few scalars, from which the `Rejection` is built once, here; the rare
    // cases (`WAITERS` up, decision timing, contention) are out of line. With classes the
    // class fast attempt is inlined too (`try_acquire_classed`; the rest is out of line).
    #[inline(always)]
    pub fn try_acquire(&self, demand: Demand) -> Result<Admission, Rejection> {
        let shared = &*self.shared;
        // The subscribers' interests, read once (one relaxed load): the no-class decision below
        // does not ask again, and its admission is observed only for subscribers to admissions,
        // releases or timing (a subscription made meanwhile may miss this decision's event:
        // `crate::record::events`). Subscribers to other kinds (telemetry's) cost a decision
        // nothing but the publication of a refusal.
        // Decision timing (`Interest::DECISION_TIMING`) has no scope to drop on every exit:
        // with timing asked for, every exit passes through the admit hook (an admission is
        // then observed) or the reject hook, which end it.
        let interests = shared.events.interests();
        let reservation = if shared.has_budget {
            Some(demand.reservation().unwrap_or(Reservation::ZERO))
        } else {
            None
        };
        let r = if shared.has_budget {
            demand.reservation().map_or(0, |x| x.total())
        } else {
            0
        };
        let priority = demand.priority();
        // Both paths end in the few scalars of `Granted`, and the admission is built once, here:
        // merging two whole `Admission` values (one from an out-of-line call) made the compiler
        // move the admission through memory in a way that stalled on store forwarding.
        let g = if shared.classed {
            if interests.intersects(Interest::DECISION_TIMING) {
                crate::record::timing::begin_now();
            }
            self.try_acquire_classed(demand.class(), r, priority)?
        } else if !interests.intersects(Interest::DECISION_TIMING) {
            // Nobody times decisions: the inline decision, whoever else subscribes (telemetry
            // subscribes to refusals and reconfigurations, not to admissions).
            if demand.class().is_some() {
                return Err(classed::unknown_class());
            }
            match plain::try_admit(shared, r, priority) {
                Ok(g) => g,
                // Built here, in the place the caller keeps it; published after the decision
                // left its operation.
                Err(plain::NoAdmit::Refused(f)) if interests.intersects(Interest::REJECT) => {
                    return Err(self.publish_refusal(f, r));
                }
                Err(plain::NoAdmit::Refused(f)) => return Err(f.rejection(r)),
                Err(plain::NoAdmit::Rejected(rejection)) => return Err(rejection),
            }
        } else {
            self.try_admit_observed(demand, r, priority, interests)?
        };
        let observed =
            interests.intersects(Interest::ADMIT | Interest::RELEASE | Interest::DECISION_TIMING);
        Ok(self.admission_observed(g, priority, reservation, observed))
    }

    /// Builds a no-class refusal that `try_acquire` decided inline (counted already) and calls
    /// its reject subscribers, outside the decision's operation. Out of line, so that the
    /// refusal without subscribers keeps its registers.
    #[cold]
    #[inline(never)]
    fn publish_refusal(&self, f: plain::Refused, r: u64) -> Rejection {
        let rejection = f.rejection(r);
        crate::handle::events::rejected(&self.shared, None, &rejection);
        rejection
    }

    /// The no-class decision of `try_acquire` with decision timing asked for (`interests`):
    /// timed, its refusal counted and explained after its operation and published
    /// (`crate::protocol::plain::try_admit_observed`).
    #[cold]
    #[inline(never)]
    fn try_admit_observed(
        &self,
        demand: Demand,
        r: u64,
        priority: Priority,
        interests: Interest,
    ) -> Result<Granted, Rejection> {
        if interests.intersects(Interest::DECISION_TIMING) {
            crate::record::timing::begin_now();
        }
        if demand.class().is_some() {
            return Err(classed::unknown_class());
        }
        plain::try_admit_observed(&self.shared, r, priority)
    }

    /// Builds the admission of a successful decision.
    #[inline(always)]
    pub(crate) fn admission_from(
        &self,
        g: Granted,
        priority: Priority,
        reservation: Option<Reservation>,
    ) -> Admission {
        // The only event cost on the fast path: one relaxed load (`crate::record::events`).
        // Only subscribers to admissions or releases, or to decision timing (whose clock the
        // admit hook ends), make an admission observed.
        let observed = self
            .shared
            .events
            .wants(Interest::ADMIT | Interest::RELEASE | Interest::DECISION_TIMING);
        self.admission_observed(g, priority, reservation, observed)
    }

    /// [`admission_from`](Self::admission_from) with the event flag already read (`observed`).
    #[inline(always)]
    pub(crate) fn admission_observed(
        &self,
        g: Granted,
        priority: Priority,
        reservation: Option<Reservation>,
        observed: bool,
    ) -> Admission {
        let id = AdmissionId::from_key_bits(self.shared.id_prefix, g.key, g.n);
        // The hook gets copies, not the admission: taking its address would keep it in memory.
        // The admission remembers the answer, so its release reads no flag.
        if observed {
            crate::handle::events::admitted(
                &self.shared,
                id,
                g.revision,
                priority,
                reservation,
                g.class,
            );
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

    /// The no-class fast decision (`crate::protocol::plain::try_decide`). `Err` carries the
    /// word and the limits that refused, for [`Bulkhead::refusal`] (which re-checks the tag).
    #[inline(always)]
    pub(crate) fn try_decide(&self, r: u64, priority: Priority) -> Result<Granted, Refusal<'_>> {
        plain::try_decide(&self.shared, r, priority)
    }

    /// Counts an admission (no class) decided outside `try_decide` and returns what builds it.
    #[inline(always)]
    pub(crate) fn count_admission(&self, revision: u64, r: u64) -> Granted {
        plain::count(&self.shared, revision, r)
    }

    /// Counts and explains a no-class refusal `f`; `None` if the tag moved since (the limits
    /// may have been torn: decide again). See `crate::protocol::plain::refusal`.
    #[inline(always)]
    pub(crate) fn refusal(&self, f: &Refusal<'_>, r: u64, priority: Priority) -> Option<Rejection> {
        plain::refusal(&self.shared, f, r, priority)
    }

    /// [`refusal`](Self::refusal) of a decision made outside `try_decide` (under the queue
    /// lock).
    #[inline(always)]
    pub(crate) fn refusal_of(
        &self,
        w: Word,
        lim: &Hot,
        reason: RejectReason,
        r: u64,
        priority: Priority,
    ) -> Option<Rejection> {
        plain::refusal_of(&self.shared, w, lim, reason, r, priority)
    }

    /// Counts and explains the refusal of a waiter (or of a request refused before it could
    /// wait: `aborted`; or of a caller waiting on a call shared with others: `timeout`,
    /// `aborted`, `unshareable_result`), with the state as it is now.
    #[cold]
    pub(crate) fn waiter_refusal(&self, reason: RejectReason, demand: &Demand) -> Rejection {
        let shared = &*self.shared;
        // A demand in a class this bulkhead does not have is refused as such before anything
        // else (a cancelled one too): nothing is counted.
        if !self.class_is_valid(demand.class()) {
            return unknown_class();
        }
        let r = if shared.has_budget {
            demand.reservation().unwrap_or(Reservation::ZERO).total()
        } else {
            0
        };
        if shared.classed {
            let constraint = match reason {
                RejectReason::Shutdown
                | RejectReason::Aborted
                | RejectReason::UnshareableResult => None,
                _ => Some(crate::vocab::rejection::Constraint::Global),
            };
            let k = self
                .class_index(demand.class())
                .unwrap_or(shared.default_class);
            let mut rej = self.class_answer_refusal(k, reason, constraint, r, demand.priority());
            rej.set_pending(crate::protocol::handoff::pending(shared) as u64);
            return rej;
        }
        plain::waiter_refusal(shared, reason, r, demand.priority())
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
    /// # Panics
    /// Only if the kernel breaks its own contract: on Linux the grace period's barrier is
    /// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, registered when the first bulkhead is
    /// built (a failed registration selects the fence fallback instead). If that call failed
    /// after a successful registration, waiting out the grace period would not be sound, so it
    /// panics rather than install limits that stopped decisions might still commit against.
    /// No input reaches it.
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
        // Keyed by name (CONTRACT.md §4): a table read from a bulkhead with the same classes
        // is accepted, one from a bulkhead with other classes is not. Installed with this
        // bulkhead's provenance, so `limits()` keeps telling its ids from others'.
        next.classes.check_origin(&canon.current.classes)?;
        let next = LimitsSnapshot {
            classes: next.classes.with_origin_of(&canon.current.classes),
            ..next
        };
        // The words: ring, tag bump, class migration, grace period (`crate::protocol::install`).
        let visit = crate::protocol::install::install(shared, &mut canon, &next);
        let previous = std::mem::replace(&mut canon.current, next);
        drop(canon);
        crate::protocol::install::after_install(shared, visit);
        let change = LimitsChange {
            previous,
            current: next,
        };
        crate::handle::events::emit(shared, || {
            crate::record::events::Event::Reconfigure(Box::new(change))
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
    /// # Panics
    /// As [`apply_limits`](Bulkhead::apply_limits) (a kernel barrier failing after
    /// registration); no input reaches it.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::builder().max_concurrent(1).token_budget(100).initial_revision(7).build().unwrap();
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
        // ordered against this RMW by the `SeqCst` total order (`crate::protocol::classed`).
        crate::sync::loom_sc_fence();
        crate::protocol::handoff::close_queue(&self.shared);
    }

    /// Whether `close()` was called.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// let b = Bulkhead::new(1).unwrap();
    /// assert!(!b.is_closed());
    /// ```
    #[must_use]
    pub fn is_closed(&self) -> bool {
        Word(self.shared.word.load(Ordering::Acquire)).closed()
    }

    /// The current limits snapshot.
    ///
    /// ```
    /// # use llm_bulkhead::Bulkhead;
    /// assert_eq!(Bulkhead::new(3).unwrap().limits().max_concurrent, 3);
    /// ```
    #[must_use = "limits() is a snapshot: reading it changes nothing"]
    pub fn limits(&self) -> LimitsSnapshot {
        // Not the reconfiguration lock, which an install holds while it waits out a grace
        // period: the published copy, which it replaces only with its tag bump.
        *lock(&self.shared.published)
    }

    /// A snapshot of state and counters. Without classes, state fields come from one read of
    /// the state word. With classes, each class's numbers come from one read of its class
    /// word, and the global totals (`in_flight`, tokens in flight, the shared remainder's use)
    /// add the class words read one after another, not at one instant: while an admission in
    /// one class and a release in another race the call, a total can pass its limit by what
    /// moved meanwhile, though no instant's state ever does (every decision checks the limits
    /// atomically). Counters are summed over threads (see `crate::record::stats` for what is
    /// exact when).
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, Demand, Reservation};
    /// let b = Bulkhead::builder().max_concurrent(4).token_budget(1_200).build().unwrap();
    /// let a = b.try_acquire(Demand::tokens(Reservation::new(100, 1_000).unwrap())).unwrap();
    /// let s = b.stats();
    /// assert_eq!((s.in_flight, s.token_budget.unwrap().available), (1, 100));
    /// # drop(a);
    /// ```
    #[must_use = "stats() is a snapshot: reading it changes nothing"]
    pub fn stats(&self) -> Stats {
        let shared = &*self.shared;
        let limits = self.limits();
        let w = Word(shared.word.load(Ordering::Acquire));
        let mut t = Totals::default();
        let n = shared.class_words.len();
        shared.counters.for_each(|c| t.add(c, n));
        let rejected = t.rejected.total();
        let abandoned_open = t.abandoned.saturating_sub(t.abandoned_settled);
        // With classes the totals are the sums of the class words (`crate::protocol::classed`).
        let (state, slots, tokens) = if shared.classed {
            crate::protocol::classed::collect(shared)
        } else {
            (Vec::new(), w.slots(), w.tokens())
        };
        // A class release books nothing: released = admitted − in flight − abandoned and not
        // yet released.
        for (tt, &(n, _)) in t.classes.iter_mut().zip(&state) {
            let open = tt.abandoned.saturating_sub(tt.abandoned_settled);
            tt.released = tt.admitted.saturating_sub(n + open);
        }
        let classes = crate::record::stats::classes_stats(
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
            pending: crate::protocol::handoff::pending(shared) as u64,
            queued_total: crate::protocol::handoff::queued_total(shared),
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
            borrowed_concurrency_abandoned_by_cause: crate::record::stats::AbandonCauses {
                manual: t.abandoned.saturating_sub(t.abandoned_deadline),
                deadline: t.abandoned_deadline,
            },
            classes,
            subscriber_panics: shared.events.panics(),
        }
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        let w = Word(shared.word.load(Ordering::Relaxed));
        let (slots, tokens) = if shared.classed {
            let (_, g, t) = crate::protocol::classed::collect(shared);
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
