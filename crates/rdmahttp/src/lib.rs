//! RDMA over HTTP, after Dalessandro and Wyckoff, "Accelerating Web Protocols Using
//! RDMA" (NCA 2007): a GET names an RDMA endpoint in an `RDMA:` header and the body
//! moves over the software iWARP stack ([`farside_iwarp`]) instead of the HTTP
//! connection. A client that does not ask, or a request the server will not take that
//! way, gets an ordinary body: the header never makes a request fail.
//!
//! - [`header`]: the `RDMA:` request and response fields, a pure grammar.
//! - [`caps`]: the server's limits (sizes, transfers at once, registered bytes).
//! - [`registration`]: dynamic, static, or a cache of registered files.
//! - [`server`]: the server side, server-writes and client-reads (the back-end's);
//!   [`link`]: its RDMA connections, on the software stack or (feature `verbs`) a real
//!   RDMA device.
//! - [`client`]: one GET that asks for RDMA and takes whatever comes (`farside get`,
//!   [`cli`]).
//! - [`session`]: a client that keeps its HTTP and RDMA connections across requests
//!   (`farside loadgen --rdma`).
//! - [`arena`], [`arena_read`]: arena-reads, bodies in the node's object arena read
//!   one-sidedly by the client with READs the kernel answers (XDP): the server side
//!   (puts, hints) and the pipelined, validating reader.
//! - [`regbench`]: what one registration costs, per strategy (`farside lab rdma-http`'s
//!   Table 1).

pub mod arena;
pub mod arena_read;
pub mod caps;
pub mod cli;
pub mod client;
pub mod grant;
pub mod header;
pub mod link;
pub mod regbench;
pub mod registration;
pub mod server;
pub mod session;

pub use cli::{run_get, GetArgs};
