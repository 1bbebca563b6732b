//! Tracing and metrics (features `tracing` and `metrics`).
//!
//! **Metrics are read, not pushed.** Every decision is already counted in the bulkhead's
//! per-thread statistics stripes, so the counters and gauges are set from one
//! [`Bulkhead::stats`] read when they are scraped: call [`Telemetry::record`] in the
//! exporter's scrape handler, just before rendering (counters are set with
//! `Counter::absolute`, gauges with `Gauge::set`). Nothing is pushed per decision, so metrics
//! add no lock, no allocation and no work to an admission, a release or a refusal; and every
//! exported number is the one `stats()` gives (a refund made by a usage report before
//! release counts, as it does there). Counters are monotonic whatever the race with
//! decisions: the recorder keeps the largest value set (`absolute` is a `fetch_max` in the
//! `metrics` crate's atomic counters).
//!
//! **Events are delivered only for what is traced.** [`Telemetry::instrument`] subscribes to
//! the kinds it needs ([`Interest`]): refusals, reconfigurations, abandonments and the LLM
//! layer's bypasses; admissions, usage reports and releases only with
//! [`Telemetry::trace_admissions`]. The default therefore leaves the acquire + release pair as
//! it is with nobody subscribed (`benches/telemetry.rs` measures it). The counters
//! `llm_bulkhead_reconfigured_total` and `llm_bulkhead_bypassed_total` (which `stats()` does
//! not hold) are counted from those events; they are rare or off the enforced path.
//!
//! Fields are **sanitized by construction**: events carry ids, class names (a fixed table from
//! the configuration, never a raw tenant id), priorities, reasons, constraints, revisions and
//! numbers. Nothing from a request (prompt, headers, body) reaches the core, so nothing of it
//! can reach a span. The crate installs no exporter and no subscriber: the application chooses
//! (the gateway example uses `metrics-exporter-prometheus`).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `llm_bulkhead_admitted_total` | counter | `class` |
//! | `llm_bulkhead_rejected_total` | counter | `reason`, `class` |
//! | `llm_bulkhead_released_total` | counter | `class` |
//! | `llm_bulkhead_tokens_refunded_total` | counter | `class` |
//! | `llm_bulkhead_bypassed_total` | counter (events) | `reason`, `class` |
//! | `llm_bulkhead_borrowed_concurrency_abandoned_total` | counter | `cause` |
//! | `llm_bulkhead_reconfigured_total` | counter (events) | |
//! | `llm_bulkhead_in_flight`, `llm_bulkhead_max_concurrent` | gauge | |
//! | `llm_bulkhead_pending`, `llm_bulkhead_max_queue` | gauge | |
//! | `llm_bulkhead_tokens_in_flight`, `llm_bulkhead_token_budget` | gauge | |
//! | `llm_bulkhead_limits_revision`, `llm_bulkhead_closed` | gauge | |
//! | `llm_bulkhead_class_in_flight`, `llm_bulkhead_class_tokens_in_flight` | gauge | `class` |
//! | `llm_bulkhead_hold_seconds` | histogram (layer) | `class` |
//! | `llm_bulkhead_queue_wait_seconds` | histogram (layer) | |
//!
//! `class` is absent on bulkheads without classes. With [`Telemetry::name`] every metric also
//! has a `bulkhead` label. The two histograms are recorded by the tower layer
//! ([`record_metrics`](crate::tower::BulkheadLayerBuilder::record_metrics)); an exporter
//! renders them as histograms when it is given buckets (Prometheus: [`HOLD_SECONDS_BUCKETS`]
//! and [`QUEUE_WAIT_SECONDS_BUCKETS`] through `set_buckets_for_metric`, as the gateway example
//! does; without buckets `metrics-exporter-prometheus` writes summaries, which cannot be
//! aggregated across replicas).
//!
//! # Logs
//!
//! Tracing events have the target `llm_bulkhead`. Under overload refusals are the most
//! frequent event, so a refusal is logged at `DEBUG` (with its detail), and at `INFO` only as
//! a **summary: at most one line per second per reason** (`"refusals"`, with `reason` and
//! `count`: the refusals of that reason since the previous summary line, the current one
//! included; the line is written by the first refusal after the second has passed, so the
//! count of a burst that ended is written with the next refusal, and `stats()` always has
//! the exact figures). Observe mode's bypasses are summarised the same way (`"bypasses"`).
//! Reconfigurations are at `INFO`, abandonments at `WARN`; admissions, releases and usage
//! reports at `DEBUG` with [`Telemetry::trace_admissions`].
//!
//! ```
//! use llm_bulkhead::{telemetry, Bulkhead, Demand};
//! let bulkhead = Bulkhead::new(1)?;
//! let telemetry = telemetry::Telemetry::default();
//! let _subscription = telemetry.instrument(&bulkhead);
//! drop(bulkhead.try_acquire(Demand::slot())?); // counted in stats(); no event built
//! telemetry.record(&bulkhead); // in the scrape handler: counters and gauges from stats()
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{Bulkhead, Event, Interest, Subscription};

/// The hold-time histogram's name.
///
/// ```
/// assert_eq!(llm_bulkhead::telemetry::HOLD_SECONDS, "llm_bulkhead_hold_seconds");
/// ```
pub const HOLD_SECONDS: &str = "llm_bulkhead_hold_seconds";
/// The queue-wait histogram's name.
///
/// ```
/// assert_eq!(llm_bulkhead::telemetry::QUEUE_WAIT_SECONDS, "llm_bulkhead_queue_wait_seconds");
/// ```
pub const QUEUE_WAIT_SECONDS: &str = "llm_bulkhead_queue_wait_seconds";

/// Bucket bounds (seconds) for [`HOLD_SECONDS`]: an LLM call holds its admission from a few
/// milliseconds (a refused upstream) to minutes (a long stream).
///
/// ```
/// use llm_bulkhead::telemetry::HOLD_SECONDS_BUCKETS;
/// assert!(HOLD_SECONDS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
/// ```
pub const HOLD_SECONDS_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Bucket bounds (seconds) for [`QUEUE_WAIT_SECONDS`]: from a hand-off (microseconds) to a
/// queue timeout.
///
/// ```
/// use llm_bulkhead::telemetry::QUEUE_WAIT_SECONDS_BUCKETS;
/// assert!(QUEUE_WAIT_SECONDS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
/// ```
pub const QUEUE_WAIT_SECONDS_BUCKETS: [f64; 14] = [
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0,
];

/// What [`Telemetry::instrument`] traces and what [`Telemetry::record`] exports.
///
/// ```
/// use llm_bulkhead::telemetry::Telemetry;
/// let t = Telemetry::default().name("openai");
/// # let _ = t;
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Telemetry {
    name: Option<String>,
    tracing: bool,
    metrics: bool,
    trace_admissions: bool,
    decision_timing: bool,
    /// Milliseconds on a monotonic clock, for the refusal summaries (tests inject one).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    clock: Option<fn() -> u64>,
}

impl Default for Telemetry {
    /// Tracing events and metrics, each when its feature is enabled; admissions not traced.
    fn default() -> Telemetry {
        Telemetry {
            name: None,
            tracing: cfg!(feature = "tracing"),
            metrics: cfg!(feature = "metrics"),
            trace_admissions: false,
            decision_timing: false,
            clock: None,
        }
    }
}

impl Telemetry {
    /// Adds the label `bulkhead = name` to every metric and the field `bulkhead` to every
    /// tracing event (for processes with several bulkheads, one per provider or model).
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().name("anthropic");
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Telemetry {
        self.name = Some(name.into());
        self
    }

    /// Emits tracing events (feature `tracing`; default on when enabled).
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().tracing(false);
    /// ```
    pub fn tracing(mut self, on: bool) -> Telemetry {
        self.tracing = on && cfg!(feature = "tracing");
        self
    }

    /// Exports metrics (feature `metrics`; default on when enabled): [`record`](Self::record)
    /// sets them, and `instrument` counts reconfigurations and bypasses.
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().metrics(false);
    /// ```
    pub fn metrics(mut self, on: bool) -> Telemetry {
        self.metrics = on && cfg!(feature = "metrics");
        self
    }

    /// Also traces every admission, usage report and release at `DEBUG` (default off). This
    /// subscribes to those events, so every admission builds and delivers two events: the
    /// pair then costs several times what it costs without (see `benches/telemetry.rs`).
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().trace_admissions(true);
    /// ```
    pub fn trace_admissions(mut self, on: bool) -> Telemetry {
        self.trace_admissions = on;
        self
    }

    /// Asks for decision timing ([`Interest::DECISION_TIMING`], default off): admit and
    /// reject events then carry how long the decision took and how long it queued, and the
    /// traced lines show them (`decision_ns`, `queue_wait_ns`). It makes every decision of the
    /// bulkhead read the clock, so it is not on by default.
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().trace_admissions(true).decision_timing(true);
    /// ```
    pub fn decision_timing(mut self, on: bool) -> Telemetry {
        self.decision_timing = on;
        self
    }

    /// The clock of the refusal summaries, in milliseconds (tests inject one).
    #[cfg(test)]
    pub(crate) fn clock(mut self, clock: fn() -> u64) -> Telemetry {
        self.clock = Some(clock);
        self
    }

    /// The event kinds `instrument` subscribes to.
    fn interest(&self) -> Interest {
        let mut i = Interest::NONE;
        if self.tracing {
            i = i | Interest::REJECT | Interest::RECONFIGURE | Interest::ABANDON;
            i = i | Interest::EXTENSION;
            if self.trace_admissions {
                i = i | Interest::ADMIT | Interest::USAGE | Interest::RELEASE;
            }
        }
        if self.metrics {
            i = i | Interest::RECONFIGURE | Interest::EXTENSION;
        }
        if self.decision_timing {
            i = i | Interest::DECISION_TIMING;
        }
        i
    }

    /// Subscribes to the events of `bulkhead` that are traced (and to reconfigurations and
    /// bypasses, which are counted): see the module docs for which. Dropping the subscription
    /// stops it. Install the metrics recorder first: the event counters' handles are
    /// registered here. Metrics read from `stats()` need [`record`](Self::record) at scrape
    /// time, subscribed or not.
    ///
    /// ```
    /// # use llm_bulkhead::{telemetry::Telemetry, Bulkhead};
    /// let b = Bulkhead::new(2).unwrap();
    /// let sub = Telemetry::default().instrument(&b);
    /// drop(sub);
    /// ```
    pub fn instrument(&self, bulkhead: &Bulkhead) -> Subscription {
        #[cfg(feature = "metrics")]
        let counters = self
            .metrics
            .then(|| metrics_part::EventCounters::new(bulkhead, self.name.as_deref()));
        #[cfg(feature = "tracing")]
        let traced = self
            .tracing
            .then(|| tracing_part::Traced::new(self.name.clone(), self.clock));
        bulkhead.subscribe_to(self.interest(), move |event: &Event| {
            #[cfg(feature = "tracing")]
            if let Some(t) = &traced {
                t.emit(event);
            }
            #[cfg(feature = "metrics")]
            if let Some(c) = &counters {
                c.count(event);
            }
            let _ = event;
        })
    }

    /// Sets every counter and gauge of the table above (but the two event counters and the
    /// layer's histograms) from one [`Bulkhead::stats`] read (feature `metrics`; nothing with
    /// [`metrics(false)`](Self::metrics)). Call it in the exporter's scrape handler, before
    /// rendering. It allocates (labels), never on a decision's path.
    ///
    /// ```
    /// use llm_bulkhead::{telemetry::Telemetry, Bulkhead, Demand};
    /// let b = Bulkhead::new(4).unwrap();
    /// drop(b.try_acquire(Demand::slot()).unwrap());
    /// Telemetry::default().name("openai").record(&b); // admitted_total 1, released_total 1
    /// ```
    pub fn record(&self, bulkhead: &Bulkhead) {
        #[cfg(feature = "metrics")]
        if self.metrics {
            metrics_part::record(bulkhead, self.name.as_deref());
        }
        let _ = bulkhead;
    }
}

/// Sets the gauges (only) from `bulkhead.stats()` (feature `metrics`); prefer
/// [`Telemetry::record`], which sets the counters too.
///
/// ```
/// use llm_bulkhead::{telemetry, Bulkhead};
/// telemetry::record_gauges(&Bulkhead::new(4).unwrap());
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn record_gauges(bulkhead: &Bulkhead) {
    metrics_part::gauges(&bulkhead.stats(), None);
}

/// [`record_gauges`] with a `bulkhead` label.
///
/// ```
/// use llm_bulkhead::{telemetry, Bulkhead};
/// telemetry::record_gauges_named(&Bulkhead::new(4).unwrap(), "openai");
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn record_gauges_named(bulkhead: &Bulkhead, name: &str) {
    metrics_part::gauges(&bulkhead.stats(), Some(name));
}

#[cfg(feature = "tracing")]
mod tracing_part {
    use crate::sync::{AtomicU64, Ordering};
    use crate::{Event, RejectReason};
    use tracing::{debug, info, warn};

    /// Milliseconds since the first call in this process (a monotonic clock).
    fn now_ms() -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(std::time::Instant::now);
        u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// One entry per counted reason, and one for any other.
    const REASONS: usize = RejectReason::COUNTED.len() + 1;

    /// At most one summary line per second per reason: counts per reason since the last line.
    pub(super) struct Summary {
        clock: fn() -> u64,
        /// Per reason (its position in `RejectReason::COUNTED`): the clock at the last line,
        /// plus one (0: never).
        last: [AtomicU64; REASONS],
        /// Per reason: occurrences not yet written in a line.
        count: [AtomicU64; REASONS],
    }

    impl Summary {
        pub(super) fn new(clock: fn() -> u64) -> Summary {
            Summary {
                clock,
                last: std::array::from_fn(|_| AtomicU64::new(0)),
                count: std::array::from_fn(|_| AtomicU64::new(0)),
            }
        }

        /// Counts one occurrence of `reason`; `Some(n)` when a line is due now, with the `n`
        /// occurrences since the previous line (this one included). Lock-free: of the threads
        /// that find a line due, the one whose CAS moves the window writes it.
        pub(super) fn note(&self, reason: RejectReason) -> Option<u64> {
            let counted = RejectReason::COUNTED.iter().position(|x| *x == reason);
            let r = counted.unwrap_or(REASONS - 1);
            self.count[r].fetch_add(1, Ordering::Relaxed);
            let now = (self.clock)().saturating_add(1);
            let last = self.last[r].load(Ordering::Relaxed);
            if last != 0 && now < last.saturating_add(1_000) {
                return None;
            }
            self.last[r]
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .ok()?;
            Some(self.count[r].swap(0, Ordering::Relaxed))
        }
    }

    /// The tracing side of one instrumented bulkhead.
    pub(super) struct Traced {
        name: Option<String>,
        refusals: Summary,
        #[cfg_attr(not(feature = "llm"), allow(dead_code))]
        bypasses: Summary,
    }

    impl Traced {
        pub(super) fn new(name: Option<String>, clock: Option<fn() -> u64>) -> Traced {
            let clock = clock.unwrap_or(now_ms);
            Traced {
                name,
                refusals: Summary::new(clock),
                bypasses: Summary::new(clock),
            }
        }
        pub(super) fn emit(&self, event: &Event) {
            let bulkhead = self.name.as_deref().unwrap_or("");
            match event {
                Event::Admit(e) => debug!(
                    target: "llm_bulkhead",
                    bulkhead,
                    admission_id = %e.admission_id,
                    class = e.class.as_deref().unwrap_or(""),
                    priority = match e.priority {
                        crate::Priority::High => "high",
                        crate::Priority::Normal => "normal",
                    },
                    revision = e.revision,
                    reserved_tokens = e.reserved_tokens,
                    borrowed_concurrency = e.resources.borrowed_concurrency,
                    borrowed_tokens = e.resources.borrowed_tokens,
                    decision_ns = e.timing.map(|t| t.decision_ns),
                    queue_wait_ns = e.timing.map(|t| t.queue_wait_ns),
                    "admitted"
                ),
                Event::Reject(e) => {
                    let r = &e.rejection;
                    let d = &r.detail();
                    let t = d.token_budget;
                    if let Some(count) = self.refusals.note(r.reason) {
                        info!(
                            target: "llm_bulkhead",
                            bulkhead,
                            reason = r.reason.as_str(),
                            count,
                            "refusals"
                        );
                    }
                    debug!(
                        target: "llm_bulkhead",
                        bulkhead,
                        class = e.class.as_deref().unwrap_or(""),
                        reason = r.reason.as_str(),
                        constraint = r.constraint.map_or("", |c| c.as_str()),
                        revision = r.revision,
                        in_flight = d.in_flight,
                        max_concurrent = d.max_concurrent,
                        pending = d.pending,
                        max_queue = d.max_queue,
                        tokens_in_flight = t.map(|t| t.in_flight_tokens),
                        effective_budget = t.map(|t| t.effective_budget),
                        requested_tokens = t.map(|t| t.requested),
                    decision_ns = e.timing.map(|t| t.decision_ns),
                    queue_wait_ns = e.timing.map(|t| t.queue_wait_ns),
                        "rejected"
                    )
                }
                Event::Usage(e) => debug!(
                    target: "llm_bulkhead",
                    bulkhead,
                    admission_id = %e.admission_id,
                    class = e.class.as_deref().unwrap_or(""),
                    sequence = e.sequence,
                    held_tokens = e.held_tokens,
                    delta_tokens = e.delta_tokens,
                    "usage reported"
                ),
                Event::Release(e) => debug!(
                    target: "llm_bulkhead",
                    bulkhead,
                    admission_id = %e.admission_id,
                    class = e.class.as_deref().unwrap_or(""),
                    revision = e.revision,
                    held_tokens = e.held_tokens,
                    refunded_tokens = e.refunded_tokens,
                    "released"
                ),
                Event::Reconfigure(c) => match c.current.token_budget {
                    // A reserve above the budget refuses every normal-priority token demand (a
                    // snapshot may install it on purpose): not a routine change.
                    Some(t) if t.high_priority_reserve > t.budget => warn!(
                        target: "llm_bulkhead",
                        bulkhead,
                        revision = c.current.revision,
                        previous_revision = c.previous.revision,
                        token_budget = t.budget,
                        high_priority_reserve = t.high_priority_reserve,
                        "limits applied with a high-priority reserve above the token budget: \
                         every normal-priority token demand is refused"
                    ),
                    _ => info!(
                        target: "llm_bulkhead",
                        bulkhead,
                        revision = c.current.revision,
                        previous_revision = c.previous.revision,
                        max_concurrent = c.current.max_concurrent,
                        max_queue = c.current.max_queue,
                        token_budget = c.current.token_budget.map(|t| t.budget),
                        "limits applied"
                    ),
                },
                Event::BorrowedConcurrencyAbandon(e) => warn!(
                    target: "llm_bulkhead",
                    bulkhead,
                    admission_id = %e.admission_id,
                    class = e.class.as_deref().unwrap_or(""),
                    cause = e.cause.as_str(),
                    held_tokens = e.held_tokens,
                    "borrowed slot abandoned"
                ),
                #[cfg(feature = "llm")]
                Event::Extension(_) => {
                    if let Some(crate::llm::LlmEvent::Bypass(e)) = crate::llm::LlmEvent::of(event) {
                        if let Some(count) = self.bypasses.note(e.reason) {
                            info!(
                                target: "llm_bulkhead",
                                bulkhead,
                                reason = e.reason.as_str(),
                                count,
                                "bypasses"
                            );
                        }
                        debug!(
                            target: "llm_bulkhead",
                            bulkhead,
                            admission_id = %e.admission_id,
                            class = e.class.as_deref().unwrap_or(""),
                            reason = e.reason.as_str(),
                            revision = e.revision,
                            raced = e.raced,
                            "bypassed (observe mode)"
                        )
                    }
                }
                #[cfg(not(feature = "llm"))]
                Event::Extension(_) => {}
            }
        }
    }
}

#[cfg(feature = "metrics")]
mod metrics_part {
    use crate::{Bulkhead, Event, RejectReason, Stats};
    use metrics::{counter, gauge, Counter, Label};

    /// The two counters `stats()` does not hold, counted from events: bypasses (per class
    /// and reason; one entry without a class label on a bulkhead without classes) and
    /// reconfigurations.
    pub(super) struct EventCounters {
        #[cfg_attr(not(feature = "llm"), allow(dead_code))]
        classes: Vec<String>,
        /// Registered (at zero) without the `llm` feature too, which alone makes bypasses.
        #[cfg_attr(not(feature = "llm"), allow(dead_code))]
        bypassed: Vec<[Counter; RejectReason::COUNTED.len()]>,
        reconfigured: Counter,
    }

    fn labels(
        name: Option<&str>,
        class: Option<&str>,
        more: &[(&'static str, &'static str)],
    ) -> Vec<Label> {
        let mut l = Vec::with_capacity(2 + more.len());
        if let Some(n) = name {
            l.push(Label::new("bulkhead", n.to_owned()));
        }
        if let Some(c) = class {
            l.push(Label::new("class", c.to_owned()));
        }
        for (k, v) in more {
            l.push(Label::new(*k, *v));
        }
        l
    }

    impl EventCounters {
        pub(super) fn new(bulkhead: &Bulkhead, name: Option<&str>) -> EventCounters {
            let classes = bulkhead.class_names().to_vec();
            // Events of a classed bulkhead always name their class; the others never do.
            let keys: Vec<Option<&str>> = if classes.is_empty() {
                vec![None]
            } else {
                classes.iter().map(|c| Some(c.as_str())).collect()
            };
            let bypassed = keys
                .iter()
                .map(|k| {
                    RejectReason::COUNTED.map(|r| {
                        let l = labels(name, *k, &[("reason", r.as_str())]);
                        counter!("llm_bulkhead_bypassed_total", l)
                    })
                })
                .collect();
            EventCounters {
                bypassed,
                reconfigured: counter!("llm_bulkhead_reconfigured_total", labels(name, None, &[])),
                classes,
            }
        }

        pub(super) fn count(&self, event: &Event) {
            match event {
                #[cfg(feature = "llm")]
                Event::Extension(_) => {
                    if let Some(crate::llm::LlmEvent::Bypass(e)) = crate::llm::LlmEvent::of(event) {
                        let k = e
                            .class
                            .as_deref()
                            .and_then(|c| self.classes.iter().position(|n| n == c))
                            .unwrap_or(0);
                        let r = RejectReason::COUNTED
                            .iter()
                            .position(|x| *x == e.reason)
                            .unwrap_or(0);
                        self.bypassed[k][r].increment(1);
                    }
                }
                Event::Reconfigure(_) => self.reconfigured.increment(1),
                _ => {}
            }
        }
    }

    /// Every counter and gauge that `stats()` holds, from one read.
    pub(super) fn record(bulkhead: &Bulkhead, name: Option<&str>) {
        let s = bulkhead.stats();
        let set = |metric: &'static str, class: Option<&str>, v: u64| {
            counter!(metric, labels(name, class, &[])).absolute(v);
        };
        let by_reason = |class: Option<&str>, counts: &crate::RejectCounts| {
            for r in RejectReason::COUNTED {
                let l = labels(name, class, &[("reason", r.as_str())]);
                counter!("llm_bulkhead_rejected_total", l).absolute(counts.get(r));
            }
        };
        match &s.classes {
            None => {
                set("llm_bulkhead_admitted_total", None, s.admitted);
                set("llm_bulkhead_released_total", None, s.released);
                let refunded = s.token_budget.map_or(0, |t| t.total_refunded);
                set("llm_bulkhead_tokens_refunded_total", None, refunded);
                by_reason(None, &s.rejected_by_reason);
            }
            Some(c) => {
                for k in &c.classes {
                    let class = Some(k.name.as_str());
                    set("llm_bulkhead_admitted_total", class, k.admitted);
                    set("llm_bulkhead_released_total", class, k.released);
                    set(
                        "llm_bulkhead_tokens_refunded_total",
                        class,
                        k.total_refunded,
                    );
                    by_reason(class, &k.rejected_by_reason);
                }
            }
        }
        let causes = s.borrowed_concurrency_abandoned_by_cause;
        for (cause, v) in [("manual", causes.manual), ("deadline", causes.deadline)] {
            let l = labels(name, None, &[("cause", cause)]);
            counter!("llm_bulkhead_borrowed_concurrency_abandoned_total", l).absolute(v);
        }
        gauges(&s, name);
    }

    pub(super) fn gauges(s: &Stats, name: Option<&str>) {
        let g =
            |metric: &'static str, v: u64| gauge!(metric, labels(name, None, &[])).set(v as f64);
        g("llm_bulkhead_in_flight", s.in_flight);
        g(
            "llm_bulkhead_max_concurrent",
            u64::from(s.limits.max_concurrent),
        );
        g("llm_bulkhead_pending", s.pending);
        g("llm_bulkhead_max_queue", u64::from(s.limits.max_queue));
        g("llm_bulkhead_limits_revision", s.limits.revision);
        g("llm_bulkhead_closed", u64::from(s.closed));
        if let Some(t) = &s.token_budget {
            g("llm_bulkhead_tokens_in_flight", t.in_flight_tokens);
            g("llm_bulkhead_token_budget", t.budget);
        }
        if let Some(c) = &s.classes {
            for k in &c.classes {
                let l = || labels(name, Some(&k.name), &[]);
                gauge!("llm_bulkhead_class_in_flight", l()).set(k.in_flight as f64);
                gauge!("llm_bulkhead_class_tokens_in_flight", l()).set(k.in_flight_tokens as f64);
            }
        }
    }
}

/// The refusal summary lines, with an injected clock: at most one line per second per reason,
/// each with the count since the previous one. The clock is a number the test sets (no sleep).
#[cfg(all(test, feature = "tracing"))]
#[allow(clippy::disallowed_types)] // test scaffolding, outside any protocol
mod tests {
    use super::Telemetry;
    use crate::{Bulkhead, Demand, Reservation};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    static NOW_MS: AtomicU64 = AtomicU64::new(0);

    fn clock() -> u64 {
        NOW_MS.load(Ordering::Relaxed)
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn refusals_are_summarised_once_a_second_per_reason() {
        let out = Buffer::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let b = Bulkhead::builder()
                .max_concurrent(2)
                .token_budget(100)
                .build()
                .unwrap();
            let _sub = Telemetry::default()
                .metrics(false)
                .clock(clock)
                .instrument(&b);
            let tokens = |n| Demand::tokens(Reservation::new(n, 0).unwrap());
            let at = |ms: u64, demand: &dyn Fn() -> Demand, times: usize| {
                NOW_MS.store(ms, Ordering::Relaxed);
                for _ in 0..times {
                    assert!(b.try_acquire(demand()).is_err());
                }
            };
            let _one = b.try_acquire(tokens(10)).unwrap();
            at(0, &|| tokens(200), 1); // first budget refusal: a line (count 1)
            at(500, &|| tokens(200), 4); // within the second: counted, no line
            at(999, &|| tokens(200), 1);
            at(1_000, &|| tokens(200), 1); // a second later: a line with the 6 since
            let _two = b.try_acquire(tokens(10)).unwrap();
            at(1_000, &|| tokens(10), 2); // another reason has its own window
            at(1_999, &|| tokens(10), 3);
            at(2_000, &|| tokens(10), 1);
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<(&str, &str)> = text
            .lines()
            .map(|l| {
                assert!(l.contains("INFO llm_bulkhead: refusals"), "{l}");
                let field = |k: &str| {
                    let v = &l[l.find(k).expect(l) + k.len()..];
                    v.split_whitespace().next().unwrap()
                };
                (field("reason="), field("count="))
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("\"budget_limit\"", "1"),
                ("\"budget_limit\"", "6"),
                ("\"concurrency_limit\"", "1"),
                ("\"concurrency_limit\"", "5"),
            ],
            "{text}"
        );
    }
}
