//! The host's RDMA devices: enumeration (`ibv_get_device_list`) and a probe that opens
//! one and allocates a protection domain on it, the check a server makes once at start
//! before it offers transfers over the device.

use crate::sys::{self, Lib};
use crate::Error;
use std::fmt;

/// Devices enumerated at once: the most a host reports that this crate looks at (a
/// host has a handful; the bound keeps a broken sysfs from sizing a vector).
pub const DEVICES_MAX: usize = 256;

/// What a device carries RDMA over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand and RoCE (Linux rxe): the peer must be a verbs device too.
    Ib,
    /// iWARP (an iWARP RNIC, Linux siw): MPA/DDP/RDMAP over TCP, the wire of the
    /// software stack, so its peer may be `farside_iwarp`.
    Iwarp,
    Other(i32),
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Ib => f.write_str("ib"),
            Transport::Iwarp => f.write_str("iwarp"),
            Transport::Other(n) => write!(f, "transport-{n}"),
        }
    }
}

/// One RDMA device of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The kernel's name (`siw0`, `rxe0`, `mlx5_0`, `irdma0`, ...).
    pub name: String,
    pub transport: Transport,
}

pub(crate) fn info(dev: *const sys::DevicePrefix) -> DeviceInfo {
    // SAFETY: `dev` is a live `struct ibv_device` from rdma-core, whose public prefix
    // is `DevicePrefix`; its name is a NUL-terminated array.
    let d = unsafe { &*dev };
    let transport = match d.transport_type {
        sys::IBV_TRANSPORT_IB => Transport::Ib,
        sys::IBV_TRANSPORT_IWARP => Transport::Iwarp,
        n => Transport::Other(n),
    };
    DeviceInfo {
        // SAFETY: the name array is NUL-terminated (rdma-core fills it from sysfs).
        name: unsafe { sys::c_str(d.name.as_ptr()) },
        transport,
    }
}

/// The host's RDMA devices (none on a host without an RNIC, siw or rxe).
pub fn devices() -> Result<Vec<DeviceInfo>, Error> {
    with_list(|list| Ok(list.iter().map(|&d| info(d)).collect()))
}

/// Run `f` on the device list, freed after.
fn with_list<R>(f: impl FnOnce(&[*mut sys::DevicePrefix]) -> Result<R, Error>) -> Result<R, Error> {
    let lib = Lib::load().map_err(Error::Load)?;
    let mut n: libc::c_int = 0;
    // SAFETY: rdma-core's prototype; `n` is a valid out pointer.
    let list = unsafe { (lib.ibv.get_device_list)(&mut n) };
    if list.is_null() {
        // No uverbs support at all (e.g. no /sys/class/infiniband_verbs): no devices.
        let e = std::io::Error::last_os_error();
        log::debug!("verbs: ibv_get_device_list: {e}");
        return f(&[]);
    }
    let n = usize::try_from(n).unwrap_or(0).min(DEVICES_MAX);
    // SAFETY: the list has `n` entries (and a NULL after them) until it is freed.
    let devs = unsafe { std::slice::from_raw_parts(list, n) }.to_vec();
    let r = f(&devs);
    // SAFETY: the list came from ibv_get_device_list and is freed once; devices
    // opened from it stay valid (rdma-core refcounts them).
    unsafe { (lib.ibv.free_device_list)(list) };
    r
}

/// Open the device named `name` (or the first), allocate a protection domain on it and
/// release both: the device is there and usable by this process. The error names the
/// devices there are.
pub fn probe(name: Option<&str>) -> Result<DeviceInfo, Error> {
    let lib = Lib::load().map_err(Error::Load)?;
    with_list(|list| {
        let found: Vec<DeviceInfo> = list.iter().map(|&d| info(d)).collect();
        let at = match name {
            None => (!found.is_empty()).then_some(0),
            Some(n) => found.iter().position(|d| d.name == n),
        };
        let Some(at) = at else {
            return Err(Error::NoDevice {
                wanted: name.map(str::to_owned),
                found: found.into_iter().map(|d| d.name).collect(),
            });
        };
        // SAFETY: a device of the live list.
        let ctx = unsafe { (lib.ibv.open_device)(list[at]) };
        if ctx.is_null() {
            return Err(Error::call("ibv_open_device"));
        }
        // SAFETY: `ctx` is the open context.
        let pd = unsafe { (lib.ibv.alloc_pd)(ctx) };
        let r = if pd.is_null() {
            Err(Error::call("ibv_alloc_pd"))
        } else {
            // SAFETY: allocated just above, released once.
            unsafe { (lib.ibv.dealloc_pd)(pd) };
            Ok(found[at].clone())
        };
        // SAFETY: opened above, closed once.
        unsafe { (lib.ibv.close_device)(ctx) };
        r
    })
}
