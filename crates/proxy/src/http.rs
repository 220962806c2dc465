//! HTTP/1.1 message heads and body framing for the proxy data path.
//!
//! Everything here is synchronous and allocation-free on the hot path: a head is parsed
//! with `httparse` straight out of the connection's read buffer, and the rewritten head
//! for the other side is appended to one caller-owned `Vec<u8>` so that it goes out in a
//! single `write_all`. Bodies are never buffered whole: the server streams them, using
//! [`BodyFraming`] to know where they end and [`Chunked`] to find the end of a chunked
//! body (relayed byte for byte, or decoded for HTTP/1.0 clients).

use std::io::Write as _;
use std::ops::Range;

/// Header slots parsed on the stack; more (up to `http.max_headers`) go to the heap.
const STACK_HEADERS: usize = 128;

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (no Content-Length/Transfer-Encoding, HEAD, 1xx, 204, 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Responses only: the body runs until the back-end closes the connection.
    Close,
}

/// Why a request head was refused. Each maps to one status in [`RequestError::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// Bad request line or header syntax, bad Content-Length, CL together with TE,
    /// missing or repeated Host on HTTP/1.1.
    Malformed,
    /// The head is larger than `http.max_header_bytes`.
    HeadTooLarge,
    /// More than `http.max_headers` header fields.
    TooManyHeaders,
    /// A transfer coding other than `chunked`, or CONNECT.
    NotImplemented,
}

impl RequestError {
    pub fn status(self) -> u16 {
        match self {
            RequestError::Malformed => 400,
            RequestError::HeadTooLarge | RequestError::TooManyHeaders => 431,
            RequestError::NotImplemented => 501,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            RequestError::Malformed => "malformed_request",
            RequestError::HeadTooLarge => "header_too_large",
            RequestError::TooManyHeaders => "too_many_headers",
            RequestError::NotImplemented => "not_implemented",
        }
    }
}

/// What the data path needs to know about a parsed request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// Bytes of the head in the buffer, including the final CRLF.
    pub head_len: usize,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub is_head: bool,
    pub is_get: bool,
    /// Safe to resend on a fresh connection if a pooled one turns out to be dead.
    pub idempotent: bool,
    pub framing: BodyFraming,
    /// The client wants the connection kept open after this exchange.
    pub keep_alive: bool,
    /// `Expect: 100-continue` with a body: the proxy answers `100 Continue` itself.
    pub expect_continue: bool,
    /// The Host value without port, as offsets into the parsed buffer.
    pub host: Option<Range<usize>>,
    /// The request target, as offsets into the parsed buffer.
    pub target: Range<usize>,
}

/// Why a response head from a back-end was refused (the client gets 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseError {
    Malformed,
    HeadTooLarge,
}

/// What the data path needs to know about a parsed response head.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead {
    pub head_len: usize,
    pub status: u16,
    pub framing: BodyFraming,
    /// The back-end connection may go back to the pool once the body is relayed.
    pub upstream_reusable: bool,
    /// Close the client connection after this response.
    pub client_close: bool,
    /// Decode a chunked body for an HTTP/1.0 client (body then ends with the connection).
    pub dechunk: bool,
}

fn eq_ic(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// Comma-separated tokens of a header value, trimmed, empty ones skipped.
fn tokens(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&c| c == b',').map(trim).filter(|t| !t.is_empty())
}

fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    // 19 digits always fit in u64; longer is not a length anyone sends.
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    v.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Headers that describe one hop and are never forwarded. `Transfer-Encoding` and
/// `Content-Length` are re-framed by the proxy itself.
fn is_hop_by_hop(name: &str) -> bool {
    const HOP: [&str; 7] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "transfer-encoding",
    ];
    HOP.iter().any(|h| eq_ic(h, name))
}

/// Is `name` listed in any `Connection` header (and so hop-by-hop for this message)?
fn named_by_connection(name: &str, headers: &[httparse::Header<'_>]) -> bool {
    headers
        .iter()
        .filter(|h| eq_ic(h.name, "connection"))
        .flat_map(|h| tokens(h.value))
        .any(|t| t.eq_ignore_ascii_case(name.as_bytes()))
}

fn offset_in(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// `Host` value without the port; `[v6]:port` keeps its brackets.
fn strip_port(host: &[u8]) -> &[u8] {
    if host.first() == Some(&b'[') {
        return match host.iter().position(|&c| c == b']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.iter().rposition(|&c| c == b':') {
        Some(colon) => &host[..colon],
        None => host,
    }
}

fn with_headers<'b, R>(max_headers: usize, f: impl FnOnce(&mut [httparse::Header<'b>]) -> R) -> R {
    if max_headers <= STACK_HEADERS {
        let mut stack: [httparse::Header<'b>; STACK_HEADERS] =
            [httparse::EMPTY_HEADER; STACK_HEADERS];
        f(&mut stack[..max_headers])
    } else {
        let mut heap: Vec<httparse::Header<'b>> = vec![httparse::EMPTY_HEADER; max_headers];
        f(&mut heap)
    }
}

/// Parse a request head at the start of `buf`. `Ok(None)`: incomplete, read more.
/// On success the head to send upstream has been appended to `out` (cleared first):
/// hop-by-hop headers removed, `X-Forwarded-For`/`X-Forwarded-Proto` added, framing
/// re-stated, always as HTTP/1.1 so the upstream connection can be kept alive.
pub fn parse_request(
    buf: &[u8],
    max_headers: usize,
    max_header_bytes: usize,
    peer_ip: &str,
    out: &mut Vec<u8>,
) -> Result<Option<RequestHead>, RequestError> {
    with_headers(max_headers, |headers| {
        let mut req = httparse::Request::new(headers);
        let head_len = match req.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return if buf.len() >= max_header_bytes {
                    Err(RequestError::HeadTooLarge)
                } else {
                    Ok(None)
                };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooManyHeaders),
            Err(_) => return Err(RequestError::Malformed),
        };
        if head_len > max_header_bytes {
            return Err(RequestError::HeadTooLarge);
        }
        let method = req.method.ok_or(RequestError::Malformed)?;
        let path = req.path.ok_or(RequestError::Malformed)?;
        let minor_version = req.version.ok_or(RequestError::Malformed)?;
        if method == "CONNECT" {
            return Err(RequestError::NotImplemented);
        }
        let headers: &[httparse::Header<'_>] = req.headers;

        let mut content_length = None;
        let mut te_seen = false;
        let mut chunked_count = 0;
        let mut conn_close = false;
        let mut conn_keep_alive = false;
        let mut conn_names_others = false;
        let mut host = None;
        let mut expect_continue = false;
        for h in headers {
            if eq_ic(h.name, "content-length") {
                let n = parse_content_length(h.value).ok_or(RequestError::Malformed)?;
                if content_length.is_some_and(|m| m != n) {
                    return Err(RequestError::Malformed);
                }
                content_length = Some(n);
            } else if eq_ic(h.name, "transfer-encoding") {
                te_seen = true;
                for t in tokens(h.value) {
                    if !t.eq_ignore_ascii_case(b"chunked") {
                        return Err(RequestError::NotImplemented);
                    }
                    chunked_count += 1;
                }
            } else if eq_ic(h.name, "connection") {
                for t in tokens(h.value) {
                    let close = t.eq_ignore_ascii_case(b"close");
                    let keep_alive = t.eq_ignore_ascii_case(b"keep-alive");
                    conn_close |= close;
                    conn_keep_alive |= keep_alive;
                    conn_names_others |= !close && !keep_alive;
                }
            } else if eq_ic(h.name, "host") {
                if host.is_some() {
                    return Err(RequestError::Malformed);
                }
                host = Some(offset_in(buf, strip_port(trim(h.value))));
            } else if eq_ic(h.name, "expect") {
                expect_continue = trim(h.value).eq_ignore_ascii_case(b"100-continue");
            }
        }
        // Both framings at once is the request-smuggling shape: refuse (RFC 9112 §6.3).
        if te_seen && (content_length.is_some() || chunked_count != 1) {
            return Err(RequestError::Malformed);
        }
        if minor_version == 1 && host.is_none() {
            return Err(RequestError::Malformed);
        }
        let framing = match (te_seen, content_length) {
            (true, _) => BodyFraming::Chunked,
            (false, Some(n)) if n > 0 => BodyFraming::Length(n),
            _ => BodyFraming::None,
        };
        let keep_alive = if minor_version == 1 {
            !conn_close
        } else {
            conn_keep_alive && !conn_close
        };

        out.clear();
        out.extend_from_slice(method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let mut xff_prior = false;
        for h in headers {
            let n = h.name;
            if is_hop_by_hop(n)
                || eq_ic(n, "content-length")
                || eq_ic(n, "expect")
                || eq_ic(n, "x-forwarded-for")
                || eq_ic(n, "x-forwarded-proto")
            {
                xff_prior |= eq_ic(n, "x-forwarded-for");
                continue;
            }
            if conn_names_others && !eq_ic(n, "host") && named_by_connection(n, headers) {
                continue;
            }
            push_header(out, n.as_bytes(), h.value);
        }
        out.extend_from_slice(b"X-Forwarded-For: ");
        if xff_prior {
            for h in headers.iter().filter(|h| eq_ic(h.name, "x-forwarded-for")) {
                let v = trim(h.value);
                if !v.is_empty() {
                    out.extend_from_slice(v);
                    out.extend_from_slice(b", ");
                }
            }
        }
        out.extend_from_slice(peer_ip.as_bytes());
        out.extend_from_slice(b"\r\nX-Forwarded-Proto: http\r\n");
        match framing {
            BodyFraming::Length(n) => {
                let _ = write!(out, "Content-Length: {n}\r\n");
            }
            BodyFraming::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
            BodyFraming::None | BodyFraming::Close => {}
        }
        out.extend_from_slice(b"\r\n");

        let is_head = method == "HEAD";
        Ok(Some(RequestHead {
            head_len,
            minor_version,
            is_head,
            is_get: method == "GET",
            idempotent: matches!(
                method,
                "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE"
            ),
            framing,
            keep_alive,
            expect_continue: expect_continue && framing != BodyFraming::None,
            host,
            target: offset_in(buf, path.as_bytes()),
        }))
    })
}

fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Parse a back-end's response head at the start of `buf`. `Ok(None)`: incomplete.
/// On success (and unless it is an interim 1xx, which the caller skips) the head for the
/// client has been appended to `out` (cleared first).
pub fn parse_response(
    buf: &[u8],
    max_headers: usize,
    max_header_bytes: usize,
    req: &RequestHead,
    out: &mut Vec<u8>,
) -> Result<Option<ResponseHead>, ResponseError> {
    with_headers(max_headers, |headers| {
        let mut resp = httparse::Response::new(headers);
        let head_len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return if buf.len() >= max_header_bytes {
                    Err(ResponseError::HeadTooLarge)
                } else {
                    Ok(None)
                };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::HeadTooLarge),
            Err(_) => return Err(ResponseError::Malformed),
        };
        if head_len > max_header_bytes {
            return Err(ResponseError::HeadTooLarge);
        }
        let status = resp.code.ok_or(ResponseError::Malformed)?;
        let minor_version = resp.version.ok_or(ResponseError::Malformed)?;
        let reason = resp.reason.unwrap_or("");
        // We strip Upgrade, so a switch of protocols is a back-end protocol error.
        if status == 101 {
            return Err(ResponseError::Malformed);
        }
        let headers: &[httparse::Header<'_>] = resp.headers;
        if (100..200).contains(&status) {
            return Ok(Some(ResponseHead {
                head_len,
                status,
                framing: BodyFraming::None,
                upstream_reusable: true,
                client_close: false,
                dechunk: false,
            }));
        }

        let mut content_length = None;
        let mut te_seen = false;
        let mut te_chunked_last = false;
        let mut conn_names_others = false;
        let mut conn_close = false;
        let mut conn_keep_alive = false;
        for h in headers {
            if eq_ic(h.name, "content-length") {
                let n = parse_content_length(h.value).ok_or(ResponseError::Malformed)?;
                if content_length.is_some_and(|m| m != n) {
                    return Err(ResponseError::Malformed);
                }
                content_length = Some(n);
            } else if eq_ic(h.name, "transfer-encoding") {
                te_seen = true;
                te_chunked_last = tokens(h.value)
                    .last()
                    .is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
            } else if eq_ic(h.name, "connection") {
                for t in tokens(h.value) {
                    let close = t.eq_ignore_ascii_case(b"close");
                    let keep_alive = t.eq_ignore_ascii_case(b"keep-alive");
                    conn_close |= close;
                    conn_keep_alive |= keep_alive;
                    conn_names_others |= !close && !keep_alive;
                }
            }
        }
        let no_body = req.is_head || status == 204 || status == 304;
        let framing = if no_body {
            BodyFraming::None
        } else if te_seen {
            // RFC 9112 §6.3: TE wins over CL; a final coding other than chunked means
            // the body runs until close.
            if te_chunked_last {
                BodyFraming::Chunked
            } else {
                BodyFraming::Close
            }
        } else {
            match content_length {
                Some(0) => BodyFraming::None,
                Some(n) => BodyFraming::Length(n),
                None => BodyFraming::Close,
            }
        };
        let upstream_keep_alive = if minor_version == 1 {
            !conn_close
        } else {
            conn_keep_alive && !conn_close
        };
        let dechunk = framing == BodyFraming::Chunked && req.minor_version == 0;
        let client_close = !req.keep_alive || framing == BodyFraming::Close || dechunk;

        out.clear();
        let _ = write!(out, "HTTP/1.1 {status} {reason}\r\n");
        // For bodiless responses Content-Length describes the entity (HEAD): keep it.
        let restate_length = framing != BodyFraming::None;
        for h in headers {
            let n = h.name;
            if is_hop_by_hop(n)
                || (restate_length && eq_ic(n, "content-length"))
                || (conn_names_others && named_by_connection(n, headers))
            {
                continue;
            }
            push_header(out, n.as_bytes(), h.value);
        }
        match framing {
            BodyFraming::Length(n) => {
                let _ = write!(out, "Content-Length: {n}\r\n");
            }
            BodyFraming::Chunked if !dechunk => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n")
            }
            _ => {}
        }
        if client_close {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if req.minor_version == 0 {
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        Ok(Some(ResponseHead {
            head_len,
            status,
            framing,
            upstream_reusable: upstream_keep_alive && framing != BodyFraming::Close,
            client_close,
            dechunk,
        }))
    })
}

/// Reason phrase for the statuses the proxy generates itself.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// A complete response generated by the proxy itself (errors, rejections, metrics),
/// appended to `out` (cleared first).
pub fn local_response(
    out: &mut Vec<u8>,
    status: u16,
    close: bool,
    retry_after_s: Option<u32>,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) {
    out.clear();
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        reason_phrase(status),
        body.len()
    );
    if let Some(s) = retry_after_s {
        let _ = write!(out, "Retry-After: {s}\r\n");
    }
    out.extend_from_slice(if close {
        b"Connection: close\r\n\r\n"
    } else {
        b"\r\n"
    });
    if !head_only {
        out.extend_from_slice(body);
    }
}

/// A malformed chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
    Done,
}

/// Incremental scanner of a chunked body: finds where it ends (relay mode) and hands out
/// the payload bytes (decode mode). Chunk extensions and trailers are tolerated.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    digits: u8,
}

impl Default for Chunked {
    fn default() -> Self {
        Self::new()
    }
}

impl Chunked {
    pub fn new() -> Self {
        Chunked {
            state: ChunkState::Size,
            size: 0,
            digits: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    fn end_of_size_line(&mut self) -> Result<(), ChunkError> {
        if self.digits == 0 {
            return Err(ChunkError);
        }
        self.digits = 0;
        self.state = if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        };
        Ok(())
    }

    /// Scan `input`. Payload bytes are passed to `on_data`. Returns `Some(n)` when the
    /// body ended after the first `n` bytes of `input`, `None` when all of it belongs to
    /// the body and more is needed.
    pub fn feed(
        &mut self,
        input: &[u8],
        on_data: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<usize>, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.state {
                ChunkState::Size => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        // 15 hex digits = 2^60 bytes: far beyond any real chunk.
                        if self.digits >= 15 {
                            return Err(ChunkError);
                        }
                        let d = (c as char).to_digit(16).unwrap_or(0);
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    b';' | b' ' | b'\t' => self.state = ChunkState::Extension,
                    b'\r' => self.state = ChunkState::SizeLf,
                    b'\n' => self.end_of_size_line()?,
                    _ => return Err(ChunkError),
                },
                ChunkState::Extension => {
                    if c == b'\n' {
                        self.end_of_size_line()?;
                    }
                }
                ChunkState::SizeLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.end_of_size_line()?;
                }
                ChunkState::Data => {
                    let n = (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    on_data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = ChunkState::DataCr;
                    }
                    continue;
                }
                ChunkState::DataCr => match c {
                    b'\r' => self.state = ChunkState::DataLf,
                    b'\n' => self.state = ChunkState::Size,
                    _ => return Err(ChunkError),
                },
                ChunkState::DataLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.state = ChunkState::Size;
                }
                ChunkState::TrailerStart => match c {
                    b'\r' => self.state = ChunkState::TrailerLf,
                    b'\n' => {
                        self.state = ChunkState::Done;
                        return Ok(Some(i + 1));
                    }
                    _ => self.state = ChunkState::TrailerLine,
                },
                ChunkState::TrailerLine => {
                    if c == b'\n' {
                        self.state = ChunkState::TrailerStart;
                    }
                }
                ChunkState::TrailerLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.state = ChunkState::Done;
                    return Ok(Some(i + 1));
                }
                ChunkState::Done => return Ok(Some(i)),
            }
            i += 1;
        }
        Ok(if self.state == ChunkState::Done {
            Some(input.len())
        } else {
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<Option<RequestHead>, RequestError> {
        let mut out = Vec::new();
        parse_request(s.as_bytes(), 100, 16384, "10.0.0.1", &mut out)
    }

    #[test]
    fn request_framing_and_errors() {
        let h = req("GET / HTTP/1.1\r\nHost: a:80\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, BodyFraming::None);
        assert!(h.keep_alive);
        assert_eq!(h.host, Some(22..23));
        assert_eq!(
            req("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().map(|_| ()),
            None
        );
        let h = req("POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, BodyFraming::Length(5));
        assert!(!h.keep_alive);
        let e = |s: &str| req(s).unwrap_err().status();
        assert_eq!(e("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(e("GET\x01 / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(
            e("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            e("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        assert_eq!(
            e("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
            400
        );
    }

    #[test]
    fn request_rewrite_strips_hop_by_hop_and_appends_xff() {
        let mut out = Vec::new();
        let s = "GET /x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
                 Keep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\nX-Forwarded-For: 1.2.3.4\r\n\
                 Proxy-Authorization: Basic x\r\n\r\n";
        parse_request(s.as_bytes(), 100, 16384, "10.0.0.1", &mut out)
            .unwrap()
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "GET /x HTTP/1.1\r\nHost: a\r\nProxy-Authorization: Basic x\r\n\
             X-Forwarded-For: 1.2.3.4, 10.0.0.1\r\nX-Forwarded-Proto: http\r\n\r\n"
        );
    }

    #[test]
    fn bodiless_responses_keep_their_length_and_have_no_body() {
        let get = req("GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().unwrap();
        let head = req("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().unwrap();
        let resp = |r: &RequestHead, s: &str| {
            let mut out = Vec::new();
            let h = parse_response(s.as_bytes(), 100, 16384, r, &mut out)
                .unwrap()
                .unwrap();
            (h, String::from_utf8(out).unwrap())
        };
        let (h, out) = resp(&head, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::None);
        assert!(out.contains("Content-Length: 5\r\n"), "{out}");
        for s in [
            "HTTP/1.1 204 No Content\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        ] {
            let (h, _) = resp(&get, s);
            assert_eq!(h.framing, BodyFraming::None);
            assert!(h.upstream_reusable && !h.client_close);
        }
        let (h, out) = resp(&get, "HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, BodyFraming::Close);
        assert!(h.client_close && !h.upstream_reusable);
        assert!(out.ends_with("Connection: close\r\n\r\n"));
        let (h, _) = resp(
            &get,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        );
        assert_eq!(h.framing, BodyFraming::Chunked, "TE wins over CL");
    }

    /// Random splices of HTTP-ish fragments: parsing never panics, and a head that
    /// parses always yields offsets inside the buffer.
    #[test]
    fn random_heads_and_chunks_never_panic() {
        const PARTS: [&str; 20] = [
            "GET ",
            "POST ",
            "/x",
            " HTTP/1.1",
            " HTTP/1.0",
            "\r\n",
            "\n",
            "Host: ",
            "a:80",
            "[::1]:8",
            "Content-Length: ",
            "12",
            "Transfer-Encoding: ",
            "chunked",
            ", gzip",
            "Connection: ",
            "close, X-A",
            ":",
            " ",
            "\x00\x7f",
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut out = Vec::new();
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            for _ in 0..next() % 16 {
                buf.extend_from_slice(PARTS[(next() % PARTS.len() as u64) as usize].as_bytes());
            }
            if next() % 2 == 0 {
                buf.extend_from_slice(b"\r\n\r\n");
            }
            if let Ok(Some(h)) = parse_request(&buf, 8, 1024, "1.2.3.4", &mut out) {
                assert!(h.head_len <= buf.len() && h.target.end <= buf.len());
                assert!(h.host.is_none_or(|r| r.end <= buf.len()));
            }
            let _ = Chunked::new().feed(&buf, &mut |_| {});
        }
    }

    #[test]
    fn chunked_scanner_finds_end_across_splits() {
        let body = b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for split in 0..body.len() {
            let mut c = Chunked::new();
            let mut data = Vec::new();
            let first = c
                .feed(&body[..split], &mut |d| data.extend_from_slice(d))
                .unwrap();
            let end = match first {
                Some(n) => n,
                None => {
                    split
                        + c.feed(&body[split..], &mut |d| data.extend_from_slice(d))
                            .unwrap()
                            .unwrap()
                }
            };
            assert_eq!(&body[end..], b"NEXT", "split {split}");
            assert_eq!(data, b"wikipedia");
        }
        assert_eq!(Chunked::new().feed(b"zz\r\n", &mut |_| {}), Err(ChunkError));
    }
}
