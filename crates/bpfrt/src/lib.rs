//! The BPF user-space runtime: what every crate that embeds a BPF program
//! (`bpf/*.bpf.c`, compiled by `farside-bpfbuild` at build time) does with it, in one
//! place.
//!
//! - [`Object`]: load a clang-built object (maps created, no kernel BTF), find its
//!   programs by name and type and verify them ([`Object::load_program`]: a verifier
//!   refusal keeps its log), read and write its maps through aya's typed views with
//!   errors naming the map ([`Object::array_get`], [`Object::array_set`],
//!   [`Object::typed`]), sum per-CPU counters ([`Object::per_cpu_sum`]), run a program
//!   on a frame with BPF_PROG_TEST_RUN ([`Object::test_run`]);
//! - attach ([`Object::attach_xdp`] in an [`XdpMode`], [`Object::attach_tc_ingress`],
//!   [`Object::attach_sk_lookup`]) and detach;
//! - [`RawMap`]: element commands through a map's own descriptor, from `&self` and
//!   any thread (flow holds, socket maps);
//! - [`MmapArray`]: a `BPF_F_MMAPABLE` array map shared with user space;
//! - [`ProgStats`]: a loaded program's run time and count ([`Object::program_stats`];
//!   kept while [`stats_enabled`], or turned on with [`enable_stats`]);
//! - [`btf`]: field offsets of kernel structures from the running kernel's BTF, for
//!   programs that read kernel memory without CO-RE;
//! - [`Error`]: one error vocabulary (no privilege, load/verify with the verifier's
//!   log, missing program or map, no interface, attach, map, system call, bad
//!   arguments, test run), each naming the program and the step.
//!
//! The programs' specifics (map layouts, names, packet tests) stay in their crates:
//! `farside-xdp` (the rmem responder, the kernel sampler), `farside-frontend` (the tc
//! front-end), `farside-migrate` (the flow hold), `farside-specd` (steering) and
//! `farside-monitor` (AF_XDP receive). Everything here but [`btf`] parsing needs
//! CAP_BPF and CAP_NET_ADMIN (root in practice).

mod attach;
pub mod btf;
mod error;
mod mmap;
mod object;
mod rawmap;
mod stats;

pub use attach::XdpMode;
pub use error::{error_chain, is_permission_error, Error, Result};
pub use mmap::MmapArray;
pub use object::{Loadable, Object, TestOutcome, TEST_FRAME_BYTES_MAX};
pub use rawmap::{flags, RawMap};
pub use stats::{enable_stats, stats_enabled, ProgStats, STATS_SYSCTL};

/// True if this process runs as root (the root tests skip otherwise).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Index of interface `ifname` in the calling thread's network namespace.
pub fn ifindex(ifname: &str) -> Result<u32> {
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ {
        return Err(Error::NoInterface(ifname.to_string()));
    }
    let c = std::ffi::CString::new(ifname).map_err(|_| Error::NoInterface(ifname.to_string()))?;
    // SAFETY: if_nametoindex reads a NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(Error::NoInterface(ifname.to_string()));
    }
    Ok(i)
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`, for deadlines
/// user space writes into maps (the system helpers' clock, named for its BPF use).
pub fn ktime_ns() -> u64 {
    farside_rt::mono_ns()
}
