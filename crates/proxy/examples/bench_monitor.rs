//! Monitor and decision cost against the number of back-ends.
//!
//! For each back-end count N: one gatherd-like responder answers N udp regions (one
//! socket, a region per read key, `farside_monitor::responder`); the monitor polls them
//! every period with its poller threads for `--seconds`; then the proxy's decisions run
//! over a table of N fresh entries. Prints, per N: the pollers' CPU (% of one core, and
//! µs per period, from each poller's CLOCK_THREAD_CPUTIME_ID), periods that overran,
//! the share of reads answered, CPU per answered read and per READ sent (and the
//! user / system split per answered read, from /proc, tick-grained), the batch sizes
//! reached (READs per `sendmmsg`, replies per `recvmmsg`), `ppoll` sleeps per period,
//! and ns per decision: `choose` is the decision alone, `route` adds the request's
//! accounting (counters, in-flight guard taken and dropped); p2c and least-loaded;
//! the accept check.
//!
//! Run (release, on a quiet machine; the responder needs a core of its own at 1,024):
//! `cargo run --release -p farside-proxy --example bench_monitor -- \
//!    [--backends 16,256,1024] [--seconds 5] [--period-us 1000] [--threads 0] [--group]
//!    [--xsk IFACE] [--only MODE:RX] [--responders K] [--pin]`
//!
//! `--group`: each N is measured twice, `unicast` (a READ per back-end, as above) and
//! `group` (`MonitorOptions::group`: ONE READ per period to the group address, answered
//! by `farside_monitor::responder::GroupResponder` with N replies, region `i`'s from its
//! own endpoint 127.1.x.y:P, i.e. what N back-ends' XDP programs would send; the
//! network's fan-out of the group datagram is not part of the cost). Decision costs do
//! not depend on the mode and are printed on the unicast row only.
//!
//! `--responders K` (group mode): K threads answer each group READ, each sending an
//! equal share of the replies (`GroupResponder::spawn_threads`). One thread sends the
//! 1,024 replies one after another over ~3.7 ms, so the poller gathers them in ~37
//! wake-ups per period where back-ends answering in parallel would take a few; more
//! threads bring that closer on a host with CPUs to spare.
//!
//! `--only MODE:RX` (e.g. `group:xsk`): measure that row alone, for A/B runs.
//!
//! **The kernel's receive cost** (softirq time, which no thread's CPU clock counts):
//! `sirq_ns/rd` is the host's softirq time over the window (every CPU, from the
//! `softirq` column of /proc/stat, tick-sampled: 4 ms a tick at HZ=250, so use a few
//! seconds or more) per answered read. On loopback a datagram's receive (IP, UDP, the
//! socket's queue and wake-up) runs in NET_RX softirq on the CPU that SENT it, so with
//! `--pin` (pollers on CPU 0, responders on CPU 1) the time splits by direction:
//! `rx_sirq_ns/rd` is the responders' CPU's, i.e. receiving the REPLIES (what the
//! monitor's host would spend on its own CPUs behind a NIC), and `tx_sirq_ns/rd` the
//! pollers' CPU's (receiving the READs: the back-ends' cost). `net_rx/rd`: NET_RX
//! softirq runs per answered read (/proc/softirqs, every CPU). Without `--pin` the
//! split columns print `-`.
//!
//! `--xsk IFACE` (root; the bench's responders are on lo, so `--xsk lo`): each mode is
//! measured twice, `rx udp` (replies from the poller's UDP socket, `recvmmsg`) and
//! `rx xsk` (`MonitorOptions::rx = xsk:IFACE`: replies taken from AF_XDP RX rings fed by
//! `bpf/xskrx.bpf.c`, one poller thread). The `rx` column says the path the pollers
//! actually used (`udp` on an `xsk` row: the set-up failed, see the log line) and
//! `ring%` the share of the replies taken from the rings. `reps/recv` is then replies
//! per ring drain.
//!
//! Targets: 1,024 back-ends at 1 ms with the monitor ≤ 1 core; a per-request
//! decision < 100 ns.

use farside_monitor::responder::{GroupResponder, MultiResponder};
use farside_monitor::table::{Entry, EntryStatus, EntryWriter};
use farside_monitor::{create_table, Monitor, MonitorOptions, MonitorRx, Watch};
use farside_proxy::config::{BackendConfig, BalancePolicy, ProxyConfig};
use farside_proxy::control::Control;
use farside_proxy::gate::Gate;
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

struct Args {
    backends: Vec<usize>,
    seconds: f64,
    period_us: u64,
    threads: usize,
    /// Also measure group reads.
    group: bool,
    /// Also measure every mode with AF_XDP receive on this interface.
    xsk: Option<String>,
    /// `--only MODE:RX`: measure just that row (e.g. `group:xsk`), for A/B runs.
    only: Option<(String, String)>,
    /// `--responders K`: threads answering each group READ (default 1).
    responders: usize,
    /// `--pin`: pollers on CPU 0, responders on CPU 1 (softirq split by direction).
    pin: bool,
}

/// How the monitor reads in one measurement.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unicast,
    Group,
}

/// The responder of one measurement.
enum Responder {
    Multi(MultiResponder),
    Group(GroupResponder),
}

impl Responder {
    fn target(&self, i: usize) -> farside_monitor::Target {
        match self {
            Responder::Multi(r) => r.target(i),
            Responder::Group(r) => r.target(i),
        }
    }

    fn publish_all(&self, bump: u64) {
        match self {
            Responder::Multi(r) => r.publish_all(bump),
            Responder::Group(r) => r.publish_all(bump),
        }
    }
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        backends: vec![16, 256, 1024],
        seconds: 5.0,
        period_us: 1000,
        threads: 0,
        group: false,
        xsk: None,
        only: None,
        responders: 1,
        pin: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--group" {
            a.group = true;
            continue;
        }
        if k == "--pin" {
            a.pin = true;
            continue;
        }
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{k} {v}: {e}");
        match k.as_str() {
            "--backends" => {
                a.backends = v
                    .split(',')
                    .map(|x| x.parse::<usize>().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            "--seconds" => a.seconds = v.parse().map_err(|e| bad(&e))?,
            "--period-us" => a.period_us = v.parse().map_err(|e| bad(&e))?,
            "--threads" => a.threads = v.parse().map_err(|e| bad(&e))?,
            "--xsk" => a.xsk = Some(v),
            "--responders" => a.responders = v.parse().map_err(|e| bad(&e))?,
            "--only" => {
                let (m, rx) = v
                    .split_once(':')
                    .ok_or_else(|| bad(&"expected MODE:RX, e.g. group:xsk"))?;
                if !["unicast", "group"].contains(&m) || !["udp", "xsk"].contains(&rx) {
                    return Err(bad(&"MODE is unicast or group, RX udp or xsk"));
                }
                a.only = Some((m.to_string(), rx.to_string()));
            }
            _ => return Err(format!("unknown flag {k} (see the file's doc comment)")),
        }
    }
    Ok(a)
}

/// User and system CPU time so far of this process's threads named `monitor-poll-*`,
/// ns (from /proc/self/task/*/stat, in clock ticks).
fn pollers_user_sys_ns() -> (u64, u64) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut out = (0, 0);
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("monitor-poll") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime and stime are the
        // 12th and 13th.
        let rest = stat.rsplit_once(')').map_or("", |r| r.1);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if f.len() > 12 {
            out.0 += f[11] * 1_000_000_000 / hz;
            out.1 += f[12] * 1_000_000_000 / hz;
        }
    }
    out
}

/// Softirq time so far per CPU, ns (the `softirq` column of /proc/stat, in clock
/// ticks), and NET_RX softirq runs summed over CPUs (/proc/softirqs).
fn softirq_ns() -> (Vec<u64>, u64) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let per_cpu = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            // cpuN user nice system idle iowait irq softirq ...
            let t: u64 = l
                .split_whitespace()
                .nth(7)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            t * 1_000_000_000 / hz
        })
        .collect();
    let runs = std::fs::read_to_string("/proc/softirqs")
        .unwrap_or_default()
        .lines()
        .find(|l| l.trim_start().starts_with("NET_RX:"))
        .map_or(0, |l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse::<u64>().ok())
                .sum()
        });
    (per_cpu, runs)
}

/// Pin this process's threads whose name starts with `prefix` to `cpu`; how many.
fn pin_threads(prefix: &str, cpu: usize) -> usize {
    let mut n = 0;
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let Ok(tid) = t.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        if !comm.starts_with(prefix) {
            continue;
        }
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it; the call reads
        // it for its size.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        n += usize::from(ok);
    }
    n
}

/// What the pollers did over the steady window.
struct Cost {
    pollers: usize,
    /// The receive path the pollers used (`xsk` if every poller took AF_XDP).
    rx: &'static str,
    /// Share of the replies taken from AF_XDP rings, %.
    ring_pct: f64,
    cpu_pct: f64,
    us_per_period: f64,
    overruns: u64,
    answered_pct: f64,
    /// CPU per answered read, ns: all, then user and system (tick-grained).
    ns_per_read: f64,
    user_ns_per_read: f64,
    sys_ns_per_read: f64,
    /// CPU per READ datagram sent (answered or not), ns.
    ns_per_sent: f64,
    /// Datagrams per sendmmsg, replies per recvmmsg, ppoll sleeps per period.
    sent_per_call: f64,
    recv_per_call: f64,
    waits_per_period: f64,
    /// Softirq ns per answered read: the whole host's; with `--pin`, the responders'
    /// CPU's (receiving the replies) and the pollers' CPU's (receiving the READs).
    sirq_ns_per_read: f64,
    rx_sirq_ns_per_read: Option<f64>,
    tx_sirq_ns_per_read: Option<f64>,
    /// NET_RX softirq runs per answered read (every CPU).
    net_rx_per_read: f64,
}

/// Pollers' CPU over a steady window.
fn monitor_cost(n: usize, a: &Args, mode: Mode, rx: &MonitorRx) -> Cost {
    let r = match mode {
        Mode::Unicast => Responder::Multi(MultiResponder::spawn(n).expect("responder")),
        Mode::Group => Responder::Group(
            GroupResponder::spawn_threads(n, a.responders).expect("group responder"),
        ),
    };
    let group = match &r {
        Responder::Group(g) => Some(g.group),
        Responder::Multi(_) => None,
    };
    let table = create_table(None, n, a.period_us).expect("table");
    let watches = (0..n)
        .map(|i| Watch {
            index: i,
            name: format!("b{i}"),
            region: r.target(i),
        })
        .collect();
    let opts = MonitorOptions {
        period: Duration::from_micros(a.period_us),
        read_timeout: Duration::from_millis(50),
        stale_after: Duration::from_millis(100),
        // Group READs carry the group responder's shared key; unicast targets name
        // their own.
        key: match &r {
            Responder::Group(g) => Some(g.key()),
            Responder::Multi(_) => None,
        },
        nice: 0,
        threads: a.threads,
        group,
        rx: rx.clone(),
    };
    let m = Monitor::start(watches, table, opts).expect("monitor");

    let snap = |m: &Monitor| {
        m.pollers().iter().fold([0u64; 9], |s, p| {
            [
                s[0] + p.cpu_ns.load(Ordering::Relaxed),
                s[1] + p.periods.load(Ordering::Relaxed),
                s[2] + p.overruns.load(Ordering::Relaxed),
                // A group READ is a send call of its own (`sendto`).
                s[3] + p.send_calls.load(Ordering::Relaxed) + p.group_sent.load(Ordering::Relaxed),
                s[4] + p.recv_calls.load(Ordering::Relaxed),
                s[5] + p.waits.load(Ordering::Relaxed),
                s[6] + p.sent.load(Ordering::Relaxed),
                s[7] + p.xsk_rx.load(Ordering::Relaxed),
                s[8] + p.udp_rx.load(Ordering::Relaxed),
            ]
        })
    };
    let reads = |m: &Monitor| -> u64 {
        (0..n)
            .filter_map(|i| m.stats(i))
            .map(|s| s.read.count())
            .sum()
    };
    // Warm up (first reads, socket buffers), then measure a steady window.
    std::thread::sleep(Duration::from_millis(500));
    // Pinned once the threads run (and have named themselves).
    let pinned = a.pin && {
        let polls = pin_threads("monitor-poll", 0);
        let resps = pin_threads("multi-responder", 1) + pin_threads("group-responder", 1);
        if polls == 0 || resps == 0 {
            eprintln!("bench_monitor: --pin: pinned {polls} pollers, {resps} responders: no split");
        }
        polls > 0 && resps > 0
    };
    let (c0, r0, t0, us0) = (snap(&m), reads(&m), Instant::now(), pollers_user_sys_ns());
    let sirq0 = softirq_ns();
    let ticker = std::thread::spawn({
        let until = Instant::now() + Duration::from_secs_f64(a.seconds);
        move || {
            // A gatherer's rhythm: every region gets a new sample each 10 ms.
            let mut k = 0;
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
                k += 1;
                r.publish_all(k);
            }
            r
        }
    });
    let _r = ticker.join().expect("ticker");
    let (c1, r1, wall, us1) = (snap(&m), reads(&m), t0.elapsed(), pollers_user_sys_ns());
    let sirq1 = softirq_ns();
    let sirq_cpu = |c: usize| {
        let at = |s: &(Vec<u64>, u64)| s.0.get(c).copied().unwrap_or(0);
        at(&sirq1).saturating_sub(at(&sirq0)) as f64
    };
    let sirq_all: f64 = (0..sirq1.0.len()).map(sirq_cpu).sum();
    let d = |k: usize| (c1[k] - c0[k]) as f64;
    let cpu_ns = d(0);
    let periods = d(1).max(1.0);
    let threads = m.pollers().len().max(1) as f64;
    let expected_reads = n as f64 * wall.as_secs_f64() * 1e6 / a.period_us as f64;
    let answered = (r1 - r0).max(1) as f64;
    let xsk = m.pollers().iter().all(|p| p.xsk.load(Ordering::Relaxed));
    Cost {
        pollers: m.pollers().len(),
        rx: if xsk { "xsk" } else { "udp" },
        ring_pct: 100.0 * d(7) / (d(7) + d(8)).max(1.0),
        cpu_pct: 100.0 * cpu_ns / wall.as_nanos() as f64,
        us_per_period: cpu_ns / 1e3 / (periods / threads),
        overruns: c1[2] - c0[2],
        answered_pct: 100.0 * (r1 - r0) as f64 / expected_reads,
        ns_per_read: cpu_ns / answered,
        user_ns_per_read: (us1.0 - us0.0) as f64 / answered,
        sys_ns_per_read: (us1.1 - us0.1) as f64 / answered,
        ns_per_sent: cpu_ns / d(6).max(1.0),
        sent_per_call: d(6) / d(3).max(1.0),
        recv_per_call: answered / d(4).max(1.0),
        waits_per_period: d(5) / periods,
        sirq_ns_per_read: sirq_all / answered,
        rx_sirq_ns_per_read: pinned.then(|| sirq_cpu(1) / answered),
        tx_sirq_ns_per_read: pinned.then(|| sirq_cpu(0) / answered),
        net_rx_per_read: sirq1.1.saturating_sub(sirq0.1) as f64 / answered,
    }
}

/// ns per call of `f`, best of 5 runs of about 200 ms each.
fn ns_per(mut f: impl FnMut()) -> f64 {
    let mut iters = 1_000u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() > Duration::from_millis(200) {
            break;
        }
        iters *= 4;
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .fold(f64::MAX, f64::min)
}

/// ns per decision: (choose: the decision alone, route: the decision and the request's
/// accounting (counters, in-flight guard taken and dropped), accept check).
fn decision_cost(n: usize, policy: BalancePolicy) -> (f64, f64, f64) {
    let path = std::env::temp_dir().join(format!(
        "farside-bench-monitor-{}-{n}-{policy:?}",
        std::process::id()
    ));
    let table = create_table(Some(&path), n, 1000).expect("table");
    let backends = (0..n)
        .map(|i| BackendConfig {
            addr: format!("127.0.0.{}:{}", 1 + i / 60_000, 1024 + i % 60_000)
                .parse()
                .expect("addr"),
            site: String::new(),
            region: None,
            limit: None,
            maxconn: None,
        })
        .collect();
    let mut cfg = ProxyConfig::simple("127.0.0.1:1".parse().expect("addr"), backends);
    cfg.admission.enabled = true;
    cfg.admission.limit = Some(1000);
    cfg.admission.stale_after_ms = 3_600_000;
    cfg.balance.policy = policy;
    cfg.monitor.table = Some(path.display().to_string());
    let ctl = Control::new(&cfg).expect("control");
    for i in 0..n {
        let e = Entry {
            status: EntryStatus::Ok,
            conns_established: 10 + (i as u64 % 7),
            advanced_mono_ns: farside_rt::mono_ns(),
            ..Default::default()
        };
        EntryWriter::new(&*table, i).publish(&e);
    }
    let choose = ns_per(|| {
        black_box(ctl.choose(black_box(None)).expect("admitted"));
    });
    let route = ns_per(|| {
        black_box(ctl.route(black_box(None)).expect("admitted"));
    });
    let peer = "127.0.0.1:9".parse().expect("addr");
    let accept = ns_per(|| {
        black_box(ctl.on_accept(black_box(peer))).expect("admitted");
    });
    let _ = std::fs::remove_file(path);
    (choose, route, accept)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_monitor: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "{:>8} {:>7} {:>3} {:>5} {:>7} {:>9} {:>13} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>10} {:>13} {:>13} {:>9}",
        "backends",
        "mode",
        "rx",
        "ring%",
        "pollers",
        "cpu_%core",
        "cpu_us/period",
        "overruns",
        "answered%",
        "cpu_ns/read",
        "cpu_ns/sent",
        "user_ns/rd",
        "sys_ns/rd",
        "reads/send",
        "reps/recv",
        "waits/period",
        "choose_p2c_ns",
        "route_p2c_ns",
        "choose_ll_ns",
        "route_ll_ns",
        "accept_ns",
        "sirq_ns/rd",
        "rx_sirq_ns/rd",
        "tx_sirq_ns/rd",
        "net_rx/rd"
    );
    let modes: &[Mode] = if a.group {
        &[Mode::Unicast, Mode::Group]
    } else {
        &[Mode::Unicast]
    };
    let mut rxs = vec![MonitorRx::Udp];
    if let Some(i) = &a.xsk {
        rxs.push(MonitorRx::Xsk(i.clone()));
    }
    for &n in &a.backends {
        for &mode in modes {
            for rx in &rxs {
                if let Some((m, r)) = &a.only {
                    let name = if mode == Mode::Group {
                        "group"
                    } else {
                        "unicast"
                    };
                    let rx_name = if *rx == MonitorRx::Udp { "udp" } else { "xsk" };
                    if m != name || r != rx_name {
                        continue;
                    }
                }
                row(n, &a, mode, rx);
            }
        }
    }
}

/// Measure and print one row.
fn row(n: usize, a: &Args, mode: Mode, rx: &MonitorRx) {
    let c = monitor_cost(n, a, mode, rx);
    let decisions = match mode {
        Mode::Unicast if *rx == MonitorRx::Udp => {
            let (p2c_choose, p2c, accept) = decision_cost(n, BalancePolicy::P2c);
            let (ll_choose, ll, _) = decision_cost(n, BalancePolicy::LeastLoaded);
            format!("{p2c_choose:>11.1} {p2c:>11.1} {ll_choose:>11.1} {ll:>11.1} {accept:>9.1}")
        }
        _ => format!("{:>11} {:>11} {:>11} {:>11} {:>9}", "-", "-", "-", "-", "-"),
    };
    let mode = match mode {
        Mode::Unicast => "unicast",
        Mode::Group => "group",
    };
    let split = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.0}"));
    println!(
            "{n:>8} {mode:>7} {:>3} {:>5.1} {:>7} {:>9.1} {:>13.1} {:>8} {:>9.1} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>9.1} {:>9.1} {:>11.1} {decisions} {:>10.0} {:>13} {:>13} {:>9.2}",
            c.rx,
            c.ring_pct,
            c.pollers,
            c.cpu_pct,
            c.us_per_period,
            c.overruns,
            c.answered_pct,
            c.ns_per_read,
            c.ns_per_sent,
            c.user_ns_per_read,
            c.sys_ns_per_read,
            c.sent_per_call,
            c.recv_per_call,
            c.waits_per_period,
            c.sirq_ns_per_read,
            split(c.rx_sirq_ns_per_read),
            split(c.tx_sirq_ns_per_read),
            c.net_rx_per_read,
        );
}
