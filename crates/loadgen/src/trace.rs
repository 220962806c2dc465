//! Workloads: which URL a client requests next.
//!
//! Three traces, as in the paper's section IV: one 16 KiB file, a Zipf-like
//! popularity over many files (alpha 0.9), and the 1998 World Cup sample.
//!
//! URL scheme. A trace names each object twice over, chosen by `--paths`:
//! - `generated` (default): `/files/<bytes>/<name>`, which farside's test
//!   back-end answers with `<bytes>` bytes without any docroot;
//! - `docroot`: the object's natural path (`/zipf/<rank>.html`, the World Cup
//!   URL), for servers with a docroot made by [`write_docroot`].
//!
//! The single-file trace requests `--file-path` (default `/file16k`) in both
//! modes. [`write_docroot`] materialises every object of either mode, so nginx
//! or Apache can serve both.
//!
//! World Cup replay uses the whole shipped sample (`timestamp,client_id,url,
//! status,size`, see `shared/traces/README.md`) and starts at a random row
//! chosen by `--seed` ([`Trace::start_row`]), wrapping around at the end, so
//! repeated points with different seeds replay different parts of the day.
//! Rows whose log status was 304 are sent as conditional GETs
//! (`If-Modified-Since`, [`Pick::conditional`]).
//! - Closed loop: each loadgen client replays *sessions*: the requests of one
//!   trace client, in log order, on one connection; when a session ends the
//!   loadgen client takes the next trace client (a new user, a new
//!   connection). Sessions are taken in order of first appearance from the
//!   seeded start. The trace's timing is ignored (the client's think time
//!   applies).
//! - Open loop: rows are sent at their logged times divided by the time scale
//!   ([`Trace::replay_row`]); rows logged within the same second are
//!   spread evenly over it (the log has one-second resolution). A trace
//!   client's requests reuse its idle connection.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::LoadgenError;

/// File name of the World Cup sample under the project's `data/` directory.
pub const WORLDCUP_FILE: &str = "wc98-day6-sample.csv.gz";
/// Size of the single-file trace's object (the paper's 16 KB file).
pub const SINGLE_FILE_BYTES: u64 = 16 * 1024;
/// Most files a Zipf trace may have (its CDF table is 8 bytes per file).
pub const ZIPF_FILES_MAX: usize = 10_000_000;
/// Median object size of the Zipf trace, bytes.
pub const ZIPF_SIZE_MEDIAN_BYTES: f64 = 4096.0;
/// Log-normal shape of Zipf object sizes (heavy tail: mean ≈ 2× median).
pub const ZIPF_SIZE_SIGMA: f64 = 1.2;
/// Largest Zipf object, bytes.
pub const ZIPF_SIZE_MAX_BYTES: u64 = 1 << 20;
/// Most rows read from a World Cup trace file (the sample has 199,999).
pub const WORLDCUP_ROWS_MAX: usize = 50_000_000;

/// Which workload to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceKind {
    /// One file (`--file-path`), requested by every client.
    Single,
    /// `--zipf-files` files with Zipf(`--zipf-alpha`) popularity.
    Zipf,
    /// The 1998 World Cup sample: URL sequence, popularity and sizes.
    Worldcup,
}

/// How trace objects are named in requests (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathMode {
    /// `/files/<bytes>/<name>`: served by farside-backend without a docroot.
    Generated,
    /// Natural paths: needs a docroot written by `write_docroot`.
    Docroot,
}

/// SplitMix64: small, fast, good enough for workload sampling; no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Size of the Zipf object of `rank` (1-based): log-normal, median
/// [`ZIPF_SIZE_MEDIAN_BYTES`], capped at [`ZIPF_SIZE_MAX_BYTES`]. Depends on
/// the rank only (not on `--seed`), so a docroot written once fits every run.
pub fn zipf_file_bytes(rank: usize) -> u64 {
    let h1 = mix64((rank as u64).wrapping_mul(2).wrapping_add(0x5EED));
    let h2 = mix64((rank as u64).wrapping_mul(2).wrapping_add(0x5EEE));
    // Uniforms in (0, 1]: never ln(0).
    let u1 = ((h1 >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let u2 = (h2 >> 11) as f64 / (1u64 << 53) as f64;
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let bytes = (ZIPF_SIZE_MEDIAN_BYTES * (ZIPF_SIZE_SIGMA * z).exp()).round();
    (bytes as u64).clamp(1, ZIPF_SIZE_MAX_BYTES)
}

/// Zipf(alpha) sampler over ranks 1..=n by inverse CDF.
#[derive(Debug, Clone)]
pub struct ZipfSampler {
    cdf: Vec<f64>,
}

impl ZipfSampler {
    pub fn new(n: usize, alpha: f64) -> ZipfSampler {
        assert!(n >= 1, "zipf needs at least one file");
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        ZipfSampler { cdf }
    }

    /// Probability of `rank` (1-based) in theory.
    pub fn probability(&self, rank: usize) -> f64 {
        let below = if rank >= 2 { self.cdf[rank - 2] } else { 0.0 };
        self.cdf[rank - 1] - below
    }

    /// A rank in 1..=n.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.next_f64();
        self.cdf
            .partition_point(|c| *c <= u)
            .min(self.cdf.len() - 1)
            + 1
    }
}

/// The World Cup sample, loaded: distinct URLs, their sizes and the sequence.
/// The per-row vectors (`sequence`, `times_s`, `clients`, `not_modified`)
/// have one entry per valid row, in file (time) order.
#[derive(Debug, Clone)]
pub struct WorldCupTrace {
    /// Distinct URLs in order of first appearance.
    pub urls: Vec<String>,
    /// Largest size seen per URL (`-` counts as 0).
    pub sizes: Vec<u64>,
    /// The request sequence, as indexes into `urls`.
    pub sequence: Vec<u32>,
    /// Log timestamp of each row, Unix seconds.
    pub times_s: Vec<u64>,
    /// Client of each row, as a dense index in order of first appearance.
    pub clients: Vec<u32>,
    /// Whether the log answered the row 304 Not Modified.
    pub not_modified: Vec<bool>,
    /// Data rows skipped for a bad field.
    pub rows_skipped: u64,
}

impl WorldCupTrace {
    /// Loads a `timestamp,client_id,url,status,size` file, gzip'd if its
    /// name ends in `.gz`. Rows with bad fields are skipped and counted.
    pub fn load(path: &Path) -> Result<WorldCupTrace, LoadgenError> {
        let file = std::fs::File::open(path)
            .map_err(|e| LoadgenError::Trace(format!("{}: {e}", path.display())))?;
        let reader: Box<dyn BufRead> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(BufReader::new(flate2::read::GzDecoder::new(file)))
        } else {
            Box::new(BufReader::new(file))
        };
        let mut index: HashMap<String, u32> = HashMap::new();
        let mut client_index: HashMap<u64, u32> = HashMap::new();
        let mut trace = WorldCupTrace {
            urls: Vec::new(),
            sizes: Vec::new(),
            sequence: Vec::new(),
            times_s: Vec::new(),
            clients: Vec::new(),
            not_modified: Vec::new(),
            rows_skipped: 0,
        };
        for (n, line) in reader.split(b'\n').enumerate() {
            let line = line.map_err(|e| LoadgenError::Trace(format!("{}: {e}", path.display())))?;
            if n == 0 && line.starts_with(b"timestamp,") {
                continue;
            }
            if trace.sequence.len() >= WORLDCUP_ROWS_MAX {
                break;
            }
            let Some(row) = parse_row(&line) else {
                trace.rows_skipped += 1;
                continue;
            };
            // The log is sorted by time; a row going back in time would
            // break the replay's schedule.
            if trace.times_s.last().is_some_and(|t| row.time_s < *t) {
                trace.rows_skipped += 1;
                continue;
            }
            let (url, size) = (row.url, row.size);
            let next_client = client_index.len() as u32;
            let client = *client_index.entry(row.client).or_insert(next_client);
            trace.times_s.push(row.time_s);
            trace.clients.push(client);
            trace.not_modified.push(row.status == 304);
            let id = *index.entry(url.to_string()).or_insert_with(|| {
                trace.urls.push(url.to_string());
                trace.sizes.push(0);
                (trace.urls.len() - 1) as u32
            });
            let slot = &mut trace.sizes[id as usize];
            *slot = (*slot).max(size);
            trace.sequence.push(id);
        }
        if trace.sequence.is_empty() {
            return Err(LoadgenError::Trace(format!(
                "{}: no valid rows ({} skipped)",
                path.display(),
                trace.rows_skipped
            )));
        }
        Ok(trace)
    }
}

struct Row<'a> {
    time_s: u64,
    client: u64,
    url: &'a str,
    status: u16,
    size: u64,
}

fn parse_row(line: &[u8]) -> Option<Row<'_>> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut fields = line.split(',');
    let (ts, client, url, status, size) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if fields.next().is_some() {
        return None;
    }
    let time_s = ts.parse::<u64>().ok()?;
    let client = client.parse::<u64>().ok()?;
    let status = status.parse::<u16>().ok()?;
    let valid_url = url.starts_with('/') && url.bytes().all(|b| b.is_ascii_graphic());
    if !valid_url {
        return None;
    }
    let size = if size == "-" { 0 } else { size.parse().ok()? };
    Some(Row {
        time_s,
        client,
        url,
        status,
        size,
    })
}

/// Finds a file of the project's `data/` directory: `$FARSIDE_DATA/<name>`,
/// then `data/<name>` in the current directory and its ancestors, then in
/// the executable's ancestors.
pub fn find_data_file(name: &str) -> Result<PathBuf, LoadgenError> {
    let mut tried = Vec::new();
    if let Some(dir) = std::env::var_os("FARSIDE_DATA") {
        let p = PathBuf::from(dir).join(name);
        if p.is_file() {
            return Ok(p);
        }
        tried.push(p);
    }
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    for start in starts {
        for dir in start.ancestors() {
            let p = dir.join("data").join(name);
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p);
        }
    }
    Err(LoadgenError::Trace(format!(
        "{name} not found; set FARSIDE_DATA to the project's data/ directory or pass --trace-file (tried {} places, first {:?})",
        tried.len(),
        tried.first()
    )))
}

/// Percent-encodes bytes not allowed in a request target (RFC 3986 pchar,
/// `/` and `?`); `%` itself is encoded, so the path maps to a file name 1:1.
fn encode_target(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    for b in url.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One object a trace can request.
#[derive(Debug, Clone)]
pub struct TraceObject {
    /// Request target as sent (encoded, may carry a query).
    pub target: String,
    /// Body size in bytes.
    pub bytes: u64,
    /// Path of the object's file relative to a docroot (decoded, no query).
    pub file: String,
}

impl TraceObject {
    fn new(raw_url: &str, bytes: u64) -> TraceObject {
        let path = raw_url.split('?').next().unwrap_or("/");
        let mut file = path.trim_start_matches('/').to_string();
        if file.is_empty() || file.ends_with('/') {
            file.push_str("index.html");
        }
        TraceObject {
            target: encode_target(raw_url),
            bytes,
            file,
        }
    }
}

/// The World Cup sample prepared for replay.
struct Replay {
    /// Object of each row.
    objects: Vec<u32>,
    /// Whether each row is sent as a conditional GET (the log had a 304).
    conditional: Vec<bool>,
    /// Trace client of each row (dense index).
    clients: Vec<u32>,
    /// Time of each row since the first row, ms; rows of one logged second
    /// are spread evenly over it.
    times_ms: Vec<u64>,
    /// Rows of each trace client in log order, clients in order of first
    /// appearance.
    sessions: Vec<Vec<u32>>,
    /// Replay period: time of the last row plus one second, ms.
    period_ms: u64,
}

impl Replay {
    fn new(wc: &WorldCupTrace) -> Replay {
        let n = wc.sequence.len();
        let first = wc.times_s.first().copied().unwrap_or(0);
        let mut times_ms = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            let mut j = i;
            while j < n && wc.times_s[j] == wc.times_s[i] {
                j += 1;
            }
            let group = (j - i) as u64;
            for k in 0..group {
                times_ms.push((wc.times_s[i] - first) * 1000 + k * 1000 / group);
            }
            i = j;
        }
        let client_count = wc
            .clients
            .iter()
            .map(|c| *c as usize + 1)
            .max()
            .unwrap_or(0);
        let mut sessions = vec![Vec::new(); client_count];
        for (row, c) in wc.clients.iter().enumerate() {
            sessions[*c as usize].push(row as u32);
        }
        let period_ms = times_ms.last().map_or(1000, |t| t + 1000);
        Replay {
            objects: wc.sequence.clone(),
            conditional: wc.not_modified.clone(),
            clients: wc.clients.clone(),
            times_ms,
            sessions,
            period_ms,
        }
    }
}

enum Sampler {
    Single,
    Zipf(ZipfSampler),
    Replay(Replay),
}

/// One request to send: which object, and whether conditionally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Index into [`Trace::objects`].
    pub object: usize,
    /// Send `If-Modified-Since` (the World Cup log answered this row 304).
    pub conditional: bool,
}

/// A user's position in a trace (see [`Trace::new_session`]).
#[derive(Debug, Clone)]
pub struct Session {
    /// World Cup: (trace client, next position in its rows).
    replay: Option<(usize, usize)>,
}

/// One row of an open-loop World Cup replay ([`Trace::replay_row`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRow {
    pub pick: Pick,
    /// Trace client (dense index) the row belongs to.
    pub client: u32,
    /// Send time since the start of the replay at time scale 1, ms.
    pub offset_ms: u64,
}

/// A workload ready to sample: its objects and how to pick the next one.
pub struct Trace {
    pub kind: TraceKind,
    pub objects: Vec<TraceObject>,
    /// World Cup rows skipped while loading (0 for other traces).
    pub rows_skipped: u64,
    sampler: Sampler,
    /// Shared position in the World Cup rows (`next`) and sessions
    /// (`new_session`), counted from the seeded start; wraps around.
    cursor: AtomicUsize,
    session_cursor: AtomicUsize,
    /// First World Cup row replayed (seeded, see [`Trace::seeded`]).
    start_row: usize,
}

impl Trace {
    pub fn single(file_path: &str) -> Trace {
        Trace {
            kind: TraceKind::Single,
            objects: vec![TraceObject::new(file_path, SINGLE_FILE_BYTES)],
            rows_skipped: 0,
            sampler: Sampler::Single,
            cursor: AtomicUsize::new(0),
            session_cursor: AtomicUsize::new(0),
            start_row: 0,
        }
    }

    pub fn zipf(files: usize, alpha: f64, mode: PathMode) -> Trace {
        let objects = (1..=files)
            .map(|rank| {
                let bytes = zipf_file_bytes(rank);
                let url = match mode {
                    PathMode::Generated => format!("/files/{bytes}/zipf-{rank}"),
                    PathMode::Docroot => format!("/zipf/{rank}.html"),
                };
                TraceObject::new(&url, bytes)
            })
            .collect();
        Trace {
            kind: TraceKind::Zipf,
            objects,
            rows_skipped: 0,
            sampler: Sampler::Zipf(ZipfSampler::new(files, alpha)),
            cursor: AtomicUsize::new(0),
            session_cursor: AtomicUsize::new(0),
            start_row: 0,
        }
    }

    pub fn worldcup(wc: WorldCupTrace, mode: PathMode) -> Trace {
        let objects = wc
            .urls
            .iter()
            .zip(&wc.sizes)
            .map(|(url, &bytes)| match mode {
                PathMode::Generated => TraceObject::new(&format!("/files/{bytes}/wc{url}"), bytes),
                PathMode::Docroot => TraceObject::new(url, bytes),
            })
            .collect();
        Trace {
            kind: TraceKind::Worldcup,
            objects,
            rows_skipped: wc.rows_skipped,
            sampler: Sampler::Replay(Replay::new(&wc)),
            cursor: AtomicUsize::new(0),
            session_cursor: AtomicUsize::new(0),
            start_row: 0,
        }
    }

    /// Starts the World Cup replay at a row drawn from `seed` (uniform over
    /// the whole sample); other traces are unchanged.
    pub fn seeded(mut self, seed: u64) -> Trace {
        if let Sampler::Replay(r) = &self.sampler {
            let mut rng = Rng::new(seed ^ 0x57A2_7C0F_F5E7_0000);
            self.start_row = (rng.next_u64() % r.objects.len().max(1) as u64) as usize;
        }
        self
    }

    /// First World Cup row replayed (0 for other traces).
    pub fn start_row(&self) -> usize {
        self.start_row
    }

    /// Rows of the World Cup replay (0 for other traces).
    pub fn replay_rows(&self) -> usize {
        match &self.sampler {
            Sampler::Replay(r) => r.objects.len(),
            _ => 0,
        }
    }

    /// Average request rate of the World Cup log at time scale 1, requests/s
    /// (None for other traces).
    pub fn replay_rate(&self) -> Option<f64> {
        match &self.sampler {
            Sampler::Replay(r) => Some(r.objects.len() as f64 / (r.period_ms as f64 / 1000.0)),
            _ => None,
        }
    }

    /// The `k`-th row of the open-loop replay from the seeded start, wrapping
    /// around (None for traces that are not replays).
    pub fn replay_row(&self, k: u64) -> Option<ReplayRow> {
        let Sampler::Replay(r) = &self.sampler else {
            return None;
        };
        let n = r.objects.len() as u64;
        let abs = self.start_row as u64 + k;
        let (lap, row) = (abs / n, (abs % n) as usize);
        let start_ms = r.times_ms[self.start_row];
        let offset_ms = (lap * r.period_ms + r.times_ms[row]) - start_ms;
        Some(ReplayRow {
            pick: Pick {
                object: r.objects[row] as usize,
                conditional: r.conditional[row],
            },
            client: r.clients[row],
            offset_ms,
        })
    }

    /// Index into `objects` of the next request. Zipf draws from `rng` (one
    /// per client); World Cup takes the next row of the shared sequence,
    /// from the seeded start.
    pub fn next(&self, rng: &mut Rng) -> usize {
        match &self.sampler {
            Sampler::Single => 0,
            Sampler::Zipf(z) => z.sample(rng) - 1,
            Sampler::Replay(r) => {
                let k = self.cursor.fetch_add(1, Ordering::Relaxed);
                r.objects[(self.start_row + k) % r.objects.len()] as usize
            }
        }
    }

    /// A new user. World Cup: the next trace client (a session), in order of
    /// first appearance from the seeded start; other traces: an endless
    /// session.
    pub fn new_session(&self) -> Session {
        match &self.sampler {
            Sampler::Replay(r) => {
                let first = r.clients[self.start_row] as usize;
                let k = self.session_cursor.fetch_add(1, Ordering::Relaxed);
                Session {
                    replay: Some(((first + k) % r.sessions.len(), 0)),
                }
            }
            _ => Session { replay: None },
        }
    }

    /// The session's next request; None when its trace client has no more.
    pub fn next_in(&self, session: &mut Session, rng: &mut Rng) -> Option<Pick> {
        match (&self.sampler, &mut session.replay) {
            (Sampler::Replay(r), Some((client, pos))) => {
                let row = *r.sessions[*client].get(*pos)? as usize;
                *pos += 1;
                Some(Pick {
                    object: r.objects[row] as usize,
                    conditional: r.conditional[row],
                })
            }
            _ => Some(Pick {
                object: self.next(rng),
                conditional: false,
            }),
        }
    }
}

/// Modification time of docroot files: [`crate::CONDITIONAL_DATE`]
/// (1998-04-30 00:00:00 UTC), the `If-Modified-Since` of conditional GETs.
pub const CONDITIONAL_MTIME_UNIX_S: u64 = 893_894_400;

fn conditional_mtime() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(CONDITIONAL_MTIME_UNIX_S)
}

/// What [`write_docroot`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DocrootReport {
    pub files_written: u64,
    pub bytes_written: u64,
    /// Objects whose path cannot be a file (e.g. `/a` and `/a/b` both
    /// requested, or a `..` segment); servers will answer them 404.
    pub files_skipped: u64,
}

/// Writes every object `trace` can request under `dir`, with its size and
/// deterministic content, so a static server rooted at `dir` serves the trace.
/// Files are stamped [`CONDITIONAL_MTIME_UNIX_S`] so conditional GETs match.
pub fn write_docroot(trace: &Trace, dir: &Path) -> io::Result<DocrootReport> {
    let mut report = DocrootReport::default();
    std::fs::create_dir_all(dir)?;
    let mut chunk = vec![0u8; 64 * 1024];
    for (i, b) in chunk.iter_mut().enumerate() {
        *b = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-\n"[i % 64];
    }
    let mut seen = std::collections::HashSet::new();
    for obj in &trace.objects {
        if !seen.insert(obj.file.clone()) {
            continue;
        }
        if obj.file.split('/').any(|s| s == ".." || s == ".") {
            report.files_skipped += 1;
            continue;
        }
        let path = dir.join(&obj.file);
        let written = (|| -> io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::File::create(&path)?;
            let mut left = obj.bytes;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                f.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            // Conditional GETs carry this date; a server comparing
            // If-Modified-Since exactly (nginx) then answers 304.
            f.set_modified(conditional_mtime())?;
            Ok(())
        })();
        match written {
            Ok(()) => {
                report.files_written += 1;
                report.bytes_written += obj.bytes;
            }
            Err(e) => {
                log::debug!("docroot: skipping {}: {e}", path.display());
                report.files_skipped += 1;
            }
        }
    }
    Ok(report)
}
