//! The `/metrics` endpoint: a deliberately tiny HTTP/1.1 responder.
//!
//! Prometheus only ever sends `GET /metrics`, so a full HTTP stack would be weight without use.
//! The server lives on its own thread with a current-thread tokio runtime: the training loop stays
//! synchronous, and a slow or stuck scraper only costs that thread a bounded wait. The listener is
//! bound before the thread starts so that a busy port is an error the caller sees, and port 0
//! resolves to a real address the caller can print.
//!
//! Abuse is bounded: only `GET` (and `HEAD`) of `/metrics` is served (404 for other paths, 405
//! for other methods), a request head past 8 KiB is refused with 400, and at most
//! [`MAX_CONNECTIONS`] connections are served at once — one more is answered 503 at once, so a
//! flood or a crowd of idle sockets costs the trainer a bounded number of tasks and file
//! descriptors, never its memory; the text itself is re-encoded at most every 100 ms
//! (`snapshot.rs`), so a flood costs socket work, not a gather per request. The address is `logging.prometheus.address` (default
//! `127.0.0.1`, this host only).

use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};

use crate::error::TelemetryError;
use crate::snapshot::Snapshot;

/// A request head larger than this is refused; Prometheus sends a few hundred bytes.
const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;
/// What a refused connection may still send before it is closed.
const MAX_DRAIN_BYTES: usize = 64 * 1024;
/// How long one connection may take to send its request or receive the answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; Prometheus holds one.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection refused for being one too many may take to receive its 503.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop cannot spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// A running `/metrics` server; dropping it (or calling [`MetricsServer::stop`]) shuts it down.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub(crate) fn start(
        registry: Registry,
        address: &str,
        port: u16,
    ) -> Result<Self, TelemetryError> {
        let bind_error = |source| TelemetryError::Bind {
            address: address.to_owned(),
            port,
            source,
        };
        let listener = StdTcpListener::bind((address, port)).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        if !local_addr.ip().is_loopback() {
            tracing::warn!(%local_addr, "/metrics is reachable from other hosts");
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(TelemetryError::ServerStart)?;
        let (shutdown, shutdown_received) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("ferrotron-metrics".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            let metrics = Arc::new(Snapshot::new(registry));
                            accept_until(listener, metrics, shutdown_received).await
                        }
                        Err(error) => tracing::error!(%error, "cannot serve /metrics"),
                    }
                });
            })
            .map_err(TelemetryError::ServerStart)?;
        tracing::debug!(%local_addr, "serving Prometheus /metrics");
        Ok(Self {
            local_addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address actually bound (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving and waits for the server thread to end.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The receiver is gone only if the server already ended; nothing left to stop then.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the /metrics server thread panicked");
        }
    }
}

async fn accept_until(
    listener: TcpListener,
    metrics: Arc<Snapshot>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        tokio::spawn(async move {
                            let busy = Response::text(503, "Service Unavailable", "too many connections\n");
                            let _ = tokio::time::timeout(REFUSAL_TIMEOUT, refuse(stream, busy)).await;
                        });
                        continue;
                    };
                    let metrics = Arc::clone(&metrics);
                    tokio::spawn(async move {
                        let _permit = permit;
                        let answered =
                            tokio::time::timeout(CONNECTION_TIMEOUT, answer(stream, &metrics)).await;
                        match answered {
                            Ok(Ok(())) => {}
                            Ok(Err(error)) => tracing::debug!(%peer, %error, "/metrics connection failed"),
                            Err(_) => tracing::debug!(%peer, "/metrics connection timed out"),
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a /metrics connection");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
            },
        }
    }
}

/// Answers `response` without reading the request, and closes.
async fn refuse(mut stream: TcpStream, response: Response) -> io::Result<()> {
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}

/// Reads one request head, writes one response, closes the connection.
async fn answer(mut stream: TcpStream, metrics: &Snapshot) -> io::Result<()> {
    let head = read_request_head(&mut stream).await?;
    let Some(head) = head else {
        let refused = Response::text(400, "Bad Request", "request head too large or incomplete\n");
        stream.write_all(&refused.to_bytes()).await?;
        stream.shutdown().await?;
        return drain(&mut stream).await;
    };
    let response = respond(&head, metrics);
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}

/// Reads and drops what the client still sends (up to a bound), so that closing with unread
/// input does not reset the connection before the client has read the refusal.
async fn drain(stream: &mut TcpStream) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    let mut left = MAX_DRAIN_BYTES;
    while left > 0 {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        left = left.saturating_sub(read);
    }
    Ok(())
}

/// The head up to and including the blank line that ends it; `None` when it is longer than
/// [`MAX_REQUEST_HEAD_BYTES`] or the connection ends first.
async fn read_request_head(stream: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head.windows(4).position(|window| window == b"\r\n\r\n") {
            let len = end + 4;
            return Ok((len <= MAX_REQUEST_HEAD_BYTES).then(|| head[..len].to_vec()));
        }
        if head.len() > MAX_REQUEST_HEAD_BYTES {
            return Ok(None);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..read]);
    }
}

fn respond(head: &[u8], metrics: &Snapshot) -> Response {
    let Some((method, path)) = request_line(head) else {
        return Response::text(400, "Bad Request", "malformed request line\n");
    };
    let path = path.split('?').next().unwrap_or(path);
    if path != "/metrics" {
        return Response::text(404, "Not Found", "not found; metrics are at /metrics\n");
    }
    let include_body = match method {
        "GET" => true,
        "HEAD" => false,
        _ => {
            return Response::text(405, "Method Not Allowed", "use GET\n")
                .with_header("Allow: GET, HEAD");
        }
    };
    match metrics.text() {
        Ok(text) => Response {
            status: 200,
            reason: "OK",
            content_type: prometheus::TEXT_FORMAT,
            body: text.as_bytes().to_vec(),
            include_body,
            extra_header: None,
        },
        Err(error) => Response::text(
            500,
            "Internal Server Error",
            &format!("cannot encode metrics: {error}\n"),
        ),
    }
}

/// `(method, target)` from `METHOD TARGET HTTP/1.x`.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line_end = head.windows(2).position(|window| window == b"\r\n")?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    (parts.next().is_none() && version.starts_with("HTTP/1.")).then_some((method, target))
}

struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
    include_body: bool,
    extra_header: Option<&'static str>,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: &str) -> Self {
        Self {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
            include_body: true,
            extra_header: None,
        }
    }

    fn with_header(mut self, header: &'static str) -> Self {
        self.extra_header = Some(header);
        self
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        if let Some(header) = self.extra_header {
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend_from_slice(b"\r\n");
        if self.include_body {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_line_is_parsed() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(request_line(b"GET /metrics SPDY/3\r\n\r\n"), None);
        assert_eq!(request_line(b"no line end"), None);
    }

    #[test]
    fn head_requests_get_headers_without_body() {
        let metrics = Snapshot::new(Registry::new());
        let response = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", &metrics);
        assert_eq!(response.status, 200);
        let bytes = String::from_utf8(response.to_bytes()).expect("utf-8");
        assert!(bytes.ends_with("\r\n\r\n"), "{bytes}");
    }

    #[test]
    fn other_methods_are_refused() {
        let metrics = Snapshot::new(Registry::new());
        let response = respond(b"POST /metrics HTTP/1.1\r\n\r\n", &metrics);
        assert_eq!(response.status, 405);
        let bytes = String::from_utf8(response.to_bytes()).expect("utf-8");
        assert!(bytes.contains("Allow: GET, HEAD\r\n"), "{bytes}");
    }

    #[test]
    fn query_strings_are_ignored() {
        let metrics = Snapshot::new(Registry::new());
        let response = respond(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n", &metrics);
        assert_eq!(response.status, 200);
    }
}
