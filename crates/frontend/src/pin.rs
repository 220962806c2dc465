//! Pinned maps: the front-end's state kept across a restart, as Katran keeps its maps
//! on bpffs. `farside frontend --pin-maps` (default on when `/sys/fs/bpf` is a bpffs)
//! pins the maps a restart must not lose under [`PIN_ROOT`]`/<iface>/`:
//!
//! | map | why |
//! |---|---|
//! | `fe_config` | the flow hash's secret key: flows without an entry hash as before |
//! | `fe_backends` | which back-end an index names: the entries below are indices |
//! | `fe_flows` | flows created by SYNs |
//! | `fe_moved` | migrated flows (the ones a re-hash would lose) |
//! | `fe_replay` | the MOVE's highest sequences: a restart must not reopen a replay |
//!
//! A new front-end loads fresh maps, and if pins exist for its interface and they
//! were made for the same VIP and the same back-ends (addresses, in order), copies
//! their entries (and the hash key) into its maps before attaching; then it replaces
//! the pins by its own maps. Pins of another configuration are discarded (logged):
//! indices would name other back-ends. Copying instead of reusing the pinned maps
//! keeps the program's map definitions the single source of their sizes: a map whose
//! size changed between versions is copied, never reused with the old size.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, Map, MapData};
use farside_bpfrt::Error;

use crate::backend::BackendSpec;
use crate::maps::{
    BackendEntry, Config, FlowKey, FlowValue, ReplayKey, MAP_BACKENDS, MAP_CONFIG, MAP_FLOWS,
    MAP_MOVED, MAP_REPLAY,
};
use crate::table::HashKey;

/// Where `farside frontend` pins maps: one directory per interface below it.
pub const PIN_ROOT: &str = "/sys/fs/bpf/farside";
/// The maps pinned, in the order they are restored.
pub const PINNED_MAPS: [&str; 5] = [MAP_CONFIG, MAP_BACKENDS, MAP_FLOWS, MAP_MOVED, MAP_REPLAY];
/// `statfs` magic of a bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

const LABEL: &str = "the front-end program";

/// Whether `path` is on a bpffs (where maps can be pinned).
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills a struct we own from a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Whether this process runs in the network namespace of PID 1 (the host's). Pins
/// are named by interface only, so front-ends in several namespaces with one
/// interface name (a lab) would share them: pinning is on by default only here.
pub fn in_host_netns() -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::metadata("/proc/self/ns/net"),
        std::fs::metadata("/proc/1/ns/net"),
    ) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// `--pin-maps`'s default: on if `root` (or the directory it would be made in) is on
/// a bpffs and this is the host's network namespace.
pub fn default_on(root: &Path) -> bool {
    let on_bpffs = if root.exists() {
        is_bpffs(root)
    } else {
        root.parent().is_some_and(is_bpffs)
    };
    on_bpffs && in_host_netns()
}

/// The pin directory of interface `ifname` under `root`.
pub fn pin_dir(root: &Path, ifname: &str) -> PathBuf {
    root.join(ifname)
}

/// What a start found pinned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The pinned hash key, reused (None: none pinned, or discarded).
    pub hash_key: Option<HashKey>,
    /// Flow-table entries copied.
    pub flows: usize,
    /// Moved flows copied.
    pub moved: usize,
    /// Replay-check entries copied.
    pub replay: usize,
    /// Pins existed but were made for another VIP or other back-ends: not used.
    pub discarded: bool,
}

fn open(dir: &Path, name: &str) -> Result<Option<Map>, Error> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path)
        .map_err(|e| Error::map(LABEL, &format!("opening pinned {}", path.display()), &e))?;
    Map::from_map_data(data)
        .map(Some)
        .map_err(|e| Error::map(LABEL, &format!("pinned {}", path.display()), &e))
}

/// The pinned state in `dir` for `vip` and `backends`: the hash key and the entries of
/// the pinned flow, moved and replay maps, if they were made for the same VIP and
/// back-ends.
pub(crate) struct Pinned {
    pub hash_key: HashKey,
    pub flows: Vec<(FlowKey, FlowValue)>,
    pub moved: Vec<(FlowKey, FlowValue)>,
    pub replay: Vec<(ReplayKey, u64)>,
}

/// Read what is pinned in `dir`, or None (nothing pinned, or another configuration:
/// then `discarded` is set).
pub(crate) fn read(
    dir: &Path,
    vip: SocketAddrV4,
    backends: &[BackendSpec],
    discarded: &mut bool,
) -> Result<Option<Pinned>, Error> {
    let (Some(config), Some(bmap)) = (open(dir, MAP_CONFIG)?, open(dir, MAP_BACKENDS)?) else {
        return Ok(None);
    };
    let config: Array<MapData, Config> =
        Array::try_from(config).map_err(|e| Error::map(LABEL, "pinned fe_config", &e))?;
    let c = config
        .get(&0, 0)
        .map_err(|e| Error::map(LABEL, "reading pinned fe_config", &e))?;
    let bmap: Array<MapData, BackendEntry> =
        Array::try_from(bmap).map_err(|e| Error::map(LABEL, "pinned fe_backends", &e))?;
    let same_vip = c.vip == u32::from(*vip.ip()).to_be() && c.port == vip.port().to_be();
    let same_backends = c.backends as usize == backends.len()
        && backends.iter().enumerate().all(|(i, b)| {
            bmap.get(&(i as u32), 0)
                .map(|e| Ipv4Addr::from(u32::from_be(e.ip)) == b.ip)
                .unwrap_or(false)
        });
    if !(same_vip && same_backends) {
        *discarded = true;
        return Ok(None);
    }
    fn entries<K: aya::Pod, V: aya::Pod>(dir: &Path, name: &str) -> Result<Vec<(K, V)>, Error> {
        let Some(m) = open(dir, name)? else {
            return Ok(Vec::new());
        };
        let m: HashMap<MapData, K, V> =
            HashMap::try_from(m).map_err(|e| Error::map(LABEL, name, &e))?;
        Ok(m.iter().filter_map(|kv| kv.ok()).collect())
    }
    Ok(Some(Pinned {
        hash_key: HashKey::from_halves(c.hash_k0, c.hash_k1),
        flows: entries(dir, MAP_FLOWS)?,
        moved: entries(dir, MAP_MOVED)?,
        replay: entries(dir, MAP_REPLAY)?,
    }))
}

/// Pin `maps` (name, map) in `dir` (created 0700), replacing what was pinned there.
pub(crate) fn pin_all<'a>(
    dir: &Path,
    maps: impl Iterator<Item = (&'a str, &'a Map)>,
) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::os(LABEL, &format!("creating {}", dir.display()), e))?;
    for (name, map) in maps {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::os(LABEL, &format!("removing {}", path.display()), e)),
        }
        map.pin(&path)
            .map_err(|e| Error::map(LABEL, &format!("pinning {}", path.display()), &e))?;
    }
    Ok(())
}

/// Remove the pins of `dir` (and the directory): `farside frontend --unpin`'s work and
/// the tests' cleanup.
pub fn unpin(dir: &Path) -> std::io::Result<()> {
    for name in PINNED_MAPS {
        match std::fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
