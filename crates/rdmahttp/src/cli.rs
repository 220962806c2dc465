//! `farside get`: one GET, optionally asking for the body by RDMA; prints how it came,
//! its length and its digest, and writes the body to `--output`.

use crate::client::{self, GetOptions, Via};
use crate::header::Mode;
use crate::registration::Registration;
use std::path::PathBuf;
use std::time::Duration;

/// Default `--maxlen`: the server's default transfer cap.
pub const MAXLEN_DEFAULT: u64 = crate::caps::TRANSFER_BYTES_MAX_DEFAULT;

/// Command-line flags of `farside get`.
#[derive(Debug, Clone, clap::Args)]
pub struct GetArgs {
    /// The URL, http://HOST[:PORT]/PATH.
    pub url: String,
    /// Ask for the body by RDMA: server-writes (the server writes it into a region
    /// this client registered) or client-reads (this client reads it from the
    /// server). The body comes over TCP whenever the server does not take the request
    /// that way. Default: none, a plain GET.
    #[arg(long)]
    pub rdma: Option<Mode>,
    /// Largest body taken by RDMA, in bytes (server-writes registers a region this
    /// large). Default: 16 MiB.
    #[arg(long, default_value_t = MAXLEN_DEFAULT)]
    pub maxlen: u64,
    /// Bound on each wait (connect, answer, RDMA completion), in ms. Default: 10000.
    #[arg(long = "timeout-ms", default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Write the body to this file. Default: not written.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Ask for arena-reads instead of --rdma (`RDMA: arena-reads`): a body the server
    /// keeps in its kernel-answered object arena is read one-sidedly under this arena
    /// reader key, ID:PATH (a key file) or ID (the credential rmem-ID), and validated
    /// (seqlock and CRC32c). Default: off.
    #[arg(long = "arena-key", value_name = "ID[:PATH]", conflicts_with = "rdma")]
    pub arena_key: Option<String>,
}

/// Run `farside get`: prints `status=S bytes=N fnv1a64=H via=V[ declined=R]`.
pub fn run_get(a: GetArgs) -> Result<(), String> {
    let opts = GetOptions {
        mode: a.rdma,
        maxlen: a.maxlen,
        timeout: Duration::from_millis(a.timeout_ms.max(1)),
    };
    let got = match &a.arena_key {
        None => client::get(&a.url, &opts).map_err(|e| format!("{}: {e}", a.url))?,
        Some(spec) => {
            let key = farside_rmem::ClientKey::load(spec)?;
            let (addr, host, path) =
                client::parse_url(&a.url).map_err(|e| format!("{}: {e}", a.url))?;
            crate::session::Session::new(addr, &host, opts, false)
                .with_arena_key(key)
                .get(&path)
                .map_err(|e| format!("{}: {e}", a.url))?
                .fetched
        }
    };
    if let Some(path) = &a.output {
        std::fs::write(path, &got.body).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let declined = match got.via {
        Via::Tcp(Some(d)) => format!(" declined={}", d.token()),
        _ => String::new(),
    };
    println!(
        "status={} bytes={} fnv1a64={:016x} via={}{declined}",
        got.status,
        got.body.len(),
        client::fnv1a64(&got.body),
        got.via.token()
    );
    Ok(())
}

/// The server's RDMA flags (`farside backend --rdma ...`).
#[derive(Debug, Clone, clap::Args)]
pub struct RdmaServeArgs {
    /// Honour the `RDMA:` request header (server-writes, client-reads): move a GET's
    /// body over RDMA to the endpoint the client names, if it is the client's own
    /// address and within the caps below; otherwise, and without this flag, the body
    /// goes over TCP as usual. Default: off.
    #[arg(long)]
    pub rdma: bool,
    /// Largest body moved by RDMA, in bytes; larger ones go over TCP. Default: 16 MiB.
    #[arg(long = "rdma-transfer-bytes-max", default_value_t = crate::caps::TRANSFER_BYTES_MAX_DEFAULT)]
    pub transfer_bytes_max: u64,
    /// RDMA transfers at once; more go over TCP. Default: 8.
    #[arg(long = "rdma-transfers-max", default_value_t = crate::caps::TRANSFERS_MAX_DEFAULT)]
    pub transfers_max: usize,
    /// Bytes registered for RDMA transfers at once (the memlock budget); beyond it
    /// bodies go over TCP. Default: 64 MiB.
    #[arg(long = "rdma-registered-bytes-max", default_value_t = crate::caps::REGISTERED_BYTES_MAX_DEFAULT)]
    pub registered_bytes_max: u64,
    /// Time to connect to the client's RDMA endpoint, in ms, and again for the MPA
    /// set-up on that connection; then the body goes over TCP. Default: 1000.
    #[arg(long = "rdma-connect-timeout-ms", default_value_t = 1000)]
    pub connect_timeout_ms: u64,
    /// Time one transfer may take once connected, in ms (client-reads: until the
    /// client's done, after which the region is released anyway). Default: 10000.
    #[arg(long = "rdma-transfer-timeout-ms", default_value_t = 10_000)]
    pub transfer_timeout_ms: u64,
    /// How bodies get into registered memory: dynamic (a region per request, the body
    /// copied in), static (one region per RDMA connection of --rdma-transfer-bytes-max,
    /// held and counted for its life, the body copied in), cache (a file's contents
    /// registered once, shared by every connection until the file's size or mtime
    /// changes; under --rdma-registered-bytes-max). Default: dynamic.
    #[arg(long = "rdma-registration", value_enum, default_value_t = Registration::Dynamic)]
    pub registration: Registration,
    /// Answer `RDMA: arena-reads` (with --rdma): put file bodies into this process's
    /// object arena, a BPF map the rmem XDP responder (attached to IFACE, generic
    /// mode) answers one-sided READs from, and answer where the body is; the client
    /// reads it with no server process scheduled. No other XDP program may be attached
    /// to IFACE. Needs root. Default: off (arena-reads declined, not-offered).
    #[arg(long = "rdma-arena-iface", value_name = "IFACE")]
    pub arena_iface: Option<String>,
    /// Udp port of the arena responder. Default: 7300.
    #[arg(long = "rdma-arena-port", default_value_t = ARENA_PORT_DEFAULT)]
    pub arena_port: u16,
    /// The arena reader key, ID:PATH (a key file, 0600) or ID (the credential
    /// rmem-ID): clients must hold the same key; its rights are READ of the arena
    /// region only. Required with --rdma-arena-iface.
    #[arg(long = "rdma-arena-key", value_name = "ID[:PATH]")]
    pub arena_key: Option<String>,
    /// Run RDMA connections (server-writes, client-reads) on a real RDMA device through
    /// rdma-core, loaded at run time: NAME (as `ibv_devices` lists it: an iWARP RNIC, or
    /// siw, whose wire the software-iWARP clients speak) or `any` (the device that
    /// routes to each client). Without rdma-core or the device, and for a connection
    /// the device cannot make, the software iWARP stack is used (logged). Needs a build
    /// with the `verbs` feature. Default: the software iWARP stack.
    #[arg(long = "rdma-device", value_name = "NAME|any")]
    pub device: Option<String>,
    /// How the arena responder is attached to IFACE: generic (any interface; the
    /// request is copied into an skb with XDP headroom, any reply size the request was
    /// padded to) or native (in the driver: on a veth the peer must take XDP frames, GRO
    /// or an XDP program on it, and frames are at most a page, so bulk READs span at
    /// most two chunks and the link MTU must be at most 3,520 B). Default: generic.
    #[arg(long = "rdma-arena-xdp-mode", value_name = "MODE", default_value = "generic",
          value_parser = ["generic", "native"])]
    pub arena_xdp_mode: String,
    /// Direct readers (with --rdma-arena-iface): an arena-reads request that asks
    /// (`direct=1`) also gets a grant, a key derived from the arena reader key, bound
    /// to the client's address for 10 s and enforced by the XDP responder, and its file
    /// is published in the arena's index under its url path (static public files
    /// only: a 200 of a regular file under --root for a plain path; not with
    /// --sites-root). The client then resolves later urls with one-sided index READs,
    /// no request to this process; published files are re-checked every 200 ms and a
    /// changed one is unpublished. Default: off.
    #[arg(long = "rdma-arena-direct", requires = "arena_iface")]
    pub arena_direct: bool,
}

/// Default `--rdma-arena-port`.
pub const ARENA_PORT_DEFAULT: u16 = 7300;

impl Default for RdmaServeArgs {
    fn default() -> Self {
        let c = crate::caps::Caps::default();
        RdmaServeArgs {
            rdma: false,
            transfer_bytes_max: c.transfer_bytes_max,
            transfers_max: c.transfers_max,
            registered_bytes_max: c.registered_bytes_max,
            connect_timeout_ms: c.connect_timeout.as_millis() as u64,
            transfer_timeout_ms: c.transfer_timeout.as_millis() as u64,
            registration: Registration::Dynamic,
            arena_iface: None,
            arena_port: ARENA_PORT_DEFAULT,
            arena_key: None,
            device: None,
            arena_xdp_mode: "generic".into(),
            arena_direct: false,
        }
    }
}

impl RdmaServeArgs {
    /// The arena server these flags ask for, started (its responder attached), or
    /// `None` without --rdma-arena-iface.
    pub fn start_arena(&self) -> Result<Option<crate::arena::ArenaServer>, String> {
        let Some(iface) = &self.arena_iface else {
            return Ok(None);
        };
        if !self.rdma {
            return Err("--rdma-arena-iface needs --rdma".into());
        }
        let spec = self
            .arena_key
            .as_deref()
            .ok_or("--rdma-arena-iface needs --rdma-arena-key ID[:PATH]")?;
        let (id, path) = farside_rmem::ClientKey::parse_spec(spec)?;
        let keys = crate::arena::arena_keyring(id, path.as_deref())?;
        let mode = if self.arena_xdp_mode == "native" {
            farside_xdp::XdpMode::Native
        } else {
            farside_xdp::XdpMode::Generic
        };
        let mut arena = crate::arena::ArenaServer::start(iface, mode, self.arena_port, id, &keys)?;
        if self.arena_direct {
            let master = keys
                .get(farside_auth::mac::KeyId(id))
                .ok_or("arena key missing from its keyring")?
                .key;
            arena.enable_direct(master);
        }
        Ok(Some(arena))
    }

    /// The RDMA server these flags ask for (without its arena: [`Self::start_arena`]).
    /// With `--rdma-device`, its connections run on that device if it opens here, else
    /// on the software stack with a warning.
    pub fn server(&self) -> Result<crate::server::Server, String> {
        let server = crate::server::Server::new(self.caps(), self.registration);
        let Some(device) = &self.device else {
            return Ok(server);
        };
        #[cfg(feature = "verbs")]
        {
            let name = (device != "any").then(|| device.clone());
            Ok(server.with_verbs(name).0)
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = server;
            Err(format!(
                "--rdma-device {device}: this farside was built without the verbs back-end \
                 (cargo build -p farside --features verbs)"
            ))
        }
    }

    /// The caps these flags set.
    pub fn caps(&self) -> crate::caps::Caps {
        crate::caps::Caps {
            transfer_bytes_max: self.transfer_bytes_max,
            transfers_max: self.transfers_max,
            registered_bytes_max: self.registered_bytes_max,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            transfer_timeout: Duration::from_millis(self.transfer_timeout_ms),
        }
    }
}
