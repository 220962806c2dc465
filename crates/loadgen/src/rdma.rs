//! `farside loadgen --rdma MODE`: load with the seed paper's `RDMA:` header (Dalessandro
//! and Wyckoff, NCA 2007), every body checked.
//!
//! - **Clients**: `--clients` closed-loop clients, one thread each, each a
//!   [`farside_rdmahttp::session::Session`]: one HTTP/1.1 keep-alive connection and on
//!   it one RDMA connection (software iWARP) kept across every request, as the paper's
//!   clients kept theirs (`--no-keepalive`: new connections, HTTP and RDMA, for every
//!   request). `--rdma off` runs the same clients without the header: the TCP
//!   baseline with identical clients.
//! - **Work**: client `i` requests `--rdma-paths` in turn starting at path `i`, after
//!   `--rdma-warmup-requests` requests that are not measured (the first one sets the
//!   RDMA connection up); then until it made `--rdma-requests-per-client` requests, or
//!   `--duration-s` passed since its warm-up ended, or `--requests` measured requests
//!   were started by all clients together.
//! - **Checks**: every body is compared with the file of the same path under
//!   `--rdma-root` (length and FNV-1a 64, read once at start): a 200 whose body differs
//!   is a `wrong_bodies`, never served.
//! - **Times**: each measured request's latency (request written to body in hand,
//!   RDMA completion included) in an HdrHistogram; each RDMA connection set-up,
//!   warm-up included, separately (`connect_*_us`: request written to the MPA set-up
//!   done, the server's work to get there included).
//!
//! The summary ([`RdmaSummary`]) has stable keys, listed in `docs/loadgen.md`.

use crate::summary::{encode_hist, new_latency_hist, record_latency};
use crate::{LoadgenArgs, LoadgenError};
use farside_rdmahttp::client::{GetOptions, Via};
use farside_rdmahttp::header::Mode;
use farside_rdmahttp::session::Session;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most `--rdma` clients: each is a thread with an RDMA connection (two more threads)
/// and a sink region of up to `--rdma-maxlen` bytes.
pub const RDMA_CLIENTS_MAX: usize = 64;
/// Most `--rdma-paths`: each file is read once at start to know its digest.
pub const RDMA_PATHS_MAX: usize = 256;
/// Largest file of `--rdma-paths` (and `--rdma-maxlen`): the largest region the
/// software iWARP stack registers.
pub const RDMA_FILE_BYTES_MAX: u64 = farside_rdmahttp::client::REGION_BYTES_MAX as u64;
/// Most warm-up requests per client.
pub const RDMA_WARMUP_REQUESTS_MAX: u32 = 1000;
/// Error messages kept in the summary (the first ones; the rest are only counted).
pub const ERRORS_KEPT: usize = 8;

/// `--rdma`: how the load asks for its bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RdmaLoad {
    /// No `RDMA:` header: the same clients, bodies over TCP (the baseline).
    Off,
    /// The server RDMA-Writes each body into the client's registered sink.
    ServerWrites,
    /// The client RDMA-Reads each body from the server's registered region.
    ClientReads,
    /// `RDMA: arena-reads`: the server answers where the body is in its object arena
    /// and the client reads it one-sidedly with READs its XDP responder answers in the
    /// kernel (needs --rdma-arena-key).
    XdpReads,
    /// As xdp-reads, also asking for a grant (`direct=1`): while it is live, a client
    /// resolves each path with one-sided READs of the server's arena index and reads
    /// the body, with no HTTP request; a miss asks over HTTP (needs
    /// --rdma-arena-key and a back-end with --rdma-arena-direct).
    XdpDirect,
}

impl RdmaLoad {
    pub fn as_str(self) -> &'static str {
        match self {
            RdmaLoad::Off => "off",
            RdmaLoad::ServerWrites => "server-writes",
            RdmaLoad::ClientReads => "client-reads",
            RdmaLoad::XdpReads => "xdp-reads",
            RdmaLoad::XdpDirect => "xdp-direct",
        }
    }

    fn mode(self) -> Option<Mode> {
        match self {
            RdmaLoad::Off | RdmaLoad::XdpReads | RdmaLoad::XdpDirect => None,
            RdmaLoad::ServerWrites => Some(Mode::ServerWrites),
            RdmaLoad::ClientReads => Some(Mode::ClientReads),
        }
    }
}

/// The `--rdma` flags of `farside loadgen` (the rest: `--target`, `--host`,
/// `--clients`, `--duration-s`, `--requests`, `--timeout-ms`, `--no-keepalive`,
/// `--think-ms`, `--json`, `--quiet`).
#[derive(Debug, Clone, clap::Args)]
pub struct RdmaLoadArgs {
    /// Load with the `RDMA:` request header (seed 004): server-writes, client-reads, or
    /// off (the same clients without the header: the TCP baseline). Each client keeps
    /// one HTTP connection and one RDMA connection for all its requests; every body is
    /// checked against --rdma-root. Needs --rdma-root. Default: none (the HTTP load
    /// generator above).
    #[arg(long = "rdma", value_enum)]
    pub rdma: Option<RdmaLoad>,
    /// --rdma: the paths requested (comma-separated), in turn, client i starting at
    /// the i-th. Default: --file-path.
    #[arg(
        id = "rdma_paths",
        long = "rdma-paths",
        value_delimiter = ',',
        requires = "rdma"
    )]
    pub paths: Vec<String>,
    /// --rdma: the directory the server serves (or a copy): each body is checked
    /// against the file of its path here (length and FNV-1a 64); a 200 with another
    /// body counts in wrong_bodies.
    #[arg(id = "rdma_root", long = "rdma-root", requires = "rdma")]
    pub root: Option<PathBuf>,
    /// --rdma: the most taken by RDMA, bytes (server-writes: each client's sink region).
    /// Default: the largest file of --rdma-paths.
    #[arg(id = "rdma_maxlen", long = "rdma-maxlen", requires = "rdma")]
    pub maxlen: Option<u64>,
    /// --rdma: requests per client before measuring (the first sets the RDMA
    /// connection up; its set-up time is in connect_*_us). Default: 1.
    #[arg(
        id = "rdma_warmup_requests",
        long = "rdma-warmup-requests",
        default_value_t = 1,
        requires = "rdma"
    )]
    pub warmup_requests: u32,
    /// --rdma: measured requests per client; a client stops after them. Default: no
    /// limit (--duration-s, --requests).
    #[arg(
        id = "rdma_requests_per_client",
        long = "rdma-requests-per-client",
        requires = "rdma"
    )]
    pub requests_per_client: Option<u32>,
    /// --rdma xdp-reads, xdp-direct: the arena reader key, ID:PATH (a key file, 0600) or ID (the
    /// credential rmem-ID), the one the back-end's --rdma-arena-key names.
    #[arg(
        id = "rdma_arena_key",
        long = "rdma-arena-key",
        value_name = "ID[:PATH]",
        requires = "rdma"
    )]
    pub arena_key: Option<String>,
}

impl Default for RdmaLoadArgs {
    fn default() -> Self {
        RdmaLoadArgs {
            rdma: None,
            paths: Vec::new(),
            root: None,
            maxlen: None,
            warmup_requests: 1,
            requests_per_client: None,
            arena_key: None,
        }
    }
}

/// The result of a `--rdma` run. Its keys are stable (docs/loadgen.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RdmaSummary {
    pub target: String,
    /// `off`, `server-writes`, `client-reads`.
    pub mode: String,
    pub clients: usize,
    pub keepalive: bool,
    pub paths: Vec<String>,
    /// Size of each path's file, bytes.
    pub file_bytes: Vec<u64>,
    pub maxlen: u64,
    pub warmup_requests: u32,
    pub requests_per_client: Option<u32>,
    /// Measured requests completed (served + wrong_bodies + failures).
    pub requests: u64,
    /// 200s whose body matched its file.
    pub served: u64,
    /// 200s whose body did not match its file (length or CRC32c).
    pub wrong_bodies: u64,
    /// Errors (connection, timeout, malformed answer, an announced RDMA transfer that
    /// did not arrive) and non-200 answers.
    pub failures: u64,
    /// How the measured bodies came.
    pub via_server_writes: u64,
    pub via_client_reads: u64,
    /// Bodies read one-sidedly from the server's arena (xdp-reads).
    #[serde(default)]
    pub via_xdp_reads: u64,
    /// Bodies resolved and read from the arena under a grant, no HTTP request
    /// (xdp-direct).
    #[serde(default)]
    pub via_xdp_direct: u64,
    /// xdp-direct: attempts under a live grant that fell back to HTTP (not published,
    /// stale, lost; warm-up included).
    #[serde(default)]
    pub direct_misses: u64,
    /// xdp-reads and xdp-direct: bodies the server put in its arena that the one-sided
    /// read could not deliver, asked for again over HTTP without the header (counted
    /// in `via_tcp` with `declined` `transfer`; warm-up included), and why (the first
    /// [`ERRORS_KEPT`]).
    #[serde(default)]
    pub arena_fallbacks: u64,
    #[serde(default)]
    pub arena_fallback_reasons: Vec<String>,
    /// Mean time from a measured request written to its HTTP answer read, ms (the
    /// server's part; the RDMA transfer after it excluded), over the requests that made
    /// one; 0 if none did.
    #[serde(default)]
    pub http_answer_avg_ms: f64,
    /// Measured requests that made an HTTP request.
    #[serde(default)]
    pub http_answers: u64,
    pub via_tcp: u64,
    /// Requests with the header the server answered over TCP, by its reason.
    pub declined: BTreeMap<String, u64>,
    /// Body bytes of served requests.
    pub bytes: u64,
    /// Measured time: the longest client's, s.
    pub duration_s: f64,
    /// Served / duration_s.
    pub tps: f64,
    /// Served bytes / duration_s, 10^6 B/s.
    pub mb_per_s: f64,
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// RDMA connections set up (warm-up included): one per client when persistent.
    pub rdma_connections: u64,
    /// HTTP connections opened (warm-up included).
    pub http_connections: u64,
    /// RDMA connection set-up times: count, mean, p99 and max, µs.
    pub connect_count: u64,
    pub connect_avg_us: f64,
    pub connect_p99_us: f64,
    pub connect_max_us: f64,
    /// Warm-up requests that failed or brought a wrong body.
    pub warmup_failures: u64,
    /// Of those, the ones that brought a wrong body (the rest failed: an error or a
    /// status other than 200).
    #[serde(default)]
    pub warmup_wrong_bodies: u64,
    /// Base64 HdrHistogram V2-deflate of the measured latencies (µs), for exact merges.
    pub latency_hist_v2: String,
    /// The first failures' messages.
    pub errors: Vec<String>,
}

/// A file of `--rdma-paths` as read at start.
struct Expected {
    path: String,
    len: u64,
    /// The file's CRC32c, as `--check-root` checks HTTP bodies: computed in hardware,
    /// so checking a body takes little of the clients' CPU from the transfers they time
    /// (FNV-1a, one multiply per byte, took a third of it at 15 clients).
    crc: u32,
}

/// What one client measured.
struct ClientResult {
    latency: Histogram<u64>,
    connects: Vec<u64>,
    served: u64,
    wrong: u64,
    failures: u64,
    warmup_failures: u64,
    warmup_wrong: u64,
    via: [u64; 5],
    direct_misses: u64,
    arena_fallbacks: u64,
    arena_fallback_reasons: Vec<String>,
    http_answer_us: u64,
    http_answers: u64,
    declined: BTreeMap<String, u64>,
    bytes: u64,
    rdma_connections: u64,
    http_connections: u64,
    measured: Duration,
    errors: Vec<String>,
}

fn bad(m: String) -> LoadgenError {
    LoadgenError::Args(m)
}

/// The files of `--rdma-paths` under `--rdma-root`, with their lengths and CRC32c.
fn expected(root: &Path, paths: &[String]) -> Result<Vec<Expected>, LoadgenError> {
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let rel = p
            .strip_prefix('/')
            .filter(|r| !r.split('/').any(|c| c == ".."))
            .ok_or_else(|| {
                bad(format!(
                    "--rdma-paths {p}: must start with / and have no .."
                ))
            })?;
        let file = root.join(rel);
        let meta = std::fs::metadata(&file)
            .map_err(|e| bad(format!("--rdma-paths {p}: {}: {e}", file.display())))?;
        if !meta.is_file() || meta.len() > RDMA_FILE_BYTES_MAX {
            return Err(bad(format!(
                "--rdma-paths {p}: {} is not a file of at most {RDMA_FILE_BYTES_MAX} bytes",
                file.display()
            )));
        }
        let bytes = std::fs::read(&file)?;
        out.push(Expected {
            path: p.clone(),
            len: bytes.len() as u64,
            crc: crc32c::crc32c(&bytes),
        });
    }
    Ok(out)
}

/// Run `farside loadgen --rdma MODE` (see the module doc).
pub fn run(args: &LoadgenArgs) -> Result<RdmaSummary, LoadgenError> {
    let r = &args.rdma;
    let load = r
        .rdma
        .ok_or_else(|| bad("--rdma: not given (run the HTTP load generator instead)".into()))?;
    if args.clients == 0 || args.clients > RDMA_CLIENTS_MAX {
        return Err(bad(format!(
            "--clients with --rdma must be in 1..={RDMA_CLIENTS_MAX}"
        )));
    }
    if args.is_open_loop() {
        return Err(bad(
            "--rdma runs a closed loop: no --rate / --time-scale".into()
        ));
    }
    let root = r
        .root
        .as_ref()
        .ok_or_else(|| bad("--rdma needs --rdma-root (the bodies are checked)".into()))?;
    let paths = if r.paths.is_empty() {
        vec![args.file_path.clone()]
    } else {
        r.paths.clone()
    };
    if paths.len() > RDMA_PATHS_MAX {
        return Err(bad(format!("--rdma-paths: at most {RDMA_PATHS_MAX}")));
    }
    if r.warmup_requests > RDMA_WARMUP_REQUESTS_MAX {
        return Err(bad(format!(
            "--rdma-warmup-requests: at most {RDMA_WARMUP_REQUESTS_MAX}"
        )));
    }
    if !(args.duration_s > 0.0 && args.duration_s <= crate::DURATION_S_MAX) {
        return Err(bad(format!(
            "--duration-s must be in (0, {}]",
            crate::DURATION_S_MAX
        )));
    }
    if args.timeout_ms == 0 {
        return Err(bad("--timeout-ms must be at least 1".into()));
    }
    let files = expected(root, &paths)?;
    let largest = files.iter().map(|f| f.len).max().unwrap_or(0).max(1);
    let maxlen = r.maxlen.unwrap_or(largest);
    if maxlen == 0 || maxlen > RDMA_FILE_BYTES_MAX {
        return Err(bad(format!(
            "--rdma-maxlen must be in 1..={RDMA_FILE_BYTES_MAX}"
        )));
    }
    let addr: SocketAddr = args
        .target
        .to_socket_addrs()
        .map_err(|e| LoadgenError::Target(format!("{}: {e}", args.target)))?
        .next()
        .ok_or_else(|| LoadgenError::Target(format!("{}: no address", args.target)))?;
    let host = args.host.clone().unwrap_or_else(|| args.target.clone());
    let opts = GetOptions {
        mode: load.mode(),
        maxlen,
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let keepalive = !args.no_keepalive;
    let arena_key = match (load, &r.arena_key) {
        (RdmaLoad::XdpReads | RdmaLoad::XdpDirect, Some(spec)) => Some(
            farside_rmem::ClientKey::load(spec)
                .map_err(|e| bad(format!("--rdma-arena-key: {e}")))?,
        ),
        (RdmaLoad::XdpReads | RdmaLoad::XdpDirect, None) => {
            return Err(bad(format!(
                "--rdma {} needs --rdma-arena-key ID[:PATH]",
                load.as_str()
            )))
        }
        _ => None,
    };
    let direct = load == RdmaLoad::XdpDirect;
    if !args.quiet {
        eprintln!(
            "loadgen --rdma {}: {} client(s) on {addr}, {} path(s), keep-alive {keepalive}",
            load.as_str(),
            args.clients,
            files.len()
        );
    }
    let files = Arc::new(files);
    let started = Arc::new(AtomicU64::new(0));
    let work = Work {
        warmup: r.warmup_requests,
        per_client: r.requests_per_client,
        total: args.requests,
        duration: Duration::from_secs_f64(args.duration_s),
        think: Duration::from_millis(args.think_ms),
    };
    let handles: Vec<_> = (0..args.clients)
        .map(|i| {
            let (files, started, host) = (Arc::clone(&files), Arc::clone(&started), host.clone());
            std::thread::Builder::new()
                .name(format!("rdma-client-{i}"))
                .spawn(move || {
                    let session = match arena_key {
                        Some(k) if direct => Session::new(addr, &host, opts, keepalive)
                            .with_arena_key(k)
                            .with_arena_direct(),
                        Some(k) => Session::new(addr, &host, opts, keepalive).with_arena_key(k),
                        None => Session::new(addr, &host, opts, keepalive),
                    };
                    client(i, session, &files, &work, &started)
                })
        })
        .collect::<Result<_, _>>()?;
    let mut results = Vec::with_capacity(handles.len());
    for h in handles {
        results.push(
            h.join()
                .map_err(|_| LoadgenError::Io(io::Error::other("an --rdma client panicked")))?,
        );
    }
    Ok(summarize(args, load, &files, maxlen, &results))
}

/// How much each client does.
#[derive(Clone, Copy)]
struct Work {
    warmup: u32,
    per_client: Option<u32>,
    total: Option<u64>,
    duration: Duration,
    think: Duration,
}

fn client(
    i: usize,
    mut s: Session,
    files: &[Expected],
    w: &Work,
    started: &AtomicU64,
) -> ClientResult {
    let mut r = ClientResult {
        latency: new_latency_hist(),
        connects: Vec::new(),
        served: 0,
        wrong: 0,
        failures: 0,
        warmup_failures: 0,
        warmup_wrong: 0,
        via: [0; 5],
        direct_misses: 0,
        arena_fallbacks: 0,
        arena_fallback_reasons: Vec::new(),
        http_answer_us: 0,
        http_answers: 0,
        declined: BTreeMap::new(),
        bytes: 0,
        rdma_connections: 0,
        http_connections: 0,
        measured: Duration::ZERO,
        errors: Vec::new(),
    };
    let mut k = i;
    let mut next = || {
        let f = &files[k % files.len()];
        k += 1;
        f
    };
    for _ in 0..w.warmup {
        let f = next();
        let failed = match s.get(&f.path) {
            Ok(got) => {
                r.http_connections += u64::from(got.http_connect);
                if let Some(d) = got.rdma_connect {
                    r.connects.push(d.as_micros() as u64);
                }
                if got.fetched.status != 200 {
                    Some(format!("status {}", got.fetched.status))
                } else if !matches(f, &got.fetched.body) {
                    r.warmup_wrong += 1;
                    Some(format!(
                        "wrong body ({} bytes via {}, want {})",
                        got.fetched.body.len(),
                        got.fetched.via.token(),
                        f.len
                    ))
                } else {
                    None
                }
            }
            Err(e) => Some(e.to_string()),
        };
        if let Some(e) = failed {
            r.warmup_failures += 1;
            keep_error(&mut r.errors, format!("warm-up {}: {e}", f.path));
        }
        if !w.think.is_zero() {
            std::thread::sleep(w.think);
        }
    }
    let t0 = Instant::now();
    let mut done = 0u32;
    loop {
        if w.per_client.is_some_and(|n| done >= n) || t0.elapsed() >= w.duration {
            break;
        }
        if let Some(total) = w.total {
            if started.fetch_add(1, Ordering::Relaxed) >= total {
                break;
            }
        }
        done += 1;
        let f = next();
        let t = Instant::now();
        let got = s.get(&f.path);
        let us = t.elapsed().as_micros() as u64;
        match got {
            Ok(got) => {
                r.http_connections += u64::from(got.http_connect);
                if let Some(d) = got.rdma_connect {
                    r.connects.push(d.as_micros() as u64);
                }
                if let Some(d) = got.http_answer {
                    r.http_answer_us += d.as_micros() as u64;
                    r.http_answers += 1;
                }
                let via = got.fetched.via;
                if got.fetched.status != 200 {
                    r.failures += 1;
                    keep_error(
                        &mut r.errors,
                        format!("{}: status {}", f.path, got.fetched.status),
                    );
                } else if !matches(f, &got.fetched.body) {
                    r.wrong += 1;
                    keep_error(
                        &mut r.errors,
                        format!(
                            "{}: wrong body ({} bytes via {}, want {})",
                            f.path,
                            got.fetched.body.len(),
                            via.token(),
                            f.len
                        ),
                    );
                } else {
                    r.served += 1;
                    r.bytes += f.len;
                    record_latency(&mut r.latency, us);
                    match via {
                        Via::ServerWrites => r.via[0] += 1,
                        Via::ClientReads => r.via[1] += 1,
                        Via::ArenaReads => r.via[3] += 1,
                        Via::ArenaDirect => r.via[4] += 1,
                        Via::Tcp(d) => {
                            r.via[2] += 1;
                            if let Some(d) = d {
                                *r.declined.entry(d.token().to_string()).or_default() += 1;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                r.failures += 1;
                keep_error(&mut r.errors, format!("{}: {e}", f.path));
            }
        }
        if !w.think.is_zero() {
            std::thread::sleep(w.think);
        }
    }
    r.measured = t0.elapsed();
    r.direct_misses = s.direct_misses();
    r.arena_fallbacks = s.arena_fallbacks();
    r.arena_fallback_reasons = s.arena_fallback_reasons().to_vec();
    r.rdma_connections = s.rdma_connections();
    r
}

fn matches(f: &Expected, body: &[u8]) -> bool {
    body.len() as u64 == f.len && crc32c::crc32c(body) == f.crc
}

fn keep_error(v: &mut Vec<String>, e: String) {
    if v.len() < ERRORS_KEPT {
        v.push(e);
    }
}

fn summarize(
    args: &LoadgenArgs,
    load: RdmaLoad,
    files: &[Expected],
    maxlen: u64,
    results: &[ClientResult],
) -> RdmaSummary {
    let mut latency = new_latency_hist();
    let mut connects = Vec::new();
    let mut s = RdmaSummary {
        target: args.target.clone(),
        mode: load.as_str().to_string(),
        clients: args.clients,
        keepalive: !args.no_keepalive,
        paths: files.iter().map(|f| f.path.clone()).collect(),
        file_bytes: files.iter().map(|f| f.len).collect(),
        maxlen,
        warmup_requests: args.rdma.warmup_requests,
        requests_per_client: args.rdma.requests_per_client,
        ..RdmaSummary::default()
    };
    let mut longest = Duration::ZERO;
    let mut answer_us = 0u64;
    for r in results {
        latency.add(&r.latency).expect("same bounds");
        connects.extend_from_slice(&r.connects);
        s.served += r.served;
        s.wrong_bodies += r.wrong;
        s.failures += r.failures;
        s.warmup_failures += r.warmup_failures;
        s.warmup_wrong_bodies += r.warmup_wrong;
        s.via_server_writes += r.via[0];
        s.via_client_reads += r.via[1];
        s.via_tcp += r.via[2];
        s.via_xdp_reads += r.via[3];
        s.via_xdp_direct += r.via[4];
        s.direct_misses += r.direct_misses;
        s.arena_fallbacks += r.arena_fallbacks;
        for e in &r.arena_fallback_reasons {
            keep_error(&mut s.arena_fallback_reasons, e.clone());
        }
        answer_us += r.http_answer_us;
        s.http_answers += r.http_answers;
        for (k, v) in &r.declined {
            *s.declined.entry(k.clone()).or_default() += v;
        }
        s.bytes += r.bytes;
        s.rdma_connections += r.rdma_connections;
        s.http_connections += r.http_connections;
        longest = longest.max(r.measured);
        for e in &r.errors {
            keep_error(&mut s.errors, e.clone());
        }
    }
    if s.http_answers > 0 {
        s.http_answer_avg_ms = answer_us as f64 / s.http_answers as f64 / 1e3;
    }
    s.requests = s.served + s.wrong_bodies + s.failures;
    s.duration_s = longest.as_secs_f64();
    if s.duration_s > 0.0 {
        s.tps = s.served as f64 / s.duration_s;
        s.mb_per_s = s.bytes as f64 / 1e6 / s.duration_s;
    }
    if !latency.is_empty() {
        s.avg_ms = latency.mean() / 1e3;
        s.p50_ms = latency.value_at_quantile(0.5) as f64 / 1e3;
        s.p99_ms = latency.value_at_quantile(0.99) as f64 / 1e3;
        s.max_ms = latency.max() as f64 / 1e3;
    }
    s.latency_hist_v2 = encode_hist(&latency);
    connects.sort_unstable();
    s.connect_count = connects.len() as u64;
    if !connects.is_empty() {
        s.connect_avg_us = connects.iter().sum::<u64>() as f64 / connects.len() as f64;
        let at = ((connects.len() as f64 * 0.99).ceil() as usize).clamp(1, connects.len());
        s.connect_p99_us = connects[at - 1] as f64;
        s.connect_max_us = *connects.last().expect("not empty") as f64;
    }
    s
}

/// Print `s` as text.
pub fn print_summary<W: Write>(s: &RdmaSummary, out: &mut W) -> io::Result<()> {
    writeln!(
        out,
        "rdma {} {} clients={} keepalive={} paths={}",
        s.mode,
        s.target,
        s.clients,
        s.keepalive,
        s.paths.len()
    )?;
    writeln!(
        out,
        "requests={} served={} wrong_bodies={} failures={} warmup_failures={}",
        s.requests, s.served, s.wrong_bodies, s.failures, s.warmup_failures
    )?;
    let declined: Vec<String> = s.declined.iter().map(|(k, v)| format!("{k}={v}")).collect();
    writeln!(
        out,
        "via server-writes={} client-reads={} xdp-reads={} xdp-direct={} tcp={} declined[{}]",
        s.via_server_writes,
        s.via_client_reads,
        s.via_xdp_reads,
        s.via_xdp_direct,
        s.via_tcp,
        declined.join(",")
    )?;
    writeln!(
        out,
        "latency avg={:.3}ms p50={:.3}ms p99={:.3}ms max={:.3}ms; {:.1} req/s {:.1} MB/s over {:.2}s",
        s.avg_ms, s.p50_ms, s.p99_ms, s.max_ms, s.tps, s.mb_per_s, s.duration_s
    )?;
    writeln!(
        out,
        "rdma connections={} (set-up avg={:.0}us p99={:.0}us max={:.0}us) http connections={} \
         http answers={} (avg {:.3}ms) direct misses={} arena fall-backs={}",
        s.rdma_connections,
        s.connect_avg_us,
        s.connect_p99_us,
        s.connect_max_us,
        s.http_connections,
        s.http_answers,
        s.http_answer_avg_ms,
        s.direct_misses,
        s.arena_fallbacks
    )?;
    for e in &s.errors {
        writeln!(out, "error: {e}")?;
    }
    for e in &s.arena_fallback_reasons {
        writeln!(out, "arena fall-back: {e}")?;
    }
    Ok(())
}

/// `farside loadgen --rdma ...`: run and print (text, or JSON with `--json`).
pub fn run_cli(args: &LoadgenArgs) -> Result<RdmaSummary, LoadgenError> {
    let s = run(args)?;
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &s).map_err(io::Error::other)?;
        writeln!(out)?;
    } else {
        print_summary(&s, &mut out)?;
    }
    Ok(s)
}
