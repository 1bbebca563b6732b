//! The layer's histograms (feature `metrics`): hold time per class and queue wait.

use crate::{Bulkhead, ClassId};
use metrics::{Histogram, Label};
use std::time::Instant;

/// Histogram handles, registered when the layer is built.
pub(crate) struct LayerMetrics {
    /// Per class index, then one for admissions without a class.
    hold: Vec<Histogram>,
    wait: Histogram,
}

impl LayerMetrics {
    pub(crate) fn new(bulkhead: &Bulkhead, name: Option<&str>) -> LayerMetrics {
        let labels = |class: Option<&String>| {
            let mut l = Vec::new();
            if let Some(n) = name {
                l.push(Label::new("bulkhead", n.to_owned()));
            }
            if let Some(c) = class {
                l.push(Label::new("class", c.clone()));
            }
            l
        };
        let mut hold: Vec<Histogram> = bulkhead
            .class_names()
            .iter()
            .map(|c| metrics::histogram!(crate::telemetry::HOLD_SECONDS, labels(Some(c))))
            .collect();
        hold.push(metrics::histogram!(
            crate::telemetry::HOLD_SECONDS,
            labels(None)
        ));
        LayerMetrics {
            hold,
            wait: metrics::histogram!(crate::telemetry::QUEUE_WAIT_SECONDS, labels(None)),
        }
    }

    #[inline]
    pub(crate) fn timer(&self, class: Option<ClassId>) -> HoldTimer {
        let i = class.map_or(self.hold.len() - 1, |c| c.index().min(self.hold.len() - 1));
        HoldTimer {
            start: Instant::now(),
            histogram: self.hold[i].clone(),
        }
    }

    pub(crate) fn record_wait(&self, started: Instant) {
        self.wait.record(started.elapsed().as_secs_f64());
    }
}

/// Records the hold time when dropped (with the admission it travels with).
pub(crate) struct HoldTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for HoldTimer {
    fn drop(&mut self) {
        self.histogram.record(self.start.elapsed().as_secs_f64());
    }
}
