//! In-tree fuzzing of the proxy's two parsers of client bytes: the request head parser
//! (`http::parse_request`) and the chunked-body scanner (`http::Chunked`), alone and
//! together on pipelined streams. Stable Rust, no extra tools: a seeded xorshift mutator
//! over a corpus of valid inputs, run for a bounded number of iterations so that it runs
//! in CI on every `cargo test`.
//!
//! - `FARSIDE_FUZZ_ITERS=N`: iterations per target (default [`CI_ITERS`]). For a long
//!   run (about 300k executions per second per target in the test profile here):
//!   `FARSIDE_FUZZ_ITERS=20000000 cargo test -p farside-proxy --test fuzz_http --
//!   --nocapture --test-threads=1`.
//! - `FARSIDE_FUZZ_SEED=S`: start from another seed (default fixed, so CI is repeatable).
//!   A failure prints the seed, the iteration and the input.
//!
//! Properties checked on every input:
//! - neither parser panics;
//! - an accepted head lies inside the input, never carries both Content-Length and
//!   Transfer-Encoding, and its rewritten form (what goes upstream) is strict CRLF text
//!   with one framing header that parses back to the same framing;
//! - the chunked scanner agrees with an independent, whole-buffer reference decoder of
//!   RFC 9112 §7.1 on where a body ends and what its payload is, rejects what the
//!   reference rejects, gives the same answer however the input is split across reads,
//!   and re-encoding its payload then decoding again gives the same bytes;
//! - a pipelined stream of requests, split as the data path splits it (rewritten heads,
//!   bodies relayed as is), is read by a model back-end as exactly the same requests and
//!   payloads, with nothing left over: no desynchronisation.

use farside_proxy::http::{
    self, BodyFraming, ChunkError, Chunked, CHUNK_EXT_BYTES_MAX, CHUNK_SIZE_DIGITS_MAX,
    TRAILER_BYTES_MAX,
};

/// Iterations per target in CI: a few seconds of one core in the test profile.
const CI_ITERS: u64 = 200_000;
/// Largest fuzz input; the parsers' bounds (16 KiB) are exercised by the corpus growing
/// inputs through duplication up to this.
const INPUT_BYTES_MAX: usize = 40 * 1024;
/// Limits given to `parse_request` (small, so they are hit often).
const MAX_HEADERS: usize = 16;
const MAX_HEADER_BYTES: usize = 2048;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

/// Bytes and fragments that matter to HTTP/1.1 framing.
const TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b"\r",
    b" ",
    b"\t",
    b":",
    b";",
    b"=",
    b"\"",
    b"\\",
    b",",
    b"0",
    b"f",
    b"F",
    b"x",
    b"\x00",
    b"\x0b",
    b"\x0c",
    b"\x7f",
    b"\x80",
    b"\xff",
    b"0\r\n\r\n",
    b"\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Transfer_Encoding: chunked\r\n",
    b"Transfer-Encoding: chunked, identity\r\n",
    b"Transfer-Encoding: gzip, chunked\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: +5\r\n",
    b"Content-Length: 99999999999999999999\r\n",
    b"Host: a\r\n",
    b"Connection: close, X-Y\r\n",
    b"Expect: 100-continue\r\n",
    b" HTTP/1.0",
    b" HTTP/1.1",
    b";name=\"q\\\"d\"",
    b"ffffffffffffffff",
    b"X-T: v\r\n",
];

const HEAD_CORPUS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /x?y=1 HTTP/1.0\r\n\r\n",
    b"HEAD /index.html HTTP/1.1\r\nHost: example.com:8080\r\nConnection: keep-alive\r\n\r\n",
    b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\nContent-Type: text/plain\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: [::1]:80\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
    b"PUT /f HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nX-Forwarded-For: 1.2.3.4\r\nConnection: X-A\r\nX-A: 1\r\n\r\n",
    b"DELETE /d HTTP/1.1\nHost: a\nTE: trailers\nUpgrade: h2c\n\n",
    b"OPTIONS * HTTP/1.1\r\nHost: a\r\nKeep-Alive: 5\r\nProxy-Connection: close\r\n\r\n",
];

const CHUNK_CORPUS: &[&[u8]] = &[
    b"5\r\nhello\r\n0\r\n\r\n",
    b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nX-T: 1\r\n\r\n",
    b"A; a = b ;c=\"q;\\\"x\"\r\n0123456789\r\n000\r\nA: 1\r\nB:\r\n\r\n",
    b"1\r\nx\r\n1\r\ny\r\n1\r\nz\r\n0;last\r\n\r\nGET / HTTP/1.1\r\n",
    b"0\r\n\r\n",
    b"10\r\n0123456789abcdef\r\n0\r\nTrailer-A: v1 v2\r\nTrailer-B: \x80\xff\r\n\r\n",
];

fn mutate(rng: &mut Rng, corpus: &[&[u8]], input: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            // Flip a bit.
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            // Replace a byte with an interesting one.
            1 if len > 0 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                let i = rng.below(len);
                input[i] = t[0];
            }
            // Insert a token.
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                let i = rng.below(len + 1);
                input.splice(i..i, t.iter().copied());
            }
            // Delete a range.
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                input.drain(i..i + n);
            }
            // Duplicate a range (grows inputs towards the bounds).
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below(len - i);
                let copy: Vec<u8> = input[i..i + n].to_vec();
                for _ in 0..1 + rng.below(8) {
                    input.splice(i..i, copy.iter().copied());
                }
            }
            // Splice in part of another corpus entry.
            5 => {
                let other = corpus[rng.below(corpus.len())];
                let a = rng.below(other.len());
                let b = a + rng.below(other.len() - a + 1);
                let i = rng.below(len + 1);
                input.splice(i..i, other[a..b].iter().copied());
            }
            // Truncate.
            6 if len > 0 => input.truncate(rng.below(len)),
            // Random byte.
            7 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            // Change a hex digit (chunk sizes).
            _ => {
                if let Some(i) = (0..len.min(64))
                    .map(|_| rng.below(len))
                    .find(|&i| input[i].is_ascii_hexdigit())
                {
                    input[i] = b"0123456789abcdefF"[rng.below(17)];
                }
            }
        }
    }
    input.truncate(INPUT_BYTES_MAX);
}

/// Runs `check` on `iters` mutated inputs; on a panic, reports how to reproduce it.
/// `check` names the outcome of each input, tallied in the final line (so a run shows it
/// exercised acceptance as well as every way of refusing).
fn fuzz(name: &str, corpus: &[&[u8]], check: impl Fn(&mut Rng, &[u8]) -> &'static str) {
    let iters = env_u64("FARSIDE_FUZZ_ITERS", CI_ITERS);
    let seed = env_u64("FARSIDE_FUZZ_SEED", 0x5EED_F00D_CAFE_0001);
    // xorshift needs a non-zero state.
    let mut rng = Rng(seed.max(1));
    let started = std::time::Instant::now();
    let mut outcomes = std::collections::BTreeMap::<&str, u64>::new();
    for iter in 0..iters {
        let base = corpus[rng.below(corpus.len())];
        let mut input = base.to_vec();
        // Some inputs stay valid, most get mutated, a few mutated several times over.
        let rounds = [0, 1, 1, 2, 3, 8][rng.below(6)];
        for _ in 0..rounds {
            mutate(&mut rng, corpus, &mut input);
        }
        let mut inner = Rng(rng.next() | 1);
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&mut inner, &input)));
        if let Ok(outcome) = r {
            *outcomes.entry(outcome).or_default() += 1;
        } else {
            panic!(
                "{name}: property failed at iteration {iter} (FARSIDE_FUZZ_SEED={seed}) on input {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
    println!(
        "{name}: {iters} executions in {:.2?} (seed {seed}), no findings; outcomes {outcomes:?}",
        started.elapsed()
    );
}

/// Does `head` have a field `name`, also spelt with `_` for `-` (as CGI-style back-ends
/// read it)?
fn has_header(head: &[u8], name: &str) -> bool {
    head.split(|&c| c == b'\n').skip(1).any(|line| {
        line.split(|&c| c == b':').next().is_some_and(|n| {
            n.len() == name.len()
                && n.iter()
                    .zip(name.bytes())
                    .all(|(&a, b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
        })
    })
}

/// The rewritten head is strict: CRLF line ends only, no CR or LF anywhere else, ends
/// with the empty line.
fn assert_strict_crlf(out: &[u8]) {
    assert!(out.ends_with(b"\r\n\r\n"));
    for (i, &c) in out.iter().enumerate() {
        match c {
            b'\r' => assert_eq!(out.get(i + 1), Some(&b'\n'), "bare CR at {i}"),
            b'\n' => assert!(i > 0 && out[i - 1] == b'\r', "bare LF at {i}"),
            _ => {}
        }
    }
}

#[test]
fn fuzz_request_head_parser() {
    fuzz("request head", HEAD_CORPUS, |_rng, input| {
        let mut out = Vec::new();
        let parsed =
            http::parse_request(input, MAX_HEADERS, MAX_HEADER_BYTES, "10.0.0.1", &mut out);
        let h = match parsed {
            Ok(Some(h)) => h,
            Ok(None) => return "incomplete",
            Err(e) => return e.reason(),
        };
        assert!(h.head_len <= input.len() && h.head_len <= MAX_HEADER_BYTES);
        assert!(h.target.end <= h.head_len);
        assert!(h.host.clone().is_none_or(|r| r.end <= h.head_len));
        let head = &input[..h.head_len];
        assert!(
            !(has_header(head, "content-length") && has_header(head, "transfer-encoding")),
            "accepted CL together with TE"
        );
        if h.minor_version == 0 {
            assert!(
                !has_header(head, "transfer-encoding"),
                "accepted TE on HTTP/1.0"
            );
            assert!(!h.expect_continue);
        }
        // What goes upstream.
        assert_strict_crlf(&out);
        let framing_headers = [
            has_header(&out, "content-length"),
            has_header(&out, "transfer-encoding"),
        ];
        match h.framing {
            BodyFraming::Length(n) => {
                assert_eq!(framing_headers, [true, false]);
                assert!(n > 0);
            }
            BodyFraming::Chunked => assert_eq!(framing_headers, [false, true]),
            BodyFraming::None => assert_eq!(framing_headers, [false, false]),
            BodyFraming::Close => panic!("a request never runs until close"),
        }
        // Parsed again (as the back-end will), the rewritten head frames the body alike.
        // An HTTP/1.0 request without Host gets one from the data path (the back-end's
        // address) before the empty line, as here.
        if h.host.is_none() {
            let end = out.len() - 2;
            out.splice(end..end, b"Host: 10.0.0.2:80\r\n".iter().copied());
        }
        let mut again = Vec::new();
        let h2 = http::parse_request(&out, MAX_HEADERS + 4, 1 << 20, "10.0.0.1", &mut again)
            .expect("rewritten head parses")
            .expect("rewritten head is complete");
        assert_eq!(h2.head_len, out.len());
        assert_eq!(h2.framing, h.framing);
        match h.framing {
            BodyFraming::Length(_) => "accepted, length",
            BodyFraming::Chunked => "accepted, chunked",
            _ => "accepted, no body",
        }
    });
}

/// What the reference decoder makes of a whole buffer.
#[derive(Debug, PartialEq, Eq)]
enum Ref {
    Complete(usize, Vec<u8>),
    Invalid,
    Incomplete,
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

fn is_vchar_or_ws(c: u8) -> bool {
    c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80
}

/// RFC 9112 §7.1.1: `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`,
/// written as a plain recursive-descent over a complete line (independent of the
/// proxy's byte-at-a-time state machine).
fn valid_extensions(mut s: &[u8]) -> bool {
    fn bws(s: &mut &[u8]) {
        while let [b' ' | b'\t', rest @ ..] = s {
            *s = rest;
        }
    }
    fn token(s: &mut &[u8]) -> bool {
        let n = s.iter().take_while(|&&c| is_tchar(c)).count();
        *s = &s[n..];
        n > 0
    }
    fn quoted(s: &mut &[u8]) -> bool {
        let [b'"', rest @ ..] = s else { return false };
        let mut i = 0;
        while i < rest.len() {
            match rest[i] {
                b'"' => {
                    *s = &rest[i + 1..];
                    return true;
                }
                b'\\' if i + 1 < rest.len() && is_vchar_or_ws(rest[i + 1]) => i += 2,
                c if is_vchar_or_ws(c) && c != b'\\' => i += 1,
                _ => return false,
            }
        }
        false
    }
    while !s.is_empty() {
        bws(&mut s);
        let [b';', rest @ ..] = s else { return false };
        s = rest;
        bws(&mut s);
        if !token(&mut s) {
            return false;
        }
        let save = s;
        bws(&mut s);
        if let [b'=', rest @ ..] = s {
            s = rest;
            bws(&mut s);
            if !(token(&mut s) || quoted(&mut s)) {
                return false;
            }
        } else {
            s = save;
        }
    }
    true
}

fn valid_field_line(line: &[u8]) -> bool {
    let name = line.iter().take_while(|&&c| is_tchar(c)).count();
    name > 0 && line.get(name) == Some(&b':') && line[name + 1..].iter().all(|&c| is_vchar_or_ws(c))
}

/// A whole-buffer chunked decoder, line by line, with the proxy's documented bounds.
fn reference(b: &[u8]) -> Ref {
    let line_at = |pos: usize| -> Option<usize> {
        b[pos..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|i| pos + i)
    };
    let bare = |line: &[u8]| line.iter().any(|&c| c == b'\r' || c == b'\n');
    let mut pos = 0;
    let mut payload = Vec::new();
    let mut ext_bytes = 0usize;
    loop {
        let Some(eol) = line_at(pos) else {
            return Ref::Incomplete;
        };
        let line = &b[pos..eol];
        if bare(line) {
            return Ref::Invalid;
        }
        let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
        if digits == 0 || digits > usize::from(CHUNK_SIZE_DIGITS_MAX) {
            return Ref::Invalid;
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap(), 16).unwrap();
        let ext = &line[digits..];
        if !ext.is_empty() {
            ext_bytes += ext.len() + 1;
            if ext_bytes as u64 > CHUNK_EXT_BYTES_MAX || !valid_extensions(ext) {
                return Ref::Invalid;
            }
        }
        pos = eol + 2;
        if size == 0 {
            let mut trailer_bytes = 0usize;
            loop {
                let Some(eol) = line_at(pos) else {
                    return Ref::Incomplete;
                };
                let line = &b[pos..eol];
                if line.is_empty() {
                    return if trailer_bytes as u64 + 1 > TRAILER_BYTES_MAX {
                        Ref::Invalid
                    } else {
                        Ref::Complete(eol + 2, payload)
                    };
                }
                trailer_bytes += line.len() + 2;
                if bare(line) || !valid_field_line(line) || trailer_bytes as u64 > TRAILER_BYTES_MAX
                {
                    return Ref::Invalid;
                }
                pos = eol + 2;
            }
        }
        let size = size as usize;
        if b.len() < pos.saturating_add(size).saturating_add(2) {
            return Ref::Incomplete;
        }
        payload.extend_from_slice(&b[pos..pos + size]);
        if &b[pos + size..pos + size + 2] != b"\r\n" {
            return Ref::Invalid;
        }
        pos += size + 2;
    }
}

/// The scanner's answer for `input` fed in the given pieces: end offset and payload.
fn scan_split(input: &[u8], cuts: &[usize]) -> Result<Option<(usize, Vec<u8>)>, ChunkError> {
    let mut c = Chunked::new();
    let mut payload = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        if cut < at {
            continue;
        }
        if let Some(n) = c.feed(&input[at..cut], &mut |d| payload.extend_from_slice(d))? {
            return Ok(Some((at + n, payload)));
        }
        at = cut;
    }
    Ok(None)
}

fn encode(payload: &[u8], sizes: &mut impl FnMut() -> usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let n = sizes().clamp(1, rest.len());
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[test]
fn fuzz_chunked_decoder() {
    fuzz("chunked decoder", CHUNK_CORPUS, |rng, input| {
        let whole = scan_split(input, &[]);
        // Never beyond the input.
        if let Ok(Some((end, payload))) = &whole {
            assert!(*end <= input.len() && payload.len() <= *end);
        }
        // The same however the bytes arrive.
        let mut cuts: Vec<usize> = (0..rng.below(5))
            .map(|_| rng.below(input.len() + 1))
            .collect();
        cuts.sort_unstable();
        assert_eq!(scan_split(input, &cuts), whole, "split at {cuts:?}");
        // Agrees with the reference on where the body ends and what it carries.
        let r = reference(input);
        match (&whole, &r) {
            (Ok(Some((e, p))), Ref::Complete(re, rp)) => assert_eq!((e, p), (re, rp)),
            (_, Ref::Complete(..)) | (Ok(Some(_)), _) => {
                panic!("scanner {whole:?} but reference {r:?}")
            }
            (Ok(None), Ref::Invalid) => panic!("scanner waits for more, reference rejects"),
            // The scanner rejects a line as soon as it goes wrong or past a bound, before
            // its CRLF; the reference only judges complete lines.
            (Err(_), Ref::Invalid | Ref::Incomplete) | (Ok(None), Ref::Incomplete) => {}
        }
        // Decode, re-encode in other chunk sizes, decode again: the same payload.
        if let Ok(Some((_, payload))) = whole {
            let mut sizes = || 1 + rng.below(300);
            let again = encode(&payload, &mut sizes);
            let (end, p2) = scan_split(&again, &[]).unwrap().unwrap();
            assert_eq!(end, again.len());
            assert!(p2 == payload);
            return "complete";
        }
        match r {
            Ref::Invalid => "invalid",
            _ if whole.is_err() => "refused before line end",
            _ => "incomplete",
        }
    });
}

const STREAM_CORPUS: &[&[u8]] = &[
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\nT: 1\r\n\r\nPUT /c HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok",
    b"GET / HTTP/1.0\r\n\r\nPOST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 30\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
];

/// One request as relayed: its head and its payload.
type Exchange = (Vec<u8>, Vec<u8>);

/// What a back-end makes of the bytes the proxy sends it: heads split at the empty line,
/// framed by their one Content-Length or `Transfer-Encoding: chunked` (decoded by the
/// reference decoder). `None` if it cannot make sense of them.
fn backend_reads(mut wire: &[u8]) -> Option<Vec<Exchange>> {
    let mut requests = Vec::new();
    while !wire.is_empty() {
        let head_len = wire.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = &wire[..head_len];
        let field = |name: &str| {
            head.split(|&c| c == b'\n').skip(1).find_map(|line| {
                let colon = line.iter().position(|&c| c == b':')?;
                line[..colon]
                    .eq_ignore_ascii_case(name.as_bytes())
                    .then(|| {
                        String::from_utf8_lossy(&line[colon + 1..])
                            .trim()
                            .to_string()
                    })
            })
        };
        let (body_len, payload) = match (field("content-length"), field("transfer-encoding")) {
            (Some(_), Some(_)) => return None,
            (Some(n), None) => {
                let n: usize = n.parse().ok()?;
                let body = wire.get(head_len..head_len + n)?;
                (n, body.to_vec())
            }
            (None, Some(te)) if te == "chunked" => match reference(&wire[head_len..]) {
                Ref::Complete(e, p) => (e, p),
                _ => return None,
            },
            (None, Some(_)) => return None,
            (None, None) => (0, Vec::new()),
        };
        requests.push((head.to_vec(), payload));
        wire = &wire[head_len + body_len..];
    }
    Some(requests)
}

/// The proxy's split of a pipelined request stream, as the data path does it: each
/// request's rewritten head (with Host added when missing) and its body, relayed as is.
/// Stops at the first request that is refused or incomplete.
fn proxy_splits(input: &[u8]) -> (Vec<u8>, Vec<Exchange>) {
    let mut pos = 0;
    let mut wire = Vec::new();
    let mut requests = Vec::new();
    let mut out = Vec::new();
    loop {
        let rest = &input[pos..];
        let Ok(Some(h)) =
            http::parse_request(rest, MAX_HEADERS, MAX_HEADER_BYTES, "10.0.0.1", &mut out)
        else {
            break;
        };
        if h.host.is_none() {
            let end = out.len() - 2;
            out.splice(end..end, b"Host: 10.0.0.2:80\r\n".iter().copied());
        }
        let body = &rest[h.head_len..];
        let (body_len, payload) = match h.framing {
            BodyFraming::None => (0, Vec::new()),
            BodyFraming::Length(n) => match usize::try_from(n).ok().filter(|&n| n <= body.len()) {
                Some(n) => (n, body[..n].to_vec()),
                None => break,
            },
            BodyFraming::Chunked => match scan_split(body, &[]) {
                Ok(Some((e, p))) => (e, p),
                _ => break,
            },
            BodyFraming::Close => panic!("a request never runs until close"),
        };
        wire.extend_from_slice(&out);
        wire.extend_from_slice(&body[..body_len]);
        requests.push((out.clone(), payload));
        pos += h.head_len + body_len;
        assert!(pos <= input.len(), "accepted more than the input");
    }
    (wire, requests)
}

/// No desynchronisation: a back-end reading exactly the bytes the proxy relays sees the
/// same requests, with the same payloads, and nothing more.
#[test]
fn fuzz_pipelined_stream_reaches_backend_as_the_proxy_split_it() {
    fuzz("request stream", STREAM_CORPUS, |_rng, input| {
        let (wire, requests) = proxy_splits(input);
        let seen = backend_reads(&wire).expect("back-end cannot parse what the proxy sent");
        assert_eq!(seen, requests);
        match requests.len() {
            0 => "no request",
            1 => "1 request",
            _ => "2+ requests",
        }
    });
}
