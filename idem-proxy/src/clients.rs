//! Accepting clients within their limits: at most `max_connections` open at once; the
//! first bytes and every request head within `header_timeout` (of the connection's start,
//! or of the previous answer's end: hyper's HTTP/1 timer, which axum's `serve` never
//! sets); no write to a client stuck longer than `send_timeout`; HTTP/2 peers pinged; and
//! a graceful shutdown that lets requests in flight finish and closes the rest.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use idem_http::Body;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::ClientLimits;
use crate::observe;

/// The HTTP/2 connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How often an HTTP/2 client is pinged, and how long its answer may take: a peer gone
/// without a word is found within a minute.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Streams one HTTP/2 client connection may open at once.
const H2_MAX_STREAMS: u32 = 100;

/// Serves `app` on `listener` until `shutdown` completes; then accepts no more, asks
/// every connection to close once its requests are answered, closes at once those with
/// none in flight (idle, or still sending a head), and returns when all have closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ClientLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let draining = CancellationToken::new();
    let mut http1 = auto::Builder::new(TokioExecutor::new()).http1_only();
    http1
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut http2 = auto::Builder::new(TokioExecutor::new()).http2_only();
    http2
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .keep_alive_interval(H2_PING_INTERVAL)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    tokio::pin!(shutdown);
    loop {
        // Past the limit nothing is accepted: new connections wait in the backlog.
        if connections.available_permits() == 0 {
            observe::client_limit("connections");
        }
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&connections).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, remote) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = accept_failed(err) => continue,
                    }
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Requests of this connection not yet answered: a shutdown closes it at once
        // when there are none.
        let in_flight = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&in_flight);
        let service = app
            .clone()
            .map_request(move |mut request: http::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(remote));
                request.map(axum::body::Body::new)
            })
            .map_future(move |answered| {
                let guard = InFlight::new(Arc::clone(&counted));
                async move {
                    let response: Result<http::Response<axum::body::Body>, _> = answered.await;
                    response.map(|response| {
                        response.map(|body| axum::body::Body::new(guard.until_end_of(body)))
                    })
                }
            });
        let (http1, http2) = (http1.clone(), http2.clone());
        let (header_timeout, send_timeout) = (limits.header_timeout, limits.send_timeout);
        let watcher = graceful.watcher();
        let draining = draining.clone();
        observe::client_connections(1.0);
        tokio::spawn(async move {
            // The protocol, from the first bytes, within the head's time: a client that
            // sends nothing (or part of the HTTP/2 preface) is closed, and at once when a
            // shutdown begins.
            let protocol = tokio::select! {
                // A client whose bytes are already here is served, not dropped.
                biased;
                protocol = sniff(&stream, header_timeout) => protocol,
                () = draining.cancelled() => None,
            };
            if let Some(protocol) = protocol {
                let wrote = Arc::new(AtomicBool::new(false));
                let io = TokioIo::new(Timed::new(stream, send_timeout, Arc::clone(&wrote)));
                let service = TowerToHyperService::new(service);
                // Upgrades are not proxied: plain connections, so that each builder
                // speaks only its own protocol.
                let connection = match protocol {
                    Protocol::Http1 => http1.serve_connection(io, service),
                    Protocol::Http2 => http2.serve_connection(io, service),
                }
                .into_owned();
                let connection = watcher.watch(connection);
                // HTTP/2 connections close by themselves once their streams are done
                // (hyper's GOAWAY); an HTTP/1 one still sending a head would not.
                let http1 = matches!(protocol, Protocol::Http1);
                let flush = send_timeout.min(FLUSH_WINDOW);
                tokio::select! {
                    // A client that breaks its connection, sends no head in time or
                    // stops reading its answer ends it.
                    _ = connection => {}
                    () = quiet_once_draining(&draining, &in_flight, &wrote, flush), if http1 => {}
                }
            }
            observe::client_connections(-1.0);
            drop(permit);
        });
    }
    drop(listener);
    draining.cancel();
    graceful.shutdown().await;
}

/// The longest a shutdown waits, once an HTTP/1 connection has no request in flight, for
/// its last answer to reach the client before the connection is cut.
const FLUSH_WINDOW: Duration = Duration::from_secs(5);

/// Completes once a shutdown began and the connection went a whole `flush` with no
/// request in flight and nothing written (its last answer's bytes all left, and hyper
/// would have closed it, unless it is still sending a head): hyper closes idle HTTP/1
/// connections itself, but not one that is still sending a head.
async fn quiet_once_draining(
    draining: &CancellationToken,
    in_flight: &AtomicUsize,
    wrote: &AtomicBool,
    flush: Duration,
) {
    draining.cancelled().await;
    // Bounded by the connection: it ends by itself when its last answer is sent, and a
    // client that stops reading is cut by the send timeout.
    loop {
        while in_flight.load(Ordering::Acquire) > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        wrote.store(false, Ordering::Release);
        tokio::time::sleep(flush).await;
        if in_flight.load(Ordering::Acquire) == 0 && !wrote.load(Ordering::Acquire) {
            return;
        }
    }
}

#[derive(Clone, Copy)]
enum Protocol {
    Http1,
    Http2,
}

/// Which protocol the client speaks, by its first bytes (HTTP/2 prior knowledge begins
/// with the preface), read without taking them; `None` when it sends nothing telling
/// within `within`, or closes.
async fn sniff(stream: &TcpStream, within: Duration) -> Option<Protocol> {
    let told = tokio::time::timeout(within, async {
        let mut first = [0u8; PREFACE.len()];
        let mut pause = Duration::from_millis(5);
        loop {
            let n = stream.peek(&mut first).await.ok()?;
            if n == 0 {
                return None;
            }
            if first[..n] != PREFACE[..n] {
                return Some(Protocol::Http1);
            }
            if n == PREFACE.len() {
                return Some(Protocol::Http2);
            }
            // Part of the preface: `peek` answers at once with the same bytes until more
            // arrive, so wait before looking again, longer each time.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    })
    .await;
    told.ok().flatten()
}

/// A failed accept: a client gone before it was accepted is nothing; anything else (no
/// file descriptor left, most often) is waited out, as hyper's own server did.
async fn accept_failed(err: io::Error) {
    if matches!(
        err.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %err, "accepting a client connection failed; trying again in 1 s (raise the open-files limit, or lower `max_connections`)");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// One request of a connection, counted from its arrival until its answer's body ended
/// or was dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }

    fn until_end_of(self, body: axum::body::Body) -> Held<axum::body::Body, Self> {
        Held { body, _held: self }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `body`, holding `permit` until it ends or is dropped.
pub(crate) fn holding(body: Body, permit: OwnedSemaphorePermit) -> Body {
    Body::new(Held {
        body,
        _held: permit,
    })
}

/// A body, and something held as long as it is.
struct Held<B, H> {
    body: B,
    _held: H,
}

impl<B, H> http_body::Body for Held<B, H>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<idem_core::BoxError>,
    H: Unpin,
{
    type Data = Bytes;
    type Error = idem_core::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body)
            .poll_frame(cx)
            .map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A client socket whose writes may not stay blocked longer than `timeout` (a client
/// that stopped reading its answer), as nginx's `send_timeout`.
struct Timed {
    stream: TcpStream,
    timeout: Duration,
    /// Armed while a write waits.
    stuck: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Raised by every write that went through.
    wrote: Arc<AtomicBool>,
}

impl Timed {
    fn new(stream: TcpStream, timeout: Duration, wrote: Arc<AtomicBool>) -> Self {
        Self {
            stream,
            timeout,
            stuck: None,
            wrote,
        }
    }

    /// Raises `wrote` for bytes that went out: a flush with nothing to send is no sign
    /// of an answer still going.
    fn note(&self, written: &Poll<io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0) {
            self.wrote.store(true, Ordering::Release);
        }
    }

    /// `poll` of a write: pending for at most `timeout` in a row.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(done) = poll(Pin::new(&mut self.stream), cx) {
            self.stuck = None;
            return Poll::Ready(done);
        }
        let timeout = self.timeout;
        let stuck = self
            .stuck
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stuck.as_mut().poll(cx));
        observe::client_limit("send_timeout");
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client stopped reading its answer",
        )))
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = self.bounded(cx, |stream, cx| stream.poll_write(cx, buf));
        self.note(&written);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = self.bounded(cx, |stream, cx| stream.poll_write_vectored(cx, bufs));
        self.note(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, AsyncWrite::poll_flush)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, AsyncWrite::poll_shutdown)
    }
}
