//! One reliable-connected queue pair on a real RDMA device, connected with the RDMA
//! connection manager (librdmacm), with its protection domain, completion queue and
//! memory regions: the verbs-shaped API of `farside_iwarp` (register, post Write, Read,
//! Send and receives, poll completions) over an RNIC, siw or rxe.
//!
//! ```text
//!  Conn::connect(ip:port)   resolve address (picks the device that routes to it) ─ route ─
//!                           PD, CQ, RC QP ─ rdma_connect (an iWARP device runs MPA) ─ ESTABLISHED
//!  Listener::accept         CONNECT_REQUEST ─ own event channel ─ PD, CQ, QP ─ rdma_accept ─ ESTABLISHED
//! ```
//!
//! A region is a buffer this connection owns (zeroed) or a shared read-only one
//! (`Arc<[u8]>`, registered without a copy, never writable locally or remotely), as in
//! the software stack. Its handle is its rkey; the peer addresses it by rkey and the
//! buffer's virtual address ([`Conn::remote_to`]), the verbs convention (the software
//! stack's regions start at tagged offset 0). The software stack's bounds apply:
//! [`MR_MAX`] regions, [`MR_BYTES_MAX`] bytes each, [`CQ_DEPTH_MAX`] completions.
//! Registered bytes are pinned by the kernel (RLIMIT_MEMLOCK); the caller's budget
//! caps them, as it caps the software stack's.

use crate::sys::{self, Lib};
use crate::Error;
use farside_iwarp::verbs::{
    Access, AccessError, VerbsError, Wc, WcOpcode, WcStatus, CQ_DEPTH_MAX, MR_BYTES_MAX, MR_MAX,
};
use libc::c_void;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Work requests outstanding on a queue pair's send queue (and on its receive queue):
/// a transfer has a Write and a Send, or a Read, and one receive, in flight.
pub const QP_WR_MAX: u32 = 16;
/// Completion queue entries: both queues full, so the CQ cannot overflow.
pub const CQ_ENTRIES: usize = 2 * QP_WR_MAX as usize;
/// RDMA Reads the peer may have outstanding against us, and we against it (IRD/ORD
/// offered at connection), as the software stack's default.
pub const READS_IN_FLIGHT: u8 = 8;
/// Longest sleep between two empty polls of the completion queue while waiting: a
/// completion is seen at most this late (a busy poll would hold a CPU the loaded
/// server does not have).
pub const POLL_SLEEP_MAX: Duration = Duration::from_millis(1);
/// Listen backlog of a [`Listener`].
pub const LISTEN_BACKLOG: i32 = 16;

const _: () = assert!(CQ_ENTRIES <= CQ_DEPTH_MAX);

fn verbs_access(a: Access) -> libc::c_int {
    let mut f = 0;
    if a.contains(Access::LOCAL_WRITE) {
        f |= sys::IBV_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        // Verbs requires local write with remote write.
        f |= sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::IBV_ACCESS_REMOTE_READ;
    }
    f
}

enum Buf {
    Owned(Box<[u8]>),
    Shared(Arc<[u8]>),
}

impl Buf {
    fn ptr(&self) -> *const u8 {
        match self {
            Buf::Owned(b) => b.as_ptr(),
            Buf::Shared(a) => a.as_ptr(),
        }
    }
}

struct Region {
    mr: *mut sys::Mr,
    buf: Buf,
}

impl Region {
    fn mr(&self) -> &sys::Mr {
        // SAFETY: registered until the region is dropped from the table.
        unsafe { &*self.mr }
    }
}

/// A socket address as a `sockaddr_storage` for librdmacm.
fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
        }
    }
    ss
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr_storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr_storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(std::net::SocketAddrV6::new(ip, port, 0, sin6.sin6_scope_id).into())
        }
        _ => None,
    }
}

/// An event channel and one id on it, destroyed together (id first).
struct Cm {
    lib: &'static Lib,
    channel: *mut sys::EventChannel,
    id: *mut sys::CmIdPrefix,
}

impl Cm {
    fn new(lib: &'static Lib) -> Result<Cm, Error> {
        // SAFETY: rdma-core prototypes; results checked before use.
        let channel = unsafe { (lib.cm.create_event_channel)() };
        if channel.is_null() {
            return Err(Error::call("rdma_create_event_channel"));
        }
        let mut cm = Cm {
            lib,
            channel,
            id: std::ptr::null_mut(),
        };
        // SAFETY: `channel` is live; `cm.id` is a valid out pointer.
        let r = unsafe {
            (lib.cm.create_id)(channel, &mut cm.id, std::ptr::null_mut(), sys::RDMA_PS_TCP)
        };
        if r != 0 {
            return Err(Error::call("rdma_create_id"));
        }
        Ok(cm)
    }

    /// The next event on the channel, within `timeout`: its type and status, and the
    /// id it is for (a new id for a connect request).
    fn event(&self, timeout: Duration) -> Result<(i32, i32, *mut sys::CmIdPrefix), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                // SAFETY: the channel is live.
                fd: unsafe { (*self.channel).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => return Err(Error::Timeout("rdma_cm event")),
                n if n < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(Error::Call("poll", e));
                }
                _ => {}
            }
            let mut ev: *mut sys::CmEventPrefix = std::ptr::null_mut();
            // SAFETY: the channel is readable, so this does not block; `ev` is an out
            // pointer.
            if unsafe { (self.lib.cm.get_cm_event)(self.channel, &mut ev) } != 0 {
                return Err(Error::call("rdma_get_cm_event"));
            }
            // SAFETY: a live event until acknowledged below.
            let (kind, status, id) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
            // SAFETY: acknowledged once; the id it names stays live.
            unsafe { (self.lib.cm.ack_cm_event)(ev) };
            return Ok((kind, status, id as *mut sys::CmIdPrefix));
        }
    }

    /// Wait for event `want` (an error event, or another, fails the step).
    fn expect(&self, step: &'static str, want: i32, timeout: Duration) -> Result<(), Error> {
        let (kind, status, _) = self.event(timeout)?;
        if kind == want && status == 0 {
            return Ok(());
        }
        Err(Error::Cm {
            step,
            // SAFETY: rdma-core's static event name.
            got: format!("{} (status {status})", unsafe {
                sys::c_str((self.lib.cm.event_str)(kind))
            }),
        })
    }
}

impl Drop for Cm {
    fn drop(&mut self) {
        // SAFETY: created by this Cm, destroyed once, id before its channel.
        unsafe {
            if !self.id.is_null() {
                (self.lib.cm.destroy_id)(self.id);
            }
            (self.lib.cm.destroy_event_channel)(self.channel);
        }
    }
}

/// The device objects of a connection: PD and CQ on the id's device, the QP on the id.
struct Objects {
    lib: &'static Lib,
    pd: *mut c_void,
    cq: *mut c_void,
    qp: *mut c_void,
}

impl Objects {
    fn new(cm: &Cm) -> Result<Objects, Error> {
        let lib = cm.lib;
        // SAFETY: the id is live and bound to a device (its address was resolved or it
        // came from a connect request), so `verbs` is its open context.
        let ctx = unsafe { (*cm.id).verbs };
        if ctx.is_null() {
            return Err(Error::Cm {
                step: "device",
                got: "the id has no device".into(),
            });
        }
        let mut o = Objects {
            lib,
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
        };
        // SAFETY: rdma-core prototypes on the live context; each result checked, and
        // released in Drop.
        o.pd = unsafe { (lib.ibv.alloc_pd)(ctx) };
        if o.pd.is_null() {
            return Err(Error::call("ibv_alloc_pd"));
        }
        o.cq = unsafe {
            (lib.ibv.create_cq)(
                ctx,
                CQ_ENTRIES as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if o.cq.is_null() {
            return Err(Error::call("ibv_create_cq"));
        }
        let mut attr = sys::QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: o.cq,
            recv_cq: o.cq,
            srq: std::ptr::null_mut(),
            cap: sys::QpCap {
                max_send_wr: QP_WR_MAX,
                max_recv_wr: QP_WR_MAX,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live id, PD and attributes; the QP is the id's until rdma_destroy_qp.
        if unsafe { (lib.cm.create_qp)(cm.id, o.pd, &mut attr) } != 0 {
            return Err(Error::call("rdma_create_qp"));
        }
        // SAFETY: set by rdma_create_qp.
        o.qp = unsafe { (*cm.id).qp };
        Ok(o)
    }
}

/// One connected RC queue pair (see the module doc). Every method takes `&self`: the
/// region table has its own lock, and posting and polling are thread-safe in verbs.
pub struct Conn {
    lib: &'static Lib,
    regions: Mutex<Vec<Region>>,
    objects: Objects,
    cm: Cm,
    device: String,
    peer: SocketAddr,
    /// A completion failed or the peer disconnected: the queue pair is in error.
    broken: AtomicBool,
}

// SAFETY: the raw pointers are rdma-core objects, which verbs allows to be used from
// any thread (posting, polling, registration are thread-safe in libibverbs); the
// region table is behind a Mutex and the buffers it owns are only touched under it.
unsafe impl Send for Conn {}
// SAFETY: as above: `&self` methods only call thread-safe verbs or take the lock.
unsafe impl Sync for Conn {}

fn conn_param() -> sys::ConnParam {
    sys::ConnParam {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: READS_IN_FLIGHT,
        initiator_depth: READS_IN_FLIGHT,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

impl Conn {
    /// Connect to the RDMA endpoint `to` (an iWARP device runs the MPA set-up with it as
    /// initiator, so `to` may be a software iWARP responder). The device is the one
    /// that routes to `to`; with `device`, it must be that one. Each step is bounded by
    /// `timeout`.
    pub fn connect(to: SocketAddr, device: Option<&str>, timeout: Duration) -> Result<Conn, Error> {
        let lib = Lib::load().map_err(Error::Load)?;
        let found = crate::device::devices()?;
        if found.is_empty() {
            return Err(Error::NoDevice {
                wanted: device.map(str::to_owned),
                found: Vec::new(),
            });
        }
        let cm = Cm::new(lib)?;
        let dst = sockaddr(to);
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: live id; `dst` outlives the call (librdmacm copies it).
        if unsafe {
            (lib.cm.resolve_addr)(cm.id, std::ptr::null(), &dst as *const _ as *const _, ms)
        } != 0
        {
            return Err(Error::call("rdma_resolve_addr"));
        }
        cm.expect("resolve address", sys::RDMA_CM_EVENT_ADDR_RESOLVED, timeout)?;
        let name = id_device(&cm);
        if let Some(want) = device {
            if want != name {
                return Err(Error::NoDevice {
                    wanted: Some(want.to_owned()),
                    found: vec![format!("{name} (the device routing to {to})")],
                });
            }
        }
        // SAFETY: live id with a resolved address.
        if unsafe { (lib.cm.resolve_route)(cm.id, ms) } != 0 {
            return Err(Error::call("rdma_resolve_route"));
        }
        cm.expect("resolve route", sys::RDMA_CM_EVENT_ROUTE_RESOLVED, timeout)?;
        let objects = Objects::new(&cm)?;
        let conn = Conn::assemble(lib, cm, objects, name, to);
        let mut param = conn_param();
        // SAFETY: live id with its QP; `param` outlives the call.
        if unsafe { (lib.cm.connect)(conn.cm.id, &mut param) } != 0 {
            return Err(Error::call("rdma_connect"));
        }
        conn.cm
            .expect("connect", sys::RDMA_CM_EVENT_ESTABLISHED, timeout)?;
        Ok(conn)
    }

    fn assemble(
        lib: &'static Lib,
        cm: Cm,
        objects: Objects,
        device: String,
        peer: SocketAddr,
    ) -> Conn {
        Conn {
            lib,
            regions: Mutex::new(Vec::new()),
            objects,
            cm,
            device,
            peer,
            broken: AtomicBool::new(false),
        }
    }

    /// The device this connection runs on.
    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn regions(&self) -> MutexGuard<'_, Vec<Region>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, buf: Buf, len: usize, access: Access) -> Result<u32, Error> {
        if len == 0 || len > MR_BYTES_MAX {
            return Err(Error::Verbs(VerbsError::BadLength(len)));
        }
        let mut regions = self.regions();
        if regions.len() >= MR_MAX {
            return Err(Error::Verbs(VerbsError::Full("memory regions", MR_MAX)));
        }
        // SAFETY: the buffer is `len` bytes and lives in the table until deregistered;
        // a shared one is registered without any write access.
        let mr = unsafe {
            (self.lib.ibv.reg_mr)(
                self.objects.pd,
                buf.ptr() as *mut c_void,
                len,
                verbs_access(access),
            )
        };
        if mr.is_null() {
            return Err(Error::call("ibv_reg_mr"));
        }
        let region = Region { mr, buf };
        let rkey = region.mr().rkey;
        regions.push(region);
        Ok(rkey)
    }

    /// Register a zeroed region of `len` bytes; its handle (rkey).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<u32, Error> {
        if len == 0 || len > MR_BYTES_MAX {
            return Err(Error::Verbs(VerbsError::BadLength(len)));
        }
        self.insert(Buf::Owned(vec![0; len].into_boxed_slice()), len, access)
    }

    /// Register `buf` read-only, without a copy (no local or remote write access).
    pub fn reg_shared(&self, buf: Arc<[u8]>, access: Access) -> Result<u32, Error> {
        if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
            return Err(Error::Verbs(VerbsError::Access(AccessError::AccessPerm)));
        }
        let len = buf.len();
        self.insert(Buf::Shared(buf), len, access)
    }

    /// Deregister region `rkey`; its buffer is freed (or its share dropped).
    pub fn dereg_mr(&self, rkey: u32) -> Result<(), Error> {
        let mut regions = self.regions();
        let at = regions
            .iter()
            .position(|r| r.mr().rkey == rkey)
            .ok_or(Error::Verbs(VerbsError::Access(AccessError::InvalidStag)))?;
        let r = regions.swap_remove(at);
        // SAFETY: registered by this connection, deregistered once, before its buffer
        // is dropped (with `r`).
        if unsafe { (self.lib.ibv.dereg_mr)(r.mr) } != 0 {
            return Err(Error::call("ibv_dereg_mr"));
        }
        Ok(())
    }

    /// Where the peer addresses byte 0 of region `rkey` (its virtual address).
    pub fn remote_to(&self, rkey: u32) -> Option<u64> {
        let regions = self.regions();
        let r = regions.iter().find(|r| r.mr().rkey == rkey)?;
        Some(r.buf.ptr() as u64)
    }

    /// `f` on the bytes of region `rkey` (owned: mutable), bounds checked.
    fn with_bytes<R>(
        &self,
        rkey: u32,
        off: usize,
        len: usize,
        f: impl FnOnce(Option<&mut [u8]>, &[u8]) -> R,
    ) -> Result<R, Error> {
        let mut regions = self.regions();
        let r = regions
            .iter_mut()
            .find(|r| r.mr().rkey == rkey)
            .ok_or(Error::Verbs(VerbsError::Access(AccessError::InvalidStag)))?;
        let end = off
            .checked_add(len)
            .ok_or(Error::Verbs(VerbsError::Access(AccessError::ToWrap)))?;
        match &mut r.buf {
            Buf::Owned(b) if end <= b.len() => Ok(f(Some(&mut b[off..end]), &[])),
            Buf::Shared(a) if end <= a.len() => Ok(f(None, &a[off..end])),
            _ => Err(Error::Verbs(VerbsError::Access(AccessError::BaseBounds))),
        }
    }

    /// Copy `data` into owned region `rkey` at `off` (not while the device may be
    /// writing there: the caller's protocol orders it).
    pub fn write(&self, rkey: u32, off: usize, data: &[u8]) -> Result<(), Error> {
        self.with_bytes(rkey, off, data.len(), |owned, _| match owned {
            Some(dst) => {
                dst.copy_from_slice(data);
                Ok(())
            }
            None => Err(Error::Verbs(VerbsError::Access(AccessError::AccessPerm))),
        })?
    }

    /// A copy of `len` bytes of region `rkey` at `off`.
    pub fn read(&self, rkey: u32, off: usize, len: usize) -> Result<Vec<u8>, Error> {
        self.with_bytes(rkey, off, len, |owned, shared| match owned {
            Some(b) => b.to_vec(),
            None => shared.to_vec(),
        })
    }

    /// The SGE of `len` bytes at `off` of local region `rkey`.
    fn sge(&self, rkey: u32, off: usize, len: usize) -> Result<sys::Sge, Error> {
        let regions = self.regions();
        let r = regions
            .iter()
            .find(|r| r.mr().rkey == rkey)
            .ok_or(Error::Verbs(VerbsError::Access(AccessError::InvalidStag)))?;
        let end = off
            .checked_add(len)
            .ok_or(Error::Verbs(VerbsError::Access(AccessError::ToWrap)))?;
        if end > r.mr().length {
            return Err(Error::Verbs(VerbsError::Access(AccessError::BaseBounds)));
        }
        Ok(sys::Sge {
            addr: r.buf.ptr() as u64 + off as u64,
            length: u32::try_from(len).map_err(|_| Error::Verbs(VerbsError::BadLength(len)))?,
            lkey: r.mr().lkey,
        })
    }

    fn post(
        &self,
        wr_id: u64,
        opcode: i32,
        flags: u32,
        mut sge: sys::Sge,
        remote: (u32, u64),
    ) -> Result<(), Error> {
        let mut wr = sys::SendWr::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = opcode;
        wr.send_flags = sys::IBV_SEND_SIGNALED | flags;
        wr.rkey = remote.0;
        wr.remote_addr = remote.1;
        let mut bad: *mut sys::SendWr = std::ptr::null_mut();
        // SAFETY: the QP is live; `wr` and its SGE outlive the call (the provider
        // copies them into its send queue); the SGE's memory is registered.
        let r = unsafe {
            let ops = sys::ops_of(self.objects.qp);
            let post = ops.post_send.ok_or(Error::call("ibv_post_send (no op)"))?;
            post(self.objects.qp, &mut wr, &mut bad)
        };
        Error::returned("ibv_post_send", r)
    }

    /// RDMA Write `len` bytes at `off` of local region `rkey` to the peer's
    /// `remote_stag`/`remote_to`.
    pub fn post_write(
        &self,
        wr_id: u64,
        rkey: u32,
        off: usize,
        len: usize,
        remote_stag: u32,
        remote_to: u64,
    ) -> Result<(), Error> {
        let sge = self.sge(rkey, off, len)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_WRITE,
            0,
            sge,
            (remote_stag, remote_to),
        )
    }

    /// RDMA Read `len` bytes from the peer's `remote_stag`/`remote_to` into local
    /// region `rkey` at `off`.
    pub fn post_read(
        &self,
        wr_id: u64,
        rkey: u32,
        off: usize,
        len: usize,
        remote_stag: u32,
        remote_to: u64,
    ) -> Result<(), Error> {
        let sge = self.sge(rkey, off, len)?;
        self.post(
            wr_id,
            sys::IBV_WR_RDMA_READ,
            0,
            sge,
            (remote_stag, remote_to),
        )
    }

    /// Send `len` bytes at `off` of local region `rkey`, solicited if asked.
    pub fn post_send(
        &self,
        wr_id: u64,
        rkey: u32,
        off: usize,
        len: usize,
        solicited: bool,
    ) -> Result<(), Error> {
        let sge = self.sge(rkey, off, len)?;
        let flags = if solicited {
            sys::IBV_SEND_SOLICITED
        } else {
            0
        };
        self.post(wr_id, sys::IBV_WR_SEND, flags, sge, (0, 0))
    }

    /// Post a receive into `len` bytes at `off` of local region `rkey`.
    pub fn post_recv(&self, wr_id: u64, rkey: u32, off: usize, len: usize) -> Result<(), Error> {
        let mut sge = self.sge(rkey, off, len)?;
        let mut wr = sys::RecvWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut sys::RecvWr = std::ptr::null_mut();
        // SAFETY: as post_send.
        let r = unsafe {
            let ops = sys::ops_of(self.objects.qp);
            let post = ops.post_recv.ok_or(Error::call("ibv_post_recv (no op)"))?;
            post(self.objects.qp, &mut wr, &mut bad)
        };
        Error::returned("ibv_post_recv", r)
    }

    /// The next completion, or `None` once `timeout` passed without one.
    pub fn wait_wc(&self, timeout: Duration) -> Option<Wc> {
        let deadline = Instant::now() + timeout;
        let mut sleep = Duration::from_micros(1);
        loop {
            let mut wc = sys::Wc::default();
            // SAFETY: the CQ is live; one entry of room.
            let n = unsafe {
                let ops = sys::ops_of(self.objects.cq);
                match ops.poll_cq {
                    Some(poll) => poll(self.objects.cq, 1, &mut wc),
                    None => -1,
                }
            };
            if n > 0 {
                return Some(self.to_wc(&wc));
            }
            if n < 0 {
                self.broken.store(true, Ordering::Relaxed);
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(sleep.min(deadline - now));
            sleep = (sleep * 2).min(POLL_SLEEP_MAX);
        }
    }

    fn to_wc(&self, wc: &sys::Wc) -> Wc {
        if wc.status != sys::IBV_WC_SUCCESS {
            self.broken.store(true, Ordering::Relaxed);
            if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                // SAFETY: rdma-core's static status name.
                let s = unsafe { sys::c_str((self.lib.ibv.wc_status_str)(wc.status)) };
                log::warn!("verbs: {} on {}: completion {s}", self.peer, self.device);
            }
        }
        completion(wc)
    }

    /// Close gracefully: disconnect and wait up to `timeout` for the connection manager
    /// to report it closed (on iWARP, after the data posted before went out); whether
    /// it did. The queue pair takes no work after this.
    pub fn disconnect(&self, timeout: Duration) -> bool {
        self.broken.store(true, Ordering::Relaxed);
        // SAFETY: a live, connected id.
        if unsafe { (self.lib.cm.disconnect)(self.cm.id) } != 0 {
            return false;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.cm.event(left) {
                Ok((sys::RDMA_CM_EVENT_DISCONNECTED, _, _)) => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Whether the connection still takes work: no failed completion and no
    /// disconnect from the peer.
    pub fn is_up(&self) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        // Any event on an established connection's channel ends it (disconnected,
        // device removal, ...).
        if let Ok((kind, _, _)) = self.cm.event(Duration::ZERO) {
            log::info!("verbs: {} on {}: event {kind}", self.peer, self.device);
            self.broken.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let lib = self.lib;
        // SAFETY: every object was created by this connection and is released once,
        // in the order verbs requires: disconnect, QP, regions, CQ, PD (the id and its
        // channel go with `cm`, after).
        unsafe {
            (lib.cm.disconnect)(self.cm.id);
            if !self.objects.qp.is_null() {
                (lib.cm.destroy_qp)(self.cm.id);
            }
            for r in self.regions().drain(..) {
                (lib.ibv.dereg_mr)(r.mr);
            }
        }
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        // SAFETY: created in Objects::new, released once (the QP was destroyed by the
        // Conn, or never created if `new` failed before it).
        unsafe {
            if !self.cq.is_null() {
                (self.lib.ibv.destroy_cq)(self.cq);
            }
            if !self.pd.is_null() {
                (self.lib.ibv.dealloc_pd)(self.pd);
            }
        }
    }
}

/// A device's completion as the software stack's: every failure but a local
/// protection error is reported as flushed (the queue pair is in error either way; the
/// device's status is logged); opcodes this crate never posts (atomics, binds) do not
/// occur and read as Send.
fn completion(wc: &sys::Wc) -> Wc {
    let opcode = match wc.opcode {
        sys::IBV_WC_RDMA_WRITE => WcOpcode::Write,
        sys::IBV_WC_RDMA_READ => WcOpcode::Read,
        o if o & sys::IBV_WC_RECV != 0 => WcOpcode::Recv,
        _ => WcOpcode::Send,
    };
    let status = match wc.status {
        sys::IBV_WC_SUCCESS => WcStatus::Success,
        sys::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
        _ => WcStatus::Flushed,
    };
    Wc {
        wr_id: wc.wr_id,
        opcode,
        status,
        byte_len: wc.byte_len,
        solicited: false,
        invalidated_stag: (wc.wc_flags & sys::IBV_WC_WITH_INV != 0).then_some(wc.imm_data),
    }
}

/// The name of the device an id is bound to.
fn id_device(cm: &Cm) -> String {
    // SAFETY: a live id; `verbs` (if set) is its open context, whose first field is
    // its device.
    unsafe {
        let ctx = (*cm.id).verbs as *const sys::ContextPrefix;
        if ctx.is_null() {
            return "?".into();
        }
        crate::device::info((*ctx).device as *const sys::DevicePrefix).name
    }
}

/// A passive endpoint: accepts verbs connections on an address of an RDMA device.
pub struct Listener {
    cm: Cm,
}

// SAFETY: the id and channel are only used through `&self` calls librdmacm allows from
// any thread.
unsafe impl Send for Listener {}

impl Listener {
    /// Listen on `addr` (it must be an address of an RDMA device; port 0 picks one).
    pub fn bind(addr: SocketAddr) -> Result<Listener, Error> {
        let lib = Lib::load().map_err(Error::Load)?;
        let cm = Cm::new(lib)?;
        let sa = sockaddr(addr);
        // SAFETY: live id; `sa` outlives the calls.
        unsafe {
            if (lib.cm.bind_addr)(cm.id, &sa as *const _ as *const _) != 0 {
                return Err(Error::call("rdma_bind_addr"));
            }
            if (lib.cm.listen)(cm.id, LISTEN_BACKLOG) != 0 {
                return Err(Error::call("rdma_listen"));
            }
        }
        Ok(Listener { cm })
    }

    /// The address it listens on (the port picked for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live, bound id: its route's source address is set.
        let ss = unsafe { &(*self.cm.id).src };
        from_sockaddr(ss)
    }

    /// Accept one connection, waiting up to `timeout` for it and again for its set-up.
    /// `recvs` receives (`wr_id`, `len`) are posted into a fresh region before the
    /// connection is accepted, so a Send arriving first finds one; their region's rkey
    /// is returned with the connection.
    pub fn accept(
        &self,
        timeout: Duration,
        recvs: &[(u64, usize)],
    ) -> Result<(Conn, Option<u32>), Error> {
        let (kind, _, id) = self.cm.event(timeout)?;
        if kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
            return Err(Error::Cm {
                step: "accept",
                got: format!("event {kind}"),
            });
        }
        let lib = self.cm.lib;
        // The new id moves to its own channel so the connection owns its events.
        // SAFETY: rdma-core prototypes; results checked.
        let channel = unsafe { (lib.cm.create_event_channel)() };
        if channel.is_null() {
            // SAFETY: the new id is ours to destroy.
            unsafe { (lib.cm.destroy_id)(id) };
            return Err(Error::call("rdma_create_event_channel"));
        }
        let cm = Cm { lib, channel, id };
        // SAFETY: live id and channel.
        if unsafe { (lib.cm.migrate_id)(id, channel) } != 0 {
            return Err(Error::call("rdma_migrate_id"));
        }
        let objects = Objects::new(&cm)?;
        let name = id_device(&cm);
        let conn = Conn::assemble(
            lib,
            cm,
            objects,
            name,
            // SAFETY: the id of a connect request has its route's destination set.
            from_sockaddr(unsafe { &(*id).dst }).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        );
        let total: usize = recvs.iter().map(|r| r.1).sum();
        let region = if total > 0 {
            let rkey = conn.reg_mr(total, Access::LOCAL_WRITE)?;
            let mut off = 0;
            for &(wr_id, len) in recvs {
                conn.post_recv(wr_id, rkey, off, len)?;
                off += len;
            }
            Some(rkey)
        } else {
            None
        };
        let mut param = conn_param();
        // SAFETY: live id with its QP; `param` outlives the call.
        if unsafe { (lib.cm.accept)(conn.cm.id, &mut param) } != 0 {
            return Err(Error::call("rdma_accept"));
        }
        conn.cm
            .expect("accept", sys::RDMA_CM_EVENT_ESTABLISHED, timeout)?;
        Ok((conn, region))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(opcode: i32, status: i32, flags: u32) -> Wc {
        completion(&sys::Wc {
            wr_id: 9,
            status,
            opcode,
            byte_len: 100,
            imm_data: 0x1234,
            wc_flags: flags,
            ..Default::default()
        })
    }

    #[test]
    fn device_completions_read_as_the_software_stacks() {
        let ok = sys::IBV_WC_SUCCESS;
        assert_eq!(wc(sys::IBV_WC_RDMA_WRITE, ok, 0).opcode, WcOpcode::Write);
        assert_eq!(wc(sys::IBV_WC_RDMA_READ, ok, 0).opcode, WcOpcode::Read);
        assert_eq!(wc(sys::IBV_WC_SEND, ok, 0).opcode, WcOpcode::Send);
        // IBV_WC_RECV and IBV_WC_RECV_RDMA_WITH_IMM
        assert_eq!(wc(sys::IBV_WC_RECV, ok, 0).opcode, WcOpcode::Recv);
        assert_eq!(wc(sys::IBV_WC_RECV | 1, ok, 0).opcode, WcOpcode::Recv);
        let w = wc(sys::IBV_WC_RECV, ok, 0);
        assert_eq!((w.wr_id, w.status, w.byte_len), (9, WcStatus::Success, 100));
        assert_eq!(w.invalidated_stag, None);
        assert_eq!(
            wc(sys::IBV_WC_RECV, ok, sys::IBV_WC_WITH_INV).invalidated_stag,
            Some(0x1234)
        );
        assert_eq!(
            wc(sys::IBV_WC_RDMA_WRITE, sys::IBV_WC_LOC_PROT_ERR, 0).status,
            WcStatus::LocalProtection
        );
        for failed in [
            sys::IBV_WC_WR_FLUSH_ERR,
            10, /* REM_ACCESS_ERR */
            12, /* RETRY_EXC_ERR */
        ] {
            assert_eq!(wc(sys::IBV_WC_SEND, failed, 0).status, WcStatus::Flushed);
        }
    }

    #[test]
    fn access_rights_map_to_verbs_flags() {
        assert_eq!(verbs_access(Access::NONE), 0);
        assert_eq!(
            verbs_access(Access::LOCAL_WRITE),
            sys::IBV_ACCESS_LOCAL_WRITE
        );
        assert_eq!(
            verbs_access(Access::REMOTE_READ),
            sys::IBV_ACCESS_REMOTE_READ
        );
        // Verbs refuses remote write without local write.
        assert_eq!(
            verbs_access(Access::REMOTE_WRITE),
            sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_LOCAL_WRITE
        );
    }

    #[test]
    fn socket_addresses_round_trip_through_sockaddr_storage() {
        for a in ["10.1.2.3:4791", "[fe80::1%2]:8080", "[::1]:1"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&sockaddr(a)), Some(a));
        }
    }
}
