//! The labels the tables and the lines under them give a point's load and links, and
//! the run's params that label its trace and its nodes' CPU slice.

/// `1500/s` (open loop: the offered rate) or `16 clients` (closed loop).
pub fn load_label(load_model: &str, rate: f64, clients: usize) -> String {
    if load_model == "open" {
        format!("{rate:.0}/s")
    } else {
        format!("{clients} clients")
    }
}

/// `10G`, `1G`, or `-` for an unshaped link.
pub fn link_label(gbit: f64) -> String {
    if gbit <= 0.0 {
        "-".into()
    } else {
        format!("{gbit}G")
    }
}

/// The trace's name, label and whether it is synthetic, into the run's params (the
/// sample's runs keep their earlier `trace` text).
pub(super) fn trace_params(params: &mut serde_json::Value, l: &farside_coop::synth::TraceLabel) {
    if l.name != "wc98-day6-sample" {
        params["trace"] = format!(
            "{}, files at their paths and sizes with content of their own",
            l.label
        )
        .into();
    }
    params["trace_name"] = l.name.clone().into();
    params["trace_synthetic"] = l.synthetic.into();
    params["trace_label"] = l.label.clone().into();
    if let Some(d) = &l.description {
        params["trace_command"] = d["command"].clone();
        params["trace_source"] = d["source"].clone();
    }
}

/// The host's CFS bandwidth slice the nodes' quotas run under, into the run's params: the
/// fabric lowers it while the run lives (`crate::fabric::netns::slice_for`); `null` where
/// the sysctl cannot be read.
pub(super) fn slice_params(params: &mut serde_json::Value, quota_pct: u32) {
    use crate::fabric::netns::{cpu_quota_period, slice_for, SLICE_SYSCTL};
    let host = std::fs::read_to_string(SLICE_SYSCTL)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let quota = cpu_quota_period(quota_pct).0;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    params["cfs_slice_us"] = host.map(|h| slice_for(quota, cpus, h)).into();
    params["cfs_slice"] = format!(
        "kernel.sched_cfs_bandwidth_slice_us while the run lasts: the node quota {quota} us over \
         2 x {cpus} CPUs, at least {} us, at most the host's own setting (a slice above the quota \
         let one CPU hold a node's whole quota and throttled its threads on the others)",
        crate::fabric::netns::SLICE_MIN_US
    )
    .into();
}
