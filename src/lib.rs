//! # llm-bulkhead
//!
//! A lock-free admission controller for LLM gateways. For every call a gateway is about to
//! make it answers *should this run right now?*: it admits or refuses a [`Demand`] (a
//! concurrency slot, an optional token [`Reservation`], a [`Priority`]) against a global
//! concurrency limit and an in-flight token budget, from any number of threads, with one CAS
//! on one packed atomic word and no lock.
//!
//! ```
//! use llm_bulkhead::{Bulkhead, Demand, RejectReason, Reservation, Usage};
//!
//! let bulkhead = Bulkhead::builder()
//!     .max_concurrent(8)
//!     .token_budget(50_000)
//!     .high_priority_reserve(5_000)
//!     .build()?;
//!
//! // Reserve estimated input + max output tokens before calling the provider.
//! let demand = Demand::tokens(Reservation::new(1_200, 800)?);
//! match bulkhead.try_acquire(demand) {
//!     Ok(admission) => {
//!         // ... call the provider ...
//!         let report = admission.release(Some(Usage::new(1_150, 310)))?;
//!         assert_eq!(report.refunded, 2_000 - 1_460);
//!     }
//!     Err(rejection) => {
//!         // Answer 429/503 with `rejection` (it serialises with the `serde` feature).
//!         assert_ne!(rejection.reason, RejectReason::Shutdown);
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Where things are
//!
//! Every public type is exported here, at the root, and has this one path; the modules below
//! are the crate's source layout, bottom layer first (imports only go down; `tests/layers.rs`
//! checks it):
//!
//! * `src/sync.rs`: the facade every atomic, lock and thread goes through (std or loom).
//! * `src/vocab/`: the vocabulary: [`Demand`], [`Reservation`], [`Rejection`] and its reasons,
//!   the errors, [`AdmissionId`].
//! * `src/words/`: the packed atomic words and the limits they are read against:
//!   `state.rs` (the no-class word, and the protocol notes: which operation is wait-free,
//!   lock-free or blocking, and why), revisioned [`LimitsSnapshot`]s and the ring the fast
//!   path reads them from (`limits.rs`), the class table (`classes.rs`: [`ClassTable`],
//!   [`ClassLimits`]).
//! * `src/record/`: events for subscribers ([`Event`], [`Bulkhead::subscribe`]) and the
//!   per-thread statistics behind [`Bulkhead::stats`]; `src/grace.rs`: the grace period of
//!   reconfiguration.
//! * `src/wait/list.rs`: the waiter list; `src/shared.rs`: the state block every handle and
//!   admission shares, and what keeps it alive.
//! * `src/protocol/`: how decisions change the words: the no-class protocol (`plain.rs`: the
//!   one-CAS enter, the refusal, the decision under the queue mutex, the returns of tokens;
//!   `handoff.rs`: the hand-off to waiters, the pump, close), the class protocol (`classed.rs`:
//!   floors, ceilings, borrowing from the shared remainder; `class_pump.rs`: its queue side),
//!   token waiting (`token_wait.rs`) and the install of a limits snapshot (`install.rs`: the
//!   ring, the tag bump, the class migration, the grace period).
//! * `src/wait/`: blocking acquire, the [`Acquire`] future, [`Drain`], [`CancelToken`], the
//!   timer: they hold the queue mutex and link or unlink nodes; every decision they need is
//!   the protocols'.
//! * `src/handle/`: [`Bulkhead`] (decisions, `apply_limits`, `close`, `stats`), [`Admission`]
//!   (usage reports, release, abandonment), [`Bulkhead::would_admit`] (the advisory decision).
//! * `model` and `conformance` (feature `testing`): the sequential reference model the engine
//!   is tested against, and the harness that drives both.
//! * `llm` (default feature `llm`): chat requests as gateways receive them, and token
//!   estimation (naive, model-aware, custom) that turns them into reservations, and
//!   `LlmBulkhead` (`estimate`, `would_admit`, `run_blocking`, async `run`).
//! * `config` (feature `serde`; JSON with `json`, TOML with `toml`): `BulkheadConfig` and
//!   class-named `LimitsConfig` snapshots for files and control planes.
//! * `tower` (feature `tower`): a `Layer` for HTTP gateways that holds each admission until the
//!   last byte of the response body, with 429/503 JSON refusals.
//! * `telemetry` (features `tracing`, `metrics`): tracing events and metrics, no exporter.
//! * `cluster` (feature `cluster`): one global budget shared by several replicas as leased
//!   shares kept in Redis, applied to each replica's bulkhead as revisioned snapshots
//!   (`cluster-tokio`: the agent as a tokio task).
//! * `pools` (feature `serde`): gateway pools, provider × traffic-class partitions behind a
//!   global guard, with connection limits, retry budgets, overflow actions and fallbacks.
//! * [`contract`]: the behaviour contract (cited as "contract §N"); [`guide`]: the user guide.
//!
//! ## Features
//!
//! `llm` (default, with `json` and `serde`), `serde` (derives only), `json`, `toml`, `tower`,
//! `tracing`, `metrics`, `cluster`, `cluster-tokio`; `--no-default-features` is the bare core. `testing` is test support.
//!
//! ## Guarantees (contract §10)
//!
//! * **Safety:** no admission makes the slots in use exceed `max_concurrent` or the tokens
//!   held exceed the effective budget. Only usage reports (accounting, not admission) can push
//!   tokens past the budget.
//! * **No leaks:** once every admission is released or dropped, slots and tokens in flight are
//!   zero, whatever the interleaving, including panics (an admission releases on drop).
//! * **Progress:** `try_acquire` and release are lock-free and take no lock, also while a
//!   drain waits; a release takes the queue's lock only to hand its slot to a queued waiter (or,
//!   during a drain, to wake the drainers once the bulkhead is idle). A thread's very first
//!   decision may block briefly on the `thread_local` crate's global thread-id lock (once per
//!   thread). The per-operation table is in `src/words/state.rs`.
//! * **Atomic reconfiguration:** once `apply_limits` returns, no decision made under an older
//!   snapshot can succeed (a grace period keeps any limits tag from being reused under a
//!   stopped decision of the same bulkhead; it waits for nothing else); every admission keeps
//!   the revision that authorised it.
//! * **Precision:** without classes, a refusal is explained by one real state: no request is
//!   refused because of another request's tentative step. With classes a decision takes steps
//!   on two words, and a step that another decider sees before it is taken back can refuse a
//!   request that no serial order refuses. Some such steps are avoided: a borrower whose
//!   reservation holds its whole demand stands from that reservation, whatever
//!   reconfiguration follows (also one that changes its class's limits under it); a borrower
//!   whose class step came before a reconfiguration's
//!   change of the tag stands under its tag (the install marks every class word first); any
//!   other step that a reconfiguration overtakes (a protected step, the collect-checked
//!   path's, a borrower with part of its demand inside its class's floors) is kept and
//!   decided under the new limits, taken back only when they refuse it; the collect-checked
//!   path takes no step that its own collect already refuses; and a refusal that a fresh
//!   collect contradicts is decided again, up to 256 times and yielding, outside any
//!   operation, while the step in progress lands. Others remain: a kept step that the new
//!   limits refuse, a borrower's reservation whose class moved under it (a ceiling reached,
//!   a class that now needs more than was reserved, or, for a reservation that does not hold
//!   its whole demand, a change of the class's limits), a step taken back
//!   because the bulkhead closed or the stored amounts passed a limit, and a step in progress
//!   that outlasts those retries. A refusal's constraint is derived from its collect (a demand
//!   inside its floors is never labelled `admission_class_protection`), but such refusals are
//!   not excluded: `tests/stress_classes.rs` and `tests/spurious_refusals.rs` measure them (see
//!   the README's Performance section).
#![deny(unsafe_op_in_unsafe_fn)]
// The facade rule (`src/sync.rs`, `clippy.toml`): for the library only.
#![warn(clippy::disallowed_types, clippy::disallowed_methods)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// The state words are 64-bit atomics, and a decision is one CAS on one of them: without native
// 64-bit atomics there is no lock-free admission (a lock-based emulation would make every
// decision a lock). Say so plainly rather than fail on an unresolved import.
#[cfg(not(target_has_atomic = "64"))]
compile_error!(
    "llm-bulkhead needs native 64-bit atomics (target_has_atomic = \"64\"): its admission \
     decision is one CAS on a packed 64-bit word"
);

// The layers, bottom up (tests/layers.rs holds the table and checks every `crate::` path
// against it): the sync facade; the vocabulary; the atomic words and limits; what the layers
// above record (events, statistics) and the grace period; the waiter list; the shared block;
// the protocols; the waits; the public handles; the integrations. Beside the facade, at the
// bottom: the kernel's coarse clocks.
mod grace;
mod handle;
#[cfg(all(
    target_os = "linux",
    any(feature = "coordinator", feature = "cluster", test)
))]
mod os_clock;
mod protocol;
mod record;
mod shared;
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
mod sync;
mod vocab;
mod wait;
mod words;

#[cfg(all(feature = "cluster", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub mod cluster;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod config;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod conformance;
pub mod contract;
#[cfg(feature = "coordinator")]
#[cfg_attr(docsrs, doc(cfg(feature = "coordinator")))]
pub mod coordinator;
// The guide links to the LLM layer and the `config` types, which exist only with `llm` (a
// default feature): without it those links cannot resolve, and the text stays as it is.
#[cfg_attr(not(feature = "llm"), allow(rustdoc::broken_intra_doc_links))]
pub mod guide;
#[cfg(feature = "llm")]
#[cfg_attr(docsrs, doc(cfg(feature = "llm")))]
pub mod llm;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod model;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod pools;
#[cfg(any(feature = "tracing", feature = "metrics"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tracing", feature = "metrics"))))]
pub mod telemetry;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use handle::admission::{Admission, ReleaseError, ReleaseReport, UsageReport};
pub use handle::advice::Advice;
pub use handle::builder::{BulkheadBuilder, Profile};
pub use handle::bulkhead::Bulkhead;
pub use handle::events::Subscription;
pub use record::events::{
    AbandonCause, AbandonEvent, AdmitEvent, Event, ExtensionEvent, Interest, RejectEvent,
    ReleaseEvent, UsageEvent,
};
pub use record::stats::{
    AbandonCauses, ClassStats, ClassesStats, QueueWaits, RejectCounts, SharedStats,
    SharedTokenStats, Stats, TokenStats,
};
pub use vocab::class::{ClassId, Resources, UnknownClass, MAX_CLASSES};
pub use vocab::demand::{Demand, Priority, Reconcile, Reservation, Usage};
pub use vocab::error::{ConfigError, ConfigProblem, UsageError};
pub use vocab::id::AdmissionId;
pub use vocab::never_fits::{FitLimit, NeverFits};
pub use vocab::rejection::{
    CapacityDetail, ClassCapacity, ClassDetail, ClassTokenCapacity, Constraint, RejectReason,
    Rejection, SharedAmount, SharedCapacity, TokenCapacity,
};
pub use wait::cancel::{CancelToken, Cancelled};
pub use wait::multi as multi_wait;
pub use wait::waiting::{
    Acquire, AcquireTimed, Drain, DrainReport, QueueTimeout, Timed, Timing, WaitOptions,
};
pub use words::class_word::{MAX_CLASSED_SLOTS, MAX_CLASSED_TOKENS};
pub use words::classes::{ClassLimits, ClassTable};
pub use words::limits::{
    ApplyLimitsError, BudgetLimits, LimitsChange, LimitsSnapshot, MAX_REVISION,
};
pub use words::state::{MAX_SLOTS, MAX_TOKENS};

/// Test support (feature `testing`; not for production builds): per-thread pause hooks at the
/// protocol steps named by [`PausePoint`](testing::PausePoint), for deterministic race tests,
/// and a per-thread count of wait-queue lock acquisitions ([`queue_locks`](testing::queue_locks)).
#[cfg(all(feature = "testing", not(loom)))]
pub mod testing {
    pub use crate::sync::hooks::{
        clear_pause_hook, live_states, queue_locks, set_pause_hook,
        skip_grace_period_on_this_thread,
    };
    pub use crate::sync::PausePoint;

    /// The number of pending entries in the process's async-deadline timer: waits with a
    /// deadline that are still registered. A cancelled wait (a dropped future, a waiter that
    /// was answered) leaves none behind.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::testing::timer_entries(), 0);
    /// ```
    pub fn timer_entries() -> usize {
        crate::wait::timer::entries()
    }

    /// The stored `(U, V)` of a bulkhead with classes (the shared word: `Σ max(in flight,
    /// floor)` and `Σ max(tokens, token floor)` over the classes, CONTRACT.md §4), which
    /// `stats()` cannot show because it sums the class words; `None` without classes. At rest
    /// they must equal the floor sums of the current limits.
    ///
    /// ```
    /// use llm_bulkhead::{Bulkhead, ClassLimits};
    /// let b = Bulkhead::builder().max_concurrent(4)
    ///     .class("a", ClassLimits { protected_concurrent: 2, ..Default::default() })
    ///     .default_class("a").build().unwrap();
    /// assert_eq!(llm_bulkhead::testing::stored_shared(&b), Some((2, 0)));
    /// ```
    pub fn stored_shared(b: &crate::Bulkhead) -> Option<(u64, u64)> {
        let shared = &*b.shared;
        shared.classed.then(|| {
            let g =
                crate::words::class_word::GWord(shared.word.load(crate::sync::Ordering::SeqCst));
            (g.u(), g.v())
        })
    }
}

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
