//! Token estimation: from a request to the [`Reservation`] admission will hold
//! (`input + max_output`).
//!
//! Both built-in estimators read every part of a request a provider counts (the walk of
//! `tally`): message and system text, tool definitions (`tools`, `functions`), tool calls and
//! their arguments, tool results, documents, the Responses API's `input`, `instructions` and
//! `prompt`, unknown fields and content-part types (by their size, never as zero), with an
//! overhead per message (4 tokens, and 3 for the reply) and per tool (10, and 346 once for a
//! request with tools: Anthropic's tool-use system prompt, the largest documented), and images by
//! their provider's formula (`image`). Text costs the larger of `ceil(chars / ratio)` and a
//! bound from its UTF-8 bytes and script classes (`text`) that no text exceeds by more than
//! 1.25× under o200k_base or cl100k_base, whatever its script.
//!
//! * [`NaiveEstimator`]: the ratio is 4.0; output `max_tokens` (or `max_completion_tokens`,
//!   `max_output_tokens`) or 2048.
//! * [`ModelAwareEstimator`]: a characters-per-token ratio by model (overrides first, then the
//!   built-in table by longest case-insensitive prefix, else 4.0), a default model, an output
//!   cap, image costs, a limit on parts.
//! * Any `Fn(&LlmRequest) -> Result<Reservation, EstimateError>` is a custom estimator.
//! * [`ReservationOverride`]: an explicit per-call reservation with the consistency check.
//!
//! The output side: the request's cap (a thinking budget raises it), times `n` (choices).
//!
//! # Parse cost
//!
//! [`TokenEstimator::estimate_body`] estimates a JSON body as it parses it, without
//! materialising it: memory stays within the JSON nesting depth (serde_json's limit is 128),
//! whatever the body holds. Every object counts as a part; a body with more than the limit
//! ([`DEFAULT_MAX_PARTS`], or [`ModelAwareEstimatorBuilder::max_parts`]) is refused with
//! [`EstimateError::TooManyParts`]. A custom estimator needs the parsed request: its default
//! `estimate_body` checks the limit [`DEFAULT_MAX_PARSED_PARTS`] with the same streaming walk
//! before parsing (about 750 bytes of heap per object once parsed).

mod image;
mod tally;
#[cfg(test)]
mod tests;
mod text;

use super::request::LlmRequest;
use crate::Reservation;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
pub(crate) use tally::{Stop, Tally};

/// Objects a request may hold (messages, content blocks, tools, the objects inside them)
/// before estimation refuses it.
pub const DEFAULT_MAX_PARTS: u64 = 131_072;

/// Objects a request may hold when it is parsed into an [`LlmRequest`] (by the default
/// [`TokenEstimator::estimate_body`], for a custom estimator): about 750 bytes of heap each, so
/// at most about 12 MB.
pub const DEFAULT_MAX_PARSED_PARTS: u64 = 16_384;

/// The largest output cap an estimator accepts (2^40 tokens): larger ones make every estimate
/// overflow.
pub const MAX_OUTPUT_CAP: u64 = 1 << 40;

/// The ratios an override may set (characters per token): outside them every estimate is
/// absurd (`1e-10` reserves 4×10¹³ for 4,000 characters).
pub const RATIO_RANGE: (f64, f64) = (0.5, 32.0);

/// Tokens per message (OpenAI's 3, and the role), and once for the reply's priming.
const PER_MESSAGE: u64 = 4;
const REPLY: u64 = 3;
/// Tokens per tool definition, and once for a request with tools (Anthropic's tool-use system
/// prompt, 346 tokens at most).
const PER_TOOL: u64 = 10;
const TOOLS: u64 = 346;

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
    /// A ratio override is not a finite number within [`RATIO_RANGE`], or two overrides name
    /// the same model in different cases.
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
    /// A request holds more objects (messages, blocks, tools, …) than the limit.
    TooManyParts {
        /// The limit.
        limit: u64,
    },
    /// A request gives two fields that exclude each other.
    ConflictingFields {
        /// The fields.
        fields: [&'static str; 2],
    },
    /// A request field has the wrong type (its value is never quoted).
    InvalidField {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A body is not a JSON request (syntax, or a wrong type where the request is parsed); the
    /// problem never quotes the body.
    InvalidJson {
        /// Line of the problem (1-based; 0 when unknown).
        line: usize,
        /// Column of the problem.
        column: usize,
        /// What is wrong, without the value.
        problem: String,
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
                "ratio for model {model:?} must be a finite number from {} to {} (got {ratio}), given once whatever its case",
                RATIO_RANGE.0, RATIO_RANGE.1
            ),
            EstimateError::InvalidSetting { field, expected } => {
                write!(f, "{field} is out of range: it must be {expected}")
            }
            EstimateError::TooManyParts { limit } => write!(
                f,
                "the request holds more than {limit} parts (messages, blocks, tools and the objects in them)"
            ),
            EstimateError::ConflictingFields { fields: [a, b] } => {
                write!(f, "the request gives both {a} and {b}; send one of them")
            }
            EstimateError::InvalidField { field, expected } => {
                write!(f, "field `{field}` must be {expected}")
            }
            EstimateError::InvalidJson {
                line,
                column,
                problem,
            } => write!(
                f,
                "the body is not a JSON request: {problem} at line {line} column {column}"
            ),
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

    /// The reservation for a JSON request body. By default the body is parsed with
    /// [`LlmRequest::from_json`] (its parts limit is [`DEFAULT_MAX_PARSED_PARTS`]) and
    /// estimated; the
    /// built-in estimators override it to estimate while parsing, without materialising the
    /// body.
    ///
    /// # Errors
    /// [`EstimateError::InvalidJson`], [`EstimateError::InvalidField`],
    /// [`EstimateError::ConflictingFields`], [`EstimateError::TooManyParts`], or the
    /// estimate's own.
    ///
    /// ```
    /// use llm_bulkhead::llm::{LlmRequest, TokenEstimator};
    /// use llm_bulkhead::Reservation;
    /// let by_messages = |r: &LlmRequest| Reservation::new(r.messages.len() as u64, 1).map_err(|_| unreachable!());
    /// let r = by_messages.estimate_body(br#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
    /// assert_eq!(r.input(), 1);
    /// ```
    fn estimate_body(&self, body: &[u8]) -> Result<Reservation, EstimateError> {
        self.estimate(&LlmRequest::from_json(body, DEFAULT_MAX_PARSED_PARTS)?)
    }
}

impl<F> TokenEstimator for F
where
    F: Fn(&LlmRequest) -> Result<Reservation, EstimateError> + Send + Sync,
{
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        self(request)
    }
}

/// A walk's own refusals as estimation errors.
pub(crate) fn stop_error(stop: Stop, max_parts: u64) -> EstimateError {
    match stop {
        Stop::TooManyParts => EstimateError::TooManyParts { limit: max_parts },
        Stop::BothMaxTokens => EstimateError::ConflictingFields {
            fields: ["max_tokens", "max_completion_tokens"],
        },
        Stop::NotACount(field) => EstimateError::InvalidField {
            field,
            expected: "a non-negative integer",
        },
    }
}

/// Walks a JSON body; a syntax error becomes [`EstimateError::InvalidJson`] (serde_json's
/// syntax messages never quote the input).
pub(crate) fn tally_json(body: &[u8], max_parts: u64) -> Result<Tally, EstimateError> {
    let (t, r) = Tally::of_json(body, max_parts);
    match (t.stop, r) {
        (Some(stop), _) => Err(stop_error(stop, max_parts)),
        (None, Err(e)) => Err(EstimateError::InvalidJson {
            line: e.line(),
            column: e.column(),
            problem: super::request::scrub(&e),
        }),
        (None, Ok(())) => Ok(t),
    }
}

/// The settings a tally is turned into a reservation with.
struct Finish<'a> {
    model: Option<&'a str>,
    ratio: f64,
    output_cap: u64,
    images: Option<&'a OpaqueBlockTokens>,
}

impl Finish<'_> {
    /// `input = text + overheads + images + extra_input_tokens`, `max_output = cap × n`.
    fn reservation(&self, t: &Tally) -> Result<Reservation, EstimateError> {
        // IEEE-754 double division and ceil, as the reference computes it.
        let by_ratio = (t.chars as f64 / self.ratio).ceil();
        if !(by_ratio.is_finite() && by_ratio < u64::MAX as f64) {
            return Err(EstimateError::Overflow { field: "input" });
        }
        let text = (by_ratio as u64).max(t.units.div_ceil(text::UNIT));
        let messages = t.messages * PER_MESSAGE + if t.messages > 0 { REPLY } else { 0 };
        let tools = t.tools * PER_TOOL + if t.tools > 0 { TOOLS } else { 0 };
        let mut buf = [0u8; 32];
        let model = self.model.map(|m| {
            let n = m.len().min(buf.len());
            buf[..n].copy_from_slice(&m.as_bytes()[..n]);
            buf[..n].make_ascii_lowercase();
            &buf[..n]
        });
        let mut images = 0u64;
        for (kind, cost) in t.images.iter().enumerate() {
            let configured = self
                .images
                .and_then(|c| c.configured(tally::IMAGE_KINDS[kind]));
            images += match configured {
                Some(per) => per.saturating_mul(cost.images),
                None => cost.tokens(model),
            };
        }
        let mut input = 0u64;
        for part in [
            text,
            messages,
            tools,
            images,
            t.out.extra_input.unwrap_or(0),
        ] {
            input = plus(input, part, "input")?;
        }
        let cap = t
            .out
            .max_completion_tokens
            .or(t.out.max_tokens)
            .or(t.out.max_output_tokens)
            .unwrap_or(self.output_cap)
            .max(t.out.thinking_budget.unwrap_or(0));
        let output =
            cap.checked_mul(t.out.n.unwrap_or(1).max(1))
                .ok_or(EstimateError::Overflow {
                    field: "max_output",
                })?;
        reservation(input, output)
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

/// Every part counted (see the [module](self)), text at 4 characters per token or its
/// script bound, whichever is larger; `max_output` = the request's cap or 2048, times `n`.
///
/// ```
/// use llm_bulkhead::llm::{LlmRequest, NaiveEstimator, TokenEstimator};
/// // 400 characters of short English words: 154 by the script bound (o200k_base counts 117),
/// // and 7 for one message and the reply.
/// let text = "the cat sat on the mat. ".repeat(17)[..400].to_owned();
/// let r = NaiveEstimator.estimate(&LlmRequest::new("any", &[&text])).unwrap();
/// assert_eq!((r.input(), r.max_output()), (161, 2_048));
/// // Dense text costs its bound: a four-byte character 3.2 (its length / 1.25; no token is
/// // shorter than a byte), 0.8 for the space the text starts after, 7 for the message.
/// let r = NaiveEstimator.estimate(&LlmRequest::new("any", &[&"😀".repeat(100)])).unwrap();
/// assert_eq!(r.input(), 321 + 7);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct NaiveEstimator;

impl TokenEstimator for NaiveEstimator {
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        let t = Tally::of_request(request, DEFAULT_MAX_PARTS)
            .map_err(|s| stop_error(s, DEFAULT_MAX_PARTS))?;
        NaiveEstimator::FINISH.reservation(&t)
    }

    fn estimate_body(&self, body: &[u8]) -> Result<Reservation, EstimateError> {
        NaiveEstimator::FINISH.reservation(&tally_json(body, DEFAULT_MAX_PARTS)?)
    }
}

impl NaiveEstimator {
    const FINISH: Finish<'static> = Finish {
        model: None,
        ratio: 4.0,
        output_cap: DEFAULT_OUTPUT_CAP,
        images: None,
    };
}

/// What an image costs instead of its provider's formula, by its content-part type (`image`,
/// `image_url`, `input_image`), for a deployment that knows its images better than the
/// formula's worst case. Every other part is counted by its size; a type with no cost here
/// (`ByType` without a default) keeps the formula.
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

    /// The configured cost of type `kind`, if any.
    fn configured(&self, kind: &str) -> Option<u64> {
        match self {
            OpaqueBlockTokens::Flat(n) => Some(*n),
            OpaqueBlockTokens::ByType { default, by_type } => {
                by_type.get(kind).copied().or(*default)
            }
        }
    }

    /// The cost of one block of type `kind` (0 where none is configured).
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
    overrides: Vec<(String, f64)>,
    default_model: Option<String>,
    output_cap: Option<u64>,
    max_parts: Option<u64>,
    opaque: Option<OpaqueBlockTokens>,
    on_unknown_model: Option<UnknownModelHook>,
}

impl ModelAwareEstimatorBuilder {
    /// A characters-per-token ratio for one model name, checked before the built-in table.
    /// Names match case-insensitively, as the table does; the same name given again (in any
    /// case) is refused at [`build`](Self::build), as is a ratio outside [`RATIO_RANGE`].
    pub fn ratio(mut self, model: &str, ratio: f64) -> Self {
        self.overrides.push((model.to_owned(), ratio));
        self
    }

    /// The model assumed when a request names none.
    pub fn default_model(mut self, model: &str) -> Self {
        self.default_model = Some(model.to_owned());
        self
    }

    /// The output cap when a request sets none (default 2048); from 1 to [`MAX_OUTPUT_CAP`].
    pub fn output_cap(mut self, cap: u64) -> Self {
        self.output_cap = Some(cap);
        self
    }

    /// The most objects a request may hold (default [`DEFAULT_MAX_PARTS`]; at least 1).
    pub fn max_parts(mut self, parts: u64) -> Self {
        self.max_parts = Some(parts);
        self
    }

    /// Every image costs `tokens` instead of its provider's formula.
    pub fn opaque_block_tokens(mut self, tokens: u64) -> Self {
        self.opaque = Some(OpaqueBlockTokens::Flat(tokens));
        self
    }

    /// Images cost by type instead of their provider's formula.
    pub fn opaque_block_costs(mut self, costs: OpaqueBlockTokens) -> Self {
        self.opaque = Some(costs);
        self
    }

    /// Called with the model name whenever no ratio is known for it (the ratio 4.0 is used).
    pub fn on_unknown_model(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_unknown_model = Some(UnknownModelHook(Arc::new(f)));
        self
    }

    /// Validates the settings and builds the estimator.
    ///
    /// # Errors
    /// [`EstimateError::InvalidRatio`] for a ratio outside [`RATIO_RANGE`] or a model given
    /// twice (whatever the case); [`EstimateError::InvalidSetting`] for an empty model name
    /// (field `default_model`, or `ratio` for an override), an output cap of 0 or above
    /// [`MAX_OUTPUT_CAP`], or a parts limit of 0.
    ///
    /// ```
    /// use llm_bulkhead::llm::{EstimateError, ModelAwareEstimator};
    /// let e = |b: llm_bulkhead::llm::ModelAwareEstimatorBuilder| b.build().unwrap_err();
    /// assert!(matches!(e(ModelAwareEstimator::builder().default_model("")), EstimateError::InvalidSetting { field: "default_model", .. }));
    /// assert!(matches!(e(ModelAwareEstimator::builder().ratio("m", 1e300)), EstimateError::InvalidRatio { .. }));
    /// assert!(matches!(e(ModelAwareEstimator::builder().ratio("M", 3.0).ratio("m", 3.0)), EstimateError::InvalidRatio { .. }));
    /// assert!(matches!(e(ModelAwareEstimator::builder().output_cap(0)), EstimateError::InvalidSetting { field: "output_cap", .. }));
    /// assert!(matches!(e(ModelAwareEstimator::builder().output_cap(u64::MAX)), EstimateError::InvalidSetting { .. }));
    /// ```
    pub fn build(self) -> Result<ModelAwareEstimator, EstimateError> {
        let empty = |field| EstimateError::InvalidSetting {
            field,
            expected: "a non-empty model name",
        };
        if self.default_model.as_deref() == Some("") {
            return Err(empty("default_model"));
        }
        if self.overrides.iter().any(|(m, _)| m.is_empty()) {
            return Err(empty("ratio"));
        }
        let mut overrides = HashMap::new();
        for (model, ratio) in &self.overrides {
            let sane = ratio.is_finite() && (RATIO_RANGE.0..=RATIO_RANGE.1).contains(ratio);
            if !sane || overrides.insert(model.to_lowercase(), *ratio).is_some() {
                return Err(EstimateError::InvalidRatio {
                    model: model.clone(),
                    ratio: *ratio,
                });
            }
        }
        let output_cap = self.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        if !(1..=MAX_OUTPUT_CAP).contains(&output_cap) {
            return Err(EstimateError::InvalidSetting {
                field: "output_cap",
                expected: "from 1 to 2^40",
            });
        }
        let max_parts = self.max_parts.unwrap_or(DEFAULT_MAX_PARTS);
        if max_parts == 0 {
            return Err(EstimateError::InvalidSetting {
                field: "max_parts",
                expected: "at least 1",
            });
        }
        Ok(ModelAwareEstimator {
            overrides,
            default_model: self.default_model,
            output_cap,
            max_parts,
            opaque: self.opaque,
            on_unknown_model: self.on_unknown_model,
        })
    }
}

/// Estimates every part of a request (see the [module](self)), with a characters-per-token
/// ratio chosen by model for text (or the text's script bound, if larger) and image formulas
/// chosen by model.
///
/// `input = text + 4 per message (+3) + tools + images + extra_input_tokens`;
/// `max_output` = the request's cap (or the output cap, or a larger thinking budget) × `n`.
///
/// ```
/// use llm_bulkhead::llm::{ModelAwareEstimator, TokenEstimator};
/// let est = ModelAwareEstimator::builder().opaque_block_tokens(2_048).build().unwrap();
/// let body = br#"{"model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "Be brief.",
///   "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this."},
///   {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}"#;
/// let r = est.estimate_body(body).unwrap();
/// assert_eq!(r.max_output(), 1_024);
/// assert!(r.input() > 2_048 + 7);
/// ```
#[derive(Clone, Debug)]
pub struct ModelAwareEstimator {
    /// Lower-cased model name → ratio.
    overrides: HashMap<String, f64>,
    default_model: Option<String>,
    output_cap: u64,
    max_parts: u64,
    opaque: Option<OpaqueBlockTokens>,
    on_unknown_model: Option<UnknownModelHook>,
}

impl Default for ModelAwareEstimator {
    fn default() -> Self {
        ModelAwareEstimator {
            overrides: HashMap::new(),
            default_model: None,
            output_cap: DEFAULT_OUTPUT_CAP,
            max_parts: DEFAULT_MAX_PARTS,
            opaque: None,
            on_unknown_model: None,
        }
    }
}

impl ModelAwareEstimator {
    /// A builder with no overrides, no default model, output cap 2048, images by formula.
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
    /// let e = ModelAwareEstimator::builder().ratio("My-Model", 2.5).build().unwrap();
    /// assert_eq!(e.ratio_for("CLAUDE-HAIKU-4-5-20260301"), (3.8, true));
    /// assert_eq!(e.ratio_for("O1-PREVIEW"), (3.7, true));
    /// assert_eq!(e.ratio_for("MY-MODEL"), (2.5, true));
    /// assert_eq!(e.ratio_for("unknown"), (4.0, false));
    /// ```
    #[must_use]
    pub fn ratio_for(&self, model: &str) -> (f64, bool) {
        if !self.overrides.is_empty() {
            let found = if model.bytes().any(|b| b.is_ascii_uppercase()) || !model.is_ascii() {
                self.overrides.get(&model.to_lowercase())
            } else {
                self.overrides.get(model)
            };
            if let Some(r) = found {
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

    /// The reservation of a walked request naming `model`.
    fn finish(&self, model: Option<&str>, t: &Tally) -> Result<Reservation, EstimateError> {
        let model = model.or(self.default_model.as_deref());
        let (ratio, known) = self.ratio_for(model.unwrap_or(""));
        if !known {
            if let Some(f) = &self.on_unknown_model {
                (f.0)(model.unwrap_or(""));
            }
        }
        Finish {
            model,
            ratio,
            output_cap: self.output_cap,
            images: self.opaque.as_ref(),
        }
        .reservation(t)
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

impl TokenEstimator for ModelAwareEstimator {
    fn estimate(&self, request: &LlmRequest) -> Result<Reservation, EstimateError> {
        let t = Tally::of_request(request, self.max_parts)
            .map_err(|s| stop_error(s, self.max_parts))?;
        self.finish(request.model.as_deref(), &t)
    }

    fn estimate_body(&self, body: &[u8]) -> Result<Reservation, EstimateError> {
        let t = tally_json(body, self.max_parts)?;
        self.finish(t.model.as_deref(), &t)
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
