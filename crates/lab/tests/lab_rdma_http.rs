//! `farside lab rdma-http --quick` end to end, as root: the namespaces, a back-end per
//! point (tcp and software iWARP with each registration), the CPU hogs, the
//! registration probe; the table's shape, no wrong body, and bytes delivered by every
//! system (by RDMA for the iwarp systems).
//!
//! The lab starts its nodes as `current_exe() backend ...` and `current_exe() lab
//! rdma-http --probe ...`, so this test is its own binary (`harness = false`) that
//! answers those two subcommands as `farside` does, and runs the test otherwise: it
//! always exercises this tree's code, never a `farside` binary built earlier.

use clap::Parser;
use farside_lab::rdmahttp::RdmaPoint;
use std::path::PathBuf;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
// Parsed once per process: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Cmd {
    Backend(farside_backend::BackendArgs),
    Lab(farside_lab::LabArgs),
}

const TEST: &str = "lab_rdma_http_quick_has_every_point_and_no_wrong_body";

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if matches!(argv.get(1).map(String::as_str), Some("backend" | "lab")) {
        let r = match Cli::parse().cmd {
            Cmd::Backend(a) => farside_backend::run(a, None).map_err(|e| e.to_string()),
            Cmd::Lab(a) => farside_lab::run(a).map_err(|e| e.to_string()),
        };
        if let Err(e) = r {
            eprintln!("{e}");
            std::process::exit(1);
        }
        return;
    }
    // `cargo test -- --list` and filters: one test, by name.
    if argv.iter().any(|a| a == "--list") {
        println!("{TEST}: test");
        return;
    }
    // Options of the test harness that take a value (the value is no filter).
    const VALUED: [&str; 6] = [
        "--test-threads",
        "--skip",
        "--color",
        "--format",
        "--logfile",
        "-Z",
    ];
    let filters: Vec<&String> = argv
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(i, a)| !a.starts_with('-') && !VALUED.contains(&argv[i - 1].as_str()))
        .map(|(_, a)| a)
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| TEST.contains(f.as_str())) {
        return;
    }
    println!("running 1 test");
    if !farside_testkit::root_or_skip(TEST) {
        println!("test result: ok. 0 passed; 0 failed; 1 ignored");
        return;
    }
    quick_lab();
    println!("test {TEST} ... ok");
    println!("test result: ok. 1 passed; 0 failed");
}

fn quick_lab() {
    let out: PathBuf =
        std::env::temp_dir().join(format!("farside-lab-rdma-http-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let cli = Cli::try_parse_from([
        "farside",
        "lab",
        "rdma-http",
        "--quick",
        "--out",
        out.to_str().unwrap(),
        "--table1-sizes",
        "4096,1048576",
        "--fig3-sizes",
        "4096,1048576",
        "--fig4-clients",
        "2",
        "--point-s",
        "0.5",
    ])
    .unwrap();
    let Cmd::Lab(args) = cli.cmd else {
        unreachable!("parsed as lab")
    };
    farside_lab::run(args).expect("lab rdma-http --quick");
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let s: farside_lab::summary::Summary<RdmaPoint> =
        farside_lab::summary::Summary::from_json(&text).unwrap();
    assert!(s.finished);
    // table1: 2 sizes x 3 strategies x 2 loads; fig3: 2 sizes x 6 systems (tcp, three
    // iWARP registrations, xdp-reads, xdp-direct) x 2 loads; fig4: 1 client count x 6
    // systems x 2 loads.
    let count = |e: &str| s.points.iter().filter(|p| p.experiment == e).count();
    assert_eq!(
        (count("table1"), count("fig3"), count("fig4")),
        (12, 24, 12),
        "{:#?}",
        s.points
    );
    for p in &s.points {
        let what = format!("{} {} {} {}", p.experiment, p.system, p.load, p.size_bytes);
        assert_eq!(p.wrong_bodies, 0, "{what}");
        assert_eq!(p.failures, 0, "{what}");
        assert!(
            p.served > 0 && p.avg_ms > 0.0 && p.p99_ms >= p.avg_ms * 0.0,
            "{what}"
        );
        if p.experiment == "table1" {
            assert!(p.reg_cpu_us.is_some() && p.reg_wait_us.is_some(), "{what}");
            continue;
        }
        assert!(p.bytes >= p.served * p.size_bytes.min(1), "{what}");
        assert!(p.bytes > 0, "{what}: no bytes delivered");
        assert!(p.server_cpu_ns_per_byte >= 0.0, "{what}");
        if p.system == "tcp" {
            assert_eq!((p.via_rdma, p.connect_us), (0, None), "{what}");
        } else {
            assert_eq!(p.via_tcp, 0, "{what}: declined {}", p.declined);
            assert_eq!(p.via_rdma, p.served, "{what}");
            assert_eq!(
                p.rdma_connections,
                u64::from(p.clients),
                "{what}: one kept per client"
            );
            assert!(p.connect_us.is_some_and(|c| c > 0.0), "{what}");
        }
        if p.system == "xdp-direct" && p.experiment == "fig3" {
            // The warm-up request granted and published the one file: the measured
            // requests need no HTTP request but for misses. (Fig. 4's clients each
            // publish the files they fetch first, over HTTP.)
            let http = p.http_requests.expect("measured");
            assert!(
                http * 2 < p.served,
                "{what}: {http} of {} over HTTP",
                p.served
            );
        } else if p.system == "xdp-reads" {
            assert_eq!(
                p.http_requests,
                Some(p.served),
                "{what}: one HTTP request each"
            );
        }
    }
    let table = std::fs::read_to_string(out.join("table.txt")).unwrap();
    for want in [
        "Table 1",
        "Fig. 3",
        "Fig. 4",
        "loaded/idle",
        "xdp-reads",
        "negative control",
    ] {
        assert!(table.contains(want), "table.txt lacks {want}:\n{table}");
    }
    let csv = std::fs::read_to_string(out.join("rdma-http.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + s.points.len());
    let _ = std::fs::remove_dir_all(&out);
}
