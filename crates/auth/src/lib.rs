//! Trust boundaries between farside components (DESIGN.md "Trust model"): the cluster
//! network is shared with tenants, so no message is trusted for its source address.
//! Every control and one-sided message between components (rmem requests and replies,
//! the XDP path included; specd's migration protocol; the front-end's MOVE datagram and
//! control port; gatherd's notifications) is to carry an envelope with a SipHash-2-4
//! tag under a key only the parties hold, the key's id (so keys rotate without
//! downtime) and a sequence number (against replay); what it may do is limited by its
//! key's rights, per region and per operation, as RDMA scopes an rkey.
//!
//! ```text
//!  sender                                   receiver
//!  keys::Keyring::current(name) ─┐          keys::load_key (credential file, 0600)
//!  replay::Sequencer::next ──────┤                 │
//!  mac::seal(domain, ...) ───────┴─► bytes ─► receive::receive(domain, bytes, ring, table)
//!                                              mac::parse ─► key by id ─► verify tag
//!                                              ─► replay::ReplayTable::accept
//!                                           rights::check(key's rights, op, offset, len)
//! ```
//!
//! - [`siphash`]: SipHash-2-4, checked against the paper's vectors; `bpf/auth_siphash.h`
//!   is its BPF twin (tests compare them through BPF_PROG_TEST_RUN).
//! - [`mac`]: the 32-byte envelope, domain labels, sealing and constant-time opening.
//! - [`replay`]: per-(key id, sender) windows (RFC 6479), bounded with a safe eviction
//!   rule; the sender's restart-safe sequence numbers.
//! - [`floor`]: the receiver's restart-safe side: a persisted ceiling, and the floor a
//!   restarted receiver starts with, so nothing accepted before a restart is accepted
//!   after it.
//! - [`keys`]: key files and systemd credentials, refusal of exposed, weak and example
//!   keys, the keyring (current and previous key per name, revocation).
//! - [`rights`]: per-region, per-operation grants on named word ranges; agent-owned
//!   words are never remotely writable.
//! - [`receive`]: the receiving steps in their one safe order.
//!
//! Everything here is pure, or reads only the key files it is given and writes only
//! the replay state file it is given ([`floor`]).

pub mod floor;
pub mod keys;
pub mod mac;
pub mod receive;
pub mod replay;
pub mod rights;
pub mod siphash;
