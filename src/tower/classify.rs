//! Classifiers: how the layer turns a request's parts (method, URI, headers, extensions) into
//! a [`Demand`].

use crate::{Bulkhead, ClassId, Demand, Priority, Reservation};
use http::request::Parts;
use http::{HeaderName, HeaderValue, StatusCode};
use std::fmt;

/// Makes the [`Demand`] of a request from its parts, in `call`. It sees headers and
/// extensions, so an earlier layer or handler that parsed the body can leave a
/// [`TokenEstimate`] (or a whole [`Demand`]) in an extension.
///
/// Any `Fn(&Parts) -> Result<Demand, ClassifyError> + Send + Sync + 'static` is a classifier.
///
/// ```
/// use llm_bulkhead::tower::{Classify, ClassifyError};
/// use llm_bulkhead::{Demand, Priority};
/// let by_path = |parts: &http::request::Parts| -> Result<Demand, ClassifyError> {
///     Ok(if parts.uri.path().starts_with("/admin") { Demand::slot().with_priority(Priority::High) } else { Demand::slot() })
/// };
/// let (parts, ()) = http::Request::get("/admin/x").body(()).unwrap().into_parts();
/// assert_eq!(by_path.classify(&parts).unwrap().priority(), Priority::High);
/// ```
pub trait Classify: Send + Sync + 'static {
    /// The demand of the request with these parts.
    ///
    /// # Errors
    /// A [`ClassifyError`] refuses the request before it reaches the bulkhead or the inner
    /// service (400 by default in response mode).
    fn classify(&self, parts: &Parts) -> Result<Demand, ClassifyError>;
}

impl<F> Classify for F
where
    F: Fn(&Parts) -> Result<Demand, ClassifyError> + Send + Sync + 'static,
{
    #[inline]
    fn classify(&self, parts: &Parts) -> Result<Demand, ClassifyError> {
        self(parts)
    }
}

/// A classifier's refusal: the status of the response mode, a stable machine-readable code and
/// a message. Messages must not echo request text beyond what the client sent in a header.
///
/// ```
/// use llm_bulkhead::tower::ClassifyError;
/// let e = ClassifyError::bad_request("missing_estimate", "the request carries no token estimate");
/// assert_eq!(e.status, http::StatusCode::BAD_REQUEST);
/// assert_eq!(e.to_string(), "missing_estimate: the request carries no token estimate");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifyError {
    /// The response status (response mode).
    pub status: StatusCode,
    /// A stable code (`unknown_admission_class`, ...).
    pub code: &'static str,
    /// A human-readable message.
    pub message: String,
}

impl ClassifyError {
    /// A 400 refusal.
    ///
    /// ```
    /// # use llm_bulkhead::tower::ClassifyError;
    /// assert_eq!(ClassifyError::bad_request("c", "m").code, "c");
    /// ```
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ClassifyError {
        ClassifyError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for ClassifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ClassifyError {}

/// A request extension with the token reservation of the request, computed by whoever parsed
/// its body (an axum middleware or extractor, an earlier layer). [`HeaderClassifier`] uses it.
///
/// ```
/// use llm_bulkhead::tower::TokenEstimate;
/// use llm_bulkhead::Reservation;
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(TokenEstimate(Reservation::new(1_200, 800).unwrap()));
/// assert_eq!(req.extensions().get::<TokenEstimate>().unwrap().0.total(), 2_000);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEstimate(pub Reservation);

/// The classifier of [`BulkheadLayer::slots`](super::BulkheadLayer::slots): one slot per
/// request, or the [`Demand`] or [`TokenEstimate`] an extension carries.
///
/// ```
/// use llm_bulkhead::tower::{Classify, SlotPerRequest};
/// let (parts, ()) = http::Request::new(()).into_parts();
/// assert_eq!(SlotPerRequest.classify(&parts).unwrap(), llm_bulkhead::Demand::slot());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotPerRequest;

impl Classify for SlotPerRequest {
    #[inline]
    fn classify(&self, parts: &Parts) -> Result<Demand, ClassifyError> {
        Ok(from_extensions(parts).unwrap_or_else(Demand::slot))
    }
}

#[inline]
fn from_extensions(parts: &Parts) -> Option<Demand> {
    if parts.extensions.is_empty() {
        return None;
    }
    if let Some(d) = parts.extensions.get::<Demand>() {
        return Some(*d);
    }
    parts
        .extensions
        .get::<TokenEstimate>()
        .map(|t| Demand::tokens(t.0))
}

/// A classifier from headers: the admission class from one header (a trusted traffic class or
/// tenant tier set by the auth layer, never a raw tenant id), the priority from another, and
/// the tokens from a [`TokenEstimate`] extension. A [`Demand`] extension wins over all of it.
///
/// * class header absent: the default class; a name the bulkhead does not have: 400
///   `unknown_admission_class` (classes are a fixed table: contract §4);
/// * priority header `high` or `normal` (absent: normal); anything else: 400
///   `invalid_priority`;
/// * no estimate: a slot only, or 400 `missing_estimate` with
///   [`require_estimate`](Self::require_estimate) on a bulkhead with a budget;
/// * either header given more than once: 400 `duplicate_header` (never "first wins": a
///   client's own header must not override one an authentication layer appended).
///
/// ```
/// use llm_bulkhead::tower::{Classify, HeaderClassifier};
/// use llm_bulkhead::{Bulkhead, ClassLimits, Priority};
/// let b = Bulkhead::builder().max_concurrent(4)
///     .class("premium", ClassLimits::default()).class("standard", ClassLimits::default())
///     .default_class("standard").build().unwrap();
/// let c = HeaderClassifier::new(&b).class_header("x-traffic-class").priority_header("x-priority");
/// let (parts, ()) = http::Request::get("/").header("x-traffic-class", "premium").header("x-priority", "high")
///     .body(()).unwrap().into_parts();
/// let d = c.classify(&parts).unwrap();
/// assert_eq!((d.class(), d.priority()), (Some(b.class_id("premium").unwrap()), Priority::High));
/// let (parts, ()) = http::Request::get("/").header("x-traffic-class", "tenant-42").body(()).unwrap().into_parts();
/// assert_eq!(c.classify(&parts).unwrap_err().code, "unknown_admission_class");
/// ```
#[derive(Clone, Debug)]
pub struct HeaderClassifier {
    classes: Vec<(String, ClassId)>,
    class_header: Option<HeaderName>,
    priority_header: Option<HeaderName>,
    require_estimate: bool,
}

impl HeaderClassifier {
    /// A classifier for `bulkhead`'s classes, reading no header until told which.
    ///
    /// ```
    /// # use llm_bulkhead::tower::HeaderClassifier;
    /// let c = HeaderClassifier::new(&llm_bulkhead::Bulkhead::new(1).unwrap());
    /// # let _ = c;
    /// ```
    #[must_use]
    pub fn new(bulkhead: &Bulkhead) -> HeaderClassifier {
        let classes = bulkhead
            .class_names()
            .iter()
            .filter_map(|n| bulkhead.class_id(n).ok().map(|id| (n.clone(), id)))
            .collect();
        HeaderClassifier {
            classes,
            class_header: None,
            priority_header: None,
            require_estimate: false,
        }
    }

    /// Reads the class name from `header`.
    ///
    /// # Panics
    /// If `header` is not a valid header name (a programming error, like `HeaderName::from_static`).
    ///
    /// ```
    /// # use llm_bulkhead::tower::HeaderClassifier;
    /// let c = HeaderClassifier::new(&llm_bulkhead::Bulkhead::new(1).unwrap()).class_header("x-traffic-class");
    /// # let _ = c;
    /// ```
    #[must_use = "returns the changed classifier; the original is moved"]
    pub fn class_header(mut self, header: &'static str) -> HeaderClassifier {
        self.class_header = Some(HeaderName::from_static(header));
        self
    }

    /// Reads the priority (`high` or `normal`) from `header`.
    ///
    /// # Panics
    /// If `header` is not a valid, lower-case header name.
    ///
    /// ```
    /// # use llm_bulkhead::tower::HeaderClassifier;
    /// let c = HeaderClassifier::new(&llm_bulkhead::Bulkhead::new(1).unwrap()).priority_header("x-priority");
    /// # let _ = c;
    /// ```
    #[must_use = "returns the changed classifier; the original is moved"]
    pub fn priority_header(mut self, header: &'static str) -> HeaderClassifier {
        self.priority_header = Some(HeaderName::from_static(header));
        self
    }

    /// Refuses requests without a [`TokenEstimate`] (400 `missing_estimate`).
    ///
    /// ```
    /// use llm_bulkhead::tower::{Classify, HeaderClassifier};
    /// let c = HeaderClassifier::new(&llm_bulkhead::Bulkhead::new(1).unwrap()).require_estimate(true);
    /// let (parts, ()) = http::Request::new(()).into_parts();
    /// assert_eq!(c.classify(&parts).unwrap_err().code, "missing_estimate");
    /// ```
    #[must_use = "returns the changed classifier; the original is moved"]
    pub fn require_estimate(mut self, on: bool) -> HeaderClassifier {
        self.require_estimate = on;
        self
    }
}

impl Classify for HeaderClassifier {
    fn classify(&self, parts: &Parts) -> Result<Demand, ClassifyError> {
        if let Some(d) = parts.extensions.get::<Demand>() {
            return Ok(*d);
        }
        let mut demand = match parts.extensions.get::<TokenEstimate>() {
            Some(t) => Demand::tokens(t.0),
            None if self.require_estimate => {
                return Err(ClassifyError::bad_request(
                    "missing_estimate",
                    "the request carries no token estimate",
                ))
            }
            None => Demand::slot(),
        };
        if let Some(h) = &self.priority_header {
            match single(parts, h)?.map(|v| v.as_bytes()) {
                None | Some(b"normal") => {}
                Some(b"high") => demand = demand.with_priority(Priority::High),
                Some(_) => {
                    return Err(ClassifyError::bad_request(
                        "invalid_priority",
                        format!("header {h} must be `high` or `normal`"),
                    ))
                }
            }
        }
        if let Some(h) = &self.class_header {
            if let Some(v) = single(parts, h)? {
                // Compared as the bulkhead compares names (trimmed, Unicode form C).
                let name = crate::vocab::class_name::lookup_key(v.to_str().unwrap_or(""));
                match self.classes.iter().find(|(n, _)| *n == name) {
                    Some((_, id)) => demand = demand.in_class(*id),
                    None => {
                        // The name is the client's own header; it is not echoed (it may be
                        // arbitrarily long or sensitive).
                        return Err(ClassifyError::bad_request(
                            "unknown_admission_class",
                            format!("header {h} names no admission class of this gateway"),
                        ));
                    }
                }
            }
        }
        Ok(demand)
    }
}

/// The one value of header `h`, if any. Given twice, it is refused rather than read as its
/// first value: an authentication layer that appends the trusted class would otherwise be
/// overridden by the client's own header.
fn single<'a>(parts: &'a Parts, h: &HeaderName) -> Result<Option<&'a HeaderValue>, ClassifyError> {
    let mut all = parts.headers.get_all(h).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(ClassifyError::bad_request(
            "duplicate_header",
            format!("header {h} must be given once"),
        ));
    }
    Ok(first)
}

/// Estimates the token reservation of a chat request from its JSON body (features `tower` and
/// `llm`), for a middleware or extractor that read the body before the layer: parse, estimate,
/// and put the result in the request's extensions for [`HeaderClassifier`]. Errors are 400
/// refusals naming the problem (`invalid_json`, `too_many_parts`, `invalid_estimate`) and the
/// field, never echoing the body nor a slice of it.
///
/// # Errors
/// A [`ClassifyError`] for a body that is not a chat request, or that the estimator refuses.
///
/// ```
/// use llm_bulkhead::llm::ModelAwareEstimator;
/// use llm_bulkhead::tower::estimate_json;
/// let body = br#"{"model": "gpt-4o", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}"#;
/// let estimate = estimate_json(body, &ModelAwareEstimator::default()).unwrap();
/// assert_eq!(estimate.0.max_output(), 100);
/// assert_eq!(estimate_json(b"{nope", &ModelAwareEstimator::default()).unwrap_err().code, "invalid_json");
/// ```
#[cfg(feature = "llm")]
#[cfg_attr(docsrs, doc(cfg(feature = "llm")))]
pub fn estimate_json(
    body: &[u8],
    estimator: &dyn crate::llm::TokenEstimator,
) -> Result<TokenEstimate, ClassifyError> {
    // Estimated while parsing: nothing of the body is materialised, its parts are limited,
    // and no error quotes it (`TokenEstimator::estimate_body`).
    use crate::llm::EstimateError as E;
    estimator
        .estimate_body(body)
        .map(TokenEstimate)
        .map_err(|e| {
            let code = match e {
                E::InvalidJson { .. } | E::InvalidField { .. } | E::ConflictingFields { .. } => {
                    "invalid_json"
                }
                E::TooManyParts { .. } => "too_many_parts",
                _ => "invalid_estimate",
            };
            ClassifyError::bad_request(code, e.to_string())
        })
}
