//! Refusals of the layer: the typed error of error mode, the ready response of response mode,
//! and the stable JSON body both describe.

use super::body::AdmittedBody;
use super::classify::ClassifyError;
use crate::{Constraint, FitLimit, RejectReason, Rejection};
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;
use std::fmt;

/// Why the layer did not pass a request on: the bulkhead refused it, or the classifier could
/// not make a demand of it.
///
/// ```
/// use llm_bulkhead::tower::Refusal;
/// use llm_bulkhead::Bulkhead;
/// let b = Bulkhead::new(0).unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// assert_eq!(r.status(), http::StatusCode::TOO_MANY_REQUESTS);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The bulkhead refused the demand (boxed: the detail is large).
    Rejected(Box<Rejection>),
    /// The classifier refused the request (an unknown class, a malformed header, ...).
    Unclassified(ClassifyError),
    /// The replica's cluster share had lapsed at the commit (a layer built over a
    /// [`ClusterBulkhead`](crate::cluster::ClusterBulkhead), feature `cluster`): the
    /// admission was given back at once. 503 with code `share_lapsed`: this replica cannot
    /// admit until its agent installs a valid share, another replica may.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    ShareLapsed,
    /// A token reservation the replica's installed cluster share can never hold, but the
    /// global limits can (a layer built over a
    /// [`ClusterBulkhead`](crate::cluster::ClusterBulkhead), feature `cluster`): the share is
    /// zero while the table learns or after the agent degraded, or small beside the request,
    /// and grows at a later renewal. 503 with code `share_too_small` and a `Retry-After` of
    /// the agent's renewal period (the share changes at a renewal at the earliest), where a
    /// bulkhead that is not cluster-managed answers 413 `request_too_large`. A reservation
    /// above the global limits is still a 413. 503 as [`ShareLapsed`](Self::ShareLapsed):
    /// clients and load balancers retry it, and another replica may have room.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    ShareTooSmall(Box<crate::cluster::ShareTooSmall>),
}

/// The code of [`Refusal::ShareLapsed`].
#[cfg(feature = "cluster")]
const SHARE_LAPSED_CODE: &str = "share_lapsed";

/// The code of [`Refusal::ShareTooSmall`].
#[cfg(feature = "cluster")]
const SHARE_TOO_SMALL_CODE: &str = "share_too_small";

impl Refusal {
    /// The status of the response mode: 503 for `shutdown` (the bulkhead is closed) and
    /// `aborted`, 429 for every capacity refusal (`concurrency_limit`, `queue_limit`,
    /// `budget_limit`, `timeout`), and the classifier's status for its refusals. 413 for a
    /// `budget_limit` refusal whose reservation the current limits could never admit
    /// ([`Rejection::never_fits`]): a retry cannot succeed, and clients (the OpenAI SDKs among
    /// them) retry a 429 but not a 413. 500 only for `unknown_class`: a classifier that
    /// returned a class of another bulkhead (the gateway's own bug, not the client's and not a
    /// capacity refusal). With the feature `cluster`, 503 for `ShareLapsed` and `ShareTooSmall`: on a layer over a cluster share, a
    /// reservation is a 413 only when it is above the global limits.
    ///
    /// ```
    /// use llm_bulkhead::tower::{ClassifyError, Refusal};
    /// let r = Refusal::Unclassified(ClassifyError::bad_request("unknown_admission_class", "no such class"));
    /// assert_eq!(r.status(), http::StatusCode::BAD_REQUEST);
    /// ```
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Rejected(r) if r.never_fits().is_some() => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Rejected(r) => reason_status(r.reason),
            Refusal::Unclassified(e) => e.status,
            #[cfg(feature = "cluster")]
            Refusal::ShareLapsed | Refusal::ShareTooSmall(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable code of the body's `code` field (OpenAI's error field): the classifier's
    /// code, `request_too_large` for a reservation that can never fit, `share_lapsed` and
    /// `share_too_small` for the cluster refusals (feature `cluster`), else the bulkhead's
    /// reason (`concurrency_limit`, ...).
    ///
    /// ```
    /// use llm_bulkhead::tower::Refusal;
    /// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(1).token_budget(10).build().unwrap();
    /// let r = b.try_acquire(llm_bulkhead::Demand::tokens(llm_bulkhead::Reservation::new(20, 0).unwrap())).unwrap_err();
    /// assert_eq!(Refusal::Rejected(Box::new(r)).code(), "request_too_large");
    /// ```
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unclassified(e) => e.code,
            Refusal::Rejected(r) if r.never_fits().is_some() => NEVER_FITS_CODE,
            Refusal::Rejected(r) => r.reason.as_str(),
            #[cfg(feature = "cluster")]
            Refusal::ShareLapsed => SHARE_LAPSED_CODE,
            #[cfg(feature = "cluster")]
            Refusal::ShareTooSmall(_) => SHARE_TOO_SMALL_CODE,
        }
    }

    /// The JSON body of the response mode (see [`RefusalBody`]).
    ///
    /// ```
    /// use llm_bulkhead::tower::Refusal;
    /// let b = llm_bulkhead::Bulkhead::new(0).unwrap();
    /// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
    /// let json: serde_json::Value = serde_json::from_slice(&r.json()).unwrap();
    /// assert_eq!(json["error"]["reason"], "concurrency_limit");
    /// assert_eq!(json["error"]["capacity"]["max_concurrent"], 0);
    /// ```
    #[must_use]
    pub fn json(&self) -> Bytes {
        // Serialising these plain structs (string keys, integers) cannot fail.
        Bytes::from(serde_json::to_vec(&RefusalBody::of(self)).unwrap_or_default())
    }

    /// The ready response: [`status`](Self::status), `content-type: application/json`, the
    /// [`json`](Self::json) body. No `Retry-After`: a fail-fast bulkhead has no honest estimate
    /// of when capacity returns (contract §8). The one exception is
    /// `ShareTooSmall` (feature `cluster`), whose share changes at the
    /// agent's next renewal at the earliest: `Retry-After` is the renewal period, in whole
    /// seconds rounded up.
    ///
    /// ```
    /// use llm_bulkhead::tower::Refusal;
    /// let b = llm_bulkhead::Bulkhead::new(0).unwrap();
    /// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
    /// let resp = r.response::<http_body_util::Empty<bytes::Bytes>>();
    /// assert_eq!(resp.status(), 429);
    /// assert!(resp.headers().get("retry-after").is_none());
    /// ```
    pub fn response<B>(&self) -> Response<AdmittedBody<B>> {
        let mut resp = Response::new(AdmittedBody::refusal(self.json()));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        #[cfg(feature = "cluster")]
        if let Refusal::ShareTooSmall(s) = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s.retry_after_secs()));
        }
        resp
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Rejected(r) => fmt::Display::fmt(r, f),
            Refusal::Unclassified(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "cluster")]
            Refusal::ShareLapsed => {
                fmt::Display::fmt(&crate::cluster::ClusterRejection::ShareLapsed, f)
            }
            #[cfg(feature = "cluster")]
            Refusal::ShareTooSmall(s) => fmt::Display::fmt(s, f),
        }
    }
}

impl std::error::Error for Refusal {}

/// The error of error mode ([`BulkheadLayer::refuse_with_error`](super::BulkheadLayer::refuse_with_error)):
/// the layer's refusal, or the inner service's own error. Downcast a `BoxError` to it, or match.
///
/// ```
/// use llm_bulkhead::tower::{Refused, Refusal, ClassifyError};
/// let e: Refused<std::io::Error> = Refused::Refusal(Refusal::Unclassified(ClassifyError::bad_request("x", "y")));
/// assert!(e.refusal().is_some());
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Refused<E> {
    /// The layer refused the request; the inner service never saw it.
    Refusal(Refusal),
    /// The inner service failed.
    Inner(E),
}

impl<E> Refused<E> {
    /// The layer's refusal, if that is what this is.
    ///
    /// ```
    /// # use llm_bulkhead::tower::Refused;
    /// assert!(Refused::Inner(()).refusal().is_none());
    /// ```
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Refused::Refusal(r) => Some(r),
            Refused::Inner(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for Refused<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Refusal(r) => fmt::Display::fmt(r, f),
            Refused::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Refused<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Refused::Refusal(r) => Some(r),
            Refused::Inner(e) => Some(e),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// How the service answers a refusal: [`Respond`] (a ready 429/503 response, the inner error
/// type kept) or [`Fail`] (a [`Refused`] error). Sealed.
///
/// ```
/// use llm_bulkhead::tower::{ClassifyError, Fail, Refusal, RefusalMode, Respond};
/// let r = || Refusal::Unclassified(ClassifyError::bad_request("c", "m"));
/// let resp = <Respond as RefusalMode<std::io::Error>>::refuse::<String>(r()).unwrap();
/// assert_eq!(resp.status(), 400);
/// assert!(<Fail as RefusalMode<std::io::Error>>::refuse::<String>(r()).is_err());
/// ```
pub trait RefusalMode<E>: sealed::Sealed {
    /// The service's error type.
    type Error;
    /// The answer to `refusal`.
    ///
    /// # Errors
    /// In [`Fail`] mode, always: the refusal as [`Refused::Refusal`].
    fn refuse<B>(refusal: Refusal) -> Result<Response<AdmittedBody<B>>, Self::Error>;
    /// The inner service's error.
    fn inner(error: E) -> Self::Error;
}

/// Response mode (the default): refusals are ready responses, and the service keeps the inner
/// error type, so axum needs no `HandleErrorLayer`.
///
/// ```
/// use llm_bulkhead::tower::{BulkheadLayer, Respond};
/// let _layer: BulkheadLayer<Respond> = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(4).unwrap());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Respond;

/// Error mode: refusals are [`Refused::Refusal`] errors, for tower stacks that handle errors.
///
/// ```
/// use llm_bulkhead::tower::{BulkheadLayer, Fail};
/// let _layer: BulkheadLayer<Fail> = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(4).unwrap()).refuse_with_error();
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Fail;

impl sealed::Sealed for Respond {}
impl sealed::Sealed for Fail {}

impl<E> RefusalMode<E> for Respond {
    type Error = E;
    fn refuse<B>(refusal: Refusal) -> Result<Response<AdmittedBody<B>>, E> {
        Ok(refusal.response())
    }
    fn inner(error: E) -> E {
        error
    }
}

impl<E> RefusalMode<E> for Fail {
    type Error = Refused<E>;
    fn refuse<B>(refusal: Refusal) -> Result<Response<AdmittedBody<B>>, Refused<E>> {
        Err(Refused::Refusal(refusal))
    }
    fn inner(error: E) -> Refused<E> {
        Refused::Inner(error)
    }
}

/// The status of a bulkhead refusal for `reason` (one that could fit: see
/// [`Refusal::status`]).
fn reason_status(reason: RejectReason) -> StatusCode {
    match reason {
        // A de-duplication follower's unshareable result (the layer makes none): the
        // service could not answer this caller, which is not the caller's fault.
        RejectReason::Shutdown | RejectReason::Aborted | RejectReason::UnshareableResult => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        RejectReason::ConcurrencyLimit
        | RejectReason::QueueLimit
        | RejectReason::BudgetLimit
        | RejectReason::Timeout => StatusCode::TOO_MANY_REQUESTS,
        // The classifier chose a class of another bulkhead: the gateway's own error.
        RejectReason::UnknownClass => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The `code` of a refusal for a reservation the limits could never admit.
const NEVER_FITS_CODE: &str = "request_too_large";

/// The JSON body of a refusal response, shaped as OpenAI's errors (`type`, `message`, `code`)
/// with the bulkhead's figures beside them. The field names are stable; absent parts are left
/// out (never `null`):
///
/// ```json
/// {"error": {
///   "type": "admission_rejected",          // or "invalid_request" for classifier refusals
///   "code": "concurrency_limit",           // Refusal::code: the reason, the classifier's
///                                          // code, or "request_too_large"
///   "reason": "concurrency_limit",         // contract §2's reasons, or the classifier's code
///   "message": "admission refused: ...",
///   "limit": {"name": "effective_budget",  // a reservation that can never fit (413) only:
///             "requested": 100000,         // the bound it is above (`effective_budget`,
///             "most": 56000},              // `class_max_tokens`, `class_reach`)
///   "constraint": "admission_class",       // with classes only
///   "class": "standard",                   // with classes only
///   "revision": 3,                         // the limits revision the decision used
///   "capacity": {
///     "in_flight": 5, "pending": 0, "max_concurrent": 5, "max_queue": 0,
///     "tokens": {"budget": 50000, "in_flight": 49000, "effective_budget": 45000,
///                "available": 0, "requested": 1200},                        // with a budget
///     "shared": {"concurrency": {"capacity": 4, "in_use": 4, "available": 0, "requested_borrowed": 1},
///                "tokens": {...}},                                           // with classes
///     "class": {"in_flight": 3, "protected_concurrent": 3, "protected_concurrent_in_use": 3,
///               "borrowed_concurrent": 0, "available_protected_concurrent": 0,
///               "max_concurrent": 8, "available_concurrent": 5,
///               "tokens": {"in_flight": 0, "protected": 8000, "protected_in_use": 0, "borrowed": 0,
///                          "available_protected": 8000, "max": 20000, "available": 20000,
///                          "requested": 0}}                                  // with classes
///   }
/// }}
/// ```
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(1).token_budget(10).build().unwrap();
/// let r = b.try_acquire(llm_bulkhead::Demand::tokens(llm_bulkhead::Reservation::new(20, 0).unwrap())).unwrap_err();
/// let body = RefusalBody::of(&Refusal::Rejected(Box::new(r)));
/// assert_eq!(body.error.reason, "budget_limit");
/// assert_eq!(body.error.capacity.unwrap().tokens.unwrap().requested, 20);
/// ```
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct RefusalBody {
    /// The refusal.
    pub error: RefusalError,
}

/// The `error` object of a [`RefusalBody`].
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert_eq!((body.error.kind, body.error.revision), ("admission_rejected", Some(0)));
/// ```
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct RefusalError {
    /// `admission_rejected` (the bulkhead) or `invalid_request` (the classifier).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// OpenAI's `code` field: [`Refusal::code`].
    pub code: &'static str,
    /// The reason (`concurrency_limit`, ...) or the classifier's code.
    pub reason: String,
    /// A human-readable summary.
    pub message: String,
    /// The bound a reservation that can never fit is above (a 413 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitBody>,
    /// The binding constraint (with classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub constraint: Option<&'static str>,
    /// The demand's class (with classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The limits revision of the decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// What the decision saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityBody>,
}

/// The bound of a reservation that can never fit ([`Rejection::never_fits`]).
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(1).token_budget(10).build().unwrap();
/// let r = b.try_acquire(llm_bulkhead::Demand::tokens(llm_bulkhead::Reservation::new(20, 0).unwrap())).unwrap_err();
/// let limit = RefusalBody::of(&Refusal::Rejected(Box::new(r))).error.limit.unwrap();
/// assert_eq!((limit.name, limit.requested, limit.most), ("effective_budget", 20, 10));
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
#[non_exhaustive]
pub struct LimitBody {
    /// [`FitLimit::as_str`](crate::FitLimit::as_str): `effective_budget`, `class_max_tokens`
    /// or `class_reach`.
    pub name: &'static str,
    /// The reservation.
    pub requested: u64,
    /// The most that bound admits.
    pub most: u64,
    /// The most the global limits admit (a cluster share too small, `share_too_small`, only:
    /// then `most` is the share's bound and `global ≥ requested`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global: Option<u64>,
}

/// Slots, queue and, when configured, tokens and class figures.
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert_eq!(body.error.capacity.unwrap().max_concurrent, 0);
/// ```
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct CapacityBody {
    /// Slots in use.
    pub in_flight: u64,
    /// Waiters queued.
    pub pending: u64,
    /// The global concurrency limit.
    pub max_concurrent: u64,
    /// The queue bound.
    pub max_queue: u64,
    /// The budget figures (with a budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokensBody>,
    /// The shared remainder (with classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedBody>,
    /// The class's own figures (with classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<ClassBody>,
}

/// The global budget figures.
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert_eq!(body.error.capacity.unwrap().tokens.unwrap().budget, 10);
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
#[non_exhaustive]
pub struct TokensBody {
    /// The budget `B`.
    pub budget: u64,
    /// Tokens held in flight.
    pub in_flight: u64,
    /// The budget for the demand's priority.
    pub effective_budget: u64,
    /// What was available to the demand.
    pub available: u64,
    /// What the demand asked for.
    pub requested: u64,
}

/// The shared remainder of a classed bulkhead (absent without classes).
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert!(body.error.capacity.unwrap().shared.is_none());
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
#[non_exhaustive]
pub struct SharedBody {
    /// Slots.
    pub concurrency: crate::SharedAmount,
    /// Tokens (with a budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<crate::SharedAmount>,
}

/// A class's own figures (absent without classes).
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert!(body.error.capacity.unwrap().class.is_none());
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
#[non_exhaustive]
pub struct ClassBody {
    /// Its admissions in flight.
    pub in_flight: u64,
    /// Its concurrency floor.
    pub protected_concurrent: u64,
    /// The part of the floor in use.
    pub protected_concurrent_in_use: u64,
    /// Slots it borrows from the shared remainder.
    pub borrowed_concurrent: u64,
    /// Floor slots still free.
    pub available_protected_concurrent: u64,
    /// Its concurrency ceiling (when it has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    /// Slots left under the ceiling (when it has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_concurrent: Option<u64>,
    /// Its token figures (with a budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<ClassTokensBody>,
}

/// A class's token figures (with classes and a budget).
///
/// ```
/// use llm_bulkhead::tower::{Refusal, RefusalBody};
/// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(0).token_budget(10).build().unwrap();
/// let r = Refusal::Rejected(Box::new(b.try_acquire(llm_bulkhead::Demand::slot()).unwrap_err()));
/// let body = RefusalBody::of(&r);
/// assert!(body.error.capacity.unwrap().class.and_then(|c| c.tokens).is_none());
/// ```
#[derive(Clone, Copy, Debug, Serialize)]
#[non_exhaustive]
pub struct ClassTokensBody {
    /// Its tokens in flight.
    pub in_flight: u64,
    /// Its token floor.
    pub protected: u64,
    /// The part of the floor in use.
    pub protected_in_use: u64,
    /// Tokens it borrows.
    pub borrowed: u64,
    /// Floor tokens still free.
    pub available_protected: u64,
    /// Its token ceiling (when it has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// Tokens left under the ceiling (when it has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available: Option<u64>,
    /// What the demand asked for.
    pub requested: u64,
}

impl RefusalBody {
    /// The body describing `refusal`.
    ///
    /// ```
    /// use llm_bulkhead::tower::{ClassifyError, Refusal, RefusalBody};
    /// let body = RefusalBody::of(&Refusal::Unclassified(ClassifyError::bad_request("unknown_admission_class", "no class \"x\"")));
    /// assert_eq!((body.error.kind, body.error.reason.as_str()), ("invalid_request", "unknown_admission_class"));
    /// ```
    pub fn of(refusal: &Refusal) -> RefusalBody {
        let error = match refusal {
            Refusal::Unclassified(e) => RefusalError {
                kind: "invalid_request",
                code: e.code,
                reason: e.code.to_string(),
                message: e.message.clone(),
                limit: None,
                constraint: None,
                class: None,
                revision: None,
                capacity: None,
            },
            #[cfg(feature = "cluster")]
            Refusal::ShareLapsed => RefusalError {
                kind: "admission_rejected",
                code: SHARE_LAPSED_CODE,
                reason: SHARE_LAPSED_CODE.to_owned(),
                message: format!(
                    "{refusal}: this replica admits nothing until its agent installs a valid \
                     share (another replica may admit)"
                ),
                limit: None,
                constraint: None,
                class: None,
                revision: None,
                capacity: None,
            },
            #[cfg(feature = "cluster")]
            Refusal::ShareTooSmall(s) => {
                let mut e = rejected_error(&s.rejection, SHARE_TOO_SMALL_CODE);
                e.message = format!(
                    "{s}: the replica's share grows at a later renewal of its agent, or \
                     another replica may admit it (retry it)"
                );
                e.limit = Some(LimitBody {
                    name: s.limit.as_str(),
                    requested: s.requested,
                    most: s.share,
                    global: Some(s.global),
                });
                e
            }
            Refusal::Rejected(r) => rejected_error(r, refusal.code()),
        };
        RefusalBody { error }
    }
}

/// The `error` object of the bulkhead's refusal `r`, with `code`.
fn rejected_error(r: &Rejection, code: &'static str) -> RefusalError {
    let d = &r.detail();
    let classes = d.classes.as_deref();
    let never = r.never_fits();
    let mut message = r.to_string();
    if let Some(n) = never {
        message = format!(
            "{message}; a reservation of {} tokens can never fit: the {} admits at \
                         most {} tokens under the current limits (do not retry it; ask for \
                         fewer tokens)",
            n.requested,
            limit_words(n.limit),
            n.most
        );
    }
    RefusalError {
        kind: "admission_rejected",
        code,
        reason: r.reason.as_str().to_owned(),
        message,
        limit: never.map(|n| LimitBody {
            name: n.limit.as_str(),
            requested: n.requested,
            most: n.most,
            global: None,
        }),
        constraint: r.constraint.map(Constraint::as_str),
        class: classes.map(|c| c.class.id.clone()),
        revision: Some(r.revision),
        capacity: Some(CapacityBody {
            in_flight: d.in_flight,
            pending: d.pending,
            max_concurrent: d.max_concurrent,
            max_queue: d.max_queue,
            tokens: d.token_budget.map(|t| TokensBody {
                budget: t.budget,
                in_flight: t.in_flight_tokens,
                effective_budget: t.effective_budget,
                available: t.available,
                requested: t.requested,
            }),
            shared: classes.map(|c| SharedBody {
                concurrency: c.shared.concurrency,
                tokens: c.shared.token_budget,
            }),
            class: classes.map(|c| {
                let k = &c.class;
                ClassBody {
                    in_flight: k.in_flight,
                    protected_concurrent: k.protected_concurrent,
                    protected_concurrent_in_use: k.protected_concurrent_in_use,
                    borrowed_concurrent: k.borrowed_concurrent,
                    available_protected_concurrent: k.available_protected_concurrent,
                    max_concurrent: k.max_concurrent,
                    available_concurrent: k.available_concurrent,
                    tokens: k.token_budget.map(|t| ClassTokensBody {
                        in_flight: t.in_flight_tokens,
                        protected: t.protected_tokens,
                        protected_in_use: t.protected_tokens_in_use,
                        borrowed: t.borrowed_tokens,
                        available_protected: t.available_protected_tokens,
                        max: t.max_tokens,
                        available: t.available,
                        requested: t.requested,
                    }),
                }
            }),
        }),
    }
}

/// The bound, in a sentence.
fn limit_words(limit: FitLimit) -> &'static str {
    match limit {
        FitLimit::EffectiveBudget => "effective token budget",
        FitLimit::ClassMaxTokens => "class's token ceiling (max_tokens)",
        FitLimit::ClassReach => "class's token floor plus the shared token remainder",
    }
}

/// The counter of the layer's refusals by status and code (feature `metrics`; see
/// [`HTTP_REFUSALS`]).
#[cfg(feature = "metrics")]
pub(crate) struct HttpRefusals {
    name: Option<String>,
    /// The bulkhead's refusals, registered when the layer is built: one per
    /// [`RejectReason::COUNTED`] reason, then `unknown_class`, then a reservation that can
    /// never fit, then (feature `cluster`) `share_lapsed` and `share_too_small`. Classifier refusals (client errors, rarer) are looked up when they happen.
    bulkhead: Vec<metrics::Counter>,
}

/// `llm_bulkhead_http_refusals_total{status, code}` (with `bulkhead` when the layer is
/// named): every refusal a layer built with
/// [`record_metrics`](super::BulkheadLayerBuilder::record_metrics) answers, by HTTP status
/// and [`Refusal::code`] (400s of the classifier, 413s of reservations that can never fit,
/// 429s and 503s of the bulkhead, and with the feature `cluster` the 503s `share_lapsed` and
/// `share_too_small` of a layer over a cluster share). A gateway counts its own refusals made before the layer
/// (an unreadable body, ...) with [`count_http_refusal`].
///
/// ```
/// assert_eq!(llm_bulkhead::tower::HTTP_REFUSALS, "llm_bulkhead_http_refusals_total");
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub const HTTP_REFUSALS: &str = "llm_bulkhead_http_refusals_total";

/// Adds one to [`HTTP_REFUSALS`] for a refusal with `status` and `code`, labelled
/// `bulkhead = name` when given (as the layer's own).
///
/// ```
/// llm_bulkhead::tower::count_http_refusal(Some("gateway"), http::StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn count_http_refusal(name: Option<&str>, status: StatusCode, code: &'static str) {
    http_refusals(name, status, code).increment(1);
}

#[cfg(feature = "metrics")]
fn http_refusals(name: Option<&str>, status: StatusCode, code: &'static str) -> metrics::Counter {
    let mut labels = vec![
        metrics::Label::new("status", status.as_str().to_owned()),
        metrics::Label::from_static_parts("code", code),
    ];
    if let Some(n) = name {
        labels.push(metrics::Label::new("bulkhead", n.to_owned()));
    }
    metrics::counter!(HTTP_REFUSALS, labels)
}

#[cfg(feature = "metrics")]
impl HttpRefusals {
    pub(crate) fn new(name: Option<&str>) -> HttpRefusals {
        let mut bulkhead: Vec<metrics::Counter> = RejectReason::COUNTED
            .iter()
            .chain([&RejectReason::UnknownClass])
            .map(|&reason| http_refusals(name, reason_status(reason), reason.as_str()))
            .collect();
        bulkhead.push(http_refusals(
            name,
            StatusCode::PAYLOAD_TOO_LARGE,
            NEVER_FITS_CODE,
        ));
        // The cluster refusals come in runs (a learning table refuses every token request of
        // a replica for `ttl + quarantine`): registered here, not looked up per refusal.
        #[cfg(feature = "cluster")]
        for code in [SHARE_LAPSED_CODE, SHARE_TOO_SMALL_CODE] {
            bulkhead.push(http_refusals(name, StatusCode::SERVICE_UNAVAILABLE, code));
        }
        HttpRefusals {
            name: name.map(str::to_owned),
            bulkhead,
        }
    }

    /// Counts `refusal` (the status and code its response has).
    pub(crate) fn count(&self, refusal: &Refusal) {
        let i = match refusal {
            Refusal::Unclassified(e) => {
                return count_http_refusal(self.name.as_deref(), e.status, e.code);
            }
            #[cfg(feature = "cluster")]
            Refusal::ShareLapsed => self.bulkhead.len() - 2,
            #[cfg(feature = "cluster")]
            Refusal::ShareTooSmall(_) => self.bulkhead.len() - 1,
            Refusal::Rejected(r) if r.never_fits().is_some() => RejectReason::COUNTED.len() + 1,
            Refusal::Rejected(r) if r.reason == RejectReason::UnknownClass => {
                RejectReason::COUNTED.len()
            }
            Refusal::Rejected(r) => r.reason.index(),
        };
        self.bulkhead[i].increment(1);
    }
}
