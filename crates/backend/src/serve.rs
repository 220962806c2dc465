//! One connection's life: read a request head, route it, load the body, burn
//! the cost model's CPU, write the response; repeat while keep-alive allows.
//!
//! ```text
//! read_head ─▶ route ─────────▶ load body ────────▶ burn emulated CPU ─▶ write head + body
//! (≤ header    (realpath, open, (read from disk      (cost::CostModel)     (writev; larger
//!  timeout)     stat, 304?)      into the buffer)                           files streamed)
//!              └─────────────── X-Farside-Cpu-Us covers ──────────────┘
//! ```
//!
//! Files are read from disk per request with `read` and sent with `write`
//! (not `sendfile`, as Apache 2.4's default `EnableSendfile Off`), so the
//! per-byte CPU of both copies is real. Bodies up to [`BODY_BUFFER_BYTES_MAX`]
//! are read before the head is written, so `X-Farside-Cpu-Us` counts the read;
//! larger files stream in [`CHUNK_BYTES`] pieces after the head.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cost::{self, CostModel};
use crate::sites::Sites;
use crate::{
    httpdate, BackendArgs, CPU_US_MAX, GENERATED_BYTES_MAX, HEADERS_MAX, HEAD_BYTES_MAX,
    POST_DIGEST_BYTES_MAX, REQUEST_BODY_BYTES_MAX,
};
use farside_rdmahttp::header::{Decline, Response as RdmaResponse};
use std::sync::Arc;

/// Bodies up to this size are loaded before the head is written and sent
/// with it in one `writev`: covers every Zipf object (at most 1 MiB) and all
/// but a few World Cup objects, and bounds a worker's buffer to 1 MiB.
const BODY_BUFFER_BYTES_MAX: u64 = 1 << 20;
/// Chunk size used to stream larger bodies: a socket send buffer's worth.
const CHUNK_BYTES: usize = 64 * 1024;
/// Size of `/file16k` in generated mode (the paper's single-file trace).
const FILE16K_BYTES: u64 = 16 * 1024;

/// Immutable per-server configuration shared by the workers.
pub(crate) struct Config {
    /// Canonical docroot: every served file must resolve inside it.
    pub(crate) root: Option<PathBuf>,
    /// With `--coop`: files under the root are served by the cooperating node.
    pub(crate) coop: Option<Arc<crate::coop::Node>>,
    /// With `--sites-root`: the sites and the one served now (replaces `root`).
    pub(crate) sites: Option<Arc<Sites>>,
    cpu_us_default: u64,
    /// Emulated CPU of file requests.
    cost: CostModel,
    keepalive_max: u32,
    header_timeout: Duration,
    /// Value of the `X-Farside-Backend` header.
    backend_name: String,
    /// With `--rdma`: moves bodies a request's `RDMA:` header asks for.
    rdma: Option<farside_rdmahttp::server::Server>,
}

impl Config {
    pub(crate) fn new(args: &BackendArgs, addr: SocketAddr) -> io::Result<Config> {
        let root =
            match &args.root {
                Some(r) => Some(r.canonicalize().map_err(|e| {
                    io::Error::new(e.kind(), format!("--root {}: {e}", r.display()))
                })?),
                None => None,
            };
        let sites = match &args.sites_root {
            Some(dir) => Some(Arc::new(
                Sites::new(dir, args.site.as_deref().unwrap_or_default())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            )),
            None => None,
        };
        Ok(Config {
            root,
            coop: None,
            sites,
            cpu_us_default: args.cpu_us,
            cost: CostModel {
                cpu_us_per_request: args.cpu_us_per_request,
                cpu_ns_per_byte: args.cpu_ns_per_byte,
            },
            keepalive_max: args.keepalive_max,
            header_timeout: Duration::from_millis(args.header_timeout_ms),
            backend_name: addr.to_string(),
            rdma: match args.rdma.rdma {
                false => None,
                true => {
                    let server = args.rdma.server().map_err(io::Error::other)?;
                    match args.rdma.start_arena().map_err(io::Error::other)? {
                        Some(arena) => Some(server.with_arena(arena)),
                        None => Some(server),
                    }
                }
            },
        })
    }
}

/// Deterministic content of generated files: byte `i` of every generated file.
pub fn generated_byte(i: u64) -> u8 {
    const ALPHABET: &[u8; 64] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-\n";
    ALPHABET[(i % 64) as usize]
}

enum Body {
    /// Content in memory (texts, and bodies loaded into the connection's buffer).
    Bytes(Vec<u8>),
    /// `n` bytes of generated content, not yet produced.
    Generated(u64),
    /// An open file of `n` bytes, not yet read.
    File(File, u64),
    /// The first `n` bytes of the connection's body buffer.
    Loaded(u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::Generated(n) | Body::File(_, n) | Body::Loaded(n) => *n,
        }
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: Body,
    /// Close the connection after this response whatever the client asked.
    close: bool,
    /// `Last-Modified` of a file response.
    last_modified: Option<SystemTime>,
    /// Whether the cost model's CPU applies (file and generated requests).
    modelled: bool,
    /// The site whose content answered (`X-Farside-Site`) and its switch number
    /// ([`crate::sites::Sites::served`]), with `--sites-root`.
    site: Option<(Arc<str>, u64)>,
    /// The `RDMA:` response field, when the request had one.
    rdma: Option<RdmaResponse>,
    /// The file a 200 comes from: the RDMA registration cache's key.
    file_key: Option<farside_rdmahttp::registration::FileKey>,
}

impl Response {
    fn error(status: u16) -> Response {
        let text = format!("{} {}\n", status, reason(status));
        Response {
            status,
            content_type: "text/plain",
            body: Body::Bytes(text.into_bytes()),
            close: matches!(status, 400 | 413 | 431 | 500 | 501),
            last_modified: None,
            modelled: false,
            site: None,
            rdma: None,
            file_key: None,
        }
    }

    fn text(body: String) -> Response {
        Response {
            status: 200,
            content_type: "text/plain",
            body: Body::Bytes(body.into_bytes()),
            close: false,
            last_modified: None,
            modelled: false,
            site: None,
            rdma: None,
            file_key: None,
        }
    }

    /// An error answered by the file handler: it costs a request.
    fn file_error(status: u16) -> Response {
        Response {
            modelled: true,
            ..Response::error(status)
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// What the router needs from a parsed request head.
struct Request {
    head_only: bool,
    target: String,
    keep_alive: bool,
    body_bytes: u64,
    chunked_body: bool,
    /// A valid `If-Modified-Since` date.
    if_modified_since: Option<SystemTime>,
    /// `POST /digest`: the body is streamed through FNV-1a and the digest answered.
    digest: bool,
    /// The `RDMA:` field's value, if the request had one.
    rdma: Option<Vec<u8>>,
}

enum HeadResult {
    Request(Request, usize),
    Reply(Response),
    Closed,
}

/// Serves one connection until close, timeout, keep-alive limit or stop.
///
/// `body_buf` is the worker's response-body buffer, kept across connections
/// as a prefork child keeps its memory (no page faults of a fresh buffer per
/// connection); it grows to at most [`BODY_BUFFER_BYTES_MAX`].
pub(crate) fn serve_connection(
    mut stream: TcpStream,
    config: &Config,
    stop: &AtomicBool,
    body_buf: &mut Vec<u8>,
) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; HEAD_BYTES_MAX];
    let mut filled = 0usize;
    let mut served: u32 = 0;
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let mut rdma_session = farside_rdmahttp::server::Session::default();
    while !stop.load(Ordering::Relaxed) {
        let (request, head_len) = match read_head(&mut stream, &mut buf, &mut filled, config) {
            HeadResult::Request(r, n) => (r, n),
            HeadResult::Reply(resp) => {
                let _ = write_response(&mut stream, resp, false, false, 0, body_buf, config);
                return;
            }
            HeadResult::Closed => return,
        };
        buf.copy_within(head_len..filled, 0);
        filled -= head_len;
        if request.chunked_body {
            let _ = write_response(
                &mut stream,
                Response::error(501),
                false,
                false,
                0,
                body_buf,
                config,
            );
            return;
        }
        let body_max = if request.digest {
            POST_DIGEST_BYTES_MAX
        } else {
            REQUEST_BODY_BYTES_MAX
        };
        if request.body_bytes > body_max {
            let _ = write_response(
                &mut stream,
                Response::error(413),
                false,
                false,
                0,
                body_buf,
                config,
            );
            return;
        }
        if request.digest {
            let Ok(fnv) = digest_body(&mut stream, &mut buf, &mut filled, request.body_bytes)
            else {
                return;
            };
            served += 1;
            let keep_alive = request.keep_alive && served < config.keepalive_max;
            let text = format!("fnv1a64={fnv:016x} bytes={}\n", request.body_bytes);
            if write_response(
                &mut stream,
                Response::text(text),
                false,
                keep_alive,
                0,
                body_buf,
                config,
            )
            .is_err()
                || !keep_alive
            {
                return;
            }
            continue;
        }
        if discard_body(&mut stream, &mut buf, &mut filled, request.body_bytes).is_err() {
            return;
        }
        let cpu_start = farside_rt::thread_cpu();
        let mut response = route(&request, config);
        // Arena-reads of a file already in the arena: answered without reading it.
        let in_arena = match (&request.rdma, &config.rdma, response.status) {
            (Some(field), Some(server), 200) if !request.head_only => {
                server.arena_answer(field, response.file_key)
            }
            _ => None,
        };
        if let Some(answer) = in_arena {
            response.body = Body::Bytes(Vec::new());
            response.rdma = Some(answer);
        } else if !request.head_only {
            load_body(&mut response, body_buf);
        }
        if response.modelled {
            let body_bytes = if request.head_only {
                0
            } else {
                response.body.len()
            };
            cost::burn_cpu(config.cost.emulated(body_bytes));
        }
        if let (Some(field), false, None) = (&request.rdma, request.head_only, &response.rdma) {
            rdma_body(
                &mut response,
                field,
                peer,
                config,
                &mut rdma_session,
                body_buf,
            );
        }
        if let (Some(server), Some(field), Some(answer)) = (
            &config.rdma,
            &request.rdma,
            response
                .rdma
                .take_if(|_| config.rdma.is_some() && request.rdma.is_some()),
        ) {
            // Direct readers: publish a static public file, answer a grant.
            let url_path = request
                .target
                .split_once('?')
                .map_or(request.target.as_str(), |(p, _)| p);
            let fs_path = match (&config.root, &config.sites, &config.coop) {
                (Some(root), None, None) if response.file_key.is_some() => {
                    Some(root.join(url_path.trim_start_matches('/')))
                }
                _ => None,
            };
            let public = fs_path.as_deref().map(|f| (url_path, f));
            response.rdma = Some(server.with_grant(answer, field, peer, response.file_key, public));
        }
        let cpu_us = (farside_rt::thread_cpu().saturating_sub(cpu_start)).as_micros() as u64;
        served += 1;
        let keep_alive = request.keep_alive && served < config.keepalive_max && !response.close;
        let site = response.site.clone().filter(|_| response.status < 400);
        let sent = write_response(
            &mut stream,
            response,
            request.head_only,
            keep_alive,
            cpu_us,
            body_buf,
            config,
        )
        .is_ok();
        if let (true, Some((name, switch)), Some(sites)) = (sent, site, &config.sites) {
            sites.served(&name, switch);
        }
        if let Some(server) = &config.rdma {
            // A client-reads transfer: wait for done (or its deadline), release.
            server.after_answer(&mut rdma_session);
        }
        if !sent || !keep_alive {
            return;
        }
    }
}

/// A request with an `RDMA:` field: move a 200's body as it asks, leaving an empty
/// body and the field to answer, or leave the body to go over TCP with the reason.
/// Bodies larger than the connection buffer are read here in full (within the RDMA
/// transfer cap) and, if the transfer is declined, sent from memory.
fn rdma_body(
    response: &mut Response,
    field: &[u8],
    peer: Option<std::net::IpAddr>,
    config: &Config,
    session: &mut farside_rdmahttp::server::Session,
    body_buf: &mut [u8],
) {
    let (Some(server), Some(peer), 200) = (&config.rdma, peer, response.status) else {
        response.rdma = Some(RdmaResponse::Declined(Decline::NotOffered));
        return;
    };
    let n = response.body.len();
    if n > server.budget().caps().transfer_bytes_max {
        response.rdma = Some(RdmaResponse::Declined(Decline::TooLarge));
        return;
    }
    let key = response.file_key;
    let outcome = match &mut response.body {
        Body::Loaded(n) => server.serve(session, peer, field, &body_buf[..*n as usize], key),
        Body::Bytes(b) => server.serve(session, peer, field, b, key),
        Body::File(file, n) => {
            let mut bytes = Vec::with_capacity(*n as usize);
            let read = file.take(*n).read_to_end(&mut bytes);
            if !matches!(read, Ok(got) if got as u64 == *n) {
                log::warn!("backend: file read failed or shrank: {read:?}, wanted {n}");
                *response = Response::error(500);
                return;
            }
            let r = server.serve(session, peer, field, &bytes, key);
            response.body = Body::Bytes(bytes);
            r
        }
        Body::Generated(n) => {
            let bytes: Vec<u8> = (0..*n).map(generated_byte).collect();
            let r = server.serve(session, peer, field, &bytes, None);
            response.body = Body::Bytes(bytes);
            r
        }
    };
    match outcome {
        Ok(moved) => {
            response.body = Body::Bytes(Vec::new());
            response.rdma = Some(moved.response());
        }
        Err(d) => response.rdma = Some(RdmaResponse::Declined(d)),
    }
}

/// Reads (or generates) a body of at most [`BODY_BUFFER_BYTES_MAX`] into
/// `body_buf`, so its cost is paid before the head is written. A file that
/// cannot be read in full (it shrank since `stat`) becomes a 500.
fn load_body(response: &mut Response, body_buf: &mut Vec<u8>) {
    let n = response.body.len();
    if n > BODY_BUFFER_BYTES_MAX {
        return;
    }
    match &mut response.body {
        Body::File(file, _) => {
            body_buf.clear();
            // Exact room first: read_to_end would otherwise grow by doubling.
            body_buf.reserve_exact(n as usize);
            let read = file.take(n).read_to_end(body_buf);
            if !matches!(read, Ok(got) if got as u64 == n) {
                log::warn!("backend: file read failed or shrank: {read:?}, wanted {n}");
                *response = Response::error(500);
                return;
            }
        }
        Body::Generated(_) => {
            body_buf.clear();
            body_buf.extend((0..n).map(generated_byte));
        }
        Body::Bytes(_) | Body::Loaded(_) => return,
    }
    response.body = Body::Loaded(n);
}

fn read_head(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
    config: &Config,
) -> HeadResult {
    let deadline = Instant::now() + config.header_timeout;
    loop {
        if *filled > 0 {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf[..*filled]) {
                Ok(httparse::Status::Complete(n)) => {
                    return HeadResult::Request(to_request(&req), n)
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => {
                    return HeadResult::Reply(Response::error(431))
                }
                Err(_) => return HeadResult::Reply(Response::error(400)),
            }
        }
        if *filled == buf.len() {
            return HeadResult::Reply(Response::error(431));
        }
        let now = Instant::now();
        if now >= deadline {
            return HeadResult::Closed;
        }
        let _ = stream.set_read_timeout(Some(deadline - now));
        match stream.read(&mut buf[*filled..]) {
            Ok(0) => return HeadResult::Closed,
            Ok(n) => *filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return HeadResult::Closed,
        }
    }
}

fn to_request(req: &httparse::Request<'_, '_>) -> Request {
    let method = req.method.unwrap_or("");
    let version = req.version.unwrap_or(1);
    let mut connection_close = false;
    let mut connection_keep_alive = false;
    let mut body_bytes = 0u64;
    let mut chunked_body = false;
    let mut if_modified_since = None;
    let mut rdma = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case(farside_rdmahttp::header::NAME) {
            rdma = Some(h.value.to_vec());
            continue;
        }
        let value = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',') {
                let token = token.trim();
                connection_close |= token.eq_ignore_ascii_case("close");
                connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            // An unparsable length cannot be framed: treat as oversized (→ 413, close).
            body_bytes = value.trim().parse().unwrap_or(u64::MAX);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked_body = true;
        } else if h.name.eq_ignore_ascii_case("if-modified-since") {
            // An invalid date is ignored (RFC 9110 §13.1.3): the full body is sent.
            if_modified_since = httpdate::parse(&value);
        }
    }
    let keep_alive = if version >= 1 {
        !connection_close
    } else {
        connection_keep_alive
    };
    let head_only = method == "HEAD";
    let digest = method == "POST" && req.path == Some("/digest");
    let target = if method == "GET" || head_only || digest {
        req.path.unwrap_or("").to_string()
    } else {
        // Marker routed to 501 below; keeps Request small.
        String::new()
    };
    Request {
        head_only,
        target,
        keep_alive,
        body_bytes,
        chunked_body,
        if_modified_since,
        digest,
        rdma,
    }
}

/// FNV-1a (64 bit) offset basis and prime.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x100_0000_01b3;

/// Reads a `POST /digest` body of `len` bytes (the buffered part first), returns its
/// FNV-1a 64 digest.
fn digest_body(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
    len: u64,
) -> io::Result<u64> {
    let mut h = FNV_OFFSET;
    let mut update = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    };
    let buffered = (*filled as u64).min(len) as usize;
    update(&buf[..buffered]);
    buf.copy_within(buffered..*filled, 0);
    *filled -= buffered;
    let mut remaining = len - buffered as u64;
    let mut scratch = vec![0u8; CHUNK_BYTES];
    while remaining > 0 {
        let want = (remaining as usize).min(scratch.len());
        let n = match stream.read(&mut scratch[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        update(&scratch[..n]);
        remaining -= n as u64;
    }
    Ok(h)
}

fn discard_body(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
    mut remaining: u64,
) -> io::Result<()> {
    let buffered = (*filled as u64).min(remaining) as usize;
    buf.copy_within(buffered..*filled, 0);
    *filled -= buffered;
    remaining -= buffered as u64;
    let mut scratch = [0u8; 4096];
    while remaining > 0 {
        let want = (remaining as usize).min(scratch.len());
        let n = stream.read(&mut scratch[..want])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        remaining -= n as u64;
    }
    Ok(())
}

fn route(request: &Request, config: &Config) -> Response {
    if request.target.is_empty() {
        return Response::error(501);
    }
    if !request.target.starts_with('/') {
        return Response::error(400);
    }
    let (path, query) = match request.target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (request.target.as_str(), None),
    };
    match path {
        "/healthz" => return Response::text("ok\n".into()),
        "/cgi/work" => return cgi_work(query, config),
        _ => {}
    }
    if let Some(node) = &config.coop {
        return coop_file(node, path);
    }
    if let Some(sites) = &config.sites {
        let cur = sites.current();
        let mut response = static_file(&cur.root, path, request.if_modified_since);
        response.site = Some((cur.name, cur.switch));
        return response;
    }
    match &config.root {
        Some(root) => static_file(root, path, request.if_modified_since),
        None => generated(path),
    }
}

fn cgi_work(query: Option<&str>, config: &Config) -> Response {
    let mut us = config.cpu_us_default;
    for pair in query.unwrap_or("").split('&') {
        if let Some(v) = pair.strip_prefix("us=") {
            match v.parse::<u64>() {
                Ok(n) if n <= CPU_US_MAX => us = n,
                _ => return Response::error(400),
            }
        }
    }
    let start = farside_rt::thread_cpu_us();
    cost::burn_cpu_us(us);
    Response::text(format!(
        "burned {} us of cpu\n",
        farside_rt::thread_cpu_us().saturating_sub(start)
    ))
}

fn generated(path: &str) -> Response {
    let bytes = if path == "/file16k" {
        Some(FILE16K_BYTES)
    } else if let Some(rest) = path.strip_prefix("/files/") {
        let size = rest.split('/').next().unwrap_or("");
        size.parse::<u64>()
            .ok()
            .filter(|n| *n <= GENERATED_BYTES_MAX)
    } else {
        None
    };
    match bytes {
        Some(n) => Response {
            status: 200,
            content_type: "application/octet-stream",
            body: Body::Generated(n),
            close: false,
            last_modified: None,
            modelled: true,
            site: None,
            rdma: None,
            file_key: None,
        },
        None => Response::file_error(404),
    }
}

/// A file of the cooperating node (`--coop`): from its cache, a peer's or its disk;
/// `/coop/stats` answers its counters.
fn coop_file(node: &crate::coop::Node, path: &str) -> Response {
    if path == "/coop/stats" {
        return Response::text(node.stats_text());
    }
    match node.get(path) {
        Ok((body, _served)) => Response {
            status: 200,
            content_type: content_type(Path::new(path)),
            body: Body::Bytes(body.as_ref().clone()),
            close: false,
            last_modified: None,
            modelled: true,
            site: None,
            rdma: None,
            file_key: None,
        },
        Err(status) => Response::file_error(status),
    }
}

/// Decodes `%XX` escapes; `None` for malformed escapes or a NUL byte.
fn percent_decode(path: &str) -> Option<Vec<u8>> {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    (!out.contains(&0)).then_some(out)
}

/// Resolves `path` under `root` (canonical) and opens it.
///
/// Refused: malformed escapes or NUL (400), a `..` segment before or after
/// decoding (400), a path whose symlinks lead outside the docroot (403).
/// `If-Modified-Since` no earlier than the file's mtime (whole seconds, as
/// HTTP-dates have) gives 304 with no body.
fn static_file(root: &Path, path: &str, if_modified_since: Option<SystemTime>) -> Response {
    use std::os::unix::ffi::OsStrExt;
    let Some(decoded) = percent_decode(path) else {
        return Response::file_error(400);
    };
    let mut full = root.to_path_buf();
    for segment in decoded.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => return Response::file_error(400),
            s => full.push(std::ffi::OsStr::from_bytes(s)),
        }
    }
    if full.is_dir() {
        full.push("index.html");
    }
    let Ok(real) = full.canonicalize() else {
        return Response::file_error(404);
    };
    if !real.starts_with(root) {
        return Response::file_error(403);
    }
    let file = match File::open(&real) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Response::file_error(403),
        Err(_) => return Response::file_error(404),
    };
    let meta = match file.metadata() {
        Ok(meta) if meta.is_file() => meta,
        _ => return Response::file_error(404),
    };
    let last_modified = meta.modified().ok().map(whole_seconds);
    if let (Some(since), Some(modified)) = (if_modified_since, last_modified) {
        if modified <= since {
            return Response {
                status: 304,
                content_type: content_type(&real),
                body: Body::Bytes(Vec::new()),
                close: false,
                last_modified,
                modelled: true,
                site: None,
                rdma: None,
                file_key: None,
            };
        }
    }
    Response {
        status: 200,
        content_type: content_type(&real),
        body: Body::File(file, meta.len()),
        close: false,
        last_modified,
        modelled: true,
        site: None,
        rdma: None,
        file_key: Some(farside_rdmahttp::registration::FileKey::of(&meta)),
    }
}

/// `t` truncated to whole seconds (the resolution of HTTP-dates).
fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => "text/html",
        Some("gif") => "image/gif",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("css") => "text/css",
        Some("js") => "application/javascript",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    }
}

/// Writes all of `head` and then `body` with as few `writev` calls as the
/// socket allows.
fn write_all_vectored(stream: &mut TcpStream, head: &[u8], body: &[u8]) -> io::Result<()> {
    let mut slices = [IoSlice::new(head), IoSlice::new(body)];
    let mut slices: &mut [IoSlice<'_>] = &mut slices;
    while !slices.is_empty() {
        match stream.write_vectored(slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn write_response(
    stream: &mut TcpStream,
    response: Response,
    head_only: bool,
    keep_alive: bool,
    cpu_us: u64,
    body_buf: &mut Vec<u8>,
    config: &Config,
) -> io::Result<()> {
    use std::fmt::Write as _;
    let len = response.body.len();
    let mut head = String::with_capacity(320);
    let _ = write!(
        head,
        "HTTP/1.1 {} {}\r\nServer: farside-backend\r\nDate: {}\r\nX-Farside-Backend: {}\r\nX-Farside-Cpu-Us: {}\r\n",
        response.status,
        reason(response.status),
        httpdate::format(SystemTime::now()),
        config.backend_name,
        cpu_us,
    );
    if let Some((site, _)) = &response.site {
        let _ = write!(head, "X-Farside-Site: {site}\r\n");
    }
    if let Some(t) = response.last_modified {
        let _ = write!(head, "Last-Modified: {}\r\n", httpdate::format(t));
    }
    if let Some(field) = &response.rdma {
        let _ = write!(head, "{}: {field}\r\n", farside_rdmahttp::header::NAME);
    }
    // A 304 has no content and sends no Content-Length (RFC 9110 §15.4.5).
    if response.status != 304 {
        let _ = write!(
            head,
            "Content-Type: {}\r\nContent-Length: {}\r\n",
            response.content_type, len
        );
    }
    let _ = write!(
        head,
        "Connection: {}\r\n\r\n",
        if keep_alive { "keep-alive" } else { "close" }
    );
    let head = head.as_bytes();
    if head_only || response.status == 304 {
        return stream.write_all(head);
    }
    match response.body {
        Body::Bytes(bytes) => write_all_vectored(stream, head, &bytes),
        Body::Loaded(n) => write_all_vectored(stream, head, &body_buf[..n as usize]),
        Body::Generated(n) => {
            stream.write_all(head)?;
            let mut offset = 0u64;
            while offset < n {
                let chunk = (n - offset).min(CHUNK_BYTES as u64);
                body_buf.clear();
                body_buf.extend((offset..offset + chunk).map(generated_byte));
                stream.write_all(body_buf)?;
                offset += chunk;
            }
            Ok(())
        }
        Body::File(mut file, n) => {
            stream.write_all(head)?;
            body_buf.resize(CHUNK_BYTES, 0);
            let mut left = n;
            while left > 0 {
                let want = left.min(CHUNK_BYTES as u64) as usize;
                let got = match file.read(&mut body_buf[..want]) {
                    Ok(0) => {
                        // The file shrank under us: the framing is broken, close.
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    Ok(got) => got,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                stream.write_all(&body_buf[..got])?;
                left -= got as u64;
            }
            Ok(())
        }
    }
}
