//! The verbs-shaped resources: protection domains, memory regions, completion queues
//! (the queue pair is [`crate::qp`]). Shaped after the RDMA verbs (RDMAC verbs spec,
//! OpenFabrics `ibv_*`), owned by one [`Device`] per endpoint.
//!
//! A memory region is a buffer this stack owns (no `unsafe`, no pinning: the
//! application reads and writes it through [`Device::read`] and [`Device::write`]),
//! starting at a tagged offset `base_to` of the application's choosing. Its **STag** is
//! `index << 8 | key` as in Linux siw: the index finds the region, the 8-bit key is
//! random per registration, so a stale or guessed STag of a re-registered index fails.
//!
//! Every inbound placement is checked ([`Device::check`]) in siw's order: STag (valid
//! and the same key), protection domain, access rights, TO wrap, base and bounds.
//! Each failure is an [`AccessError`], which the queue pair turns into the DDP
//! (tagged placement) or RDMAP (Read Request source) Terminate code.

use crate::term::TermCode;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

/// Protection domains per device.
pub const PD_MAX: usize = 64;
/// Memory regions per device: the STag index space in use (siw's is 24 bits).
pub const MR_MAX: usize = 4096;
/// Largest region: each is an owned buffer, so this bounds one registration's memory.
pub const MR_BYTES_MAX: usize = 64 << 20;
/// Deepest completion queue.
pub const CQ_DEPTH_MAX: usize = 65536;

/// Access rights of a memory region (bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(pub u8);

impl Access {
    /// Local reads are always allowed (verbs); this grants local writes (receive
    /// buffers, Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const NONE: Access = Access(0);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// One registered region.
#[derive(Debug, Clone)]
pub struct Mr {
    pub stag: u32,
    pub pd: PdId,
    pub base_to: u64,
    pub access: Access,
    /// Cleared by a Send with Invalidate: the STag no longer admits remote access.
    pub valid: bool,
    buf: Buf,
}

/// A region's memory: its own, or a read-only buffer shared with other registrations
/// ([`Device::reg_shared`]), as one pinned buffer can back regions of many PDs.
#[derive(Debug, Clone)]
enum Buf {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Owned(v) => v,
            Buf::Shared(a) => a,
        }
    }
}

impl Mr {
    pub fn len(&self) -> usize {
        self.buf.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.bytes().is_empty()
    }
}

/// Why a placement or access was refused (siw's `enum siw_access_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    InvalidStag,
    PdMismatch,
    AccessPerm,
    ToWrap,
    BaseBounds,
}

impl AccessError {
    /// For a tagged placement (Write, Read Response): siw's `siw_tagged_error`. RFC 5041
    /// has no code for missing access rights; siw, and we, report "invalid STag".
    pub fn ddp_code(self) -> TermCode {
        match self {
            AccessError::InvalidStag | AccessError::AccessPerm => TermCode::DDP_T_INVALID_STAG,
            AccessError::PdMismatch => TermCode::DDP_T_STAG_NOT_ASSOC,
            AccessError::ToWrap => TermCode::DDP_T_TO_WRAP,
            AccessError::BaseBounds => TermCode::DDP_T_BASE_BOUNDS,
        }
    }

    /// For a Read Request's source: siw's `siw_rdmap_error`.
    pub fn rdmap_code(self) -> TermCode {
        match self {
            AccessError::InvalidStag => TermCode::RDMAP_INVALID_STAG,
            AccessError::PdMismatch => TermCode::RDMAP_STAG_NOT_ASSOC,
            AccessError::AccessPerm => TermCode::RDMAP_ACCESS_RIGHTS,
            AccessError::ToWrap => TermCode::RDMAP_TO_WRAP,
            AccessError::BaseBounds => TermCode::RDMAP_BASE_BOUNDS,
        }
    }
}

/// A verbs call refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// A named bound is reached (which one, and its value).
    Full(&'static str, usize),
    /// Region too large ([`MR_BYTES_MAX`]) or empty.
    BadLength(usize),
    NoSuchPd,
    Access(AccessError),
    /// The queue pair is not in a state that takes work requests.
    QpState(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::Full(what, max) => write!(f, "{what} full ({max})"),
            VerbsError::BadLength(n) => write!(f, "region length {n} not in 1..={MR_BYTES_MAX}"),
            VerbsError::NoSuchPd => write!(f, "no such protection domain"),
            VerbsError::Access(e) => write!(f, "access refused: {e:?}"),
            VerbsError::QpState(s) => write!(f, "queue pair is {s}"),
        }
    }
}

impl std::error::Error for VerbsError {}

/// The resources of one endpoint.
#[derive(Debug)]
pub struct Device {
    pds: usize,
    /// Index 0 is never used, so no STag is below 0x100.
    mrs: Vec<Option<Mr>>,
    rng: u64,
}

impl Device {
    /// A device whose STag keys come from `seed` (tests pass a constant; the TCP driver
    /// a random one).
    pub fn new(seed: u64) -> Device {
        Device {
            pds: 0,
            mrs: vec![None],
            rng: seed | 1,
        }
    }

    /// A device whose STag keys are unpredictable to the peer (seeded from the
    /// process's random hasher keys).
    pub fn with_random_keys() -> Device {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(std::process::id().into());
        Device::new(h.finish())
    }

    fn next_key(&mut self) -> u8 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
    }

    pub fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        if self.pds >= PD_MAX {
            return Err(VerbsError::Full("protection domains", PD_MAX));
        }
        self.pds += 1;
        Ok(PdId(self.pds as u32))
    }

    /// Register a zeroed region of `len` bytes at tagged offsets `base_to..`.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        base_to: u64,
        len: usize,
        access: Access,
    ) -> Result<u32, VerbsError> {
        // Checked before the buffer is allocated (insert checks again).
        if len == 0 || len > MR_BYTES_MAX {
            return Err(VerbsError::BadLength(len));
        }
        self.insert(pd, base_to, Buf::Owned(vec![0; len]), access)
    }

    /// Register `buf` read-only (no local or remote write access is granted) at tagged
    /// offsets `base_to..`, without copying it: the same buffer can back regions of
    /// many devices, e.g. a file's contents registered once and served on every
    /// connection.
    pub fn reg_shared(
        &mut self,
        pd: PdId,
        base_to: u64,
        buf: Arc<[u8]>,
        access: Access,
    ) -> Result<u32, VerbsError> {
        if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
            return Err(VerbsError::Access(AccessError::AccessPerm));
        }
        self.insert(pd, base_to, Buf::Shared(buf), access)
    }

    fn insert(
        &mut self,
        pd: PdId,
        base_to: u64,
        buf: Buf,
        access: Access,
    ) -> Result<u32, VerbsError> {
        if pd.0 == 0 || pd.0 as usize > self.pds {
            return Err(VerbsError::NoSuchPd);
        }
        let len = buf.bytes().len();
        if len == 0 || len > MR_BYTES_MAX || base_to.checked_add(len as u64).is_none() {
            return Err(VerbsError::BadLength(len));
        }
        let index = match self.mrs.iter().skip(1).position(|m| m.is_none()) {
            Some(i) => i + 1,
            None if self.mrs.len() <= MR_MAX => {
                self.mrs.push(None);
                self.mrs.len() - 1
            }
            None => return Err(VerbsError::Full("memory regions", MR_MAX)),
        };
        let stag = ((index as u32) << 8) | u32::from(self.next_key());
        self.mrs[index] = Some(Mr {
            stag,
            pd,
            base_to,
            access,
            valid: true,
            buf,
        });
        Ok(stag)
    }

    pub fn dereg_mr(&mut self, stag: u32) -> Result<(), VerbsError> {
        match self.slot(stag) {
            Some(i) => {
                self.mrs[i] = None;
                Ok(())
            }
            None => Err(VerbsError::Access(AccessError::InvalidStag)),
        }
    }

    fn slot(&self, stag: u32) -> Option<usize> {
        let i = (stag >> 8) as usize;
        match self.mrs.get(i) {
            Some(Some(m)) if m.stag == stag => Some(i),
            _ => None,
        }
    }

    pub fn mr(&self, stag: u32) -> Option<&Mr> {
        self.slot(stag).and_then(|i| self.mrs[i].as_ref())
    }

    /// Check an access of `len` bytes at `to` under `stag` from domain `pd`, needing
    /// `need` (remote accesses also need the STag valid, i.e. not invalidated).
    pub fn check(
        &self,
        pd: PdId,
        stag: u32,
        to: u64,
        len: usize,
        need: Access,
    ) -> Result<(), AccessError> {
        let m = self.mr(stag).ok_or(AccessError::InvalidStag)?;
        let remote = need.contains(Access::REMOTE_WRITE) || need.contains(Access::REMOTE_READ);
        if remote && !m.valid {
            return Err(AccessError::InvalidStag);
        }
        if m.pd != pd {
            return Err(AccessError::PdMismatch);
        }
        if !m.access.contains(need) {
            return Err(AccessError::AccessPerm);
        }
        let end = to.checked_add(len as u64).ok_or(AccessError::ToWrap)?;
        if to < m.base_to || end > m.base_to + m.len() as u64 {
            return Err(AccessError::BaseBounds);
        }
        Ok(())
    }

    /// The application's view: `len` bytes at `to` of region `stag`.
    pub fn read(&self, stag: u32, to: u64, len: usize) -> Result<&[u8], AccessError> {
        let m = self.mr(stag).ok_or(AccessError::InvalidStag)?;
        self.check(m.pd, stag, to, len, Access::NONE)?;
        let at = (to - m.base_to) as usize;
        Ok(&m.buf.bytes()[at..at + len])
    }

    /// The application's view: write `data` at `to` of region `stag` (not a shared one).
    pub fn write(&mut self, stag: u32, to: u64, data: &[u8]) -> Result<(), AccessError> {
        let m = self.mr(stag).ok_or(AccessError::InvalidStag)?;
        if matches!(m.buf, Buf::Shared(_)) {
            return Err(AccessError::AccessPerm);
        }
        let pd = m.pd;
        self.check(pd, stag, to, data.len(), Access::NONE)?;
        self.place(stag, to, data);
        Ok(())
    }

    /// Copy `data` in at `to`; the caller has checked the access.
    pub(crate) fn place(&mut self, stag: u32, to: u64, data: &[u8]) {
        let i = self.slot(stag).expect("placement checked");
        let m = self.mrs[i].as_mut().expect("placement checked");
        let at = (to - m.base_to) as usize;
        match &mut m.buf {
            Buf::Owned(v) => v[at..at + data.len()].copy_from_slice(data),
            // Shared regions have no write access, so no placement passes its check.
            Buf::Shared(_) => unreachable!("placement into a read-only shared region"),
        }
    }

    /// Invalidate `stag` for remote access (Send with Invalidate).
    pub(crate) fn invalidate(&mut self, pd: PdId, stag: u32) -> bool {
        match self.slot(stag) {
            Some(i) => match self.mrs[i].as_mut() {
                Some(m) if m.pd == pd && m.valid => {
                    m.valid = false;
                    true
                }
                _ => false,
            },
            None => false,
        }
    }
}

/// What a completed work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    Write,
    Read,
    Recv,
}

/// How it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// A local SGE failed its check (no data went on the wire).
    LocalProtection,
    /// Flushed: the queue pair left RTS (Terminate, error) before it ran.
    Flushed,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub status: WcStatus,
    pub byte_len: u32,
    /// A Send with Solicited Event.
    pub solicited: bool,
    /// The STag a Send with Invalidate invalidated.
    pub invalidated_stag: Option<u32>,
}

/// A completion queue with a fixed depth. A completion that finds it full is dropped
/// and [`Cq::overflowed`] set: an RNIC raises a CQ error then, and the application
/// sized the queue wrong.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<Wc>,
    depth: usize,
    overflowed: bool,
}

impl Cq {
    pub fn new(depth: usize) -> Result<Cq, VerbsError> {
        if depth == 0 || depth > CQ_DEPTH_MAX {
            return Err(VerbsError::Full("completion queue depth", CQ_DEPTH_MAX));
        }
        Ok(Cq {
            entries: VecDeque::with_capacity(depth.min(1024)),
            depth,
            overflowed: false,
        })
    }

    pub(crate) fn push(&mut self, wc: Wc) {
        if self.entries.len() >= self.depth {
            self.overflowed = true;
        } else {
            self.entries.push_back(wc);
        }
    }

    pub fn poll(&mut self) -> Option<Wc> {
        self.entries.pop_front()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stag_is_index_and_key_and_checks_run_in_order() {
        let mut d = Device::new(7);
        let pd = d.alloc_pd().unwrap();
        let pd2 = d.alloc_pd().unwrap();
        let s = d.reg_mr(pd, 0x1000, 64, Access::REMOTE_WRITE).unwrap();
        assert_eq!(s >> 8, 1);
        assert_eq!(d.check(pd, s, 0x1000, 64, Access::REMOTE_WRITE), Ok(()));
        assert_eq!(
            d.check(pd, s ^ 1, 0x1000, 1, Access::REMOTE_WRITE),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(
            d.check(pd2, s, 0x1000, 1, Access::REMOTE_WRITE),
            Err(AccessError::PdMismatch)
        );
        assert_eq!(
            d.check(pd, s, 0x1000, 1, Access::REMOTE_READ),
            Err(AccessError::AccessPerm)
        );
        assert_eq!(
            d.check(pd, s, 0x1001, 64, Access::REMOTE_WRITE),
            Err(AccessError::BaseBounds)
        );
        assert_eq!(
            d.check(pd, s, 0xfff, 1, Access::REMOTE_WRITE),
            Err(AccessError::BaseBounds)
        );
        assert_eq!(
            d.check(pd, s, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(AccessError::ToWrap)
        );
        d.dereg_mr(s).unwrap();
        let s2 = d.reg_mr(pd, 0, 8, Access::NONE).unwrap();
        assert_eq!(s2 >> 8, 1, "index reused");
        assert_eq!(d.check(pd, s, 0x1000, 1, Access::NONE).is_err(), s != s2);
    }

    #[test]
    fn shared_regions_are_read_only_and_not_copied() {
        let mut d = Device::new(3);
        let pd = d.alloc_pd().unwrap();
        let buf: Arc<[u8]> = Arc::from(&b"shared bytes"[..]);
        assert_eq!(
            d.reg_shared(pd, 0, buf.clone(), Access::REMOTE_WRITE),
            Err(VerbsError::Access(AccessError::AccessPerm))
        );
        let s = d
            .reg_shared(pd, 100, buf.clone(), Access::REMOTE_READ)
            .unwrap();
        assert_eq!(d.read(s, 100, 12).unwrap(), &buf[..]);
        assert_eq!(d.check(pd, s, 100, 12, Access::REMOTE_READ), Ok(()));
        assert_eq!(
            d.check(pd, s, 100, 1, Access::LOCAL_WRITE),
            Err(AccessError::AccessPerm)
        );
        assert_eq!(d.write(s, 100, b"x"), Err(AccessError::AccessPerm));
        assert_eq!(Arc::strong_count(&buf), 2, "registered without a copy");
        d.dereg_mr(s).unwrap();
        assert_eq!(Arc::strong_count(&buf), 1);
        assert!(d
            .reg_shared(pd, 0, Arc::from(&[][..]), Access::NONE)
            .is_err());
    }

    #[test]
    fn cq_has_a_bound() {
        let mut cq = Cq::new(1).unwrap();
        let wc = Wc {
            wr_id: 1,
            opcode: WcOpcode::Send,
            status: WcStatus::Success,
            byte_len: 0,
            solicited: false,
            invalidated_stag: None,
        };
        cq.push(wc);
        cq.push(wc);
        assert_eq!(cq.len(), 1);
        assert!(cq.overflowed());
        assert!(Cq::new(CQ_DEPTH_MAX + 1).is_err());
    }
}
