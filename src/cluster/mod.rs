//! Cluster mode (feature `cluster`): one global concurrency limit and token budget shared by
//! several replicas of a gateway, each replica admitting locally and lock-free against a
//! *leased share* kept in Redis.
//!
//! ```text
//!                 ┌──────────────── Redis (one primary) ────────────────┐
//!                 │ {ns/budget}:v2:meta    epoch, seq, learning_until,  │
//!                 │                        params (with class limits)   │
//!                 │ {ns/budget}:v2:leases  replica → applied, granted,  │
//!                 │        held, wants, renewed_at; the same per class  │
//!                 └───────▲─────────────────────▲─────────────────▲─────┘
//!       one EVALSHA per   │ renew every ttl/3   │                 │
//!       renewal, no store │ (held, wants,       │                 │
//!       call per request  │  applied, per class)│                 │
//!                         │ → grant, per class  │                 │
//!                 ┌───────┴──────┐      ┌───────┴──────┐   ┌──────┴───────┐
//!                 │ agent thread │      │ agent thread │   │ agent thread │
//!                 │ apply_limits │      │ apply_limits │   │ apply_limits │
//!                 │   Bulkhead   │      │   Bulkhead   │   │   Bulkhead   │
//!                 └──────────────┘      └──────────────┘   └──────────────┘
//!                   replica 1              replica 2          replica 3
//! ```
//!
//! The decision path is the core's, unchanged: the agent only calls
//! [`Bulkhead::apply_limits`](crate::Bulkhead::apply_limits) and
//! [`Bulkhead::stats`](crate::Bulkhead::stats). The bulkhead is built with the **global**
//! limits; the agent reads them once, installs share zero, and from then on installs its
//! lease as revisioned snapshots (it must be the only caller of `apply_limits`).
//!
//! # The pieces
//!
//! * [`renew`] / [`release`] (`allocator.rs`): the store-side decision, pure. A
//!   demand-weighted fair share (each replica's demand raised to the floor; demand plus an
//!   equal part of the spare when demands fit, max-min water-filling when they do not), capped
//!   by what the other replicas' reservations leave.
//! * Class shares (`classes.rs`, `class_view.rs`): each admission class's global floor and
//!   ceiling split the same way, by the class's own demand ([`ClassUse`]: the class's work in
//!   flight, raised under class refusals or a queue at its ceiling), with a per-replica class
//!   floor ([`ClassParams::min`]); the agent installs the share and its class limits in one
//!   `apply_limits` snapshot.
//! * [`Lease`] (`lease.rs`): the replica-side validity and degraded mode, pure.
//! * [`LeaseStore`]: [`MemoryStore`] (the allocator behind a mutex, with an injected clock) and
//!   [`RedisStore`] (the same algorithm as one Lua script per update).
//! * [`ClusterAgent`]: the thread that renews, applies and reports ([`ClusterAgent::spawn`]);
//!   with the feature `cluster-tokio`, the same steps as a tokio task
//!   (`ClusterAgent::spawn_on`, `AsyncAgent`, `TokioClock`).
//! * [`ClusterBulkhead`] (`gate.rs`): the handle to admit through. It closes the share's
//!   window on the admitting thread and gives every admission its deadline (below, A3 and A4);
//!   `CoarseClock` (`coarse.rs`, Linux) makes its one clock read cheap.
//! * [`ShareTooSmall`] (`share_fit.rs`): on the handle and the layers built over it, a token
//!   reservation is "never fits" only above the **global** limits; one that fits them but not
//!   the installed share (zero while learning or degraded, or small) is a retryable refusal
//!   ([`ClusterRejection::ShareTooSmall`]; the tower layer's 503 `share_too_small` with a
//!   `Retry-After` of the renewal period), and the agent's next renewal asks for room for it.
//!   Judged after the core refused; the core's decision path carries nothing of it.
//!
//! # The invariant, and what it assumes
//!
//! **I2 (store):** after every store write, the sum over live records of
//! `max(applied, granted, held)` is at most the global limits, per resource. **Per class**, the
//! sum of the reserved class floors (`max(applied, granted)`) is at most the class's global
//! floor, and the sum of the reserved class ceilings (`max(applied, granted, held)`, `held`
//! the class's work in flight) at most its global ceiling, per resource. (A class ceiling at
//! the global limit is no bound of its own: it is not split, and the global sum bounds it.)
//! **I3 (cluster):** no replica admits beyond its currently valid share and class limits, so at
//! every instant the slots and token reservations admitted across all replicas are at most the
//! global limits, and those of each class at most its global ceiling.
//!
//! How: growing, the store reserves before the replica applies (a grant counts from the write
//! that makes it). Shrinking, the replica applies first (attrition) and the store keeps the
//! larger reservation until a later renewal reports the smaller share applied and `held` (the
//! work in flight) below it. Classes follow the same rule, class by class: a smaller class
//! ceiling frees nothing until the replica reports it installed and its class work fits; a
//! smaller class floor until the replica reports it installed (the core counts a class's work
//! as protected only up to its installed floor, so no in-flight term is needed there). The
//! agent may install less than a class grant (a floor cut to its ceiling, the floors cut to
//! the share), never more; the store keeps the grant reserved. A class's share lives and lapses
//! with its replica's record (`ttl + quarantine`), and on the floor the replica keeps at most
//! `min(grant, floor)` of each class limit. The class invariant rests on the same assumptions
//! A1–A5 and on **A6**: every replica of a budget has the same class table (names, order and
//! global limits), which the store checks (a table created with other classes refuses the
//! request). A replica's record lives `ttl + quarantine` after its last
//! renewal, store time; the replica's own validity ends earlier (see [`Lease`]), then it keeps
//! at most its pre-reserved floor for `floor_hold`, then zero. An empty store (first start,
//! restart without data) and a replica reporting an epoch or a sequence the store does not
//! have put the table in *learning mode* for `ttl + quarantine`: nobody grows, a replica keeps
//! at most what it has installed or in flight, a new replica gets zero.
//!
//! Assumptions:
//! * **A1** one linearizable store for the budget's keys (one Redis primary). A failover that
//!   loses acknowledged writes is detected at the next renewal of a replica that saw them
//!   (epoch, sequence) and bounded by it, but not excluded.
//! * **A2** replica and store clock *rates* differ by at most `rate_bound_ppm`, and the store's
//!   clock does not step forward by more than the slack in `quarantine`.
//! * **A3** no admission commits after the end of the installed share's window. Through a
//!   [`ClusterBulkhead`] the crate enforces it on the admitting thread: the window's end is
//!   checked on the agent's clock right after the core's commit (an admission past it is given
//!   back), so an agent thread that runs late (descheduled, or in `apply_limits` waiting out a
//!   grace period behind preempted workers) no longer extends its share, and neither does an
//!   admitting thread paused before its commit. The LLM and tower layers built over the handle
//!   (`LlmBulkhead::clustered`, `BulkheadLayer::clustered`) make the same check after their
//!   own commit. Admissions taken on the [`Bulkhead`](crate::Bulkhead) directly (or through
//!   layers built over it) stay within the installed share but rely on the agent thread to
//!   change it within `margin` of its deadlines, as before. A store that stops answering does not delay the agent: each store
//!   call is bounded by the time left until the installed share must change
//!   ([`LeaseStore::set_call_timeout`]).
//! * **A4** every admission ends within `max_admission`. The crate gives every admission
//!   through a [`ClusterBulkhead`] its deadline ([`ClusterAdmission::deadline_ms`]), fires
//!   its [`CutSignal`] there, and [`ClusterBulkhead::run`] drops the work at it, as does the
//!   LLM layer's async `run` built over the handle (its `run_blocking` fires the run's stop
//!   signal there and answers `Cut` when the work returns). It does not
//!   release capacity under work that is still running: the global bound is about what runs
//!   upstream, and a slot handed back early would hide exactly the overshoot it is meant to
//!   prevent. Work that overruns is surfaced instead: releases after the deadline are counted
//!   ([`AgentStatus::overdue`], [`AgentEvent::OverdueReleased`]), and work still in flight
//!   `max_admission` after the share dropped to zero is reported as
//!   [`AgentEvent::AdmissionOverdue`]. The configuration requires `quarantine ≥ floor_hold +
//!   max_admission` plus slack ([`ClusterConfig::validate`]).
//! * **A5** replica ids are unique per process start (the agent draws one).
//!
//! Usage growth after admission (a usage report above the reservation) is accounting, not
//! admission, as in [contract §10](crate::contract). [`Degrade::FailOpen`] gives all this up:
//! up to R× the global limit with R replicas.
//!
//! # Failures, typed
//!
//! A demand above the global limit, parameters that differ from the table's, a corrupt or
//! foreign value under the crate's keys, a refused script, a server older than 5.0, an
//! unreachable server: each is a [`StoreError`]; the agent then keeps its lease only until its
//! local validity ends and degrades ([`Degrade`]). Nothing panics and no error adds capacity.
//! The Redis URL (it may carry a password) never appears in an error or an event. For classes:
//! a class the table does not know ([`AllocError::UnknownClass`]), a class demand above its
//! global ceiling ([`AllocError::AboveClassLimit`]), class limits that do not fit the global
//! ones ([`AllocError::AboveGlobal`]), a corrupt per-class value ([`StoreError::Corrupt`]); and
//! a class name the store cannot hold is refused when the agent is built
//! ([`ClusterConfigError::BadName`]`("class")`).
//!
//! # Store format
//!
//! The keys carry the format version (`v2`: format 1 plus the per-class shares). A replica of
//! format 1 reads only the `v1` keys, so every format-2 renewal marks format 1's meta key with
//! format 2: the format-1 script then answers a foreign format and that replica degrades
//! fail-closed. A new format-2 table learns for `ttl + quarantine`, which outlasts what a
//! format-1 replica still holds, and so does a table that finds a format-1 table appeared
//! under the old key (its mark deleted); never more capacity. Upgrading is therefore a restart of all
//! replicas, with the learning period as the pause in growth.

mod agent;
mod allocator;
mod class_view;
mod classes;
#[cfg(target_os = "linux")]
mod coarse;
mod gate;
mod lease;
mod redis;
mod share_fit;
mod store;
#[cfg(feature = "cluster-tokio")]
mod task;

pub use agent::{AgentEvent, AgentStatus, Clock, ClusterAgent, RunningAgent, SystemClock};
pub use allocator::{
    release, renew, reserved_class_totals, reserved_total, AllocError, Amounts, LeaseTable, Meta,
    Record, RenewReply, RenewRequest, StoreParams, MAX_AMOUNT, MAX_CLASSES, MAX_REPLICAS,
};
pub use classes::{ClassParams, ClassRecord, ClassShare, ClassUse};
#[cfg(target_os = "linux")]
pub use coarse::CoarseClock;
pub use gate::{ClusterAdmission, ClusterBulkhead, ClusterRejection, ClusterRunError, CutSignal};
#[cfg(any(feature = "llm", feature = "tower"))]
pub(crate) use gate::{ClusterWindow, Ticket};
pub use lease::{ClusterConfig, ClusterConfigError, Degrade, Lease, Phase};
pub use redis::RedisStore;
pub use share_fit::ShareTooSmall;
pub use store::{LeaseStore, MemoryStore, StoreError};
#[cfg(feature = "cluster-tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster-tokio")))]
pub use task::{AsyncAgent, TokioClock};
