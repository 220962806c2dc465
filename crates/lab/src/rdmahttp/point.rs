//! The point of `lab rdma-http` ([`RdmaPoint`]) and how it is made from what was
//! measured, without I/O: a fig3/fig4 point from the clients' summary and the server's
//! CPU, a table1 point from the registration probe's samples.

use super::*;
use crate::experiment::{LabPoint, NoExtra};

/// One point of `lab rdma-http`. Its keys are stable (docs/lab.md).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct RdmaPoint {
    /// `table1`, `fig3`, `fig4`.
    pub experiment: String,
    /// `tcp`, `iwarp-static`, `iwarp-dynamic`, `iwarp-cached`.
    pub system: String,
    /// `idle`, `loaded`.
    pub load: String,
    /// Body size (fig4: each of the five files; table1: the registered body).
    pub size_bytes: u64,
    /// Clients (table1: 1, the probe).
    pub clients: u32,
    /// Measured requests completed (table1: registration steps).
    pub requests: u64,
    /// Bodies delivered and checked (table1: steps measured).
    pub served: u64,
    /// 200s whose body differed from its file (the warm-up's included).
    pub wrong_bodies: u64,
    /// Requests that failed (error or non-200; the warm-up's included).
    pub failures: u64,
    /// Bodies that came by RDMA, and over TCP (for an iwarp system: declined, with
    /// the reasons in `declined`).
    pub via_rdma: u64,
    pub via_tcp: u64,
    #[serde(default)]
    pub declined: String,
    /// Mean and p99 of the measured requests' latency (table1: of one registration
    /// step's wall time), ms.
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Measured time (the longest client's), ms; fig4: the time all clients took for
    /// their files.
    pub wall_ms: f64,
    /// Body bytes delivered in the measured window.
    pub bytes: u64,
    pub mb_per_s: f64,
    /// The server's CPU per body byte delivered (warm-up included in both), ns: user and
    /// system time of the back-end process, softirq time of its CPU, and their sum
    /// (table1: the probe thread's CPU per registered byte, in `server_cpu_ns_per_byte`
    /// only).
    pub server_user_ns_per_byte: f64,
    pub server_sys_ns_per_byte: f64,
    pub server_softirq_ns_per_byte: f64,
    pub server_cpu_ns_per_byte: f64,
    /// The server's CPU over the run, ms (user + system + softirq).
    pub server_cpu_ms: f64,
    /// RDMA connection set-up, mean and max, µs (`None`: no RDMA connection, tcp and
    /// table1).
    pub connect_us: Option<f64>,
    pub connect_max_us: Option<f64>,
    /// RDMA connections set up (one per client when kept).
    pub rdma_connections: u64,
    /// table1: mean thread CPU time of one step, and mean wall − CPU (waiting for the
    /// CPU), µs.
    pub reg_cpu_us: Option<f64>,
    pub reg_wait_us: Option<f64>,
    /// Loaded points: the CPU hogs' share of the server's one CPU over the measured
    /// window (their run time over its wall time; the runs' mean), and the least of the
    /// runs' shares: whether the load held the paper's condition ("nearly 100 %").
    #[serde(default)]
    pub hog_cpu_frac: Option<f64>,
    #[serde(default)]
    pub hog_cpu_frac_min: Option<f64>,
    /// fig3/fig4: mean time from a measured request written to its HTTP answer read,
    /// ms (the server's part, the body's transfer after it excluded), over the requests
    /// that made one; `None` when none did (xdp-direct served every body without) or
    /// for runs kept before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_answer_ms: Option<f64>,
    /// fig3/fig4: measured requests that made an HTTP request (xdp-direct: those that
    /// fell back), and direct attempts that fell back to one (warm-up included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_misses: Option<u64>,
    /// Runs combined into this point.
    pub runs: u32,
}

impl RdmaPoint {
    /// Record the hogs' share of the server's CPU (one run).
    pub fn set_hog_share(&mut self, share: Option<f64>) {
        self.hog_cpu_frac = share;
        self.hog_cpu_frac_min = share;
    }
}

fn per_byte(ns: u64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        ns as f64 / bytes as f64
    }
}

/// A fig3/fig4 point from the clients' summary `s`, the server's CPU over the run and
/// the warm-up's body bytes (which that CPU also paid for).
pub fn point_of_load(
    key: &Key,
    s: &farside_loadgen::rdma::RdmaSummary,
    cpu: ServerCpu,
    warmup_bytes: u64,
) -> RdmaPoint {
    let bytes_all = s.bytes + warmup_bytes;
    let declined: Vec<String> = s.declined.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let rdma = s.via_server_writes + s.via_client_reads + s.via_xdp_reads + s.via_xdp_direct;
    let direct = key.system == SYSTEM_XDP_DIRECT;
    RdmaPoint {
        experiment: key.experiment.clone(),
        system: key.system.clone(),
        load: key.load.clone(),
        size_bytes: key.size_bytes,
        clients: key.clients,
        requests: s.requests,
        served: s.served,
        // A warm-up request counts as the measured ones do: a wrong body as a wrong
        // body, any other failure as a failure.
        wrong_bodies: s.wrong_bodies + s.warmup_wrong_bodies,
        failures: s.failures + s.warmup_failures.saturating_sub(s.warmup_wrong_bodies),
        via_rdma: rdma,
        via_tcp: s.via_tcp,
        declined: declined.join(" "),
        avg_ms: s.avg_ms,
        p99_ms: s.p99_ms,
        wall_ms: s.duration_s * 1e3,
        bytes: s.bytes,
        mb_per_s: s.mb_per_s,
        server_user_ns_per_byte: per_byte(cpu.user_ns, bytes_all),
        server_sys_ns_per_byte: per_byte(cpu.sys_ns, bytes_all),
        server_softirq_ns_per_byte: per_byte(cpu.softirq_ns, bytes_all),
        server_cpu_ns_per_byte: per_byte(cpu.user_ns + cpu.sys_ns + cpu.softirq_ns, bytes_all),
        server_cpu_ms: (cpu.user_ns + cpu.sys_ns + cpu.softirq_ns) as f64 / 1e6,
        connect_us: (s.connect_count > 0).then_some(s.connect_avg_us),
        connect_max_us: (s.connect_count > 0).then_some(s.connect_max_us),
        rdma_connections: s.rdma_connections,
        reg_cpu_us: None,
        reg_wait_us: None,
        hog_cpu_frac: None,
        hog_cpu_frac_min: None,
        http_answer_ms: (s.http_answers > 0).then_some(s.http_answer_avg_ms),
        http_requests: Some(s.http_answers),
        direct_misses: direct.then_some(s.direct_misses),
        runs: 1,
    }
}

/// A table1 point from the probe's samples.
pub fn point_of_probe(key: &Key, samples: &[farside_rdmahttp::regbench::Sample]) -> RdmaPoint {
    let n = samples.len().max(1) as f64;
    let mut wall: Vec<u64> = samples.iter().map(|s| s.wall_ns).collect();
    wall.sort_unstable();
    let wall_sum: u64 = wall.iter().sum();
    let cpu_sum: u64 = samples.iter().map(|s| s.cpu_ns).sum();
    let p99 = if wall.is_empty() {
        0
    } else {
        wall[((wall.len() as f64 * 0.99).ceil() as usize).clamp(1, wall.len()) - 1]
    };
    let bytes = key.size_bytes * samples.len() as u64;
    RdmaPoint {
        experiment: key.experiment.clone(),
        system: key.system.clone(),
        load: key.load.clone(),
        size_bytes: key.size_bytes,
        clients: 1,
        requests: samples.len() as u64,
        served: samples.len() as u64,
        avg_ms: wall_sum as f64 / n / 1e6,
        p99_ms: p99 as f64 / 1e6,
        wall_ms: wall_sum as f64 / 1e6,
        bytes,
        server_cpu_ns_per_byte: per_byte(cpu_sum, bytes),
        server_cpu_ms: cpu_sum as f64 / 1e6,
        reg_cpu_us: Some(cpu_sum as f64 / n / 1e3),
        reg_wait_us: Some(wall_sum.saturating_sub(cpu_sum) as f64 / n / 1e3),
        runs: 1,
        ..RdmaPoint::default()
    }
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

fn mean_opt(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let x: Vec<f64> = v.flatten().collect();
    (!x.is_empty()).then(|| mean(x.into_iter()))
}

impl LabPoint for RdmaPoint {
    type Extra = NoExtra;

    fn take_extra(&mut self) -> NoExtra {
        NoExtra {}
    }

    fn put_extra(&mut self, _: NoExtra) {}

    /// Counts summed, times and rates averaged over the runs (p99: the mean of the
    /// runs' p99s), maxima the largest.
    fn combine(runs: &[RdmaPoint]) -> RdmaPoint {
        let Some(first) = runs.first() else {
            return RdmaPoint::default();
        };
        if runs.len() == 1 {
            return first.clone();
        }
        let f = |g: fn(&RdmaPoint) -> f64| mean(runs.iter().map(g));
        let sum = |g: fn(&RdmaPoint) -> u64| runs.iter().map(g).sum::<u64>();
        RdmaPoint {
            requests: sum(|p| p.requests),
            served: sum(|p| p.served),
            wrong_bodies: sum(|p| p.wrong_bodies),
            failures: sum(|p| p.failures),
            via_rdma: sum(|p| p.via_rdma),
            via_tcp: sum(|p| p.via_tcp),
            declined: runs
                .iter()
                .map(|p| p.declined.as_str())
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            avg_ms: f(|p| p.avg_ms),
            p99_ms: f(|p| p.p99_ms),
            wall_ms: f(|p| p.wall_ms),
            bytes: sum(|p| p.bytes),
            mb_per_s: f(|p| p.mb_per_s),
            server_user_ns_per_byte: f(|p| p.server_user_ns_per_byte),
            server_sys_ns_per_byte: f(|p| p.server_sys_ns_per_byte),
            server_softirq_ns_per_byte: f(|p| p.server_softirq_ns_per_byte),
            server_cpu_ns_per_byte: f(|p| p.server_cpu_ns_per_byte),
            server_cpu_ms: f(|p| p.server_cpu_ms),
            connect_us: mean_opt(runs.iter().map(|p| p.connect_us)),
            connect_max_us: runs
                .iter()
                .filter_map(|p| p.connect_max_us)
                .reduce(f64::max),
            rdma_connections: sum(|p| p.rdma_connections),
            reg_cpu_us: mean_opt(runs.iter().map(|p| p.reg_cpu_us)),
            reg_wait_us: mean_opt(runs.iter().map(|p| p.reg_wait_us)),
            hog_cpu_frac: mean_opt(runs.iter().map(|p| p.hog_cpu_frac)),
            hog_cpu_frac_min: runs
                .iter()
                .filter_map(|p| p.hog_cpu_frac_min)
                .reduce(f64::min),
            http_answer_ms: mean_opt(runs.iter().map(|p| p.http_answer_ms)),
            http_requests: runs.iter().map(|p| p.http_requests).sum(),
            direct_misses: runs.iter().map(|p| p.direct_misses).sum(),
            runs: runs.iter().map(|p| p.runs).sum(),
            ..first.clone()
        }
    }

    fn progress_line(&self) -> String {
        let mut s = format!(
            "avg {:.3} ms p99 {:.3} ms, {} served, {} wrong, {} failed",
            self.avg_ms, self.p99_ms, self.served, self.wrong_bodies, self.failures
        );
        if let (Some(c), Some(w)) = (self.reg_cpu_us, self.reg_wait_us) {
            s.push_str(&format!(", cpu {c:.1} µs wait {w:.1} µs"));
        } else {
            s.push_str(&format!(
                ", {:.1} MB/s, server {:.2} ns/B, rdma {} tcp {}",
                self.mb_per_s, self.server_cpu_ns_per_byte, self.via_rdma, self.via_tcp
            ));
            if let Some(c) = self.connect_us {
                s.push_str(&format!(", connect {c:.0} µs"));
            }
        }
        if let Some(h) = self.hog_cpu_frac {
            s.push_str(&format!(", hogs {:.1} % of the CPU", h * 100.0));
        }
        s
    }
}
