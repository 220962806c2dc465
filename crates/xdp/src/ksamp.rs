//! The kernel-resident load sampler (`bpf/ksamp.bpf.c`): keeps the load record in the
//! region map with no user-space process involved, so that with XDP a back-end's load
//! is published *and* read without scheduling anything on it.
//!
//! It lives in the responder's object (one region map) and is started on an
//! [`XdpResponder`](crate::XdpResponder) or a [`TestProgram`](crate::TestProgram) with
//! `start_kernel_sampler`. It needs BPF (CAP_BPF and CAP_PERFMON, the kernel's BTF),
//! not XDP: [`XdpResponder::load_for_sampler`](crate::XdpResponder::load_for_sampler)
//! creates the object's maps for a host that answers no udp in the kernel, and the
//! region map (`BPF_F_MMAPABLE`) is then the node's region all the same, mapped by
//! gatherd and by same-host shm readers. The programs: a tracepoint
//! (`sock:inet_sock_set_state`) keeps per-port counts of established connections with
//! atomic adds; another (`sock:sk_data_ready`)
//! learns the watched ports' listening sockets when they signal a queued connection,
//! and the record then carries their accept queue's length (`sk_ack_backlog`, read at
//! the offset the kernel's BTF gives); a `cpu-clock` perf event on every online CPU
//! samples each CPU's busy state, and the tick on the first online CPU (the writer),
//! every period, writes the record under the seqlock. The other CPUs tick every
//! [`other_stride`] periods ([`SAMPLER_OTHER_SPREAD`] × their count, rounded up to a
//! power of two: together at most one tick per [`SAMPLER_OTHER_SPREAD`] periods), so
//! the sampler's kernel time is about the writer's tick whatever the CPU count. Each queued connection's arrival time is kept
//! (a ring of [`SAMPLER_ARRIVALS_RING`] per listener), so the record also carries the
//! back-end's queueing delay (`queue_delay_us`, `FLAG_QUEUE_DELAY`): the age of the
//! oldest connection in a watched accept queue, fresh every tick, which the proxy's
//! `--metric delay` follows. It does not see a request accepted but not yet read (the
//! user-space sampler's dump does). See `bpf/ksamp.bpf.c` for the record's fields (CPU
//! pressure, pending connections, memory and inflight are not known in the kernel: 0,
//! flags clear).
//!
//! Counters are seeded after attaching from one count the caller supplies (gatherd: a
//! sock_diag dump), so they start from the sockets that exist. Events between the
//! caller's count and the seed write are kept (the seed is applied as a difference),
//! events that race the count itself may be counted twice or missed: the count is a few
//! microseconds long.
//!
//! Only sockets of the calling thread's network namespace count (the lab runs back-ends
//! on the same port in separate namespaces). Known limits: a listener that has not had a connection queued
//! since the sampler started is not known yet: its port's backlog is the seeded value
//! until then (stale if the server accepts the seeded connections before any new one
//! arrives). At most 16 listeners are read directly (`KSAMP_LISTENERS_MAX`).
//!
//! Cost: run [`enable_bpf_stats`] (or `sysctl kernel.bpf_stats_enabled=1`) and read
//! [`KernelSamplerCosts`] (kernel run time and run count per program, from
//! `farside_bpfrt`'s program statistics).

use crate::{config_error, Loaded, XdpError};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{PerfEvent, TracePoint};
use farside_bpfrt::btf::{Btf, VMLINUX_BTF};
use farside_bpfrt::{error_chain, Error};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// Most watched ports (`KSAMP_PORTS_MAX`).
pub const SAMPLER_PORTS_MAX: usize = 4;
/// CPUs whose busy state the sampler can hold (`KSAMP_CPUS_MAX`); a host with a higher
/// online CPU id is refused (the sampler falls back to user space).
pub const SAMPLER_CPUS_MAX: u32 = 256;
/// Weight of one tick in a CPU's busy average, as a shift (`KSAMP_EMA_SHIFT`).
pub const SAMPLER_EMA_SHIFT: u32 = 4;
/// The CPUs other than the writer tick together at most once every this many periods
/// (`KSAMP_OTHER_SPREAD`): a tick costs ~0.65 µs of kernel time (measured with BPF
/// statistics, 2 CPUs at 1 ms: 1.3 µs per period), so ticking every CPU every period
/// cost 0.13% of a core on 2 CPUs and grows with the CPU count; at 4 the other CPUs add
/// at most a quarter of one tick per period on any host. They only sample their busy
/// state, which feeds `cpu_util_ppm` and `runnable`; the writer's tick publishes every
/// period and reads the accept queues and connection counts itself, so those fields
/// stay as fresh as before.
pub const SAMPLER_OTHER_SPREAD: u32 = 4;

/// Period multiple at which the CPUs other than the writer tick, with `cpus` online
/// CPUs: [`SAMPLER_OTHER_SPREAD`] × (cpus − 1) rounded up to a power of two (1 with one
/// CPU: it is the writer).
pub fn other_stride(cpus: u32) -> u32 {
    if cpus <= 1 {
        return 1;
    }
    (SAMPLER_OTHER_SPREAD * (cpus - 1)).next_power_of_two()
}

/// The busy-average shift of an other CPU's tick at `stride` ([`other_stride`]):
/// [`SAMPLER_EMA_SHIFT`] − log2(stride), at least 0, so that its average has the writer's
/// time constant in time (16 periods) while the stride is at most 16; above, a CPU's
/// value is its last tick's (busy or idle), up to `stride` periods old, and the host's
/// utilisation is the mean over CPUs sampled at different instants.
pub fn other_ema_shift(stride: u32) -> u32 {
    SAMPLER_EMA_SHIFT.saturating_sub(stride.max(1).ilog2())
}
/// Listening sockets whose accept queue the sampler reads directly
/// (`KSAMP_LISTENERS_MAX`): SO_REUSEPORT groups of up to 16 across the watched ports.
pub const SAMPLER_LISTENERS_MAX: usize = 16;
/// Arrival times kept per listener (`KSAMP_ARRIVALS_RING`) to find the age of its accept
/// queue's head, the published `queue_delay_us`; a longer queue reads as the oldest kept
/// arrival's age (a lower bound). 64 covers twice a 16-worker back-end's queue at the
/// limits admission keeps.
pub const SAMPLER_ARRIVALS_RING: usize = 64;
/// Shortest tick period: a perf cpu-clock tick on every CPU every 100 µs is already
/// 10,000 program runs per second per CPU.
pub const SAMPLER_PERIOD_MIN: Duration = Duration::from_micros(100);

const PROG_TICK: &str = "ksamp_tick";
const PROG_STATE: &str = "ksamp_state";
const PROG_READY: &str = "ksamp_ready";
const MAP_CONFIG: &str = "ksamp_config";
const MAP_COUNTS: &str = "ksamp_counts";
/// The sampler as errors name it.
const LABEL: &str = "the kernel sampler";
/// tracefs' mount point (Linux 4.1+). Attaching a tracepoint reads its id under
/// `events/`, from here or from debugfs' `tracing` (aya looks in both).
const TRACEFS: &str = "/sys/kernel/tracing";
const TRACEFS_IN_DEBUGFS: &str = "/sys/kernel/debug/tracing";

/// Mounts tracefs at [`TRACEFS`] if it is mounted at neither place. systemd mounts it at
/// boot, but a container or a minimal host may not, and without it the tracepoints
/// cannot be attached: the sampler fell back to user space, which costs the node a
/// thread woken every period (seen on a lab host: 1.2-1.5 ms/s of each back-end's
/// 200 ms/s quota, and samples 60-150 ms late while the node was throttled). Root
/// only, as the sampler is; the mount is the standard one and stays for other tools.
fn ensure_tracefs() -> Result<(), XdpError> {
    let populated = |p: &str| {
        std::fs::read_dir(p)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    };
    if populated(TRACEFS) || populated(TRACEFS_IN_DEBUGFS) {
        return Ok(());
    }
    // SAFETY: NUL-terminated constant strings, no data argument.
    let r = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            return Err(Error::NoPrivilege {
                program: LABEL,
                step: format!(
                    "mounting tracefs on {TRACEFS} (not mounted; mount it at boot: \
                     tracefs {TRACEFS} tracefs defaults 0 0 in /etc/fstab)"
                ),
            });
        }
        return Err(load_error(format!(
            "tracefs is not mounted and mounting it on {TRACEFS} failed: {e} \
             (mount it: mount -t tracefs nodev {TRACEFS})"
        )));
    }
    log::info!("xdp: mounted tracefs on {TRACEFS} (the kernel sampler's tracepoints need it)");
    Ok(())
}

/// Value of the `ksamp_config` map (struct ksamp_config).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Config {
    ports: [u16; SAMPLER_PORTS_MAX],
    ncpu: u32,
    writer_cpu: u32,
    off_num: u32,
    off_state: u32,
    off_ack_backlog: u32,
    off_net: u32,
    off_net_inum: u32,
    netns_inum: u32,
    other_stride: u32,
    other_ema_shift: u32,
}
// SAFETY: repr(C), plain integers, no padding (8 + 10 * 4 bytes).
unsafe impl aya::Pod for Config {}

/// Value of the `ksamp_counts` map (struct ksamp_counts).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Counts {
    established: [i64; SAMPLER_PORTS_MAX],
    backlog: [i64; SAMPLER_PORTS_MAX],
}
// SAFETY: repr(C), plain integers, no padding.
unsafe impl aya::Pod for Counts {}

/// Connection counts of one watched port, as a seed for the kernel counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounts {
    pub established: u64,
    pub backlog: u64,
}

/// Kernel CPU spent by one sampler program (zero unless BPF stats are enabled): the
/// BPF runtime's per-program statistics.
pub type ProgCost = farside_bpfrt::ProgStats;

/// Kernel cost of the sampler's programs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelSamplerCosts {
    /// The per-CPU tick (the writer's every period, writing the record; each other
    /// CPU's every `other_stride` periods).
    pub tick: ProgCost,
    /// The TCP state-change tracepoint (one run per state change of any TCP socket).
    pub state: ProgCost,
    /// The data-ready tracepoint (one run per data-ready wakeup of any TCP socket).
    pub ready: ProgCost,
    /// CPUs ticking.
    pub cpus: u32,
    /// Periods between two ticks of a CPU other than the writer ([`other_stride`]).
    pub other_stride: u32,
}

impl KernelSamplerCosts {
    /// Ticks per period, all CPUs: the writer's one and the others' share.
    pub fn ticks_per_period(&self) -> f64 {
        1.0 + f64::from(self.cpus.saturating_sub(1)) / f64::from(self.other_stride.max(1))
    }

    /// Kernel ns spent per published record on ticks: every CPU's ticks of one period.
    pub fn tick_ns_per_sample(&self) -> f64 {
        self.tick.ns_per_run() * self.ticks_per_period()
    }

    /// Records published so far (the writer's ticks), from the ticks counted.
    pub fn records(&self) -> u64 {
        (self.tick.run_count as f64 / self.ticks_per_period()).round() as u64
    }
}

/// Turn on the kernel's BPF run-time statistics while the returned fd is open
/// (`BPF_ENABLE_STATS`; costs two clock reads per program run).
pub fn enable_bpf_stats() -> Result<OwnedFd, XdpError> {
    farside_bpfrt::enable_stats(LABEL)
}

/// A failure of the sampler's set-up (its programs, the kernel's BTF, the namespace).
fn load_error(detail: String) -> XdpError {
    Error::Load {
        program: LABEL,
        detail,
    }
}

/// A running kernel sampler: which CPUs tick, and the ticks' links (owned here so
/// that [`SamplerState::stop_ticks`] needs no `&mut`: dropping a link detaches it).
#[derive(Debug)]
pub(crate) struct SamplerState {
    cpus: u32,
    other_stride: u32,
    ticks: std::sync::Mutex<Vec<aya::programs::perf_event::PerfEventLink>>,
}

impl SamplerState {
    /// Detach every tick: the record stops advancing (the event programs keep counting).
    pub(crate) fn stop_ticks(&self) {
        self.ticks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
}

impl Loaded {
    /// Load and attach the sampler's programs, seed the counters with `seed()` (one
    /// entry per port, in `ports` order), then start the ticks. On error nothing stays
    /// attached, so the caller may fall back to a user-space writer.
    pub(crate) fn start_kernel_sampler(
        &mut self,
        ports: &[u16],
        period: Duration,
        seed: &mut dyn FnMut() -> std::io::Result<Vec<PortCounts>>,
    ) -> Result<SamplerState, XdpError> {
        if ports.len() > SAMPLER_PORTS_MAX {
            return Err(config_error(format!(
                "kernel sampler: {} watched ports, at most {SAMPLER_PORTS_MAX}",
                ports.len()
            )));
        }
        if period < SAMPLER_PERIOD_MIN {
            return Err(config_error(format!(
                "kernel sampler: period {period:?}, at least {SAMPLER_PERIOD_MIN:?}"
            )));
        }
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| load_error(format!("{what}: {e}")))?;
        let max_cpu = cpus.iter().copied().max().unwrap_or(0);
        if max_cpu >= SAMPLER_CPUS_MAX {
            return Err(config_error(format!(
                "kernel sampler: CPU id {max_cpu}, the sampler holds ids below {SAMPLER_CPUS_MAX}"
            )));
        }
        let mut lap = crate::Lap::new();
        let btf = Btf::kernel().map_err(load_error)?;
        let off = |path: &[&str]| {
            btf.offset_of("sock", path).ok_or_else(|| {
                load_error(format!(
                    "no struct sock field {} in {VMLINUX_BTF}",
                    path.join(".")
                ))
            })
        };
        let stride = other_stride(cpus.len() as u32);
        let mut cfg = Config {
            ncpu: max_cpu + 1,
            other_stride: stride,
            other_ema_shift: other_ema_shift(stride),
            writer_cpu: cpus.first().copied().unwrap_or(0),
            off_num: off(&["__sk_common", "skc_num"])?,
            off_state: off(&["__sk_common", "skc_state"])?,
            off_ack_backlog: off(&["sk_ack_backlog"])?,
            off_net: off(&["__sk_common", "skc_net"])?,
            off_net_inum: btf.offset_of("net", &["ns", "inum"]).ok_or_else(|| {
                load_error(format!("no struct net field ns.inum in {VMLINUX_BTF}"))
            })?,
            netns_inum: own_netns_inum()?,
            ..Default::default()
        };
        cfg.ports[..ports.len()].copy_from_slice(ports);
        lap.stage("ksamp_btf");
        self.obj
            .array_set(MAP_CONFIG, 0, cfg, "configuring the kernel sampler")?;
        self.write_counts(Counts::default())?;

        // Event programs first (they only change counters), the ticks last: the record
        // is written only once everything else is in place.
        let mut ticks = Vec::with_capacity(cpus.len());
        let result = self.attach_sampler(
            ports,
            period,
            (&cpus, cfg.writer_cpu, stride),
            seed,
            &mut ticks,
            &mut lap,
        );
        self.stages.append(&mut lap.stages);
        if result.is_err() {
            ticks.clear();
            self.stop_kernel_sampler();
        }
        result.map(|()| SamplerState {
            cpus: cpus.len() as u32,
            other_stride: stride,
            ticks: std::sync::Mutex::new(ticks),
        })
    }

    fn attach_sampler(
        &mut self,
        ports: &[u16],
        period: Duration,
        (cpus, writer, stride): (&[u32], u32, u32),
        seed: &mut dyn FnMut() -> std::io::Result<Vec<PortCounts>>,
        ticks: &mut Vec<aya::programs::perf_event::PerfEventLink>,
        lap: &mut crate::Lap,
    ) -> Result<(), XdpError> {
        let attach_err = |p: &str, e: aya::programs::ProgramError| {
            Error::classify(LABEL, &format!("attaching {p}"), &e, |_| {
                load_error(format!("{p}: {}", error_chain(&e)))
            })
        };
        ensure_tracefs()?;
        let tp: &mut TracePoint = self.obj.load_program(PROG_STATE)?;
        tp.attach("sock", "inet_sock_set_state")
            .map_err(|e| attach_err(PROG_STATE, e))?;
        let tp: &mut TracePoint = self.obj.load_program(PROG_READY)?;
        tp.attach("sock", "sk_data_ready")
            .map_err(|e| attach_err(PROG_READY, e))?;

        // The tick verified before the seed: the seed callback may hand the record over
        // from a user-space writer, and the record is not written between that and the
        // first tick, so that gap must not hold a verification.
        self.obj.load_program::<PerfEvent>(PROG_TICK)?;
        lap.stage("ksamp_events");
        // Seed: the caller's count, applied as a difference so that events counted by
        // the programs since `before` are kept.
        let before = self.read_counts()?;
        let counted = seed().map_err(|e| config_error(format!("kernel sampler seed: {e}")))?;
        let now = self.read_counts()?;
        let mut c = now;
        for (i, pc) in counted.iter().take(ports.len()).enumerate() {
            c.established[i] += pc.established as i64 - before.established[i];
            c.backlog[i] += pc.backlog as i64 - before.backlog[i];
        }
        self.write_counts(c)?;
        lap.stage("ksamp_seed");

        let pe: &mut PerfEvent = self.obj.program_mut(PROG_TICK)?;
        for &cpu in cpus {
            let every = if cpu == writer { 1 } else { u64::from(stride) };
            let id = pe
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period.as_nanos() as u64 * every),
                    false,
                )
                .map_err(|e| attach_err(PROG_TICK, e))?;
            ticks.push(pe.take_link(id).map_err(|e| attach_err(PROG_TICK, e))?);
        }
        lap.stage("ksamp_ticks");
        Ok(())
    }

    /// Detach and unload every sampler program (the record stops advancing).
    pub(crate) fn stop_kernel_sampler(&mut self) {
        for name in [PROG_TICK, PROG_READY, PROG_STATE] {
            if let Some(p) = self.obj.ebpf_mut().program_mut(name) {
                // Unloading detaches every link of the program; not loaded is fine.
                let _ = match p {
                    aya::programs::Program::PerfEvent(p) => p.unload(),
                    aya::programs::Program::TracePoint(p) => p.unload(),
                    _ => Ok(()),
                };
            }
        }
    }

    fn read_counts(&mut self) -> Result<Counts, XdpError> {
        self.obj.array_get(MAP_COUNTS, 0)
    }

    fn write_counts(&mut self, c: Counts) -> Result<(), XdpError> {
        self.obj
            .array_set(MAP_COUNTS, 0, c, "seeding the kernel sampler")
    }

    /// Kernel run time and count of the sampler's programs.
    pub(crate) fn sampler_costs(&self, state: &SamplerState) -> KernelSamplerCosts {
        let cost = |name: &str| self.obj.program_stats(name).unwrap_or_default();
        KernelSamplerCosts {
            tick: cost(PROG_TICK),
            state: cost(PROG_STATE),
            ready: cost(PROG_READY),
            cpus: state.cpus,
            other_stride: state.other_stride,
        }
    }
}

/// The sampler's programs by name, as [`crate::XdpResponder::program_stats`] lists them.
pub(crate) const PROGRAMS: [&str; 3] = [PROG_TICK, PROG_STATE, PROG_READY];

/// Inode number of the calling thread's network namespace: the sampler counts only
/// sockets of this namespace.
fn own_netns_inum() -> Result<u32, XdpError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| load_error(format!("/proc/thread-self/ns/net: {e}")))?;
    u32::try_from(m.ino()).map_err(|_| load_error(format!("netns inode {} > u32", m.ino())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_values_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<Config>(), 48);
        assert_eq!(std::mem::size_of::<Counts>(), 64);
    }

    #[test]
    fn the_other_cpus_tick_at_most_once_per_spread_with_the_time_constant_kept() {
        assert_eq!(other_stride(1), 1);
        assert_eq!(other_stride(2), 4);
        assert_eq!(other_stride(3), 8);
        assert_eq!(other_stride(4), 16);
        assert_eq!(other_stride(64), 256);
        for cpus in 2..=SAMPLER_CPUS_MAX {
            let k = other_stride(cpus);
            assert!(k.is_power_of_two());
            // The others together: at most one tick per SAMPLER_OTHER_SPREAD periods.
            assert!(f64::from(cpus - 1) / f64::from(k) <= 1.0 / f64::from(SAMPLER_OTHER_SPREAD));
            // Weight k / 16 per tick (one in 16 per period at the writer's), capped at 1.
            let shift = other_ema_shift(k);
            assert_eq!(
                1u32 << (SAMPLER_EMA_SHIFT - shift),
                k.min(1 << SAMPLER_EMA_SHIFT)
            );
        }
        let c = KernelSamplerCosts {
            tick: ProgCost {
                run_time_ns: 1_250_000,
                run_count: 1250,
            },
            cpus: 2,
            other_stride: 4,
            ..Default::default()
        };
        // 1,000 records and 250 ticks of the other CPU: 1,000 ns per run, 1,250 per record.
        assert_eq!(c.records(), 1000);
        assert!((c.tick_ns_per_sample() - 1250.0).abs() < 1e-9);
    }
}
