//! Synthetic traces fitted to published statistics of classic web traces, in the World
//! Cup sample's format (`timestamp,client_id,url,status,size`, gzip'd), so every reader of
//! that format (the lab, the load generator, [`crate::trace::Trace::read_world_cup`])
//! takes them as they are.
//!
//! A [`Profile`] holds the figures a paper published for one trace (distinct documents,
//! the Zipf-like exponent of popularity or the share of requests the most popular
//! documents take, the median and mean document size) and names its source; every figure
//! the generator needs that was not published is a rule stated beside the profile
//! (`data/TRACES.md` lists both, with addresses). [`synthesize`] is pure and seeded:
//!
//! - popularity: request `i` asks for rank `r` with probability proportional to
//!   `r^-alpha` over the profile's distinct documents (independent requests, the model of
//!   Breslau et al., INFOCOM 1999);
//! - sizes: each document's size is one stratified quantile of a lognormal with the
//!   published median whose shape is solved so that the mean of the documents' sizes,
//!   bounded by [`SYNTH_BODY_BYTES_MAX`], is the published mean; sizes are dealt to
//!   popularity ranks by a seeded shuffle (size and popularity independent: Breslau et
//!   al. found only a weak correlation between them);
//! - clients: consecutive sessions of one client each, geometric in length with the
//!   World Cup sample's mean ([`SESSION_REQUESTS_MEAN`]), so the load generator's closed
//!   loop replays sessions as it does the sample's;
//! - time: one day like the sample, the rows spread evenly (the open-loop replay rescales
//!   the log's time to the offered rate anyway); every status 200.
//!
//! [`Fit`] measures a trace the way the profile states it (distinct documents, mean and
//! median document size, the share of the top documents, alpha fitted on rank and
//! frequency), so a generated trace can be checked against its profile.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::trace::Trace;

/// Largest body a synthetic document may have: the World Cup sample's largest
/// (2,891,887 B), so synthetic runs serve nothing larger than the lab already serves
/// (well inside the arena's largest slot, 11.47 MB, and the emulated disk's 64 MiB file
/// bound).
pub const SYNTH_BODY_BYTES_MAX: u32 = 2_891_887;
/// Requests a synthetic trace may have: the trace reader's bound
/// ([`crate::trace::TRACE_REQUESTS_MAX`]), so every trace made can be read back.
pub const SYNTH_REQUESTS_MAX: usize = crate::trace::TRACE_REQUESTS_MAX;
/// Distinct documents a profile may have (its popularity table is 8 bytes a document).
pub const SYNTH_OBJECTS_MAX: usize = 1_000_000;
/// Mean requests per client session: the World Cup sample's (199,999 requests from
/// 17,505 clients), no session figure being published for the fitted traces.
pub const SESSION_REQUESTS_MEAN: f64 = 199_999.0 / 17_505.0;
/// First timestamp of a synthetic trace: 1 May 1998 00:00 UTC, the sample's day.
pub const SYNTH_START_UNIX_S: u64 = 893_980_800;
/// Seconds a synthetic trace spans (one day, as the sample).
pub const SYNTH_SPAN_S: u64 = 86_400;
/// Rank/frequency fit: only ranks requested at least this often take part (below it the
/// counts are dominated by sampling noise: 0s, 1s and 2s flatten the tail).
pub const FIT_COUNT_MIN: u64 = 10;
/// Documents whose share of requests [`Fit::top_share`] reports (the NCSA figure is for
/// the top 25).
pub const FIT_TOP: usize = 25;

/// How a profile's popularity exponent is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Popularity {
    /// The exponent the source fitted.
    Alpha(f64),
    /// The source gives the share of requests its `top` most popular documents took; the
    /// exponent is the one that gives them that share over the profile's documents.
    TopShare { top: usize, share: f64 },
}

/// Published statistics of one classic trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Name on the command line (`farside trace synth --profile NAME`).
    pub name: &'static str,
    /// The trace and the source of its figures (authors, venue, address).
    pub source: &'static str,
    /// Short name of the source for labels ("synthetic, fitted to ...").
    pub source_short: &'static str,
    /// Distinct documents.
    pub distinct_objects: usize,
    /// Popularity.
    pub popularity: Popularity,
    /// Median document size, bytes.
    pub size_median_bytes: f64,
    /// Mean document size, bytes.
    pub size_mean_bytes: f64,
    /// Whether the sizes are this trace's published figures (false: a rule, see `rules`).
    pub sizes_published: bool,
    /// Rules used where a figure was not published, one a line.
    pub rules: &'static [&'static str],
}

/// 1 KB as the 1994–95 papers wrote it.
const KB: f64 = 1024.0;

/// The profiles (see `data/TRACES.md` for every figure and its source).
pub fn profiles() -> Vec<Profile> {
    vec![
        Profile {
            name: "ncsa-1994",
            source: "NCSA's web server (4-server cluster), 2-3 August 1994: H.-W. Braun and \
                     k. claffy, \"Web traffic characterization: an assessment of the impact of \
                     caching documents from NCSA's web server\", WWW Conference, Oct 1994, \
                     section \"server statistics for 2-3 August 1994\", \
                     https://archives.iw3c2.org/www2/Proceedings/DDay/claffy/section3_3.html",
            source_short: "NCSA 2-3 Aug 1994 (Braun & claffy, WWW 1994)",
            distinct_objects: 8_949,
            popularity: Popularity::TopShare {
                top: 25,
                share: 0.59,
            },
            size_median_bytes: 3.0 * KB,
            size_mean_bytes: 17.0 * KB,
            sizes_published: true,
            rules: &[
                "alpha: not published; the exponent that gives the top 25 of 8,949 documents 59 % of the requests (published)",
                "sizes: lognormal with the published median (3 KB) and mean (17 KB) of retrieved documents, bounded by the World Cup sample's largest body",
                "sessions and time: not published; the World Cup sample's mean session, one day",
            ],
        },
        Profile {
            name: "bu-1995",
            source: "Boston University client traces (NCSA Mosaic, 1994-95, over half a \
                     million requests for 46,830 documents; Zipf slope -0.986): C. Cunha, \
                     A. Bestavros, M. Crovella, \"Characteristics of WWW Client-based \
                     Traces\", BU-CS-95-010, July 1995, \
                     https://cs-www.bu.edu/faculty/crovella/paper-archive/TR-95-010/paper.html \
                     (figures quoted at http://www.xent.com/FoRK-archive/jan00/0625.html)",
            source_short: "BU client traces 1995 (Cunha, Bestavros & Crovella, BU-CS-95-010)",
            distinct_objects: 46_830,
            popularity: Popularity::Alpha(0.986),
            size_median_bytes: 3.0 * KB,
            size_mean_bytes: 17.0 * KB,
            sizes_published: false,
            rules: &[
                "sizes: no median or mean found in the sources read; the ncsa-1994 rule (lognormal, median 3 KB, mean 17 KB), the same years and browser",
                "sessions and time: not published; the World Cup sample's mean session, one day",
            ],
        },
    ]
}

/// The profile called `name`.
pub fn profile(name: &str) -> Option<Profile> {
    profiles().into_iter().find(|p| p.name == name)
}

impl Profile {
    /// The popularity exponent (solved from the published share when that is what was
    /// published).
    pub fn alpha(&self) -> f64 {
        match self.popularity {
            Popularity::Alpha(a) => a,
            Popularity::TopShare { top, share } => {
                alpha_for_top_share(self.distinct_objects, top, share)
            }
        }
    }

    /// "synthetic, fitted to <source>": how runs label a trace made from this profile.
    pub fn label(&self) -> String {
        format!("synthetic, fitted to {}", self.source_short)
    }
}

/// One row of a trace in the World Cup sample's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Unix seconds.
    pub timestamp: u64,
    /// Client number.
    pub client_id: u64,
    /// Path (printable ASCII, no commas).
    pub url: String,
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub size: u32,
}

/// A small seeded generator (xorshift64*), so a trace depends on nothing but its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed: any seed (0 too) gives a well-mixed non-zero state.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf-like weights `r^-alpha`, ranks 1..=n, normalised to a cumulative table.
fn zipf_cdf(n: usize, alpha: f64) -> Vec<f64> {
    let mut cdf = Vec::with_capacity(n);
    let mut sum = 0.0;
    for r in 1..=n {
        sum += (r as f64).powf(-alpha);
        cdf.push(sum);
    }
    for c in &mut cdf {
        *c /= sum;
    }
    cdf
}

/// The share of requests the `top` most popular of `n` documents take under `r^-alpha`.
pub fn top_share(n: usize, top: usize, alpha: f64) -> f64 {
    let cdf = zipf_cdf(n, alpha);
    cdf[top.clamp(1, n) - 1]
}

/// The exponent under which the `top` most popular of `n` documents take `share` of the
/// requests (bisection; the share grows with the exponent).
pub fn alpha_for_top_share(n: usize, top: usize, share: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 4.0f64);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if top_share(n, top, mid) < share {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Inverse of the standard normal CDF (Acklam's rational approximation, relative error
/// below 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// `n` stratified quantiles of a lognormal (median `median`, shape `sigma`), each rounded
/// and bounded to 1..=[`SYNTH_BODY_BYTES_MAX`], in ascending order.
fn lognormal_quantiles(n: usize, median: f64, sigma: f64) -> Vec<u32> {
    (0..n)
        .map(|j| {
            let z = normal_quantile((j as f64 + 0.5) / n as f64);
            (median * (sigma * z).exp())
                .round()
                .clamp(1.0, SYNTH_BODY_BYTES_MAX as f64) as u32
        })
        .collect()
}

fn mean_u32(v: &[u32]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

/// The lognormal shape whose `n` bounded stratified quantiles have mean `mean` (the
/// unbounded mean is `median * exp(sigma^2 / 2)`; the bound at the largest body lowers
/// it, so the shape is solved on the bounded sizes by bisection).
pub fn lognormal_sigma(n: usize, median: f64, mean: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 4.0f64);
    for _ in 0..50 {
        let mid = (lo + hi) / 2.0;
        if mean_u32(&lognormal_quantiles(n, median, mid)) < mean {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// The documents' sizes by popularity rank (index 0 = the most popular): the profile's
/// bounded lognormal quantiles dealt to ranks by a shuffle seeded with `seed`.
pub fn object_sizes(p: &Profile, seed: u64) -> Vec<u32> {
    let n = p.distinct_objects;
    let sigma = lognormal_sigma(n, p.size_median_bytes, p.size_mean_bytes);
    let mut sizes = lognormal_quantiles(n, p.size_median_bytes, sigma);
    let mut rng = Rng::new(seed ^ 0x5EED_51CE);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        sizes.swap(i, j);
    }
    sizes
}

/// The url of the document of popularity rank `rank` (0-based) of profile `name`.
pub fn object_url(name: &str, rank: usize) -> String {
    format!("/synth/{name}/d{rank}")
}

/// `requests` rows fitted to profile `p`, the same for the same seed (module doc).
/// Errors: more requests than [`SYNTH_REQUESTS_MAX`] or a profile outside the bounds.
pub fn synthesize(p: &Profile, requests: usize, seed: u64) -> io::Result<Vec<Row>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    if requests == 0 || requests > SYNTH_REQUESTS_MAX {
        return Err(bad(format!(
            "requests {requests} outside 1..={SYNTH_REQUESTS_MAX}"
        )));
    }
    if p.distinct_objects == 0 || p.distinct_objects > SYNTH_OBJECTS_MAX {
        return Err(bad(format!(
            "profile {}: {} documents outside 1..={SYNTH_OBJECTS_MAX}",
            p.name, p.distinct_objects
        )));
    }
    let sizes = object_sizes(p, seed);
    let cdf = zipf_cdf(p.distinct_objects, p.alpha());
    let mut rng = Rng::new(seed);
    let end_p = 1.0 / SESSION_REQUESTS_MEAN;
    let (mut client, mut left) = (0u64, 0u64);
    let mut rows = Vec::with_capacity(requests);
    for i in 0..requests {
        if left == 0 {
            client += 1;
            // Geometric on 1, 2, ... with mean SESSION_REQUESTS_MEAN.
            let u = 1.0 - rng.next_f64();
            left = 1 + (u.ln() / (1.0 - end_p).ln()).floor() as u64;
        }
        left -= 1;
        let u = rng.next_f64();
        let rank = cdf.partition_point(|&c| c <= u).min(p.distinct_objects - 1);
        rows.push(Row {
            timestamp: SYNTH_START_UNIX_S + (i as u64 * SYNTH_SPAN_S) / requests as u64,
            client_id: client,
            url: object_url(p.name, rank),
            status: 200,
            size: sizes[rank],
        });
    }
    Ok(rows)
}

/// The rows as the sample's CSV text, header first.
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = String::from("timestamp,client_id,url,status,size\n");
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{}\n",
            r.timestamp, r.client_id, r.url, r.status, r.size
        ));
    }
    out
}

/// Writes the rows to `path` as gzip'd CSV. The gzip header carries no time or name, so
/// the same rows give the same bytes.
pub fn write_csv_gz(rows: &[Row], path: &Path) -> io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(io::BufWriter::new(file), flate2::Compression::default());
    gz.write_all(to_csv(rows).as_bytes())?;
    gz.finish()?.flush()
}

/// The description written beside a synthetic trace `x.csv.gz`: `x.synth.json`.
pub fn sidecar_path(trace: &Path) -> PathBuf {
    let name = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".csv.gz")
        .or_else(|| name.strip_suffix(".gz"))
        .unwrap_or(&name);
    trace.with_file_name(format!("{stem}.synth.json"))
}

/// FNV-1a 64 of `bytes`: a digest that shows a regenerated trace is byte-identical.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a run says of the trace it replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLabel {
    /// The profile, `wc98-day6-sample`, or the file's name.
    pub name: String,
    /// Whether the file is a synthetic trace described by its `.synth.json`.
    pub synthetic: bool,
    /// "synthetic, fitted to <source>", the sample's description, or the file's name.
    pub label: String,
    /// The `.synth.json` beside a synthetic trace.
    pub description: Option<serde_json::Value>,
}

/// The sample's label (the run texts of earlier runs say this).
pub const WORLD_CUP_LABEL: &str = "World Cup 1998 sample (data/wc98-day6-sample.csv.gz)";

/// Labels the trace file `path`: the World Cup sample, a synthetic trace (its
/// `.synth.json` beside it, whose digest must match the file), or any other file in the
/// format (its name, not called synthetic). Errors: a description that does not match.
pub fn trace_label(path: &Path) -> io::Result<TraceLabel> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let sample = crate::trace::world_cup_sample_path();
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    };
    if same(path, &sample) {
        return Ok(TraceLabel {
            name: "wc98-day6-sample".into(),
            synthetic: false,
            label: WORLD_CUP_LABEL.into(),
            description: None,
        });
    }
    let side = sidecar_path(path);
    if let Ok(text) = std::fs::read(&side) {
        let bad = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what}", side.display()),
            )
        };
        let d: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| bad(&e.to_string()))?;
        let digest = format!("{:016x}", fnv1a64(&std::fs::read(path)?));
        if d["fnv1a64"].as_str() != Some(digest.as_str()) {
            return Err(bad(&format!(
                "describes another file than {file_name} (digest {} there, {digest} here)",
                d["fnv1a64"]
            )));
        }
        return Ok(TraceLabel {
            name: d["profile"].as_str().unwrap_or(&file_name).to_string(),
            synthetic: d["synthetic"].as_bool().unwrap_or(false),
            label: d["label"].as_str().unwrap_or(&file_name).to_string(),
            description: Some(d),
        });
    }
    Ok(TraceLabel {
        name: file_name.clone(),
        synthetic: false,
        label: format!("trace file {file_name} (no .synth.json beside it)"),
        description: None,
    })
}

/// A trace measured as profiles state their figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fit {
    pub requests: usize,
    /// Documents requested at least once.
    pub distinct_objects: usize,
    pub distinct_bytes: u64,
    /// Mean and median size of the distinct documents, bytes.
    pub mean_object_bytes: f64,
    pub median_object_bytes: f64,
    /// Mean body bytes per request.
    pub mean_request_bytes: f64,
    /// Share of requests the [`FIT_TOP`] most requested documents take.
    pub top_share: f64,
    /// Exponent of a least-squares line through (ln rank, ln count) over the ranks
    /// requested at least [`FIT_COUNT_MIN`] times.
    pub alpha_fit: f64,
    /// Share of the distinct documents requested exactly once.
    pub one_timer_share: f64,
}

/// Measures `t` ([`Fit`]).
pub fn fit(t: &Trace) -> Fit {
    let mut count = vec![0u64; t.object_bytes.len()];
    for &r in &t.requests {
        count[r as usize] += 1;
    }
    let mut seen: Vec<(u64, u32)> = count
        .iter()
        .zip(&t.object_bytes)
        .filter(|(c, _)| **c > 0)
        .map(|(&c, &b)| (c, b))
        .collect();
    seen.sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut sizes: Vec<u32> = seen.iter().map(|s| s.1).collect();
    sizes.sort_unstable();
    let requests = t.requests.len();
    let top: u64 = seen.iter().take(FIT_TOP).map(|s| s.0).sum();
    let pts: Vec<(f64, f64)> = seen
        .iter()
        .enumerate()
        .take_while(|(_, s)| s.0 >= FIT_COUNT_MIN)
        .map(|(i, s)| (((i + 1) as f64).ln(), (s.0 as f64).ln()))
        .collect();
    let alpha_fit = if pts.len() >= 2 {
        let n = pts.len() as f64;
        let (mx, my) = (
            pts.iter().map(|p| p.0).sum::<f64>() / n,
            pts.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        -sxy / sxx
    } else {
        f64::NAN
    };
    Fit {
        requests,
        distinct_objects: seen.len(),
        distinct_bytes: sizes.iter().map(|&b| b as u64).sum(),
        mean_object_bytes: mean_u32(&sizes),
        median_object_bytes: if sizes.is_empty() {
            0.0
        } else if sizes.len() % 2 == 1 {
            sizes[sizes.len() / 2] as f64
        } else {
            (sizes[sizes.len() / 2 - 1] as f64 + sizes[sizes.len() / 2] as f64) / 2.0
        },
        mean_request_bytes: t.mean_request_bytes(),
        top_share: top as f64 / requests.max(1) as f64,
        alpha_fit,
        one_timer_share: seen.iter().filter(|s| s.0 == 1).count() as f64 / seen.len().max(1) as f64,
    }
}

/// Documents of `p` expected to be requested at least once in `requests` requests:
/// `sum_r 1 - (1 - p_r)^requests`.
pub fn expected_distinct(p: &Profile, requests: usize) -> f64 {
    let cdf = zipf_cdf(p.distinct_objects, p.alpha());
    let mut prev = 0.0;
    cdf.iter()
        .map(|&c| {
            let pr = c - prev;
            prev = c;
            1.0 - (1.0 - pr).powf(requests as f64)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_of(rows: &[Row], dir: &Path, name: &str) -> Trace {
        let path = dir.join(name);
        write_csv_gz(rows, &path).unwrap();
        Trace::read_world_cup(&path).unwrap()
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("farside-synth-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_seed_another_trace() {
        let p = profile("ncsa-1994").unwrap();
        let a = synthesize(&p, 20_000, 7).unwrap();
        let b = synthesize(&p, 20_000, 7).unwrap();
        let c = synthesize(&p, 20_000, 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let d = temp_dir("seed");
        write_csv_gz(&a, &d.join("a.csv.gz")).unwrap();
        write_csv_gz(&b, &d.join("b.csv.gz")).unwrap();
        let (fa, fb) = (
            std::fs::read(d.join("a.csv.gz")).unwrap(),
            std::fs::read(d.join("b.csv.gz")).unwrap(),
        );
        assert_eq!(fnv1a64(&fa), fnv1a64(&fb));
        assert_eq!(fa, fb);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_ncsa_exponent_gives_the_published_top_25_share() {
        let p = profile("ncsa-1994").unwrap();
        let a = p.alpha();
        assert!((top_share(8_949, 25, a) - 0.59).abs() < 1e-9, "alpha {a}");
        // A steeper exponent concentrates more: the solve is on the rising side.
        assert!(top_share(8_949, 25, a + 0.1) > 0.59);
    }

    #[test]
    fn sizes_have_the_published_median_and_mean_within_the_largest_body() {
        for p in profiles() {
            let s = object_sizes(&p, 3);
            assert_eq!(s.len(), p.distinct_objects);
            let mean = mean_u32(&s);
            assert!(
                (mean / p.size_mean_bytes - 1.0).abs() < 0.01,
                "{}: mean {mean}",
                p.name
            );
            let mut sorted = s.clone();
            sorted.sort_unstable();
            let median = sorted[sorted.len() / 2] as f64;
            assert!(
                (median / p.size_median_bytes - 1.0).abs() < 0.01,
                "{}: median {median}",
                p.name
            );
            assert!(s.iter().all(|&b| (1..=SYNTH_BODY_BYTES_MAX).contains(&b)));
            // The shuffle deals the same sizes to other ranks for another seed.
            let t = object_sizes(&p, 4);
            assert_ne!(s, t);
            let mut st = t.clone();
            st.sort_unstable();
            assert_eq!(sorted, st);
        }
    }

    /// Tolerances of a generated trace against its profile (docs/coop.md states them):
    /// distinct documents within 2 % of the number expected at that many requests, mean
    /// document size within 10 % of the profile's, alpha fitted on rank and frequency
    /// within 0.05 of the profile's.
    #[test]
    fn generated_traces_measure_as_their_profiles_within_the_tolerances() {
        let d = temp_dir("fit");
        for p in profiles() {
            let requests = 200_000;
            let rows = synthesize(&p, requests, 1).unwrap();
            let t = trace_of(&rows, &d, &format!("{}.csv.gz", p.name));
            assert_eq!(t.requests.len(), requests);
            let f = fit(&t);
            let want = expected_distinct(&p, requests);
            assert!(
                (f.distinct_objects as f64 / want - 1.0).abs() < 0.02,
                "{}: {} distinct, {want:.0} expected",
                p.name,
                f.distinct_objects
            );
            assert!(
                (f.mean_object_bytes / p.size_mean_bytes - 1.0).abs() < 0.10,
                "{}: mean {}",
                p.name,
                f.mean_object_bytes
            );
            assert!(
                (f.alpha_fit - p.alpha()).abs() < 0.05,
                "{}: alpha fitted {} for {}",
                p.name,
                f.alpha_fit,
                p.alpha()
            );
            // Every row a 200 with its document's size, time never going back.
            assert!(rows.iter().all(|r| r.status == 200 && r.size >= 1));
            assert!(rows.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
            let clients = rows.last().unwrap().client_id as f64;
            let mean_session = requests as f64 / clients;
            assert!(
                (mean_session / SESSION_REQUESTS_MEAN - 1.0).abs() < 0.05,
                "{}: sessions of {mean_session}",
                p.name
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_requests_are_refused_and_the_sidecar_sits_beside_the_trace() {
        let p = profile("bu-1995").unwrap();
        assert!(synthesize(&p, 0, 1).is_err());
        assert!(synthesize(&p, SYNTH_REQUESTS_MAX + 1, 1).is_err());
        assert!(profile("nope").is_none());
        assert_eq!(
            sidecar_path(Path::new("/x/ncsa.csv.gz")),
            PathBuf::from("/x/ncsa.synth.json")
        );
        assert!(p.label().starts_with("synthetic, fitted to BU"));
    }

    #[test]
    fn a_trace_is_labelled_from_its_description_only_when_the_digest_matches() {
        let wc = trace_label(&crate::trace::world_cup_sample_path()).unwrap();
        assert_eq!(
            (wc.name.as_str(), wc.synthetic),
            ("wc98-day6-sample", false)
        );
        let d = temp_dir("label");
        let path = d.join("t.csv.gz");
        let rows = synthesize(&profile("bu-1995").unwrap(), 1_000, 2).unwrap();
        write_csv_gz(&rows, &path).unwrap();
        let plain = trace_label(&path).unwrap();
        assert!(!plain.synthetic && plain.label.contains("t.csv.gz"));
        let digest = format!("{:016x}", fnv1a64(&std::fs::read(&path).unwrap()));
        let side = serde_json::json!({"profile": "bu-1995", "synthetic": true,
            "label": "synthetic, fitted to X", "fnv1a64": digest});
        std::fs::write(sidecar_path(&path), side.to_string()).unwrap();
        let l = trace_label(&path).unwrap();
        assert_eq!((l.name.as_str(), l.synthetic), ("bu-1995", true));
        assert_eq!(l.label, "synthetic, fitted to X");
        // Another file under the same description is refused.
        write_csv_gz(&rows[..999], &path).unwrap();
        assert!(trace_label(&path).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_normal_quantile_is_the_inverse_cdf() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_963_985).abs() < 1e-6);
        assert!((normal_quantile(0.001) + 3.090_232_306).abs() < 1e-6);
    }
}
