//! The blind front-end of seed 002: an eBPF program on the
//! front-end node's LAN interface that routes each new TCP flow to the VIP to a
//! back-end by weighted hash of its 4-tuple and keeps a flow table, so that a
//! migrated connection's later packets reach its new node. L2 direct server return
//! (LVS-DR, Katran's L2 mode): the VIP is on every back-end's loopback, the program
//! rewrites only the destination (and source) MAC and sends the frame back out,
//! replies go from the back-end straight to the client. See `docs/frontend.md`.
//!
//! - [`table`]: the weight table (Maglev) and the 4-tuple hash (SipHash under a
//!   secret key) of the paper's sub-optimal routing, pure and unit-tested;
//! - [`Frontend`]: load, configure, attach (tc ingress), and the map operations;
//! - [`control`]: the control port (`MOVE`, `HOLD`, `RELEASE`, `FLOW`, `WEIGHTS`,
//!   `STATS`) on a Unix socket or TCP, and its [`control::Client`];
//! - [`control_auth`]: the sealed `AUTH` lines a TCP control port takes;
//! - [`fmove`]: the one-sided MOVE, a UDP request the program answers (and, with a
//!   key, authenticates) in the kernel, and its [`fmove::MoveClient`];
//! - [`pin`]: maps pinned on bpffs, so a restarted front-end keeps its flows;
//! - [`cli`]: `farside frontend`.
//!
//! Trust boundaries: only SYNs create flow entries; migrated flows live in a bounded
//! table traffic cannot evict; holds expire; the hash key is secret; the MOVE is
//! authenticated with `--key-file` and accepted only on the move interface; control
//! is best on a 0600 Unix socket; on TCP every request is sealed with the same key
//! (a TCP control port without one is refused).
//!
//! Everything but [`table`] needs CAP_BPF and CAP_NET_ADMIN (root in practice).

mod backend;
pub mod cli;
pub mod control;
pub mod control_auth;
pub mod fmove;
mod loader;
mod maps;
pub mod pin;
pub mod table;

pub use backend::{format_mac, parse_mac, parse_weights, validate_backends, BackendSpec};
pub use loader::{
    detach_iface, iface_ipv4, iface_mac_index, verdict, BackendReport, Frontend, FrontendError,
    Stats, HOLD_TTL_DEFAULT, HOLD_TTL_MAX, MOVED_IDLE_MAX,
};
pub use maps::{
    BACKENDS_MAX, COUNTERS, COUNTER_NAMES, FLOWS_MAX, KEYS_MAX, MOVED_MAX, REPLAY_MAX,
    SEEN_REFRESH_NS, SLOTS,
};

/// True if this process runs as root (the live tests need it).
pub use farside_bpfrt::is_root;
