//! One HTTP/1.1 exchange on a (possibly kept-alive) connection.
//!
//! Parses the status line and headers with httparse, then reads the whole
//! body framed by Content-Length, chunked encoding, or connection close.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Largest response head accepted; larger is a malformed response.
const RESPONSE_HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most response headers parsed.
const RESPONSE_HEADERS_MAX: usize = 64;
/// Longest chunk-size or trailer line of a chunked body.
const CHUNK_LINE_BYTES_MAX: usize = 4096;
/// Read buffer per connection.
const READ_BUFFER_BYTES: usize = 32 * 1024;

/// Why an exchange failed (the request's outcome, see `Outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The TCP connection could not be established.
    Connect,
    /// Not established within the connect timeout: abandoned.
    ConnectTimeout,
    /// Reset, unexpected EOF or another socket error after connecting.
    Io,
    /// The response could not be parsed or framed.
    Malformed,
}

/// Random ports tried per connection before the kernel chooses one
/// (`--source-ports random`): a port is busy only if a connection of ours to the same
/// server holds it, a few hundred of the range's ~28,000, so 8 busy draws in a row
/// (odds below 1e-10 at 1 % in use) mean the range is nearly full.
pub const SOURCE_PORT_ATTEMPTS: u32 = 8;

/// `--source-ports random`: each connection's source port drawn uniformly from the
/// ephemeral range, as if every connection came from a client of its own. Linux hands
/// a host's connects ports that it reuses within seconds under load, so a single
/// client host's ports correlate with the fate of its earlier connections (an
/// abandoned connect frees its port at once); a front-end that hashes the 4-tuple then
/// sends the reused ports where their last connection went.
pub struct PortPicker {
    lo: u16,
    /// Ports in the range (`hi - lo + 1`).
    span: u32,
    /// SplitMix64 state, advanced atomically (one draw per attempt).
    state: AtomicU64,
    /// Connections whose [`SOURCE_PORT_ATTEMPTS`] random ports were all busy (the
    /// kernel chose).
    pub fallbacks: AtomicU64,
}

impl PortPicker {
    /// Draws from `lo..=hi` (a host's `net.ipv4.ip_local_port_range`), seeded.
    pub fn new(lo: u16, hi: u16, seed: u64) -> Result<PortPicker, String> {
        if lo == 0 || hi < lo {
            return Err(format!(
                "source port range {lo}-{hi}: want 1 <= low <= high"
            ));
        }
        Ok(PortPicker {
            lo,
            span: u32::from(hi - lo) + 1,
            state: AtomicU64::new(seed ^ 0x5eed_5041_7e55_0f00),
            fallbacks: AtomicU64::new(0),
        })
    }

    /// The host's ephemeral range, from `/proc/sys/net/ipv4/ip_local_port_range`.
    pub fn from_host(seed: u64) -> Result<PortPicker, String> {
        const PATH: &str = "/proc/sys/net/ipv4/ip_local_port_range";
        let text = std::fs::read_to_string(PATH).map_err(|e| format!("{PATH}: {e}"))?;
        let mut it = text.split_whitespace().map(str::parse::<u16>);
        match (it.next(), it.next()) {
            (Some(Ok(lo)), Some(Ok(hi))) => PortPicker::new(lo, hi, seed),
            _ => Err(format!("{PATH}: expected two ports, got {text:?}")),
        }
    }

    /// The range drawn from, inclusive.
    pub fn range(&self) -> (u16, u16) {
        (self.lo, (u32::from(self.lo) + self.span - 1) as u16)
    }

    fn next(&self) -> u16 {
        let mut z = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // Lemire's multiply-shift: uniform enough for a span of at most 65,535.
        self.lo + ((u64::from(z as u32) * u64::from(self.span)) >> 32) as u16
    }
}

/// Connects from a random source port of `ports` (bound with `SO_REUSEADDR`, so a
/// port whose earlier connection is gone can be taken again; the kernel still refuses
/// a 4-tuple in use, and then another port is drawn). After
/// [`SOURCE_PORT_ATTEMPTS`] busy ports the kernel chooses.
async fn connect_from_random_port(
    addr: SocketAddr,
    ports: &PortPicker,
) -> std::io::Result<TcpStream> {
    let any = match addr.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = || match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    };
    for _ in 0..SOURCE_PORT_ATTEMPTS {
        let s = socket()?;
        s.set_reuseaddr(true)?;
        if let Err(e) = s.bind(SocketAddr::new(any, ports.next())) {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                continue;
            }
            return Err(e);
        }
        match s.connect(addr).await {
            // EADDRNOTAVAIL: this 4-tuple is in use (or in TIME_WAIT).
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => continue,
            r => return r,
        }
    }
    ports.fallbacks.fetch_add(1, Ordering::Relaxed);
    TcpStream::connect(addr).await
}

/// A client connection with its read buffer.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Requests already completed on this connection.
    pub reused: u32,
    /// CRC32c of the body being read, when bodies are checked ([`Conn::check_bodies`]).
    crc: Option<u32>,
}

/// Result of one successful exchange.
pub struct Reply {
    pub status: u16,
    pub body_bytes: u64,
    /// Whether the connection may carry another request.
    pub reusable: bool,
    /// `Retry-After` in delta-seconds, if the response had one (an HTTP-date
    /// form is ignored: back-off then follows its own schedule).
    pub retry_after: Option<Duration>,
    /// CRC32c of the body, when the connection checks bodies.
    pub body_crc: Option<u32>,
}

impl Conn {
    /// Compute the CRC32c of every body read on this connection ([`Reply::body_crc`]).
    pub fn check_bodies(&mut self) {
        self.crc = Some(0);
    }

    /// Adds the buffered bytes `from..to` to the body's CRC32c, when checked.
    fn digest(&mut self, from: usize, to: usize) {
        if let Some(c) = self.crc.as_mut() {
            *c = crc32c::crc32c_append(*c, &self.buf[from..to]);
        }
    }

    /// Connects to `addr`; with `timeout`, an attempt still not established then is
    /// abandoned (the socket is closed, so the kernel sends no more SYNs for it).
    /// `ports`: draw the source port (`--source-ports random`); `None`: the kernel's.
    pub async fn connect(
        addr: SocketAddr,
        timeout: Option<Duration>,
        ports: Option<&PortPicker>,
    ) -> Result<Conn, Failure> {
        let connecting = async {
            match ports {
                Some(p) => connect_from_random_port(addr, p).await,
                None => TcpStream::connect(addr).await,
            }
        };
        let stream = match timeout {
            Some(t) => tokio::time::timeout(t, connecting)
                .await
                .map_err(|_| Failure::ConnectTimeout)?,
            None => connecting.await,
        }
        .map_err(|_| Failure::Connect)?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            buf: vec![0; READ_BUFFER_BYTES],
            start: 0,
            end: 0,
            reused: 0,
            crc: None,
        })
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Reads more bytes into the buffer; returns how many (0 = EOF).
    async fn fill(&mut self) -> Result<usize, Failure> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= RESPONSE_HEAD_BYTES_MAX {
                return Err(Failure::Malformed);
            }
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self
            .stream
            .read(&mut self.buf[self.end..])
            .await
            .map_err(|_| Failure::Io)?;
        self.end += n;
        Ok(n)
    }

    /// Discards exactly `n` body bytes.
    async fn skip(&mut self, mut n: u64) -> Result<(), Failure> {
        loop {
            let take = (self.end - self.start).min(n.min(usize::MAX as u64) as usize);
            self.digest(self.start, self.start + take);
            self.start += take;
            n -= take as u64;
            if n == 0 {
                return Ok(());
            }
            if self.fill().await? == 0 {
                return Err(Failure::Io);
            }
        }
    }

    /// Returns the next CRLF-terminated line (without CRLF).
    async fn line(&mut self) -> Result<Vec<u8>, Failure> {
        loop {
            if let Some(pos) = self.buffered().windows(2).position(|w| w == b"\r\n") {
                let line = self.buffered()[..pos].to_vec();
                self.start += pos + 2;
                return Ok(line);
            }
            if self.end - self.start > CHUNK_LINE_BYTES_MAX {
                return Err(Failure::Malformed);
            }
            if self.fill().await? == 0 {
                return Err(Failure::Io);
            }
        }
    }

    /// Sends `request` and reads the whole response. `head_only` for HEAD.
    ///
    /// On a kept-alive connection the server may have closed it while idle;
    /// `Err((Failure::Io, false))` then means "nothing received", which the
    /// caller may retry on a fresh connection as HTTP clients do.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<Reply, (Failure, bool)> {
        self.stream
            .write_all(request)
            .await
            .map_err(|_| (Failure::Io, false))?;
        let mut received_any = self.end > self.start;
        // Head, skipping 1xx interim responses.
        let (status, framing, close, retry_after) = loop {
            let parsed = {
                let mut headers = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(self.buffered()) {
                    Ok(httparse::Status::Complete(n)) => Some((n, head_info(&resp))),
                    Ok(httparse::Status::Partial) => None,
                    Err(_) => return Err((Failure::Malformed, true)),
                }
            };
            match parsed {
                Some((n, info)) => {
                    self.start += n;
                    let (status, ..) = info;
                    if (100..200).contains(&status) {
                        continue;
                    }
                    break info;
                }
                None => match self.fill().await {
                    Ok(0) => return Err((Failure::Io, received_any)),
                    Ok(_) => received_any = true,
                    Err(f) => return Err((f, received_any)),
                },
            }
        };
        let no_body = status == 204 || status == 304;
        let fail = |f| (f, true);
        if self.crc.is_some() {
            self.crc = Some(0);
        }
        let (body_bytes, reusable) = match framing {
            _ if no_body => (0, !close),
            Framing::Chunked => (self.chunked_body().await.map_err(fail)?, !close),
            Framing::Length(n) => {
                self.skip(n).await.map_err(fail)?;
                (n, !close)
            }
            Framing::Eof => {
                let mut total = (self.end - self.start) as u64;
                self.digest(self.start, self.end);
                self.start = self.end;
                loop {
                    let n = self.fill().await.map_err(fail)?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    self.digest(self.start, self.end);
                    self.start = self.end;
                }
                (total, false)
            }
        };
        self.reused += 1;
        Ok(Reply {
            status,
            body_bytes,
            reusable,
            retry_after,
            body_crc: self.crc,
        })
    }

    async fn chunked_body(&mut self) -> Result<u64, Failure> {
        let mut total = 0u64;
        loop {
            let line = self.line().await?;
            let text = std::str::from_utf8(&line).map_err(|_| Failure::Malformed)?;
            let size_hex = text.split(';').next().unwrap_or("").trim();
            let size = u64::from_str_radix(size_hex, 16).map_err(|_| Failure::Malformed)?;
            if size == 0 {
                // Trailers, up to the empty line.
                while !self.line().await?.is_empty() {}
                return Ok(total);
            }
            self.skip(size).await?;
            if !self.line().await?.is_empty() {
                return Err(Failure::Malformed);
            }
            total += size;
        }
    }
}

enum Framing {
    Length(u64),
    Chunked,
    Eof,
}

/// (status, framing, connection close?, Retry-After) from a parsed response head.
fn head_info(resp: &httparse::Response<'_, '_>) -> (u16, Framing, bool, Option<Duration>) {
    let status = resp.code.unwrap_or(0);
    let mut framing = Framing::Eof;
    let mut close = resp.version == Some(0);
    let mut retry_after = None;
    for h in resp.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("retry-after") {
            retry_after = value.trim().parse::<u64>().ok().map(Duration::from_secs);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().contains("chunked") {
                framing = Framing::Chunked;
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            if !matches!(framing, Framing::Chunked) {
                // An unparsable length: fall back to reading until close.
                framing = value
                    .trim()
                    .parse()
                    .map(Framing::Length)
                    .unwrap_or(Framing::Eof);
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            let v = value.to_ascii_lowercase();
            if v.contains("close") {
                close = true;
            } else if v.contains("keep-alive") {
                close = false;
            }
        }
    }
    (status, framing, close, retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_picker_draws_within_its_range_and_refuses_a_bad_one() {
        let p = PortPicker::new(40000, 40009, 7).unwrap();
        assert_eq!(p.range(), (40000, 40009));
        let mut hits = [0u32; 10];
        for _ in 0..10_000 {
            let port = p.next();
            assert!((40000..=40009).contains(&port), "{port}");
            hits[usize::from(port - 40000)] += 1;
        }
        assert!(hits.iter().all(|&h| (800..=1200).contains(&h)), "{hits:?}");
        let full = PortPicker::new(1, u16::MAX, 1).unwrap();
        assert_eq!(full.range(), (1, u16::MAX));
        assert!(PortPicker::new(0, 10, 1).is_err());
        assert!(PortPicker::new(20, 10, 1).is_err());
    }
}
