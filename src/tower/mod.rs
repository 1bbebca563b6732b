//! A tower `Layer` for HTTP gateways (feature `tower`): every request
//! is admitted by a [`Bulkhead`] before it reaches the inner service, and the admission is held
//! until the **last byte of the response body** (contract §11).
//!
//! ```
//! use llm_bulkhead::tower::{BulkheadLayer, HeaderClassifier};
//! use llm_bulkhead::{Bulkhead, ClassLimits};
//! use tower_layer::Layer;
//!
//! let bulkhead = Bulkhead::builder().max_concurrent(64).token_budget(200_000)
//!     .class("interactive", ClassLimits { protected_concurrent: 16, ..Default::default() })
//!     .class("batch", ClassLimits { max_concurrent: Some(8), ..Default::default() })
//!     .default_class("interactive")
//!     .build()?;
//! let classify = HeaderClassifier::new(&bulkhead).class_header("x-traffic-class");
//! let layer = BulkheadLayer::new(bulkhead.clone(), classify);
//! # let inner = tower::service_fn(|_: http::Request<()>| async { Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new())) });
//! let service = layer.layer(inner);
//! # let _ = service;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What it does
//!
//! * **One limit per bulkhead.** The layer keeps its settings behind one `Arc` made when the
//!   layer is built, and a [`Bulkhead`] is itself a shared handle: any number of `layer()`
//!   calls and clones enforce one limit. (tower's `ConcurrencyLimitLayer` applied to an axum
//!   route makes a semaphore per clone, so it limits nothing: tokio-rs/axum#2582.)
//! * **The decision is made in `call`**, from a [`Classify`] over the request's parts (class,
//!   priority, tokens; an extension can carry a [`TokenEstimate`] or a whole
//!   [`Demand`](crate::Demand); `estimate_json`, with the `llm` feature, makes that estimate
//!   from a JSON body a middleware has read). `poll_ready` only forwards the inner service's readiness and
//!   never waits on the bulkhead, so an idle keep-alive connection holds nothing.
//! * **The admission lasts until the body ends**: the response's body is an [`AdmittedBody`]
//!   that releases at its end, on a body error, or when dropped (a client that disconnects).
//!   A body already at its end (204, 304, `HEAD`) releases at once.
//!   [`ReleaseAt::Headers`] releases when the response head is produced instead, for
//!   non-streaming services whose bodies are cheap to send.
//! * **Usage on the way**: a [`UsageHook`] (such as [`openai_usage`]) looks at body frames; a
//!   final usage chunk reports usage with a reconciliation, so the unused tokens go back to the
//!   budget before the stream closes, while the slot stays held to the end.
//! * **Refusals**: by default ([`Respond`]) a ready response: 429 for capacity, 413 for a
//!   reservation the current limits could never admit ([`Rejection::never_fits`](crate::Rejection::never_fits): retrying
//!   it is useless), 503 for a closed bulkhead, a JSON [`RefusalBody`] shaped as OpenAI's
//!   errors (with `code`), no `Retry-After` (contract §8; a layer over a cluster share,
//!   feature `cluster`, answers 503 `share_lapsed`, and 503 `share_too_small` with the
//!   renewal period as `Retry-After` where the share, not the global limits, is too small for
//!   the reservation: see `Refusal::ShareTooSmall`); the service keeps
//!   the inner error type, so axum needs no `HandleErrorLayer`. With
//!   [`refuse_with_error`](BulkheadLayer::refuse_with_error) ([`Fail`]) a [`Refused`] error.
//!   Either way a refused request never reaches the inner service.
//! * **Cancellation**: dropping the response future releases the admission (or leaves the
//!   queue); see [`ResponseFuture`].
//! * **Observe mode** ([`BulkheadLayerBuilder::observe`], feature `llm`): refused requests go
//!   through without an admission and are counted as bypasses, for rolling limits out.
//! * **Fail-fast by default**: `try_acquire`. [`BulkheadLayerBuilder::wait_in_queue`] waits in
//!   the bulkhead's bounded FIFO queue instead (boxed, with a timeout).
//!
//! # Where it goes in a stack
//!
//! Inside authentication (the class header must be trusted) and request tracing, outside the
//! provider call. A `TimeoutLayer` *outside* the bulkhead layer cancels the response future,
//! which releases the admission while the provider may still be generating: the crate's
//! [`guide`](crate::guide) says what to do about it.
//!
//! # Cost
//!
//! Without I/O the layer adds one `try_acquire`, one release and one classifier call to a
//! request, and no allocation unless a queue wait is asked for; `benches/layer.rs` measures it
//! next to tower's `ConcurrencyLimit`.

mod body;
mod classify;
mod future;
#[cfg(feature = "metrics")]
mod metrics;
mod pools;
mod refusal;

pub use body::{openai_usage, AdmittedBody, UsageHook, UsageUpdate};
#[cfg(feature = "llm")]
pub use classify::estimate_json;
pub use classify::{Classify, ClassifyError, HeaderClassifier, SlotPerRequest, TokenEstimate};
pub use future::ResponseFuture;
pub use pools::{
    HeaderPoolClassifier, PoolAssignment, PoolClassify, PoolDegrade, PoolsFuture, PoolsLayer,
    PoolsService,
};
#[cfg(feature = "metrics")]
pub use refusal::{count_http_refusal, HTTP_REFUSALS};
pub use refusal::{
    CapacityBody, ClassBody, ClassTokensBody, Fail, LimitBody, Refusal, RefusalBody, RefusalError,
    RefusalMode, Refused, Respond, SharedBody, TokensBody,
};

use crate::{Admission, Bulkhead, WaitOptions};
use body::Held;
use http::{Request, Response};
use http_body::Body;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// When the admission of a response ends.
///
/// ```
/// use llm_bulkhead::tower::ReleaseAt;
/// assert_eq!(ReleaseAt::default(), ReleaseAt::EndOfBody);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReleaseAt {
    /// When the body ends, fails or is dropped (the default: a stream holds its slot and
    /// tokens until its last chunk).
    #[default]
    EndOfBody,
    /// When the inner service produces the response head. For services whose bodies are
    /// already complete or cheap: a stream would then run outside the limit.
    Headers,
}

/// The settings every clone of a layer and of its services shares.
pub(crate) struct Settings {
    bulkhead: Bulkhead,
    classifier: Box<dyn Classify>,
    release_at: ReleaseAt,
    wait: Option<Option<Duration>>,
    hook: Option<UsageHook>,
    #[cfg(feature = "metrics")]
    metrics: Option<metrics::LayerMetrics>,
    #[cfg(feature = "metrics")]
    refusals: Option<refusal::HttpRefusals>,
    /// The cluster share's window and deadline (`None`: not cluster-managed), see
    /// [`BulkheadLayer::clustered`].
    #[cfg(feature = "cluster")]
    window: Option<crate::cluster::ClusterWindow>,
    /// Observe mode: the shadow reasons, and the bulkhead's observe-mode counters.
    #[cfg(feature = "llm")]
    observe: Option<(
        crate::llm::ShadowReasons,
        std::sync::Arc<crate::llm::observe::stats::ObserveCounters>,
    )>,
}

impl Settings {
    /// Holds a committed admission; on a cluster-managed bulkhead, after the share's window
    /// check (a lapsed share gives the admission back at once).
    #[inline]
    fn hold(&self, admission: Admission) -> Result<Held, Refusal> {
        #[cfg(feature = "cluster")]
        let ticket = match &self.window {
            None => None,
            Some(w) => Some(w.check().map_err(|_| Refusal::ShareLapsed)?),
        };
        Ok(Held {
            #[cfg(feature = "metrics")]
            _timer: self.metrics.as_ref().map(|m| m.timer(admission.class())),
            hold: body::Hold::Admitted(admission),
            hook: self.hook.clone(),
            #[cfg(feature = "cluster")]
            _ticket: ticket,
        })
    }

    /// Observe mode: the refusal of `demand` for a shadow reason becomes a bypass (counted,
    /// reported, holding nothing), unless the bulkhead is closed (never bypassed).
    #[cfg(feature = "llm")]
    #[cold]
    fn bypass(
        &self,
        demand: &crate::Demand,
        rejection: crate::Rejection,
        counters: &std::sync::Arc<crate::llm::observe::stats::ObserveCounters>,
        raced: bool,
    ) -> Result<Held, Refusal> {
        let wait = WaitOptions::default();
        if let Some(hard) = crate::llm::observe::hard_refusal(&self.bulkhead, demand, &wait) {
            return Err(Refusal::Rejected(Box::new(hard)));
        }
        let bypassed = crate::llm::observe::Bypassed::begin(
            &self.bulkhead,
            counters,
            demand,
            rejection,
            raced,
        );
        Ok(Held {
            #[cfg(feature = "metrics")]
            _timer: self.metrics.as_ref().map(|m| m.timer(bypassed.class)),
            hold: body::Hold::Bypassed(bypassed),
            hook: self.hook.clone(),
            #[cfg(feature = "cluster")]
            _ticket: None,
        })
    }

    /// The fail-fast decision: an admission, a bypass (observe mode), or a refusal.
    #[inline]
    fn decide(&self, demand: crate::Demand) -> Result<Held, Refusal> {
        #[cfg(feature = "llm")]
        if let Some((shadow, counters)) = &self.observe {
            // As `LlmBulkhead::run` in observe mode: the advisory check first (a refusal for a
            // shadow reason bypasses, uncounted as a rejection), then the real decision (a
            // refusal for a shadow reason, counted, bypasses with `raced`).
            let advised = match self.bulkhead.would_admit(&demand) {
                crate::Advice::Refuse(r) if shadow.contains(r.reason) => {
                    return self.bypass(&demand, r, counters, false)
                }
                advice => advice.admits(),
            };
            return match self.bulkhead.try_acquire(demand) {
                Ok(a) => self.hold(a),
                Err(r) if shadow.contains(r.reason) => self.bypass(&demand, r, counters, advised),
                Err(r) => Err(self.rejected(&demand, r)),
            };
        }
        match self.bulkhead.try_acquire(demand) {
            Ok(a) => self.hold(a),
            Err(r) => Err(self.rejected(&demand, r)),
        }
    }

    /// The refusal of the bulkhead's `rejection` of `demand`: on a cluster-managed bulkhead, a
    /// reservation the share can never hold but the global limits can is
    /// `Refusal::ShareTooSmall` (503 with `Retry-After`), not a 413.
    #[cold]
    fn rejected(&self, _demand: &crate::Demand, rejection: crate::Rejection) -> Refusal {
        #[cfg(feature = "cluster")]
        if let Some(w) = &self.window {
            return match w.judge(_demand, rejection) {
                Ok(s) => Refusal::ShareTooSmall(s),
                Err(r) => Refusal::Rejected(Box::new(r)),
            };
        }
        Refusal::Rejected(Box::new(rejection))
    }

    /// Counts `refusal` in [`HTTP_REFUSALS`] (when metrics are recorded) and passes it on.
    #[cold]
    fn refused(&self, refusal: Refusal) -> Refusal {
        #[cfg(feature = "metrics")]
        if let Some(c) = &self.refusals {
            c.count(&refusal);
        }
        refusal
    }

    fn record_wait(&self, _started: std::time::Instant) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.record_wait(_started);
        }
    }
}

#[inline]
fn wrap<B: Body>(
    release_at: ReleaseAt,
    resp: Response<B>,
    held: Option<Held>,
) -> Response<AdmittedBody<B>> {
    resp.map(|body| {
        let held = match (release_at, held) {
            (_, None) => None,
            (ReleaseAt::Headers, Some(h)) => {
                h.finish();
                None
            }
            (ReleaseAt::EndOfBody, Some(h)) if body.is_end_stream() => {
                h.finish();
                None
            }
            (ReleaseAt::EndOfBody, held) => held,
        };
        AdmittedBody::held(body, held)
    })
}

/// Builds a [`BulkheadLayer`].
///
/// ```
/// use llm_bulkhead::tower::{openai_usage, BulkheadLayer, ReleaseAt, SlotPerRequest};
/// use std::time::Duration;
/// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::builder().max_concurrent(4).max_queue(8).build().unwrap())
///     .classifier(SlotPerRequest)
///     .release_at(ReleaseAt::EndOfBody)
///     .usage_from_frames(openai_usage)
///     .wait_in_queue(Some(Duration::from_secs(2)))
///     .build();
/// # let _ = layer;
/// ```
#[must_use]
pub struct BulkheadLayerBuilder {
    settings: Settings,
}

impl BulkheadLayerBuilder {
    /// The classifier (default [`SlotPerRequest`]).
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, HeaderClassifier};
    /// let b = llm_bulkhead::Bulkhead::new(2).unwrap();
    /// let layer = BulkheadLayer::builder(b.clone()).classifier(HeaderClassifier::new(&b)).build();
    /// # let _ = layer;
    /// ```
    pub fn classifier(mut self, classifier: impl Classify) -> Self {
        self.settings.classifier = Box::new(classifier);
        self
    }

    /// When admissions end (default [`ReleaseAt::EndOfBody`]).
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, ReleaseAt};
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(2).unwrap()).release_at(ReleaseAt::Headers).build();
    /// # let _ = layer;
    /// ```
    pub fn release_at(mut self, at: ReleaseAt) -> Self {
        self.settings.release_at = at;
        self
    }

    /// Runs `hook` on the first chunk of every data frame of a held body; what it returns is
    /// reported as usage ([`Admission::report_usage`]). [`openai_usage`] reads a final
    /// `usage` object, so the unused reservation is refunded before the stream ends.
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, UsageUpdate};
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(2).unwrap())
    ///     .usage_from_frames(|frame: &[u8]| frame.starts_with(b"done").then(|| UsageUpdate::last(llm_bulkhead::Usage::new(1, 1))))
    ///     .build();
    /// # let _ = layer;
    /// ```
    pub fn usage_from_frames(
        mut self,
        hook: impl Fn(&[u8]) -> Option<UsageUpdate> + Send + Sync + 'static,
    ) -> Self {
        self.settings.hook = Some(Arc::new(hook));
        self
    }

    /// Waits in the bulkhead's FIFO queue (bounded by its `max_queue`) when no slot is free,
    /// for at most `timeout` (`None`: the bulkhead's default timeout), instead of refusing at
    /// once. Capacity refusals (tokens, class limits) still fail fast (contract §2). Each
    /// request then allocates its wait future. axum has no per-request timeout of its own, so
    /// give one here or outside.
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let b = llm_bulkhead::Bulkhead::builder().max_concurrent(2).max_queue(16).build().unwrap();
    /// let layer = BulkheadLayer::builder(b).wait_in_queue(Some(std::time::Duration::from_millis(500))).build();
    /// # let _ = layer;
    /// ```
    pub fn wait_in_queue(mut self, timeout: Option<Duration>) -> Self {
        self.settings.wait = Some(timeout);
        self
    }

    /// Observe mode (feature `llm`), for rollouts: a request refused for one of `shadow`'s
    /// reasons goes through anyway, without an admission, counted as a bypass
    /// ([`LlmStats::of`](crate::llm::LlmStats::of)`(bulkhead).observe`, `bypass` events read
    /// with [`LlmEvent`](crate::llm::LlmEvent)), exactly as `LlmBulkhead::run` in
    /// [`Mode::Observe`](crate::llm::Mode::Observe) does. A closed bulkhead still refuses (503).
    /// It applies to the fail-fast decision only: a layer built with
    /// [`wait_in_queue`](Self::wait_in_queue) waits and enforces, and ignores this setting.
    ///
    /// ```
    /// use llm_bulkhead::llm::ShadowReasons;
    /// use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(0).unwrap()).observe(ShadowReasons::ALL).build();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "llm")]
    #[cfg_attr(docsrs, doc(cfg(feature = "llm")))]
    pub fn observe(mut self, shadow: crate::llm::ShadowReasons) -> Self {
        let counters = crate::llm::observe::stats::ObserveCounters::of(&self.settings.bulkhead);
        self.settings.observe = Some((shadow, counters));
        self
    }

    /// Records a histogram of hold time (admission to release) per class and of queue wait
    /// through the `metrics` facade (feature `metrics`): `llm_bulkhead_hold_seconds` and
    /// `llm_bulkhead_queue_wait_seconds`. Install the recorder before building the layer: the
    /// handles are registered here. It also counts every refusal the layer answers, by status
    /// and code, in [`HTTP_REFUSALS`].
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(2).unwrap()).record_metrics(true).build();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_metrics(mut self, on: bool) -> Self {
        self.settings.metrics =
            on.then(|| metrics::LayerMetrics::new(&self.settings.bulkhead, None));
        self.settings.refusals = on.then(|| refusal::HttpRefusals::new(None));
        self
    }

    /// As [`record_metrics(true)`](Self::record_metrics), with the label `bulkhead = name`
    /// on the histograms (as [`Telemetry::name`](crate::telemetry::Telemetry::name) labels the
    /// counters).
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(2).unwrap()).record_metrics_named("openai").build();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_metrics_named(mut self, name: &str) -> Self {
        self.settings.metrics = Some(metrics::LayerMetrics::new(
            &self.settings.bulkhead,
            Some(name),
        ));
        self.settings.refusals = Some(refusal::HttpRefusals::new(Some(name)));
        self
    }

    /// The layer, in response mode.
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(2).unwrap()).build();
    /// # let _ = layer;
    /// ```
    #[must_use = "the layer does nothing until it wraps a service"]
    pub fn build(self) -> BulkheadLayer {
        BulkheadLayer {
            settings: Arc::new(self.settings),
            _mode: PhantomData,
        }
    }
}

impl fmt::Debug for BulkheadLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayerBuilder")
            .finish_non_exhaustive()
    }
}

/// The layer: wraps services in [`BulkheadService`]s that share its bulkhead and settings.
/// `M` is [`Respond`] (refusals are responses) or [`Fail`] (refusals are errors).
///
/// ```
/// use llm_bulkhead::tower::BulkheadLayer;
/// use tower_layer::Layer;
/// let layer = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(5).unwrap());
/// let inner = tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"hi"))))
/// });
/// let (a, b) = (layer.layer(inner.clone()), layer.clone().layer(inner));
/// # let _ = (a, b); // both share one limit of 5
/// ```
pub struct BulkheadLayer<M = Respond> {
    settings: Arc<Settings>,
    _mode: PhantomData<fn() -> M>,
}

impl BulkheadLayer {
    /// A builder for `bulkhead` (classifier [`SlotPerRequest`], release at the end of the body,
    /// fail-fast, response mode).
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::builder(llm_bulkhead::Bulkhead::new(1).unwrap()).build();
    /// # let _ = layer;
    /// ```
    pub fn builder(bulkhead: Bulkhead) -> BulkheadLayerBuilder {
        BulkheadLayerBuilder {
            settings: Settings {
                bulkhead,
                classifier: Box::new(SlotPerRequest),
                release_at: ReleaseAt::EndOfBody,
                wait: None,
                hook: None,
                #[cfg(feature = "metrics")]
                metrics: None,
                #[cfg(feature = "metrics")]
                refusals: None,
                #[cfg(feature = "cluster")]
                window: None,
                #[cfg(feature = "llm")]
                observe: None,
            },
        }
    }

    /// A layer admitting requests of `bulkhead` as `classifier` says.
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, HeaderClassifier};
    /// let b = llm_bulkhead::Bulkhead::new(3).unwrap();
    /// let layer = BulkheadLayer::new(b.clone(), HeaderClassifier::new(&b));
    /// # let _ = layer;
    /// ```
    pub fn new(bulkhead: Bulkhead, classifier: impl Classify) -> BulkheadLayer {
        BulkheadLayer::builder(bulkhead)
            .classifier(classifier)
            .build()
    }

    /// A layer taking one slot per request ([`SlotPerRequest`]).
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap());
    /// assert_eq!(layer.bulkhead().limits().max_concurrent, 3);
    /// ```
    #[must_use]
    pub fn slots(bulkhead: Bulkhead) -> BulkheadLayer {
        BulkheadLayer::builder(bulkhead).build()
    }

    /// A builder over the bulkhead a cluster agent manages (feature `cluster`), whose
    /// requests admit through the share's window: an admission that commits after the
    /// installed share's window ended is given back at once and the request refused with
    /// [`Refusal::ShareLapsed`] (503, code `share_lapsed`), queued requests included. Every
    /// admission carries the cluster admission deadline, and a release after it (the end of a
    /// response body that outlived `max_admission`) is counted in
    /// [`AgentStatus::overdue`](crate::cluster::AgentStatus::overdue); the layer does not cut
    /// the body itself.
    ///
    /// ```
    /// use llm_bulkhead::cluster::{ClusterAgent, ClusterConfig, MemoryStore};
    /// use llm_bulkhead::tower::{BulkheadLayer, SlotPerRequest};
    /// use llm_bulkhead::Bulkhead;
    /// let agent = ClusterAgent::new(Bulkhead::new(64).unwrap(), Box::new(MemoryStore::new()),
    ///     ClusterConfig::new("gateway", "provider")).unwrap();
    /// let layer = BulkheadLayer::clustered(&agent.handle()).classifier(SlotPerRequest).build();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn clustered(handle: &crate::cluster::ClusterBulkhead) -> BulkheadLayerBuilder {
        let mut builder = BulkheadLayer::builder(handle.bulkhead().clone());
        builder.settings.window = Some(handle.window().clone());
        builder
    }
}

impl<M> BulkheadLayer<M> {
    /// The same layer in error mode: refusals are [`Refused::Refusal`] errors.
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, Fail};
    /// let layer: BulkheadLayer<Fail> = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap()).refuse_with_error();
    /// # let _ = layer;
    /// ```
    #[must_use = "returns the changed layer; the original is moved"]
    pub fn refuse_with_error(self) -> BulkheadLayer<Fail> {
        BulkheadLayer {
            settings: self.settings,
            _mode: PhantomData,
        }
    }

    /// The same layer in response mode.
    ///
    /// ```
    /// # use llm_bulkhead::tower::{BulkheadLayer, Respond};
    /// let layer: BulkheadLayer<Respond> = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap()).refuse_with_error().respond();
    /// # let _ = layer;
    /// ```
    #[must_use = "returns the changed layer; the original is moved"]
    pub fn respond(self) -> BulkheadLayer<Respond> {
        BulkheadLayer {
            settings: self.settings,
            _mode: PhantomData,
        }
    }

    /// The bulkhead (for stats, limits snapshots, close).
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer;
    /// let layer = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap());
    /// assert_eq!(layer.bulkhead().stats().in_flight, 0);
    /// ```
    #[must_use]
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.settings.bulkhead
    }
}

impl<M> Clone for BulkheadLayer<M> {
    fn clone(&self) -> Self {
        BulkheadLayer {
            settings: self.settings.clone(),
            _mode: PhantomData,
        }
    }
}

impl<M> fmt::Debug for BulkheadLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("bulkhead", &self.settings.bulkhead)
            .field("release_at", &self.settings.release_at)
            .finish_non_exhaustive()
    }
}

impl<S, M> Layer<S> for BulkheadLayer<M> {
    type Service = BulkheadService<S, M>;

    fn layer(&self, inner: S) -> BulkheadService<S, M> {
        BulkheadService {
            inner,
            settings: self.settings.clone(),
            _mode: PhantomData,
        }
    }
}

/// The service of a [`BulkheadLayer`]. Cheap to clone (the inner service and one `Arc`);
/// every clone shares the layer's bulkhead.
///
/// ```
/// use llm_bulkhead::tower::BulkheadLayer;
/// use tower::ServiceExt;
/// use tower_layer::Layer;
/// let bulkhead = llm_bulkhead::Bulkhead::new(0).unwrap(); // the kill switch
/// let svc = BulkheadLayer::slots(bulkhead).layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
/// }));
/// let resp = futures_lite::future::block_on(svc.oneshot(http::Request::new(()))).unwrap();
/// assert_eq!(resp.status(), 429);
/// ```
pub struct BulkheadService<S, M = Respond> {
    inner: S,
    settings: Arc<Settings>,
    _mode: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for BulkheadService<S, M> {
    fn clone(&self) -> Self {
        BulkheadService {
            inner: self.inner.clone(),
            settings: self.settings.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for BulkheadService<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadService")
            .field("inner", &self.inner)
            .field("bulkhead", &self.settings.bulkhead)
            .finish_non_exhaustive()
    }
}

impl<S, M> BulkheadService<S, M> {
    /// The bulkhead.
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer; use tower_layer::Layer;
    /// let svc = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap()).layer(());
    /// assert_eq!(svc.bulkhead().limits().max_concurrent, 3);
    /// ```
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.settings.bulkhead
    }

    /// The inner service.
    ///
    /// ```
    /// # use llm_bulkhead::tower::BulkheadLayer; use tower_layer::Layer;
    /// let svc = BulkheadLayer::slots(llm_bulkhead::Bulkhead::new(3).unwrap()).layer(7);
    /// assert_eq!(*svc.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, RB, B, M> Service<Request<RB>> for BulkheadService<S, M>
where
    S: Service<Request<RB>, Response = Response<B>> + Clone,
    B: Body,
    M: RefusalMode<S::Error>,
{
    type Response = Response<AdmittedBody<B>>;
    type Error = M::Error;
    type Future = ResponseFuture<S, RB, M>;

    /// Forwards the inner service's readiness; never waits on the bulkhead.
    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner)
    }

    fn call(&mut self, req: Request<RB>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let demand = match self.settings.classifier.classify(&parts) {
            Ok(d) => d,
            Err(e) => {
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    target: "llm_bulkhead::tower",
                    code = e.code,
                    status = e.status.as_u16(),
                    "request refused by the classifier"
                );
                return ResponseFuture::refused(self.settings.refused(Refusal::Unclassified(e)));
            }
        };
        let req = Request::from_parts(parts, body);
        if let Some(timeout) = self.settings.wait {
            // The ready service goes with the request; this clone takes its place (tower's
            // documented pattern: a clone of a ready service is not ready).
            let clone = self.inner.clone();
            let inner = std::mem::replace(&mut self.inner, clone);
            let bulkhead = self.settings.bulkhead.clone();
            let options = WaitOptions {
                timeout: timeout.map_or(crate::QueueTimeout::Default, crate::QueueTimeout::After),
                cancel: None,
            };
            let wait = Box::pin(async move { bulkhead.acquire(demand, options).await });
            return ResponseFuture::waiting(self.settings.clone(), wait, demand, inner, req);
        }
        match self.settings.decide(demand) {
            // The inner service stays ready and untouched: it never sees the request.
            Err(refusal) => ResponseFuture::refused(self.settings.refused(refusal)),
            Ok(held) => {
                // Called now, so the service `poll_ready` readied is the one that takes it.
                let future = self.inner.call(req);
                ResponseFuture::calling(self.settings.release_at, future, held)
            }
        }
    }
}
