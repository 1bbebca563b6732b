//! Configuration as data (feature `serde`): a [`BulkheadConfig`] that builds a [`Bulkhead`],
//! and [`LimitsConfig`], a limits snapshot keyed by class *name* for a control plane.
//!
//! Both are strict: every struct refuses unknown fields (a typo such as `max_token` is an
//! error, never a silently dropped ceiling), floors default to 0 and ceilings to "absent" (only
//! the global limits apply), and the reference library's camelCase names (`maxConcurrent`,
//! `tokenBudget`, `highPriorityReserve`, `protectedConcurrent`, `maxInFlightTokens`, ...) are
//! accepted as aliases of the snake_case names the crate writes. The rules a bulkhead enforces
//! are the ones of [`contract`](crate::contract) §4 and §6; every validation error names the field and
//! the bound it broke.
//!
//! ```
//! # #[cfg(feature = "toml")] {
//! use llm_bulkhead::config::BulkheadConfig;
//!
//! // The seed's class example, as a gateway would keep it in a file.
//! let config = BulkheadConfig::from_toml(r#"
//!     max_concurrent = 20
//!     token_budget = { budget = 50_000 }
//!
//!     [admission_classes]
//!     default_class = "standard"
//!     [admission_classes.classes.latencySensitive]
//!     protectedConcurrent = 8
//!     maxConcurrent = 14
//!     protectedInFlightTokens = 20_000
//!     maxInFlightTokens = 36_000
//!     [admission_classes.classes.standard]
//!     protected_concurrent = 3
//!     max_concurrent = 8
//!     protected_tokens = 8_000
//!     max_tokens = 20_000
//!     [admission_classes.classes.background]
//!     max_concurrent = 4
//!     max_tokens = 10_000
//! "#)?;
//! let bulkhead = config.build()?;
//! assert_eq!(bulkhead.class_names(), ["latencySensitive", "standard", "background"]);
//!
//! // A typo is an error that names the field, not a dropped ceiling.
//! let typo = BulkheadConfig::from_toml("max_concurrent = 4\n[admission_classes]\ndefault_class = \"a\"\n[admission_classes.classes.a]\nmax_token = 10\n");
//! assert!(typo.unwrap_err().to_string().contains("unknown field `max_token`"));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A control plane sends [`LimitsConfig`]s: the whole snapshot, classes by name.
//! [`apply_limits_file`] reads one from a file and applies it only if its revision is newer.

use crate::vocab::class_name;
use crate::{
    Bulkhead, BulkheadBuilder, ClassLimits, ConfigError, LimitsSnapshot, Profile, RejectReason,
    MAX_CLASSES,
};
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// Everything needed to build a bulkhead: global limits, the token budget, admission classes,
/// the queue, the profile, and (for the LLM layer) the rollout mode and the estimator's model.
///
/// Absent fields take the builder's defaults; `max_concurrent` is required (a missing one is
/// an error rather than the fail-closed 0 a forgotten line would give).
///
/// ```
/// use llm_bulkhead::config::BulkheadConfig;
/// let config: BulkheadConfig = serde_json::from_str(r#"{
///     "maxConcurrent": 8, "maxQueue": 4, "timeoutMs": 2500,
///     "tokenBudget": {"budget": 50000, "highPriorityReserve": 5000}
/// }"#)?;
/// let b = config.build()?;
/// assert_eq!((b.limits().max_concurrent, b.limits().max_queue), (8, 4));
/// assert_eq!(b.default_queue_timeout(), Some(std::time::Duration::from_millis(2500)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkheadConfig {
    /// Global concurrency limit (0: fail closed, a kill switch from the start).
    #[serde(alias = "maxConcurrent")]
    pub max_concurrent: u32,
    /// Wait queue bound (absent: the profile's, else 0, fail-fast).
    #[serde(default, alias = "maxQueue", skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u32>,
    /// How long a waiter may stay queued by default, in milliseconds (absent: the profile's,
    /// else no deadline): the builder's `queue_timeout`. `queue_timeout_ms` (its old name) and the
    /// reference's `timeoutMs` are accepted as aliases.
    #[serde(
        default,
        alias = "timeout_ms",
        alias = "timeoutMs",
        skip_serializing_if = "Option::is_none"
    )]
    pub queue_timeout_ms: Option<u64>,
    /// `interactive` (fail-fast) or `batch` (queue 20, 30 s); explicit fields win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// The revision of the first limits snapshot (default 0).
    #[serde(default, alias = "initialRevision", skip_serializing_if = "is_zero")]
    pub initial_revision: u64,
    /// Time queue waits for `stats().queue_waits` (default off).
    #[serde(default, alias = "measureQueueWaits", skip_serializing_if = "is_false")]
    pub measure_queue_waits: bool,
    /// Let a demand refused only for tokens wait in the queue (default off: fail-fast; see
    /// [`BulkheadBuilder::wait_for_tokens`]).
    #[serde(default, alias = "waitForTokens", skip_serializing_if = "is_false")]
    pub wait_for_tokens: bool,
    /// `enforce` (default) or `observe`: what `LlmBulkhead::run` does with refusals
    /// ([`BulkheadConfig::run_mode`], feature `llm`).
    #[serde(default, skip_serializing_if = "RolloutMode::is_enforce")]
    pub mode: RolloutMode,
    /// The refusal reasons observe mode bypasses (absent: all four shadowable reasons).
    #[serde(
        default,
        alias = "shadowReasons",
        skip_serializing_if = "Option::is_none"
    )]
    pub shadow_reasons: Option<Vec<RejectReason>>,
    /// The model the LLM layer's estimator assumes when a request names none. Not empty:
    /// reading `"model": ""` fails on field `model`, and [`estimator`](Self::estimator)
    /// refuses an empty one set in code.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "non_empty_model"
    )]
    pub model: Option<String>,
    /// The in-flight token budget (absent: no budget).
    #[serde(
        default,
        alias = "tokenBudget",
        skip_serializing_if = "Option::is_none"
    )]
    pub token_budget: Option<TokenBudgetConfig>,
    /// Admission classes (absent: none).
    #[serde(
        default,
        alias = "admissionClasses",
        skip_serializing_if = "Option::is_none"
    )]
    pub admission_classes: Option<ClassesConfig>,
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The token budget of a [`BulkheadConfig`].
///
/// ```
/// use llm_bulkhead::config::TokenBudgetConfig;
/// let t: TokenBudgetConfig = serde_json::from_str(r#"{"budget": 1000, "outputCap": 256}"#).unwrap();
/// assert_eq!((t.high_priority_reserve, t.output_cap), (0, Some(256)));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBudgetConfig {
    /// The budget `B` (0 is legal: only 0-token demands fit).
    pub budget: u64,
    /// Tokens only high-priority demands may use (default 0; at most `budget`).
    #[serde(
        default,
        alias = "highPriorityReserve",
        skip_serializing_if = "is_zero"
    )]
    pub high_priority_reserve: u64,
    /// The estimator's output cap for requests without `max_tokens` (LLM layer; default
    /// 2048).
    #[serde(default, alias = "outputCap", skip_serializing_if = "Option::is_none")]
    pub output_cap: Option<u64>,
}

/// The admission classes of a [`BulkheadConfig`]: the default class and the table, by name.
///
/// ```
/// use llm_bulkhead::config::ClassesConfig;
/// let c: ClassesConfig = serde_json::from_str(
///     r#"{"defaultClass": "standard", "classes": {"premium": {"maxConcurrent": 8}, "standard": {}}}"#).unwrap();
/// assert_eq!(c.classes.names().collect::<Vec<_>>(), ["premium", "standard"]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassesConfig {
    /// The class of demands that name none; must be one of `classes`.
    #[serde(alias = "defaultClass")]
    pub default_class: String,
    /// The classes, in the order they are written (that order gives the [`ClassId`]s).
    ///
    /// [`ClassId`]: crate::ClassId
    pub classes: ClassMap,
}

/// One class's floors and ceilings. Absent floors are 0; absent ceilings mean only the global
/// limits apply. Token fields need a token budget.
///
/// ```
/// use llm_bulkhead::config::ClassConfig;
/// let c: ClassConfig = serde_json::from_str(r#"{"protectedConcurrent": 2, "maxInFlightTokens": 9000}"#).unwrap();
/// assert_eq!((c.protected_concurrent, c.max_concurrent, c.protected_tokens, c.max_tokens), (2, None, 0, Some(9000)));
/// assert!(serde_json::from_str::<ClassConfig>(r#"{"max_token": 1}"#).is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Slots reserved for the class (its concurrency floor).
    #[serde(
        default,
        alias = "protectedConcurrent",
        skip_serializing_if = "is_zero32"
    )]
    pub protected_concurrent: u32,
    /// The class's concurrency ceiling.
    #[serde(
        default,
        alias = "maxConcurrent",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_concurrent: Option<u32>,
    /// Tokens reserved for the class (its token floor).
    #[serde(
        default,
        alias = "protectedTokens",
        alias = "protected_in_flight_tokens",
        alias = "protectedInFlightTokens",
        skip_serializing_if = "is_zero"
    )]
    pub protected_tokens: u64,
    /// The class's token ceiling.
    #[serde(
        default,
        alias = "maxTokens",
        alias = "max_in_flight_tokens",
        alias = "maxInFlightTokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_tokens: Option<u64>,
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

impl From<ClassConfig> for ClassLimits {
    fn from(c: ClassConfig) -> ClassLimits {
        ClassLimits {
            protected_concurrent: c.protected_concurrent,
            max_concurrent: c.max_concurrent,
            protected_tokens: c.protected_tokens,
            max_tokens: c.max_tokens,
        }
    }
}

impl From<ClassLimits> for ClassConfig {
    fn from(c: ClassLimits) -> ClassConfig {
        ClassConfig {
            protected_concurrent: c.protected_concurrent,
            max_concurrent: c.max_concurrent,
            protected_tokens: c.protected_tokens,
            max_tokens: c.max_tokens,
        }
    }
}

/// Classes by name, in the order they were written. Serialised as a map; a name given twice is
/// an error (a plain map would silently keep one of them), and so are more than
/// [`MAX_CLASSES`] classes. Names are compared as the bulkhead compares them: trimmed of white
/// space and in Unicode normalisation form C, so `"a"` and `"a "` (or `"a\u{a0}"`, or two
/// spellings of `"é"`) are one name, given twice; they are kept in that canonical spelling. A
/// name that is empty, or holds a control or bidirectional formatting character, is refused.
///
/// ```
/// use llm_bulkhead::config::{ClassConfig, ClassMap};
/// let m: ClassMap = serde_json::from_str(r#"{"b": {}, " a ": {"maxConcurrent": 1}}"#).unwrap();
/// assert_eq!(m.get("a").unwrap().max_concurrent, Some(1));
/// assert_eq!(m.names().collect::<Vec<_>>(), ["b", "a"]);
/// assert!(serde_json::from_str::<ClassMap>(r#"{"a": {}, "a": {}}"#).is_err());
/// assert!(serde_json::from_str::<ClassMap>(r#"{"a": {"maxConcurrent": 1}, "a\t": {}}"#).is_err());
/// assert!(serde_json::from_str::<ClassMap>(r#"{"a\u202e": {}}"#).is_err());
/// let built: ClassMap = [("x", ClassConfig::default())].into_iter().collect();
/// assert_eq!(built.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassMap(Vec<(String, ClassConfig)>);

impl ClassMap {
    /// The limits of class `name`.
    ///
    /// ```
    /// # use llm_bulkhead::config::{ClassConfig, ClassMap};
    /// let m: ClassMap = [("a", ClassConfig::default())].into_iter().collect();
    /// assert!(m.get("a").is_some() && m.get("b").is_none());
    /// ```
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&ClassConfig> {
        let key = class_name::lookup_key(name);
        self.0.iter().find(|(n, _)| *n == key).map(|(_, c)| c)
    }

    /// The names, in order.
    ///
    /// ```
    /// # use llm_bulkhead::config::{ClassConfig, ClassMap};
    /// let m: ClassMap = [("a", ClassConfig::default())].into_iter().collect();
    /// assert_eq!(m.names().next(), Some("a"));
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// The entries, in order.
    ///
    /// ```
    /// # use llm_bulkhead::config::{ClassConfig, ClassMap};
    /// let m: ClassMap = [("a", ClassConfig::default())].into_iter().collect();
    /// assert_eq!(m.iter().count(), 1);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ClassConfig)> {
        self.0.iter().map(|(n, c)| (n.as_str(), c))
    }

    /// The number of classes.
    ///
    /// ```
    /// assert_eq!(llm_bulkhead::config::ClassMap::default().len(), 0);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no class.
    ///
    /// ```
    /// assert!(llm_bulkhead::config::ClassMap::default().is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets the limits of `name` (replacing them, or appending a new class). The name is kept
    /// in its canonical spelling (trimmed, Unicode form C), so `"a "` replaces `"a"`; a name
    /// the bulkhead refuses (empty, with a control or bidirectional formatting character) is
    /// kept as given, and building or applying the configuration refuses it.
    ///
    /// ```
    /// # use llm_bulkhead::config::{ClassConfig, ClassMap};
    /// let mut m = ClassMap::default();
    /// m.insert("a", ClassConfig { max_concurrent: Some(2), ..Default::default() });
    /// m.insert("a ", ClassConfig::default());
    /// assert_eq!((m.len(), m.get("a").unwrap().max_concurrent), (1, None));
    /// ```
    pub fn insert(&mut self, name: impl Into<String>, limits: ClassConfig) {
        let name = name.into();
        let name = class_name::lookup_key(&name).into_owned();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c = limits,
            None => self.0.push((name, limits)),
        }
    }
}

impl<N: Into<String>> FromIterator<(N, ClassConfig)> for ClassMap {
    fn from_iter<I: IntoIterator<Item = (N, ClassConfig)>>(iter: I) -> ClassMap {
        let mut m = ClassMap::default();
        for (n, c) in iter {
            m.insert(n, c);
        }
        m
    }
}

impl Serialize for ClassMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (n, c) in &self.0 {
            map.serialize_entry(n, c)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for ClassMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ClassMap, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ClassMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "a map of at most {MAX_CLASSES} class names to class limits"
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<ClassMap, A::Error> {
                let mut out: Vec<(String, ClassConfig)> = Vec::new();
                while let Some(given) = a.next_key::<String>()? {
                    // Quoted names are bounded: a key can be megabytes long.
                    let quoted = || format!("{:?}", error::bounded(&given));
                    let name = class_name::canonical(&given)
                        .map_err(|why| {
                            serde::de::Error::custom(format_args!(
                                "admission class {}: {why}",
                                quoted()
                            ))
                        })?
                        .into_owned();
                    if let Some((first, _)) = out.iter().find(|(n, _)| *n == name) {
                        return Err(serde::de::Error::custom(format_args!(
                            "admission class {} is given twice (as {first:?} after trimming \
                             and Unicode normalisation)",
                            quoted()
                        )));
                    }
                    if out.len() == MAX_CLASSES {
                        return Err(serde::de::Error::custom(format_args!(
                            "at most {MAX_CLASSES} admission classes are supported"
                        )));
                    }
                    let limits = a.next_value::<ClassConfig>()?;
                    out.push((name, limits));
                }
                Ok(ClassMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// What `LlmBulkhead::run` does with refusals: answer them (`enforce`, the default) or run the
/// refused work anyway and count it (`observe`, for rollouts).
///
/// ```
/// use llm_bulkhead::config::RolloutMode;
/// assert_eq!(serde_json::to_string(&RolloutMode::Observe).unwrap(), "\"observe\"");
/// assert!(RolloutMode::default().is_enforce());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutMode {
    /// Refusals are the answer.
    #[default]
    Enforce,
    /// Refusals for a shadow reason run anyway, without an admission.
    Observe,
}

impl RolloutMode {
    /// Whether this is [`RolloutMode::Enforce`].
    ///
    /// ```
    /// assert!(!llm_bulkhead::config::RolloutMode::Observe.is_enforce());
    /// ```
    #[must_use]
    pub fn is_enforce(&self) -> bool {
        *self == RolloutMode::Enforce
    }
}

impl BulkheadConfig {
    /// The builder these settings describe (for settings a config file does not carry).
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// let b = BulkheadConfig { max_concurrent: 3, ..Default::default() }.builder().build().unwrap();
    /// assert_eq!(b.limits().max_concurrent, 3);
    /// ```
    pub fn builder(&self) -> BulkheadBuilder {
        let mut b = Bulkhead::builder()
            .max_concurrent(self.max_concurrent)
            .initial_revision(self.initial_revision)
            .measure_queue_waits(self.measure_queue_waits)
            .wait_for_tokens(self.wait_for_tokens);
        if let Some(q) = self.max_queue {
            b = b.max_queue(q);
        }
        if let Some(ms) = self.queue_timeout_ms {
            b = b.queue_timeout(Duration::from_millis(ms));
        }
        if let Some(p) = self.profile {
            b = b.profile(p);
        }
        if let Some(t) = &self.token_budget {
            b = b.token_budget(t.budget);
            if t.high_priority_reserve > 0 {
                b = b.high_priority_reserve(t.high_priority_reserve);
            }
        }
        if let Some(c) = &self.admission_classes {
            for (name, limits) in c.classes.iter() {
                b = b.class(name, (*limits).into());
            }
            b = b.default_class(c.default_class.clone());
        }
        b
    }

    /// Validates everything and builds the bulkhead.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field and the bound it broke; nothing is built.
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// let err = BulkheadConfig { max_concurrent: 1 << 20, ..Default::default() }.build().unwrap_err();
    /// assert_eq!(err.to_string(), "max_concurrent = 1048576 exceeds the largest supported value 32767");
    /// ```
    pub fn build(&self) -> Result<Bulkhead, ConfigError> {
        self.builder().build()
    }

    /// The settings of an existing bulkhead's current limits (the default class, timeout and
    /// classes included; the rollout mode, model and output cap are not the bulkhead's and
    /// stay at their defaults).
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// let config = BulkheadConfig { max_concurrent: 7, ..Default::default() };
    /// assert_eq!(BulkheadConfig::of(&config.build().unwrap()), config);
    /// ```
    #[must_use]
    pub fn of(bulkhead: &Bulkhead) -> BulkheadConfig {
        let l = bulkhead.limits();
        let stats_default = bulkhead.stats().classes.map(|c| c.default_class);
        BulkheadConfig {
            max_concurrent: l.max_concurrent,
            max_queue: (l.max_queue > 0).then_some(l.max_queue),
            queue_timeout_ms: bulkhead
                .default_queue_timeout()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            profile: None,
            initial_revision: l.revision,
            measure_queue_waits: bulkhead.measures_queue_waits(),
            wait_for_tokens: bulkhead.waits_for_tokens(),
            mode: RolloutMode::Enforce,
            shadow_reasons: None,
            model: None,
            token_budget: l.token_budget.map(|t| TokenBudgetConfig {
                budget: t.budget,
                high_priority_reserve: t.high_priority_reserve,
                output_cap: None,
            }),
            admission_classes: stats_default.map(|default_class| ClassesConfig {
                default_class,
                classes: named_classes(bulkhead, &l),
            }),
        }
    }
}

#[cfg(feature = "llm")]
#[cfg_attr(docsrs, doc(cfg(feature = "llm")))]
impl BulkheadConfig {
    /// The rollout mode for [`RunOptions::mode`](crate::llm::RunOptions::mode): `enforce`, or
    /// `observe` with `shadow_reasons` (all four shadowable reasons when absent).
    ///
    /// # Errors
    /// [`ModeError::NotShadowable`](crate::llm::ModeError::NotShadowable) for `shutdown` or
    /// `aborted` in `shadow_reasons`.
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// use llm_bulkhead::llm::{Mode, ShadowReasons};
    /// let c = BulkheadConfig::from_json(r#"{"max_concurrent": 1, "mode": "observe", "shadow_reasons": ["timeout"]}"#).unwrap();
    /// assert_eq!(c.run_mode().unwrap(), Mode::Observe(ShadowReasons::new([llm_bulkhead::RejectReason::Timeout]).unwrap()));
    /// let bad = BulkheadConfig::from_json(r#"{"max_concurrent": 1, "mode": "observe", "shadow_reasons": ["shutdown"]}"#).unwrap();
    /// assert!(bad.run_mode().is_err());
    /// ```
    pub fn run_mode(&self) -> Result<crate::llm::Mode, crate::llm::ModeError> {
        use crate::llm::{Mode, ShadowReasons};
        let reasons = match &self.shadow_reasons {
            None => ShadowReasons::ALL,
            Some(r) => ShadowReasons::new(r.iter().copied())?,
        };
        Ok(match self.mode {
            RolloutMode::Enforce => Mode::Enforce,
            RolloutMode::Observe => Mode::Observe(reasons),
        })
    }

    /// The model-aware estimator these settings describe (`model` as the default model,
    /// `token_budget.output_cap` as the output cap).
    ///
    /// # Errors
    /// The estimator builder's [`EstimateError`](crate::llm::EstimateError) (an empty `model`
    /// is `InvalidSetting` on field `default_model`).
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// use llm_bulkhead::llm::{LlmRequest, TokenEstimator};
    /// let c = BulkheadConfig::from_json(r#"{"max_concurrent": 1, "model": "gpt-4o", "token_budget": {"budget": 9000, "output_cap": 100}}"#).unwrap();
    /// let r = c.estimator().unwrap().estimate(&LlmRequest::default()).unwrap();
    /// assert_eq!(r.max_output(), 100);
    /// ```
    pub fn estimator(&self) -> Result<crate::llm::ModelAwareEstimator, crate::llm::EstimateError> {
        let mut e = crate::llm::ModelAwareEstimator::builder();
        if let Some(m) = &self.model {
            e = e.default_model(m);
        }
        if let Some(cap) = self.token_budget.as_ref().and_then(|t| t.output_cap) {
            e = e.output_cap(cap);
        }
        e.build()
    }

    /// Builds the bulkhead and its LLM front end with [`estimator`](Self::estimator).
    ///
    /// # Errors
    /// [`LoadError::Invalid`] for the bulkhead's settings, [`LoadError::Estimator`] for the
    /// estimator's.
    ///
    /// ```
    /// use llm_bulkhead::config::BulkheadConfig;
    /// let llm = BulkheadConfig::from_json(r#"{"max_concurrent": 2, "token_budget": {"budget": 9000}}"#)?.build_llm()?;
    /// assert_eq!(llm.bulkhead().limits().max_concurrent, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_llm(&self) -> Result<crate::llm::LlmBulkhead, LoadError> {
        let bulkhead = self.build()?;
        let estimator = self.estimator().map_err(LoadError::Estimator)?;
        Ok(crate::llm::LlmBulkhead::new(bulkhead, estimator))
    }
}

pub(crate) fn named_classes(bulkhead: &Bulkhead, l: &LimitsSnapshot) -> ClassMap {
    bulkhead
        .class_names()
        .iter()
        .zip(l.classes.iter())
        .map(|(n, c)| (n.clone(), ClassConfig::from(*c)))
        .collect()
}
mod error;
mod limits;

pub use error::{Format, LoadError};
pub use limits::{BudgetConfig, LimitsConfig};

#[cfg(any(feature = "json", feature = "toml"))]
mod text;
#[cfg(any(feature = "json", feature = "toml"))]
pub(crate) use text::parse as parse_text;
#[cfg(any(feature = "json", feature = "toml"))]
pub use text::{apply_limits_file, FileOutcome};

/// Reads [`BulkheadConfig::model`], refusing an empty name (the reader names the field).
fn non_empty_model<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let model = Option::<String>::deserialize(d)?;
    if model.as_deref() == Some("") {
        return Err(serde::de::Error::custom(
            "model must be a non-empty model name",
        ));
    }
    Ok(model)
}
