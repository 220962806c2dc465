//! The bottom crate of system helpers: what several farside tiers need from the kernel
//! and none of them owns. It depends on nothing of farside, so that any crate can use
//! it.
//!
//! - [`clock`]: the clocks ([`mono_ns`], [`coarse_mono_ns`]) and a drift-free
//!   [`Pacer`] for periodic threads (the remote-memory layer, the monitor, gatherd's
//!   sampler, the proxy, the lab's prober).
//! - [`thread`]: the calling thread's and process's CPU time ([`thread_cpu_ns`],
//!   [`thread_cpu_us`], [`process_cpu_ns`]) and per-thread priority
//!   ([`set_thread_nice`], [`apply_thread_nice`]).
//! - [`sockaddr`]: `SocketAddr` to and from the C socket addresses raw socket calls use.
//! - [`sockdiag`]: counting a server's TCP connections with netlink `sock_diag`
//!   (gatherd's sampler, specd's load).
//! - [`pidfd`]: taking a descriptor from another process (specd takes the local web
//!   server's listener).
//! - [`fdpass`]: passing descriptors over Unix sockets (`SCM_RIGHTS`).
//! - [`rundir`]: runtime and state files in shared places that no local user can
//!   steer: checked directories, `O_NOFOLLOW | O_EXCL` creates, checked opens,
//!   atomic writes.

pub mod clock;
pub mod fdpass;
pub mod pidfd;
pub mod rundir;
pub mod sockaddr;
pub mod sockdiag;
pub mod thread;

pub use clock::{coarse_mono_ns, mono_ns, Pacer};
pub use thread::{
    apply_thread_nice, process_cpu_ns, set_thread_nice, thread_cpu, thread_cpu_ns, thread_cpu_us,
};
