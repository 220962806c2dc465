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
#[derive(Debug, Clone)]
pub struct WorldCupTrace {
    /// Distinct URLs in order of first appearance.
    pub urls: Vec<String>,
    /// Largest size seen per URL (`-` counts as 0).
    pub sizes: Vec<u64>,
    /// The request sequence, as indexes into `urls`.
    pub sequence: Vec<u32>,
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
        let mut trace = WorldCupTrace {
            urls: Vec::new(),
            sizes: Vec::new(),
            sequence: Vec::new(),
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
            let Some((url, size)) = parse_row(&line) else {
                trace.rows_skipped += 1;
                continue;
            };
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

fn parse_row(line: &[u8]) -> Option<(&str, u64)> {
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
    ts.parse::<u64>().ok()?;
    client.parse::<u64>().ok()?;
    status.parse::<u16>().ok()?;
    let valid_url = url.starts_with('/') && url.bytes().all(|b| b.is_ascii_graphic());
    if !valid_url {
        return None;
    }
    let size = if size == "-" { 0 } else { size.parse().ok()? };
    Some((url, size))
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

enum Sampler {
    Single,
    Zipf(ZipfSampler),
    Sequence(Vec<u32>),
}

/// A workload ready to sample: its objects and how to pick the next one.
pub struct Trace {
    pub kind: TraceKind,
    pub objects: Vec<TraceObject>,
    /// World Cup rows skipped while loading (0 for other traces).
    pub rows_skipped: u64,
    sampler: Sampler,
    /// Shared position in a replayed sequence (World Cup), wraps around.
    cursor: AtomicUsize,
}

impl Trace {
    pub fn single(file_path: &str) -> Trace {
        Trace {
            kind: TraceKind::Single,
            objects: vec![TraceObject::new(file_path, SINGLE_FILE_BYTES)],
            rows_skipped: 0,
            sampler: Sampler::Single,
            cursor: AtomicUsize::new(0),
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
            sampler: Sampler::Sequence(wc.sequence),
            cursor: AtomicUsize::new(0),
        }
    }

    /// Index into `objects` of the next request. Zipf draws from `rng` (one
    /// per client); World Cup takes the next row of the shared sequence.
    pub fn next(&self, rng: &mut Rng) -> usize {
        match &self.sampler {
            Sampler::Single => 0,
            Sampler::Zipf(z) => z.sample(rng) - 1,
            Sampler::Sequence(seq) => {
                let i = self.cursor.fetch_add(1, Ordering::Relaxed) % seq.len();
                seq[i] as usize
            }
        }
    }
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
