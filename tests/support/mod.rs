//! Test support for the HTTP tests: a body fed by a channel, a loopback server started and
//! stopped by the test, and a one-connection-per-request HTTP/1 client. Everything binds
//! 127.0.0.1 on an ephemeral port.
#![allow(dead_code)]

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A response body whose frames the test sends; it ends when the sender is dropped.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Result<Bytes, std::io::Error>>,
}

/// The sending half of a [`ChannelBody`].
pub type BodySender = mpsc::UnboundedSender<Result<Bytes, std::io::Error>>;

impl ChannelBody {
    pub fn new() -> (BodySender, ChannelBody) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, ChannelBody { rx })
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// A server on 127.0.0.1 (ephemeral port) for the duration of a test.
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(router: axum::Router) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Server { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request on its own connection. Aborting `connection` closes the socket (a client
/// that disconnects).
pub struct Call {
    pub response: Response<Incoming>,
    pub connection: JoinHandle<()>,
}

pub async fn call(addr: SocketAddr, request: Request<Full<Bytes>>) -> Call {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(async move {
        let _ = conn.await;
    });
    let response = sender.send_request(request).await.unwrap();
    Call {
        response,
        connection,
    }
}

pub fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

pub fn post_json(path: &str, json: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(path)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(json.as_bytes())))
        .unwrap()
}

/// The whole body of a response.
pub async fn text(response: Response<Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The next data frame of a body (None at its end).
pub async fn next_chunk(body: &mut Incoming) -> Option<Bytes> {
    loop {
        match body.frame().await? {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    return Some(d);
                }
            }
            Err(e) => panic!("body error: {e}"),
        }
    }
}

/// Runs `test` on a fresh multi-threaded runtime, bounded in time (a safety net, never a
/// synchronisation: the tests wait on channels and notifications).
pub fn run<F: Future<Output = ()> + Send + 'static>(test: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("the test did not finish within 60 s");
    });
}

/// Waits until `done()` holds, yielding to other tasks between checks. For conditions another
/// task reaches without telling us (a server noticing a closed socket); bounded by `run`.
pub async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::task::yield_now().await;
    }
}

/// The count of `llm_bulkhead_http_refusals_total` with `status` and `code` (and `bulkhead`,
/// when given) in `snapshot` (`None`: no such counter registered).
#[cfg(all(feature = "tower", feature = "metrics"))]
pub fn http_refusals(
    snapshot: &[(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        metrics_util::debugging::DebugValue,
    )],
    status: &str,
    code: &str,
    bulkhead: Option<&str>,
) -> Option<u64> {
    snapshot
        .iter()
        .find(|(k, _, _, _)| {
            let key = k.key();
            let has = |name: &str, value: &str| {
                key.labels().any(|l| l.key() == name && l.value() == value)
            };
            key.name() == llm_bulkhead::tower::HTTP_REFUSALS
                && has("status", status)
                && has("code", code)
                && bulkhead.is_none_or(|b| has("bulkhead", b))
        })
        .map(|(_, _, _, v)| match v {
            metrics_util::debugging::DebugValue::Counter(n) => *n,
            other => panic!("{other:?}"),
        })
}
