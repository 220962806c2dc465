//! The one Prometheus encoder of farside, and the small admin HTTP server that serves it.
//!
//! [`Encoder`] writes the text exposition format (version 0.0.4) so that it is always
//! conformant, whatever order its callers report samples in: every family gets one
//! `# HELP` and one `# TYPE` line, its samples stay together (a caller that loops over
//! back-ends and reports several families per back-end does not interleave them), label
//! values and help text are escaped, and non-finite values are spelled as Prometheus
//! reads them. Families come out in the order they were first reported.
//!
//! [`AdminServer`] answers `GET /metrics` on its own blocking thread, one short request
//! per connection, with bounded request size and time; it never touches the data path.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// Collects the samples of one scrape, grouped by family; [`Encoder::finish`] gives the
/// text. One encoder per scrape: every part of the program reports into the same one.
#[derive(Default)]
pub struct Encoder {
    order: Vec<String>,
    families: HashMap<String, Family>,
}

impl Encoder {
    /// An empty scrape.
    pub fn new() -> Self {
        Self::default()
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
        let f = self.family(name, Kind::Counter, help);
        sample(&mut f.samples, name, "", labels, None, v.into());
    }

    /// One gauge sample.
    pub fn gauge(&mut self, name: &str, help: &str, labels: Labels<'_>, v: impl Into<Value>) {
        let f = self.family(name, Kind::Gauge, help);
        sample(&mut f.samples, name, "", labels, None, v.into());
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
/// Time an admin client has to send its request, and to take the answer: a stalled
/// scraper holds the one admin thread at most this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin server calls per scrape: fills a fresh encoder.
pub type Render = Arc<dyn Fn(&mut Encoder) + Send + Sync>;

/// The admin HTTP server: `GET /metrics` (and `HEAD`) on its own thread; 404 elsewhere,
/// 405 for other methods. One request per connection (`Connection: close`).
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
        let local_addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let tag = name.to_string();
        std::thread::Builder::new()
            .name(format!("{name}-admin"))
            .spawn(move || {
                for conn in l.incoming() {
                    if st.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Ok(c) = conn {
                        if let Err(e) = answer(c, &render) {
                            log::debug!("{tag} admin: {e}");
                        }
                    }
                }
            })?;
        Ok(AdminServer { local_addr, stop })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
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

fn answer(mut c: TcpStream, render: &Render) -> io::Result<()> {
    c.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    c.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut buf = [0u8; REQUEST_BYTES_MAX];
    let mut n = 0;
    while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
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
    let head = method == b"HEAD";
    if target != b"/metrics" {
        write_reply(
            &mut c,
            "404 Not Found",
            "text/plain",
            b"try GET /metrics\n",
            head,
        )
    } else if method != b"GET" && !head {
        write_reply(
            &mut c,
            "405 Method Not Allowed",
            "text/plain",
            b"GET /metrics\n",
            false,
        )
    } else {
        let body = scrape_text(&**render);
        write_reply(&mut c, "200 OK", CONTENT_TYPE, body.as_bytes(), head)
    }
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
}
