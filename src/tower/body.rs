//! The response body that holds the admission until its last frame, and the usage hook that
//! lets a streamed usage chunk refund tokens before the end.

use crate::{Admission, Reconcile, Usage};
use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

/// What a usage hook found in a body frame: the usage so far and, for a final report, the
/// reconciliation that returns the unused output tokens at once.
///
/// ```
/// use llm_bulkhead::tower::UsageUpdate;
/// use llm_bulkhead::Usage;
/// let u = UsageUpdate::last(Usage::new(12, 30));
/// assert_eq!(u.reconcile.unwrap().remaining_output, 0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageUpdate {
    /// Cumulative usage (contract §5: clamped so it never decreases).
    pub usage: Usage,
    /// The reconciliation ([`Admission::report_usage`]).
    pub reconcile: Option<Reconcile>,
}

impl UsageUpdate {
    /// The final usage of a generation: nothing more will be produced, so the hold shrinks to
    /// the overrun (if any) and the rest of the reservation is refunded now.
    ///
    /// ```
    /// # use llm_bulkhead::{tower::UsageUpdate, Usage};
    /// assert_eq!(UsageUpdate::last(Usage::new(1, 2)).usage, Usage::new(1, 2));
    /// ```
    #[must_use]
    pub fn last(usage: Usage) -> UsageUpdate {
        UsageUpdate {
            usage,
            reconcile: Some(Reconcile {
                remaining_output: 0,
                safety_margin: 0,
            }),
        }
    }
}

/// Looks at each data frame of a held response body and reports usage it finds (see
/// [`BulkheadLayerBuilder::usage_from_frames`](super::BulkheadLayerBuilder::usage_from_frames)). It sees
/// the frame's first contiguous chunk; [`openai_usage`] is one for OpenAI- and
/// Anthropic-shaped bodies.
///
/// ```
/// use llm_bulkhead::tower::{openai_usage, UsageHook};
/// let hook: UsageHook = std::sync::Arc::new(openai_usage);
/// assert!(hook(b"data: [DONE]\n\n").is_none());
/// ```
pub type UsageHook = Arc<dyn Fn(&[u8]) -> Option<UsageUpdate> + Send + Sync>;

/// Finds a final `usage` object in a body frame: an SSE frame's `data:` lines or a whole JSON
/// body, OpenAI (`prompt_tokens`/`completion_tokens`) or Anthropic (`input_tokens`/
/// `output_tokens`) names. Frames without the bytes `"usage"` are skipped without parsing.
/// A usage object split across frames is not seen (the release still settles the admission).
///
/// ```
/// use llm_bulkhead::tower::openai_usage;
/// use llm_bulkhead::Usage;
/// let sse = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34}}\n\n";
/// assert_eq!(openai_usage(sse).unwrap().usage, Usage::new(12, 34));
/// assert_eq!(openai_usage(b"data: {\"usage\":null}\n\n"), None);
/// assert_eq!(openai_usage(b"data: [DONE]\n\n"), None);
/// let anthropic = br#"{"type":"message_delta","usage":{"output_tokens":15}}"#;
/// assert_eq!(openai_usage(anthropic).unwrap().usage, Usage::new(0, 15));
/// ```
#[must_use]
pub fn openai_usage(frame: &[u8]) -> Option<UsageUpdate> {
    const NEEDLE: &[u8] = b"\"usage\"";
    if !frame.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
        return None;
    }
    let trimmed = frame.trim_ascii_start();
    if trimmed.first() == Some(&b'{') {
        return usage_of_json(trimmed);
    }
    let mut found = None;
    for line in frame.split(|b| *b == b'\n') {
        if let Some(data) = line.strip_prefix(b"data:") {
            if let Some(u) = usage_of_json(data.trim_ascii()) {
                found = Some(u);
            }
        }
    }
    found
}

fn usage_of_json(json: &[u8]) -> Option<UsageUpdate> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let u = v.get("usage")?.as_object()?;
    let n = |k: &str| u.get(k).and_then(serde_json::Value::as_u64);
    let input = n("prompt_tokens").or_else(|| n("input_tokens"));
    let output = n("completion_tokens").or_else(|| n("output_tokens"));
    if input.is_none() && output.is_none() {
        return None;
    }
    Some(UsageUpdate::last(Usage::new(
        input.unwrap_or(0),
        output.unwrap_or(0),
    )))
}

/// What a response in flight holds: an admission, or (observe mode) a bypass that holds no
/// capacity but is counted and settled like one.
pub(crate) enum Hold {
    Admitted(Admission),
    /// A pools permit and how the response ended upstream (its status).
    Pool(
        crate::pools::OwnedPoolPermit,
        Option<crate::pools::FailureClass>,
    ),
    #[cfg(feature = "llm")]
    Bypassed(crate::llm::observe::Bypassed),
}

/// An admission (or bypass) held by a response in flight: released when dropped.
pub(crate) struct Held {
    pub(crate) hold: Hold,
    pub(crate) hook: Option<UsageHook>,
    #[cfg(feature = "metrics")]
    pub(crate) _timer: Option<super::metrics::HoldTimer>,
    /// A cluster admission's deadline: dropped after `hold` (declared after it), so a
    /// release past the deadline is counted as overdue.
    #[cfg(feature = "cluster")]
    pub(crate) _ticket: Option<crate::cluster::Ticket>,
}

impl Held {
    fn inspect(&mut self, chunk: &[u8]) {
        if let Some(hook) = &self.hook {
            if let Some(u) = hook(chunk) {
                // An invalid report (it cannot be, with `remaining_output: 0`) changes nothing;
                // the release settles with the last valid one.
                let _ = match &mut self.hold {
                    Hold::Admitted(a) => a.report_usage_reconciled(u.usage, u.reconcile),
                    // A pools permit holds units, not tokens: nothing to refund.
                    Hold::Pool(..) => return,
                    #[cfg(feature = "llm")]
                    Hold::Bypassed(b) => b.report_usage_reconciled(u.usage, u.reconcile),
                };
            }
        }
    }

    /// Releases with the last usage report (the end of the body).
    pub(crate) fn finish(self) {
        // `release(None)` uses the last report; the error case (an invalid explicit usage)
        // cannot happen without one, and the admission is released on drop regardless.
        let Held { hold, .. } = self;
        match hold {
            Hold::Admitted(a) => {
                let _ = a.release(None);
            }
            Hold::Pool(p, failure) => p.complete(failure),
            #[cfg(feature = "llm")]
            Hold::Bypassed(mut b) => b.finish(None),
        }
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Held");
        match &self.hold {
            Hold::Admitted(a) => d.field("admission", &a.id()),
            Hold::Pool(p, _) => d.field("pool_permit", p),
            #[cfg(feature = "llm")]
            Hold::Bypassed(b) => d.field("admission", &b.id),
        };
        d.finish_non_exhaustive()
    }
}

pin_project! {
    /// The body of a response that went through the layer. While the inner body streams, it
    /// holds the admission; the admission is released when the body ends (`poll_frame` returns
    /// `None`, or `is_end_stream` becomes true after a frame), when it fails, or when it is
    /// dropped (a client that disconnects). A body that is already at its end when the
    /// response is produced (204, 304, `HEAD`, an empty body) releases at once.
    ///
    /// It also carries the JSON body of a refusal in response mode.
    ///
    /// ```
    /// use http_body::Body;
    /// use llm_bulkhead::tower::AdmittedBody;
    /// let b: AdmittedBody<http_body_util::Empty<bytes::Bytes>> = AdmittedBody::refusal(bytes::Bytes::from_static(b"{}"));
    /// assert_eq!(b.size_hint().exact(), Some(2));
    /// ```
    pub struct AdmittedBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
            held: Option<Held>,
        },
        Refusal {
            data: Option<Bytes>,
        },
    }
}

impl<B> AdmittedBody<B> {
    /// A body that holds `held` until `body` ends.
    pub(crate) fn held(body: B, held: Option<Held>) -> AdmittedBody<B> {
        AdmittedBody {
            kind: Kind::Inner { body, held },
        }
    }

    /// A complete body of `data` (a refusal).
    ///
    /// ```
    /// # use llm_bulkhead::tower::AdmittedBody;
    /// let b: AdmittedBody<String> = AdmittedBody::refusal(bytes::Bytes::new());
    /// assert!(!b.holds_admission());
    /// ```
    pub fn refusal(data: Bytes) -> AdmittedBody<B> {
        AdmittedBody {
            kind: Kind::Refusal { data: Some(data) },
        }
    }

    /// Whether the body still holds its admission.
    ///
    /// ```
    /// # use llm_bulkhead::tower::AdmittedBody;
    /// let b: AdmittedBody<String> = AdmittedBody::refusal(bytes::Bytes::new());
    /// assert!(!b.holds_admission());
    /// ```
    pub fn holds_admission(&self) -> bool {
        matches!(&self.kind, Kind::Inner { held: Some(_), .. })
    }
}

impl<B: fmt::Debug> fmt::Debug for AdmittedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body, held } => f
                .debug_struct("AdmittedBody")
                .field("body", body)
                .field("held", held)
                .finish(),
            Kind::Refusal { data } => f
                .debug_struct("AdmittedBody")
                .field("refusal", data)
                .finish(),
        }
    }
}

impl<B> Body for AdmittedBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Refusal { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(B::Data::from(d)))))
            }
            KindProj::Inner { mut body, held } => {
                let polled = ready!(body.as_mut().poll_frame(cx));
                match &polled {
                    Some(Ok(frame)) => {
                        if let (Some(h), Some(data)) = (held.as_mut(), frame.data_ref()) {
                            if h.hook.is_some() {
                                h.inspect(data.chunk());
                            }
                        }
                        if body.is_end_stream() {
                            if let Some(h) = held.take() {
                                h.finish();
                            }
                        }
                    }
                    // A failed body is over: release (dropping settles with the last report).
                    Some(Err(_)) => drop(held.take()),
                    None => {
                        if let Some(h) = held.take() {
                            h.finish();
                        }
                    }
                }
                Poll::Ready(polled)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Refusal { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Refusal { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
