//! The response future of [`BulkheadService`](super::BulkheadService).

use super::body::{AdmittedBody, Held};
use super::refusal::{Refusal, RefusalMode};
use super::{ReleaseAt, Settings};
use crate::{Admission, Rejection};
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// A queue wait: the bulkhead's async acquire, owning its bulkhead handle.
pub(crate) type Wait = Pin<Box<dyn Future<Output = Result<Admission, Rejection>> + Send>>;

pin_project! {
    /// The future of one request through the layer. Dropping it releases the admission (while
    /// the inner service runs) or leaves the queue (while waiting), so a timeout outside the
    /// layer or a client that goes away never leaks capacity.
    ///
    /// # Cancel safety
    /// Dropping it at any point releases everything it holds; a request refused or dropped
    /// before its admission never reaches the inner service.
    ///
    /// ```
    /// use llm_bulkhead::tower::BulkheadLayer;
    /// use tower::{Service, ServiceExt};
    /// use tower_layer::Layer;
    /// let b = llm_bulkhead::Bulkhead::new(1).unwrap();
    /// let mut svc = BulkheadLayer::slots(b.clone()).layer(tower::service_fn(|_: http::Request<()>| async {
    ///     std::future::pending::<()>().await; // a provider call that never ends
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
    /// }));
    /// let future = svc.call(http::Request::new(())); // admitted in `call`
    /// assert_eq!(b.stats().in_flight, 1);
    /// drop(future); // a timeout outside, or a client gone
    /// assert_eq!(b.stats().in_flight, 0);
    /// ```
    #[must_use = "futures do nothing unless polled (dropping it releases the admission)"]
    pub struct ResponseFuture<S, RB, M>
    where
        S: Service<Request<RB>>,
    {
        #[pin]
        state: State<S, RB>,
        release_at: ReleaseAt,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, RB>
    where
        S: Service<Request<RB>>,
    {
        Refused {
            refusal: Option<Refusal>,
        },
        Waiting {
            // Boxed: the waiting path allocates its wait anyway, and keeping the service and
            // the request out of line keeps the fast path's future small (moves of a large
            // future cost more than the admission itself).
            waiting: Box<Waiting<S, RB>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            held: Option<Held>,
        },
    }
}

pub(crate) struct Waiting<S, RB> {
    wait: Wait,
    /// What the wait asks for (a refusal's cluster judgement reads it).
    demand: crate::Demand,
    service: Option<S>,
    request: Option<Request<RB>>,
    settings: Arc<Settings>,
    started: std::time::Instant,
}

impl<S, RB, M> ResponseFuture<S, RB, M>
where
    S: Service<Request<RB>>,
{
    pub(crate) fn refused(refusal: Refusal) -> Self {
        ResponseFuture {
            state: State::Refused {
                refusal: Some(refusal),
            },
            release_at: ReleaseAt::EndOfBody,
            _mode: PhantomData,
        }
    }

    #[inline]
    pub(crate) fn calling(release_at: ReleaseAt, future: S::Future, held: Held) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                held: Some(held),
            },
            release_at,
            _mode: PhantomData,
        }
    }

    pub(crate) fn waiting(
        settings: Arc<Settings>,
        wait: Wait,
        demand: crate::Demand,
        service: S,
        request: Request<RB>,
    ) -> Self {
        ResponseFuture {
            release_at: settings.release_at,
            state: State::Waiting {
                waiting: Box::new(Waiting {
                    wait,
                    demand,
                    service: Some(service),
                    request: Some(request),
                    settings,
                    started: std::time::Instant::now(),
                }),
            },
            _mode: PhantomData,
        }
    }
}

impl<S, RB, M, B> Future for ResponseFuture<S, RB, M>
where
    S: Service<Request<RB>, Response = Response<B>>,
    B: Body,
    M: RefusalMode<S::Error>,
{
    type Output = Result<Response<AdmittedBody<B>>, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Refused { refusal } => {
                    // Polled again after completion: a refusal is answered once; later polls
                    // answer it again with the same body (futures need not be polled twice).
                    let r = refusal.take().unwrap_or_else(|| {
                        Refusal::Unclassified(super::ClassifyError {
                            status: http::StatusCode::SERVICE_UNAVAILABLE,
                            code: "polled_after_completion",
                            message: "the response future was polled after it completed".into(),
                        })
                    });
                    return Poll::Ready(M::refuse(r));
                }
                StateProj::Waiting { waiting } => {
                    let Waiting {
                        wait,
                        demand,
                        service,
                        request,
                        settings,
                        started,
                    } = &mut **waiting;
                    let outcome = ready!(wait.as_mut().poll(cx));
                    settings.record_wait(*started);
                    match outcome {
                        Err(rejection) => {
                            let refusal = settings.refused(settings.rejected(demand, rejection));
                            this.state.set(State::Refused { refusal: None });
                            return Poll::Ready(M::refuse(refusal));
                        }
                        Ok(admission) => {
                            let (Some(mut svc), Some(req)) = (service.take(), request.take())
                            else {
                                unreachable!("a waiting state always has its service and request")
                            };
                            let held = match settings.hold(admission) {
                                Ok(held) => held,
                                Err(refusal) => {
                                    // A lapsed cluster share: given back, the service untouched.
                                    let refusal = settings.refused(refusal);
                                    this.state.set(State::Refused { refusal: None });
                                    return Poll::Ready(M::refuse(refusal));
                                }
                            };
                            let future = svc.call(req);
                            this.state.set(State::Calling {
                                future,
                                held: Some(held),
                            });
                        }
                    }
                }
                StateProj::Calling { future, held } => {
                    let out = ready!(future.poll(cx));
                    let held = held.take();
                    return Poll::Ready(match out {
                        Ok(resp) => Ok(super::wrap(*this.release_at, resp, held)),
                        Err(e) => {
                            drop(held);
                            Err(M::inner(e))
                        }
                    });
                }
            }
        }
    }
}

impl<S, RB, M> fmt::Debug for ResponseFuture<S, RB, M>
where
    S: Service<Request<RB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
