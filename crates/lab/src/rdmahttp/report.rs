//! The outputs of `lab rdma-http`: Table 1, Fig. 3 and Fig. 4 as text tables (idle
//! and loaded side by side, with the loaded/idle ratio), and `rdma-http.csv` (one row
//! per point, every key).

use super::*;
use crate::table::{Align, Table};
use std::fmt::Write as _;

fn find<'a>(
    points: &'a [RdmaPoint],
    e: &str,
    system: &str,
    load: &str,
    size: u64,
    clients: u32,
) -> Option<&'a RdmaPoint> {
    points.iter().find(|p| {
        p.experiment == e
            && p.system == system
            && p.load == load
            && p.size_bytes == size
            && p.clients == clients
    })
}

fn ratio(loaded: Option<f64>, idle: Option<f64>) -> String {
    match (loaded, idle) {
        (Some(l), Some(i)) if i > 0.0 => format!("{:.1}x", l / i),
        _ => "-".into(),
    }
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// `1024` → `1 KiB`, `512000` → `500 kB`, `8388608` → `8 MiB`.
pub fn size_label(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1024 && b.is_multiple_of(1024) {
        format!("{} KiB", b >> 10)
    } else if b >= 1000 && b.is_multiple_of(1000) {
        format!("{} kB", b / 1000)
    } else {
        format!("{b} B")
    }
}

fn distinct<T: PartialEq + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

fn table1(points: &[RdmaPoint]) -> String {
    let ps: Vec<&RdmaPoint> = points.iter().filter(|p| p.experiment == "table1").collect();
    if ps.is_empty() {
        return String::new();
    }
    let mut t = Table::new()
        .col("", "strategy", Align::Left, 14)
        .col(" ", "size", Align::Right, 8)
        .cols(
            " ",
            Align::Right,
            [
                ("wall us", 10),
                ("cpu us", 10),
                ("wall us", 11),
                ("cpu us", 10),
                ("wait us", 11),
                ("loaded/idle", 11),
            ],
        )
        .group("", 2)
        .group("idle", 2)
        .group("loaded", 3)
        .rule('-');
    for s in distinct(ps.iter().map(|p| p.system.clone())) {
        for size in distinct(ps.iter().filter(|p| p.system == s).map(|p| p.size_bytes)) {
            let at = |l: &str| find(points, "table1", &s, l, size, 1);
            let (i, l) = (at("idle"), at("loaded"));
            let us = |p: Option<&RdmaPoint>| p.map(|p| p.avg_ms * 1e3);
            t.row(vec![
                s.trim_start_matches("iwarp-").to_string(),
                size_label(size),
                f(us(i), 1),
                f(i.and_then(|p| p.reg_cpu_us), 1),
                f(us(l), 1),
                f(l.and_then(|p| p.reg_cpu_us), 1),
                f(l.and_then(|p| p.reg_wait_us), 1),
                ratio(us(l), us(i)),
            ]);
        }
    }
    let mut out = String::from(
        "Table 1: one registration step (dynamic: register + copy + deregister; static: \
         copy into the pre-registered region; cached: cache hit + register without copy + \
         deregister), mean per step; wait = wall - thread CPU (time waiting for the CPU)\n",
    );
    out.push_str(&t.render());
    out
}

fn fig3(points: &[RdmaPoint]) -> String {
    let ps: Vec<&RdmaPoint> = points.iter().filter(|p| p.experiment == "fig3").collect();
    if ps.is_empty() {
        return String::new();
    }
    let mut t = Table::new()
        .col("", "size", Align::Right, 8)
        .col(" ", "system", Align::Left, 14)
        .cols(
            " ",
            Align::Right,
            [
                ("avg ms", 9),
                ("p99 ms", 9),
                ("ns/B u+s+si", 18),
                ("avg ms", 9),
                ("p99 ms", 9),
                ("ns/B u+s+si", 18),
                ("loaded/idle", 11),
                ("conn us", 9),
                ("wrong", 5),
            ],
        )
        .group("", 2)
        .group("idle", 3)
        .group("loaded", 3)
        .rule('-');
    for size in distinct(ps.iter().map(|p| p.size_bytes)) {
        for s in distinct(
            ps.iter()
                .filter(|p| p.size_bytes == size)
                .map(|p| p.system.clone()),
        ) {
            let (i, l) = (
                find(points, "fig3", &s, "idle", size, 1),
                find(points, "fig3", &s, "loaded", size, 1),
            );
            t.row(vec![
                size_label(size),
                s.clone(),
                f(i.map(|p| p.avg_ms), 3),
                f(i.map(|p| p.p99_ms), 3),
                cpu_split(i),
                f(l.map(|p| p.avg_ms), 3),
                f(l.map(|p| p.p99_ms), 3),
                cpu_split(l),
                ratio(l.map(|p| p.avg_ms), i.map(|p| p.avg_ms)),
                connect(i, l),
                (i.map_or(0, |p| p.wrong_bodies) + l.map_or(0, |p| p.wrong_bodies)).to_string(),
            ]);
        }
    }
    let mut out = String::from(
        "Fig. 3: one client, retrieval time of one file vs size (server-writes for iwarp-*); \
         server CPU per byte = user + system of the back-end + softirq of its CPU; conn = \
         RDMA set-up idle/loaded\n",
    );
    out.push_str(&t.render());
    out
}

fn cpu_split(p: Option<&RdmaPoint>) -> String {
    p.map_or_else(
        || "-".into(),
        |p| {
            format!(
                "{:.2}+{:.2}+{:.2}",
                p.server_user_ns_per_byte, p.server_sys_ns_per_byte, p.server_softirq_ns_per_byte
            )
        },
    )
}

fn connect(i: Option<&RdmaPoint>, l: Option<&RdmaPoint>) -> String {
    match (i.and_then(|p| p.connect_us), l.and_then(|p| p.connect_us)) {
        (None, None) => "-".into(),
        (a, b) => format!("{}/{}", f(a, 0), f(b, 0)),
    }
}

fn fig4(points: &[RdmaPoint]) -> String {
    let ps: Vec<&RdmaPoint> = points.iter().filter(|p| p.experiment == "fig4").collect();
    if ps.is_empty() {
        return String::new();
    }
    let mut t = Table::new()
        .col("", "clients", Align::Right, 7)
        .col(" ", "system", Align::Left, 14)
        .cols(
            " ",
            Align::Right,
            [
                ("avg ms", 9),
                ("p99 ms", 9),
                ("all ms", 9),
                ("ns/B", 6),
                ("avg ms", 9),
                ("p99 ms", 9),
                ("all ms", 9),
                ("ns/B", 6),
                ("loaded/idle", 11),
                ("conn us", 11),
                ("wrong", 5),
            ],
        )
        .group("", 2)
        .group("idle", 4)
        .group("loaded", 4)
        .rule('-');
    for c in distinct(ps.iter().map(|p| p.clients)) {
        for s in distinct(
            ps.iter()
                .filter(|p| p.clients == c)
                .map(|p| p.system.clone()),
        ) {
            let (i, l) = (
                find(points, "fig4", &s, "idle", FIG4_FILE_BYTES, c),
                find(points, "fig4", &s, "loaded", FIG4_FILE_BYTES, c),
            );
            t.row(vec![
                c.to_string(),
                s.clone(),
                f(i.map(|p| p.avg_ms), 2),
                f(i.map(|p| p.p99_ms), 2),
                f(i.map(|p| p.wall_ms), 1),
                f(i.map(|p| p.server_cpu_ns_per_byte), 2),
                f(l.map(|p| p.avg_ms), 2),
                f(l.map(|p| p.p99_ms), 2),
                f(l.map(|p| p.wall_ms), 1),
                f(l.map(|p| p.server_cpu_ns_per_byte), 2),
                ratio(l.map(|p| p.avg_ms), i.map(|p| p.avg_ms)),
                connect(i, l),
                (i.map_or(0, |p| p.wrong_bodies) + l.map_or(0, |p| p.wrong_bodies)).to_string(),
            ]);
        }
    }
    let mut out = String::from(
        "Fig. 4: N clients, each fetching five 1 MiB files in turn on one kept connection; \
         avg/p99 per file, all = time until every client had its files\n",
    );
    out.push_str(&t.render());
    out
}

/// Idle: how much faster TCP was than each iwarp system (fig3, per size).
fn idle_tcp_lines(points: &[RdmaPoint]) -> String {
    let mut out = String::new();
    let sizes = distinct(
        points
            .iter()
            .filter(|p| p.experiment == "fig3")
            .map(|p| p.size_bytes),
    );
    for size in sizes {
        let Some(tcp) = find(points, "fig3", "tcp", "idle", size, 1) else {
            continue;
        };
        let others: Vec<String> = points
            .iter()
            .filter(|p| {
                p.experiment == "fig3"
                    && p.load == "idle"
                    && p.size_bytes == size
                    && p.system != "tcp"
                    && tcp.avg_ms > 0.0
            })
            .map(|p| format!("{} {:.2}x", p.system, p.avg_ms / tcp.avg_ms))
            .collect();
        if !others.is_empty() {
            let _ = writeln!(
                out,
                "idle {}: tcp {:.3} ms; iwarp time / tcp time: {}",
                size_label(size),
                tcp.avg_ms,
                others.join(", ")
            );
        }
    }
    out
}

/// The targets, from the points there are, for each arena system (xdp-reads always,
/// xdp-direct when measured): loaded/idle at 1 MiB and 8 MiB (target <= 1.5x) beside
/// tcp's (target >= 3x), and Fig. 4 at the most clients under load, tcp time / the
/// system's time (target >= 2x).
fn targets(points: &[RdmaPoint]) -> String {
    let mut out = String::new();
    for system in [SYSTEM_XDP_READS, SYSTEM_XDP_DIRECT] {
        if system != SYSTEM_XDP_READS && !points.iter().any(|p| p.system == system) {
            continue;
        }
        out.push_str(&system_targets(points, system));
    }
    out
}

fn system_targets(points: &[RdmaPoint], system: &str) -> String {
    let mut out = format!("targets ({system}):\n");
    let avg = |s: &str, load: &str, size: u64, e: &str, c: u32| {
        find(points, e, s, load, size, c).map(|p| p.avg_ms)
    };
    for size in [1u64 << 20, 8 << 20] {
        let (xi, xl) = (
            avg(system, "idle", size, "fig3", 1),
            avg(system, "loaded", size, "fig3", 1),
        );
        if xi.is_none() && xl.is_none() {
            continue;
        }
        let (ti, tl) = (
            avg("tcp", "idle", size, "fig3", 1),
            avg("tcp", "loaded", size, "fig3", 1),
        );
        let _ = writeln!(
            out,
            "  fig3 {}: loaded/idle {system} {} (target <= 1.5x), tcp {} (target >= 3x)",
            size_label(size),
            ratio(xl, xi),
            ratio(tl, ti)
        );
    }
    let most = points
        .iter()
        .filter(|p| p.experiment == "fig4" && p.load == "loaded")
        .map(|p| p.clients)
        .max();
    if let Some(c) = most {
        let (x, t) = (
            avg(system, "loaded", FIG4_FILE_BYTES, "fig4", c),
            avg("tcp", "loaded", FIG4_FILE_BYTES, "fig4", c),
        );
        let _ = writeln!(
            out,
            "  fig4 {c} clients loaded: tcp time / {system} time {} (target >= 2x)",
            ratio(t, x)
        );
    }
    out
}

/// The CPU hogs' share of the server's CPU over the loaded points that recorded it
/// (empty if none did: runs kept before it was measured).
fn hog_line(points: &[RdmaPoint]) -> String {
    let shares: Vec<(&RdmaPoint, f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p, p.hog_cpu_frac?, p.hog_cpu_frac_min?)))
        .collect();
    let Some(low) = shares
        .iter()
        .min_by(|a, b| a.2.total_cmp(&b.2))
        .map(|s| (s.0, s.2))
    else {
        return String::new();
    };
    let mean = shares.iter().map(|s| s.1).sum::<f64>() / shares.len() as f64;
    format!(
        "CPU hogs' share of the server's CPU over {} loaded points (run time / wall time): \
         mean {:.1} %, lowest run {:.1} % ({} {} {} c{})\n",
        shares.len(),
        mean * 100.0,
        low.1 * 100.0,
        low.0.experiment,
        low.0.system,
        size_label(low.0.size_bytes),
        low.0.clients
    )
}

/// The experiment's text: Table 1, Fig. 3, Fig. 4, the idle comparison and what the
/// software stack can show.
pub fn tables(points: &[RdmaPoint]) -> String {
    let mut parts: Vec<String> = [table1(points), fig3(points), fig4(points)]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let idle = idle_tcp_lines(points);
    if !idle.is_empty() {
        parts.push(idle);
    }
    let declined: Vec<String> = points
        .iter()
        .filter(|p| !p.declined.is_empty())
        .map(|p| {
            format!(
                "{} {} {} {} c{}: {}",
                p.experiment,
                p.system,
                p.load,
                size_label(p.size_bytes),
                p.clients,
                p.declined
            )
        })
        .collect();
    if !declined.is_empty() {
        parts.push(format!(
            "declined by the server (bodies over TCP):\n{}\n",
            declined.join("\n")
        ));
    }
    let hog = hog_line(points);
    if !hog.is_empty() {
        parts.push(hog);
    }
    if points.iter().any(|p| p.system == SYSTEM_XDP_READS) {
        parts.push(targets(points));
        parts.push(format!("{CONTROL_NOTE}.\n"));
    } else {
        parts.push(format!(
            "{SYSTEM_NOT_BUILT}: not built yet (bodies read one-sidedly from the kernel-answered \
             object arena).\n{CONTROL_NOTE}.\n"
        ));
    }
    parts.join("\n")
}

/// `rdma-http.csv`: one row per point, every key.
pub fn csv(points: &[RdmaPoint]) -> io::Result<String> {
    let head = [
        "experiment",
        "system",
        "load",
        "size_bytes",
        "clients",
        "requests",
        "served",
        "wrong_bodies",
        "failures",
        "via_rdma",
        "via_tcp",
        "declined",
        "avg_ms",
        "p99_ms",
        "wall_ms",
        "bytes",
        "mb_per_s",
        "server_user_ns_per_byte",
        "server_sys_ns_per_byte",
        "server_softirq_ns_per_byte",
        "server_cpu_ns_per_byte",
        "server_cpu_ms",
        "connect_us",
        "connect_max_us",
        "rdma_connections",
        "reg_cpu_us",
        "reg_wait_us",
        "runs",
        "hog_cpu_frac",
        "hog_cpu_frac_min",
    ];
    let o = |v: Option<f64>| v.map_or_else(String::new, crate::report::fmt_num);
    let n = crate::report::fmt_num;
    crate::report::csv_text(
        &head,
        points.iter().map(|p| {
            vec![
                p.experiment.clone(),
                p.system.clone(),
                p.load.clone(),
                p.size_bytes.to_string(),
                p.clients.to_string(),
                p.requests.to_string(),
                p.served.to_string(),
                p.wrong_bodies.to_string(),
                p.failures.to_string(),
                p.via_rdma.to_string(),
                p.via_tcp.to_string(),
                p.declined.clone(),
                n(p.avg_ms),
                n(p.p99_ms),
                n(p.wall_ms),
                p.bytes.to_string(),
                n(p.mb_per_s),
                n(p.server_user_ns_per_byte),
                n(p.server_sys_ns_per_byte),
                n(p.server_softirq_ns_per_byte),
                n(p.server_cpu_ns_per_byte),
                n(p.server_cpu_ms),
                o(p.connect_us),
                o(p.connect_max_us),
                p.rdma_connections.to_string(),
                o(p.reg_cpu_us),
                o(p.reg_wait_us),
                p.runs.to_string(),
                o(p.hog_cpu_frac),
                o(p.hog_cpu_frac_min),
            ]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(e: &str, system: &str, load: &str, size: u64, avg_ms: f64) -> RdmaPoint {
        RdmaPoint {
            experiment: e.into(),
            system: system.into(),
            load: load.into(),
            size_bytes: size,
            clients: 1,
            avg_ms,
            runs: 1,
            ..RdmaPoint::default()
        }
    }

    #[test]
    fn tables_pair_idle_with_loaded_and_give_the_ratio() {
        let pts = vec![
            p("fig3", "tcp", "idle", 4096, 0.5),
            p("fig3", "tcp", "loaded", 4096, 2.0),
            p("fig3", "iwarp-static", "idle", 4096, 1.0),
            p("table1", "iwarp-dynamic", "idle", 1 << 20, 1.0),
        ];
        let t = tables(&pts);
        assert!(t.contains("4.0x"), "{t}");
        assert!(
            t.contains("iwarp time / tcp time: iwarp-static 2.00x"),
            "{t}"
        );
        assert!(t.contains("Table 1") && t.contains("1 MiB"), "{t}");
        assert!(t.contains(SYSTEM_NOT_BUILT));
        let c = csv(&pts).unwrap();
        assert_eq!(c.lines().count(), 5);
        assert!(c.starts_with("experiment,system,load,size_bytes,clients"));
        assert_eq!(size_label(512_000), "500 KiB");
        assert_eq!(size_label(500_000), "500 kB");
        assert_eq!(size_label(2048), "2 KiB");
        assert!(!t.contains("hogs' share"), "{t}");
    }

    #[test]
    fn the_hogs_share_is_reported_with_its_lowest_run() {
        let mut a = p("fig4", "tcp", "loaded", 1 << 20, 20.0);
        a.clients = 15;
        a.set_hog_share(Some(0.95));
        let mut b = a.clone();
        b.set_hog_share(Some(0.85));
        let c = <RdmaPoint as crate::experiment::LabPoint>::combine(&[a, b]);
        assert_eq!(c.hog_cpu_frac_min, Some(0.85));
        assert!((c.hog_cpu_frac.unwrap() - 0.9).abs() < 1e-9);
        let t = tables(&[c.clone(), p("fig4", "tcp", "idle", 1 << 20, 5.0)]);
        assert!(
            t.contains("over 1 loaded points")
                && t.contains("lowest run 85.0 % (fig4 tcp 1 MiB c15)"),
            "{t}"
        );
        assert!(csv(&[c])
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .ends_with("hog_cpu_frac,hog_cpu_frac_min"));
    }

    #[test]
    fn repeats_sum_counts_and_average_times() {
        let mut a = p("fig3", "tcp", "idle", 4096, 1.0);
        a.served = 3;
        let mut b = a.clone();
        b.avg_ms = 3.0;
        b.connect_us = Some(10.0);
        let c = <RdmaPoint as crate::experiment::LabPoint>::combine(&[a, b]);
        assert_eq!(
            (c.served, c.runs, c.avg_ms, c.connect_us),
            (6, 2, 2.0, Some(10.0))
        );
    }
}
