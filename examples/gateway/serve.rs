//! The gateway's HTTP server: hyper HTTP/1 connections with a header-read timeout, an idle
//! timeout, and a shutdown bounded whatever clients do. (The body-read deadline is the app's,
//! `app::Gateway`, so that it also holds under any other server.)
//!
//! * **Header read**: from the moment a connection can take a request (it opened, or its last
//!   response ended) to the end of the request's head. It closes connections that send
//!   nothing, partial headers, or nothing more after a response (an idle keep-alive).
//! * **Idle**: no byte read or written for this long closes the connection whatever it is
//!   doing: a client that stops reading a stream, a stalled body, a provider that sends
//!   nothing. Its admission is released when the connection's response is dropped.
//! * **Shutdown** (SIGTERM or SIGINT in `main.rs`): stop accepting, close the bulkhead (new
//!   requests on open connections get a 503), let every connection finish its response and
//!   close, and after the drain deadline cut what is left. The report says which happened.
#![allow(dead_code)]

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use llm_bulkhead::Bulkhead;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::ServiceExt;

/// The server's timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// From a connection's readiness for a request to the end of the request's head.
    pub header_read: Duration,
    /// No byte read or written on a connection for this long closes it.
    pub idle: Duration,
    /// How long a shutdown waits for responses in flight before cutting them.
    pub drain: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            header_read: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            drain: Duration::from_secs(20),
        }
    }
}

/// How a shutdown ended.
#[derive(Clone, Copy, Debug)]
pub struct Stopped {
    /// Every connection finished within the drain deadline.
    pub drained: bool,
    /// Connections cut at the deadline.
    pub cut: usize,
    /// Admissions still held after the connections were gone (0 unless something leaks).
    pub in_flight: u64,
}

/// SIGTERM (what systemd and Kubernetes send) or SIGINT (Ctrl-C), whichever comes first; the
/// signal's name. The handlers are installed when this is called, not when it is polled, so a
/// signal sent after the call is never lost.
///
/// # Errors
/// Installing a handler failed.
pub fn signals() -> std::io::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Serves `router` on `listener` until `shutdown` completes, then shuts down as the module
/// says: `bulkhead` is closed, connections drain for at most `timeouts.drain`, and what is
/// left is cut. Returns when every connection is gone.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bulkhead: Bulkhead,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) -> Stopped {
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, router.clone(), timeouts, stopping.clone()));
                }
                // Out of descriptors, or a connection reset before it was accepted: keep
                // serving the others (a short pause, so that a full table is not a busy loop).
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    bulkhead.close();
    stop.send_replace(true);
    let all_done = async { while connections.join_next().await.is_some() {} };
    let drained = tokio::time::timeout(timeouts.drain, all_done).await.is_ok();
    let cut = connections.len();
    // Cutting a connection drops its response, and with it the admission it holds.
    connections.shutdown().await;
    let report = bulkhead.drain(Some(Duration::from_secs(1))).await;
    Stopped {
        drained,
        cut,
        in_flight: report.in_flight,
    }
}

/// One connection: hyper HTTP/1 with the header-read timeout, under the idle watchdog, and
/// told to finish its response and close when `stopping` turns true.
async fn connection(
    stream: TcpStream,
    router: Router,
    timeouts: Timeouts,
    mut stopping: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        router.clone().oneshot(req.map(Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut told = false;
    loop {
        let idle_at = activity.last() + timeouts.idle;
        tokio::select! {
            _ = conn.as_mut() => return,
            changed = stopping.changed(), if !told => {
                told = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep_until(idle_at) => {
                // Idle since `idle_at - idle`: dropping the connection closes its socket.
                if activity.last() + timeouts.idle <= Instant::now() {
                    return;
                }
            }
        }
    }
}

/// When a connection last moved a byte, as milliseconds since it opened.
struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A socket that records when it last read or wrote a byte.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let out = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        out
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let out = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        out
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let out = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        out
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
