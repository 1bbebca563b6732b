//! # A guide to putting a bulkhead in front of an LLM provider
//!
//! This module has no code: it is the crate's user guide, in the order a gateway meets the
//! questions. The rules themselves are in [`contract`](crate::contract).
//!
//! ## 1. Concepts
//!
//! A [`Bulkhead`](crate::Bulkhead) answers one question per provider call: *should this run
//! right now?* It admits or refuses a [`Demand`](crate::Demand): a **slot** (one unit of
//! `max_concurrent`), optionally a **token reservation** (estimated input plus the maximum
//! output) against an in-flight **token budget**, a **priority**, and an **admission class**.
//! An admission holds its slot and tokens until it is released; usage reports shrink (refund)
//! or grow (overrun) its hold on the way. Refusals are fail-fast and carry the figures that
//! explain them; nothing waits unless a bounded queue is configured.
//!
//! Slots bound *how many* calls run; the budget bounds *how much work* is in flight (ten
//! 100,000-token prompts and ten 500-token prompts are the same ten slots). The budget is not
//! a spend cap: tokens come back when calls end.
//!
//! ## 2. Sizing limits and floors
//!
//! * **`max_concurrent`**: the provider's (or your account's) concurrency, divided among the
//!   gateway's replicas. Each replica's bulkhead is local; with N replicas behind a balancer
//!   give each `limit / N`, and let a control plane adjust it ([`config::LimitsConfig`]).
//! * **`token_budget`**: roughly `max_concurrent × a typical reservation`. Too small and long
//!   prompts are refused while slots are free (`budget_limit`); too large and it never binds.
//!   Watch `llm_bulkhead_tokens_in_flight` against `llm_bulkhead_token_budget`.
//! * **`high_priority_reserve`**: tokens only `Priority::High` may use (health checks, paid
//!   tiers, retries of user-facing work).
//! * **Classes** are trusted policy buckets (`interactive`, `batch`, a tenant *tier*), never raw
//!   tenant ids: the table is fixed at construction, which bounds memory and metric
//!   cardinality. A **floor** (`protected_concurrent`, `protected_tokens`) is capacity no
//!   other class may take, even while idle; a **ceiling** (`max_concurrent`, `max_tokens`)
//!   caps the class. Floors must add up to at most the global limits; what is left is shared,
//!   first come, first served. Start with ceilings only (isolation without reservations), and
//!   add a floor for the class whose latency you must protect, sized to its steady load.
//! * **Queue**: `max_queue = 0` (fail-fast, the `interactive` profile) suits interactive
//!   traffic behind a client that retries with backoff; a small queue with a timeout (the
//!   `batch` profile) smooths bursts for batch work. The tower layer queues only with
//!   [`wait_in_queue`]. With `wait_for_tokens(true)` a demand short only of tokens waits too
//!   (strict FIFO); a floor still protects its class then, because a newcomer inside its
//!   class's floors, of a class with nobody queued, is admitted ahead of the queue while the
//!   floors-included sums fit the global limits (CONTRACT.md §2, as stated in `contract`).
//!
//! The whole configuration can live in a file ([`config::BulkheadConfig`], JSON or TOML, with
//! the reference library's camelCase names accepted): unknown fields are errors, so a typo
//! never drops a limit.
//!
//! ## 3. Rolling out with observe mode
//!
//! New limits are best tried without refusing anyone. With the `llm` feature,
//! [`LlmBulkhead::run`](crate::llm::LlmBulkhead::run) in
//! [`Mode::Observe`](crate::llm::Mode) makes every decision and counts it, but runs the work
//! that enforce mode would refuse anyway (a *bypass*: `llm::LlmStats::of(&bulkhead).observe`,
//! `bypass` events read with `llm::LlmEvent::of`, `llm_bulkhead_bypassed_total`), holding
//! nothing for it. The configuration's `mode` and
//! `shadow_reasons` give that mode ([`BulkheadConfig::run_mode`](crate::config::BulkheadConfig::run_mode)).
//! Roll out per partition: observe a class or a route for a few days, compare the would-be
//! refusals with your error budget, then enforce it and observe the next. The tower layer
//! does the same with [`observe`] (one layer per partition: a route, or a stack per class).
//!
//! ## 4. Where the tower layer goes
//!
//! ```text
//!   request ─▶ tracing ─▶ auth ─▶ body-size limit / estimate ─▶ BULKHEAD ─▶ timeout ─▶ provider call
//! ```
//!
//! * **Inside authentication** (and request tracing): the class header must come from the
//!   auth layer, not from the client, and unauthenticated requests should not take slots.
//! * **After the estimate**: a tower layer cannot read the body without buffering it, so
//!   parse the JSON body in a middleware or extractor before the layer and leave a
//!   [`TokenEstimate`] in the request's extensions (the gateway
//!   example does exactly this, bounded to 1 MiB).
//! * **Outside the provider timeout.** A timeout *outside* the bulkhead cancels the layer's
//!   response future, which releases the admission at once, while the provider may still be
//!   generating (and billing) for a request the gateway forgot: capacity is given back that
//!   the provider has not given back. Put the timeout *inside* the layer, around the provider
//!   call: when it fires it drops the upstream request, which closes the upstream connection
//!   (the cancellation OpenAI-compatible servers act on), and only then does the response
//!   travel back through the layer and release. If you cannot cancel upstream work (a
//!   provider that keeps generating after a disconnect), hold the admission until the
//!   upstream call really ends (spawn it and release from the task), or reserve that capacity
//!   with a floor that is never lent, and account the rest as best effort.
//! * **Route-level is fine**: all clones and every `layer()` call share the bulkhead handle,
//!   so `MethodRouter::route_layer` limits what it should (unlike tower's
//!   `ConcurrencyLimitLayer`, which makes a semaphore per clone there: tokio-rs/axum#2582).
//!   Prefer `route_layer` to `layer` so a 405 or 404 takes no slot.
//!
//! ## 5. Streaming
//!
//! The admission lives in the response body: a stream holds its slot and tokens until its
//! last byte, and a client that disconnects releases them when the server drops the body.
//! Hook [`openai_usage`] (or your own parser) into
//! [`usage_from_frames`]: the final
//! usage chunk then refunds the unused reservation before the stream closes, so the next
//! requests see the tokens sooner. Non-streaming services whose bodies are complete can ask
//! for [`ReleaseAt::Headers`].
//!
//! ## 6. Refusals and clients
//!
//! The layer answers **429** for capacity (`concurrency_limit`, `queue_limit`,
//! `budget_limit`, a queue `timeout`) and **503** when the bulkhead is closed (draining for
//! shutdown), with a JSON body whose field names are stable
//! ([`RefusalBody`]). It sends **no `Retry-After`**: a fail-fast
//! bulkhead cannot know when capacity returns, and an invented number synchronises client
//! retries. Clients should retry with jittered exponential backoff. Never map overload to 500.
//!
//! ## 7. Operating it
//!
//! * **Kill switch**: apply a snapshot with `max_concurrent: 0` (the gateway example's
//!   `POST /admin/limits`); new work gets `concurrency_limit`, running work finishes.
//!   [`config::apply_limits_file`](crate::config::apply_limits_file) applies a snapshot file only when its revision
//!   is newer, so a poller can call it on every change.
//! * **Shutdown**: `close()`, then `drain(Some(deadline))`: the listener stops, refused
//!   requests get 503, and the report says what was still running at the deadline.
//! * **Telemetry**: [`telemetry`] (features `tracing`, `metrics`) traces refusals (at `DEBUG`,
//!   with a once-a-second `INFO` summary per reason), reconfigurations and bypasses with
//!   sanitized fields; call `Telemetry::record` when metrics are scraped: it sets every
//!   counter and gauge from `stats()`, so decisions pay nothing for metrics. The crate ships
//!   no exporter.
//!
//! ## 8. Choosing the LLM layer's entry point
//!
//! * **`run` (async)** for work that fits one callback. With a borrowed-concurrency deadline
//!   it answers the caller **at expiry** and drops the work's future (that cancels the
//!   provider call; tokens are settled with the last usage report).
//! * **`run_blocking`** for synchronous work: it runs on the caller's thread, so at expiry it
//!   can only return the slot and set `stop_requested`; the caller hears of the deadline when
//!   the work returns. Poll `stop_requested` in long loops.
//! * **`run_shared`** when identical requests should share one call: configure
//!   [`with_dedup`](crate::llm::LlmBulkhead::with_dedup) and use it (its work returns a boxed
//!   `Send` future). With de-duplication enabled, `run` and `run_blocking` refuse calls that do
//!   not pass `dedup: false`, so a shared call is never silently made twice. Followers that
//!   time out, are cancelled or cannot be given the result count as refusals (`timeout`,
//!   `aborted`, `unshareable_result`), so dashboards built on rejections see them. With
//!   `detach_at_deadline` and your spawner, the caller is answered at expiry and the work
//!   runs on to settle its real usage (the seed's behaviour).
//! * **`try_acquire` / `acquire` / `acquire_blocking`** on `LlmBulkhead` when the work does
//!   not fit a callback (an external lease first, a stream handed elsewhere): they estimate
//!   the request and apply the class, priority and reserve of the same `RunOptions`, and give
//!   back the [`Admission`](crate::Admission) to release yourself. They never de-duplicate.
//!
//! * **`run_timed` / `run_blocking_timed` / `run_shared_timed`** when you want the
//!   reference's `decisionDurationNs` and `queueWaitNs` per call: the same runs, answering
//!   [`RunTimed`](crate::llm::RunTimed) (the result and its decision, queue and work
//!   nanoseconds); the work reads the decision's part from `ctx.timing()`. Only these read a
//!   clock, [`with_clock`](crate::llm::LlmBulkhead::with_clock)'s (a
//!   [`ManualClock`](crate::llm::ManualClock) makes tests exact). For every decision of a
//!   bulkhead, subscribe with `Interest::DECISION_TIMING` instead: admit and reject events then
//!   carry the decision and queue-wait figures (measured by the core, on the system clock).
//!
//! Reports and errors name classes by name (`"class": "batch"`), as events do, so a gateway
//! forwards them as they are. [`contract`](crate::contract) §12 is the exact list.
//!
//! ## 9. Gateway pools: one boundary per provider and traffic class
//!
//! One bulkhead in front of several providers lets a slow provider take the permits a healthy
//! one needs. [`pools`](crate::pools) (feature `serde`, on by default) splits them:
//!
//! * **Partitions** are keyed by provider and traffic class (`primary-interactive`,
//!   `secondary-batch`), optionally split by model family or tenant tier when quotas or
//!   priorities differ. Each has an active limit, a high-priority reserve, an optional token
//!   budget and a retry budget. Each provider has a connection limit its partitions share, and
//!   a global guard bounds them all. Write them as a matrix in TOML or JSON
//!   ([`PoolsConfig`](crate::pools::PoolsConfig)); a typo, a zero or contradictory limit, a
//!   retry percent above 100, an unknown name or a fallback cycle is an error naming its cell.
//! * **One decision.** A request is admitted only when it holds its partition's unit, a
//!   connection of its provider and a unit of the guard together. No count ever passes its
//!   limit, at any instant; a refusal is cheap and gives back what it took. A refusal is
//!   always explained by admitted requests: a decision that finds a count full only with
//!   another decision's units in progress waits for that decision (a few instructions) and
//!   decides on what it leaves, so a unit taken and then given back refuses no one.
//! * **Overflow** is one documented action per class: a fast rejection, a degraded answer the
//!   caller serves, the partition's approved fallbacks in order, each with its own budget, or
//!   a bounded wait (`overflow = "wait"`) in the partition's pending queue, at most
//!   `pending_limit` waiters and `queue_max_age_ms` each.
//!   The route lists every decision, never visits a partition twice and stops at the attempt
//!   budget. Nothing retries on its own.
//! * **Retries** are charged to their partition when decided
//!   ([`charge_retry`](crate::pools::Pools::charge_retry)), held through the back-off and the
//!   attempt, and bounded by `max(percent × active, min)` (Envoy's shape: 20 % and 3 by
//!   default). Let exactly one layer retry: turn the provider SDK's own retries off.
//! * **Rollout**: set `observe = true` on a partition to count what its limits would refuse
//!   (`shadow_refusals`) without refusing, then enforce one partition at a time. Every
//!   decision carries its partition's limit version, so an incident review can tell a limit
//!   change from a provider event.
//! * **Events**: one decision event per decision and one completion event (latency, failure
//!   class) per admitted request, sanitized by construction; the
//!   [`TracingObserver`](crate::pools::PoolsObserver) and metrics observers emit them, and
//!   `Pools::stats` has per-partition counts, including the retry budget's remaining, open and
//!   overflow figures.
//!
//! * **Waiting** ([`admit_blocking`](crate::pools::Pools::admit_blocking),
//!   [`admit_async`](crate::pools::Pools::admit_async)): a waiter starts inside the release
//!   that frees what it needs (its partition's unit, a connection, a guard unit), oldest
//!   first; a waiter blocked on its own partition blocks nobody behind it, and a newcomer
//!   racing with the release never takes the unit it frees for a waiter of another
//!   partition (it defers to the queue when it may have). A waiter older than
//!   the queue age is refused with `queue_age_exceeded` even when the queue is short; a caller
//!   whose deadline is nearer than the age of the oldest waiter is refused at entry
//!   (`deadline_unmeetable`); a full queue refuses with `pending_limit_reached`. A dropped
//!   future leaves the queue and passes on any start it was given (with a dispatch and a
//!   cancelled completion event). Ages and deadlines are read on the pools' clock: inject one
//!   ([`with_clock`](crate::pools::Pools::with_clock)) and drive the waiters' deadlines with
//!   [`expire_waiters`](crate::pools::Pools::expire_waiters) in tests. Size the queue from the
//!   caller's deadline and the provider's service time: a queue that waits longer than the
//!   caller will is only a slower refusal.
//! * **In a gateway**: the tower `PoolsLayer` (feature `tower`) classifies each request from
//!   its headers, routes it through the pools and holds the permit to the last body byte;
//!   `examples/pools_gateway` runs two providers behind it, and the main demo
//!   (`cargo run --release --example demo`) ends with the seed's slow-provider scenario,
//!   checked claim by claim.
//!
//! [`config::LimitsConfig`]: crate::config::LimitsConfig
//! [`config::BulkheadConfig`]: crate::config::BulkheadConfig
#![cfg_attr(
    feature = "tower",
    doc = "[`wait_in_queue`]: crate::tower::BulkheadLayerBuilder::wait_in_queue
[`observe`]: crate::tower::BulkheadLayerBuilder::observe
[`TokenEstimate`]: crate::tower::TokenEstimate
[`openai_usage`]: crate::tower::openai_usage
[`usage_from_frames`]: crate::tower::BulkheadLayerBuilder::usage_from_frames
[`ReleaseAt::Headers`]: crate::tower::ReleaseAt::Headers
[`RefusalBody`]: crate::tower::RefusalBody"
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`wait_in_queue`]: crate#modules
[`observe`]: crate#modules
[`TokenEstimate`]: crate#modules
[`openai_usage`]: crate#modules
[`usage_from_frames`]: crate#modules
[`ReleaseAt::Headers`]: crate#modules
[`RefusalBody`]: crate#modules"
)]
#![cfg_attr(
    any(feature = "tracing", feature = "metrics"),
    doc = "[`telemetry`]: crate::telemetry"
)]
#![cfg_attr(
    not(any(feature = "tracing", feature = "metrics")),
    doc = "[`telemetry`]: crate#modules"
)]
