//! The verbs back-end: the verbs-shaped API of `farside_iwarp` (protection domain,
//! memory regions, an RC queue pair, its completion queue) over a real RDMA device (an
//! iWARP or RoCE RNIC, Linux siw or rxe), through rdma-core loaded at run time.
//!
//! ```text
//!  sys.rs     rdma-core's ABI: dlopen of libibverbs.so.1 and librdmacm.so.1, the
//!             structs this crate passes or reads, the inline post/poll calls through
//!             the context's ops
//!  device.rs  the host's devices; a probe that opens one and allocates a PD
//!  conn.rs    one connection: rdma_cm connect/accept, regions, Write, Read, Send,
//!             receives, completions (`Conn`, `Listener`)
//! ```
//!
//! Nothing is linked at build time, so building this crate (and the `verbs` feature of
//! the crates that use it) needs no RDMA library; a host without rdma-core, or without
//! a device, gets an [`Error`] that says which, and the caller falls back to the
//! software stack.

pub mod conn;
pub mod device;
pub mod sys;

pub use conn::{Conn, Listener};
pub use device::{devices, probe, DeviceInfo, Transport};

use std::fmt;

/// Why a verbs operation could not be done.
#[derive(Debug)]
pub enum Error {
    /// rdma-core is not installed (or lacks a function).
    Load(sys::LoadError),
    /// No RDMA device, or not the one asked for; the devices there are.
    NoDevice {
        wanted: Option<String>,
        found: Vec<String>,
    },
    /// A verbs or rdma_cm call failed (errno).
    Call(&'static str, std::io::Error),
    /// The connection manager reported something else than the step waited for.
    Cm { step: &'static str, got: String },
    /// A step did not finish in time.
    Timeout(&'static str),
    /// A bound or a check of the verbs API (the software stack's).
    Verbs(farside_iwarp::verbs::VerbsError),
}

impl Error {
    /// A failed call, with the errno it left.
    pub(crate) fn call(what: &'static str) -> Error {
        Error::Call(what, std::io::Error::last_os_error())
    }

    /// `Ok` for a verb that returned 0, else its return value as the errno it is
    /// (`ibv_post_send`/`ibv_post_recv` return it rather than set `errno`).
    pub(crate) fn returned(what: &'static str, r: std::os::raw::c_int) -> Result<(), Error> {
        if r == 0 {
            Ok(())
        } else {
            Err(Error::Call(what, std::io::Error::from_raw_os_error(r)))
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(e) => write!(f, "rdma-core: {e}"),
            Error::NoDevice { wanted, found } => {
                match wanted {
                    Some(w) => write!(f, "no RDMA device {w:?}")?,
                    None => f.write_str("no RDMA device")?,
                }
                if found.is_empty() {
                    f.write_str(" (0 devices: no RNIC, and no siw or rxe link)")
                } else {
                    write!(f, " (devices: {})", found.join(", "))
                }
            }
            Error::Call(what, e) => write!(f, "{what}: {e}"),
            Error::Cm { step, got } => write!(f, "rdma_cm {step}: got {got}"),
            Error::Timeout(what) => write!(f, "{what}: timed out"),
            Error::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}
