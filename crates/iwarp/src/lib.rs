//! A software iWARP stack: RDMA over TCP as the seed paper's Apache module uses it
//! (Dalessandro and Wyckoff, "Accelerating Web Protocols Using RDMA", NCA 2007), wire
//! compatible with Linux siw and iWARP RNICs.
//!
//! ```text
//!  verbs (verbs.rs)    PD, MR (STag = index << 8 | key), CQ; bounded tables
//!        │
//!  queue pair (qp.rs)  RDMAP semantics: Write, Read Request/Response with ORD/IRD
//!        │             credits, Send/Send-SE, Terminate; DDP placement checks
//!        │
//!  RDMAP (rdmap.rs)    RFC 5040: opcodes, Read Request body, Terminate header
//!  DDP   (ddp.rs)      RFC 5041: tagged/untagged headers, segmentation
//!  MPA   (mpa/)        RFC 5044 + RFC 6581: Request/Reply and set-up (setup.rs),
//!                      FPDU framing (fpdu.rs), CRC32c (crc.rs)
//!        │
//!  TCP driver (tcp.rs) std::net::TcpStream, a reader and a writer thread per connection
//! ```
//!
//! Everything above the driver is sans-I/O: state machines fed with bytes that return
//! bytes to send and completions, so the protocol is tested without sockets. Refusals
//! are [`term::TermCode`]s, the Terminate codes of RFC 5040 §4.8 as Linux siw picks
//! them. [`decode`] and [`pcap`] turn a capture into one JSON line per message
//! (`farside iwarp decode`), to check captures of real peers against this stack.

#![forbid(unsafe_code)]

pub mod cli;
pub mod crc;
pub mod ddp;
pub mod decode;
pub mod mpa;
pub mod pcap;
pub mod qp;
pub mod rdmap;
pub mod tcp;
pub mod term;
pub mod verbs;

pub use cli::{run, IwarpArgs};
