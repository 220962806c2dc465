//! The one Prometheus encoder of farside, and the small admin HTTP server that serves it.
//!
//! [`Encoder`] writes the text exposition format (version 0.0.4) so that it is always
//! conformant, whatever order its callers report samples in: every family gets one
//! `# HELP` and one `# TYPE` line, its samples stay together (a caller that loops over
//! back-ends and reports several families per back-end does not interleave them), label
//! values and help text are escaped, and non-finite values are spelled as Prometheus
//! reads them. Families come out in the order they were first reported.
//!
//! [`AdminServer`] answers `GET /metrics` off the data path, one short request per
//! connection, each connection on its own thread (at most `CONNS_MAX` at once) with a
//! bounded request size and a deadline for the request, so one slow client does not
//! hold up scrapes.
//! Given a [`Dashboard`], it also serves a live page and its server-sent-events stream
//! (bounded streams, each on its own thread, one snapshot per tick shared by all).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a family measures, as its `# TYPE` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (reset at restart); names end in `_total` by convention.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets (`_bucket{le=…}`), `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample value: integers print exactly (a u64 counter past 2^53 keeps every digit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// An unsigned count.
    U(u64),
    /// A signed reading (e.g. -1 for "unknown").
    I(i64),
    /// A real number; NaN and infinities print as `NaN`, `+Inf`, `-Inf`.
    F(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::U(v.into())
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::U(v as u64)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::U(u64::from(v))
    }
}

fn write_value(out: &mut String, v: Value) {
    let _ = match v {
        Value::U(v) => write!(out, "{v}"),
        Value::I(v) => write!(out, "{v}"),
        Value::F(v) if v.is_nan() => write!(out, "NaN"),
        Value::F(v) if v == f64::INFINITY => write!(out, "+Inf"),
        Value::F(v) if v == f64::NEG_INFINITY => write!(out, "-Inf"),
        Value::F(v) => write!(out, "{v}"),
    };
}

/// Label pairs of one sample, `(name, value)`; values are escaped by the encoder.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

struct Family {
    help: String,
    kind: Kind,
    samples: String,
}

/// One sample as reported, kept by a [`Encoder::capturing`] encoder (the live dashboard
/// reads the very values `/metrics` prints, without parsing text).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Family name plus suffix (`_sum`, `_count` for histograms; buckets are not kept).
    pub name: String,
    /// Label pairs in reported order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: Value,
}

/// Collects the samples of one scrape, grouped by family; [`Encoder::finish`] gives the
/// text. One encoder per scrape: every part of the program reports into the same one.
#[derive(Default)]
pub struct Encoder {
    order: Vec<String>,
    families: HashMap<String, Family>,
    /// `Some` for a capturing encoder: samples are kept here instead of as text.
    captured: Option<Vec<Sample>>,
}

impl Encoder {
    /// An empty scrape.
    pub fn new() -> Self {
        Self::default()
    }

    /// An encoder that keeps each counter, gauge and histogram `_sum`/`_count` sample as
    /// a [`Sample`] (no text; histogram buckets are dropped); see [`Encoder::into_samples`].
    pub fn capturing() -> Self {
        Encoder {
            captured: Some(Vec::new()),
            ..Self::default()
        }
    }

    /// The samples a [`Encoder::capturing`] encoder kept, in report order (empty for a
    /// text encoder).
    pub fn into_samples(self) -> Vec<Sample> {
        self.captured.unwrap_or_default()
    }

    fn capture(&mut self, name: &str, suffix: &str, labels: Labels<'_>, v: Value) -> bool {
        let Some(c) = self.captured.as_mut() else {
            return false;
        };
        if suffix != "_bucket" {
            c.push(Sample {
                name: format!("{name}{suffix}"),
                labels: labels
                    .iter()
                    .map(|&(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                value: v,
            });
        }
        true
    }

    /// The family `name`, declared on first use with `kind` and `help`. Reporting the same
    /// name with another kind is a programming error (debug builds panic; release builds
    /// keep the first kind).
    fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Family {
        debug_assert!(valid_name(name), "bad metric name {name:?}");
        if !self.families.contains_key(name) {
            self.order.push(name.to_string());
            self.families.insert(
                name.to_string(),
                Family {
                    help: help.to_string(),
                    kind,
                    samples: String::new(),
                },
            );
        }
        let f = self.families.get_mut(name).expect("inserted above");
        debug_assert_eq!(f.kind, kind, "metric {name} reported with two types");
        f
    }

    /// Declare family `name` without samples yet (it is listed even if none follow).
    pub fn declare(&mut self, name: &str, kind: Kind, help: &str) {
        self.family(name, kind, help);
    }

    /// One counter sample.
    pub fn counter(&mut self, name: &str, help: &str, labels: Labels<'_>, v: impl Into<Value>) {
        let v = v.into();
        if self.capture(name, "", labels, v) {
            return;
        }
        let f = self.family(name, Kind::Counter, help);
        sample(&mut f.samples, name, "", labels, None, v);
    }

    /// One gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: Labels<'_>, v: impl Into<Value>) {
        let v = v.into();
        if self.capture(name, "", labels, v) {
            return;
        }
        let f = self.family(name, Kind::Gauge, help);
        sample(&mut f.samples, name, "", labels, None, v);
    }

    /// One histogram (one label set): `buckets` are `(upper bound, count in that bucket)`
    /// — *not* cumulative — in rising order, without `+Inf`; `overflow` counts what lies
    /// above the last bound. Writes the cumulative `_bucket` lines, `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: Labels<'_>,
        buckets: impl IntoIterator<Item = (f64, u64)>,
        overflow: u64,
        sum: f64,
    ) {
        if self.captured.is_some() {
            let count = buckets.into_iter().map(|(_, n)| n).sum::<u64>() + overflow;
            self.capture(name, "_sum", labels, sum.into());
            self.capture(name, "_count", labels, count.into());
            return;
        }
        let f = self.family(name, Kind::Histogram, help);
        let mut cumulative = 0u64;
        let mut le = String::new();
        for (bound, n) in buckets {
            cumulative += n;
            le.clear();
            write_value(&mut le, Value::F(bound));
            sample(
                &mut f.samples,
                name,
                "_bucket",
                labels,
                Some(&le),
                cumulative.into(),
            );
        }
        cumulative += overflow;
        sample(
            &mut f.samples,
            name,
            "_bucket",
            labels,
            Some("+Inf"),
            cumulative.into(),
        );
        sample(&mut f.samples, name, "_sum", labels, None, sum.into());
        sample(
            &mut f.samples,
            name,
            "_count",
            labels,
            None,
            cumulative.into(),
        );
    }

    /// The text exposition of everything reported, families in first-report order.
    pub fn finish(self) -> String {
        let mut out = String::with_capacity(
            self.families
                .values()
                .map(|f| f.samples.len() + f.help.len() + 64)
                .sum(),
        );
        for name in &self.order {
            let f = &self.families[name];
            let _ = write!(out, "# HELP {name} ");
            escape(&mut out, &f.help, false);
            let _ = writeln!(out, "\n# TYPE {name} {}", f.kind.name());
            out.push_str(&f.samples);
        }
        out
    }
}

fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: Labels<'_>,
    le: Option<&str>,
    v: Value,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            debug_assert!(valid_label(k), "bad label name {k:?}");
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v, true);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    write_value(out, v);
    out.push('\n');
}

/// Escape as the text format wants: `\` and newline always, `"` in label values.
fn escape(out: &mut String, s: &str, quote: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn valid_name(n: &str) -> bool {
    let mut cs = n.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label(n: &str) -> bool {
    let mut cs = n.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Most bytes of an admin request read before answering (a scrape's head is ~100 bytes).
const REQUEST_BYTES_MAX: usize = 4096;
/// Time an admin client has to send its whole request head (a deadline, not a
/// per-read timeout: a client trickling a byte at a time is cut too), and each write
/// of the answer: a stalled client holds its connection's thread about this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Admin connections answered at once, each on its own thread: a few stalled or slow
/// clients hold a few of them (each at most about [`REQUEST_TIMEOUT`]), not the
/// server, so scrapes are answered beside them; a scrape takes milliseconds, so 16
/// covers several scrapers and operators at once. Over the bound a connection is
/// closed unanswered (the client retries at its next scrape).
const CONNS_MAX: usize = 16;

/// Most dashboard event streams open at once: each holds one thread and one connection,
/// and an open page is one stream, so this covers a few operators' tabs; the next one
/// is answered 503 until a stream ends.
pub const STREAMS_MAX: usize = 8;
/// Snapshots per second an event stream gets unless it asks `?hz=N`.
pub const HZ_DEFAULT: u32 = 10;
/// Most snapshots per second a stream gets (`?hz=` above is capped to it): faster than
/// anyone reads a table, and it bounds the snapshot work of the admin threads.
pub const HZ_MAX: u32 = 20;
/// Time one event may take to be written to a stream's client: a stalled browser (its
/// socket buffer full) is dropped after this, and its slot freed.
pub const STREAM_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin server calls per scrape: fills a fresh encoder.
pub type Render = Arc<dyn Fn(&mut Encoder) + Send + Sync>;

/// Builds one dashboard snapshot (JSON text).
pub type Snapshot = Arc<dyn Fn() -> String + Send + Sync>;

/// A live page served by the admin server next to `/metrics`: static files (the page and
/// its assets, embedded in the binary) and `GET /events[?hz=N]`, a server-sent-events
/// stream of snapshots (`data: JSON`), [`HZ_DEFAULT`] a second (at most [`HZ_MAX`]),
/// at most [`STREAMS_MAX`] streams at once.
pub struct Dashboard {
    /// `(path, content type, body)`: `GET path` answers `body`; `/` is the page.
    pub files: Vec<(&'static str, &'static str, &'static [u8])>,
    /// Builds one snapshot. Called at most once per tick of the fastest open stream and
    /// shared by all streams, never per stream; never called with no stream open.
    pub snapshot: Snapshot,
}

/// The dashboard as served: open streams and the last snapshot.
struct Live {
    dash: Dashboard,
    streams: AtomicUsize,
    last: Mutex<Option<(Instant, Arc<str>)>>,
}

impl Live {
    /// The shared snapshot if it is younger than most of `period` (so streams at the same
    /// rate share one), else a new one.
    fn snapshot(&self, period: Duration) -> Arc<str> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, s)) = last.as_ref() {
            if at.elapsed() < period * 9 / 10 {
                return s.clone();
            }
        }
        let s: Arc<str> = (self.dash.snapshot)().into();
        *last = Some((Instant::now(), s.clone()));
        s
    }

    fn take_slot(self: &Arc<Self>) -> Option<Slot> {
        self.streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < STREAMS_MAX).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }
}

/// One of the [`STREAMS_MAX`] stream slots, given back when dropped.
struct Slot(Arc<Live>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The admin HTTP server: `GET /metrics` (and `HEAD`), a thread per connection; with a
/// [`Dashboard`], also its files and event streams (each stream on its own thread).
/// 404 elsewhere, 405 for other methods. One request per connection (`Connection:
/// close`).
pub struct AdminServer {
    /// Where it listens (the port is resolved if 0 was asked).
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl AdminServer {
    /// Bind `addr` and serve `render`'s output until dropped.
    pub fn spawn(addr: SocketAddr, name: &str, render: Render) -> io::Result<AdminServer> {
        Self::serve(TcpListener::bind(addr)?, name, render)
    }

    /// Serve on an already bound listener (e.g. one bound before privileges drop).
    pub fn serve(l: TcpListener, name: &str, render: Render) -> io::Result<AdminServer> {
        Self::serve_with(l, name, render, None)
    }

    /// As [`AdminServer::serve`], and serve `dashboard` too if given.
    pub fn serve_with(
        l: TcpListener,
        name: &str,
        render: Render,
        dashboard: Option<Dashboard>,
    ) -> io::Result<AdminServer> {
        let local_addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Ctx {
            render,
            live: dashboard.map(|dash| {
                Arc::new(Live {
                    dash,
                    streams: AtomicUsize::new(0),
                    last: Mutex::new(None),
                })
            }),
            stop: stop.clone(),
            tag: name.to_string(),
        };
        let ctx = Arc::new(ctx);
        let active = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name(format!("{name}-admin"))
            .spawn(move || {
                for conn in l.incoming() {
                    if ctx.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(c) = conn else { continue };
                    let taken = active.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < CONNS_MAX).then_some(n + 1)
                    });
                    if taken.is_err() {
                        log::debug!(
                            "{} admin: {CONNS_MAX} connections open, one closed",
                            ctx.tag
                        );
                        continue;
                    }
                    let (ctx2, active2) = (ctx.clone(), active.clone());
                    let spawned = std::thread::Builder::new()
                        .name(format!("{}-admin-c", ctx.tag))
                        .spawn(move || {
                            if let Err(e) = answer(c, &ctx2) {
                                log::debug!("{} admin: {e}", ctx2.tag);
                            }
                            active2.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        active.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            })?;
        Ok(AdminServer { local_addr, stop })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        // Streams see `stop` at their next tick.
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_millis(100));
    }
}

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Render one scrape to text.
pub fn scrape_text(render: &(dyn Fn(&mut Encoder) + Send + Sync)) -> String {
    let mut e = Encoder::new();
    render(&mut e);
    e.finish()
}

/// What the accept loop answers with.
struct Ctx {
    render: Render,
    live: Option<Arc<Live>>,
    stop: Arc<AtomicBool>,
    tag: String,
}

/// `?hz=N` of an events request: [`HZ_DEFAULT`] if absent, capped at [`HZ_MAX`].
fn parse_hz(query: &[u8]) -> Result<u32, &'static str> {
    let mut hz = HZ_DEFAULT;
    for pair in query.split(|&b| b == b'&') {
        if let Some(v) = pair.strip_prefix(b"hz=") {
            hz = std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .filter(|&n| n >= 1)
                .ok_or("hz must be a whole number of updates per second, at least 1\n")?
                .min(HZ_MAX);
        }
    }
    Ok(hz)
}

fn answer(mut c: TcpStream, ctx: &Ctx) -> io::Result<()> {
    c.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut buf = [0u8; REQUEST_BYTES_MAX];
    let mut n = 0;
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not complete within its deadline",
            ));
        }
        c.set_read_timeout(Some(left))?;
        if n == buf.len() {
            return write_reply(
                &mut c,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request head too large\n",
                false,
            );
        }
        let r = c.read(&mut buf[n..])?;
        if r == 0 {
            return Ok(());
        }
        n += r;
    }
    let line = buf[..n].split(|&b| b == b'\r').next().unwrap_or(&[]);
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or(&[]), parts.next().unwrap_or(&[]));
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(q) => (&target[..q], &target[q + 1..]),
        None => (target, &[][..]),
    };
    let head = method == b"HEAD";
    let get = method == b"GET" || head;
    let file = ctx.live.as_ref().and_then(|l| {
        l.dash
            .files
            .iter()
            .find(|f| f.0.as_bytes() == path)
            .copied()
    });
    let events = ctx.live.as_ref().filter(|_| path == b"/events");
    if path == b"/metrics" {
        if !get {
            return write_reply(
                &mut c,
                "405 Method Not Allowed",
                "text/plain",
                b"GET /metrics\n",
                false,
            );
        }
        let body = scrape_text(&*ctx.render);
        write_reply(&mut c, "200 OK", CONTENT_TYPE, body.as_bytes(), head)
    } else if let Some((_, ctype, body)) = file {
        if !get {
            return write_reply(
                &mut c,
                "405 Method Not Allowed",
                "text/plain",
                b"GET\n",
                false,
            );
        }
        write_reply(&mut c, "200 OK", ctype, body, head)
    } else if let Some(live) = events {
        if method != b"GET" {
            return write_reply(
                &mut c,
                "405 Method Not Allowed",
                "text/plain",
                b"GET /events\n",
                false,
            );
        }
        let hz = match parse_hz(query) {
            Ok(hz) => hz,
            Err(e) => {
                return write_reply(&mut c, "400 Bad Request", "text/plain", e.as_bytes(), false)
            }
        };
        let Some(slot) = live.take_slot() else {
            return write_reply(
                &mut c,
                "503 Service Unavailable",
                "text/plain",
                b"too many dashboard streams open\n",
                false,
            );
        };
        let (stop, tag) = (ctx.stop.clone(), ctx.tag.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-sse", ctx.tag))
            .spawn({
                let c = c.try_clone()?;
                move || {
                    if let Err(e) = stream(c, &slot.0, hz, &stop) {
                        log::debug!("{tag} admin stream ended: {e}");
                    }
                }
            });
        if spawned.is_err() {
            return write_reply(
                &mut c,
                "503 Service Unavailable",
                "text/plain",
                b"cannot start a stream thread\n",
                false,
            );
        }
        Ok(())
    } else {
        let hint: &[u8] = if ctx.live.is_some() {
            b"try GET / (dashboard) or GET /metrics\n"
        } else {
            b"try GET /metrics\n"
        };
        write_reply(&mut c, "404 Not Found", "text/plain", hint, head)
    }
}

/// Serve one event stream: `hz` snapshots a second until the server stops or the client
/// goes (a write fails, or takes longer than [`STREAM_WRITE_TIMEOUT`]).
fn stream(mut c: TcpStream, live: &Live, hz: u32, stop: &AtomicBool) -> io::Result<()> {
    c.set_write_timeout(Some(STREAM_WRITE_TIMEOUT))?;
    c.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
          Connection: close\r\n\r\nretry: 1000\n\n",
    )?;
    let period = Duration::from_secs(1) / hz;
    let mut next = Instant::now();
    let mut event = String::new();
    while !stop.load(Ordering::Relaxed) {
        let snap = live.snapshot(period);
        event.clear();
        for line in snap.split('\n') {
            event.push_str("data: ");
            event.push_str(line);
            event.push('\n');
        }
        event.push('\n');
        c.write_all(event.as_bytes())?;
        next += period;
        let now = Instant::now();
        match next.checked_duration_since(now) {
            Some(d) => std::thread::sleep(d),
            None => next = now,
        }
    }
    Ok(())
}

fn write_reply(
    c: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &[u8],
    head_only: bool,
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    c.write_all(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_stay_together_and_values_are_escaped() {
        let mut e = Encoder::new();
        for b in ["a", "b\"\\\nc"] {
            e.gauge("x_load", "Load.", &[("backend", b)], 1u64);
            e.counter("x_errs_total", "Errors\\ of\nx.", &[("backend", b)], 2u64);
        }
        e.gauge("x_nan", "n", &[], f64::NAN);
        let t = e.finish();
        assert_eq!(
            t,
            "# HELP x_load Load.\n# TYPE x_load gauge\nx_load{backend=\"a\"} 1\n\
             x_load{backend=\"b\\\"\\\\\\nc\"} 1\n\
             # HELP x_errs_total Errors\\\\ of\\nx.\n# TYPE x_errs_total counter\n\
             x_errs_total{backend=\"a\"} 2\nx_errs_total{backend=\"b\\\"\\\\\\nc\"} 2\n\
             # HELP x_nan n\n# TYPE x_nan gauge\nx_nan NaN\n"
        );
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut e = Encoder::new();
        e.histogram(
            "h_seconds",
            "H.",
            &[("b", "1")],
            [(0.001, 1), (0.5, 2)],
            3,
            9.5,
        );
        let t = e.finish();
        assert!(
            t.contains("h_seconds_bucket{b=\"1\",le=\"0.001\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("h_seconds_bucket{b=\"1\",le=\"0.5\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("h_seconds_bucket{b=\"1\",le=\"+Inf\"} 6\n"),
            "{t}"
        );
        assert!(
            t.contains("h_seconds_sum{b=\"1\"} 9.5\nh_seconds_count{b=\"1\"} 6\n"),
            "{t}"
        );
    }

    #[test]
    fn server_answers_metrics_and_404() {
        let s = AdminServer::spawn(
            "127.0.0.1:0".parse().unwrap(),
            "test",
            Arc::new(|e: &mut Encoder| e.counter("t_total", "T.", &[], 7u64)),
        )
        .unwrap();
        let get = |req: &str| {
            let mut c = TcpStream::connect(s.local_addr).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        let r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.ends_with("# TYPE t_total counter\nt_total 7\n"), "{r}");
        assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    }

    /// One client trickling its request a byte at a time does not hold up scrapes,
    /// and is cut at the request deadline.
    #[test]
    fn a_trickling_client_does_not_hold_up_scrapes() {
        let s = AdminServer::spawn(
            "127.0.0.1:0".parse().unwrap(),
            "test",
            Arc::new(|e: &mut Encoder| e.counter("t_total", "T.", &[], 7u64)),
        )
        .unwrap();
        let mut slow = TcpStream::connect(s.local_addr).unwrap();
        // A byte every 200 ms (well inside any per-read timeout) for up to a minute;
        // true when the server cut it first.
        let trickler = std::thread::spawn(move || {
            let head = b"GET /metrics HTTP/1.1\r\nX: ";
            for b in head.iter().chain(std::iter::repeat(&b'x')).take(300) {
                if slow.write_all(&[*b]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            false
        });
        let mut c = TcpStream::connect(s.local_addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        assert!(r.ends_with("t_total 7\n"), "the scrape beside it: {r}");
        assert!(trickler.join().unwrap(), "the trickler was cut");
    }

    #[test]
    fn capturing_keeps_values_not_text() {
        let mut e = Encoder::capturing();
        e.gauge("x_load", "Load.", &[("backend", "a")], 3u64);
        e.histogram("h_seconds", "H.", &[], [(0.1, 2), (1.0, 1)], 1, 0.5);
        let s = e.into_samples();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["x_load", "h_seconds_sum", "h_seconds_count"]);
        assert_eq!(s[0].labels, [("backend".to_string(), "a".to_string())]);
        assert_eq!(s[0].value, Value::U(3));
        assert_eq!(s[2].value, Value::U(4));
    }

    fn dashboard_server() -> (AdminServer, Arc<AtomicUsize>) {
        let built = Arc::new(AtomicUsize::new(0));
        let b = built.clone();
        let s = AdminServer::serve_with(
            TcpListener::bind("127.0.0.1:0").unwrap(),
            "test",
            Arc::new(|e: &mut Encoder| e.counter("t_total", "T.", &[], 7u64)),
            Some(Dashboard {
                files: vec![("/", "text/html", b"<p>page</p>")],
                snapshot: Arc::new(move || {
                    let n = b.fetch_add(1, Ordering::SeqCst);
                    format!("{{\"n\":{n}}}")
                }),
            }),
        )
        .unwrap();
        (s, built)
    }

    fn request(addr: SocketAddr, req: &str) -> TcpStream {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        c
    }

    /// Read until `want` events (blank-line terminated) arrived after the head.
    fn read_events(c: &mut TcpStream, want: usize) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let t = String::from_utf8_lossy(&got).to_string();
            if let Some((_, body)) = t.split_once("\r\n\r\n") {
                if body.matches("data: ").count() >= want && body.ends_with("\n\n") {
                    return t;
                }
            }
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "stream closed early: {t}");
            got.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn events_are_framed_and_streams_bounded() {
        let (s, built) = dashboard_server();
        let get = |req: &str| {
            let mut r = String::new();
            request(s.local_addr, req).read_to_string(&mut r).unwrap();
            r
        };
        let page = get("GET / HTTP/1.1\r\n\r\n");
        assert!(page.starts_with("HTTP/1.1 200 OK\r\n"), "{page}");
        assert!(page.contains("Content-Type: text/html\r\n") && page.ends_with("<p>page</p>"));
        let m = get("GET /metrics HTTP/1.1\r\n\r\n");
        assert!(m.ends_with("# TYPE t_total counter\nt_total 7\n"), "{m}");
        assert!(get("GET /events?hz=x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(get("GET /events?hz=0 HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(get("POST /events HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(get("GET /nothing HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert_eq!(
            built.load(Ordering::SeqCst),
            0,
            "no snapshot without a stream"
        );

        // Framing: SSE head, then `data: JSON` events separated by blank lines.
        let mut first = request(s.local_addr, "GET /events?hz=1000 HTTP/1.1\r\n\r\n");
        let t = read_events(&mut first, 3);
        let (head, body) = t.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains("Content-Type: text/event-stream\r\n"),
            "{head}"
        );
        assert!(!head.contains("Content-Length"), "{head}");
        let events: Vec<&str> = body
            .split("\n\n")
            .filter(|e| e.starts_with("data: "))
            .collect();
        assert!(events.len() >= 3, "{body}");
        for e in &events {
            assert!(e.starts_with("data: {\"n\":") && e.ends_with('}'), "{e:?}");
        }

        // The bound: STREAMS_MAX streams in all; the next one gets 503.
        let mut open = vec![first];
        for _ in 1..STREAMS_MAX {
            let mut c = request(s.local_addr, "GET /events HTTP/1.1\r\n\r\n");
            read_events(&mut c, 1);
            open.push(c);
        }
        let over = get("GET /events HTTP/1.1\r\n\r\n");
        assert!(over.starts_with("HTTP/1.1 503"), "{over}");
        // Streams at one rate share snapshots: 8 streams at 10/s for ~0.5 s build about
        // 5 snapshots, not 40.
        let before = built.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        let during = built.load(Ordering::SeqCst) - before;
        assert!(
            during <= 12,
            "{during} snapshots built for 8 streams in 0.5 s"
        );
        // A stream that goes frees its slot (noticed at its next write or two).
        drop(open.pop());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Only the status line: a 200 stream never ends.
            let mut c = request(s.local_addr, "GET /events HTTP/1.1\r\n\r\n");
            let mut r = [0u8; 12];
            c.read_exact(&mut r).unwrap();
            let r = String::from_utf8_lossy(&r).to_string();
            if r == "HTTP/1.1 200" {
                break;
            }
            assert!(Instant::now() < deadline, "slot not freed: {r}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
