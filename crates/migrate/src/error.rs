//! Why a connection was not dumped, restored or migrated. Each refusal is its own
//! variant: the daemon never migrates a connection whose state it could not fully
//! dump, and says which part it could not.

use std::fmt;
use std::io;

/// Which socket queue a [`DumpError`] concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// Bytes to send (unacknowledged and unsent).
    Send,
    /// Bytes received, not yet read by the application.
    Recv,
}

/// Why [`crate::dump`] refused a socket. After a refusal the socket is thawed again
/// and keeps working where it is.
#[derive(Debug)]
pub enum DumpError {
    /// Not an IPv4/IPv6 TCP socket.
    NotTcp,
    /// TCP state other than ESTABLISHED (value as in `tcp_info.tcpi_state`).
    NotEstablished(u8),
    /// Urgent (out-of-band) data announced or pending: not restorable.
    UrgentData,
    /// `SO_OOBINLINE` is set: urgent data cannot be detected.
    OobInline,
    /// `tcpi_options` bits this crate cannot restore (ECN, µs timestamps, …).
    UnknownOptions(u8),
    /// A queue is larger than [`crate::QUEUE_BYTES_MAX`].
    QueueTooLarge(Queue, usize),
    /// A queue could not be read completely.
    QueueIncomplete {
        /// Which queue.
        queue: Queue,
        /// Bytes the kernel said it holds.
        expected: usize,
        /// Bytes read.
        got: usize,
    },
    /// The state kept changing while being read (input not frozen).
    Unstable,
    /// A system call failed (TCP_REPAIR needs CAP_NET_ADMIN).
    Sys(io::Error),
}

impl fmt::Display for DumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotTcp => write!(f, "not a TCP/IP socket"),
            Self::NotEstablished(s) => write!(f, "TCP state {s} is not ESTABLISHED"),
            Self::UrgentData => write!(f, "urgent data pending"),
            Self::OobInline => write!(f, "SO_OOBINLINE set"),
            Self::UnknownOptions(o) => write!(f, "unknown TCP options 0x{o:02x}"),
            Self::QueueTooLarge(q, n) => write!(f, "{q:?} queue holds {n} bytes"),
            Self::QueueIncomplete {
                queue,
                expected,
                got,
            } => write!(f, "{queue:?} queue read {got} of {expected} bytes"),
            Self::Unstable => write!(f, "state changed during the dump"),
            Self::Sys(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DumpError {}

impl From<io::Error> for DumpError {
    fn from(e: io::Error) -> Self {
        Self::Sys(e)
    }
}
