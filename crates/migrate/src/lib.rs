//! TCP connection endpoint migration (seed 002): move the server
//! side of an established connection to another socket — another process, namespace
//! or host — invisibly to the client, with Linux TCP_REPAIR.
//!
//! - [`dump`]: freeze a socket (input filter + repair mode) and read its full state
//!   ([`TcpState`]), refusing what it cannot read completely; resume it or close it
//!   silently.
//! - [`mod@restore`]: rebuild a socket from a [`TcpState`], kept frozen ([`Frozen`]) until
//!   the source has moved the flow.
//! - [`wire`]: the versioned, bounded encoding of the hand-over messages, and why the
//!   decoder refuses its input ([`WireError`]).
//! - [`hold`]: the flow hold of a same-namespace hand-over ([`FlowHold`]): an
//!   sk_lookup program that drops a migrating connection's segments silently while
//!   no socket has its 4-tuple (instead of the listener's RST).
//! - [`drain`]: the source's flow drain off the migrating thread ([`Reaper`]: frozen
//!   sockets closed at their deadline by one thread per [`ControlPool`]).
//! - [`proto`]: the source/target hand-over ([`migrate`], [`migrate_with`] which moves
//!   the front-end's flow between restore and close, [`Target`]) with the paper's
//!   fall-back: refused or failed migrations resume on the source.
//!
//! - `testkit` (cargo feature `testkit`, for tests and the `migrate_many` bench): the
//!   shared migration session, namespaces and the many-connection bench core.
//!
//! TCP_REPAIR needs CAP_NET_ADMIN. The protocol and failure cases are described in
//! `docs/migrate.md`.

mod bufs;
pub mod drain;
pub mod dump;
pub mod error;
pub mod hold;
pub mod proto;
pub mod restore;
pub mod state;
mod sys;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod wire;

pub use drain::{DrainStats, Reaper};
pub use dump::{close_silently, freeze_and_dump, resume};
pub use error::{DumpError, Queue};
pub use hold::{FlowHold, Held};
pub use proto::{
    migrate, migrate_with, serve_conn, ControlConn, ControlPool, Fallback, Handover, MigrateConfig,
    Outcome, Ready, Target, TargetOutcome, Timings,
};
pub use restore::{restore, restore_frozen, Frozen};
pub use state::{RepairWindow, TcpOptions, TcpState, QUEUE_BYTES_MAX};
pub use wire::WireError;
