//! The `RDMA:` header field, request and response, as a pure grammar.
//!
//! ```text
//! request   RDMA: server-writes, ip=10.0.0.15, port=3242, stag=642, to=0, maxlen=1048576
//!           RDMA: client-reads, ip=10.0.0.15, port=3242, maxlen=1048576
//! response  RDMA: server-writes, len=N                  (the body went by RDMA Write)
//!           RDMA: client-reads, stag=S, to=T, len=N     (read it there, then say done)
//!           RDMA: declined, reason=too-large            (the body is in this response)
//!
//! request   RDMA: arena-reads, maxlen=1048576
//! response  RDMA: arena-reads, port=7200, key=5, slot=0x1a2b0, class=10, hash=0x9f.., len=N
//!                 (read it one-sidedly from the server's kernel-answered object arena:
//!                  crate::arena; nothing to say done)
//! ```
//!
//! The request is the seed paper's (Figure 1): the mode first, then `name=value`
//! parameters separated by commas, in any order, names case-insensitive, optional
//! whitespace around each. `ip`/`port` name the client's RDMA listener (the server
//! connects to it, as the paper's server does), `stag`/`to` the client's sink region
//! (server-writes only; client-reads must not name one), `maxlen` the most the client
//! takes. Numbers are decimal, or hexadecimal after `0x`. Unknown parameters are
//! ignored (a newer client still gets served); a repeated or missing parameter, a value
//! out of range, or a field longer than [`FIELD_BYTES_MAX`] is a [`HeaderError`], and
//! the server answers such a request as if it had no `RDMA:` header at all.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// The header field's name.
pub const NAME: &str = "RDMA";
/// Longest field value parsed: the longest valid request (an IPv6 address and every
/// number at its widest) is under 160 bytes.
pub const FIELD_BYTES_MAX: usize = 256;

/// Who moves the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The server RDMA-Writes the body into the client's region, then answers.
    ServerWrites,
    /// The server answers where the body is; the client RDMA-Reads it and says done.
    ClientReads,
}

impl Mode {
    pub fn token(self) -> &'static str {
        match self {
            Mode::ServerWrites => "server-writes",
            Mode::ClientReads => "client-reads",
        }
    }

    fn from_token(t: &str) -> Option<Mode> {
        if t.eq_ignore_ascii_case("server-writes") {
            Some(Mode::ServerWrites)
        } else if t.eq_ignore_ascii_case("client-reads") {
            Some(Mode::ClientReads)
        } else {
            None
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::from_token(s).ok_or_else(|| format!("{s:?}: server-writes or client-reads"))
    }
}

/// A client's `RDMA:` request field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    /// The client's RDMA listener (`ip`, `port`).
    pub endpoint: SocketAddr,
    /// The client's sink region (server-writes): STag and tagged offset.
    pub sink: Option<(u32, u64)>,
    /// The most body bytes the client takes this way.
    pub maxlen: u64,
}

/// Why a request field was not taken (the request is then served without RDMA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    TooLong,
    NotText,
    UnknownMode,
    /// A parameter without `=`, or with a value that does not parse.
    BadParam(&'static str),
    Repeated(&'static str),
    Missing(&'static str),
    /// `stag`/`to` with client-reads.
    Unexpected(&'static str),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::TooLong => write!(f, "longer than {FIELD_BYTES_MAX} bytes"),
            HeaderError::NotText => write!(f, "not ASCII text"),
            HeaderError::UnknownMode => write!(f, "unknown mode"),
            HeaderError::BadParam(p) => write!(f, "bad parameter {p}"),
            HeaderError::Repeated(p) => write!(f, "parameter {p} repeated"),
            HeaderError::Missing(p) => write!(f, "parameter {p} missing"),
            HeaderError::Unexpected(p) => write!(f, "parameter {p} not allowed in this mode"),
        }
    }
}

impl std::error::Error for HeaderError {}

/// Why the server did not move the body by RDMA (it is then in the response, over TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decline {
    /// The request's field did not parse.
    BadField,
    /// The server does not offer RDMA, or not for this request (not a 200 GET).
    NotOffered,
    /// The body is larger than the client's `maxlen` or the server's transfer cap.
    TooLarge,
    /// `ip` is not the HTTP peer's own address.
    PeerMismatch,
    /// Too many transfers at once, or the registered-bytes budget is spent.
    Busy,
    /// The RDMA connection to the client failed or timed out.
    Connect,
    /// The RDMA transfer failed after the connection was made.
    Transfer,
}

impl Decline {
    pub fn token(self) -> &'static str {
        match self {
            Decline::BadField => "bad-field",
            Decline::NotOffered => "not-offered",
            Decline::TooLarge => "too-large",
            Decline::PeerMismatch => "peer-mismatch",
            Decline::Busy => "busy",
            Decline::Connect => "connect",
            Decline::Transfer => "transfer",
        }
    }

    const ALL: [Decline; 7] = [
        Decline::BadField,
        Decline::NotOffered,
        Decline::TooLarge,
        Decline::PeerMismatch,
        Decline::Busy,
        Decline::Connect,
        Decline::Transfer,
    ];

    fn from_token(t: &str) -> Option<Decline> {
        Decline::ALL
            .into_iter()
            .find(|d| d.token().eq_ignore_ascii_case(t))
    }
}

/// The first token of an arena-reads field (request and response).
pub const ARENA_READS: &str = "arena-reads";

/// Where an object is in the server's object arena: what a client needs to read it
/// one-sidedly from the server's own address (the HTTP peer), at the arena responder's
/// udp `port`, under key id `key` (an arena reader key the client holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaHint {
    pub port: u16,
    pub key: u32,
    /// Byte offset of the object's slot in the arena's slot area.
    pub slot: u64,
    /// The slot's size class (`farside_arena::layout`): where its tail word is.
    pub class: u8,
    /// The url hash the object is stored under (checked in the slot).
    pub hash: u64,
    pub len: u64,
}

/// An arena-reads request field's `maxlen`: `Some` if `value` is one (its first token
/// `arena-reads`), else `None` (another field, or a malformed one).
pub fn parse_arena_request(value: &[u8]) -> Option<u64> {
    let (first, p) = Params::split(text(value).ok()?).ok()?;
    if !first.eq_ignore_ascii_case(ARENA_READS) {
        return None;
    }
    p.need("maxlen").ok()
}

/// Whether an arena-reads request field asks for a grant (`direct=1`: the client
/// will resolve later urls in the arena itself, `crate::grant`). Unknown to servers
/// that do not grant, which ignore it.
pub fn arena_request_direct(value: &[u8]) -> bool {
    let Some((_, p)) = text(value).ok().and_then(|t| Params::split(t).ok()) else {
        return false;
    };
    matches!(p.num("direct"), Ok(Some(1)))
}

/// The server's `RDMA:` response field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// The body is in the server's object arena; `Content-Length: 0`.
    ArenaReads(ArenaHint),
    /// As `ArenaReads`, with a grant to resolve later urls in the arena without asking
    /// (`grant=G, gexp=E, ttl=T`; `crate::grant`).
    ArenaDirect(ArenaHint, crate::grant::Grant),
    /// The body (`len` bytes) is in the client's region; `Content-Length: 0`.
    ServerWrites { len: u64 },
    /// The body is at `stag`/`to` on the RDMA connection; `Content-Length: 0`.
    ClientReads { stag: u32, to: u64, len: u64 },
    /// The body is in this response.
    Declined(Decline),
}

/// Parsed `name=value` pairs of a field after its first token.
struct Params<'a> {
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    /// `(first token, params)`; the caller checked length and text.
    fn split(value: &'a str) -> Result<(&'a str, Params<'a>), HeaderError> {
        let mut parts = value.split(',').map(str::trim);
        let first = parts.next().unwrap_or("");
        let mut pairs = Vec::new();
        for p in parts {
            if p.is_empty() {
                continue;
            }
            let (n, v) = p.split_once('=').ok_or(HeaderError::BadParam("(no =)"))?;
            pairs.push((n.trim(), v.trim()));
        }
        Ok((first, Params { pairs }))
    }

    /// The value of `name`, at most once.
    fn get(&self, name: &'static str) -> Result<Option<&'a str>, HeaderError> {
        let mut found = None;
        for (n, v) in &self.pairs {
            if n.eq_ignore_ascii_case(name) {
                if found.is_some() {
                    return Err(HeaderError::Repeated(name));
                }
                found = Some(*v);
            }
        }
        Ok(found)
    }

    fn num(&self, name: &'static str) -> Result<Option<u64>, HeaderError> {
        match self.get(name)? {
            None => Ok(None),
            Some(v) => parse_u64(v).map(Some).ok_or(HeaderError::BadParam(name)),
        }
    }

    fn need(&self, name: &'static str) -> Result<u64, HeaderError> {
        self.num(name)?.ok_or(HeaderError::Missing(name))
    }
}

/// Decimal, or hexadecimal after `0x`; no sign, no spaces, no overflow.
fn parse_u64(v: &str) -> Option<u64> {
    let (digits, radix) = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (v, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn text(value: &[u8]) -> Result<&str, HeaderError> {
    if value.len() > FIELD_BYTES_MAX {
        return Err(HeaderError::TooLong);
    }
    let s = std::str::from_utf8(value).map_err(|_| HeaderError::NotText)?;
    if !s.is_ascii() {
        return Err(HeaderError::NotText);
    }
    Ok(s)
}

/// Parse a request's `RDMA:` field value.
pub fn parse_request(value: &[u8]) -> Result<Request, HeaderError> {
    let (mode, p) = Params::split(text(value)?)?;
    let mode = Mode::from_token(mode).ok_or(HeaderError::UnknownMode)?;
    let ip: IpAddr = p
        .get("ip")?
        .ok_or(HeaderError::Missing("ip"))?
        .parse()
        .map_err(|_| HeaderError::BadParam("ip"))?;
    let port = u16::try_from(p.need("port")?)
        .ok()
        .filter(|&p| p != 0)
        .ok_or(HeaderError::BadParam("port"))?;
    let maxlen = p.need("maxlen")?;
    let sink = match mode {
        Mode::ServerWrites => {
            let stag = u32::try_from(p.need("stag")?).map_err(|_| HeaderError::BadParam("stag"))?;
            Some((stag, p.num("to")?.unwrap_or(0)))
        }
        Mode::ClientReads => {
            if p.get("stag")?.is_some() {
                return Err(HeaderError::Unexpected("stag"));
            }
            if p.get("to")?.is_some() {
                return Err(HeaderError::Unexpected("to"));
            }
            None
        }
    };
    Ok(Request {
        mode,
        endpoint: SocketAddr::new(ip, port),
        sink,
        maxlen,
    })
}

/// Parse a response's `RDMA:` field value.
pub fn parse_response(value: &[u8]) -> Result<Response, HeaderError> {
    let (first, p) = Params::split(text(value)?)?;
    if first.eq_ignore_ascii_case("declined") {
        let reason = p
            .get("reason")?
            .and_then(Decline::from_token)
            .ok_or(HeaderError::BadParam("reason"))?;
        return Ok(Response::Declined(reason));
    }
    let len = p.need("len")?;
    if first.eq_ignore_ascii_case(ARENA_READS) {
        let small = |name: &'static str, max: u64| -> Result<u64, HeaderError> {
            Some(p.need(name)?)
                .filter(|&v| v <= max)
                .ok_or(HeaderError::BadParam(name))
        };
        let hint = ArenaHint {
            port: small("port", u16::MAX.into())? as u16,
            key: small("key", u32::MAX.into())? as u32,
            slot: p.need("slot")?,
            class: small("class", u8::MAX.into())? as u8,
            hash: p.need("hash")?,
            len,
        };
        if p.get("grant")?.is_none() {
            return Ok(Response::ArenaReads(hint));
        }
        let grant = crate::grant::Grant {
            id: small("grant", u32::MAX.into())? as u32,
            expires_ns: p.need("gexp")?,
            ttl_ms: p.need("ttl")?,
        };
        return Ok(Response::ArenaDirect(hint, grant));
    }
    match Mode::from_token(first).ok_or(HeaderError::UnknownMode)? {
        Mode::ServerWrites => Ok(Response::ServerWrites { len }),
        Mode::ClientReads => Ok(Response::ClientReads {
            stag: u32::try_from(p.need("stag")?).map_err(|_| HeaderError::BadParam("stag"))?,
            to: p.num("to")?.unwrap_or(0),
            len,
        }),
    }
}

impl fmt::Display for Request {
    /// The field value, as [`parse_request`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, ip={}, port={}",
            self.mode.token(),
            self.endpoint.ip(),
            self.endpoint.port()
        )?;
        if let Some((stag, to)) = self.sink {
            write!(f, ", stag={stag}, to={to}")?;
        }
        write!(f, ", maxlen={}", self.maxlen)
    }
}

impl fmt::Display for Response {
    /// The field value, as [`parse_response`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Response::ServerWrites { len } => write!(f, "server-writes, len={len}"),
            Response::ClientReads { stag, to, len } => {
                write!(f, "client-reads, stag={stag}, to={to}, len={len}")
            }
            Response::Declined(d) => write!(f, "declined, reason={}", d.token()),
            Response::ArenaReads(h) => write!(
                f,
                "{ARENA_READS}, port={}, key={}, slot={:#x}, class={}, hash={:#x}, len={}",
                h.port, h.key, h.slot, h.class, h.hash, h.len
            ),
            Response::ArenaDirect(h, g) => write!(
                f,
                "{}, grant={}, gexp={}, ttl={}",
                Response::ArenaReads(*h),
                g.id,
                g.expires_ns,
                g.ttl_ms
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: reproducible from the seed printed on failure.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn random_request(r: &mut Rng) -> Request {
        let ip: IpAddr = if r.below(2) == 0 {
            IpAddr::from((r.next() as u32).to_be_bytes())
        } else {
            IpAddr::from(((u128::from(r.next()) << 64) | u128::from(r.next())).to_be_bytes())
        };
        let mode = if r.below(2) == 0 {
            Mode::ServerWrites
        } else {
            Mode::ClientReads
        };
        Request {
            mode,
            endpoint: SocketAddr::new(ip, 1 + r.below(65535) as u16),
            sink: (mode == Mode::ServerWrites).then(|| (r.next() as u32, r.next() >> r.below(64))),
            maxlen: r.next() >> r.below(64),
        }
    }

    #[test]
    fn arena_fields_round_trip() {
        assert_eq!(parse_arena_request(b"arena-reads, maxlen=0x100"), Some(256));
        assert_eq!(parse_arena_request(b"Arena-Reads,maxlen=7,x=1"), Some(7));
        assert_eq!(parse_arena_request(b"arena-reads"), None);
        assert_eq!(parse_arena_request(b"client-reads, maxlen=7"), None);
        let h = ArenaHint {
            port: 7200,
            key: 5,
            slot: 0x1a2b0,
            class: 10,
            hash: u64::MAX - 1,
            len: 1 << 20,
        };
        let text = Response::ArenaReads(h).to_string();
        assert_eq!(parse_response(text.as_bytes()), Ok(Response::ArenaReads(h)));
        let g = crate::grant::Grant {
            id: 0x4000_0001,
            expires_ns: 123_456_789,
            ttl_ms: 9_999,
        };
        let text = Response::ArenaDirect(h, g).to_string();
        assert_eq!(
            parse_response(text.as_bytes()),
            Ok(Response::ArenaDirect(h, g))
        );
        assert!(arena_request_direct(b"arena-reads, maxlen=7, direct=1"));
        assert!(!arena_request_direct(b"arena-reads, maxlen=7"));
        assert!(!arena_request_direct(b"arena-reads, maxlen=7, direct=2"));
        assert_eq!(
            parse_arena_request(b"arena-reads, maxlen=7, direct=1"),
            Some(7),
            "a server that does not grant still serves it"
        );
        assert_eq!(
            parse_response(b"arena-reads, port=70000, key=1, slot=0, class=0, hash=1, len=1"),
            Err(HeaderError::BadParam("port"))
        );
        assert_eq!(
            parse_response(b"arena-reads, port=7, key=1, slot=0, class=0, len=1"),
            Err(HeaderError::Missing("hash"))
        );
    }

    #[test]
    fn parses_the_papers_example() {
        let r = parse_request(
            b"server-writes, ip=10.0.0.15, port=3242,\tstag=642, to=0, maxlen=1048576",
        )
        .unwrap();
        assert_eq!(r.mode, Mode::ServerWrites);
        assert_eq!(r.endpoint, "10.0.0.15:3242".parse().unwrap());
        assert_eq!(r.sink, Some((642, 0)));
        assert_eq!(r.maxlen, 1 << 20);
    }

    #[test]
    fn order_case_hex_and_unknown_parameters_are_accepted() {
        let r =
            parse_request(b"Server-Writes,MAXLEN=0x10 , to=7,stag=0xff,port=9,ip=::1,x=y").unwrap();
        assert_eq!(r.endpoint, "[::1]:9".parse().unwrap());
        assert_eq!((r.sink, r.maxlen), (Some((255, 7)), 16));
        let r = parse_request(b"client-reads, ip=127.0.0.1, port=1, maxlen=5").unwrap();
        assert_eq!((r.mode, r.sink), (Mode::ClientReads, None));
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        let cases: &[(&[u8], HeaderError)] = &[
            (b"", HeaderError::UnknownMode),
            (
                b"server-reads, ip=1.2.3.4, port=1, maxlen=1",
                HeaderError::UnknownMode,
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, maxlen=1",
                HeaderError::Missing("stag"),
            ),
            (
                b"server-writes, port=1, stag=1, maxlen=1",
                HeaderError::Missing("ip"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=0, stag=1, maxlen=1",
                HeaderError::BadParam("port"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=65536, stag=1, maxlen=1",
                HeaderError::BadParam("port"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, stag=4294967296, maxlen=1",
                HeaderError::BadParam("stag"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, stag=1, maxlen=-1",
                HeaderError::BadParam("maxlen"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, stag=1, maxlen=18446744073709551616",
                HeaderError::BadParam("maxlen"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, port=2, stag=1, maxlen=1",
                HeaderError::Repeated("port"),
            ),
            (
                b"server-writes, ip=1.2.3.4:5, port=1, stag=1, maxlen=1",
                HeaderError::BadParam("ip"),
            ),
            (
                b"server-writes, ip, port=1, stag=1, maxlen=1",
                HeaderError::BadParam("(no =)"),
            ),
            (
                b"client-reads, ip=1.2.3.4, port=1, stag=1, maxlen=1",
                HeaderError::Unexpected("stag"),
            ),
            (
                b"server-writes, ip=1.2.3.4, port=1, stag=\xff, maxlen=1",
                HeaderError::NotText,
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_request(input).as_ref(),
                Err(want),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(
            parse_request(&[b' '; FIELD_BYTES_MAX + 1]),
            Err(HeaderError::TooLong)
        );
    }

    #[test]
    fn every_request_roundtrips_through_its_text() {
        for seed in 0..2000u64 {
            let mut r = Rng(seed);
            let req = random_request(&mut r);
            let text = req.to_string();
            assert!(text.len() <= FIELD_BYTES_MAX, "seed {seed}: {text}");
            assert_eq!(
                parse_request(text.as_bytes()),
                Ok(req),
                "seed {seed}: {text}"
            );
        }
    }

    #[test]
    fn every_response_roundtrips_through_its_text() {
        let mut r = Rng(1);
        for _ in 0..1000 {
            let resp = match r.below(3) {
                0 => Response::ServerWrites { len: r.next() },
                1 => Response::ClientReads {
                    stag: r.next() as u32,
                    to: r.next(),
                    len: r.next(),
                },
                _ => Response::Declined(Decline::ALL[r.below(7) as usize]),
            };
            assert_eq!(parse_response(resp.to_string().as_bytes()), Ok(resp));
        }
    }

    /// Mutated fields (bytes flipped, cut, spliced) parse or fail, never panic, and
    /// whatever parses prints back to a field that parses to the same request.
    #[test]
    fn mutated_fields_never_panic_and_what_parses_is_stable() {
        for seed in 0..5000u64 {
            let mut r = Rng(seed);
            let mut field = random_request(&mut r).to_string().into_bytes();
            for _ in 0..1 + r.below(4) {
                let at = r.below(field.len() as u64) as usize;
                match r.below(4) {
                    0 => field[at] = r.next() as u8,
                    1 => field.truncate(at),
                    2 => field.insert(at, b",=x0 \t"[r.below(6) as usize]),
                    _ => {
                        field.remove(at);
                    }
                }
                if field.is_empty() {
                    break;
                }
            }
            if let Ok(req) = parse_request(&field) {
                assert_eq!(
                    parse_request(req.to_string().as_bytes()),
                    Ok(req),
                    "seed {seed}"
                );
            }
            let _ = parse_response(&field);
        }
    }
}
