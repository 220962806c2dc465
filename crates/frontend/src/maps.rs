//! Map layouts and limits shared with `bpf/frontend_*.h` (one source of truth there;
//! the test below parses the header and checks every mirrored value).

/// Back-ends the program can route to (`FE_BACKENDS_MAX`): a handful in the paper's
/// cluster; 64 keeps the per-back-end maps small.
pub const BACKENDS_MAX: usize = 64;
/// Weight-table slots (`FE_SLOTS`): Maglev's lookup table, a prime over 100 x
/// [`BACKENDS_MAX`]; weights resolve to 1/16,381.
pub const SLOTS: usize = 16_381;
/// Flows the LRU flow table holds (`FE_FLOWS_MAX`); older ones are evicted. Only a
/// SYN creates an entry.
pub const FLOWS_MAX: usize = 65_536;
/// Moved flows the moved-flow table holds (`FE_MOVED_MAX`): a plain hash traffic
/// cannot evict; a MOVE into a full one is refused (counted `move_full`). Entries idle
/// [`MOVED_IDLE_MAX`](crate::MOVED_IDLE_MAX) are removed by the front-end's sweep.
pub const MOVED_MAX: usize = 65_536;
/// A moved entry's last-seen time is refreshed at most this often (`FE_SEEN_REFRESH_NS`).
pub const SEEN_REFRESH_NS: u64 = 1_000_000_000;
/// Flow flag: packets of the flow are dropped (`FE_FLOW_HOLD`).
pub const FLOW_HOLD: u32 = 1;

/// Global counters, by index (`FE_CNT_*`), with the names `STATS` reports.
pub const COUNTER_NAMES: [&str; COUNTERS] = [
    "passed",
    "malformed",
    "fragment",
    "ip_options",
    "nonsyn_miss",
    "held",
    "no_backend",
    "insert_failed",
    "syn_hit",
    "move_malformed",
    "move_refused",
    "moved",
    "move_already",
    "move_not_owner",
    "move_not_found",
    "move_full",
    "hold_expired",
    "move_unauth",
    "move_replay",
    "move_replay_full",
    "move_wrong_iface",
];
/// Number of global counters (`FE_COUNTERS`).
pub const COUNTERS: usize = 21;
/// Keys the one-sided MOVE verifies with (`FE_KEYS_MAX`): current and previous during
/// a rotation, with room to spare.
pub const KEYS_MAX: usize = 4;
/// (key id, sender) pairs the MOVE's replay check remembers (`FE_REPLAY_MAX`): only
/// authentic messages from configured back-ends add one, so at most
/// [`BACKENDS_MAX`] x [`KEYS_MAX`]; a new sender at a full table is refused.
pub const REPLAY_MAX: usize = 256;

pub(crate) const PROG_NAME: &str = "fs_frontend";
pub(crate) const MAP_CONFIG: &str = "fe_config";
pub(crate) const MAP_BACKENDS: &str = "fe_backends";
pub(crate) const MAP_TABLE: &str = "fe_table";
pub(crate) const MAP_FLOWS: &str = "fe_flows";
pub(crate) const MAP_MOVED: &str = "fe_moved";
pub(crate) const MAP_KEYS: &str = "fe_keys";
pub(crate) const MAP_REPLAY: &str = "fe_replay";
pub(crate) const MAP_MOVE_FLOOR: &str = "fe_move_floor";
pub(crate) const MAP_BSTATS: &str = "fe_bstats";
pub(crate) const MAP_COUNTERS: &str = "fe_counters";
pub(crate) const MAP_BIP: &str = "fe_bip";

/// `struct fe_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Config {
    pub vip: u32,
    pub port: u16,
    pub mac: [u8; 6],
    pub ifindex: u32,
    pub backends: u32,
    pub ip: u32,
    pub move_port: u16,
    /// 1: a MOVE must carry an auth envelope under a key of `fe_keys`.
    pub move_auth: u16,
    /// MOVE is accepted only arriving on this interface.
    pub move_ifindex: u32,
    /// The flow hash's key (`SipKey::halves`).
    pub hash_k0: u64,
    pub hash_k1: u64,
    /// The move interface's MAC.
    pub move_mac: [u8; 6],
    pub reserved: u16,
}

/// `struct fe_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyValue {
    pub k0: u64,
    pub k1: u64,
}

/// `struct fe_backend`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BackendEntry {
    pub mac: [u8; 6],
    pub reserved: u16,
    pub ip: u32,
}

/// `struct fe_flow_key` (network byte order, as `to_be` values stored natively).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlowKey {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
}

/// `struct fe_flow`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FlowValue {
    pub backend: u32,
    pub flags: u32,
    /// With [`FLOW_HOLD`]: packets are dropped until then (CLOCK_MONOTONIC ns).
    pub hold_until_ns: u64,
    /// In the moved-flow table: the flow's last packet (to [`SEEN_REFRESH_NS`]).
    pub seen_ns: u64,
}

/// `struct fe_bstats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BackendStats {
    pub packets: u64,
    pub new_flows: u64,
}

// SAFETY: repr(C), plain integers, no padding (sizes checked in the test below).
unsafe impl aya::Pod for Config {}
// SAFETY: as above.
unsafe impl aya::Pod for BackendEntry {}
// SAFETY: as above.
unsafe impl aya::Pod for KeyValue {}
// SAFETY: as above.
unsafe impl aya::Pod for ReplayKey {}

/// `struct fe_replay_key`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ReplayKey {
    pub key_id: u32,
    pub reserved: u32,
    pub sender: u64,
}
// SAFETY: as above.
unsafe impl aya::Pod for FlowKey {}
// SAFETY: as above.
unsafe impl aya::Pod for FlowValue {}
// SAFETY: as above.
unsafe impl aya::Pod for BackendStats {}

impl FlowKey {
    pub fn new(client: std::net::SocketAddrV4, vip: std::net::SocketAddrV4) -> FlowKey {
        FlowKey {
            saddr: u32::from(*client.ip()).to_be(),
            daddr: u32::from(*vip.ip()).to_be(),
            sport: client.port().to_be(),
            dport: vip.port().to_be(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn define(header: &str, name: &str) -> u64 {
        header
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some("#define") && it.next() == Some(name))
                    .then(|| it.next())
                    .flatten()
            })
            .map(|v| {
                let v = v.trim_end_matches("ULL").trim_end_matches('U');
                match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).unwrap(),
                    None => v.parse().unwrap(),
                }
            })
            .unwrap_or_else(|| panic!("{name} not in frontend_consts.h"))
    }

    #[test]
    fn constants_match_the_bpf_header() {
        let h = include_str!("../../../bpf/frontend_consts.h");
        assert_eq!(define(h, "FE_BACKENDS_MAX"), BACKENDS_MAX as u64);
        assert_eq!(define(h, "FE_SLOTS"), SLOTS as u64);
        assert_eq!(define(h, "FE_FLOWS_MAX"), FLOWS_MAX as u64);
        assert_eq!(define(h, "FE_MOVED_MAX"), MOVED_MAX as u64);
        assert_eq!(define(h, "FE_KEYS_MAX"), KEYS_MAX as u64);
        assert_eq!(define(h, "FE_REPLAY_MAX"), REPLAY_MAX as u64);
        assert_eq!(define(h, "FE_SEEN_REFRESH_NS"), SEEN_REFRESH_NS);
        assert_eq!(define(h, "FE_FLOW_HOLD"), u64::from(FLOW_HOLD));
        assert_eq!(define(h, "FE_COUNTERS"), COUNTERS as u64);
        for (i, name) in [
            "FE_CNT_PASSED",
            "FE_CNT_MALFORMED",
            "FE_CNT_FRAGMENT",
            "FE_CNT_IP_OPTIONS",
            "FE_CNT_NONSYN_MISS",
            "FE_CNT_HELD",
            "FE_CNT_NO_BACKEND",
            "FE_CNT_INSERT_FAILED",
            "FE_CNT_SYN_HIT",
            "FE_CNT_MOVE_MALFORMED",
            "FE_CNT_MOVE_REFUSED",
            "FE_CNT_MOVED",
            "FE_CNT_MOVE_ALREADY",
            "FE_CNT_MOVE_NOT_OWNER",
            "FE_CNT_MOVE_NOT_FOUND",
            "FE_CNT_MOVE_FULL",
            "FE_CNT_HOLD_EXPIRED",
            "FE_CNT_MOVE_UNAUTH",
            "FE_CNT_MOVE_REPLAY",
            "FE_CNT_MOVE_REPLAY_FULL",
            "FE_CNT_MOVE_WRONG_IFACE",
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(define(h, name), i as u64, "{name}");
            assert_eq!(
                COUNTER_NAMES[i],
                name.trim_start_matches("FE_CNT_").to_lowercase()
            );
        }
        use crate::fmove;
        assert_eq!(define(h, "FE_MOVE_MAGIC"), u64::from(fmove::MAGIC));
        assert_eq!(define(h, "FE_MOVE_VERSION"), u64::from(fmove::VERSION));
        assert_eq!(
            define(h, "FE_MOVE_OP_REQUEST"),
            u64::from(fmove::OP_REQUEST)
        );
        assert_eq!(define(h, "FE_MOVE_OP_REPLY"), u64::from(fmove::OP_REPLY));
        for s in [
            fmove::MoveStatus::Moved,
            fmove::MoveStatus::Already,
            fmove::MoveStatus::NotOwner,
            fmove::MoveStatus::NotFound,
            fmove::MoveStatus::Full,
        ] {
            let name = match s {
                fmove::MoveStatus::Moved => "FE_MOVE_MOVED",
                fmove::MoveStatus::Already => "FE_MOVE_ALREADY",
                fmove::MoveStatus::NotOwner => "FE_MOVE_NOT_OWNER",
                fmove::MoveStatus::NotFound => "FE_MOVE_NOT_FOUND",
                fmove::MoveStatus::Full => "FE_MOVE_FULL",
            };
            assert_eq!(define(h, name), u64::from(s as u16), "{name}");
        }
        assert_eq!(std::mem::size_of::<Config>(), 56);
        assert_eq!(std::mem::size_of::<KeyValue>(), 16);
        assert_eq!(std::mem::size_of::<ReplayKey>(), 16);
        assert_eq!(std::mem::size_of::<BackendEntry>(), 12);
        assert_eq!(std::mem::size_of::<FlowKey>(), 12);
        assert_eq!(std::mem::size_of::<FlowValue>(), 24);
        assert_eq!(std::mem::size_of::<BackendStats>(), 16);
    }
}
