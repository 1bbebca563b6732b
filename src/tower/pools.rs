//! Routing through gateway [`pools`](crate::pools): [`PoolsLayer`] classifies each request to
//! a partition, admits it there (or on an approved fallback, or after a bounded wait in the
//! partition's pending queue, as the class's overflow action says), tells the inner service
//! which partition and provider it was given ([`PoolAssignment`], a request extension), and
//! holds the permit until the last byte of the response body, as the bulkhead layer does.
//!
//! * The decision is made in `call`; `poll_ready` only forwards the inner service's readiness.
//! * The settings (the pools, the classifier) sit behind one `Arc`: every clone and every
//!   `layer()` call routes through the same pools.
//! * A refused request never reaches the inner service: it is answered with 429 (a full
//!   partition, queue or budget), 503 (the class's degraded action, unless the gateway
//!   serves its own documented degraded result: [`PoolsLayer::degrade_with`]) or 400 (a
//!   request the classifier cannot place), with a JSON body naming the reason and every
//!   decision of its route.
//! * Every response carries `x-pool-route`: the decisions made for it, in order, as
//!   `partition:decision:reason` joined by commas.
//! * The permit ends at the body's end, error or drop; a response whose status says the
//!   provider was overloaded (429, 503, 529) or failed (another 5xx) completes with that
//!   failure class. Dropping the response future cancels a wait in the queue.
//!
//! ```
//! use llm_bulkhead::pools::{Pools, PoolsConfig};
//! use llm_bulkhead::tower::{HeaderPoolClassifier, PoolAssignment, PoolsLayer};
//! use std::sync::Arc;
//! use tower::{Service, ServiceExt};
//! use tower_layer::Layer;
//!
//! let pools = Arc::new(Pools::new(&PoolsConfig::single("primary", "interactive", 4))?);
//! let layer = PoolsLayer::new(pools.clone(), HeaderPoolClassifier::new());
//! let mut svc = layer.layer(tower::service_fn(|req: http::Request<()>| async move {
//!     let to = req.extensions().get::<PoolAssignment>().unwrap().provider.clone();
//!     let body = http_body_util::Full::<bytes::Bytes>::from(to);
//!     Ok::<_, std::convert::Infallible>(http::Response::new(body))
//! }));
//! let req = http::Request::builder()
//!     .header("x-provider", "primary")
//!     .header("x-traffic-class", "interactive")
//!     .body(())?;
//! let resp = futures_lite::future::block_on(async { svc.ready().await?.call(req).await })?;
//! assert_eq!(resp.headers()["x-pool-route"], "primary-interactive:dispatch:capacity_available");
//! assert_eq!(pools.stats().partitions[0].active, 1); // held until the body ends
//! drop(resp);
//! assert_eq!(pools.stats().partitions[0].active, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::body::{Held, Hold};
use super::AdmittedBody;
use crate::pools::{
    Classification, Decision, FailureClass, PoolOutcome, PoolRequest, Pools, Route, RouteError,
};
use crate::Priority;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower_layer::Layer;
use tower_service::Service;

/// Places a request in the pools: its partition, priority, tokens and whether it may fall
/// back. Any `Fn(&Pools, &Parts) -> Result<PoolRequest, RouteError>` is one.
///
/// ```
/// use llm_bulkhead::pools::{Classification, PoolRequest, Pools};
/// use llm_bulkhead::tower::PoolClassify;
/// fn all_primary(pools: &Pools, _: &http::request::Parts) -> Result<PoolRequest, llm_bulkhead::pools::RouteError> {
///     Ok(PoolRequest::new(0, pools.classify(&Classification::new("primary", "interactive"))?))
/// }
/// fn takes(_: impl PoolClassify) {}
/// takes(all_primary);
/// ```
pub trait PoolClassify: Send + Sync + 'static {
    /// The request's place in `pools`.
    ///
    /// # Errors
    /// A [`RouteError`] (an unknown provider or class): the request is answered with 400.
    fn classify(&self, pools: &Pools, parts: &Parts) -> Result<PoolRequest, RouteError>;
}

impl<F> PoolClassify for F
where
    F: Fn(&Pools, &Parts) -> Result<PoolRequest, RouteError> + Send + Sync + 'static,
{
    fn classify(&self, pools: &Pools, parts: &Parts) -> Result<PoolRequest, RouteError> {
        self(pools, parts)
    }
}

/// A classifier that reads headers: `x-provider`, `x-traffic-class`, optionally
/// `x-model-family` and `x-tenant-tier` (the partition, through [`Pools::classify`]),
/// `x-priority: high`, `x-allow-fallback: false`, and `x-request-id` (a number; else the
/// request gets the next number of a counter). Defaults stand in for a missing provider or
/// class. The headers must be trusted (put the layer inside authentication).
///
/// ```
/// use llm_bulkhead::tower::HeaderPoolClassifier;
/// let c = HeaderPoolClassifier::new().default_provider("primary").default_class("batch");
/// # let _ = c;
/// ```
#[derive(Debug, Default)]
pub struct HeaderPoolClassifier {
    default_provider: Option<String>,
    default_class: Option<String>,
    next_id: crate::sync::AtomicU64,
}

impl HeaderPoolClassifier {
    /// A classifier with no defaults: a request without `x-provider` or `x-traffic-class` is
    /// refused with 400.
    ///
    /// ```
    /// let c = llm_bulkhead::tower::HeaderPoolClassifier::new();
    /// # let _ = c;
    /// ```
    pub fn new() -> Self {
        HeaderPoolClassifier::default()
    }

    /// The provider of a request without `x-provider`.
    ///
    /// ```
    /// let c = llm_bulkhead::tower::HeaderPoolClassifier::new().default_provider("primary");
    /// # let _ = c;
    /// ```
    #[must_use]
    pub fn default_provider(mut self, provider: &str) -> Self {
        self.default_provider = Some(provider.to_owned());
        self
    }

    /// The traffic class of a request without `x-traffic-class`.
    ///
    /// ```
    /// let c = llm_bulkhead::tower::HeaderPoolClassifier::new().default_class("interactive");
    /// # let _ = c;
    /// ```
    #[must_use]
    pub fn default_class(mut self, class: &str) -> Self {
        self.default_class = Some(class.to_owned());
        self
    }
}

impl PoolClassify for HeaderPoolClassifier {
    fn classify(&self, pools: &Pools, parts: &Parts) -> Result<PoolRequest, RouteError> {
        let h = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let provider = h("x-provider").or(self.default_provider.as_deref());
        let class = h("x-traffic-class").or(self.default_class.as_deref());
        let provider = provider.ok_or_else(|| RouteError::UnknownProvider(String::new()))?;
        let class = class.ok_or_else(|| RouteError::UnknownClass(String::new()))?;
        let mut c = Classification::new(provider, class);
        if let Some(m) = h("x-model-family") {
            c = c.model_family(m);
        }
        if let Some(t) = h("x-tenant-tier") {
            c = c.tenant_tier(t);
        }
        let id = match h("x-request-id").and_then(|v| v.parse().ok()) {
            Some(id) => id,
            None => self.next_id.fetch_add(1, crate::sync::Ordering::Relaxed),
        };
        let mut req = PoolRequest::new(id, pools.classify(&c)?);
        if h("x-priority").is_some_and(|p| p.eq_ignore_ascii_case("high")) {
            req.priority = Priority::High;
        }
        req.allow_fallback = h("x-allow-fallback").is_none_or(|v| v != "false");
        Ok(req)
    }
}

/// Where the pools sent a request: a request extension the inner service reads to call the
/// right provider (a fallback may have moved it to another provider).
///
/// ```
/// use llm_bulkhead::tower::PoolAssignment;
/// let a = PoolAssignment { partition: "p-c".into(), provider: "p".into(), attempt: 1 };
/// assert_eq!(a.provider, "p");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolAssignment {
    /// The partition that admitted it.
    pub partition: String,
    /// That partition's provider: the one to call.
    pub provider: String,
    /// Its attempt number (1: the partition it was classified to).
    pub attempt: u32,
}

/// The class's degraded result, served when the pools answer `degrade` (module docs): any
/// `Fn(&Pools, &Parts, &Route) -> Response<Bytes>` is one. It sees the request's head and
/// every decision of its route, and runs on the request's task after the decision, holding no
/// capacity (a degraded request was admitted nowhere).
///
/// ```
/// use bytes::Bytes;
/// use llm_bulkhead::pools::{Pools, Route};
/// use llm_bulkhead::tower::PoolDegrade;
/// fn busy(_: &Pools, _: &http::request::Parts, _: &Route) -> http::Response<Bytes> {
///     http::Response::new(Bytes::from_static(b"{\"answer\":\"try again shortly\"}"))
/// }
/// fn takes(_: impl PoolDegrade) {}
/// takes(busy);
/// ```
pub trait PoolDegrade: Send + Sync + 'static {
    /// The response served instead of calling the provider.
    fn degraded(&self, pools: &Pools, parts: &Parts, route: &Route) -> Response<Bytes>;
}

impl<F> PoolDegrade for F
where
    F: Fn(&Pools, &Parts, &Route) -> Response<Bytes> + Send + Sync + 'static,
{
    fn degraded(&self, pools: &Pools, parts: &Parts, route: &Route) -> Response<Bytes> {
        self(pools, parts, route)
    }
}

#[derive(Clone)]
struct Settings {
    pools: Arc<Pools>,
    classifier: Arc<dyn PoolClassify>,
    wait: Option<Duration>,
    /// `None`: a degraded request gets the 503 JSON body.
    degrade: Option<Arc<dyn PoolDegrade>>,
}

/// A tower `Layer` that routes every request through gateway pools (module docs).
///
/// ```
/// use llm_bulkhead::pools::{Pools, PoolsConfig};
/// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer};
/// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
/// let layer = PoolsLayer::new(pools, HeaderPoolClassifier::new());
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PoolsLayer {
    settings: Arc<Settings>,
}

impl PoolsLayer {
    /// A layer over `pools`, placing requests with `classifier`. A class that waits waits at
    /// most its partition's queue age.
    ///
    /// ```
    /// use llm_bulkhead::pools::{Pools, PoolsConfig};
    /// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer};
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let layer = PoolsLayer::new(pools.clone(), HeaderPoolClassifier::new().default_provider("p"));
    /// assert!(std::sync::Arc::ptr_eq(layer.pools(), &pools));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(pools: Arc<Pools>, classifier: impl PoolClassify) -> PoolsLayer {
        PoolsLayer {
            settings: Arc::new(Settings {
                pools,
                classifier: Arc::new(classifier),
                wait: None,
                degrade: None,
            }),
        }
    }

    /// A request waits at most `d` in a pending queue (its deadline: the nearer of this and
    /// its partition's queue age).
    ///
    /// ```
    /// use llm_bulkhead::pools::{Pools, PoolsConfig};
    /// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer};
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let layer = PoolsLayer::new(pools, HeaderPoolClassifier::new())
    ///     .wait_at_most(std::time::Duration::from_secs(2));
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn wait_at_most(self, d: Duration) -> PoolsLayer {
        PoolsLayer {
            settings: Arc::new(Settings {
                wait: Some(d),
                ..(*self.settings).clone()
            }),
        }
    }

    /// Serves `degrade`'s response to a request whose class's overflow action is `degrade`
    /// and that no partition admitted (the seed's "documented degraded result"), instead of
    /// the default 503 with a JSON body. Its status, headers and body are the caller's; the
    /// layer adds only `x-pool-route`. Refusals (429) and unplaced requests (400) are
    /// unchanged.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use llm_bulkhead::pools::{Pools, PoolsConfig};
    /// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer};
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let layer = PoolsLayer::new(pools, HeaderPoolClassifier::new()).degrade_with(
    ///     |_: &Pools, _: &http::request::Parts, _: &llm_bulkhead::pools::Route| {
    ///         http::Response::new(Bytes::from_static(b"a cached answer"))
    ///     },
    /// );
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn degrade_with(self, degrade: impl PoolDegrade) -> PoolsLayer {
        PoolsLayer {
            settings: Arc::new(Settings {
                degrade: Some(Arc::new(degrade)),
                ..(*self.settings).clone()
            }),
        }
    }

    /// The pools it routes through.
    ///
    /// ```
    /// use llm_bulkhead::pools::{Pools, PoolsConfig};
    /// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer};
    /// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
    /// let layer = PoolsLayer::new(pools, HeaderPoolClassifier::new());
    /// assert_eq!(layer.pools().stats().partitions.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pools(&self) -> &Arc<Pools> {
        &self.settings.pools
    }
}

impl fmt::Debug for PoolsLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolsLayer")
            .field("pools", &self.settings.pools)
            .field("wait", &self.settings.wait)
            .field("degrade_with", &self.settings.degrade.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for PoolsLayer {
    type Service = PoolsService<S>;

    fn layer(&self, inner: S) -> PoolsService<S> {
        PoolsService {
            inner,
            settings: self.settings.clone(),
        }
    }
}

/// The service of a [`PoolsLayer`].
///
/// ```
/// use llm_bulkhead::pools::{Pools, PoolsConfig};
/// use llm_bulkhead::tower::{HeaderPoolClassifier, PoolsLayer, PoolsService};
/// use tower_layer::Layer;
/// let pools = std::sync::Arc::new(Pools::new(&PoolsConfig::single("p", "c", 1))?);
/// let svc: PoolsService<()> = PoolsLayer::new(pools, HeaderPoolClassifier::new()).layer(());
/// # let _ = svc;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PoolsService<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S: fmt::Debug> fmt::Debug for PoolsService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolsService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The response future of a [`PoolsService`] (boxed: it may wait in a pending queue).
///
/// # Cancel safety
///
/// Dropping it leaves the queue or gives the permit back; nothing leaks.
pub type PoolsFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<AdmittedBody<B>>, E>> + Send>>;

impl<S, RB, B> Service<Request<RB>> for PoolsService<S>
where
    S: Service<Request<RB>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    RB: Send + 'static,
    B: Body + Send + 'static,
    B::Data: From<Bytes>,
{
    type Response = Response<AdmittedBody<B>>;
    type Error = S::Error;
    type Future = PoolsFuture<B, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<RB>) -> Self::Future {
        // The ready service goes with this call; a clone takes its place (tower's pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = self.settings.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let pools = &settings.pools;
            let preq = match settings.classifier.classify(pools, &parts) {
                Ok(r) => r,
                Err(e) => return Ok(unplaced(&e)),
            };
            let deadline = settings.wait.map(|d| Instant::now() + d);
            let (permit, route) = match pools.admit_async(preq, deadline).await {
                PoolOutcome::Dispatched { permit, route } => (permit, route),
                PoolOutcome::Degraded { route } => {
                    return Ok(match &settings.degrade {
                        Some(d) => degraded(pools, &route, d.degraded(pools, &parts, &route)),
                        None => refused(pools, &route, StatusCode::SERVICE_UNAVAILABLE),
                    })
                }
                PoolOutcome::Rejected { route } => {
                    return Ok(refused(pools, &route, StatusCode::TOO_MANY_REQUESTS))
                }
            };
            let at = permit.partition();
            let Ok(permit) = permit.into_owned(pools) else {
                unreachable!("a permit of these pools")
            };
            parts.extensions.insert(PoolAssignment {
                partition: pools.name(at).to_owned(),
                provider: pools.provider_of(at).to_owned(),
                attempt: route.attempts(),
            });
            let trail = route_header(pools, &route);
            // An inner error drops the permit: it completes as `Dropped`.
            let resp = inner.call(Request::from_parts(parts, body)).await?;
            let failure = failure_of(resp.status());
            let (mut head, body) = resp.into_parts();
            if let Some(v) = trail {
                head.headers.insert(ROUTE, v);
            }
            let held = Held {
                hold: Hold::Pool(permit, failure),
                hook: None,
                #[cfg(feature = "metrics")]
                _timer: None,
                #[cfg(feature = "cluster")]
                _ticket: None,
            };
            // A body already at its end (204, 304, HEAD) ends the permit now.
            let held = if body.is_end_stream() {
                held.finish();
                None
            } else {
                Some(held)
            };
            Ok(Response::from_parts(head, AdmittedBody::held(body, held)))
        })
    }
}

/// The header that lists a request's decisions.
const ROUTE: HeaderName = HeaderName::from_static("x-pool-route");

fn failure_of(status: StatusCode) -> Option<FailureClass> {
    match status.as_u16() {
        429 | 503 | 529 => Some(FailureClass::UpstreamOverload),
        500..=599 => Some(FailureClass::UpstreamError),
        _ => None,
    }
}

/// `partition:decision:reason`, comma-joined (`None` if a configured name is not a valid
/// header value).
fn route_header(pools: &Pools, route: &Route) -> Option<HeaderValue> {
    let text: Vec<String> = route
        .decisions()
        .iter()
        .map(|d| {
            let name = pools.name(d.partition);
            format!("{name}:{}:{}", d.decision.as_str(), d.reason.as_str())
        })
        .collect();
    HeaderValue::from_str(&text.join(",")).ok()
}

fn json_response<B>(status: StatusCode, body: &serde_json::Value) -> Response<AdmittedBody<B>> {
    let mut resp = Response::new(AdmittedBody::refusal(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn refused<B>(pools: &Pools, route: &Route, status: StatusCode) -> Response<AdmittedBody<B>> {
    let decisions: Vec<serde_json::Value> = route
        .decisions()
        .iter()
        .map(|d| {
            serde_json::json!({
                "partition": pools.name(d.partition),
                "decision": d.decision,
                "reason": d.reason,
                "attempt": d.attempt,
                "limit_version": d.limit_version,
            })
        })
        .collect();
    let last = route.decisions().last().copied();
    let reason = route
        .ended_by
        .or(last.map(|d| d.reason))
        .map_or("unknown", |r| r.as_str());
    let degraded = last.is_some_and(|d| d.decision == Decision::Degrade);
    let body = serde_json::json!({ "error": {
        "type": if degraded { "degraded" } else { "pool_overloaded" },
        "code": "bulkhead_overloaded",
        "reason": reason,
        "message": format!("no partition admitted the request: {reason}"),
        "route": decisions,
    }});
    let mut resp = json_response(status, &body);
    if let Some(v) = route_header(pools, route) {
        resp.headers_mut().insert(ROUTE, v);
    }
    resp
}

/// The user's degraded response, with the route header added.
fn degraded<B>(pools: &Pools, route: &Route, resp: Response<Bytes>) -> Response<AdmittedBody<B>> {
    let (mut head, body) = resp.into_parts();
    if let Some(v) = route_header(pools, route) {
        head.headers.insert(ROUTE, v);
    }
    Response::from_parts(head, AdmittedBody::refusal(body))
}

fn unplaced<B>(e: &RouteError) -> Response<AdmittedBody<B>> {
    let body = serde_json::json!({ "error": {
        "type": "invalid_request",
        "code": "unknown_route",
        "reason": "unknown_route",
        "message": e.to_string(),
    }});
    json_response(StatusCode::BAD_REQUEST, &body)
}
