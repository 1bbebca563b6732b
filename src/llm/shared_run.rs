//! De-duplication as an option of `run` (seed 001: "deduplication applies to run()"): a
//! bulkhead-level setting ([`LlmBulkhead::with_dedup`]: on/off, key function, map bound), the
//! per-call `dedup` and `dedup_scope` of [`RunOptions`], and the entry points
//! [`LlmBulkhead::run_shared`] (results shared by `Clone`) and
//! [`LlmBulkhead::run_shared_with`] (a share function per call).
//!
//! # The `Send` obstacle, and the design
//! A shared call is driven by whichever participant polls it, so its future must be `Send` and
//! `'static`; the future of an `AsyncFnOnce` closure cannot be required `Send` on stable Rust.
//! The work of a shared run therefore returns a boxed future that may borrow the context:
//! `for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E>`, written
//! `|ctx| Box::pin(async move { … })`. The run future owns everything it needs (the request is
//! estimated and keyed when `run_shared` is called), so it is `Send + 'static` and can be
//! spawned.
//!
//! # An answer at the deadline
//! Because the work owns its context, a shared run can answer the seed's way: with
//! `RunOptions::detach_at_deadline` (a spawner), expiry of the borrowed-concurrency deadline
//! answers the caller (and the followers) [`RunError::Deadline`] at once, and the work, still
//! running, is handed to the spawner; it settles its tokens when it ends, and a drain counts
//! it until then. The flight's key is freed at expiry, so an identical call meanwhile starts a
//! new call (the reference's B13). Without a spawner a shared run answers at expiry as `run`
//! does: the work's future is dropped.
//!
//! # Partitions
//! The key is the bulkhead's key function of the request (default: [`DedupKey::for_request`],
//! the whole request), inside the call's `dedup_scope` and its admission class. The class is
//! resolved first: no class means the default class, so `None` and `Some(default)` share; a
//! class this bulkhead does not have, or a class on a bulkhead without classes, is
//! [`RunError::Invalid`] before anything joins. Results of different types never share.
//!
//! # Where it differs from the reference
//! Every call is validated and estimated, followers too (the reference lets a follower skip
//! validation, its B11). A follower's failures (its own timeout, its own cancellation,
//! an unshareable result) are [`RunError::Shared`], counted in [`DedupStats`] (`timeouts`,
//! `cancelled`, `unshareable`) and seen as a `dedup` event (outcomes `timeout`, `cancelled`,
//! `unshareable`); as in the reference (its dedup-wait rejections) they are also refusals of
//! that caller: counted in `Stats::rejected` and `rejected_by_reason` (reasons `timeout`,
//! `aborted`, `unshareable_result`; per class too), published as a `reject` event, and so
//! in the metrics. Their rejection's capacity detail is the state when the follower was
//! answered (the reference sends none). A leader's error passed on to its followers is not
//! counted again. A follower waits with
//! an explicit `wait.timeout` only; it leaves at once when its own `wait.cancel` token fires
//! (the token wakes it) or when its future is dropped, and neither cancels the leader's call
//! or the other followers. The leader's token is the leader's, as in `run`: it cancels the
//! leader's wait for admission and reaches its work's stop signal.

use super::dedup::events::{DedupEvent, DedupOutcome};
use super::dedup::{Dedup, DedupError, DedupKey, DedupStats, FollowerOptions};
use super::observe::stats::{ObserveCounters, ObserveStats};
use super::observe::Mode;
use super::request::LlmRequest;
use super::run::{
    acquire_noting, admit_now, race_deadline, settle, settle_raced, LlmBulkhead, NoWatch,
    RunContext, RunError, RunOptions, RunTimed, Stopwatch, UsageFrom,
};
use super::EstimateError;
use crate::{ClassId, RejectReason, Stats};
use std::any::{Any, TypeId};
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;

/// The future a shared run's work returns: boxed, `Send`, and free to borrow the context.
///
/// ```
/// use llm_bulkhead::llm::{BoxWork, RunContext};
/// fn work(ctx: &mut RunContext) -> BoxWork<'_, u64, ()> {
///     Box::pin(async move { Ok(ctx.revision()) })
/// }
/// # let _ = work;
/// ```
pub type BoxWork<'c, R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'c>>;

/// A custom de-duplication key function: the key of a request, or `None` to opt it out
/// (the reference's empty key). The scope and class partition are applied to its answer.
///
/// ```
/// use llm_bulkhead::llm::{DedupKey, DedupKeyFn, LlmRequest};
/// use std::sync::Arc;
/// // Share by model and last message only; requests without messages never share.
/// let key: DedupKeyFn = Arc::new(|r: &LlmRequest| {
///     let last = r.messages.last()?;
///     DedupKey::of_bytes(format!("{:?}|{}", r.model, last.content.text_len()).as_bytes())
/// });
/// assert!(key(&LlmRequest::default()).is_none());
/// ```
pub type DedupKeyFn = Arc<dyn Fn(&LlmRequest) -> Option<DedupKey> + Send + Sync>;

/// The bulkhead-level de-duplication setting (the reference's `deduplication` option).
///
/// ```
/// use llm_bulkhead::llm::{DedupKey, DedupSettings};
/// use std::sync::Arc;
/// let on = DedupSettings::default();
/// assert!(on.enabled);
/// let custom = DedupSettings {
///     key: Some(Arc::new(|r: &llm_bulkhead::llm::LlmRequest| DedupKey::of_bytes(r.model.as_deref()?.as_bytes()))),
///     max_in_flight: 100,
///     ..DedupSettings::default()
/// };
/// # let _ = custom;
/// ```
#[derive(Clone)]
pub struct DedupSettings {
    /// De-duplicate calls that do not opt out (`RunOptions::dedup`). `false` keeps the map
    /// but shares nothing.
    pub enabled: bool,
    /// The key function (`None`: [`DedupKey::for_request`], the whole request).
    pub key: Option<DedupKeyFn>,
    /// At most this many keys in flight; a call that finds the map full runs on its own
    /// (counted in [`DedupStats::full`]). Above zero.
    pub max_in_flight: usize,
}

impl Default for DedupSettings {
    /// On, the default key, at most 10,000 keys in flight.
    fn default() -> Self {
        DedupSettings {
            enabled: true,
            key: None,
            max_in_flight: 10_000,
        }
    }
}

impl fmt::Debug for DedupSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupSettings")
            .field("enabled", &self.enabled)
            .field("key", &self.key.as_ref().map(|_| "custom"))
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

/// The statistics of an [`LlmBulkhead`]: the bulkhead's, observe mode's (the reference's
/// `stats().observe`, absent before the first bypass), and de-duplication's when it is
/// configured (the reference's `stats().deduplication`, absent when off).
///
/// ```
/// use llm_bulkhead::llm::{DedupSettings, LlmBulkhead, NaiveEstimator};
/// use llm_bulkhead::Bulkhead;
/// let plain = LlmBulkhead::new(Bulkhead::new(1).unwrap(), NaiveEstimator);
/// assert!(plain.stats().dedup.is_none());
/// let dedup = plain.clone().with_dedup(DedupSettings::default()).unwrap();
/// assert_eq!(dedup.stats().dedup.unwrap().active, 0);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LlmStats {
    /// [`Bulkhead::stats`](crate::Bulkhead::stats).
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub bulkhead: Stats,
    /// Observe mode's figures: `None` until the first bypass (as in the reference). Shared by
    /// every `LlmBulkhead` and tower layer wrapping the same bulkhead.
    pub observe: Option<ObserveStats>,
    /// De-duplication (`None` when the bulkhead has no de-duplication setting).
    pub dedup: Option<DedupStats>,
}

impl LlmStats {
    /// The statistics of a bulkhead the LLM layer is used with but that has no
    /// [`LlmBulkhead`] at hand (a tower layer's, say): the bulkhead's and observe mode's;
    /// `dedup` is `None` (de-duplication belongs to an `LlmBulkhead`).
    ///
    /// ```
    /// use llm_bulkhead::llm::LlmStats;
    /// let b = llm_bulkhead::Bulkhead::new(1).unwrap();
    /// let s = LlmStats::of(&b);
    /// assert_eq!((s.bulkhead.in_flight, s.observe, s.dedup), (0, None, None));
    /// ```
    #[must_use = "a snapshot: reading it changes nothing"]
    pub fn of(bulkhead: &crate::Bulkhead) -> LlmStats {
        LlmStats {
            bulkhead: bulkhead.stats(),
            observe: ObserveCounters::of(bulkhead).stats(),
            dedup: None,
        }
    }
}

/// A result of some type, with the way to share it (a type-erased flight carries any result).
pub(super) struct Erased {
    value: Option<Box<dyn Any + Send>>,
    sharer: Sharer,
}

type DynShare = Arc<dyn Fn(&(dyn Any + Send)) -> Option<Box<dyn Any + Send>> + Send + Sync>;

#[derive(Clone)]
enum Sharer {
    /// By `Clone` (a function pointer: no allocation per call).
    Fn(fn(&(dyn Any + Send)) -> Option<Box<dyn Any + Send>>),
    /// By the caller's share function.
    Dyn(DynShare),
}

impl Erased {
    fn share(&self) -> Erased {
        let value = self.value.as_deref().and_then(|v| match &self.sharer {
            Sharer::Fn(f) => f(v),
            Sharer::Dyn(f) => f(v),
        });
        Erased {
            value,
            sharer: self.sharer.clone(),
        }
    }
}

fn share_clone<R: Clone + Send + 'static, E: Clone + Send + 'static>(
    v: &(dyn Any + Send),
) -> Option<Box<dyn Any + Send>> {
    let r = v.downcast_ref::<Result<R, RunError<E>>>()?;
    Some(Box::new(r.clone()))
}

/// The sharer of `run_shared_with*`: a follower gets `share` of the leader's success (`None`:
/// unshareable), and its error by `Clone`.
fn share_with<R, E, S>(share: S) -> Sharer
where
    R: Send + 'static,
    E: Clone + Send + 'static,
    S: Fn(&R) -> Option<R> + Send + Sync + 'static,
{
    let sharer: DynShare = Arc::new(move |v: &(dyn Any + Send)| {
        let r = v.downcast_ref::<Result<R, RunError<E>>>()?;
        let shared: Result<R, RunError<E>> = match r {
            Ok(x) => Ok(share(x)?),
            Err(e) => Err(e.clone()),
        };
        Some(Box::new(shared) as Box<dyn Any + Send>)
    });
    Sharer::Dyn(sharer)
}

/// The de-duplication of an [`LlmBulkhead`].
pub(super) struct SharedDedup {
    settings: DedupSettings,
    flights: Dedup<Erased>,
}

impl SharedDedup {
    /// Whether calls that do not opt out are de-duplicated ([`DedupSettings::enabled`]).
    pub(super) fn enabled(&self) -> bool {
        self.settings.enabled
    }
}

/// What a shared run does once registered: run on its own, or take part in a flight.
enum Path<U, F, C> {
    Solo(LlmBulkhead, crate::Demand, RunOptions<U>, F),
    /// A flight, with what a follower needs to count and report its own failures (a leader
    /// always gets its own result, so it takes no reference to them).
    Flight(
        super::dedup::DedupRun<Erased>,
        Option<(
            Option<ClassId>,
            Arc<SharedDedup>,
            crate::Bulkhead,
            crate::Demand,
        )>,
        C,
    ),
}

/// A 64-bit tag of a type, from its `TypeId`.
fn type_tag<T: 'static>() -> u64 {
    #[derive(Default)]
    struct Fold(u64);
    impl Hasher for Fold {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
        fn write_u64(&mut self, v: u64) {
            self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        fn write_u128(&mut self, v: u128) {
            self.write_u64(v as u64);
            self.write_u64((v >> 64) as u64);
        }
    }
    let mut h = Fold(0xcbf2_9ce4_8422_2325);
    TypeId::of::<T>().hash(&mut h);
    h.finish()
}

impl LlmBulkhead {
    /// The same front end with bulkhead-level de-duplication for
    /// [`run_shared`](Self::run_shared) and [`run_shared_with`](Self::run_shared_with).
    /// Clones share the map.
    ///
    /// # Errors
    /// [`EstimateError::InvalidSetting`] (`max_in_flight` is 0).
    ///
    /// ```
    /// use llm_bulkhead::llm::{DedupSettings, LlmBulkhead, NaiveEstimator};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
    ///     .with_dedup(DedupSettings::default())
    ///     .unwrap();
    /// assert!(LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
    ///     .with_dedup(DedupSettings { max_in_flight: 0, ..DedupSettings::default() }).is_err());
    /// # let _ = llm;
    /// ```
    pub fn with_dedup(mut self, settings: DedupSettings) -> Result<LlmBulkhead, EstimateError> {
        if settings.max_in_flight == 0 {
            return Err(EstimateError::InvalidSetting {
                field: "dedup.max_in_flight",
                expected: "above zero",
            });
        }
        let flights = Dedup::with_share(settings.max_in_flight, Erased::share);
        self.dedup = Some(Arc::new(SharedDedup { settings, flights }));
        Ok(self)
    }

    /// The bulkhead's statistics, observe mode's and, when configured, de-duplication's.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, NaiveEstimator};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(2).unwrap(), NaiveEstimator);
    /// assert_eq!(llm.stats().bulkhead.limits.max_concurrent, 2);
    /// ```
    #[must_use = "stats() is a snapshot: reading it changes nothing"]
    pub fn stats(&self) -> LlmStats {
        LlmStats {
            bulkhead: self.bulkhead.stats(),
            observe: self.observe.stats(),
            dedup: self.dedup.as_ref().map(|d| d.flights.stats()),
        }
    }

    /// The class a shared run is partitioned by: the default class when none is named;
    /// an error for a class this bulkhead does not have, or any class without classes.
    fn dedup_class(&self, class: Option<ClassId>) -> Result<Option<ClassId>, EstimateError> {
        let shared = &*self.bulkhead.shared;
        if !shared.classed {
            return match class {
                None => Ok(None),
                Some(_) => Err(EstimateError::InvalidSetting {
                    field: "class",
                    expected: "none: this bulkhead has no admission classes",
                }),
            };
        }
        match class {
            None => Ok(Some(ClassId::new(shared.class_owner, shared.default_class))),
            Some(c) if c.is_of(shared.class_owner) => Ok(Some(c)),
            Some(_) => Err(EstimateError::InvalidSetting {
                field: "class",
                expected: "a class of this bulkhead",
            }),
        }
    }

    /// As [`run`](Self::run), and identical calls in flight share one: when the bulkhead
    /// de-duplicates ([`with_dedup`](Self::with_dedup)) and the call does not opt out
    /// (`options.dedup`), the first call of a key **leads** (it is admitted and runs `work`),
    /// and every identical call meanwhile **follows**: it takes no admission, runs nothing, and
    /// gets a clone of the leader's outcome (a success, its error, a rejection or a deadline
    /// error alike). Registration happens here, synchronously. The key is the bulkhead's key
    /// function of the request, inside `options.dedup_scope` and the admission class (see the
    /// module docs of `src/llm/shared_run.rs` for the partitions and the `Send` design).
    ///
    /// The shared call is owned by the flight: dropping the leader's future does not cancel
    /// the call its followers wait on; it is dropped when every participant is gone (which
    /// releases its admission, as dropping a `run` does). A follower waits at most
    /// `options.wait.timeout` (only when given explicitly), then answers
    /// [`RunError::Shared`]`(Timeout)` while the call goes on; when its own
    /// `options.wait.cancel` token fires it answers [`RunError::Shared`]`(Cancelled)` at once
    /// (counted in `DedupStats::cancelled`, a `dedup` event with outcome `cancelled`), and the
    /// leader and the other followers go on. Each such answer is also a refusal of that caller
    /// (reasons `timeout` and `aborted`): counted in the bulkhead's `rejected` and
    /// `rejected_by_reason`, with a `reject` event.
    ///
    /// At the borrowed-concurrency deadline it answers [`RunError::Deadline`] at expiry, as
    /// [`run`](Self::run) does (the work's future is dropped); with
    /// [`RunOptions::detach_at_deadline`] the work is handed to the spawner instead and goes
    /// on (the seed's behaviour).
    ///
    /// # Cancel safety
    /// Dropping the future leaves the flight (see above); nothing leaks.
    ///
    /// # Errors
    /// As [`run`](Self::run); a class the bulkhead does not have is [`RunError::Invalid`]
    /// before anything joins; a follower's own failures are [`RunError::Shared`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{DedupSettings, LlmBulkhead, LlmRequest, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
    ///     .with_dedup(DedupSettings::default()).unwrap();
    /// let request = LlmRequest::new("gpt-4o", &["What is a bulkhead?"]);
    /// let call = || llm.run_shared(&request, RunOptions::default(), |ctx| Box::pin(async move {
    ///     Ok::<_, ()>(format!("answer of {}", ctx.admission_id()))
    /// }));
    /// let (leader, follower) = (call(), call()); // the second joins the first
    /// let (a, b) = futures_lite::future::block_on(async { (leader.await, follower.await) });
    /// assert_eq!(a.unwrap(), b.unwrap());
    /// let s = llm.stats();
    /// assert_eq!((s.bulkhead.admitted, s.dedup.unwrap().hits), (1, 1));
    /// ```
    pub fn run_shared<R, E, U, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> impl Future<Output = Result<R, RunError<E>>> + Send + 'static
    where
        R: Clone + Send + 'static,
        E: Clone + Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
    {
        self.shared_run(
            request,
            options,
            Sharer::Fn(share_clone::<R, E>),
            work,
            NoWatch,
        )
    }

    /// [`run_shared`](Self::run_shared), also reporting its
    /// [`RunTiming`](crate::llm::RunTiming) (as
    /// [`run_timed`](Self::run_timed)). A leader, or a call not de-duplicated, gets the timing
    /// of its own admission and work; a follower, which takes no admission and runs nothing,
    /// gets its wait for the shared call as `queue_wait_ns` (and `work_ns` `None`). With
    /// `detach_at_deadline`, the work's time ends when it is handed to the spawner.
    ///
    /// # Cancel safety
    /// As [`run_shared`](Self::run_shared).
    ///
    /// # Errors
    /// As [`run_shared`](Self::run_shared), inside [`RunTimed::value`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{DedupSettings, LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
    ///     .with_dedup(DedupSettings::default()).unwrap().with_clock(clock.clone());
    /// let request = LlmRequest::new("gpt-4o", &["hi"]);
    /// let tick = clock.clone();
    /// let leader = llm.run_shared_timed(&request, RunOptions::default(), move |_ctx| Box::pin(async move {
    ///     tick.advance(Duration::from_millis(90)); // the provider call
    ///     Ok::<_, ()>(1)
    /// }));
    /// let follower = llm.run_shared_timed(&request, RunOptions::default(), |_ctx| Box::pin(async { Ok::<_, ()>(2) }));
    /// let (a, b) = futures_lite::future::block_on(async { (leader.await, follower.await) });
    /// assert_eq!((a.value.unwrap(), a.timing.work_ns), (1, Some(90_000_000)));
    /// assert_eq!((b.value.unwrap(), b.timing.queue_wait_ns, b.timing.work_ns), (1, 90_000_000, None));
    /// ```
    pub fn run_shared_timed<R, E, U, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        work: F,
    ) -> impl Future<Output = RunTimed<Result<R, RunError<E>>>> + Send + 'static
    where
        R: Clone + Send + 'static,
        E: Clone + Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
    {
        self.shared_run(
            request,
            options,
            Sharer::Fn(share_clone::<R, E>),
            work,
            self.watch(),
        )
    }

    /// As [`run_shared`](Self::run_shared), for results that are not `Clone` or must not be
    /// handed out twice (a single-consumer stream): each follower gets `share(&result)` of
    /// the leader's success, and the leader keeps the original. `share` answering `None` means
    /// the result cannot be shared (the reference's `unshareable_result`): that follower gets
    /// [`RunError::Shared`]`(Unshareable)`, counted in `DedupStats::unshareable` and seen as a
    /// `dedup` event with outcome `unshareable`, and counted as a refusal with reason
    /// [`RejectReason::UnshareableResult`] (with a `reject` event). A leader's error reaches
    /// followers by `Clone`.
    ///
    /// # Cancel safety
    /// As [`run_shared`](Self::run_shared).
    ///
    /// # Errors
    /// As [`run_shared`](Self::run_shared).
    ///
    /// ```
    /// use llm_bulkhead::llm::{DedupError, DedupSettings, LlmBulkhead, LlmRequest, NaiveEstimator, RunError, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// struct Stream(u32); // not Clone: one consumer only
    /// let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator)
    ///     .with_dedup(DedupSettings::default()).unwrap();
    /// let request = LlmRequest::new("gpt-4o", &["hi"]);
    /// let call = || llm.run_shared_with(&request, RunOptions::default(), |_: &Stream| None,
    ///     |_ctx| Box::pin(async { Ok::<_, ()>(Stream(7)) }));
    /// let (leader, follower) = (call(), call());
    /// let (a, b) = futures_lite::future::block_on(async { (leader.await, follower.await) });
    /// assert_eq!(a.unwrap().0, 7);
    /// assert!(matches!(b, Err(RunError::Shared(DedupError::Unshareable))));
    /// assert_eq!(llm.stats().dedup.unwrap().unshareable, 1);
    /// let rejected = llm.stats().bulkhead.rejected_by_reason;
    /// assert_eq!(rejected.get(llm_bulkhead::RejectReason::UnshareableResult), 1);
    /// ```
    pub fn run_shared_with<R, E, U, S, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        share: S,
        work: F,
    ) -> impl Future<Output = Result<R, RunError<E>>> + Send + 'static
    where
        R: Send + 'static,
        E: Clone + Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        S: Fn(&R) -> Option<R> + Send + Sync + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
    {
        self.shared_run(
            request,
            options,
            share_with::<R, E, S>(share),
            work,
            NoWatch,
        )
    }

    /// [`run_shared_with`](Self::run_shared_with), also reporting its
    /// [`RunTiming`](crate::llm::RunTiming), as [`run_shared_timed`](Self::run_shared_timed).
    ///
    /// # Cancel safety
    /// As [`run_shared`](Self::run_shared).
    ///
    /// # Errors
    /// As [`run_shared_with`](Self::run_shared_with), inside [`RunTimed::value`].
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, ManualClock, NaiveEstimator, RunOptions};
    /// use llm_bulkhead::Bulkhead;
    /// use std::time::Duration;
    /// struct Stream(u32); // not Clone
    /// let clock = ManualClock::new();
    /// let llm = LlmBulkhead::new(Bulkhead::new(4).unwrap(), NaiveEstimator).with_clock(clock.clone());
    /// let tick = clock.clone();
    /// let t = futures_lite::future::block_on(llm.run_shared_with_timed(&LlmRequest::default(),
    ///     RunOptions::default(), |_: &Stream| None, move |_ctx| Box::pin(async move {
    ///         tick.advance(Duration::from_millis(8));
    ///         Ok::<_, ()>(Stream(3))
    ///     })));
    /// assert_eq!((t.value.unwrap().0, t.timing.work_ns), (3, Some(8_000_000)));
    /// ```
    pub fn run_shared_with_timed<R, E, U, S, F>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        share: S,
        work: F,
    ) -> impl Future<Output = RunTimed<Result<R, RunError<E>>>> + Send + 'static
    where
        R: Send + 'static,
        E: Clone + Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        S: Fn(&R) -> Option<R> + Send + Sync + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
    {
        self.shared_run(
            request,
            options,
            share_with::<R, E, S>(share),
            work,
            self.watch(),
        )
    }

    /// The body of the `run_shared*` calls: `w` takes the readings (none, untimed).
    fn shared_run<R, E, U, F, W>(
        &self,
        request: &LlmRequest,
        options: RunOptions<U>,
        sharer: Sharer,
        work: F,
        mut w: W,
    ) -> impl Future<Output = W::Out<Result<R, RunError<E>>>> + Send + 'static
    where
        R: Send + 'static,
        E: Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
        W: Stopwatch + Clone + 'static,
    {
        // Validation, estimation, the class and the key now, before anything joins.
        let prepared = Self::check_deadline(&options.borrowed_concurrency_deadline)
            .and_then(|()| self.check_unclustered())
            .and_then(|()| self.dedup_class(options.class))
            .map_err(RunError::Invalid)
            .and_then(|class| {
                let demand = self.demand(request, &options).map_err(RunError::Invalid)?;
                Ok((class, demand))
            });
        let joined = prepared.map(|(class, demand)| {
            let dedup = self.dedup.as_ref();
            let key = dedup.and_then(|d| {
                if !(d.settings.enabled && options.dedup) {
                    return None;
                }
                let scope = options.dedup_scope.as_deref().unwrap_or("");
                let key = match &d.settings.key {
                    None => Some(DedupKey::for_request(request, scope, class)),
                    Some(f) => f(request).map(|k| k.partition(scope, class)),
                };
                key.map(|k| k.typed(type_tag::<Result<R, RunError<E>>>()))
            });
            let llm = self.clone();
            let (Some(key), Some(d)) = (key, dedup) else {
                // Not de-duplicated: the plain run, without the map, the box or the erasure.
                return Path::Solo(llm, demand, options, work);
            };
            // A follower's wait starts here (a leader's timing is its call's, left in `cell`).
            w.start();
            let leader_watch = w.clone();
            let cell = w.cell();
            let leader_cell = cell.clone();
            let follower = FollowerOptions {
                timeout: match options.wait.timeout {
                    crate::QueueTimeout::After(d) => Some(d),
                    crate::QueueTimeout::Default | crate::QueueTimeout::Unbounded => None,
                },
                cancel: options.wait.cancel.clone(),
            };
            // The execution itself is the flight's work (no future around it that would hold
            // its arguments a second time).
            let call = move || {
                llm.execute(demand, options, work, leader_watch, move |out, w: W| {
                    w.publish(&leader_cell);
                    Erased {
                        value: Some(Box::new(out)),
                        sharer,
                    }
                })
            };
            let flight = d.flights.run(Some(key), follower, call);
            let follower = flight.is_follower().then(|| {
                self.dedup_event(class, DedupOutcome::Joined);
                (class, d.clone(), self.bulkhead.clone(), demand)
            });
            Path::Flight(flight, follower, cell)
        });
        async move {
            let (flight, follower, cell) = match joined {
                Err(e) => return w.wrap(Err(e)),
                Ok(Path::Solo(llm, demand, options, work)) => {
                    return llm
                        .execute(demand, options, work, w, |out, w: W| w.wrap(out))
                        .await;
                }
                Ok(Path::Flight(flight, follower, cell)) => (flight, follower, cell),
            };
            // A follower's failure, counted and reported (a leader has none: it gets its own
            // result, never a share, a timeout or a cancellation of its own).
            let failed = |e: DedupError, count: bool| {
                if let Some((class, dedup, bulkhead, demand)) = &follower {
                    if count {
                        dedup.flights.count_unshareable();
                    }
                    let (outcome, reason) = match e {
                        DedupError::Unshareable => {
                            (DedupOutcome::Unshareable, RejectReason::UnshareableResult)
                        }
                        DedupError::Timeout => (DedupOutcome::Timeout, RejectReason::Timeout),
                        DedupError::Cancelled => (DedupOutcome::Cancelled, RejectReason::Aborted),
                    };
                    emit_dedup(bulkhead, *class, outcome);
                    // A refusal of this caller as well (the reference's dedup-wait rejection):
                    // counted by reason (and per class), with a `reject` event.
                    drop(bulkhead.waiter_refusal(reason, demand));
                }
                Err(RunError::Shared(e))
            };
            let out = match flight.await {
                Ok(Erased { value: Some(v), .. }) => match v.downcast::<Result<R, RunError<E>>>() {
                    Ok(out) => *out,
                    // Unreachable: keys are typed by the result type.
                    Err(_) => failed(DedupError::Unshareable, true),
                },
                // The share function declined for this follower.
                Ok(Erased { value: None, .. }) => failed(DedupError::Unshareable, true),
                // A share function that panicked (counted by the map), the follower's own
                // timeout or cancellation (counted by the map too).
                Err(e) => failed(e, false),
            };
            if follower.is_some() {
                w.followed();
                return w.wrap(out);
            }
            w.wrap_from(&cell, out)
        }
    }

    fn dedup_event(&self, class: Option<ClassId>, outcome: DedupOutcome) {
        emit_dedup(&self.bulkhead, class, outcome);
    }

    /// The admission, the work and the release of a shared call (the body of `run`, with a
    /// boxed work future so that the whole is `Send`), its outcome handed to `finish`. It owns
    /// the bulkhead, so that it can be a flight's work as it is.
    ///
    /// Not an `async fn`: the options are taken apart first, so that the future holds only
    /// the parts it uses, once (an `async fn` would keep its argument and the parts).
    fn execute<R, E, U, F, O, W>(
        self,
        demand: crate::Demand,
        options: RunOptions<U>,
        work: F,
        mut w: W,
        finish: impl FnOnce(Result<R, RunError<E>>, W) -> O + Send + 'static,
    ) -> impl Future<Output = O> + Send + 'static
    where
        R: Send + 'static,
        E: Send + 'static,
        U: UsageFrom<R> + Send + 'static,
        F: for<'c> FnOnce(&'c mut RunContext) -> BoxWork<'c, R, E> + Send + 'static,
        W: Stopwatch + 'static,
    {
        let RunOptions {
            wait,
            borrowed_concurrency_deadline: deadline,
            usage,
            mode,
            detach_at_deadline,
            ..
        } = options;
        async move {
            let caller = wait.cancel.clone();
            w.start();
            let mut ctx = match admit_now(&self.bulkhead, &demand, &wait) {
                Some(a) => RunContext::new(a, deadline),
                None => {
                    w.waiting();
                    let queued = w.queued();
                    let admitted = match mode {
                        Mode::Enforce => {
                            Box::pin(acquire_noting(&self.bulkhead, demand, wait, queued))
                                .await
                                .map(|a| RunContext::new(a, deadline))
                        }
                        Mode::Observe(shadow) => {
                            Box::pin(self.observe_async(demand, wait, shadow, deadline, queued))
                                .await
                        }
                    };
                    match admitted {
                        Ok(ctx) => ctx,
                        Err(e) => {
                            w.decided();
                            return finish(Err(RunError::Rejected(e)), w);
                        }
                    }
                }
            };
            w.admitted(&mut ctx);
            ctx.set_caller(caller);
            let Some((signal, expired)) = ctx.deadline_watch() else {
                let out = work(&mut ctx).await;
                w.ended();
                let out = settle(&mut ctx, out, &usage);
                drop(ctx);
                return finish(out, w);
            };
            let Some(detach) = detach_at_deadline else {
                // As `run`: answered at expiry, the work dropped (nowhere to detach it to).
                let out = race_deadline(work(&mut ctx), &signal).await;
                w.ended();
                let out = settle_raced(&mut ctx, out, &usage, expired);
                drop(ctx);
                return finish(out, w);
            };
            // The work owns its context, so that it can outlive this run if the deadline detaches it.
            let mut body: Pin<Box<dyn Future<Output = Result<R, RunError<E>>> + Send>> =
                Box::pin(async move {
                    let out = work(&mut ctx).await;
                    settle(&mut ctx, out, &usage)
                });
            let out = std::future::poll_fn(move |cx| {
                if let std::task::Poll::Ready(out) = body.as_mut().poll(cx) {
                    return std::task::Poll::Ready(out);
                }
                signal.register(cx.waker());
                if !signal.deadline_fired() {
                    return std::task::Poll::Pending;
                }
                // Expired: answer now; the work goes on where the application runs it, and its
                // tokens are settled when it ends.
                let rest = std::mem::replace(&mut body, Box::pin(std::future::pending()));
                detach(Box::pin(async move {
                    let _ = rest.await;
                }));
                std::task::Poll::Ready(Err(RunError::Deadline(expired.clone())))
            })
            .await;
            w.ended();
            finish(out, w)
        }
    }
}

fn emit_dedup(bulkhead: &crate::Bulkhead, class: Option<ClassId>, outcome: DedupOutcome) {
    let shared = &*bulkhead.shared;
    super::events::emit(bulkhead, || DedupEvent {
        class: crate::handle::events::class_name(shared, class.map(ClassId::index)),
        outcome,
    });
}
