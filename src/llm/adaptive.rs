//! Adaptive estimation: a per-model, smoothed correction of the input estimate, learnt from the
//! usage providers report (reference §3.6, with its defaults and numbers).
//!
//! Each observation compares the reported input tokens with the **uncorrected** base estimate
//! (so corrections never compound), smooths the ratio exponentially, and, once a model has
//! enough samples, scales that model's input estimates by the ratio clamped to
//! `[min_correction, max_correction]`. The output cap is never corrected. At most `max_models`
//! models are tracked; the oldest-inserted is evicted first.
//!
//! # Concurrency
//!
//! The per-model state sits behind one mutex, held for a few hundred nanoseconds at most (a
//! linear scan of at most `max_models` entries). Estimation itself (the base estimate) runs
//! outside the lock.

use super::estimate::{EstimateError, ModelAwareEstimator, TokenEstimator};
use super::request::LlmRequest;
use crate::sync::{lock, Mutex, MutexGuard};
use crate::{Reservation, Usage};

/// One model's correction, as [`AdaptiveEstimator::corrections`] reports it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Correction {
    /// The model key (lower-cased).
    pub model: String,
    /// Observations so far.
    pub samples: u64,
    /// The smoothed ratio `reported input / base input`, unclamped.
    pub factor: f64,
    /// What estimates are multiplied by now: 1 until `min_samples`, then the clamped factor.
    pub applied: f64,
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    smoothing: f64,
    min_samples: u64,
    min_correction: f64,
    max_correction: f64,
    max_models: usize,
}

impl Settings {
    fn applied(&self, samples: u64, factor: f64) -> f64 {
        if samples < self.min_samples {
            1.0
        } else {
            factor.clamp(self.min_correction, self.max_correction)
        }
    }
}

/// Builds an [`AdaptiveEstimator`]; defaults are the reference's: smoothing 0.2, 5 samples,
/// corrections within [0.5, 2], 64 models.
#[derive(Clone, Debug)]
#[must_use]
pub struct AdaptiveEstimatorBuilder {
    base: ModelAwareEstimator,
    settings: Settings,
}

impl AdaptiveEstimatorBuilder {
    /// Weight of a new observation, in (0, 1].
    pub fn smoothing(mut self, s: f64) -> Self {
        self.settings.smoothing = s;
        self
    }
    /// Observations needed before a correction applies (≥ 1).
    pub fn min_samples(mut self, n: u64) -> Self {
        self.settings.min_samples = n;
        self
    }
    /// Smallest applied correction (> 0).
    pub fn min_correction(mut self, c: f64) -> Self {
        self.settings.min_correction = c;
        self
    }
    /// Largest applied correction (≥ `min_correction`).
    pub fn max_correction(mut self, c: f64) -> Self {
        self.settings.max_correction = c;
        self
    }
    /// Most models tracked (≥ 1).
    pub fn max_models(mut self, n: usize) -> Self {
        self.settings.max_models = n;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`EstimateError::InvalidSetting`] naming the first invalid setting.
    pub fn build(self) -> Result<AdaptiveEstimator, EstimateError> {
        let s = self.settings;
        let bad = |field, expected| Err(EstimateError::InvalidSetting { field, expected });
        if !(s.smoothing > 0.0 && s.smoothing <= 1.0) {
            return bad("smoothing", "in (0, 1]");
        }
        if s.min_samples < 1 {
            return bad("min_samples", "at least 1");
        }
        if !(s.min_correction > 0.0 && s.min_correction.is_finite()) {
            return bad("min_correction", "a finite number above 0");
        }
        if !(s.max_correction >= s.min_correction && s.max_correction.is_finite()) {
            return bad("max_correction", "finite and at least min_correction");
        }
        if s.max_models < 1 {
            return bad("max_models", "at least 1");
        }
        Ok(AdaptiveEstimator {
            base: self.base,
            settings: s,
            state: Mutex::new(Vec::new()),
        })
    }
}

/// A [`ModelAwareEstimator`] whose input estimates learn from reported usage.
///
/// ```
/// use llm_bulkhead::llm::{AdaptiveEstimator, LlmRequest, ModelAwareEstimator, TokenEstimator};
/// use llm_bulkhead::Usage;
/// let est = AdaptiveEstimator::builder(ModelAwareEstimator::default()).min_samples(3).smoothing(1.0).build()?;
/// let req = LlmRequest::new("gpt-4o", &[&" ".repeat(370)]); // base input: 370 / 3.7 + 7 = 107
/// for _ in 0..3 {
///     est.observe(&req, Usage::new(150, 10))?; // the provider keeps reporting 150
/// }
/// assert_eq!(est.estimate(&req)?.input(), 150);
/// # Ok::<(), llm_bulkhead::llm::EstimateError>(())
/// ```
#[derive(Debug)]
pub struct AdaptiveEstimator {
    base: ModelAwareEstimator,
    settings: Settings,
    /// `(model key, samples, factor)` in insertion order.
    state: Mutex<Vec<(String, u64, f64)>>,
}

impl AdaptiveEstimator {
    /// A builder around `base`, with the reference's defaults.
    pub fn builder(base: ModelAwareEstimator) -> AdaptiveEstimatorBuilder {
        AdaptiveEstimatorBuilder {
            base,
            settings: Settings {
                smoothing: 0.2,
                min_samples: 5,
                min_correction: 0.5,
                max_correction: 2.0,
                max_models: 64,
            },
        }
    }

    fn key(&self, request: &LlmRequest) -> String {
        request
            .model
            .as_deref()
            .or(self.base.default_model())
            .unwrap_or("")
            .to_lowercase()
    }

    fn state(&self) -> MutexGuard<'_, Vec<(String, u64, f64)>> {
        // Every critical section leaves the vector consistent, so a poisoned lock is usable.
        lock(&self.state)
    }

    /// Learns from the usage a provider reported for `request`. Ignored when the base estimate
    /// of the input is 0.
    ///
    /// # Errors
    /// [`EstimateError::Overflow`] when the usage's total overflows, or the base estimator's
    /// error.
    pub fn observe(&self, request: &LlmRequest, usage: Usage) -> Result<(), EstimateError> {
        usage
            .total()
            .ok_or(EstimateError::Overflow { field: "usage" })?;
        let base = self.base.estimate(request)?.input();
        if base == 0 {
            return Ok(());
        }
        let observed = usage.input as f64 / base as f64;
        let key = self.key(request);
        let mut state = self.state();
        if let Some(e) = state.iter_mut().find(|e| e.0 == key) {
            e.2 += self.settings.smoothing * (observed - e.2);
            e.1 += 1;
        } else {
            while state.len() >= self.settings.max_models {
                state.remove(0);
            }
            state.push((key, 1, observed));
        }
        Ok(())
    }

    /// Every tracked model's correction, oldest first.
    pub fn corrections(&self) -> Vec<Correction> {
        self.state()
            .iter()
            .map(|(model, samples, factor)| Correction {
                model: model.clone(),
                samples: *samples,
                factor: *factor,
                applied: self.settings.applied(*samples, *factor),
            })
            .collect()
    }

    /// Forgets one model (matched case-insensitively), or every model.
    pub fn reset(&self, model: Option<&str>) {
        let mut state = self.state();
        match model {
            Some(m) => {
                let key = m.to_lowercase();
                state.retain(|e| e.0 != key);
            }
            None => state.clear(),
        }
    }
}

impl TokenEstimator for AdaptiveEstimator {
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        let base = self.base.estimate(request)?;
        let key = self.key(request);
        let applied = self
            .state()
            .iter()
            .find(|e| e.0 == key)
            .map_or(1.0, |e| self.settings.applied(e.1, e.2));
        if applied == 1.0 {
            return Ok(base);
        }
        let input = (base.input() as f64 * applied).ceil();
        if !(input.is_finite() && input < u64::MAX as f64) {
            return Err(EstimateError::Overflow { field: "input" });
        }
        Reservation::new(input as u64, base.max_output()).map_err(|_| EstimateError::Overflow {
            field: "reservation",
        })
    }
}
