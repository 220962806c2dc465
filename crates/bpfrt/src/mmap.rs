//! A shared mapping of a `BPF_F_MMAPABLE` array map: user space reads and writes its
//! values with plain loads and stores (atomics where the program races), no syscall.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `len` bytes (rounded up to whole pages) of an mmapable array map, shared and
/// writable; unmapped when dropped. The mapping holds the map: it stays valid after
/// the object and every descriptor of the map are gone.
#[derive(Debug)]
pub struct MmapArray {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; what is stored there and how it is
// accessed (atomics) is the user's contract, through `as_ptr`/`value`.
unsafe impl Send for MmapArray {}
// SAFETY: as above.
unsafe impl Sync for MmapArray {}

impl MmapArray {
    /// Map the first `len` bytes of array map `fd` (entry 0 at offset 0; entries
    /// `value_size` rounded up to 8 bytes apart).
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<MmapArray> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = len.max(1).next_multiple_of(page);
        // SAFETY: a fresh shared mapping of an mmapable BPF array; the kernel checks
        // the descriptor and the length against the map's size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MmapArray { ptr: p.cast(), len })
    }

    /// Start of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: at least one page is).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entry 0 as a `T`.
    ///
    /// # Safety
    /// `T` must be the map's value layout, valid for every bit pattern the program
    /// may write, and accessed with atomics wherever the program writes concurrently.
    pub unsafe fn value<T>(&self) -> &T {
        assert!(std::mem::size_of::<T>() <= self.len);
        assert_eq!(self.ptr as usize % std::mem::align_of::<T>(), 0);
        // SAFETY: within the mapping and aligned (checked); layout per the contract.
        unsafe { &*self.ptr.cast::<T>() }
    }
}

impl Drop for MmapArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
