//! The telemetry module: tracing events with sanitized fields and metrics through the facade,
//! checked with a local subscriber and a local debugging recorder (no global state).

use llm_bulkhead::telemetry::Telemetry;
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Reservation, Usage};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

type Labels = Vec<(String, String)>;

#[path = "support/log_buffer.rs"]
mod log_buffer;
use log_buffer::Buffer;

/// `f`'s result and what it traced (`DEBUG` and above, as text).
fn traced<T>(f: impl FnOnce() -> T) -> (T, String) {
    let out = Buffer::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let value = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    (value, text)
}

type Metrics = Vec<(String, Labels, DebugValue)>;

/// Every metric the recorder holds (each of one of `kinds`), without the label `skip`.
fn metrics_of(snapshotter: &Snapshotter, kinds: &[MetricKind], skip: &str) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            assert!(kinds.contains(&k.kind()), "{k:?}");
            let key = k.key();
            let labels = key
                .labels()
                .filter(|l| l.key() != skip)
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, v)
        })
        .collect()
}

/// The value of metric `name` with exactly `labels`.
fn find<'a>(metrics: &'a Metrics, name: &str, labels: &[(&str, &str)]) -> &'a DebugValue {
    metrics
        .iter()
        .find(|(n, l, _)| {
            n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
        })
        .map(|(_, _, v)| v)
        .unwrap_or_else(|| panic!("no {name} {labels:?} in {metrics:?}"))
}

fn classed() -> Bulkhead {
    Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(1_000)
        .class("premium", ClassLimits::default())
        .class(
            "batch",
            ClassLimits {
                max_concurrent: Some(1),
                ..Default::default()
            },
        )
        .default_class("premium")
        .build()
        .unwrap()
}

#[test]
fn tracing_events_carry_sanitized_decision_fields() {
    let (refused_revision, text) = traced(|| {
        let b = classed();
        let batch = b.class_id("batch").unwrap();
        let _sub = Telemetry::default()
            .name("openai")
            .metrics(false)
            .trace_admissions(true)
            .instrument(&b);
        let a = b
            .try_acquire(Demand::tokens(Reservation::new(100, 50).unwrap()).in_class(batch))
            .unwrap();
        let refused = b
            .try_acquire(Demand::tokens(Reservation::new(10, 5).unwrap()).in_class(batch))
            .unwrap_err();
        a.release(Some(Usage::new(90, 20))).unwrap();
        b.apply_limits(b.limits().with_revision(4)).unwrap();
        refused.revision
    });
    let admit = text.lines().find(|l| l.contains("admitted")).expect(&text);
    assert!(admit.contains("DEBUG llm_bulkhead"), "{admit}");
    assert!(admit.contains("bulkhead=\"openai\""), "{admit}");
    assert!(admit.contains("class=\"batch\""), "{admit}");
    assert!(admit.contains("reserved_tokens=150"), "{admit}");
    assert!(admit.contains("admission_id="), "{admit}");
    let reject = text.lines().find(|l| l.contains("rejected")).expect(&text);
    assert!(reject.contains("DEBUG llm_bulkhead"), "{reject}");
    let summary = text
        .lines()
        .find(|l| l.contains("llm_bulkhead: refusals"))
        .expect(&text);
    assert!(summary.contains("INFO llm_bulkhead"), "{summary}");
    assert!(summary.contains("count=1"), "{summary}");
    assert!(reject.contains("reason=\"concurrency_limit\""), "{reject}");
    assert!(
        reject.contains("constraint=\"admission_class\""),
        "{reject}"
    );
    assert!(
        reject.contains(&format!("revision={refused_revision}")),
        "{reject}"
    );
    assert!(reject.contains("max_concurrent=2"), "{reject}");
    assert!(reject.contains("requested_tokens=15"), "{reject}");
    let release = text.lines().find(|l| l.contains("released")).expect(&text);
    assert!(release.contains("refunded_tokens=40"), "{release}");
    assert!(text.contains("limits applied") && text.contains("revision=4"));
}

#[test]
fn counters_gauges_and_labels_through_the_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let b = classed();
        let batch = b.class_id("batch").unwrap();
        let telemetry = Telemetry::default().tracing(false);
        let _sub = telemetry.instrument(&b);
        let held = b.try_acquire(Demand::slot().in_class(batch)).unwrap();
        assert!(b.try_acquire(Demand::slot().in_class(batch)).is_err());
        let _premium = b.try_acquire(Demand::slot()).unwrap();
        assert!(b.try_acquire(Demand::slot()).is_err());
        drop(held);
        telemetry.record(&b);
    });
    let values = metrics_of(&snapshotter, &[MetricKind::Counter, MetricKind::Gauge], "");
    let get = |name: &str, labels: &[(&str, &str)]| find(&values, name, labels);
    assert_eq!(
        get("llm_bulkhead_admitted_total", &[("class", "batch")]),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        get("llm_bulkhead_admitted_total", &[("class", "premium")]),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        get(
            "llm_bulkhead_rejected_total",
            &[("class", "batch"), ("reason", "concurrency_limit")]
        ),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        get(
            "llm_bulkhead_rejected_total",
            &[("class", "premium"), ("reason", "concurrency_limit")]
        ),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        get("llm_bulkhead_released_total", &[("class", "batch")]),
        &DebugValue::Counter(1)
    );
    let gauge = |name: &str, labels: &[(&str, &str)]| match get(name, labels) {
        DebugValue::Gauge(g) => g.into_inner(),
        v => panic!("{name}: {v:?}"),
    };
    assert_eq!(gauge("llm_bulkhead_in_flight", &[]), 1.0);
    assert_eq!(gauge("llm_bulkhead_max_concurrent", &[]), 2.0);
    assert_eq!(gauge("llm_bulkhead_token_budget", &[]), 1_000.0);
    assert_eq!(
        gauge("llm_bulkhead_class_in_flight", &[("class", "premium")]),
        1.0
    );
    assert_eq!(
        gauge("llm_bulkhead_class_in_flight", &[("class", "batch")]),
        0.0
    );
}

/// Observe mode's bypasses (LLM-layer events, delivered as `Event::Extension`) reach both
/// telemetry paths under the names they always had: the tracing message
/// "bypassed (observe mode)" and the counter `llm_bulkhead_bypassed_total`.
#[cfg(feature = "llm")]
#[test]
fn bypasses_reach_tracing_and_metrics() {
    use llm_bulkhead::llm::{LlmBulkhead, LlmRequest, Mode, RunOptions};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (id, text) = traced(|| {
        metrics::with_local_recorder(&recorder, || {
            let b = classed();
            let batch = b.class_id("batch").unwrap();
            let _sub = Telemetry::default().name("openai").instrument(&b);
            let _held = b.try_acquire(Demand::slot().in_class(batch)).unwrap();
            let llm = LlmBulkhead::new(b, |_: &LlmRequest| Ok(Reservation::new(10, 5).unwrap()));
            let options = RunOptions {
                mode: Mode::observe(),
                class: Some(batch),
                ..RunOptions::default()
            };
            llm.run_blocking(&LlmRequest::default(), options, |ctx| {
                Ok::<_, ()>(ctx.admission_id())
            })
            .unwrap()
        })
    });
    assert!(id.is_shadow());
    let bypass = text
        .lines()
        .find(|l| l.contains("bypassed (observe mode)"))
        .expect(&text);
    assert!(bypass.contains("DEBUG llm_bulkhead"), "{bypass}");
    let summary = text
        .lines()
        .find(|l| l.contains("llm_bulkhead: bypasses"))
        .expect(&text);
    assert!(summary.contains("INFO llm_bulkhead"), "{summary}");
    assert!(summary.contains("count=1"), "{summary}");
    assert!(bypass.contains("bulkhead=\"openai\""), "{bypass}");
    assert!(bypass.contains("class=\"batch\""), "{bypass}");
    assert!(bypass.contains("reason=\"concurrency_limit\""), "{bypass}");
    assert!(bypass.contains("raced=false"), "{bypass}");
    assert!(bypass.contains(&format!("admission_id={id}")), "{bypass}");
    let bypassed: Vec<(Labels, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| k.key().name() == "llm_bulkhead_bypassed_total")
        .map(|(k, _, _, v)| {
            let labels = k
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (labels, v)
        })
        .filter(|(_, v)| *v != DebugValue::Counter(0))
        .collect();
    let label = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(bypassed.len(), 1, "{bypassed:?}");
    let (labels, value) = &bypassed[0];
    assert_eq!(value, &DebugValue::Counter(1));
    for l in [
        label("bulkhead", "openai"),
        label("class", "batch"),
        label("reason", "concurrency_limit"),
    ] {
        assert!(labels.contains(&l), "{labels:?}");
    }
}

/// Every number `Telemetry::record` exports is the one `stats()` gives, on a run whose usage
/// reports refund tokens before release (the refund counter stayed at 0 when it was fed by
/// release events), with and without classes, after refusals and an abandonment.
#[test]
fn every_exported_number_equals_stats() {
    for classed_bulkhead in [false, true] {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let b = if classed_bulkhead {
            classed()
        } else {
            Bulkhead::builder()
                .max_concurrent(2)
                .token_budget(1_000)
                .build()
                .unwrap()
        };
        let telemetry = Telemetry::default().name("gw").tracing(false);
        let stats = metrics::with_local_recorder(&recorder, || {
            let _sub = telemetry.instrument(&b);
            for _ in 0..3 {
                let mut a = b
                    .try_acquire(Demand::tokens(Reservation::new(100, 200).unwrap()))
                    .unwrap();
                // Usage before release: 300 held, 40 consumed so far, 260 refunded now.
                a.report_usage(Usage::new(30, 10)).unwrap();
                let _other = b
                    .try_acquire(Demand::tokens(Reservation::new(100, 200).unwrap()))
                    .unwrap();
                assert!(b.try_acquire(Demand::slot()).is_err()); // concurrency_limit
                a.release(None).unwrap();
            }
            assert!(b
                .try_acquire(Demand::tokens(Reservation::new(900, 900).unwrap()))
                .is_err()); // budget_limit
            telemetry.record(&b);
            b.stats()
        });
        let values = metrics_of(
            &snapshotter,
            &[MetricKind::Counter, MetricKind::Gauge],
            "bulkhead",
        );
        let counter = |name: &str, labels: &[(&str, &str)]| -> u64 {
            match find(&values, name, labels) {
                DebugValue::Counter(c) => *c,
                other => panic!("{name} {labels:?}: {other:?}"),
            }
        };
        let reasons = llm_bulkhead::RejectReason::COUNTED;
        match &stats.classes {
            None => {
                let t = stats.token_budget.unwrap();
                assert!(t.total_refunded >= 3 * 260, "{t:?}");
                assert_eq!(counter("llm_bulkhead_admitted_total", &[]), stats.admitted);
                assert_eq!(counter("llm_bulkhead_released_total", &[]), stats.released);
                assert_eq!(
                    counter("llm_bulkhead_tokens_refunded_total", &[]),
                    t.total_refunded
                );
                for r in reasons {
                    assert_eq!(
                        counter("llm_bulkhead_rejected_total", &[("reason", r.as_str())]),
                        stats.rejected_by_reason.get(r),
                        "{r:?}"
                    );
                }
            }
            Some(c) => {
                for k in &c.classes {
                    let class = ("class", k.name.as_str());
                    assert_eq!(counter("llm_bulkhead_admitted_total", &[class]), k.admitted);
                    assert_eq!(counter("llm_bulkhead_released_total", &[class]), k.released);
                    assert_eq!(
                        counter("llm_bulkhead_tokens_refunded_total", &[class]),
                        k.total_refunded
                    );
                    for r in reasons {
                        assert_eq!(
                            counter(
                                "llm_bulkhead_rejected_total",
                                &[class, ("reason", r.as_str())]
                            ),
                            k.rejected_by_reason.get(r),
                            "{r:?}"
                        );
                    }
                }
                assert!(c.classes[0].total_refunded >= 3 * 260);
            }
        }
        assert!(stats.rejected >= 4);
        assert_eq!(counter("llm_bulkhead_reconfigured_total", &[]), 0);
    }
}

/// `Telemetry::decision_timing` puts the decision's timing on the traced lines; the default
/// does not ask for it (no clock read).
#[test]
fn decision_timing_reaches_the_traced_lines_only_when_asked() {
    for asked in [false, true] {
        let ((), text) = traced(|| {
            let b = Bulkhead::new(1).unwrap();
            let _sub = Telemetry::default()
                .metrics(false)
                .trace_admissions(true)
                .decision_timing(asked)
                .instrument(&b);
            drop(b.try_acquire(Demand::slot()).unwrap());
        });
        let admit = text.lines().find(|l| l.contains("admitted")).expect(&text);
        assert_eq!(admit.contains("decision_ns="), asked, "{admit}");
        assert_eq!(admit.contains("queue_wait_ns=0"), asked, "{admit}");
    }
}

/// A limits install whose high-priority reserve exceeds the budget (every normal-priority
/// token demand refused) is a warning that says so, not the routine "limits applied".
#[test]
fn a_reserve_above_the_budget_is_logged_as_a_warning() {
    let ((), text) = traced(|| {
        let b = Bulkhead::builder()
            .max_concurrent(2)
            .token_budget(1_000)
            .build()
            .unwrap();
        let _sub = Telemetry::default().metrics(false).instrument(&b);
        let routine = b.limits().with_revision(1);
        b.apply_limits(routine).unwrap();
        let starved =
            b.limits()
                .with_revision(2)
                .with_token_budget(Some(llm_bulkhead::BudgetLimits {
                    budget: 1_000,
                    high_priority_reserve: 1_500,
                }));
        b.apply_limits(starved).unwrap();
    });
    {
        let first = text
            .lines()
            .find(|l| l.contains("revision=1"))
            .expect(&text);
        assert!(
            first.contains("INFO") && first.contains("limits applied"),
            "{first}"
        );
        let second = text
            .lines()
            .find(|l| l.contains("revision=2"))
            .expect(&text);
        assert!(second.contains("WARN"), "{second}");
        assert!(second.contains("high_priority_reserve=1500"), "{second}");
        assert!(
            second.contains("normal-priority token demand is refused"),
            "{second}"
        );
    }
}
