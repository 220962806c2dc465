//! The control layer's metrics: admission decisions, per-back-end load, limits and
//! in-flight counts, which signal decided, and the monitor's read figures, as one
//! scrape ([`Gate::render_metrics`]).

use super::*;

impl Control {
    /// The "which signal decided" lines of the metrics output (one small function, so
    /// the encoder can change around it): per-back-end admission checks by metric and
    /// by what decided them, and with metric `delay` each back-end's last queueing
    /// delay reading and target.
    pub fn render_signal_metrics(&self, enc: &mut Encoder) {
        for d in Decided::ALL {
            enc.counter(
                "farside_admission_checks_total",
                "Per-back-end admission checks by the metric in force and what decided them.",
                &[("metric", self.metric.name()), ("decided", d.name())],
                self.signals.0[d as usize].load(Ordering::Relaxed),
            );
        }
        if self.metric != Metric::Delay {
            return;
        }
        enc.gauge(
            "farside_admission_target_delay_us",
            "Queueing delay the delay metric steers each back-end to, µs.",
            &[],
            self.target_delay_us,
        );
        for (i, b) in self.backends.iter().enumerate() {
            let d = self
                .table
                .as_ref()
                .and_then(|t| table::read(&**t, i))
                .filter(|e| e.queue_delay_id != 0)
                .map_or(-1, |e| e.queue_delay_us as i64);
            let addr = b.addr.to_string();
            enc.gauge(
                "farside_backend_queue_delay_us",
                "Back-end's last published queueing delay, µs (-1: none).",
                &[("backend", &addr), ("site", &b.site)],
                d,
            );
        }
    }
}

impl Control {
    /// `[[classes]]`: per class the requests admitted and refused, and per back-end and
    /// class the requests in flight, the learned cost, its weight and the class's bound;
    /// the class rule's checks by verdict. Nothing without classes.
    pub fn render_class_metrics(&self, enc: &mut Encoder) {
        let Some(cs) = &self.classes else {
            return;
        };
        let n = cs.table.len();
        for k in 0..n {
            enc.counter(
                "farside_class_admitted_total",
                "Requests admitted, by request class.",
                &[("class", cs.table.name(k))],
                cs.admitted[k].load(Ordering::Relaxed),
            );
        }
        for k in 0..n {
            enc.counter(
                "farside_class_rejected_total",
                "Requests refused (any reason), by request class.",
                &[("class", cs.table.name(k))],
                cs.rejected[k].load(Ordering::Relaxed),
            );
        }
        for v in classes::Verdict::ALL {
            enc.counter(
                "farside_class_checks_total",
                "Per-back-end checks of the class rule, by verdict.",
                &[("verdict", v.name())],
                cs.refused_by[v as usize].load(Ordering::Relaxed),
            );
        }
        let addrs: Vec<String> = self.backends.iter().map(|b| b.addr.to_string()).collect();
        for (b, addr) in self.backends.iter().zip(&addrs) {
            for k in 0..n {
                enc.gauge(
                    "farside_class_inflight",
                    "This proxy's requests in flight to the back-end, by request class.",
                    &[("backend", addr), ("class", cs.table.name(k))],
                    b.classes.inflight[k].load(Ordering::Relaxed),
                );
            }
        }
        for (b, addr) in self.backends.iter().zip(&addrs) {
            for k in 0..n {
                enc.gauge(
                    "farside_class_cost_us",
                    "Learned cost of the class on the back-end: moving mean of its requests' times, µs (0: none yet).",
                    &[("backend", addr), ("class", cs.table.name(k))],
                    b.classes.cost(k).us.round() as u64,
                );
            }
        }
        // One family after the other (the text format keeps a family's samples together).
        let views: Vec<Vec<classes::View>> = (0..addrs.len())
            .map(|i| {
                let (now, m) = self.class_now(i, farside_rt::coarse_mono_ns());
                let budget = self.budget_now(i).max(1);
                (0..m)
                    .map(|k| classes::view(budget, 0, k, &now[..m]))
                    .collect()
            })
            .collect();
        for (vs, addr) in views.iter().zip(&addrs) {
            for (k, v) in vs.iter().enumerate() {
                enc.gauge(
                    "farside_class_bound",
                    "Most requests of the class in flight to the back-end under its current budget, learned weight and guarantee.",
                    &[("backend", addr), ("class", cs.table.name(k))],
                    classes::bound(v.budget, v.weight, v.top, v.guaranteed),
                );
            }
        }
        for (vs, addr) in views.iter().zip(&addrs) {
            for (k, v) in vs.iter().enumerate() {
                enc.gauge(
                    "farside_class_guaranteed",
                    "Slots of the back-end's budget guaranteed to the class while it asks (lower priorities; 0 for the most important).",
                    &[("backend", addr), ("class", cs.table.name(k))],
                    v.guaranteed,
                );
            }
        }
    }

    /// Back-end `i` as the monitor table and the balancer see it (the dashboard's
    /// per-back-end row): requests routed, down flag, and the table entry's status, load
    /// fields and served role.
    fn render_backend_view(&self, enc: &mut Encoder, i: usize, lbl: Labels<'_>, now: u64) {
        enc.counter(
            "farside_backend_routed_total",
            "Requests routed to the back-end (its balancing share).",
            lbl,
            self.backends[i].routed.load(Ordering::Relaxed),
        );
        enc.gauge(
            "farside_backend_down",
            "1 while the back-end is skipped after a failure (balance.down_for_ms).",
            lbl,
            self.is_down(i, now),
        );
        let Some(e) = self.table.as_ref().and_then(|t| table::read(&**t, i)) else {
            return;
        };
        enc.gauge(
            "farside_monitor_status",
            "Monitor's last read of the back-end: 0 never read, 1 ok, 2 failed (values are the last good ones).",
            lbl,
            e.status as u64,
        );
        let with = |f: &'static str| [lbl[0], lbl[1], ("field", f)];
        for (field, v) in [
            ("cpu_util_ppm", e.cpu_util_ppm),
            ("cpu_pressure_ppm", e.cpu_pressure_ppm),
            ("runnable", e.runnable),
            ("conns_established", e.conns_established),
            ("accept_backlog", e.accept_backlog),
            ("conns_pending", e.conns_pending),
        ] {
            enc.gauge(
                "farside_monitor_load",
                "Back-end load fields in the monitor table, as last read.",
                &with(field),
                v,
            );
        }
        let role = "Back-end's served role as last read (ROLE_SERVED): site number and version (version 0: no role published).";
        enc.gauge(
            "farside_monitor_role_served",
            role,
            &[lbl[0], lbl[1], ("part", "site")],
            e.role_served >> 48,
        );
        enc.gauge(
            "farside_monitor_role_served",
            role,
            &[lbl[0], lbl[1], ("part", "version")],
            e.role_served & ((1 << 48) - 1),
        );
    }

    /// Every metric of the control layer (what [`Gate::render_metrics`] appends to a
    /// scrape): decisions, per-back-end load, limits, in-flight and monitor figures.
    pub(super) fn render(&self, enc: &mut Encoder) {
        self.render_class_metrics(enc);
        let c = &self.counters;
        let decisions = "Admission decisions by stage and outcome.";
        for (stage, admitted, rejected) in [
            ("accept", &c.accept_admitted, &c.accept_rejected),
            ("request", &c.request_admitted, &c.request_rejected),
        ] {
            enc.counter(
                "farside_admission_decisions_total",
                decisions,
                &[("stage", stage), ("outcome", "admit"), ("reason", "")],
                admitted.load(Ordering::Relaxed),
            );
            for r in Reject::ALL {
                enc.counter(
                    "farside_admission_decisions_total",
                    decisions,
                    &[
                        ("stage", stage),
                        ("outcome", "reject"),
                        ("reason", r.reason()),
                    ],
                    rejected[r.index()].load(Ordering::Relaxed),
                );
            }
        }
        enc.counter(
            "farside_admission_reuse_only_total",
            "Requests admitted only onto an idle pooled connection (the queue metric was at its limit).",
            &[],
            c.request_admitted_reuse_only.load(Ordering::Relaxed),
        );
        self.render_signal_metrics(enc);
        if let Some(m) = &self.monitor {
            m.render(enc);
        }
        if let Some(s) = &self.sites {
            let roles: Vec<Option<u64>> = (0..self.backends.len())
                .map(|i| self.role_served(i))
                .collect();
            s.render(enc, &roles);
        }
        let now = mono_ns();
        for (i, b) in self.backends.iter().enumerate() {
            let addr = b.addr.to_string();
            let lbl: &[(&str, &str)] = &[("backend", &addr), ("site", &b.site)];
            let with = |k: &'static str, v: &'static str| [lbl[0], lbl[1], (k, v)];
            let load = match self.load(i, now) {
                Load::Known(v) => v as i64,
                _ => -1,
            };
            // After the load: reading it is what notices a record without a delay.
            let metric = self.metric_of(i).name();
            enc.gauge(
                "farside_backend_admission_metric",
                "The metric the back-end is admitted by (1): the configured one, or `backlog` under metric `delay` while its records carry no queueing delay.",
                &with("metric", metric),
                1u64,
            );
            enc.gauge(
                "farside_backend_load",
                "Back-end load in the unit of the metric it is admitted by (-1: stale or unknown).",
                &with("metric", metric),
                load,
            );
            enc.gauge(
                "farside_backend_inflight",
                "Requests this proxy has in flight to the back-end.",
                lbl,
                b.inflight.load(Ordering::Relaxed),
            );
            enc.gauge(
                "farside_backend_limit",
                "Admission limit on the back-end's in-flight requests now.",
                lbl,
                self.limit_now(i, Load::Unknown),
            );
            enc.gauge(
                "farside_backend_safe_inflight",
                "on_stale = local: the requests in flight this proxy holds the back-end at while its record is stale (0: none yet).",
                lbl,
                self.safe_inflight(i),
            );
            if let Some(p) = self.pool.get() {
                let (open, idle) = (p.open_count(i), p.idle_count(i));
                let conns = "Upstream connections this proxy holds open to the back-end, by state.";
                enc.gauge(
                    "farside_upstream_conns",
                    conns,
                    &with("state", "idle"),
                    idle,
                );
                enc.gauge(
                    "farside_upstream_conns",
                    conns,
                    &with("state", "busy"),
                    open.saturating_sub(idle),
                );
                enc.gauge(
                    "farside_upstream_maxconn",
                    "Cap on this proxy's open connections to the back-end.",
                    lbl,
                    p.maxconn(i),
                );
            }
            enc.counter(
                "farside_upstream_shed_total",
                "Upstream connections closed (idle ones, or returning ones instead of pooling) because the back-end queued connections.",
                lbl,
                self.shed_total(i),
            );
            if let Some(e) = self.table.as_ref().and_then(|t| table::read(&**t, i)) {
                enc.counter(
                    "farside_monitor_read_errors_total",
                    "Failed region reads of the back-end's load record.",
                    lbl,
                    e.errors,
                );
                enc.gauge(
                    "farside_monitor_read_latency_ns",
                    "Round trip of the last region read, ns.",
                    lbl,
                    e.read_latency_ns,
                );
                enc.gauge(
                    "farside_monitor_record_age_ns",
                    "Time since the back-end's load record last advanced, ns.",
                    lbl,
                    now.saturating_sub(e.advanced_mono_ns),
                );
                enc.gauge(
                    "farside_monitor_conns_interval_ns",
                    "Back-end gatherer's connection-counting interval as seen between its last two counts, ns (0: not yet seen); a count this old is due, not stale.",
                    lbl,
                    e.conns_interval_ns,
                );
            }
            self.render_backend_view(enc, i, lbl, now);
            if let Some(st) = self.monitor.as_ref().and_then(|m| m.stats(i)) {
                st.read.render(
                    enc,
                    "farside_monitor_read_seconds",
                    "Round trip of the embedded monitor's successful region reads.",
                    lbl,
                );
                st.update_gap.render(
                    enc,
                    "farside_monitor_update_gap_seconds",
                    "Time between two monitor reads that each found a new load record.",
                    lbl,
                );
            }
        }
    }
}
