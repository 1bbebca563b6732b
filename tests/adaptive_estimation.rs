//! Adaptive estimation with the reference's numbers (behaviour §3.6, v38_features #16–#25).
#![cfg(feature = "llm")]

use llm_bulkhead::llm::{
    AdaptiveEstimator, Correction, EstimateError, LlmRequest, ModelAwareEstimator, TokenEstimator,
};
use llm_bulkhead::{Bulkhead, Demand, Usage};

/// A request whose base estimate is the reference's `ceil(chars / ratio)`: the base
/// estimators now count every part (message overheads, a script bound on text), so the
/// reference's base is given as `extra_input_tokens` of a request with no messages. What these
/// tests check is the correction, which sees only the base.
fn request(model: &str, chars: usize) -> LlmRequest {
    let (ratio, _) = ModelAwareEstimator::default().ratio_for(model);
    let mut r = LlmRequest::new(model, &[]);
    r.extra_input_tokens = Some((chars as f64 / ratio).ceil() as u64);
    r.max_tokens = Some(50);
    r
}

fn adaptive() -> llm_bulkhead::llm::AdaptiveEstimatorBuilder {
    AdaptiveEstimator::builder(ModelAwareEstimator::default())
}

fn models(e: &AdaptiveEstimator) -> Vec<String> {
    e.corrections().into_iter().map(|c| c.model).collect()
}

#[test]
fn worked_example_smoothing_with_defaults() {
    // §3.6: observations 150, 200, 100 against base 100 → factor 1.5 → 1.6 → 1.48; applied 1.
    let e = adaptive().build().unwrap();
    let r = request("gpt-4o", 370);
    let mut factors = Vec::new();
    for input in [150, 200, 100] {
        e.observe(&r, Usage::new(input, 0)).unwrap();
        factors.push(e.corrections()[0].factor);
    }
    assert!((factors[0] - 1.5).abs() < 1e-12 && (factors[1] - 1.6).abs() < 1e-12);
    assert!((factors[2] - 1.48).abs() < 1e-12, "{factors:?}");
    assert_eq!(e.corrections()[0].applied, 1.0);
    assert_eq!(e.estimate(&r).unwrap().input(), 100);
}

#[test]
fn matches_the_base_before_min_samples() {
    // #16
    let e = adaptive().min_samples(3).build().unwrap();
    let r = request("gpt-4o", 370);
    let base = ModelAwareEstimator::default().estimate(&r).unwrap();
    assert_eq!(e.estimate(&r).unwrap(), base);
    for _ in 0..2 {
        e.observe(&r, Usage::new(200, 0)).unwrap();
    }
    assert_eq!(e.estimate(&r).unwrap(), base);
    assert_eq!(e.corrections()[0].applied, 1.0);
}

#[test]
fn corrects_a_systematic_underestimate() {
    // #17
    let e = adaptive().min_samples(3).smoothing(1.0).build().unwrap();
    let r = request("gpt-4o", 370);
    for _ in 0..3 {
        e.observe(&r, Usage::new(150, 0)).unwrap();
    }
    let x = e.estimate(&r).unwrap();
    assert_eq!((x.input(), x.max_output()), (150, 50));
    let c: Vec<(String, u64, f64, f64)> = e
        .corrections()
        .into_iter()
        .map(|c: Correction| (c.model, c.samples, c.factor, c.applied))
        .collect();
    assert_eq!(c, [("gpt-4o".into(), 3, 1.5, 1.5)]);
}

#[test]
fn clamps_the_applied_factor() {
    // #18
    let e = adaptive()
        .min_correction(0.8)
        .max_correction(1.5)
        .min_samples(1)
        .smoothing(1.0)
        .build()
        .unwrap();
    let r = request("gpt-4o", 370);
    e.observe(&r, Usage::new(1_000, 0)).unwrap();
    assert_eq!(e.estimate(&r).unwrap().input(), 150);
    assert_eq!(
        (e.corrections()[0].factor, e.corrections()[0].applied),
        (10.0, 1.5)
    );
    e.reset(None);
    e.observe(&r, Usage::new(1, 0)).unwrap();
    assert_eq!(e.estimate(&r).unwrap().input(), 80);
}

#[test]
fn observes_against_the_uncorrected_base() {
    // #19: feedback does not compound.
    let e = adaptive().min_samples(1).smoothing(1.0).build().unwrap();
    let r = request("gpt-4o", 370);
    e.observe(&r, Usage::new(150, 0)).unwrap();
    assert_eq!(e.estimate(&r).unwrap().input(), 150);
    e.observe(&r, Usage::new(150, 0)).unwrap();
    assert_eq!(e.corrections()[0].factor, 1.5);
    assert_eq!(e.estimate(&r).unwrap().input(), 150);
}

#[test]
fn per_model_and_case_insensitive() {
    // #20
    let e = adaptive().min_samples(1).smoothing(1.0).build().unwrap();
    e.observe(&request("gpt-4o", 370), Usage::new(200, 0))
        .unwrap();
    assert_eq!(e.estimate(&request("GPT-4o", 370)).unwrap().input(), 200);
    let claude = request("claude-sonnet-4-5", 380); // base ceil(380 / 3.9) = 98
    assert_eq!(
        ModelAwareEstimator::default()
            .estimate(&claude)
            .unwrap()
            .input(),
        98
    );
    e.observe(&claude, Usage::new(50, 0)).unwrap();
    assert_eq!(e.estimate(&claude).unwrap().input(), 50);
    let mut m = models(&e);
    m.sort();
    assert_eq!(m, ["claude-sonnet-4-5", "gpt-4o"]);
}

#[test]
fn ignores_a_zero_base_estimate() {
    // #21
    let e = adaptive().build().unwrap();
    e.observe(&LlmRequest::new("gpt-4o", &[]), Usage::new(100, 0))
        .unwrap();
    assert!(e.corrections().is_empty());
}

#[test]
fn evicts_the_oldest_model_and_resets() {
    // #22, #23
    let e = adaptive().max_models(2).build().unwrap();
    for m in ["model-a", "model-b", "model-c"] {
        e.observe(&request(m, 40), Usage::new(10, 0)).unwrap();
    }
    assert_eq!(models(&e), ["model-b", "model-c"]);
    e.reset(Some("MODEL-C"));
    assert_eq!(models(&e), ["model-b"]);
    e.reset(None);
    assert!(e.corrections().is_empty());
}

#[test]
fn validates_settings_and_usage() {
    // #24
    let field = |b: llm_bulkhead::llm::AdaptiveEstimatorBuilder| match b.build() {
        Err(EstimateError::InvalidSetting { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(adaptive().smoothing(0.0)), "smoothing");
    assert_eq!(field(adaptive().smoothing(1.1)), "smoothing");
    assert_eq!(field(adaptive().min_samples(0)), "min_samples");
    assert_eq!(field(adaptive().min_correction(0.0)), "min_correction");
    assert_eq!(
        field(adaptive().min_correction(2.0).max_correction(1.0)),
        "max_correction"
    );
    assert_eq!(field(adaptive().max_models(0)), "max_models");
    let e = adaptive().build().unwrap();
    assert!(e
        .observe(&request("gpt-4o", 40), Usage::new(u64::MAX, 1))
        .is_err());
}

#[test]
fn end_to_end_with_a_bulkhead() {
    // #25 adapted (there are no release events yet): the caller feeds each release's usage to
    // `observe`. minSamples 2, smoothing 1; base input 100; two calls report 200 → 200 + 50.
    let e = adaptive().min_samples(2).smoothing(1.0).build().unwrap();
    let b = Bulkhead::builder()
        .max_concurrent(2)
        .token_budget(100_000)
        .build()
        .unwrap();
    let r = request("gpt-4o", 370);
    assert_eq!(e.estimate(&r).unwrap().input(), 100);
    for _ in 0..2 {
        let a = b
            .try_acquire(Demand::tokens(e.estimate(&r).unwrap()))
            .unwrap();
        let usage = Usage::new(200, 5);
        a.release(Some(usage)).unwrap();
        e.observe(&r, usage).unwrap();
    }
    let x = e.estimate(&r).unwrap();
    assert_eq!((x.input(), x.total()), (200, 250));
}
