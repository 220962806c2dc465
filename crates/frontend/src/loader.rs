//! Loading, configuring and attaching `bpf/frontend.bpf.c`, and every map operation
//! the control port offers (move, hold, release, weights, stats).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::time::Duration;

use aya::maps::{HashMap, MapData, MapError};
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType};
use aya::programs::SchedClassifier;
use farside_bpfrt::{error_chain, flags, is_permission_error, Error, Object};
use serde::{Deserialize, Serialize};

use crate::backend::{format_mac, validate_backends, BackendSpec};
use crate::maps::{
    BackendEntry, BackendStats, Config, FlowKey, FlowValue, KeyValue, COUNTERS, COUNTER_NAMES,
    FLOW_HOLD, KEYS_MAX, MAP_BACKENDS, MAP_BIP, MAP_BSTATS, MAP_CONFIG, MAP_COUNTERS, MAP_FLOWS,
    MAP_KEYS, MAP_MOVED, MAP_MOVE_FLOOR, MAP_REPLAY, MAP_TABLE, MOVED_MAX, PROG_NAME, SLOTS,
};
use crate::pin::{self, Restored, PINNED_MAPS};
use crate::table;

/// The compiled program (clang -target bpf), 8-byte aligned as ELF parsing needs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/frontend.bpf.o"));

/// tc verdicts as returned by [`Frontend::test_run`] (`TC_ACT_*`).
pub mod verdict {
    /// Passed to the stack.
    pub const PASS: u32 = 0;
    /// Dropped.
    pub const DROP: u32 = 2;
    /// Forwarded (`bpf_redirect` out of the interface).
    pub const REDIRECT: u32 = 7;
}

/// What failed (the BPF runtime's error); every message names the step. Bad
/// arguments ([`Error::Config`]) read as they are: the control port replies with them.
pub type FrontendError = farside_bpfrt::Error;

/// The program as errors name it.
const LABEL: &str = "the front-end program";

/// How long a `HOLD` drops a flow's packets unless it says: a migration holds a flow
/// for its freeze (milliseconds) and then moves or releases it; a hold its migration
/// forgot ends by itself after this, so a lost `RELEASE` (or a forged `HOLD`) cannot
/// black-hole a flow for good.
pub const HOLD_TTL_DEFAULT: Duration = Duration::from_secs(5);
/// Longest hold a `HOLD` may ask for: a TCP peer retransmits for minutes, but a
/// migration that needs more than this has failed.
pub const HOLD_TTL_MAX: Duration = Duration::from_secs(60);
/// A moved flow with no packet for this long is removed from the moved-flow table by
/// [`Frontend::expire_moved`] (the program sees no FIN: this is how dead moved flows
/// leave): 300 s, about the idle timeout of cloud load balancers (AWS NLB: 350 s). A
/// moved connection idle longer loses its entry; its next packet is routed by hash.
pub const MOVED_IDLE_MAX: Duration = Duration::from_secs(300);

/// Whether a map update failed because the map is full (E2BIG).
fn is_full(e: &MapError) -> bool {
    matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// Whether a map operation found no such key (aya reports a delete's ENOENT as a
/// syscall error).
fn is_gone(e: &MapError) -> bool {
    matches!(e, MapError::KeyNotFound)
        || matches!(e, MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::ENOENT))
}

/// Counters of one back-end, summed over CPUs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendReport {
    /// The back-end's address (its name).
    pub ip: Ipv4Addr,
    /// Its MAC.
    pub mac: String,
    /// Its current weight.
    pub weight: u32,
    /// Packets forwarded to it.
    pub packets: u64,
    /// New flows (SYN, no entry) routed to it.
    pub new_flows: u64,
}

/// What `STATS` reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Per back-end, in configuration order.
    pub backends: Vec<BackendReport>,
    /// Global counters by name ([`COUNTER_NAMES`]).
    pub counters: BTreeMap<String, u64>,
    /// Entries now: the flow table's (at most [`crate::FLOWS_MAX`]) and the moved-flow
    /// table's.
    pub flows: usize,
    /// Of which in the moved-flow table (at most [`crate::MOVED_MAX`]).
    #[serde(default)]
    pub moved_flows: usize,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.backends {
            writeln!(
                f,
                "backend {} ({}) weight {}: {} packets, {} new flows",
                b.ip, b.mac, b.weight, b.packets, b.new_flows
            )?;
        }
        let c: Vec<String> = self
            .counters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(
            f,
            "flows {} ({} moved); {}",
            self.flows,
            self.moved_flows,
            c.join(" ")
        )
    }
}

/// The front-end program, loaded and configured; attached to an interface if made by
/// [`Frontend::attach`]. Detached when dropped (and by the kernel when the process
/// dies: the TCX link is owned by this process and pinned nowhere).
pub struct Frontend {
    obj: Object,
    /// `fe_config[0]` as last written.
    config: Config,
    vip: SocketAddrV4,
    backends: Vec<BackendSpec>,
    link: Option<SchedClassifierLinkId>,
    ifname: String,
    /// The attachment to the move interface, if it is another one.
    move_link: Option<(SchedClassifierLinkId, String)>,
    /// Control-port `MOVE`s refused because the moved-flow table was full (added to
    /// the program's `move_full` in [`Frontend::stats`]).
    move_full_refused: u64,
    /// The weight table as last written (empty before the first write).
    table: Vec<u32>,
}

impl Frontend {
    /// Load the program and fill its maps for `vip` and `backends`, without attaching:
    /// `mac` is the interface's own MAC (only frames to it are routed; it is the
    /// source MAC of forwarded frames), `ifindex` the interface frames go out of.
    pub fn load(
        vip: SocketAddrV4,
        backends: &[BackendSpec],
        mac: [u8; 6],
        ifindex: u32,
    ) -> Result<Frontend, FrontendError> {
        Frontend::load_pinned(vip, backends, mac, ifindex, None).map(|(fe, _)| fe)
    }

    /// [`Frontend::load`], keeping state across restarts in `pin_dir` (a directory on
    /// a bpffs, see [`crate::pin`]): what an earlier front-end of the same VIP and
    /// back-ends pinned there (hash key, flows, moved flows, replay state) is copied in,
    /// then this front-end's maps are pinned there in its place.
    pub fn load_pinned(
        vip: SocketAddrV4,
        backends: &[BackendSpec],
        mac: [u8; 6],
        ifindex: u32,
        pin_dir: Option<&Path>,
    ) -> Result<(Frontend, Restored), FrontendError> {
        if vip.port() == 0 {
            return Err(Error::Config("VIP port 0".into()));
        }
        validate_backends(backends).map_err(Error::Config)?;
        let mut restored = Restored::default();
        let pinned = match pin_dir {
            Some(d) => pin::read(d, vip, backends, &mut restored.discarded)?,
            None => None,
        };
        let hash_key = match &pinned {
            Some(p) => p.hash_key,
            None => table::random_hash_key()
                .map_err(|e| Error::os(LABEL, "drawing the flow hash's key (getrandom)", e))?,
        };
        let (hash_k0, hash_k1) = hash_key.halves();
        let mut obj = Object::load(LABEL, OBJECT)?;
        obj.load_program::<SchedClassifier>(PROG_NAME)?;
        let mut fe = Frontend {
            obj,
            config: Config {
                vip: u32::from(*vip.ip()).to_be(),
                port: vip.port().to_be(),
                mac,
                ifindex,
                backends: backends.len() as u32,
                hash_k0,
                hash_k1,
                move_ifindex: ifindex,
                move_mac: mac,
                ..Config::default()
            },
            vip,
            backends: backends.to_vec(),
            link: None,
            ifname: String::new(),
            move_link: None,
            move_full_refused: 0,
            table: Vec::new(),
        };
        for (i, b) in backends.iter().enumerate() {
            let entry = BackendEntry {
                mac: b.mac,
                reserved: 0,
                ip: u32::from(b.ip).to_be(),
            };
            fe.obj
                .array_set(MAP_BACKENDS, i as u32, entry, "writing a back-end")?;
        }
        {
            let mut m: HashMap<&mut MapData, u32, u32> = fe.obj.typed_mut(MAP_BIP)?;
            for (i, b) in backends.iter().enumerate() {
                m.insert(u32::from(b.ip).to_be(), i as u32, 0)
                    .map_err(|e| Error::map(LABEL, "writing a back-end's address", &e))?;
            }
        }
        fe.write_table()?;
        if let Some(p) = pinned {
            restored.hash_key = Some(p.hash_key);
            restored.flows = fe.copy_in(MAP_FLOWS, &p.flows)?;
            restored.moved = fe.copy_in(MAP_MOVED, &p.moved)?;
            restored.replay = fe.copy_in(MAP_REPLAY, &p.replay)?;
        }
        // The MOVE's replay floor: every second before this start (senders seal with
        // clock sequences), so a MOVE captured before a restart is refused after it
        // even when no pinned fe_replay was restored.
        let floor = farside_auth::floor::clock_floor(farside_auth::replay::Sequencer::unix_s());
        fe.obj
            .array_set(MAP_MOVE_FLOOR, 0, floor, "writing the MOVE's replay floor")?;
        // Written last: `backends` > 0 is what turns routing on.
        fe.write_config()?;
        if let Some(d) = pin_dir {
            let maps = PINNED_MAPS
                .iter()
                .map(|n| fe.obj.map(n).map(|m| (*n, m)))
                .collect::<Result<Vec<_>, _>>()?;
            pin::pin_all(d, maps.into_iter())?;
        }
        Ok((fe, restored))
    }

    /// Insert `entries` into hash map `name`; returns how many went in (a full map
    /// keeps what fitted).
    fn copy_in<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &str,
        entries: &[(K, V)],
    ) -> Result<usize, FrontendError> {
        let mut m: HashMap<&mut MapData, K, V> = self.obj.typed_mut(name)?;
        let mut n = 0;
        for (k, v) in entries {
            match m.insert(k, v, 0) {
                Ok(()) => n += 1,
                Err(e) if is_full(&e) => break,
                Err(e) => return Err(Error::map(LABEL, &format!("restoring {name}"), &e)),
            }
        }
        Ok(n)
    }

    fn write_config(&mut self) -> Result<(), FrontendError> {
        self.obj
            .array_set(MAP_CONFIG, 0, self.config, "writing the configuration")
    }

    /// Answer the one-sided MOVE (UDP to `ip:port`, the front-end's own address; see
    /// [`crate::fmove`]) in the program from now on; port 0 turns it off (such
    /// datagrams pass to the stack as any other).
    pub fn set_move_udp(&mut self, ip: Ipv4Addr, port: u16) -> Result<(), FrontendError> {
        if port != 0 && (ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast()) {
            return Err(Error::Config(format!(
                "the one-sided MOVE needs the front-end's own unicast address, not {ip}"
            )));
        }
        let before = self.config;
        self.config.ip = u32::from(ip).to_be();
        self.config.move_port = port.to_be();
        self.write_config().inspect_err(|_| self.config = before)
    }

    /// The one-sided MOVE's replay floor: a sealed MOVE whose envelope sequence is at
    /// or below it is refused (`move_replay`). Seeded at load with the clock floor of
    /// the start (`farside_auth::floor::clock_floor`).
    pub fn move_seq_floor(&self) -> Result<u64, FrontendError> {
        self.obj.array_get(MAP_MOVE_FLOOR, 0)
    }

    /// The flow hash's secret key (drawn at load): with it [`table::backend_for`]
    /// predicts where a new flow goes.
    pub fn hash_key(&self) -> table::HashKey {
        table::HashKey::from_halves(self.config.hash_k0, self.config.hash_k1)
    }

    /// Require every one-sided MOVE to carry an auth envelope (`farside_auth::mac`,
    /// domain `FrontendMove`) under `key`, named `id`; several calls install several
    /// keys (a rotation: current and previous), at most [`KEYS_MAX`](crate::KEYS_MAX).
    /// From the first call on, an unauthenticated MOVE is dropped (`move_unauth`).
    pub fn add_move_key(
        &mut self,
        id: farside_auth::mac::KeyId,
        key: farside_auth::siphash::SipKey,
    ) -> Result<(), FrontendError> {
        let (k0, k1) = key.halves();
        {
            let mut m: HashMap<&mut MapData, u32, KeyValue> = self.obj.typed_mut(MAP_KEYS)?;
            m.insert(id.0, KeyValue { k0, k1 }, 0).map_err(|e| {
                if is_full(&e) {
                    Error::Config(format!("at most {KEYS_MAX} MOVE keys"))
                } else {
                    Error::map(LABEL, "writing a MOVE key", &e)
                }
            })?;
        }
        let before = self.config;
        self.config.move_auth = 1;
        self.write_config().inspect_err(|_| self.config = before)
    }

    /// Remove MOVE key `id` (the end of a rotation). Returns whether it was installed;
    /// authentication stays required.
    pub fn revoke_move_key(&mut self, id: farside_auth::mac::KeyId) -> Result<bool, FrontendError> {
        let mut m: HashMap<&mut MapData, u32, KeyValue> = self.obj.typed_mut(MAP_KEYS)?;
        match m.remove(&id.0) {
            Ok(()) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(Error::map(LABEL, "removing a MOVE key", &e)),
        }
    }

    /// Whether a one-sided MOVE must be authenticated.
    pub fn move_authenticated(&self) -> bool {
        self.config.move_auth != 0
    }

    /// Accept the one-sided MOVE only when it arrives on interface `ifindex` (whose
    /// MAC is `mac`): the cluster-facing interface. Default: the interface the
    /// front-end was loaded for. [`Frontend::attach_move_iface`] attaches there too.
    pub fn set_move_ifindex(&mut self, ifindex: u32, mac: [u8; 6]) -> Result<(), FrontendError> {
        let before = self.config;
        self.config.move_ifindex = ifindex;
        self.config.move_mac = mac;
        self.write_config().inspect_err(|_| self.config = before)
    }

    /// Answer the one-sided MOVE on `ifname` only (the cluster-facing interface),
    /// attaching the program to its tc ingress too if it is not the routed one; a
    /// MOVE arriving elsewhere is dropped (`move_wrong_iface`).
    pub fn attach_move_iface(&mut self, ifname: &str) -> Result<(), FrontendError> {
        let (mac, ifindex) = iface_mac_index(ifname)?;
        if ifindex != self.config.ifindex {
            if let Some((link, name)) = self.move_link.take() {
                self.obj.detach_tc(PROG_NAME, link, &name)?;
            }
            let link = self.obj.attach_tc_ingress(PROG_NAME, ifname)?;
            self.move_link = Some((link, ifname.to_string()));
        }
        self.set_move_ifindex(ifindex, mac)
    }

    /// Where the one-sided MOVE is answered, if it is on.
    pub fn move_udp(&self) -> Option<SocketAddrV4> {
        (self.config.move_port != 0).then(|| {
            SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(self.config.ip)),
                u16::from_be(self.config.move_port),
            )
        })
    }

    /// Load for `vip` and `backends` and attach to `ifname`'s tc ingress (in the
    /// calling thread's network namespace).
    pub fn attach(
        ifname: &str,
        vip: SocketAddrV4,
        backends: &[BackendSpec],
    ) -> Result<Frontend, FrontendError> {
        Frontend::attach_pinned(ifname, vip, backends, None).map(|(fe, _)| fe)
    }

    /// [`Frontend::attach`] with [`Frontend::load_pinned`]'s state kept in
    /// `pin_root/<ifname>/` if `pin_root` is given.
    pub fn attach_pinned(
        ifname: &str,
        vip: SocketAddrV4,
        backends: &[BackendSpec],
        pin_root: Option<&Path>,
    ) -> Result<(Frontend, Restored), FrontendError> {
        let (mac, ifindex) = iface_mac_index(ifname)?;
        let dir = pin_root.map(|r| pin::pin_dir(r, ifname));
        let (mut fe, restored) =
            Frontend::load_pinned(vip, backends, mac, ifindex, dir.as_deref())?;
        let link = fe.obj.attach_tc_ingress(PROG_NAME, ifname)?;
        fe.link = Some(link);
        fe.ifname = ifname.to_string();
        Ok((fe, restored))
    }

    /// Fill the weight table (Maglev, [`table::fill_table`]) for the current back-ends
    /// and weights, writing only the slots that change.
    fn write_table(&mut self) -> Result<(), FrontendError> {
        let weights: Vec<u32> = self.backends.iter().map(|b| b.weight).collect();
        let ids: Vec<u64> = self
            .backends
            .iter()
            .map(|b| u64::from(u32::from(b.ip)))
            .collect();
        let t = table::fill_table(&ids, &weights, SLOTS).map_err(Error::Config)?;
        for (slot, b) in t.iter().enumerate() {
            if self.table.get(slot) == Some(b) {
                continue;
            }
            self.obj
                .array_set(MAP_TABLE, slot as u32, *b, "writing the weight table")?;
        }
        self.table = t;
        Ok(())
    }

    /// The weight table as the program sees it now.
    pub fn table(&self) -> Result<Vec<u32>, FrontendError> {
        (0..SLOTS as u32)
            .map(|i| self.obj.array_get(MAP_TABLE, i))
            .collect()
    }

    /// Detach from the interface (if attached): from now on its traffic goes to the
    /// stack. The maps stay readable.
    pub fn detach(&mut self) -> Result<(), FrontendError> {
        if let Some((link, name)) = self.move_link.take() {
            self.obj.detach_tc(PROG_NAME, link, &name)?;
        }
        match self.link.take() {
            Some(link) => self.obj.detach_tc(PROG_NAME, link, &self.ifname),
            None => Ok(()),
        }
    }

    /// Whether the program is attached.
    pub fn is_attached(&self) -> bool {
        self.link.is_some()
    }

    /// The VIP served.
    pub fn vip(&self) -> SocketAddrV4 {
        self.vip
    }

    /// The back-ends, with their current weights.
    pub fn backends(&self) -> &[BackendSpec] {
        &self.backends
    }

    /// The interface attached to ("" if not attached).
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn backend_index(&self, ip: Ipv4Addr) -> Result<u32, FrontendError> {
        self.backends
            .iter()
            .position(|b| b.ip == ip)
            .map(|i| i as u32)
            .ok_or_else(|| Error::Config(format!("no back-end {ip}")))
    }

    /// Change weights (each named by its back-end's IP; the others keep theirs) and
    /// refill the weight table. Only new flows are affected: existing entries stay.
    pub fn set_weights(&mut self, weights: &[(Ipv4Addr, u32)]) -> Result<(), FrontendError> {
        let mut next = self.backends.clone();
        for &(ip, w) in weights {
            let i = self.backend_index(ip)? as usize;
            next[i].weight = w;
        }
        validate_backends(&next).map_err(Error::Config)?;
        let before = std::mem::replace(&mut self.backends, next);
        if let Err(e) = self.write_table() {
            self.backends = before;
            return Err(e);
        }
        Ok(())
    }

    fn flows_mut(&mut self) -> Result<HashMap<&mut MapData, FlowKey, FlowValue>, FrontendError> {
        self.obj.typed_mut(MAP_FLOWS)
    }

    fn flows(&self) -> Result<HashMap<&MapData, FlowKey, FlowValue>, FrontendError> {
        self.obj.typed(MAP_FLOWS)
    }

    fn moved_mut(&mut self) -> Result<HashMap<&mut MapData, FlowKey, FlowValue>, FrontendError> {
        self.obj.typed_mut(MAP_MOVED)
    }

    fn moved(&self) -> Result<HashMap<&MapData, FlowKey, FlowValue>, FrontendError> {
        self.obj.typed(MAP_MOVED)
    }

    /// The entry the program follows for `key` (the moved-flow table's first) and the
    /// map it is in.
    fn entry(&self, key: &FlowKey) -> Result<Option<(FlowValue, &'static str)>, FrontendError> {
        for name in [MAP_MOVED, MAP_FLOWS] {
            let m: HashMap<&MapData, FlowKey, FlowValue> = self.obj.typed(name)?;
            match m.get(key, 0) {
                Ok(v) => return Ok(Some((v, name))),
                Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(Error::map(LABEL, name, &e)),
            }
        }
        Ok(None)
    }

    /// The flow of `client` to the VIP: its back-end's IP and whether it is held now
    /// (a hold past its deadline is not); None if neither table has an entry.
    pub fn flow(&self, client: SocketAddrV4) -> Result<Option<(Ipv4Addr, bool)>, FrontendError> {
        let key = FlowKey::new(client, self.vip);
        Ok(self.entry(&key)?.map(|(v, _)| {
            (
                self.backends
                    .get(v.backend as usize)
                    .map(|b| b.ip)
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
                v.flags & FLOW_HOLD != 0 && farside_bpfrt::ktime_ns() < v.hold_until_ns,
            )
        }))
    }

    /// Whether `client`'s flow is in the moved-flow table (where traffic cannot evict it).
    pub fn is_moved(&self, client: SocketAddrV4) -> Result<bool, FrontendError> {
        let key = FlowKey::new(client, self.vip);
        Ok(matches!(self.entry(&key)?, Some((_, MAP_MOVED))))
    }

    /// Send `client`'s flow to the back-end `backend` from its next packet on, and
    /// release it if held: the flip `farside_migrate::migrate_with`'s `move_flow`
    /// makes after the restore. The entry is written to the moved-flow table (created
    /// if the flow had none, e.g. evicted) and the flow table's removed; if the
    /// moved-flow table is full ([`MOVED_MAX`]) nothing is written, the refusal is
    /// counted (`move_full`) and the error says so.
    pub fn move_flow(
        &mut self,
        client: SocketAddrV4,
        backend: Ipv4Addr,
    ) -> Result<(), FrontendError> {
        let b = self.backend_index(backend)?;
        let key = FlowKey::new(client, self.vip);
        let v = FlowValue {
            backend: b,
            flags: 0,
            hold_until_ns: 0,
            seen_ns: farside_bpfrt::ktime_ns(),
        };
        match self.moved_mut()?.insert(key, v, 0) {
            Ok(()) => {}
            Err(e) if is_full(&e) => {
                self.move_full_refused += 1;
                return Err(Error::Config(format!(
                    "the moved-flow table is full ({MOVED_MAX} flows): {client} not moved"
                )));
            }
            Err(e) => return Err(Error::map(LABEL, "writing a moved flow", &e)),
        }
        match self.flows_mut()?.remove(&key) {
            Ok(()) => Ok(()),
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(Error::map(LABEL, "removing a moved flow's old entry", &e)),
        }
    }

    /// Hold (drop the packets of) `client`'s flow for [`HOLD_TTL_DEFAULT`], or release
    /// it. Errors if the flow has no entry.
    pub fn set_held(&mut self, client: SocketAddrV4, held: bool) -> Result<(), FrontendError> {
        self.set_hold(client, held.then_some(HOLD_TTL_DEFAULT))
    }

    /// Hold `client`'s flow for `ttl` (at most [`HOLD_TTL_MAX`]; after it the program
    /// forwards the flow again, counted `hold_expired`), or release it (None). Errors if
    /// the flow has no entry or `ttl` is too long.
    pub fn set_hold(
        &mut self,
        client: SocketAddrV4,
        ttl: Option<Duration>,
    ) -> Result<(), FrontendError> {
        if let Some(t) = ttl {
            if t > HOLD_TTL_MAX || t.is_zero() {
                return Err(Error::Config(format!(
                    "hold of {t:?}: between 1 ms and {HOLD_TTL_MAX:?}"
                )));
            }
        }
        let key = FlowKey::new(client, self.vip);
        let (mut v, name) = self
            .entry(&key)?
            .ok_or_else(|| Error::Config(format!("no flow from {client}")))?;
        match ttl {
            Some(t) => {
                v.flags |= FLOW_HOLD;
                v.hold_until_ns = farside_bpfrt::ktime_ns().saturating_add(t.as_nanos() as u64);
            }
            None => {
                v.flags &= !FLOW_HOLD;
                v.hold_until_ns = 0;
            }
        }
        let mut m: HashMap<&mut MapData, FlowKey, FlowValue> = self.obj.typed_mut(name)?;
        // flags::EXIST: never resurrect an entry evicted meanwhile.
        m.insert(key, v, flags::EXIST)
            .map_err(|e| Error::map(LABEL, "writing a flow entry", &e))
    }

    /// Remove moved flows with no packet for `idle` and no hold in force: the moved
    /// flows whose connections ended (the program cannot see them end). Returns how
    /// many were removed. `farside frontend` calls it with [`MOVED_IDLE_MAX`].
    pub fn expire_moved(&mut self, idle: Duration) -> Result<usize, FrontendError> {
        let now = farside_bpfrt::ktime_ns();
        let idle_ns = idle.as_nanos() as u64;
        let stale: Vec<FlowKey> = self
            .moved()?
            .iter()
            .filter_map(|kv| kv.ok())
            .filter(|(_, v)| {
                now.saturating_sub(v.seen_ns) > idle_ns
                    && !(v.flags & FLOW_HOLD != 0 && now < v.hold_until_ns)
            })
            .map(|(k, _)| k)
            .collect();
        let mut m = self.moved_mut()?;
        let mut removed = 0;
        for k in stale {
            match m.remove(&k) {
                Ok(()) => removed += 1,
                Err(e) if is_gone(&e) => {}
                Err(e) => return Err(Error::map(LABEL, "removing an idle moved flow", &e)),
            }
        }
        Ok(removed)
    }

    /// Counters and flow count.
    pub fn stats(&self) -> Result<Stats, FrontendError> {
        let mut backends = Vec::new();
        for (i, b) in self.backends.iter().enumerate() {
            let per_cpu = self.obj.per_cpu::<BackendStats>(MAP_BSTATS, i as u32)?;
            let (packets, new_flows) = per_cpu.iter().fold((0u64, 0u64), |(p, n), s| {
                (p.wrapping_add(s.packets), n.wrapping_add(s.new_flows))
            });
            backends.push(BackendReport {
                ip: b.ip,
                mac: format_mac(&b.mac),
                weight: b.weight,
                packets,
                new_flows,
            });
        }
        let sums = self.obj.per_cpu_sums(MAP_COUNTERS, COUNTERS as u32)?;
        let mut counters: BTreeMap<String, u64> = COUNTER_NAMES
            .iter()
            .zip(sums)
            .map(|(name, n)| (name.to_string(), n))
            .collect();
        *counters.entry("move_full".into()).or_default() += self.move_full_refused;
        let moved_flows = self.moved()?.keys().filter(|k| k.is_ok()).count();
        let flows = self.flows()?.keys().filter(|k| k.is_ok()).count() + moved_flows;
        Ok(Stats {
            backends,
            counters,
            flows,
            moved_flows,
        })
    }

    /// Run the program once on `frame` (an Ethernet frame) with BPF_PROG_TEST_RUN:
    /// the verdict ([`verdict`]) and the frame as the program left it. Maps are the
    /// live ones (a test run records flows and counts like real traffic).
    pub fn test_run(&self, frame: &[u8]) -> Result<(u32, Vec<u8>), FrontendError> {
        self.test_run_once(frame).map(|(v, out, _)| (v, out))
    }

    /// Mean run time in ns of the program on `frame` over `runs` test runs, as the
    /// kernel measures it, and the last verdict. Each run gets a fresh copy of
    /// `frame`: the kernel's own repeat loop would run the program again on the frame
    /// it rewrote (no longer addressed to the front-end), measuring the pass path.
    pub fn test_run_mean_ns(&self, frame: &[u8], runs: u32) -> Result<(u32, u64), FrontendError> {
        let (mut total, mut last) = (0u64, 0u32);
        for _ in 0..runs.max(1) {
            let (v, _, ns) = self.test_run_once(frame)?;
            total += u64::from(ns);
            last = v;
        }
        Ok((last, total / u64::from(runs.max(1))))
    }

    fn test_run_once(&self, frame: &[u8]) -> Result<(u32, Vec<u8>, u32), FrontendError> {
        let out_bytes = farside_bpfrt::TEST_FRAME_BYTES_MAX.max(frame.len() + 256);
        let r = self.obj.test_run(PROG_NAME, frame, out_bytes)?;
        Ok((r.retval, r.frame, r.duration_ns))
    }
}

impl Drop for Frontend {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

/// The MAC and index of `ifname` in the calling thread's network namespace (an
/// ioctl on a socket of this namespace: /sys/class/net shows the mount's namespace).
pub fn iface_mac_index(ifname: &str) -> Result<([u8; 6], u32), FrontendError> {
    let ifindex = farside_bpfrt::ifindex(ifname)?;
    #[repr(C)]
    struct IfReqHw {
        name: [u8; 16],
        family: u16,
        data: [u8; 14],
        _pad: [u8; 8],
    }
    let mut req = IfReqHw {
        name: [0; 16],
        family: 0,
        data: [0; 14],
        _pad: [0; 8],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::os(
            LABEL,
            "socket for SIOCGIFHWADDR",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: SIOCGIFHWADDR fills a struct ifreq (40 bytes) we own.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req as *mut IfReqHw) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the socket opened above.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(Error::os(LABEL, &format!("reading {ifname}'s MAC"), err));
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&req.data[..6]);
    Ok((mac, ifindex))
}

/// The first IPv4 address of `ifname` in the calling thread's network namespace
/// (SIOCGIFADDR), None if it has none.
pub fn iface_ipv4(ifname: &str) -> Result<Option<Ipv4Addr>, FrontendError> {
    if ifname.len() >= 16 || ifname.contains('\0') {
        return Err(Error::NoInterface(ifname.to_string()));
    }
    #[repr(C)]
    struct IfReqAddr {
        name: [u8; 16],
        addr: libc::sockaddr_in,
        _pad: [u8; 8],
    }
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut req = IfReqAddr {
        name: [0; 16],
        addr: unsafe { std::mem::zeroed() },
        _pad: [0; 8],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::os(
            LABEL,
            "socket for SIOCGIFADDR",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: SIOCGIFADDR fills a struct ifreq (40 bytes) we own.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFADDR, &mut req as *mut IfReqAddr) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the socket opened above.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return match err.raw_os_error() {
            Some(libc::EADDRNOTAVAIL) => Ok(None),
            Some(libc::ENODEV) => Err(Error::NoInterface(ifname.to_string())),
            _ => Err(Error::os(
                LABEL,
                &format!("reading {ifname}'s IPv4 address"),
                err,
            )),
        };
    }
    Ok(Some(Ipv4Addr::from(u32::from_be(req.addr.sin_addr.s_addr))))
}

/// `farside frontend --detach IF`: remove a front-end left attached through the
/// legacy netlink interface (kernels before 6.6) by a process that died. On kernels
/// with TCX the attachment is a link owned by the process and is gone with it; then
/// this finds nothing and says so. Returns what it did.
pub fn detach_iface(ifname: &str) -> Result<String, FrontendError> {
    iface_mac_index(ifname)?;
    match aya::programs::tc::qdisc_detach_program(ifname, TcAttachType::Ingress, PROG_NAME) {
        Ok(()) => Ok(format!("detached {PROG_NAME} from {ifname}'s tc ingress")),
        Err(aya::programs::tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {
            Ok(format!(
                "nothing to detach: no {PROG_NAME} filter on {ifname} (a TCX attachment ends with its process)"
            ))
        }
        Err(e) => {
            let msg = error_chain(&e);
            // No clsact qdisc at all: nothing was ever attached through netlink.
            if msg.contains("No such file") || msg.contains("Invalid argument") {
                Ok(format!("nothing to detach on {ifname} ({msg})"))
            } else if is_permission_error(&e) {
                Err(Error::NoPrivilege {
                    program: LABEL,
                    step: format!("detaching from {ifname}"),
                })
            } else {
                Err(Error::Attach {
                    program: LABEL,
                    target: format!("{ifname}'s tc ingress (detaching)"),
                    detail: msg,
                    hint: "",
                })
            }
        }
    }
}

/// Compile-time check: the control thread shares the front-end.
#[allow(dead_code)]
fn _assert_send() {
    fn s<T: Send>() {}
    s::<Frontend>();
}
