//! One client connection's life, from accept to close: head reading, the gate,
//! forwarding.
//!
//! One task per client connection, each a loop of exchanges:
//!
//! ```text
//! accept ─ gate.on_accept ─Err→ 503 + close (request never read)
//!   └→ read head (header/idle timeout, size limits) ─bad→ 400/408/431/501 + close
//!       └→ local endpoint (/farside/metrics, if data_port_metrics) ─→ respond ─┐
//!       └→ gate.route_request(host, target) ─Err→ reject status (+Retry-After) ─→ respond ─┤
//!       └→ pool.checkout: idle conn, or a permit under the back-end's maxconn
//!          (waits ≤ http.queue_timeout_ms) ─Err→ 503 (+Retry-After) ─→ respond ─┤
//!       └→ pooled or new upstream conn ─fail→ 502/504 ─────────→ respond ─┤
//!           └→ send head + stream body → read response head (retry once on a
//!              fresh connection if a pooled one was stale) → stream body back ─┤
//!   ←───────────────── keep-alive: next head ←──────────────────────────────┘
//! ```
//!
//! Buffers live per connection and are reused by every exchange on it: the client read
//! buffer, the upstream read buffer (allocated on first use), and one output `Vec` that
//! holds each rewritten head, so a head and the first body bytes go out in one write.
//! Bodies are streamed, never buffered whole. Every wait has a timeout from
//! [`HttpConfig`](crate::config::HttpConfig), so no peer can hold a task forever, and a
//! failure only ever closes the connection it happened on.
//!
//! Body transfers also have a total deadline and a minimum average rate (`Pace`, in
//! [`super::transfer`]): a request body that misses them gets 408, a response body
//! (back-end reads, client writes) is cut off.
//!
//! Chunked bodies are relayed byte for byte only after
//! [`Chunked`](crate::http::Chunked) has checked them against RFC 9112's grammar, so
//! the next hop delimits them exactly as the proxy did (no request smuggling through
//! lenient framing).
//!
//! Draining ([`crate::lifecycle`]): a connection idle between requests is closed, one
//! accepted just before the listener closed gets `DRAIN_FIRST_BYTE_GRACE` for its
//! request to arrive, and the response in flight is the connection's last
//! (`Connection: close`).

use super::generation::{render_metrics, HeadLimits, Live, Shared};
use super::transfer::{write_all_timeout, write_all_until, write_two, Body, Buf, Pace};
use crate::gate::Route;
use crate::http::{self, BodyFraming, ChunkError, RequestError, RequestHead};
use crate::lifecycle::Lifecycle;
use crate::metrics::UpstreamError;
use crate::pool::Checkout;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{timeout, timeout_at, Instant};

/// Upstream read buffer: a 16 KiB object plus its head arrives in one read.
const UPSTREAM_BUF_BYTES: usize = 32 * 1024;
/// Initial client read buffer; grows up to `http.max_header_bytes` for large heads.
const CLIENT_BUF_BYTES: usize = 8 * 1024;
/// After an error response or `Connection: close`, keep reading (and discarding) for at
/// most this long before closing, so unread request bytes do not turn our close into a
/// reset that destroys the response in the client's receive buffer.
const LINGER: Duration = Duration::from_millis(500);
/// ...and at most this many bytes.
const LINGER_BYTES_MAX: usize = 64 * 1024;
/// During a drain, how long a connection accepted before the listener closed may stay
/// silent before it is closed: a client sends its request right after connecting, so
/// this covers the race with the close without letting a silent one hold the drain up
/// to `http.header_timeout_ms` (and stays under the lab's 3 s stop grace).
const DRAIN_FIRST_BYTE_GRACE: Duration = Duration::from_millis(500);

/// Serve one accepted client connection until it closes (the task [`super::runtime`]'s
/// accept loop spawns); `_permit` holds its place under `http.max_client_conns`.
pub(super) async fn handle_conn(
    live: Arc<Live>,
    client: TcpStream,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
) {
    let _active = ActiveConn::new(live.clone());
    let _ = client.set_nodelay(true);
    {
        let sh = live.current();
        if let Err(r) = sh.gate.on_accept(peer) {
            sh.metrics
                .here()
                .conns_rejected_at_accept
                .fetch_add(1, Relaxed);
            sh.metrics.reject(r);
            reject_at_accept(&sh, client, r).await;
            return;
        }
    }
    let conn = Conn {
        client,
        peer_ip: peer.ip().to_string(),
        rbuf: Buf::new(CLIENT_BUF_BYTES, live.metrics.clone()),
        ubuf: Buf::new(UPSTREAM_BUF_BYTES, live.metrics.clone()),
        out: Vec::new(),
        bytes_in: 0,
        bytes_out: 0,
    };
    conn.serve(&live).await;
}

/// Keeps `connections_active` (and the drain's count of client connections) right
/// however the task ends.
struct ActiveConn {
    live: Arc<Live>,
}

impl ActiveConn {
    fn new(live: Arc<Live>) -> Self {
        live.metrics.here().conns_accepted.fetch_add(1, Relaxed);
        live.metrics.here().conns_active.fetch_add(1, Relaxed);
        live.life.conn_opened();
        ActiveConn { live }
    }
}

impl Drop for ActiveConn {
    fn drop(&mut self) {
        self.live.metrics.here().conns_active.fetch_sub(1, Relaxed);
        self.live.life.conn_closed();
    }
}

/// The paper's earliest rejection: answer before reading a byte of the request.
async fn reject_at_accept(sh: &Shared, mut client: TcpStream, r: crate::gate::Reject) {
    let status = r.status();
    let retry = (status == 503).then(|| sh.gate.retry_after_s());
    let mut out = Vec::with_capacity(192);
    http::local_response(
        &mut out,
        status,
        true,
        retry,
        "text/plain",
        r.reason().as_bytes(),
        false,
    );
    sh.metrics.response(status);
    if write_all_timeout(&mut client, &out, LINGER).await.is_ok() {
        sh.metrics
            .here()
            .bytes_out
            .fetch_add(out.len() as u64, Relaxed);
        lingering_close(client).await;
    }
}

/// Half-close, then discard what the client still sends (bounded), then close.
async fn lingering_close(mut client: TcpStream) {
    if client.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    // On the heap: an array here would sit in every connection task's state (the
    // future's size is that of its largest await point), idle ones included.
    let mut scratch = vec![0u8; 4096];
    let mut discarded = 0;
    while discarded < LINGER_BYTES_MAX {
        match timeout_at(deadline, client.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => discarded += n,
            _ => break,
        }
    }
}

/// A write to the client that failed on its deadline cuts the response body off.
fn count_write_timeout(sh: &Shared, e: &io::Error) {
    if e.kind() == io::ErrorKind::TimedOut {
        sh.metrics
            .here()
            .response_body_timeouts
            .fetch_add(1, Relaxed);
    }
}

/// Move a pooled upstream connection to this worker's I/O driver. The pool is shared by
/// all workers, and a connection stays registered with the driver of the worker that
/// opened it: used from another worker as is, every readiness event would reach this one
/// through that worker's thread (a cross-thread wake-up, late while that worker is busy).
/// With several workers it is re-registered here (two `epoll_ctl` calls per reuse).
fn rehome(s: TcpStream, workers: usize) -> io::Result<TcpStream> {
    if workers <= 1 {
        return Ok(s);
    }
    TcpStream::from_std(s.into_std()?)
}

/// Open an upstream connection that acknowledges like a warm one from its first byte
/// (`TCP_QUICKACK` off, [`delayed_acks`]): under a queued back-end every request comes
/// on a connection of its own, and in quick-ACK mode (Linux's default for a new
/// connection's first 16 ACKs) this proxy would answer each segment of the response
/// with an ACK that the back-end's CPU, the bottleneck, must then process. Measured on
/// the lab's `single` scenario: 16 segments received per request by the back-end on
/// fresh connections against 2 on kept-alive ones, and ~45 µs more of its CPU per
/// served request. Delayed ACKs still acknowledge every second full segment and every
/// read, so a response larger than the back-end's initial window is not held back.
/// Set before the handshake it also lets the handshake's last ACK ride on the request;
/// the handshake puts the connection back in quick-ACK mode, so it is set again after.
async fn connect(addr: SocketAddr, limit: Duration) -> Result<TcpStream, UpstreamError> {
    let sock = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(|_| UpstreamError::Connect)?;
    let _ = sock.set_nodelay(true);
    delayed_acks(&sock);
    match timeout(limit, sock.connect(addr)).await {
        Err(_) => Err(UpstreamError::ConnectTimeout),
        Ok(Err(_)) => Err(UpstreamError::Connect),
        Ok(Ok(s)) => {
            delayed_acks(&s);
            Ok(s)
        }
    }
}

/// Turn quick-ACK mode off on a TCP socket (`TCP_QUICKACK` = 0: the kernel's delayed-ACK
/// "ping-pong" mode, as on a request/response connection that has warmed up). Best
/// effort: a socket that refuses it acknowledges as before.
fn delayed_acks(s: &impl std::os::fd::AsRawFd) {
    let off: libc::c_int = 0;
    // SAFETY: a valid socket fd and a pointer to a c_int of the stated length.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// What to do with the client connection after an exchange.
enum Next {
    KeepAlive,
    /// Half-close gracefully (the response is complete).
    Close,
    /// Drop at once (the response is incomplete; the client must see the close).
    Abort,
}

/// Why reading a request head ended without a head.
enum HeadFail {
    Bad(RequestError),
    Timeout,
}

struct Conn {
    client: TcpStream,
    peer_ip: String,
    rbuf: Buf,
    ubuf: Buf,
    /// Staging for every head (and the first body bytes) written to either side.
    out: Vec<u8>,
    bytes_in: u64,
    bytes_out: u64,
}

impl Conn {
    async fn serve(mut self, live: &Live) {
        let accepted = Instant::now();
        let mut first = true;
        loop {
            // Draining: a kept-alive client between requests is closed now (its last
            // response said `Connection: close` unless the drain began after it).
            if !first && live.life.draining() && self.rbuf.is_empty() {
                break;
            }
            if self.rbuf.is_empty() {
                // Idle until the next request: hold no buffers meanwhile (they are
                // allocated again when its first bytes arrive).
                self.rbuf.release();
                self.ubuf.release();
                self.out = Vec::new();
            }
            let limits = live.current().limits();
            let req = self.read_head(limits, &live.life, first, accepted).await;
            // Looked up per request: a reload applies to the next request.
            let current = live.current();
            let sh = &*current;
            let req = match req {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(fail) => {
                    let (status, reason) = match fail {
                        HeadFail::Bad(e) => (e.status(), e.reason()),
                        HeadFail::Timeout => (408, "header_timeout"),
                    };
                    let sent = self
                        .respond(sh, status, true, None, reason.as_bytes(), false)
                        .await;
                    self.flush_counts(sh);
                    if sent.is_ok() {
                        lingering_close(self.client).await;
                    }
                    return;
                }
            };
            first = false;
            let started = Instant::now();
            // Boxed: the exchange's large state lives on the heap only while it runs, so
            // a connection idle between requests keeps just the small head-reading state.
            let next = Box::pin(self.exchange(sh, req)).await;
            sh.metrics.latency(started.elapsed());
            self.flush_counts(sh);
            match next {
                Next::KeepAlive if !sh.life.draining() => {}
                Next::KeepAlive | Next::Close => return lingering_close(self.client).await,
                Next::Abort => return,
            }
        }
        self.flush_counts(&live.current());
    }

    fn flush_counts(&mut self, sh: &Shared) {
        sh.metrics.here().bytes_in.fetch_add(self.bytes_in, Relaxed);
        sh.metrics
            .here()
            .bytes_out
            .fetch_add(self.bytes_out, Relaxed);
        self.bytes_in = 0;
        self.bytes_out = 0;
    }

    /// Read until a complete request head is buffered. `Ok(None)`: the client closed or
    /// idled out between requests (close quietly).
    async fn read_head(
        &mut self,
        h: HeadLimits,
        life: &Lifecycle,
        first: bool,
        accepted: Instant,
    ) -> Result<Option<RequestHead>, HeadFail> {
        // The first head must be complete `header_timeout` after accept; on a keep-alive
        // connection the client may idle `idle_timeout` before starting the next one.
        let mut awaiting_first_byte = !first && self.rbuf.is_empty();
        let mut deadline = if first {
            accepted + h.header_timeout
        } else if awaiting_first_byte {
            Instant::now() + h.idle_timeout
        } else {
            Instant::now() + h.header_timeout
        };
        loop {
            if !self.rbuf.is_empty() {
                match http::parse_request_with(
                    self.rbuf.filled(),
                    h.max_headers,
                    h.max_header_bytes,
                    &self.peer_ip,
                    h.pass_rdma,
                    &mut self.out,
                ) {
                    Ok(Some(req)) => return Ok(Some(req)),
                    Ok(None) => {}
                    Err(e) => return Err(HeadFail::Bad(e)),
                }
            }
            let silent_new_conn = first && self.rbuf.is_empty();
            let read = self.rbuf.read_from(&mut self.client, h.max_header_bytes);
            // Draining: an idle kept-alive client is closed at once; a new one that has
            // sent nothing yet gets DRAIN_FIRST_BYTE_GRACE for its request to arrive.
            let drained = async {
                if awaiting_first_byte {
                    life.until_draining().await
                } else if silent_new_conn {
                    life.until_draining().await;
                    tokio::time::sleep(DRAIN_FIRST_BYTE_GRACE).await
                } else {
                    std::future::pending().await
                }
            };
            let read = tokio::select! {
                r = timeout_at(deadline, read) => r,
                _ = drained => return Ok(None),
            };
            match read {
                Err(_) if self.rbuf.is_empty() => return Ok(None),
                Err(_) => return Err(HeadFail::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                Ok(Ok(n)) => {
                    self.bytes_in += n as u64;
                    if awaiting_first_byte {
                        awaiting_first_byte = false;
                        deadline = Instant::now() + h.header_timeout;
                    }
                }
            }
        }
    }

    /// Write a response generated by the proxy.
    async fn respond(
        &mut self,
        sh: &Shared,
        status: u16,
        close: bool,
        retry_after_s: Option<u32>,
        body: &[u8],
        head_only: bool,
    ) -> io::Result<()> {
        http::local_response(
            &mut self.out,
            status,
            close,
            retry_after_s,
            "text/plain",
            body,
            head_only,
        );
        sh.metrics.response(status);
        self.bytes_out += self.out.len() as u64;
        write_all_timeout(&mut self.client, &self.out, sh.idle_timeout).await
    }

    /// Answer `req` locally. The connection stays open only if the client wants it and
    /// its request body (if any) was already buffered, so it can be skipped.
    async fn respond_to(
        &mut self,
        sh: &Shared,
        req: &RequestHead,
        status: u16,
        retry_after_s: Option<u32>,
        body: &[u8],
    ) -> Next {
        self.rbuf.consume(req.head_len);
        let mut rest = Body::new(req.framing, false);
        let skipped = rest
            .advance(self.rbuf.filled(), &mut Vec::new())
            .unwrap_or(0);
        self.rbuf.consume(skipped);
        let close = !req.keep_alive || !rest.is_done() || sh.life.draining();
        match self
            .respond(sh, status, close, retry_after_s, body, req.is_head)
            .await
        {
            Ok(()) if close => Next::Close,
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Abort,
        }
    }

    /// One request/response exchange for a parsed head (whose rewritten form is in `out`).
    async fn exchange(&mut self, sh: &Shared, req: RequestHead) -> Next {
        let target = &self.rbuf.filled()[req.target.clone()];
        // Off unless `data_port_metrics`: the data port is public, the metrics are not.
        if sh.cfg.data_port_metrics && target == b"/farside/metrics" {
            return if req.is_get || req.is_head {
                let mut enc = farside_admin::Encoder::new();
                render_metrics(sh, &mut enc);
                let text = enc.finish();
                self.respond_to(sh, &req, 200, None, text.as_bytes()).await
            } else {
                self.respond_to(sh, &req, 405, None, b"method_not_allowed")
                    .await
            };
        }

        let routed = {
            let buf = self.rbuf.filled();
            let host = req
                .host
                .clone()
                .and_then(|r| std::str::from_utf8(&buf[r]).ok());
            // The target classifies the request (class-aware admission): a borrowed
            // slice of the read buffer, no copy.
            sh.gate.route_request(host, &buf[req.target.clone()])
        };
        let route = match routed {
            Ok(route) => route,
            Err(r) => return self.reject(sh, &req, r).await,
        };
        // Before the head is consumed, so a refusal here is answered like the gate's.
        let waited_from = Instant::now();
        let checkout = sh
            .pool
            .checkout(
                route.backend,
                route.addr,
                route.reuse_only,
                sh.queue_timeout,
            )
            .await;
        sh.metrics.upstream_wait(waited_from.elapsed());
        match checkout {
            Ok(c) => self.proxy(sh, req, route, c).await,
            Err(r) => {
                drop(route);
                self.reject(sh, &req, r).await
            }
        }
    }

    /// Answer `req` with the status of a rejection (503s carry `Retry-After`).
    async fn reject(&mut self, sh: &Shared, req: &RequestHead, r: crate::gate::Reject) -> Next {
        sh.metrics.reject(r);
        let status = r.status();
        let retry = (status == 503).then(|| sh.gate.retry_after_s());
        self.respond_to(sh, req, status, retry, r.reason().as_bytes())
            .await
    }

    async fn proxy(
        &mut self,
        sh: &Shared,
        mut req: RequestHead,
        route: Route,
        checkout: Checkout,
    ) -> Next {
        self.rbuf.consume(req.head_len);
        if req.host.is_none() {
            // Only HTTP/1.0 may omit Host, but the request goes upstream as HTTP/1.1,
            // which must carry one (RFC 9112 §3.2; nginx answers 400 without): name the
            // back-end. `out` ends with the head's empty line.
            let end = self.out.len() - 2;
            let host = format!("Host: {}\r\n", route.addr);
            self.out.splice(end..end, host.bytes());
        }
        // The request body's deadlines (see `send_request`).
        let mut pace: Option<Pace> = None;
        if req.expect_continue {
            // We strip Expect and answer it ourselves: the client would otherwise wait
            // for the 100 while we wait for its body.
            const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
            if write_all_timeout(&mut self.client, CONTINUE, sh.idle_timeout)
                .await
                .is_err()
            {
                return Next::Abort;
            }
            self.bytes_out += CONTINUE.len() as u64;
        }
        // Whatever part of the request body is already buffered goes out with the head.
        let mut body = Body::new(req.framing, false);
        let buffered_body = match body.advance(self.rbuf.filled(), &mut Vec::new()) {
            Ok(n) => {
                self.out.extend_from_slice(&self.rbuf.filled()[..n]);
                self.rbuf.consume(n);
                n
            }
            Err(ChunkError) => return self.request_body_failed(sh, BodyFail::Malformed).await,
        };
        // A request that fits in `out` can be sent again if a pooled connection was stale.
        let retryable = body.is_done() && req.idempotent;

        // A retry after a stale pooled connection connects afresh under that
        // connection's permit (the back-end closed it, so the count is unchanged).
        let mut next = Some(checkout);
        let (mut up, permit, resp) = loop {
            let (reused, mut up, permit) = match next.take().expect("set for every attempt") {
                Checkout::Pooled(s, p) => match rehome(s, sh.cfg.workers) {
                    Ok(s) => {
                        sh.metrics.here().upstream_reused.fetch_add(1, Relaxed);
                        (true, s, p)
                    }
                    // Its old driver is gone (that worker stopped): connect afresh.
                    Err(_) => {
                        next = Some(Checkout::Fresh(p));
                        continue;
                    }
                },
                Checkout::Fresh(p) => match connect(route.addr, sh.connect_timeout).await {
                    Ok(s) => {
                        sh.metrics.here().upstream_connects.fetch_add(1, Relaxed);
                        (false, s, p)
                    }
                    Err(e) => {
                        sh.gate.report_failure(route.backend);
                        return self.upstream_failed(sh, &req, e, body.is_done()).await;
                    }
                },
            };
            // The request body's deadlines run from when the proxy starts relaying it: time
            // spent getting a back-end connection is not the client's to make up.
            let pace = pace.get_or_insert_with(|| {
                let mut p = Pace::new(sh, Instant::now(), sh.request_body_timeout);
                p.moved(buffered_body);
                p
            });
            match self.send_request(sh, &mut up, &mut body, pace).await {
                Ok(()) => {}
                // `up` holds part of a request: dropping it closes it, never pooled.
                Err(Side::Client(f)) => return self.request_body_failed(sh, f).await,
                Err(Side::Upstream) if reused && retryable => {
                    sh.metrics.here().upstream_retries.fetch_add(1, Relaxed);
                    next = Some(Checkout::Fresh(permit));
                    continue;
                }
                Err(Side::Upstream) => {
                    let e = UpstreamError::ResetBeforeHead;
                    return self.upstream_failed(sh, &req, e, body.is_done()).await;
                }
            }
            match self.read_response_head(sh, &mut up, &mut req).await {
                Ok(resp) => break (up, permit, resp),
                Err((UpstreamError::ResetBeforeHead, false)) if reused && retryable => {
                    sh.metrics.here().upstream_retries.fetch_add(1, Relaxed);
                    next = Some(Checkout::Fresh(permit));
                }
                Err((e, _)) => {
                    if !reused && e == UpstreamError::ResetBeforeHead {
                        sh.gate.report_failure(route.backend);
                    }
                    return self.upstream_failed(sh, &req, e, body.is_done()).await;
                }
            }
        };

        // A short body still arriving (a typical back-end writes the head, then sends the
        // file) is read in full before the first write, so the client gets the response
        // in one segment: it is woken, and acknowledges, once per response instead of
        // twice. Bounded by the buffer and by the response timeout; as nothing has been
        // sent yet, a back-end failing here gets the client a 502.
        // The response body's deadlines (total, minimum rate) bound every wait from here
        // on: back-end reads and client writes alike.
        let mut pace = Pace::new(sh, Instant::now(), sh.response_body_timeout);
        if let BodyFraming::Length(len) = resp.framing {
            let want = resp.head_len.saturating_add(len as usize);
            while !resp.dechunk && want <= UPSTREAM_BUF_BYTES && self.ubuf.len() < want {
                let read = self.ubuf.read_from(&mut up, UPSTREAM_BUF_BYTES);
                match timeout_at(pace.until(sh.response_timeout), read).await {
                    Ok(Ok(n)) if n > 0 => {}
                    r => {
                        if r.is_err() {
                            sh.metrics
                                .here()
                                .response_body_timeouts
                                .fetch_add(1, Relaxed);
                        }
                        sh.metrics.upstream_error(UpstreamError::MidBody);
                        return self.upstream_failed_before_head(sh, &req).await;
                    }
                }
            }
        }

        // Relay the response: head plus the body bytes already read, in one (vectored)
        // write; the body bytes are not copied unless they must be decoded.
        self.ubuf.consume(resp.head_len);
        let mut body = Body::new(resp.framing, resp.dechunk);
        // Captured now: a body that completes becomes `Body::Done`, which decodes nothing.
        let decode = body.decodes();
        let n = match body.advance(self.ubuf.filled(), &mut self.out) {
            Ok(n) => n,
            Err(ChunkError) => {
                sh.metrics.upstream_error(UpstreamError::BadHead);
                return self.upstream_failed_before_head(sh, &req).await;
            }
        };
        let raw = if decode {
            &[][..]
        } else {
            &self.ubuf.filled()[..n]
        };
        let deadline = pace.until(sh.idle_timeout);
        let written = write_two(&mut self.client, &self.out, raw, deadline).await;
        if let Err(e) = written {
            count_write_timeout(sh, &e);
            return Next::Abort;
        }
        self.bytes_out += (self.out.len() + raw.len()) as u64;
        pace.moved(raw.len());
        self.ubuf.consume(n);
        let until_close = matches!(body, Body::UntilClose);
        while !body.is_done() {
            let read = self.ubuf.read_from(&mut up, UPSTREAM_BUF_BYTES);
            match timeout_at(pace.until(sh.response_timeout), read).await {
                Ok(Ok(n)) if n > 0 => {}
                Ok(Ok(_)) if until_close => break,
                r => {
                    if r.is_err() {
                        sh.metrics
                            .here()
                            .response_body_timeouts
                            .fetch_add(1, Relaxed);
                    }
                    sh.metrics.upstream_error(UpstreamError::MidBody);
                    return Next::Abort;
                }
            }
            self.out.clear();
            let n = match body.advance(self.ubuf.filled(), &mut self.out) {
                Ok(n) => n,
                Err(ChunkError) => {
                    sh.metrics.upstream_error(UpstreamError::MidBody);
                    return Next::Abort;
                }
            };
            let chunk = if decode {
                &self.out[..]
            } else {
                &self.ubuf.filled()[..n]
            };
            let deadline = pace.until(sh.idle_timeout);
            if let Err(e) = write_all_until(&mut self.client, chunk, deadline).await {
                count_write_timeout(sh, &e);
                return Next::Abort;
            }
            self.bytes_out += chunk.len() as u64;
            pace.moved(chunk.len());
            self.ubuf.consume(n);
        }
        // Bytes beyond the response mean a confused back-end: do not reuse that connection.
        if resp.upstream_reusable && self.ubuf.is_empty() {
            sh.pool.put(route.backend, route.addr, up, permit);
        }
        self.ubuf.clear();
        drop(route);
        sh.metrics.response(resp.status);
        if resp.client_close {
            Next::Close
        } else {
            Next::KeepAlive
        }
    }

    /// Send the head in `out` (with any buffered body bytes), then stream the rest of the
    /// request body from the client. `out` is left intact when the body was complete, so
    /// the request can be resent.
    ///
    /// Each read from the client is bounded by `pace` (the request body's total and
    /// minimum-rate deadlines) as well as by the idle timeout.
    async fn send_request(
        &mut self,
        sh: &Shared,
        up: &mut TcpStream,
        body: &mut Body,
        pace: &mut Pace,
    ) -> Result<(), Side> {
        write_all_timeout(up, &self.out, sh.response_timeout)
            .await
            .map_err(|_| Side::Upstream)?;
        while !body.is_done() {
            let read = self
                .rbuf
                .read_from(&mut self.client, sh.cfg.http.max_header_bytes);
            match timeout_at(pace.until(sh.idle_timeout), read).await {
                Ok(Ok(n)) if n > 0 => self.bytes_in += n as u64,
                Err(_) => return Err(Side::Client(BodyFail::Timeout)),
                Ok(_) => return Err(Side::Client(BodyFail::Gone)),
            }
            let n = body
                .advance(self.rbuf.filled(), &mut Vec::new())
                .map_err(|_| Side::Client(BodyFail::Malformed))?;
            write_all_timeout(up, &self.rbuf.filled()[..n], sh.response_timeout)
                .await
                .map_err(|_| Side::Upstream)?;
            self.rbuf.consume(n);
            pace.moved(n);
        }
        Ok(())
    }

    /// The client's request body failed before any of the response was sent: tell it
    /// why if it can still hear (408 / 400), then close. Whatever part of the request
    /// reached a back-end dies with that connection, which is never reused.
    async fn request_body_failed(&mut self, sh: &Shared, f: BodyFail) -> Next {
        let (status, reason): (u16, &[u8]) = match f {
            BodyFail::Gone => return Next::Abort,
            BodyFail::Timeout => {
                sh.metrics
                    .here()
                    .request_body_timeouts
                    .fetch_add(1, Relaxed);
                (408, b"request_body_timeout")
            }
            BodyFail::Malformed => (400, b"malformed_chunked_body"),
        };
        match self.respond(sh, status, true, None, reason, false).await {
            Ok(()) => Next::Close,
            Err(_) => Next::Abort,
        }
    }

    /// Read the back-end's response head into `ubuf`, skipping interim 1xx responses.
    /// On error, the flag says whether any response byte had arrived.
    async fn read_response_head(
        &mut self,
        sh: &Shared,
        up: &mut TcpStream,
        req: &mut RequestHead,
    ) -> Result<http::ResponseHead, (UpstreamError, bool)> {
        let h = &sh.cfg.http;
        let limit = h.max_header_bytes.max(UPSTREAM_BUF_BYTES);
        let deadline = Instant::now() + sh.response_timeout;
        let mut got_bytes = false;
        self.ubuf.clear();
        loop {
            if !self.ubuf.is_empty() {
                // Draining: this response is the connection's last (`Connection: close`).
                if sh.life.draining() {
                    req.keep_alive = false;
                }
                match http::parse_response(
                    self.ubuf.filled(),
                    h.max_headers,
                    h.max_header_bytes,
                    req,
                    &mut self.out,
                ) {
                    Ok(Some(resp)) if resp.status < 200 => {
                        self.ubuf.consume(resp.head_len);
                        continue;
                    }
                    Ok(Some(resp)) => return Ok(resp),
                    Ok(None) => {}
                    Err(_) => return Err((UpstreamError::BadHead, true)),
                }
            }
            match timeout_at(deadline, self.ubuf.read_from(up, limit)).await {
                Err(_) => return Err((UpstreamError::HeadTimeout, got_bytes)),
                Ok(Ok(0)) | Ok(Err(_)) => return Err((UpstreamError::ResetBeforeHead, got_bytes)),
                Ok(Ok(_)) => got_bytes = true,
            }
        }
    }

    async fn upstream_failed(
        &mut self,
        sh: &Shared,
        req: &RequestHead,
        e: UpstreamError,
        body_consumed: bool,
    ) -> Next {
        sh.metrics.upstream_error(e);
        let close = !req.keep_alive || !body_consumed || sh.life.draining();
        match self
            .respond(
                sh,
                e.status(),
                close,
                None,
                e.kind().as_bytes(),
                req.is_head,
            )
            .await
        {
            Ok(()) if close => Next::Close,
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Abort,
        }
    }

    /// The response head was fine but its first body bytes were not: nothing has been
    /// sent to the client yet, so it still gets a 502 (and the connection closes).
    async fn upstream_failed_before_head(&mut self, sh: &Shared, req: &RequestHead) -> Next {
        match self
            .respond(sh, 502, true, None, b"bad_upstream_body", req.is_head)
            .await
        {
            Ok(()) => Next::Close,
            Err(_) => Next::Abort,
        }
    }
}

/// Which side of an exchange failed.
enum Side {
    Client(BodyFail),
    Upstream,
}

/// How a client's request body failed.
enum BodyFail {
    /// The client closed or reset the connection.
    Gone,
    /// Idle, total or minimum-rate deadline of the request body.
    Timeout,
    /// A chunked body outside RFC 9112's grammar or the scanner's bounds.
    Malformed,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TCP_QUICKACK` as the kernel reports it: 0 in delayed-ACK (ping-pong) mode.
    fn quickack(s: &TcpStream) -> libc::c_int {
        use std::os::fd::AsRawFd;
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a valid socket fd, and a c_int buffer of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        v
    }

    #[tokio::test(flavor = "current_thread")]
    async fn upstream_connections_start_in_delayed_ack_mode() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let plain = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            quickack(&plain),
            1,
            "a new connection quick-ACKs by default"
        );
        let up = connect(addr, Duration::from_secs(5)).await.unwrap();
        assert_eq!(quickack(&up), 0, "the proxy's upstream connection does not");
        assert!(up.nodelay().unwrap());
        // And it carries data both ways as any connection does (the first accepted is
        // `plain`'s).
        let _plain_end = l.accept().await.unwrap();
        let (mut end, _) = l.accept().await.unwrap();
        let (mut up, mut b) = (up, [0u8; 4]);
        up.write_all(b"ping").await.unwrap();
        end.read_exact(&mut b).await.unwrap();
        end.write_all(b"pong").await.unwrap();
        up.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
    }
}
