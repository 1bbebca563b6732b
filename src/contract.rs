//! # The behaviour contract
//!
//! What every [`Bulkhead`](crate::Bulkhead) promises, whichever front end (the core, the
//! [`llm`](crate#modules) layer, the tower layer) drives it. Other pages of these docs cite the
//! sections below as "contract §N". The TypeScript library `async-bulkhead-llm` inspired the
//! semantics; where this crate differs, §9 lists why.
//!
//! ## §1 Vocabulary
//!
//! * A **slot** is one unit of global concurrency (`max_concurrent`).
//! * A **reservation** `r = input + max_output` tokens is fixed before admission, by an
//!   estimator or by the caller.
//! * The **hold** of an admission is the number of tokens it occupies in the in-flight budget.
//!   It starts at `r`, moves with usage reports, and is returned whole at release.
//! * `T` is the sum of all holds, `B` the budget, `H` the high-priority reserve. High-priority
//!   demands may use all of `B`; normal ones `max(0, B − H)` (the *effective* budget).
//! * A **class** is an entry of the fixed class table, with floors (`protected_concurrent`,
//!   `protected_tokens`) and optional ceilings (`max_concurrent`, `max_tokens`).
//! * A **revision** numbers an immutable limits snapshot; revisions only grow.
//!
//! ## §2 One decision
//!
//! A decision is atomic with respect to every other decision, release, usage report,
//! reconfiguration and close. The first failing check gives the refusal:
//!
//! | # | refused when | reason | constraint (with classes) |
//! |---|---|---|---|
//! | 0 | the bulkhead is closed | `shutdown` | – |
//! | 1 | a budget exists and `T + r` exceeds the effective budget | `budget_limit` | `global` |
//! | 2 | the class's tokens plus `r` exceed its token ceiling | `budget_limit` | `admission_class` |
//! | 3 | the class already runs its concurrency ceiling | `concurrency_limit` | `admission_class` |
//! | 4 | taking a shared slot would eat another class's floor (§4) | `concurrency_limit` | `admission_class_protection` |
//! | 5 | borrowing tokens would eat another class's token floor (§4) | `budget_limit` | `admission_class_protection` |
//! | 6 | no slot is free and nothing may queue (`max_queue` or `max_concurrent` is 0) | `concurrency_limit` | `global` |
//! | 7 | no slot is free and the queue is full | `queue_limit` | `global` |
//!
//! Otherwise a request with no free slot waits (waiting acquires only; `try_acquire` answers
//! `concurrency_limit`). Filling a limit exactly is allowed. Capacity checks fail fast: a
//! request refused by checks 1–5 never queues. While a waiter is queued nobody overtakes it,
//! with one exception (this crate's, stated so that floors hold under token waiting): with
//! classes, a newcomer whose demand stays inside its class's floors (it borrows neither a slot
//! nor a token), whose class has no waiter queued, while `U ≤ max_concurrent` and
//! `V ≤ budget − high_priority_reserve` (§4's sums of `max(held, floor)`), is admitted ahead of
//! the queue. Every queued waiter then decides on `U`, `V` and its own class only, none of
//! which the newcomer changes, so its admission changes no queued waiter's decision; and a
//! class's own newcomers never pass its waiters (`crate::protocol::classed`, "Bypass").
//!
//! ## §3 The wait queue
//!
//! There is one global FIFO queue bounded by `max_queue`. A waiter holds nothing. When capacity
//! comes back, the releaser makes the head waiter's whole decision (checks 1–5) on its behalf,
//! atomically, against the limits of that moment; a waiter that fails is answered with its
//! reason and the next one is considered. Waiters leave by timeout (`timeout`), cancellation
//! (`aborted`, or simply by dropping the future) or close (`shutdown`), and leaving never leaks
//! a slot, a token or a queue place. Shrinking `max_queue` keeps the waiters already queued.
//!
//! ## §4 Classes
//!
//! Every snapshot is validated before anything is installed: each floor is at most its own
//! ceiling, the concurrency floors add up to at most `max_concurrent` and the token floors to
//! at most `B`, token fields need a budget, and a snapshot names exactly the construction-time
//! classes. A class uses its floor first, then borrows from the shared remainder (the global
//! limit minus all floors). Floors are strict: capacity protected for an idle class is never
//! lent. A request inside its floor is never refused for protection, but still needs a global
//! slot and check 1. Raising a floor revokes nothing; new borrowing just pauses until enough
//! work completes. Each admission records whether its slot was borrowed and how many of its
//! tokens were, and that record never changes.
//!
//! ## §5 Tokens after admission
//!
//! Usage reports are cumulative and clamped so that neither input nor output goes down. The
//! hold becomes `input + max(max_output, output)`, or, with a [`Reconcile`](crate::Reconcile),
//! `remaining_output + safety_margin + overrun`. Growth is accounted with no admission check
//! (overrun); shrinkage is an early refund. Release returns the whole hold once (a second
//! release does nothing, and dropping an admission releases it). A borrowed slot may be
//! abandoned early; its token hold then stays until release.
//!
//! ## §6 Limits snapshots
//!
//! `apply_limits` refuses a revision that is not newer first, then validates the whole
//! snapshot, then installs it atomically. Lower limits shrink by attrition (nothing running or
//! queued is revoked); higher limits admit queued waiters at once. `max_concurrent = 0` is the
//! kill switch: new work is refused with `concurrency_limit`. Every admission keeps the
//! revision that authorised it, and once `apply_limits` returns no decision made under an older
//! revision can still succeed.
//!
//! ## §7 Close and drain
//!
//! `close` is idempotent and final: queued waiters and later requests get `shutdown`, while
//! running work may still report and release. `drain` completes when no slot, waiter or token
//! hold remains, and never hangs once that is so. A bounded drain answers by its deadline with
//! what is left, and cancels nothing.
//!
//! ## §8 What a refusal carries
//!
//! The reason, the constraint (with classes), the revision used, and the capacity the decision
//! saw: slots and queue, the budget figures (budget, in flight, effective budget, available,
//! requested), and with classes the shared remainder and the class's own figures. It all
//! serialises (feature `serde`), so a gateway can answer 429/503 with it. **No retry-after is
//! invented**: a fail-fast bulkhead has no honest estimate of when capacity comes back.
//!
//! ## §9 Deliberate differences from the TypeScript library
//!
//! 1. `shutdown` is checked before capacity.
//! 2. An already-cancelled request is refused with `aborted` even when a slot is free.
//! 3. Consumption is counted even when the hold is 0.
//! 4. There are no same-tick races: a decision never counts a slot a loser is about to give
//!    back, and a hand-off to a waiter is one atomic decision.
//! 5. `drain` never hangs after the last waiter leaves by timeout or cancellation.
//! 6. Invalid input is refused by the types or by a typed error, before any state changes.
//! 7. (LLM layer) `run` and `run_blocking` do not de-duplicate: on a bulkhead whose
//!    de-duplication is enabled they refuse a call that does not opt out with a typed error
//!    (`RunError::Invalid`, field `dedup`) instead of running it alone; `run_shared`
//!    de-duplicates. Why: a shared call is driven by whichever participant polls it, so its
//!    work must be `Send + 'static`, which the work of `run` (a closure borrowing its context)
//!    is not.
//! 8. (LLM layer) At the borrowed-concurrency deadline the async `run` answers at expiry by
//!    dropping the work's future (its tokens are settled then, with its last usage report)
//!    rather than leaving it running; `run_blocking` answers when the work returns. Why: the
//!    work of `run` borrows its context and cannot outlive the call, and a blocking closure
//!    cannot leave the caller's thread. `run_shared` with `detach_at_deadline` is the seed's
//!    behaviour (§12).
//! 9. (LLM layer) A de-duplication follower's refusal (`timeout`, `aborted`,
//!    `unshareable_result`) carries the capacity detail of the moment it was answered (the
//!    reference sends none), and a follower answers `RunError::Shared`, not `Rejected`.
//!
//! ## §10 Concurrency guarantees
//!
//! * **Safety:** no admission makes an accounted quantity exceed its limit, at any instant.
//!   (Usage growth after admission is accounting, not admission.)
//! * **No leaks:** once every admission is released and every waiter has left, all counters
//!   are zero, whatever interleaving, cancellation, timeout, close or panic happened.
//! * **Progress:** `try_acquire` and release never block and take no lock while nobody waits.
//! * **Atomic reconfiguration:** as §6.
//! * **Precision:** a refusal is explained by the state at its decision.
//!
//! ## §11 The HTTP layer (feature `tower`)
//!
//! The tower layer adds these promises on top (see the layer's module docs):
//!
//! * one limit per bulkhead handle, however many times the layer is applied or cloned;
//! * the decision is made when a request arrives (`call`), never in `poll_ready`, so idle
//!   connections hold nothing;
//! * an admission lasts until the response body ends, fails or is dropped (or until the
//!   headers, when asked), and dropping the response future releases it;
//! * a refused request never reaches the inner service, and its answer is 429 (capacity) or
//!   503 (shutdown) with the refusal's figures and no `Retry-After` (on a layer over a cluster
//!   share, feature `cluster`, also 503 `share_lapsed`, and 503 `share_too_small` with the
//!   agent's renewal period as `Retry-After`, since that share changes only at a renewal).
//!
//! ## §12 The LLM layer (feature `llm`)
//!
//! [`LlmBulkhead`](crate::llm::LlmBulkhead) adds these promises:
//!
//! * **No setting silently does nothing.** `run` and `run_blocking` on a bulkhead whose
//!   de-duplication is enabled refuse `dedup: true` (§9.7); the request-level acquires refuse
//!   a deadline, `detach_at_deadline`, observe mode, and (`try_acquire`) wait options; each as
//!   a typed error before anything changes. They never de-duplicate (the seed's `acquire()`).
//! * **Request-level acquires.** `try_acquire`, `acquire` and `acquire_blocking` estimate the
//!   request exactly as `estimate` previews it, apply the class, priority (and so the
//!   high-priority reserve) and reservation override of the same `RunOptions` as `run`, and
//!   return the [`Admission`](crate::Admission); refusals are counted as any other.
//! * **Follower refusals are refusals.** A de-duplication follower that gets no result (its
//!   own timeout, its own cancellation, an unshareable result) is counted in `rejected` and
//!   `rejected_by_reason` (`timeout`, `aborted`, `unshareable_result`; per class too) and
//!   published as a `reject` event, so the metrics count it; a leader's error passed on to
//!   its followers is not counted again.
//! * **The borrowed-concurrency deadline, by entry point.** Expiry always abandons the slot
//!   at once (cause `deadline`) and fires the run's stop signal; the caller is answered
//!   `RunError::Deadline`:
//!
//!   | entry point | the caller is answered | the work | its tokens |
//!   |---|---|---|---|
//!   | async `run` | at expiry | its future is dropped (that cancels it) | settled at expiry with its last usage report |
//!   | `run_blocking` | when the work returns (it runs on the caller's thread) | runs on; should poll `stop_requested` | settled when it returns |
//!   | `run_shared` without `detach_at_deadline` | at expiry, followers too | its future is dropped | settled at expiry |
//!   | `run_shared` with `detach_at_deadline` (the seed's) | at expiry, followers too | handed to the application's spawner, runs on | settled when it ends; drain counts it until then |
//!
//! * **Decision timing, when asked.** Admit and reject events carry `Timing` (decision and
//!   queue-wait nanoseconds) while a subscriber asks for `Interest::DECISION_TIMING`; the
//!   core's `*_timed` acquires return it. `run_timed`, `run_blocking_timed`,
//!   `run_shared_timed` and `run_shared_with_timed` answer `RunTimed`: the run's result with
//!   its `RunTiming` (decision, queue wait, and the work's time from admission until the run
//!   answered; `None` when no work ran), read on the `LlmBulkhead`'s clock (`with_clock`; the
//!   system clock by default), and the work reads the decision's part and the admission
//!   instant from `RunContext::timing` and `admitted_at`. A de-duplication follower, which takes no
//!   admission, reports its wait for the shared call as queue time. Nothing else reads a
//!   clock: `run`, `run_blocking` and `run_shared(_with)` share the timed calls' code through a
//!   zero-sized no-op, their contexts' `timing()` is `None`, and the default `Telemetry`
//!   (counters read at scrape time) asks for no timing.
//! * **Classes by name.** Wherever a class leaves the process (events, usage and release
//!   reports, the deadline error) it is serialised as its name, never its index. An empty
//!   model name (the estimator's default model, `BulkheadConfig::model`) is a typed error.
//!
//! ## §13 The client-side coordinator (feature `coordinator`)
//!
//! The [`coordinator`](crate#modules) is a different discipline from the bulkhead's: its
//! queue is **eligibility-ordered FIFO**, not strict FIFO. A ticket waits for four things at
//! once: a client slot (`client_limit`), a slot of its provider (an optional limit), its
//! provider's time gate (`readyAt = max(cooldown not-before, last start + min_interval)`), and
//! its key (at most one running invocation per key). Among the queued tickets that can start,
//! the oldest starts first; a ticket that cannot (its provider full, pacing or cooling down,
//! its key running, no client slot) is skipped and blocks nobody behind it. The start rule runs
//! inside the operation that changed the state (a completion, a cooldown, a deadline passing,
//! a submit), at every intermediate instant in time order, starts before timeouts at one
//! instant; so at the moment a newcomer is judged no queued ticket is eligible, and a newcomer
//! that can start takes no queue place and jumps nobody. The queue is bounded by `queue_cap`
//! (queued tickets only). Admission errors (overflow, timeout, close, cancel while queued) are
//! typed apart from any failure of the work and concern only tickets that never started.
//!
//! The open choices of the seed, each made as `COORDINATOR.md` §8 decides:
//!
//! | id | choice made |
//! |---|---|
//! | C1 | The start rule is atomic with the operation that enabled it: a freed slot goes to the oldest eligible queued ticket before any later operation; passed deadlines are honoured before a newcomer is judged. A newcomer is never started while an eligible ticket is queued. |
//! | C2 | Readiness is inclusive: a ticket is eligible at exactly `readyAt`. |
//! | C3 | At one instant, starts come before timeouts: a ticket eligible exactly at its deadline starts. |
//! | C4 | An admission timeout of zero is a typed error (`ZeroAdmissionTimeout`) when the ticket is submitted; a `Duration` cannot be negative. |
//! | C5 | A provider's first start is never paced; pacing counts starts, not completions. |
//! | C6 | Keys are one client-wide namespace: a key running on one provider blocks it on every provider. |
//! | C7 | An unknown provider is checked before `closed`. |
//! | C8 | A submit after close gets `AdmissionError::Closed`. |
//! | C9 | `close` is idempotent. |
//! | C10 | Cancelling a running invocation (its signal) keeps its client slot, provider slot and key until the work completes; `Ticket::cancel` of a started ticket does nothing. |
//! | C11 | `cooldown` after close is accepted; of an unknown provider is `UnknownProvider`; a zero delay or one ending no later than the current not-before changes nothing; one whose deadline overflows the clock is `DeadlineOverflow` and changes nothing. |
//! | C12 | Pacing and cooldown are separate deadlines combined by `max`; a cooldown neither resets pacing nor touches running work. |
//! | C13 | `queue_cap` counts queued tickets only; 0 is allowed (start now or overflow). |
//! | C14 | Overflow, closed and unknown-provider submits leave no trace in the state. |
//! | C15 | Several timeouts at one instant are reported in FIFO order; several starts in one step in FIFO order. |
//! | C16 | Several queued tickets may share a key; they start one at a time, oldest first. |
//! | C17 | A snapshot shows a cooldown or pacing deadline only while it is later than its `now`; otherwise `None`. |
//!
//! Time: the monotonic clock drives pacing, cooldowns and admission timeouts; the wall clock
//! only stamps `received_at`; a wall-clock jump changes no admission state. Monotonic instants
//! are `Duration`s from the clock's own origin and are never persisted. The attempt timeout
//! counts from the start. Limits are per coordinator (one client), not across processes.
//!
//! Uncontended path: while no ticket is queued, a submit that can start and a completion take
//! no mutex (the client and provider slots are atomic words, the key a slot of the running-key
//! table with its own one-word lock, taken by a claim and freed by its holder with a store, a
//! paced provider's pacing a CAS on its last-start stamp).
//! A `cooldown` that changes nothing (its deadline no later than the provider's not-before) is
//! one load and takes no mutex either. The start rule's guarantees above are unchanged: the
//! queued path raises a `WAITERS` bit in the client word before it judges a newcomer, and from
//! then until the queue is empty no admission or completion takes or gives back a client slot
//! without the mutex. A completion gives its key and provider slot back before its client slot,
//! and an admission that misses gives back what it claimed, both without the mutex, and each
//! then runs the start rule under it; a scan that sees such a give-back half done keeps what it
//! found held as held until its transaction ends, so it decides as on one state and nobody
//! overtakes (loom models in `loom-tests/tests/coordinator.rs`). Nothing under the mutex waits
//! for an uncontended operation. What it changes, and is stated where it
//! shows: an uncontended start reads the monotonic clock only when it must (a cooldown on
//! record, pacing, an attempt timeout, recorded events), so `Invocation::started_at` is `None`
//! for one that read none; a running invocation's signal is made on first use
//! (`Invocation::signal`), cancelled already if the coordinator closed; a snapshot taken while
//! another thread starts or completes uncontended may read its counters half changed (a paced
//! start's key taken and its pacing stamp not yet, for one); a ticket with an admission timeout
//! of 2^32 s or more always takes the queued path; a ticket started at its submit arms its
//! attempt timeout at the start (a started ticket dropped unwaited leaves that timer to fire
//! on a completed invocation's signal, which nothing reads). A ticket with a shorter
//! admission timeout that starts at once never has its deadline computed, so a clock reading
//! past 2^63 s (no real clock; a fake one set there) would start it where the queued path
//! would report `DeadlineOverflow`.
