//! rdma-core's stable ABI, loaded at run time: the structs (or the prefixes of them this
//! crate reads) of `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`, and the functions of
//! `libibverbs.so.1` and `librdmacm.so.1` found with `dlopen`/`dlsym`.
//!
//! Nothing here is linked at build time: a build of this crate needs no RDMA library,
//! and a host without one gets [`Lib::load`]'s error, not a failed start.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are inline functions in
//! `verbs.h`, not exported symbols: they call through the `ops` table of the queue
//! pair's or completion queue's `struct ibv_context`, and so do we ([`ContextPrefix`]).
//! Only the public, ABI-stable layouts are used (the ones rdma-core keeps for binary
//! compatibility since `IBVERBS_1.1`); where a struct is only read, only its prefix is
//! declared, and structs this crate passes in are declared whole with their sizes
//! checked below.

use libc::{c_char, c_int, c_uint, c_void, sockaddr};
use std::sync::OnceLock;

/// The sonames tried, as the distribution's runtime packages install them
/// (`libibverbs1`, `librdmacm1`).
pub const IBVERBS_SONAME: &str = "libibverbs.so.1";
pub const RDMACM_SONAME: &str = "librdmacm.so.1";

// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
// enum ibv_qp_type
pub const IBV_QPT_RC: c_int = 2;
// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_RDMA_READ: c_int = 4;
// enum ibv_send_flags
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
// enum ibv_wc_status / ibv_wc_opcode
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_LOC_PROT_ERR: c_int = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_int = 5;
pub const IBV_WC_SEND: c_int = 0;
pub const IBV_WC_RDMA_WRITE: c_int = 1;
pub const IBV_WC_RDMA_READ: c_int = 2;
pub const IBV_WC_RECV: c_int = 1 << 7;
// enum ibv_wc_flags
pub const IBV_WC_WITH_INV: c_uint = 1 << 3;
// enum ibv_transport_type
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_TRANSPORT_IWARP: c_int = 1;
// enum rdma_port_space, enum rdma_cm_event_type
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_int = 0;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_int = 2;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_int = 4;
pub const RDMA_CM_EVENT_ESTABLISHED: c_int = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_int = 10;

/// `struct ibv_device` up to its name (after two obsolete function pointers).
#[repr(C)]
pub struct DevicePrefix {
    _ops: [*const c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
}

type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut RecvWr, *mut *mut RecvWr) -> c_int;

/// `struct ibv_context` up to the `ops` entries this crate calls: `ops` is 11
/// pointers, `poll_cq`, `req_notify_cq`, 12 pointers, `post_send`, `post_recv`.
#[repr(C)]
pub struct ContextPrefix {
    pub device: *mut c_void,
    _ops0: [*const c_void; 11],
    pub poll_cq: Option<PollCq>,
    _req_notify_cq: *const c_void,
    _ops1: [*const c_void; 12],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
}

/// `struct ibv_mr` (read only).
#[repr(C)]
pub struct Mr {
    pub context: *mut c_void,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`, with its unions flattened to the `rdma` member (the only one
/// this crate fills) and padding to the size of the largest members.
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    pub imm_data: u32,
    /// `wr.rdma.remote_addr`
    pub remote_addr: u64,
    /// `wr.rdma.rkey`
    pub rkey: u32,
    /// The rest of `wr` (its largest member, `atomic`, is 32 bytes).
    _wr_rest: [u32; 5],
    /// `qp_type.xrc.remote_srqn` and padding.
    _qp_type: [u32; 2],
    /// `bind_mw` / `tso` (48 bytes).
    _tail: [u64; 6],
}

impl SendWr {
    pub fn zeroed() -> SendWr {
        SendWr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: [0; 2],
            _tail: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp` up to the context (whose `ops` post work).
#[repr(C)]
pub struct QpPrefix {
    pub context: *mut c_void,
}

/// `struct ibv_cq` up to the context (whose `ops` poll it).
#[repr(C)]
pub struct CqPrefix {
    pub context: *mut c_void,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct EventChannel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` up to the addresses of its route (`route.addr.src_*`, `dst_*`).
#[repr(C)]
pub struct CmIdPrefix {
    pub verbs: *mut c_void,
    pub channel: *mut EventChannel,
    pub context: *mut c_void,
    pub qp: *mut c_void,
    pub src: libc::sockaddr_storage,
    pub dst: libc::sockaddr_storage,
}

/// `struct rdma_conn_param`.
#[repr(C)]
pub struct ConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` up to its status.
#[repr(C)]
pub struct CmEventPrefix {
    pub id: *mut c_void,
    pub listen_id: *mut c_void,
    pub event: c_int,
    pub status: c_int,
}

// Sizes and offsets as clang lays out rdma-core's public headers on x86-64 (LP64),
// checked with offsetof/sizeof against them.
const _: () = assert!(std::mem::size_of::<Sge>() == 16);
const _: () = assert!(std::mem::size_of::<SendWr>() == 128);
const _: () = assert!(std::mem::offset_of!(SendWr, remote_addr) == 40);
const _: () = assert!(std::mem::size_of::<RecvWr>() == 32);
const _: () = assert!(std::mem::size_of::<Wc>() == 48);
const _: () = assert!(std::mem::size_of::<QpInitAttr>() == 64);
const _: () = assert!(std::mem::size_of::<ConnParam>() == 24);
const _: () = assert!(std::mem::offset_of!(ContextPrefix, poll_cq) == 8 + 11 * 8);
const _: () = assert!(std::mem::offset_of!(ContextPrefix, post_send) == 8 + 25 * 8);
const _: () = assert!(std::mem::offset_of!(ContextPrefix, post_recv) == 216);
const _: () = assert!(std::mem::offset_of!(SendWr, rkey) == 48);
const _: () = assert!(std::mem::offset_of!(Wc, wc_flags) == 36);
const _: () = assert!(std::mem::offset_of!(QpInitAttr, qp_type) == 52);
const _: () = assert!(std::mem::offset_of!(CmEventPrefix, status) == 20);
const _: () = assert!(std::mem::offset_of!(Mr, rkey) == 40);
const _: () = assert!(std::mem::offset_of!(DevicePrefix, name) == 24);
const _: () = assert!(std::mem::offset_of!(CmIdPrefix, src) == 32);
const _: () = assert!(std::mem::offset_of!(CmIdPrefix, dst) == 32 + 128);

/// The functions of `libibverbs.so.1` this crate calls.
pub struct Ibverbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut DevicePrefix,
    pub free_device_list: unsafe extern "C" fn(*mut *mut DevicePrefix),
    pub open_device: unsafe extern "C" fn(*mut DevicePrefix) -> *mut c_void,
    pub close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut Mr,
    pub dereg_mr: unsafe extern "C" fn(*mut Mr) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(c_int) -> *const c_char,
    _lib: libloading::Library,
}

/// The functions of `librdmacm.so.1` this crate calls.
pub struct Rdmacm {
    pub create_event_channel: unsafe extern "C" fn() -> *mut EventChannel,
    pub destroy_event_channel: unsafe extern "C" fn(*mut EventChannel),
    pub create_id:
        unsafe extern "C" fn(*mut EventChannel, *mut *mut CmIdPrefix, *mut c_void, c_int) -> c_int,
    pub destroy_id: unsafe extern "C" fn(*mut CmIdPrefix) -> c_int,
    pub bind_addr: unsafe extern "C" fn(*mut CmIdPrefix, *const sockaddr) -> c_int,
    pub listen: unsafe extern "C" fn(*mut CmIdPrefix, c_int) -> c_int,
    pub resolve_addr:
        unsafe extern "C" fn(*mut CmIdPrefix, *const sockaddr, *const sockaddr, c_int) -> c_int,
    pub resolve_route: unsafe extern "C" fn(*mut CmIdPrefix, c_int) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut CmIdPrefix, *mut c_void, *mut QpInitAttr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut CmIdPrefix),
    pub connect: unsafe extern "C" fn(*mut CmIdPrefix, *mut ConnParam) -> c_int,
    pub accept: unsafe extern "C" fn(*mut CmIdPrefix, *mut ConnParam) -> c_int,
    pub disconnect: unsafe extern "C" fn(*mut CmIdPrefix) -> c_int,
    pub migrate_id: unsafe extern "C" fn(*mut CmIdPrefix, *mut EventChannel) -> c_int,
    pub get_cm_event: unsafe extern "C" fn(*mut EventChannel, *mut *mut CmEventPrefix) -> c_int,
    pub ack_cm_event: unsafe extern "C" fn(*mut CmEventPrefix) -> c_int,
    pub event_str: unsafe extern "C" fn(c_int) -> *const c_char,
    _lib: libloading::Library,
}

/// rdma-core, loaded once per process.
pub struct Lib {
    pub ibv: Ibverbs,
    pub cm: Rdmacm,
}

/// Why rdma-core could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError(pub String);

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! sym {
    ($lib:expr, $soname:expr, $name:literal) => {{
        // SAFETY: the symbol's type is the prototype of rdma-core's public header,
        // declared above with the same argument and return types.
        match unsafe { $lib.get(concat!($name, "\0").as_bytes()) } {
            Ok(s) => *s,
            Err(e) => return Err(LoadError(format!("{}: no {}: {e}", $soname, $name))),
        }
    }};
}

fn open(soname: &str, package: &str) -> Result<libloading::Library, LoadError> {
    // SAFETY: loading rdma-core runs its constructors, which only set up its own
    // state (provider lists, locks); it is the library every verbs program loads.
    unsafe { libloading::Library::new(soname) }.map_err(|e| {
        LoadError(format!(
            "{soname} not loadable ({e}): apt-get install {package}"
        ))
    })
}

impl Ibverbs {
    fn load() -> Result<Ibverbs, LoadError> {
        let l = open(IBVERBS_SONAME, "libibverbs1 ibverbs-providers")?;
        let s = IBVERBS_SONAME;
        Ok(Ibverbs {
            get_device_list: sym!(l, s, "ibv_get_device_list"),
            free_device_list: sym!(l, s, "ibv_free_device_list"),
            open_device: sym!(l, s, "ibv_open_device"),
            close_device: sym!(l, s, "ibv_close_device"),
            alloc_pd: sym!(l, s, "ibv_alloc_pd"),
            dealloc_pd: sym!(l, s, "ibv_dealloc_pd"),
            reg_mr: sym!(l, s, "ibv_reg_mr"),
            dereg_mr: sym!(l, s, "ibv_dereg_mr"),
            create_cq: sym!(l, s, "ibv_create_cq"),
            destroy_cq: sym!(l, s, "ibv_destroy_cq"),
            wc_status_str: sym!(l, s, "ibv_wc_status_str"),
            _lib: l,
        })
    }
}

impl Rdmacm {
    fn load() -> Result<Rdmacm, LoadError> {
        let l = open(RDMACM_SONAME, "librdmacm1")?;
        let s = RDMACM_SONAME;
        Ok(Rdmacm {
            create_event_channel: sym!(l, s, "rdma_create_event_channel"),
            destroy_event_channel: sym!(l, s, "rdma_destroy_event_channel"),
            create_id: sym!(l, s, "rdma_create_id"),
            destroy_id: sym!(l, s, "rdma_destroy_id"),
            bind_addr: sym!(l, s, "rdma_bind_addr"),
            listen: sym!(l, s, "rdma_listen"),
            resolve_addr: sym!(l, s, "rdma_resolve_addr"),
            resolve_route: sym!(l, s, "rdma_resolve_route"),
            create_qp: sym!(l, s, "rdma_create_qp"),
            destroy_qp: sym!(l, s, "rdma_destroy_qp"),
            connect: sym!(l, s, "rdma_connect"),
            accept: sym!(l, s, "rdma_accept"),
            disconnect: sym!(l, s, "rdma_disconnect"),
            migrate_id: sym!(l, s, "rdma_migrate_id"),
            get_cm_event: sym!(l, s, "rdma_get_cm_event"),
            ack_cm_event: sym!(l, s, "rdma_ack_cm_event"),
            event_str: sym!(l, s, "rdma_event_str"),
            _lib: l,
        })
    }
}

impl Lib {
    /// rdma-core, loaded on the first call; the same error on every call if it is not
    /// installed (the process does not retry a `dlopen` that failed).
    pub fn load() -> Result<&'static Lib, LoadError> {
        static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();
        LIB.get_or_init(|| {
            Ok(Lib {
                ibv: Ibverbs::load()?,
                cm: Rdmacm::load()?,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }
}

/// A C string from rdma-core (static names), or `?`.
///
/// # Safety
/// `p` is null or a NUL-terminated string that lives through the call.
pub unsafe fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: (caller) NUL-terminated and live: rdma-core's device names, status and
    // event names.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The context's `ops` of an object whose first field is its `struct ibv_context *`
/// (a queue pair, a completion queue).
///
/// # Safety
/// `obj` is a live `ibv_qp` or `ibv_cq` of `libibverbs`.
pub unsafe fn ops_of(obj: *mut c_void) -> &'static ContextPrefix {
    // SAFETY: (caller) `obj` is live; its first field is its context, live as long.
    unsafe { &*((*(obj as *mut QpPrefix)).context as *const ContextPrefix) }
}
