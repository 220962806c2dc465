//! Map element commands through a map's own descriptor: from `&self`, from any thread,
//! one `bpf(2)` call each, and still valid after the object that created the map is
//! gone. For the maps a daemon touches on its hot path from many threads (a flow
//! hold's 4-tuples, a socket map's entries), where aya's typed views would need the
//! object borrowed mutably.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use aya::Pod;

/// Map update flags (linux/bpf.h).
pub mod flags {
    /// Create or replace.
    pub const ANY: u64 = 0;
    /// Create only (EEXIST if the key is there).
    pub const NOEXIST: u64 = 1;
    /// Replace only (ENOENT if the key is not there).
    pub const EXIST: u64 = 2;
}

/// bpf(2) commands (linux/bpf.h `enum bpf_cmd`).
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;

/// `union bpf_attr` for the map element commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// One map, by its own descriptor, with its key and value sizes: every command checks
/// that the caller's key and value types have exactly these sizes.
#[derive(Debug)]
pub struct RawMap {
    fd: OwnedFd,
    name: String,
    key_bytes: usize,
    value_bytes: usize,
}

impl RawMap {
    /// Map `fd` named `name` (in errors) of `key_bytes` keys and `value_bytes` values
    /// (as the kernel reports them: `Object::raw_map` reads them).
    pub fn new(fd: OwnedFd, name: &str, key_bytes: usize, value_bytes: usize) -> RawMap {
        RawMap {
            fd,
            name: name.to_string(),
            key_bytes,
            value_bytes,
        }
    }

    /// The map's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn check<K, V>(&self) -> io::Result<()> {
        if std::mem::size_of::<K>() != self.key_bytes
            || (std::mem::size_of::<V>() != self.value_bytes && std::mem::size_of::<V>() != 0)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {}-byte keys and {}-byte values, not {} and {}",
                    self.name,
                    self.key_bytes,
                    self.value_bytes,
                    std::mem::size_of::<K>(),
                    std::mem::size_of::<V>()
                ),
            ));
        }
        Ok(())
    }

    /// One element command on raw pointers (sizes checked by the callers).
    fn command(
        &self,
        cmd: libc::c_int,
        key: *const u8,
        value: *mut u8,
        flags: u64,
    ) -> io::Result<()> {
        let attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            _pad: 0,
            key: key as u64,
            value: value as u64,
            flags,
        };
        // SAFETY: bpf(2) with a map element command; the attr is a live local, and
        // key/value are null or point at live buffers of the map's key and value
        // sizes (checked by `check`).
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                std::ptr::addr_of!(attr),
                std::mem::size_of::<ElemAttr>(),
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// The value of `key`; `None` if the map has no such key (ENOENT).
    pub fn lookup<K: Pod, V: Pod>(&self, key: &K) -> io::Result<Option<V>> {
        self.check::<K, V>()?;
        let mut v = std::mem::MaybeUninit::<V>::zeroed();
        match self.command(
            BPF_MAP_LOOKUP_ELEM,
            (key as *const K).cast(),
            v.as_mut_ptr().cast(),
            0,
        ) {
            // SAFETY: the kernel wrote all of V (its value size); V is Pod.
            Ok(()) => Ok(Some(unsafe { v.assume_init() })),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Set `key` to `value` with `flags` ([`flags`]).
    pub fn update<K: Pod, V: Pod>(&self, key: &K, value: &V, flags: u64) -> io::Result<()> {
        self.check::<K, V>()?;
        self.command(
            BPF_MAP_UPDATE_ELEM,
            (key as *const K).cast(),
            (value as *const V).cast_mut().cast(),
            flags,
        )
    }

    /// Remove `key` (the kernel's errors as they are: ENOENT if absent; a socket map
    /// answers EINVAL for an empty slot).
    pub fn delete<K: Pod>(&self, key: &K) -> io::Result<()> {
        self.check::<K, ()>()?;
        self.command(
            BPF_MAP_DELETE_ELEM,
            (key as *const K).cast(),
            std::ptr::null_mut(),
            0,
        )
    }

    /// The key after `after` (the first key for `None`); `None` at the end.
    pub fn next_key<K: Pod>(&self, after: Option<&K>) -> io::Result<Option<K>> {
        self.check::<K, ()>()?;
        let mut next = std::mem::MaybeUninit::<K>::zeroed();
        match self.command(
            BPF_MAP_GET_NEXT_KEY,
            after.map_or(std::ptr::null(), |k| (k as *const K).cast()),
            next.as_mut_ptr().cast(),
            0,
        ) {
            // SAFETY: the kernel wrote a whole key; K is Pod.
            Ok(()) => Ok(Some(unsafe { next.assume_init() })),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every key, at most `max + 1` (a map's `max_entries` plus one pass, in case
    /// entries come and go meanwhile).
    pub fn keys<K: Pod>(&self, max: usize) -> io::Result<Vec<K>> {
        let mut out = Vec::new();
        let mut cur: Option<K> = None;
        for _ in 0..=max {
            match self.next_key(cur.as_ref())? {
                Some(k) => {
                    out.push(k);
                    cur = Some(k);
                }
                None => break,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// A BPF_MAP_TYPE_HASH of u32 keys and u64 values, `max` entries.
    fn hash_map(max: u32) -> io::Result<RawMap> {
        /// `union bpf_attr` for BPF_MAP_CREATE (the leading fields).
        #[repr(C)]
        struct CreateAttr {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
            _rest: [u32; 27],
        }
        let attr = CreateAttr {
            map_type: 1, // BPF_MAP_TYPE_HASH
            key_size: 4,
            value_size: 8,
            max_entries: max,
            map_flags: 0,
            _rest: [0; 27],
        };
        // SAFETY: BPF_MAP_CREATE (0) with a live, zero-padded attr of its size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0,
                std::ptr::addr_of!(attr),
                std::mem::size_of::<CreateAttr>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(RawMap::new(fd, "test_hash", 4, 8))
    }

    #[test]
    #[ignore = "needs root"]
    fn elements_round_trip_and_sizes_are_checked() {
        let m = hash_map(4).expect("BPF_MAP_CREATE (root?)");
        assert_eq!(m.lookup::<u32, u64>(&7).unwrap(), None);
        m.update(&7u32, &70u64, flags::NOEXIST).unwrap();
        m.update(&8u32, &80u64, flags::ANY).unwrap();
        assert_eq!(m.lookup::<u32, u64>(&7).unwrap(), Some(70));
        let e = m.update(&7u32, &71u64, flags::NOEXIST).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        let mut keys = m.keys::<u32>(4).unwrap();
        keys.sort_unstable();
        assert_eq!(keys, [7, 8]);
        m.delete(&7u32).unwrap();
        assert_eq!(m.lookup::<u32, u64>(&7).unwrap(), None);
        assert_eq!(
            m.delete(&7u32).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        // A key or value of another size is refused before the kernel sees it.
        let e = m.lookup::<u64, u64>(&7).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = m.update(&7u32, &1u32, flags::ANY).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
