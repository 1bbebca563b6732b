//! The telemetry module: tracing events with sanitized fields and metrics through the facade,
//! checked with a local subscriber and a local debugging recorder (no global state).

use llm_bulkhead::telemetry::{self, Telemetry};
use llm_bulkhead::{Bulkhead, ClassLimits, Demand, Reservation, Usage};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use std::io::Write;
use std::sync::{Arc, Mutex};

type Labels = Vec<(String, String)>;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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
    let out = Buffer::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let b = classed();
        let batch = b.class_id("batch").unwrap();
        let _sub = Telemetry::default()
            .name("openai")
            .metrics(false)
            .instrument(&b);
        let a = b
            .try_acquire(Demand::tokens(Reservation::new(100, 50).unwrap()).in_class(batch))
            .unwrap();
        let refused = b
            .try_acquire(Demand::tokens(Reservation::new(10, 5).unwrap()).in_class(batch))
            .unwrap_err();
        a.release(Some(Usage::new(90, 20))).unwrap();
        b.apply_limits(b.limits().with_revision(4)).unwrap();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let admit = text.lines().find(|l| l.contains("admitted")).expect(&text);
        assert!(admit.contains("DEBUG llm_bulkhead"), "{admit}");
        assert!(admit.contains("bulkhead=\"openai\""), "{admit}");
        assert!(admit.contains("class=\"batch\""), "{admit}");
        assert!(admit.contains("reserved_tokens=150"), "{admit}");
        assert!(admit.contains("admission_id="), "{admit}");
        let reject = text.lines().find(|l| l.contains("rejected")).expect(&text);
        assert!(reject.contains("INFO llm_bulkhead"), "{reject}");
        assert!(reject.contains("reason=\"concurrency_limit\""), "{reject}");
        assert!(
            reject.contains("constraint=\"admission_class\""),
            "{reject}"
        );
        assert!(
            reject.contains(&format!("revision={}", refused.revision)),
            "{reject}"
        );
        assert!(reject.contains("max_concurrent=2"), "{reject}");
        assert!(reject.contains("requested_tokens=15"), "{reject}");
        let release = text.lines().find(|l| l.contains("released")).expect(&text);
        assert!(release.contains("refunded_tokens=40"), "{release}");
        assert!(text.contains("limits applied") && text.contains("revision=4"));
    });
}

#[test]
fn counters_gauges_and_labels_through_the_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let b = classed();
        let batch = b.class_id("batch").unwrap();
        let _sub = Telemetry::default().tracing(false).instrument(&b);
        let held = b.try_acquire(Demand::slot().in_class(batch)).unwrap();
        assert!(b.try_acquire(Demand::slot().in_class(batch)).is_err());
        let _premium = b.try_acquire(Demand::slot()).unwrap();
        assert!(b.try_acquire(Demand::slot()).is_err());
        drop(held);
        telemetry::record_gauges(&b);
    });
    let values: Vec<(String, Labels, DebugValue)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let key = k.key();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            assert!(matches!(k.kind(), MetricKind::Counter | MetricKind::Gauge));
            (key.name().to_owned(), labels, v)
        })
        .collect();
    let get = |name: &str, labels: &[(&str, &str)]| {
        values
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, _, v)| v)
            .unwrap_or_else(|| panic!("no {name} {labels:?} in {values:?}"))
    };
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
    let out = Buffer::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let id = tracing::subscriber::with_default(subscriber, || {
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
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let bypass = text
        .lines()
        .find(|l| l.contains("bypassed (observe mode)"))
        .expect(&text);
    assert!(bypass.contains("INFO llm_bulkhead"), "{bypass}");
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

/// A limits install whose high-priority reserve exceeds the budget (every normal-priority
/// token demand refused) is a warning that says so, not the routine "limits applied".
#[test]
fn a_reserve_above_the_budget_is_logged_as_a_warning() {
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
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
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
    });
}
