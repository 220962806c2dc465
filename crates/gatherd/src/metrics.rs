//! gatherd's counters ([`GatherStats`]) and its Prometheus endpoint: the admin HTTP
//! server shared with the proxy ([`farside_admin::AdminServer`]: one blocking thread,
//! one short request per connection, bounded request size and time). It never touches
//! the sampling loop; the text comes from the one encoder ([`farside_admin::Encoder`])
//! via [`render_metrics`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use farside_admin::{AdminServer as MetricsServer, Render};
use farside_admin::{Encoder, Kind};
use farside_rmem::OpCounters;

use crate::FIELD_COST_EVERY;

/// Running totals, readable while the gatherer runs.
#[derive(Default)]
pub struct GatherStats {
    pub samples: AtomicU64,
    /// CPU time of the user-space sampling thread, ns, wake-ups, publication and
    /// bookkeeping included (read every [`FIELD_COST_EVERY`] samples), over
    /// `cost_samples` samples.
    pub cost_ns_sum: AtomicU64,
    pub cost_samples: AtomicU64,
    /// Costliest measured sample (one in [`FIELD_COST_EVERY`]), ns: its fields only.
    pub cost_ns_max: AtomicU64,
    /// Periods whose deadline had already passed when the loop woke (overruns).
    pub overruns: AtomicU64,
    pub sample_errors: AtomicU64,
    /// Per-field CPU cost, ns, summed over the samples that measured it (one in
    /// [`FIELD_COST_EVERY`] on average, chosen at random so that fields read every
    /// few samples are measured in proportion): CPU busy time and runnable tasks, CPU
    /// pressure (PSI), accept backlog, memory. Divided by `field_cost_samples` it is
    /// each field's cost per sample.
    pub field_cost_samples: AtomicU64,
    pub field_cost_cpu_ns: AtomicU64,
    pub field_cost_psi_ns: AtomicU64,
    pub field_cost_conns_ns: AtomicU64,
    pub field_cost_mem_ns: AtomicU64,
    /// The kernel-resident sampler writes the record (no user-space samples).
    pub kernel_sampler: AtomicBool,
    /// gatherd keeps the kernel's BPF run-time statistics on (`--bpf-stats`).
    pub bpf_stats: AtomicBool,
    /// Full connection counts (every `--conns-every` samples) and their CPU cost, ns.
    pub full_counts: AtomicU64,
    pub full_count_ns_sum: AtomicU64,
    /// Longest wall-clock gap between two consecutive published samples, ns, and how
    /// many gaps exceeded [`LONG_GAP`]: a reader's record goes stale only through such
    /// gaps, so they tell a stalled gatherer (descheduled, a stolen CPU, a blocked
    /// dump) from a stalled reader.
    pub gap_ns_max: AtomicU64,
    pub long_gaps: AtomicU64,
}

/// A gap between two published samples longer than this is counted and logged: half
/// the proxy's default `stale_after` (100 ms), so every gap that can make a record
/// stale under the default is in the log.
pub const LONG_GAP: Duration = Duration::from_millis(50);

/// Report gatherd's own counters and every server's op counters to the scrape's encoder.
pub fn render_metrics(
    enc: &mut Encoder,
    s: &GatherStats,
    user: &OpCounters,
    xdp: Option<&farside_xdp::XdpResponder>,
) {
    for (name, kind, help, v) in [
        (
            "samples_total",
            Kind::Counter,
            "Samples published.",
            &s.samples,
        ),
        (
            "sample_cost_ns_sum",
            Kind::Counter,
            "CPU time of the sampling thread, ns (wake-ups included), over sample_cost_samples_total samples.",
            &s.cost_ns_sum,
        ),
        (
            "sample_cost_samples_total",
            Kind::Counter,
            "Samples whose thread CPU time is in sample_cost_ns_sum.",
            &s.cost_samples,
        ),
        (
            "sample_cost_ns_max",
            Kind::Gauge,
            "Costliest measured sample's fields, ns.",
            &s.cost_ns_max,
        ),
        (
            "overruns_total",
            Kind::Counter,
            "Periods whose deadline had passed at wake-up.",
            &s.overruns,
        ),
        (
            "sample_errors_total",
            Kind::Counter,
            "Failed samples (the record was left to go stale).",
            &s.sample_errors,
        ),
        (
            "publish_gap_ns_max",
            Kind::Gauge,
            "Longest gap between two published user-space samples, ns.",
            &s.gap_ns_max,
        ),
        (
            "long_gaps_total",
            Kind::Counter,
            "Gaps between two published user-space samples longer than 50 ms.",
            &s.long_gaps,
        ),
    ] {
        let name = format!("farside_gatherd_{name}");
        let v = v.load(Ordering::Relaxed);
        match kind {
            Kind::Gauge => enc.gauge(&name, help, &[], v),
            _ => enc.counter(&name, help, &[], v),
        }
    }
    enc.counter(
        "farside_gatherd_field_cost_samples_total",
        &format!(
            "User-space samples that measured their per-field cost (one in {FIELD_COST_EVERY} at random)."
        ),
        &[],
        s.field_cost_samples.load(Ordering::Relaxed),
    );
    for (field, v) in [
        ("cpu", &s.field_cost_cpu_ns),
        ("psi", &s.field_cost_psi_ns),
        ("conns", &s.field_cost_conns_ns),
        ("mem", &s.field_cost_mem_ns),
    ] {
        enc.counter(
            "farside_gatherd_field_cost_ns_sum",
            "Per-field CPU cost of those samples, ns.",
            &[("field", field)],
            v.load(Ordering::Relaxed),
        );
    }
    enc.counter(
        "farside_gatherd_full_counts_total",
        "Full connection counts (sock_diag dumps of established sockets).",
        &[],
        s.full_counts.load(Ordering::Relaxed),
    );
    enc.counter(
        "farside_gatherd_full_count_ns_sum",
        "CPU time of full connection counts, ns.",
        &[],
        s.full_count_ns_sum.load(Ordering::Relaxed),
    );
    let kernel = s.kernel_sampler.load(Ordering::Relaxed);
    for (mode, on) in [("kernel", kernel), ("user", !kernel)] {
        enc.gauge(
            "farside_gatherd_sampler",
            "Who writes the load record (1 for the running one).",
            &[("mode", mode)],
            on,
        );
    }
    if let Some(c) = xdp.and_then(|x| x.kernel_sampler_costs()) {
        for (prog, p) in [("tick", c.tick), ("state", c.state), ("ready", c.ready)] {
            enc.counter(
                "farside_gatherd_ksampler_run_time_ns_total",
                "Kernel time of the kernel sampler's programs, ns (needs kernel.bpf_stats_enabled=1).",
                &[("prog", prog)],
                p.run_time_ns,
            );
            enc.counter(
                "farside_gatherd_ksampler_runs_total",
                "Runs of the kernel sampler's programs.",
                &[("prog", prog)],
                p.run_count,
            );
        }
    }
    if let Some(x) = xdp {
        for (prog, p) in x.program_stats() {
            enc.counter(
                "farside_gatherd_bpf_run_time_seconds_total",
                "Kernel run time of gatherd's BPF programs, seconds (grows only while farside_gatherd_bpf_stats_enabled is 1).",
                &[("prog", prog)],
                p.run_time_ns as f64 / 1e9,
            );
            enc.counter(
                "farside_gatherd_bpf_run_count_total",
                "Runs of gatherd's BPF programs counted with their run time.",
                &[("prog", prog)],
                p.run_count,
            );
        }
    }
    // The sysctl, or gatherd's own BPF_ENABLE_STATS descriptor (not seen in the sysctl);
    // another process's descriptor is not seen at all.
    let on = farside_bpfrt::stats_enabled() == Some(true) || s.bpf_stats.load(Ordering::Relaxed);
    enc.gauge(
        "farside_gatherd_bpf_stats_enabled",
        "Whether the kernel keeps BPF run-time statistics (kernel.bpf_stats_enabled=1 or --bpf-stats).",
        &[],
        u64::from(on),
    );
    user.render("farside_gatherd_user", enc);
    if let Some(x) = xdp.filter(|x| x.serves_udp()) {
        let (ops, status) = x.counters();
        let c = OpCounters::default();
        for (a, v) in c.ops.iter().zip(ops) {
            a.store(v, Ordering::Relaxed);
        }
        for (a, v) in c.status.iter().zip(status) {
            a.store(v, Ordering::Relaxed);
        }
        c.render("farside_gatherd_xdp", enc);
        enc.counter(
            "farside_gatherd_xdp_aborted_total",
            "Requests whose reply could not be built (the frame could not grow): XDP_ABORTED.",
            &[],
            x.aborted(),
        );
        enc.counter(
            "farside_gatherd_xdp_no_room_total",
            "READs passed to user space because the reply could not grow the frame.",
            &[],
            x.no_room(),
        );
    }
}
