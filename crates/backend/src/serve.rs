//! One connection's life: read a request head, route it, write the response,
//! repeat while keep-alive allows.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::{
    BackendArgs, CPU_US_MAX, GENERATED_BYTES_MAX, HEADERS_MAX, HEAD_BYTES_MAX,
    REQUEST_BODY_BYTES_MAX,
};

/// Bodies up to this size are written together with the head in one write
/// (one segment on loopback, no Nagle/delayed-ACK interplay).
const BODY_INLINE_BYTES_MAX: u64 = 64 * 1024;
/// Chunk size used to stream larger generated bodies and files.
const CHUNK_BYTES: usize = 64 * 1024;
/// Size of `/file16k` in generated mode (the paper's single-file trace).
const FILE16K_BYTES: u64 = 16 * 1024;

/// Immutable per-server configuration shared by the workers.
pub(crate) struct Config {
    root: Option<PathBuf>,
    cpu_us_default: u64,
    /// CPU burned per static or generated file request (emulated processing).
    static_cpu_us: u64,
    keepalive_max: u32,
    header_timeout: Duration,
    /// Value of the `X-Farside-Backend` header.
    backend_name: String,
}

impl Config {
    pub(crate) fn new(args: &BackendArgs, addr: SocketAddr) -> Config {
        Config {
            root: args.root.clone(),
            cpu_us_default: args.cpu_us,
            static_cpu_us: args.static_cpu_us,
            keepalive_max: args.keepalive_max,
            header_timeout: Duration::from_millis(args.header_timeout_ms),
            backend_name: addr.to_string(),
        }
    }
}

/// Deterministic content of generated files: byte `i` of every generated file.
pub fn generated_byte(i: u64) -> u8 {
    const ALPHABET: &[u8; 64] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-\n";
    ALPHABET[(i % 64) as usize]
}

/// CPU time consumed by the calling thread so far, in µs.
pub fn thread_cpu_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Busy-loops until this thread has consumed `us` µs of CPU time (so the cost
/// is real CPU, and a descheduled worker keeps owing it).
fn burn_cpu(us: u64) {
    let start = thread_cpu_us();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while thread_cpu_us().saturating_sub(start) < us {
        for _ in 0..256 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
        }
        std::hint::black_box(x);
    }
}

enum Body {
    Bytes(Vec<u8>),
    Generated(u64),
    File(File, u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::Generated(n) | Body::File(_, n) => *n,
        }
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: Body,
    /// Close the connection after this response whatever the client asked.
    close: bool,
}

impl Response {
    fn error(status: u16) -> Response {
        let text = format!("{} {}\n", status, reason(status));
        Response {
            status,
            content_type: "text/plain",
            body: Body::Bytes(text.into_bytes()),
            close: matches!(status, 400 | 413 | 431 | 501),
        }
    }

    fn text(body: String) -> Response {
        Response {
            status: 200,
            content_type: "text/plain",
            body: Body::Bytes(body.into_bytes()),
            close: false,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
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
}

enum HeadResult {
    Request(Request, usize),
    Reply(Response),
    Closed,
}

/// Serves one connection until close, timeout, keep-alive limit or stop.
pub(crate) fn serve_connection(mut stream: TcpStream, config: &Config, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; HEAD_BYTES_MAX];
    let mut filled = 0usize;
    let mut served: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let (request, head_len) = match read_head(&mut stream, &mut buf, &mut filled, config) {
            HeadResult::Request(r, n) => (r, n),
            HeadResult::Reply(resp) => {
                let _ = write_response(&mut stream, resp, false, false, config);
                return;
            }
            HeadResult::Closed => return,
        };
        buf.copy_within(head_len..filled, 0);
        filled -= head_len;
        if request.chunked_body {
            let _ = write_response(&mut stream, Response::error(501), false, false, config);
            return;
        }
        if request.body_bytes > REQUEST_BODY_BYTES_MAX {
            let _ = write_response(&mut stream, Response::error(413), false, false, config);
            return;
        }
        if discard_body(&mut stream, &mut buf, &mut filled, request.body_bytes).is_err() {
            return;
        }
        let response = route(&request, config);
        served += 1;
        let keep_alive = request.keep_alive && served < config.keepalive_max && !response.close;
        if write_response(&mut stream, response, request.head_only, keep_alive, config).is_err()
            || !keep_alive
        {
            return;
        }
    }
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
    for h in req.headers.iter() {
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
        }
    }
    let keep_alive = if version >= 1 {
        !connection_close
    } else {
        connection_keep_alive
    };
    let head_only = method == "HEAD";
    let target = if method == "GET" || head_only {
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
    }
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
    if config.static_cpu_us > 0 {
        burn_cpu(config.static_cpu_us);
    }
    match &config.root {
        Some(root) => static_file(root, path),
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
    let start = thread_cpu_us();
    burn_cpu(us);
    Response::text(format!(
        "burned {} us of cpu\n",
        thread_cpu_us().saturating_sub(start)
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
        },
        None => Response::error(404),
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

fn static_file(root: &Path, path: &str) -> Response {
    use std::os::unix::ffi::OsStrExt;
    let Some(decoded) = percent_decode(path) else {
        return Response::error(400);
    };
    let mut full = root.to_path_buf();
    for segment in decoded.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => return Response::error(400),
            s => full.push(std::ffi::OsStr::from_bytes(s)),
        }
    }
    if full.is_dir() {
        full.push("index.html");
    }
    let Ok(file) = File::open(&full) else {
        return Response::error(404);
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => {
            let len = meta.len();
            Response {
                status: 200,
                content_type: content_type(&full),
                body: Body::File(file, len),
                close: false,
            }
        }
        _ => Response::error(404),
    }
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

fn write_response(
    stream: &mut TcpStream,
    response: Response,
    head_only: bool,
    keep_alive: bool,
    config: &Config,
) -> io::Result<()> {
    let len = response.body.len();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nServer: farside-backend\r\nX-Farside-Backend: {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: {}\r\n\r\n",
        response.status,
        reason(response.status),
        config.backend_name,
        response.content_type,
        len,
        if keep_alive { "keep-alive" } else { "close" },
    )
    .into_bytes();
    if head_only {
        return stream.write_all(&out);
    }
    match response.body {
        Body::Bytes(bytes) => {
            out.extend_from_slice(&bytes);
            stream.write_all(&out)
        }
        Body::Generated(n) => {
            let inline = n <= BODY_INLINE_BYTES_MAX;
            if !inline {
                stream.write_all(&out)?;
                out.clear();
            }
            let mut offset = 0u64;
            while offset < n {
                let chunk = (n - offset).min(CHUNK_BYTES as u64);
                out.extend((offset..offset + chunk).map(generated_byte));
                offset += chunk;
                if !inline {
                    stream.write_all(&out)?;
                    out.clear();
                }
            }
            if inline {
                stream.write_all(&out)?;
            }
            Ok(())
        }
        Body::File(mut file, n) => {
            if n <= BODY_INLINE_BYTES_MAX {
                let head = out.len();
                out.resize(head + n as usize, 0);
                file.read_exact(&mut out[head..])?;
                stream.write_all(&out)
            } else {
                stream.write_all(&out)?;
                let copied = io::copy(&mut file.take(n), stream)?;
                if copied != n {
                    // The file shrank under us: the framing is broken, close.
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(())
            }
        }
    }
}
