//! Tracing and metrics (features `tracing` and `metrics`), fed by the bulkhead's
//! [`Event`]s.
//!
//! [`Telemetry::instrument`] subscribes to a bulkhead and, for every decision and settlement, emits a
//! `tracing` event and/or updates `metrics` counters. [`record_gauges`] sets the gauges from
//! [`Bulkhead::stats`] (call it when metrics are scraped: a pull keeps the gauges exact, even
//! for admissions made before the subscription). The tower layer adds histograms of hold time
//! and queue wait ([`record_metrics`](crate::tower::BulkheadLayerBuilder::record_metrics)).
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
//! | `llm_bulkhead_bypassed_total` | counter | `reason`, `class` |
//! | `llm_bulkhead_borrowed_concurrency_abandoned_total` | counter | `cause` |
//! | `llm_bulkhead_reconfigured_total` | counter | |
//! | `llm_bulkhead_in_flight`, `llm_bulkhead_max_concurrent` | gauge | |
//! | `llm_bulkhead_pending`, `llm_bulkhead_max_queue` | gauge | |
//! | `llm_bulkhead_tokens_in_flight`, `llm_bulkhead_token_budget` | gauge | |
//! | `llm_bulkhead_limits_revision`, `llm_bulkhead_closed` | gauge | |
//! | `llm_bulkhead_class_in_flight`, `llm_bulkhead_class_tokens_in_flight` | gauge | `class` |
//! | `llm_bulkhead_hold_seconds` | histogram (layer) | `class` |
//! | `llm_bulkhead_queue_wait_seconds` | histogram (layer) | |
//!
//! `class` is absent on bulkheads without classes. With [`Telemetry::name`] every metric also
//! has a `bulkhead` label. Tracing events have the target `llm_bulkhead`: admissions,
//! releases and usage at `DEBUG`, refusals, bypasses and reconfigurations at `INFO`,
//! abandonments at `WARN`.
//!
//! ```
//! use llm_bulkhead::{telemetry, Bulkhead, Demand};
//! let bulkhead = Bulkhead::new(1)?;
//! let _subscription = telemetry::Telemetry::default().instrument(&bulkhead);
//! drop(bulkhead.try_acquire(Demand::slot())?); // one admit and one release event
//! # #[cfg(feature = "metrics")]
//! telemetry::record_gauges(&bulkhead);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::{Bulkhead, Event, Subscription};

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

/// What [`Telemetry::instrument`] emits.
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
}

impl Default for Telemetry {
    /// Tracing events and metrics, each when its feature is enabled.
    fn default() -> Telemetry {
        Telemetry {
            name: None,
            tracing: cfg!(feature = "tracing"),
            metrics: cfg!(feature = "metrics"),
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

    /// Updates counters (feature `metrics`; default on when enabled).
    ///
    /// ```
    /// # use llm_bulkhead::telemetry::Telemetry;
    /// let _ = Telemetry::default().metrics(false);
    /// ```
    pub fn metrics(mut self, on: bool) -> Telemetry {
        self.metrics = on && cfg!(feature = "metrics");
        self
    }

    /// Subscribes to `bulkhead`'s events. Dropping the subscription stops it. Install the
    /// metrics recorder first: counter handles are registered here.
    ///
    /// ```
    /// # use llm_bulkhead::{telemetry::Telemetry, Bulkhead};
    /// let b = Bulkhead::new(2).unwrap();
    /// let sub = Telemetry::default().instrument(&b);
    /// drop(sub);
    /// ```
    pub fn instrument(self, bulkhead: &Bulkhead) -> Subscription {
        #[cfg(feature = "metrics")]
        let counters = self
            .metrics
            .then(|| metrics_part::Counters::new(bulkhead, self.name.as_deref()));
        let name = self.name.clone();
        let tracing_on = self.tracing;
        let _ = &name;
        let _ = tracing_on;
        bulkhead.subscribe(move |event: &Event| {
            #[cfg(feature = "tracing")]
            if tracing_on {
                tracing_part::emit(name.as_deref(), event);
            }
            #[cfg(feature = "metrics")]
            if let Some(c) = &counters {
                c.count(event);
            }
            let _ = event;
        })
    }
}

/// Sets the gauges from `bulkhead.stats()` (feature `metrics`). Call it before each scrape,
/// or on a timer; `name` labels as [`Telemetry::name`] does.
///
/// ```
/// use llm_bulkhead::{telemetry, Bulkhead};
/// telemetry::record_gauges(&Bulkhead::new(4).unwrap());
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn record_gauges(bulkhead: &Bulkhead) {
    metrics_part::gauges(bulkhead, None);
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
    metrics_part::gauges(bulkhead, Some(name));
}

#[cfg(feature = "tracing")]
mod tracing_part {
    use crate::Event;
    use tracing::{debug, info, warn};

    pub(super) fn emit(name: Option<&str>, event: &Event) {
        let bulkhead = name.unwrap_or("");
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
                "admitted"
            ),
            Event::Reject(e) => {
                let r = &e.rejection;
                let d = &r.detail();
                let t = d.token_budget;
                info!(
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
                    "limits applied with a high-priority reserve above the token budget: every \
                     normal-priority token demand is refused"
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
                    info!(
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

#[cfg(feature = "metrics")]
mod metrics_part {
    use crate::{Bulkhead, Event, RejectReason};
    use metrics::{counter, gauge, Counter, Label};

    /// Counter handles, per class (one entry, without a class label, on a bulkhead without
    /// classes).
    pub(super) struct Counters {
        classes: Vec<String>,
        admitted: Vec<Counter>,
        released: Vec<Counter>,
        refunded: Vec<Counter>,
        rejected: Vec<[Counter; RejectReason::COUNTED.len()]>,
        /// Registered (at zero) without the `llm` feature too, which alone makes bypasses.
        #[cfg_attr(not(feature = "llm"), allow(dead_code))]
        bypassed: Vec<[Counter; RejectReason::COUNTED.len()]>,
        abandoned: [Counter; 2],
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

    impl Counters {
        pub(super) fn new(bulkhead: &Bulkhead, name: Option<&str>) -> Counters {
            let classes = bulkhead.class_names().to_vec();
            // Events of a classed bulkhead always name their class; the others never do.
            let keys: Vec<Option<&str>> = if classes.is_empty() {
                vec![None]
            } else {
                classes.iter().map(|c| Some(c.as_str())).collect()
            };
            let per = |metric: &'static str| -> Vec<Counter> {
                keys.iter()
                    .map(|k| counter!(metric, labels(name, *k, &[])))
                    .collect()
            };
            let by_reason = |metric: &'static str| -> Vec<[Counter; RejectReason::COUNTED.len()]> {
                keys.iter()
                    .map(|k| {
                        RejectReason::COUNTED
                            .map(|r| counter!(metric, labels(name, *k, &[("reason", r.as_str())])))
                    })
                    .collect()
            };
            Counters {
                admitted: per("llm_bulkhead_admitted_total"),
                released: per("llm_bulkhead_released_total"),
                refunded: per("llm_bulkhead_tokens_refunded_total"),
                rejected: by_reason("llm_bulkhead_rejected_total"),
                bypassed: by_reason("llm_bulkhead_bypassed_total"),
                abandoned: ["manual", "deadline"].map(|c| {
                    counter!(
                        "llm_bulkhead_borrowed_concurrency_abandoned_total",
                        labels(name, None, &[("cause", c)])
                    )
                }),
                reconfigured: counter!("llm_bulkhead_reconfigured_total", labels(name, None, &[])),
                classes,
            }
        }

        fn class(&self, class: Option<&str>) -> usize {
            class
                .and_then(|c| self.classes.iter().position(|n| n == c))
                .unwrap_or(0)
        }

        fn reason(r: RejectReason) -> usize {
            RejectReason::COUNTED
                .iter()
                .position(|x| *x == r)
                .unwrap_or(0)
        }

        pub(super) fn count(&self, event: &Event) {
            match event {
                Event::Admit(e) => self.admitted[self.class(e.class.as_deref())].increment(1),
                Event::Reject(e) => self.rejected[self.class(e.class.as_deref())]
                    [Self::reason(e.rejection.reason)]
                .increment(1),
                Event::Release(e) => {
                    let k = self.class(e.class.as_deref());
                    self.released[k].increment(1);
                    self.refunded[k].increment(e.refunded_tokens);
                }
                #[cfg(feature = "llm")]
                Event::Extension(_) => {
                    if let Some(crate::llm::LlmEvent::Bypass(e)) = crate::llm::LlmEvent::of(event) {
                        self.bypassed[self.class(e.class.as_deref())][Self::reason(e.reason)]
                            .increment(1);
                    }
                }
                Event::BorrowedConcurrencyAbandon(e) => {
                    let i = match e.cause {
                        crate::AbandonCause::Manual => 0,
                        crate::AbandonCause::Deadline => 1,
                    };
                    self.abandoned[i].increment(1);
                }
                Event::Reconfigure(_) => self.reconfigured.increment(1),
                _ => {}
            }
        }
    }

    pub(super) fn gauges(bulkhead: &Bulkhead, name: Option<&str>) {
        let s = bulkhead.stats();
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
