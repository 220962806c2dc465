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
    /// Framing a back-end could read differently (RFC 9112 §6): Content-Length together
    /// with Transfer-Encoding, `chunked` missing, repeated or not the final coding, or
    /// Transfer-Encoding on an HTTP/1.0 request.
    BadFraming,
}

impl RequestError {
    /// The HTTP status the client gets.
    pub fn status(self) -> u16 {
        match self {
            RequestError::Malformed | RequestError::BadFraming => 400,
            RequestError::HeadTooLarge | RequestError::TooManyHeaders => 431,
            RequestError::NotImplemented => 501,
        }
    }

    /// A short machine-readable reason, sent as the body of the error response.
    pub fn reason(self) -> &'static str {
        match self {
            RequestError::Malformed => "malformed_request",
            RequestError::HeadTooLarge => "header_too_large",
            RequestError::TooManyHeaders => "too_many_headers",
            RequestError::NotImplemented => "not_implemented",
            RequestError::BadFraming => "bad_framing",
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
    /// Bad status line or header syntax, bad or conflicting Content-Length,
    /// Transfer-Encoding on an HTTP/1.0 response, or a switch of protocols.
    Malformed,
    /// The head is larger than `http.max_header_bytes` or has too many fields.
    HeadTooLarge,
    /// A transfer coding the client cannot be sent: any coding to an HTTP/1.0 client,
    /// which does not know Transfer-Encoding.
    UnsupportedCoding,
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

/// Optional whitespace of RFC 9110 §5.6.3: space and horizontal tab, nothing else.
fn is_ows(c: &u8) -> bool {
    *c == b' ' || *c == b'\t'
}

/// `v` without leading and trailing OWS.
fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|c| !is_ows(c)).unwrap_or(v.len());
    let end = v.iter().rposition(|c| !is_ows(c)).map_or(start, |e| e + 1);
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

/// `Transfer_Encoding`, `content_length` and the like: not the framing fields, but a
/// back-end that maps `_` to `-` (CGI-style environments, some frameworks) would read
/// them as such while the proxy frames the body otherwise. Refused.
fn looks_like_framing(name: &str) -> bool {
    let n = name.as_bytes();
    n.contains(&b'_')
        && ["transfer-encoding", "content-length"].iter().any(|f| {
            f.len() == n.len()
                && f.bytes()
                    .zip(n)
                    .all(|(a, &b)| a == b.to_ascii_lowercase() || (a == b'-' && b == b'_'))
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
/// re-stated, always as HTTP/1.1 so the upstream connection can be kept alive. The
/// `RDMA:` header is removed too ([`parse_request_with`] can pass it).
pub fn parse_request(
    buf: &[u8],
    max_headers: usize,
    max_header_bytes: usize,
    peer_ip: &str,
    out: &mut Vec<u8>,
) -> Result<Option<RequestHead>, RequestError> {
    parse_request_with(buf, max_headers, max_header_bytes, peer_ip, false, out)
}

/// [`parse_request`], forwarding a client's `RDMA:` header if `pass_rdma`. By default
/// it is removed: it asks the back-end to open a connection to, and write into, an
/// address the client chose (`http.pass_rdma_header`).
pub fn parse_request_with(
    buf: &[u8],
    max_headers: usize,
    max_header_bytes: usize,
    peer_ip: &str,
    pass_rdma: bool,
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
        let mut chunked_last = false;
        let mut other_coding = false;
        let mut conn_close = false;
        let mut conn_keep_alive = false;
        let mut conn_names_others = false;
        let mut host = None;
        let mut expect_continue = false;
        for h in headers {
            if looks_like_framing(h.name) {
                return Err(RequestError::BadFraming);
            }
            if eq_ic(h.name, "content-length") {
                let n = parse_content_length(h.value).ok_or(RequestError::Malformed)?;
                if content_length.is_some_and(|m| m != n) {
                    return Err(RequestError::Malformed);
                }
                content_length = Some(n);
            } else if eq_ic(h.name, "transfer-encoding") {
                // The codings of every Transfer-Encoding field, in order, form one list.
                te_seen = true;
                for t in tokens(h.value) {
                    chunked_last = t.eq_ignore_ascii_case(b"chunked");
                    if chunked_last {
                        chunked_count += 1;
                    } else {
                        other_coding = true;
                    }
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
        if te_seen {
            // RFC 9112 §6.1: Transfer-Encoding on HTTP/1.0 is faulty framing. §6.3: both
            // framings at once is the request-smuggling shape (refused rather than
            // processed-then-closed); a request whose final coding is not chunked has no
            // determinable length (400). Anything else but chunked we cannot decode (501).
            if minor_version == 0 || content_length.is_some() || !chunked_last || chunked_count != 1
            {
                return Err(RequestError::BadFraming);
            }
            if other_coding {
                return Err(RequestError::NotImplemented);
            }
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
                || (!pass_rdma && eq_ic(n, "rdma"))
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
            // RFC 9110 §10.1.1: an HTTP/1.0 client does not know `100 Continue`.
            expect_continue: expect_continue && minor_version == 1 && framing != BodyFraming::None,
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
        let mut te_other = false;
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
                // The codings of every Transfer-Encoding field, in order, form one list.
                te_seen = true;
                for t in tokens(h.value) {
                    te_chunked_last = t.eq_ignore_ascii_case(b"chunked");
                    te_other |= !te_chunked_last;
                }
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
        // RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing.
        if te_seen && minor_version == 0 {
            return Err(ResponseError::Malformed);
        }
        let no_body = req.is_head || status == 204 || status == 304;
        // Codings other than chunked are passed on with their header (RFC 9112 §6.1), which
        // an HTTP/1.0 client does not understand: refuse rather than send it a body it
        // would misread.
        if !no_body && te_other && req.minor_version == 0 {
            return Err(ResponseError::UnsupportedCoding);
        }
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
        // The back-end's own Transfer-Encoding list goes to the client verbatim when it
        // holds more than `chunked` (e.g. `gzip, chunked`, or `gzip` with the body ending
        // at close): the client needs it to decode the body.
        let pass_te = framing != BodyFraming::None && te_other;
        for h in headers {
            let n = h.name;
            if pass_te && eq_ic(n, "transfer-encoding") {
                push_header(out, n.as_bytes(), h.value);
                continue;
            }
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
            BodyFraming::Chunked if !dechunk && !pass_te => {
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
            // Content-Length beside Transfer-Encoding: a confused back-end (RFC 9112 §6.3),
            // whose connection is not trusted with another request.
            upstream_reusable: upstream_keep_alive
                && framing != BodyFraming::Close
                && !(te_seen && content_length.is_some()),
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

/// Total bytes of chunk extensions accepted in one body. Extensions carry nothing the
/// proxy uses; the bound stops a client from streaming an endless size line (the same
/// bound as Node.js's fix for CVE-2024-22019).
pub const CHUNK_EXT_BYTES_MAX: u64 = 16 * 1024;
/// Total bytes of the trailer section of one body: at most what a request head may hold
/// by default (`http.max_header_bytes`).
pub const TRAILER_BYTES_MAX: u64 = 16 * 1024;
/// Hex digits of one chunk size, leading zeros included: 16 digits fill a u64.
pub const CHUNK_SIZE_DIGITS_MAX: u8 = 16;

/// A malformed chunked body, or one beyond the bounds above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Hex digits of the chunk size.
    Size,
    /// Whitespace after the size or after an extension; a `;` must follow.
    ExtBws,
    /// After `;`: optional whitespace, then an extension name.
    ExtNameStart,
    ExtName,
    /// Whitespace after an extension name: `=` or `;` must follow.
    ExtAfterName,
    /// After `=`: optional whitespace, then a token or a quoted string.
    ExtValueStart,
    ExtToken,
    ExtQuoted,
    ExtQuotedPair,
    /// After a closing quote: `;`, whitespace then `;`, or CRLF.
    ExtAfterQuoted,
    /// CR of the size line seen; LF must follow.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// Start of a trailer line, or the CR of the final empty line.
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    EndLf,
    Done,
}

/// `tchar` of RFC 9110 §5.6.2: the bytes of a token.
pub fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Bytes of a field value or a quoted pair: HTAB, SP, VCHAR, obs-text.
fn is_field_vchar(c: u8) -> bool {
    c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80
}

/// `qdtext` of RFC 9110 §5.6.4.
fn is_qdtext(c: u8) -> bool {
    is_field_vchar(c) && c != b'"' && c != b'\\'
}

/// Incremental scanner of a chunked body, strict per RFC 9112 §7.1: finds where it ends
/// (relay mode) and hands out the payload bytes (decode mode). Every line ends in CRLF
/// (no bare LF or CR anywhere), sizes are hex digits only, extensions follow the
/// grammar (`;name`, `;name=token`, `;name="quoted"`, whitespace only around `;`/`=`)
/// and trailers are field lines (token name, colon with no whitespace before it,
/// visible value, no folding). What it accepts, every conforming parser delimits the
/// same way, so bytes it relays verbatim cannot desynchronise the next hop.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: ChunkState,
    size: u64,
    digits: u8,
    ext_bytes: u64,
    trailer_bytes: u64,
}

impl Default for Chunked {
    fn default() -> Self {
        Self::new()
    }
}

impl Chunked {
    /// A scanner at the start of a body.
    pub fn new() -> Self {
        Chunked {
            state: ChunkState::Size,
            size: 0,
            digits: 0,
            ext_bytes: 0,
            trailer_bytes: 0,
        }
    }

    /// The last-chunk and trailer section have been seen.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    fn end_of_size_line(&mut self) {
        self.digits = 0;
        self.state = if self.size == 0 {
            ChunkState::TrailerStart
        } else {
            ChunkState::Data
        };
    }

    /// Next state for byte `c` of a size line after the digits, or an error.
    fn extension(&mut self, c: u8) -> Result<ChunkState, ChunkError> {
        use ChunkState::*;
        self.ext_bytes += 1;
        if self.ext_bytes > CHUNK_EXT_BYTES_MAX {
            return Err(ChunkError);
        }
        let ws = c == b' ' || c == b'\t';
        Ok(match (self.state, c) {
            (ExtBws | ExtAfterQuoted, _) if ws => ExtBws,
            (ExtBws | ExtName | ExtAfterName | ExtToken | ExtAfterQuoted, b';') => ExtNameStart,
            (ExtName | ExtToken | ExtAfterQuoted, b'\r') => SizeLf,
            (ExtNameStart, _) if ws => ExtNameStart,
            (ExtNameStart | ExtName, _) if is_tchar(c) => ExtName,
            (ExtName | ExtAfterName, _) if ws => ExtAfterName,
            (ExtName | ExtAfterName, b'=') => ExtValueStart,
            (ExtValueStart, _) if ws => ExtValueStart,
            (ExtValueStart, b'"') => ExtQuoted,
            (ExtValueStart | ExtToken, _) if is_tchar(c) => ExtToken,
            (ExtToken, _) if ws => ExtBws,
            (ExtQuoted, b'"') => ExtAfterQuoted,
            (ExtQuoted, b'\\') => ExtQuotedPair,
            (ExtQuoted, _) if is_qdtext(c) => ExtQuoted,
            (ExtQuotedPair, _) if is_field_vchar(c) => ExtQuoted,
            _ => return Err(ChunkError),
        })
    }

    /// Next state for byte `c` of the trailer section, or an error.
    fn trailer(&mut self, c: u8) -> Result<ChunkState, ChunkError> {
        use ChunkState::*;
        self.trailer_bytes += 1;
        if self.trailer_bytes > TRAILER_BYTES_MAX {
            return Err(ChunkError);
        }
        Ok(match (self.state, c) {
            (TrailerStart, b'\r') => EndLf,
            (TrailerStart | TrailerName, _) if is_tchar(c) => TrailerName,
            (TrailerName, b':') => TrailerValue,
            (TrailerValue, b'\r') => TrailerLf,
            (TrailerValue, _) if is_field_vchar(c) => TrailerValue,
            (TrailerLf, b'\n') => TrailerStart,
            _ => return Err(ChunkError),
        })
    }

    /// Scan `input`. Payload bytes are passed to `on_data`. Returns `Some(n)` when the
    /// body ended after the first `n` bytes of `input`, `None` when all of it belongs to
    /// the body and more is needed. After an error the scanner must not be fed again.
    pub fn feed(
        &mut self,
        input: &[u8],
        on_data: &mut dyn FnMut(&[u8]),
    ) -> Result<Option<usize>, ChunkError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.state {
                Size => {
                    if let Some(d) = (c as char).to_digit(16) {
                        if self.digits >= CHUNK_SIZE_DIGITS_MAX {
                            return Err(ChunkError);
                        }
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(d)))
                            .ok_or(ChunkError)?;
                        self.digits += 1;
                    } else if self.digits == 0 {
                        return Err(ChunkError);
                    } else {
                        self.state = match c {
                            b'\r' => SizeLf,
                            b';' | b' ' | b'\t' => {
                                self.state = ExtBws;
                                self.extension(c)?
                            }
                            _ => return Err(ChunkError),
                        };
                    }
                }
                ExtBws | ExtNameStart | ExtName | ExtAfterName | ExtValueStart | ExtToken
                | ExtQuoted | ExtQuotedPair | ExtAfterQuoted => self.state = self.extension(c)?,
                SizeLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.end_of_size_line();
                }
                Data => {
                    let n = (input.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    on_data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                DataCr => {
                    if c != b'\r' {
                        return Err(ChunkError);
                    }
                    self.state = DataLf;
                }
                DataLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.state = Size;
                }
                TrailerStart | TrailerName | TrailerValue | TrailerLf => {
                    self.state = self.trailer(c)?
                }
                EndLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.state = Done;
                    return Ok(Some(i + 1));
                }
                Done => return Ok(Some(i)),
            }
            i += 1;
        }
        Ok(if self.state == Done {
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
    fn rdma_header_is_stripped_unless_passed() {
        let head = "GET /f HTTP/1.1\r\nHost: a\r\nrdma: server-writes, ip=10.0.0.1, port=9, \
                    stag=256, maxlen=99\r\nX-End: 1\r\n\r\n";
        for (pass, kept) in [(false, false), (true, true)] {
            let mut out = Vec::new();
            parse_request_with(head.as_bytes(), 100, 16384, "10.0.0.1", pass, &mut out)
                .unwrap()
                .unwrap();
            let out = String::from_utf8(out).unwrap();
            assert_eq!(out.contains("\r\nrdma: server-writes"), kept, "{out}");
            assert!(out.contains("\r\nX-End: 1\r\n"), "{out}");
        }
        let mut out = Vec::new();
        parse_request(head.as_bytes(), 100, 16384, "10.0.0.1", &mut out).unwrap();
        assert!(!String::from_utf8(out)
            .unwrap()
            .to_ascii_lowercase()
            .contains("rdma"));
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

    /// The request-smuggling classics: each is refused with the status RFC 9112 asks for
    /// (or, where the RFC allows either, the stricter one).
    #[test]
    fn smuggling_shapes_in_request_heads_are_refused() {
        const H: &str = "POST / HTTP/1.1\r\nHost: a\r\n";
        let cases: &[(&str, &str, u16)] = &[
            (
                "CL+TE",
                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                400,
            ),
            (
                "TE+CL",
                "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                400,
            ),
            (
                "CL conflict",
                "Content-Length: 4\r\nContent-Length: 5\r\n",
                400,
            ),
            ("CL list", "Content-Length: 4, 5\r\n", 400),
            ("CL plus", "Content-Length: +4\r\n", 400),
            ("CL minus", "Content-Length: -4\r\n", 400),
            ("CL hex", "Content-Length: 0x4\r\n", 400),
            ("CL inner space", "Content-Length: 4 4\r\n", 400),
            ("CL empty", "Content-Length: \r\n", 400),
            ("CL huge", "Content-Length: 99999999999999999999\r\n", 400),
            ("CL vertical tab", "Content-Length: \x0b4\r\n", 400),
            ("CL form feed", "Content-Length: 4\x0c\r\n", 400),
            ("space before colon", "Transfer-Encoding : chunked\r\n", 400),
            ("tab before colon", "Content-Length\t: 4\r\n", 400),
            ("obs-fold", "X-A: 1\r\n Transfer-Encoding: chunked\r\n", 400),
            ("obs-fold of TE", "Transfer-Encoding:\r\n chunked\r\n", 400),
            (
                "chunked, identity",
                "Transfer-Encoding: chunked, identity\r\n",
                400,
            ),
            (
                "chunked twice",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                400,
            ),
            (
                "chunked not last",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
                400,
            ),
            ("TE empty", "Transfer-Encoding: \r\n", 400),
            ("TE quoted", "Transfer-Encoding: \"chunked\"\r\n", 400),
            ("TE vertical tab", "Transfer-Encoding: \x0bchunked\r\n", 400),
            (
                "TE gzip, chunked",
                "Transfer-Encoding: gzip, chunked\r\n",
                501,
            ),
            (
                "TE with underscore",
                "Transfer_Encoding: chunked\r\nContent-Length: 4\r\n",
                400,
            ),
            ("CL with underscore", "Content_Length: 4\r\n", 400),
            (
                "bare CR in value",
                "X-A: 1\rTransfer-Encoding: chunked\r\n",
                400,
            ),
            ("NUL in value", "X-A: \x00\r\n", 400),
        ];
        for (what, fields, status) in cases {
            let r = req(&format!("{H}{fields}\r\n"));
            assert_eq!(
                r.map(|_| ()).map_err(|e| e.status()),
                Err(*status),
                "{what}"
            );
        }
        // TE on HTTP/1.0 is faulty framing even alone (RFC 9112 §6.1).
        let e = req("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap_err();
        assert_eq!(e, RequestError::BadFraming);
        // Accepted: identical repeated lengths collapse to one, leading zeros, OWS.
        let mut out = Vec::new();
        let s = format!("{H}Content-Length: 4\r\nContent-Length:  004 \r\n\r\n");
        let h = parse_request(s.as_bytes(), 100, 16384, "1.2.3.4", &mut out)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, BodyFraming::Length(4));
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.matches("Content-Length").count(), 1, "{out}");
        assert!(out.contains("Content-Length: 4\r\n"), "{out}");
        let h = req(&format!("{H}transfer-encoding: Chunked\r\n\r\n"))
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, BodyFraming::Chunked);
        // Naming the framing field in Connection does not remove it: the proxy restates it.
        let mut out = Vec::new();
        let s = format!("{H}Connection: Content-Length\r\nContent-Length: 4\r\nX_Ok: 1\r\n\r\n");
        parse_request(s.as_bytes(), 100, 16384, "1.2.3.4", &mut out)
            .unwrap()
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("\r\nContent-Length: 4\r\n") && out.contains("X_Ok: 1"),
            "{out}"
        );
    }

    #[test]
    fn continue_is_never_promised_to_http10() {
        let body = "Content-Length: 3\r\nExpect: 100-continue\r\n\r\n";
        let h = req(&format!("POST / HTTP/1.1\r\nHost: a\r\n{body}"))
            .unwrap()
            .unwrap();
        assert!(h.expect_continue);
        let h = req(&format!("POST / HTTP/1.0\r\n{body}")).unwrap().unwrap();
        assert!(!h.expect_continue);
    }

    #[test]
    fn response_codings_other_than_chunked_keep_their_header() {
        let get11 = req("GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap().unwrap();
        let get10 = req("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        let resp = |r: &RequestHead, s: &str| {
            let mut out = Vec::new();
            parse_response(s.as_bytes(), 100, 16384, r, &mut out)
                .map(|h| (h.unwrap(), String::from_utf8(out).unwrap()))
        };
        let (h, out) = resp(
            &get11,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.framing, BodyFraming::Chunked);
        assert!(
            out.contains("Transfer-Encoding: gzip, chunked\r\n"),
            "{out}"
        );
        assert_eq!(out.matches("Transfer-Encoding").count(), 1, "{out}");
        let (h, out) = resp(&get11, "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").unwrap();
        assert_eq!(h.framing, BodyFraming::Close);
        assert!(h.client_close && !h.upstream_reusable);
        assert!(out.contains("Transfer-Encoding: gzip\r\n"), "{out}");
        let (h, out) = resp(
            &get11,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.framing, BodyFraming::Chunked);
        assert!(out.contains("Transfer-Encoding: chunked\r\n"), "{out}");
        // An HTTP/1.0 client cannot be sent a coding; plain chunked is decoded for it.
        assert_eq!(
            resp(
                &get10,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
            )
            .unwrap_err(),
            ResponseError::UnsupportedCoding
        );
        let (h, out) = resp(
            &get10,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert!(h.dechunk && !out.contains("Transfer-Encoding"), "{out}");
        // Transfer-Encoding from an HTTP/1.0 back-end is faulty framing.
        assert_eq!(
            resp(
                &get11,
                "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .unwrap_err(),
            ResponseError::Malformed
        );
        // CL beside TE: TE frames the body, the back-end connection is not reused.
        let (h, out) = resp(
            &get11,
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert!(
            !h.upstream_reusable && !out.contains("Content-Length"),
            "{out}"
        );
    }

    /// Feed `body` whole; `Ok(Some(end))` with the payload, or the error.
    fn scan(body: &[u8]) -> Result<Option<(usize, Vec<u8>)>, ChunkError> {
        let mut data = Vec::new();
        let end = Chunked::new().feed(body, &mut |d| data.extend_from_slice(d))?;
        Ok(end.map(|n| (n, data)))
    }

    #[test]
    fn chunked_scanner_is_strict() {
        let bad: &[(&str, &[u8])] = &[
            ("bare LF after size", b"5\nhello\r\n0\r\n\r\n"),
            ("bare LF after data", b"5\r\nhello\n0\r\n\r\n"),
            ("bare LF at end", b"5\r\nhello\r\n0\r\n\n"),
            ("bare CR in size line", b"5\rX\nhello\r\n0\r\n\r\n"),
            ("bare CR in extension", b"5;a\rb\r\nhello\r\n0\r\n\r\n"),
            ("bare LF in extension", b"5;a\nb\r\nhello\r\n0\r\n\r\n"),
            ("no CRLF after data", b"5\r\nhelloX\r\n0\r\n\r\n"),
            ("0x prefix", b"0x5\r\nhello\r\n0\r\n\r\n"),
            ("sign", b"+5\r\nhello\r\n0\r\n\r\n"),
            ("no digits", b"\r\nhello\r\n0\r\n\r\n"),
            ("empty extension name", b"5;\r\nhello\r\n0\r\n\r\n"),
            ("trailing whitespace", b"5 \r\nhello\r\n0\r\n\r\n"),
            ("extension without semicolon", b"5 a\r\nhello\r\n0\r\n\r\n"),
            ("bad extension byte", b"5;a=b\x01\r\nhello\r\n0\r\n\r\n"),
            ("unterminated quote", b"5;a=\"b\r\nhello\r\n0\r\n\r\n"),
            ("overflow", b"10000000000000000\r\n"),
            ("17 digits", b"00000000000000001\r\n"),
            ("trailer bare LF", b"0\r\nX-A: 1\n\r\n"),
            ("trailer space before colon", b"0\r\nX-A : 1\r\n\r\n"),
            ("trailer obs-fold", b"0\r\nX-A: 1\r\n 2\r\n\r\n"),
            ("trailer without colon", b"0\r\nX-A\r\n\r\n"),
            ("trailer NUL", b"0\r\nX-A: \x00\r\n\r\n"),
            ("trailer bare CR", b"0\r\nX-A: 1\r2\r\n\r\n"),
        ];
        for (what, body) in bad {
            assert_eq!(scan(body), Err(ChunkError), "{what}");
        }
        let good: &[(&str, &[u8])] = &[
            ("plain", b"5\r\nhello\r\n0\r\n\r\n"),
            ("upper hex, zeros", b"0005\r\nhello\r\n000\r\n\r\n"),
            (
                "extensions",
                b"5;a;b=c;d=\"e;\\\"f\"\r\nhello\r\n0;z=1\r\n\r\n",
            ),
            ("BWS", b"5 ; a = b\t;c\r\nhello\r\n0\r\n\r\n"),
            ("trailers", b"5\r\nhello\r\n0\r\nX-A: 1\r\nX-B:\r\n\r\n"),
        ];
        for (what, body) in good {
            let (end, data) = scan(body).unwrap().unwrap();
            assert_eq!((end, &data[..]), (body.len(), &b"hello"[..]), "{what}");
        }
        assert_eq!(
            scan(b"a\r\n0123456789\r\n0\r\n\r\n").unwrap().unwrap().1,
            b"0123456789"
        );
    }

    #[test]
    fn chunk_extensions_and_trailers_are_bounded() {
        let mut c = Chunked::new();
        let line = format!("1;{}=1\r\nx\r\n", "e".repeat(1000));
        let mut fed = 0u64;
        let err = loop {
            match c.feed(line.as_bytes(), &mut |_| {}) {
                Ok(None) => fed += line.len() as u64,
                Ok(Some(_)) => panic!("no end was sent"),
                Err(e) => break e,
            }
        };
        assert_eq!(err, ChunkError);
        assert!(fed <= CHUNK_EXT_BYTES_MAX + line.len() as u64);
        assert!(fed >= CHUNK_EXT_BYTES_MAX - line.len() as u64);

        let mut c = Chunked::new();
        assert_eq!(c.feed(b"0\r\n", &mut |_| {}), Ok(None));
        let field = format!("X-T: {}\r\n", "v".repeat(1000));
        let err = (0..100)
            .find_map(|_| c.feed(field.as_bytes(), &mut |_| {}).err())
            .expect("trailers are bounded");
        assert_eq!(err, ChunkError);
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
