//! Token estimation: from a request to the [`Reservation`] admission will hold
//! (`input + max_output`), with the reference library's numbers.
//!
//! * [`NaiveEstimator`]: `ceil(chars / 4) + extra_input_tokens`, output `max_tokens` or 2048.
//! * [`ModelAwareEstimator`]: a characters-per-token ratio by model (overrides first, then the
//!   built-in table by longest case-insensitive prefix, else 4.0), a default model, an output
//!   cap, and charges for opaque blocks (images, documents, audio).
//! * Any `Fn(&LlmRequest) -> Result<Reservation, EstimateError>` is a custom estimator.
//! * [`ReservationOverride`]: an explicit per-call reservation with the consistency check.
//!
//! Characters are UTF-16 code units and the division is IEEE-754 `f64` followed by `ceil`, so
//! the numbers equal the reference's.

use super::request::{utf16_len, Content, LlmRequest};
use crate::Reservation;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// The output cap used when the request sets no `max_tokens` and none is configured.
pub const DEFAULT_OUTPUT_CAP: u64 = 2_048;

/// The reference library's characters-per-token ratios, matched by longest prefix of the
/// lower-cased model name.
pub const BUILT_IN_RATIOS: &[(&str, f64)] = &[
    ("claude-3-5-haiku", 3.8),
    ("claude-3-5-sonnet", 3.9),
    ("claude-3-opus", 3.9),
    ("claude-3-sonnet", 3.9),
    ("claude-3-haiku", 3.8),
    ("claude-sonnet-4", 3.9),
    ("claude-opus-4", 3.9),
    ("claude-haiku-4", 3.8),
    ("claude-sonnet-4-5", 3.9),
    ("claude-opus-4-5", 3.9),
    ("claude-haiku-4-5", 3.8),
    ("gpt-4o", 3.7),
    ("gpt-4-turbo", 3.7),
    ("gpt-4.1", 3.7),
    ("gpt-4", 3.7),
    ("gpt-3.5", 3.8),
    ("o1", 3.7),
    ("o3", 3.7),
    ("o4-mini", 3.7),
    ("gemini-2.5", 3.8),
    ("gemini-2", 3.8),
    ("gemini-1.5", 3.8),
];

/// Why an estimate or an estimator could not be made.
///
/// ```
/// use llm_bulkhead::llm::{EstimateError, ModelAwareEstimator};
/// let e = ModelAwareEstimator::builder().ratio("my-model", 0.0).build().unwrap_err();
/// assert!(matches!(e, EstimateError::InvalidRatio { .. }));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EstimateError {
    /// A token count overflowed a `u64`.
    Overflow {
        /// What overflowed.
        field: &'static str,
    },
    /// A ratio override is not a finite number above zero.
    InvalidRatio {
        /// The model it was given for.
        model: String,
        /// The value.
        ratio: f64,
    },
    /// A setting of an estimator is out of range.
    InvalidSetting {
        /// The setting.
        field: &'static str,
        /// The range it must be in.
        expected: &'static str,
    },
    /// An explicit reservation's `reserved` does not equal `input + max_output`.
    InconsistentReservation {
        /// The `reserved` given.
        reserved: u64,
        /// `input + max_output`.
        sum: u64,
    },
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::Overflow { field } => write!(f, "{field} overflows a 64-bit token count"),
            EstimateError::InvalidRatio { model, ratio } => write!(
                f,
                "ratio for model {model:?} must be a finite number above 0 (got {ratio})"
            ),
            EstimateError::InvalidSetting { field, expected } => {
                write!(f, "{field} is out of range: it must be {expected}")
            }
            EstimateError::InconsistentReservation { reserved, sum } => write!(
                f,
                "reservation.reserved ({reserved}) must equal reservation.input + reservation.max_output ({sum})"
            ),
        }
    }
}

impl std::error::Error for EstimateError {}

/// Turns a request into the reservation admission will hold.
///
/// Closures are estimators too:
///
/// ```
/// use llm_bulkhead::llm::{LlmRequest, TokenEstimator};
/// use llm_bulkhead::Reservation;
/// let fixed = |_: &LlmRequest| Reservation::new(100, 300).map_err(|_| unreachable!());
/// assert_eq!(fixed.estimate(&LlmRequest::default()).unwrap().total(), 400);
/// ```
pub trait TokenEstimator: Send + Sync {
    /// The reservation for `request`.
    ///
    /// # Errors
    /// [`EstimateError`] when the numbers overflow (or a custom estimator's own reasons).
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError>;
}

impl<F> TokenEstimator for F
where
    F: Fn(&LlmRequest) -> Result<Reservation, EstimateError> + Send + Sync,
{
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        self(request)
    }
}

fn reservation(input: u64, max_output: u64) -> Result<Reservation, EstimateError> {
    Reservation::new(input, max_output).map_err(|_| EstimateError::Overflow {
        field: "reservation",
    })
}

fn plus(a: u64, b: u64, field: &'static str) -> Result<u64, EstimateError> {
    a.checked_add(b).ok_or(EstimateError::Overflow { field })
}

/// `input = ceil(chars / 4) + extra_input_tokens`; `max_output = max_tokens` or 2048.
///
/// ```
/// use llm_bulkhead::llm::{LlmRequest, NaiveEstimator, TokenEstimator};
/// let r = NaiveEstimator.estimate(&LlmRequest::new("any", &[&"x".repeat(401)])).unwrap();
/// assert_eq!((r.input(), r.max_output()), (101, 2_048));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NaiveEstimator;

impl TokenEstimator for NaiveEstimator {
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        let input = request.text_len().div_ceil(4);
        let input = plus(input, request.extra_input_tokens.unwrap_or(0), "input")?;
        reservation(input, request.max_tokens.unwrap_or(DEFAULT_OUTPUT_CAP))
    }
}

/// What an opaque (non-text) block costs.
///
/// ```
/// use llm_bulkhead::llm::OpaqueBlockTokens;
/// let per_type = OpaqueBlockTokens::by_type(Some(100), [("image", 1_500)]);
/// assert_eq!((per_type.cost(Some("image")), per_type.cost(Some("audio"))), (1_500, 100));
/// assert_eq!(OpaqueBlockTokens::Flat(2_048).cost(None), 2_048);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpaqueBlockTokens {
    /// Every opaque block costs this many tokens.
    Flat(u64),
    /// A cost per block type, else `default` (else 0).
    ByType {
        /// Cost of types not listed.
        default: Option<u64>,
        /// Cost by block `type`.
        by_type: HashMap<String, u64>,
    },
}

impl OpaqueBlockTokens {
    /// The per-type form.
    pub fn by_type<'a>(
        default: Option<u64>,
        costs: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> OpaqueBlockTokens {
        OpaqueBlockTokens::ByType {
            default,
            by_type: costs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        }
    }

    /// The cost of one block of type `kind`.
    #[must_use]
    pub fn cost(&self, kind: Option<&str>) -> u64 {
        match self {
            OpaqueBlockTokens::Flat(n) => *n,
            OpaqueBlockTokens::ByType { default, by_type } => kind
                .and_then(|k| by_type.get(k))
                .copied()
                .or(*default)
                .unwrap_or(0),
        }
    }
}

/// Called with a model name that has no known ratio.
#[derive(Clone)]
struct UnknownModelHook(Arc<dyn Fn(&str) + Send + Sync>);

impl fmt::Debug for UnknownModelHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UnknownModelHook(..)")
    }
}

/// Builds a [`ModelAwareEstimator`].
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct ModelAwareEstimatorBuilder {
    overrides: HashMap<String, f64>,
    default_model: Option<String>,
    output_cap: Option<u64>,
    opaque: Option<OpaqueBlockTokens>,
    on_unknown_model: Option<UnknownModelHook>,
}

impl ModelAwareEstimatorBuilder {
    /// A characters-per-token ratio for one model name, checked before the built-in table
    /// (exact name first, then its lower-cased form).
    pub fn ratio(mut self, model: &str, ratio: f64) -> Self {
        self.overrides.insert(model.to_owned(), ratio);
        self
    }

    /// The model assumed when a request names none.
    pub fn default_model(mut self, model: &str) -> Self {
        self.default_model = Some(model.to_owned());
        self
    }

    /// The output cap when a request sets no `max_tokens` (default 2048).
    pub fn output_cap(mut self, cap: u64) -> Self {
        self.output_cap = Some(cap);
        self
    }

    /// Every opaque block costs `tokens`.
    pub fn opaque_block_tokens(mut self, tokens: u64) -> Self {
        self.opaque = Some(OpaqueBlockTokens::Flat(tokens));
        self
    }

    /// Opaque blocks cost by type.
    pub fn opaque_block_costs(mut self, costs: OpaqueBlockTokens) -> Self {
        self.opaque = Some(costs);
        self
    }

    /// Called with the model name whenever no ratio is known for it (the ratio 4.0 is used).
    pub fn on_unknown_model(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_unknown_model = Some(UnknownModelHook(Arc::new(f)));
        self
    }

    /// Validates the models and ratios and builds the estimator.
    ///
    /// # Errors
    /// [`EstimateError::InvalidSetting`] for an empty model name (field `default_model`, or
    /// `ratio` for an override); [`EstimateError::InvalidRatio`] for a ratio that is not
    /// finite and above 0.
    ///
    /// ```
    /// use llm_bulkhead::llm::{EstimateError, ModelAwareEstimator};
    /// let e = ModelAwareEstimator::builder().default_model("").build().unwrap_err();
    /// assert!(matches!(e, EstimateError::InvalidSetting { field: "default_model", .. }));
    /// ```
    pub fn build(self) -> Result<ModelAwareEstimator, EstimateError> {
        let empty = |field| EstimateError::InvalidSetting {
            field,
            expected: "a non-empty model name",
        };
        if self.default_model.as_deref() == Some("") {
            return Err(empty("default_model"));
        }
        if self.overrides.contains_key("") {
            return Err(empty("ratio"));
        }
        for (model, ratio) in &self.overrides {
            if !(ratio.is_finite() && *ratio > 0.0) {
                return Err(EstimateError::InvalidRatio {
                    model: model.clone(),
                    ratio: *ratio,
                });
            }
        }
        Ok(ModelAwareEstimator {
            overrides: self.overrides,
            default_model: self.default_model,
            output_cap: self.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP),
            opaque: self.opaque,
            on_unknown_model: self.on_unknown_model,
        })
    }
}

/// Estimates with a characters-per-token ratio chosen by model.
///
/// `input = ceil(chars / ratio) + Σ opaque block costs + extra_input_tokens`;
/// `max_output = max_tokens`, or the output cap.
///
/// ```
/// use llm_bulkhead::llm::{ContentBlock, Content, LlmRequest, Message, ModelAwareEstimator, TokenEstimator};
/// // The reference's worked example: 78 chars at 3.9, one image at 2048, 350 extra, 1024 out.
/// let mut req = LlmRequest::new("claude-sonnet-4-5", &[]);
/// req.system = Some(Content::from("x".repeat(39).as_str()));
/// req.messages.push(Message { role: "user".into(), extra: Default::default(),
///     content: Content::Blocks(vec![ContentBlock::from_text("y".repeat(39)), ContentBlock::of_type("image")]) });
/// req.max_tokens = Some(1_024);
/// req.extra_input_tokens = Some(350);
/// let est = ModelAwareEstimator::builder().opaque_block_tokens(2_048).build().unwrap();
/// let r = est.estimate(&req).unwrap();
/// assert_eq!((r.input(), r.total()), (2_418, 3_442));
/// ```
#[derive(Clone, Debug)]
pub struct ModelAwareEstimator {
    overrides: HashMap<String, f64>,
    default_model: Option<String>,
    output_cap: u64,
    opaque: Option<OpaqueBlockTokens>,
    on_unknown_model: Option<UnknownModelHook>,
}

impl Default for ModelAwareEstimator {
    fn default() -> Self {
        ModelAwareEstimator {
            overrides: HashMap::new(),
            default_model: None,
            output_cap: DEFAULT_OUTPUT_CAP,
            opaque: None,
            on_unknown_model: None,
        }
    }
}

impl ModelAwareEstimator {
    /// A builder with no overrides, no default model, output cap 2048 and free opaque blocks.
    pub fn builder() -> ModelAwareEstimatorBuilder {
        ModelAwareEstimatorBuilder::default()
    }

    /// The model assumed when a request names none.
    ///
    /// ```
    /// # use llm_bulkhead::llm::ModelAwareEstimator;
    /// let e = ModelAwareEstimator::builder().default_model("gpt-4o").build().unwrap();
    /// assert_eq!(e.default_model(), Some("gpt-4o"));
    /// ```
    #[must_use]
    pub fn default_model(&self) -> Option<&str> {
        self.default_model.as_deref()
    }

    /// The characters-per-token ratio for `model`, and whether it was known.
    ///
    /// ```
    /// # use llm_bulkhead::llm::ModelAwareEstimator;
    /// let e = ModelAwareEstimator::default();
    /// assert_eq!(e.ratio_for("CLAUDE-HAIKU-4-5-20260301"), (3.8, true));
    /// assert_eq!(e.ratio_for("O1-PREVIEW"), (3.7, true));
    /// assert_eq!(e.ratio_for("unknown"), (4.0, false));
    /// ```
    #[must_use]
    pub fn ratio_for(&self, model: &str) -> (f64, bool) {
        if !self.overrides.is_empty() {
            let exact = self.overrides.get(model);
            if let Some(r) = exact.or_else(|| self.overrides.get(&model.to_lowercase())) {
                return (*r, true);
            }
        }
        // Case-insensitive longest prefix. The longest built-in prefix has 17 bytes, so for
        // ASCII names (all real model names) lower-casing the first 32 bytes on the stack is
        // enough; other names are lower-cased as the reference does.
        let mut buf = [0u8; 32];
        let lowered;
        let name: &[u8] = if model.is_ascii() {
            let n = model.len().min(buf.len());
            buf[..n].copy_from_slice(&model.as_bytes()[..n]);
            buf[..n].make_ascii_lowercase();
            &buf[..n]
        } else {
            lowered = model.to_lowercase();
            lowered.as_bytes()
        };
        built_in_ratio(name).map_or((4.0, false), |r| (r, true))
    }
}

/// The ratio of the longest [`BUILT_IN_RATIOS`] prefix of `name` (already lower-cased), found
/// by the name's distinguishing bytes rather than by scanning the table: a few byte comparisons
/// whatever the table's size and the entry's position. Where a longer entry has the same ratio
/// as a shorter one it extends (`claude-sonnet-4-5` and `claude-sonnet-4`, `gpt-4o` and
/// `gpt-4`, `gemini-2.5` and `gemini-2`), the shorter one answers for both. The test
/// `lookup_equals_the_longest_prefix_scan` checks this against the table itself, entry by
/// entry, on every truncation and extension of every entry and on random names.
#[inline]
fn built_in_ratio(name: &[u8]) -> Option<f64> {
    let is = |rest: &[u8], p: &[u8]| rest.starts_with(p);
    match *name.first()? {
        b'c' => {
            let r = name.strip_prefix(b"claude-")?;
            match *r.first()? {
                b'3' => {
                    let r = r.strip_prefix(b"3-")?;
                    if let Some(r) = r.strip_prefix(b"5-") {
                        if is(r, b"haiku") {
                            Some(3.8)
                        } else {
                            is(r, b"sonnet").then_some(3.9)
                        }
                    } else if is(r, b"opus") || is(r, b"sonnet") {
                        Some(3.9)
                    } else {
                        is(r, b"haiku").then_some(3.8)
                    }
                }
                b's' => is(r, b"sonnet-4").then_some(3.9),
                b'o' => is(r, b"opus-4").then_some(3.9),
                b'h' => is(r, b"haiku-4").then_some(3.8),
                _ => None,
            }
        }
        b'g' => {
            if let Some(r) = name.strip_prefix(b"gpt-") {
                if is(r, b"4") {
                    Some(3.7)
                } else {
                    is(r, b"3.5").then_some(3.8)
                }
            } else {
                let r = name.strip_prefix(b"gemini-")?;
                (is(r, b"2") || is(r, b"1.5")).then_some(3.8)
            }
        }
        b'o' => match *name.get(1)? {
            b'1' | b'3' => Some(3.7),
            b'4' => is(name, b"o4-mini").then_some(3.7),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{built_in_ratio, BUILT_IN_RATIOS};
    use proptest::prelude::*;

    /// The definition: the ratio of the longest table entry that prefixes `name`.
    fn scan(name: &[u8]) -> Option<f64> {
        BUILT_IN_RATIOS
            .iter()
            .filter(|(prefix, _)| name.starts_with(prefix.as_bytes()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, r)| *r)
    }

    #[test]
    fn lookup_equals_the_longest_prefix_scan() {
        let mut names: Vec<Vec<u8>> = vec![Vec::new()];
        for (entry, _) in BUILT_IN_RATIOS {
            let e = entry.as_bytes();
            for n in 0..=e.len() {
                names.push(e[..n].to_vec());
            }
            for tail in [&b"-20250101"[..], b"x", b"-", b".", b"5", b"o", b"-mini"] {
                names.push([e, tail].concat());
            }
            // Every one-byte change of the entry, over the table's own alphabet.
            for i in 0..e.len() {
                for c in b"abcdeghiklmnoprstuvz0123456789-." {
                    let mut m = e.to_vec();
                    m[i] = *c;
                    names.push(m);
                }
            }
        }
        for name in &names {
            assert_eq!(
                built_in_ratio(name),
                scan(name),
                "{}",
                String::from_utf8_lossy(name)
            );
        }
    }

    #[test]
    fn one_pass_measure_equals_text_len_and_opaque_blocks() {
        use super::{ModelAwareEstimator, OpaqueBlockTokens};
        use crate::llm::{Content, ContentBlock, LlmRequest, Message};
        let blocks = |n: usize| {
            Content::Blocks(vec![
                ContentBlock::from_text("é".repeat(n)),
                ContentBlock::of_type("image"),
                ContentBlock::of_type("audio"),
                ContentBlock::from_text("𝄞x".repeat(n)),
            ])
        };
        let mut r = LlmRequest::new("m", &["plain text", "ü"]);
        r.system = Some(blocks(3));
        r.messages.push(Message {
            role: "user".into(),
            content: blocks(5),
            extra: Default::default(),
        });
        let costs = OpaqueBlockTokens::by_type(Some(7), [("image", 100)]);
        for e in [
            ModelAwareEstimator::default(),
            ModelAwareEstimator::builder()
                .opaque_block_costs(costs.clone())
                .build()
                .unwrap(),
        ] {
            let (chars, opaque) = e.measure(&r).unwrap();
            assert_eq!(chars, r.text_len());
            let two_pass: u64 = match &e.opaque {
                None => 0,
                Some(c) => r.opaque_blocks().map(|b| c.cost(b.kind())).sum(),
            };
            assert_eq!(opaque, two_pass);
        }
        assert_eq!(r.opaque_blocks().count(), 4);
    }

    proptest! {
        #[test]
        fn random_names_agree(name in "(claude-|gpt-|gemini-|o)?[0-9a-z.-]{0,12}") {
            prop_assert_eq!(built_in_ratio(name.as_bytes()), scan(name.as_bytes()));
        }
    }
}

impl ModelAwareEstimator {
    /// The request's text length in UTF-16 units ([`LlmRequest::text_len`]) and the summed
    /// cost of its opaque blocks ([`LlmRequest::opaque_blocks`]), in one pass over the content.
    #[inline]
    fn measure(&self, request: &LlmRequest) -> Result<(u64, u64), EstimateError> {
        let mut chars = 0u64;
        let mut opaque = 0u64;
        let contents = request
            .messages
            .iter()
            .map(|m| &m.content)
            .chain(request.system.as_ref());
        for content in contents {
            match content {
                Content::Text(s) => chars += utf16_len(s),
                Content::Blocks(blocks) => {
                    for b in blocks {
                        match b.text() {
                            Some(t) => chars += utf16_len(t),
                            None => {
                                if let Some(costs) = &self.opaque {
                                    opaque = plus(opaque, costs.cost(b.kind()), "input")?;
                                }
                            }
                        }
                    }
                }
                Content::Other(_) => {}
            }
        }
        Ok((chars, opaque))
    }
}

impl TokenEstimator for ModelAwareEstimator {
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        let model = request
            .model
            .as_deref()
            .or(self.default_model.as_deref())
            .unwrap_or("");
        let (ratio, known) = self.ratio_for(model);
        if !known {
            if let Some(f) = &self.on_unknown_model {
                (f.0)(model);
            }
        }
        // One pass over the content: the text length and the opaque blocks' costs.
        let (chars, opaque) = self.measure(request)?;
        // IEEE-754 double division and ceil, as the reference computes it.
        let text = (chars as f64 / ratio).ceil();
        if !(text.is_finite() && text < u64::MAX as f64) {
            return Err(EstimateError::Overflow { field: "input" });
        }
        let mut input = plus(text as u64, opaque, "input")?;
        input = plus(input, request.extra_input_tokens.unwrap_or(0), "input")?;
        reservation(input, request.max_tokens.unwrap_or(self.output_cap))
    }
}

/// An explicit per-call reservation, as a caller may send it (for example the result of an
/// earlier estimate): `reserved`, when present, must equal `input + max_output`.
///
/// ```
/// use llm_bulkhead::llm::ReservationOverride;
/// let ok = ReservationOverride { input: 100, max_output: 20, reserved: Some(120) };
/// assert_eq!(ok.resolve().unwrap().total(), 120);
/// let bad = ReservationOverride { input: 100, max_output: 20, reserved: Some(999) };
/// assert_eq!(bad.resolve().unwrap_err().to_string(),
///     "reservation.reserved (999) must equal reservation.input + reservation.max_output (120)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReservationOverride {
    /// Estimated input tokens.
    pub input: u64,
    /// Output cap.
    #[serde(alias = "maxOutput")]
    pub max_output: u64,
    /// `input + max_output`, if the caller states it.
    #[serde(default)]
    pub reserved: Option<u64>,
}

impl ReservationOverride {
    /// Checks the override and turns it into a reservation.
    ///
    /// # Errors
    /// [`EstimateError::Overflow`] or [`EstimateError::InconsistentReservation`].
    pub fn resolve(self) -> Result<Reservation, EstimateError> {
        let r = reservation(self.input, self.max_output)?;
        match self.reserved {
            Some(reserved) if reserved != r.total() => {
                Err(EstimateError::InconsistentReservation {
                    reserved,
                    sum: r.total(),
                })
            }
            _ => Ok(r),
        }
    }
}
