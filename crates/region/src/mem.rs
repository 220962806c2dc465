//! Word-addressed memory that regions and tables live in: the heap for tests and
//! in-process use, or a shared mapping of a file (`/run/farside`, created and opened
//! by the rules of `farside_rt::rundir`) or of a BPF map fd.

use farside_rt::rundir;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// A slice of 64-bit words shared with other threads, processes or the kernel.
pub trait Words: Send + Sync {
    fn words(&self) -> &[AtomicU64];

    fn len_bytes(&self) -> usize {
        self.words().len() * 8
    }
}

/// Words on the heap.
pub struct HeapWords(Box<[AtomicU64]>);

impl HeapWords {
    pub fn new(n: usize) -> Self {
        HeapWords((0..n).map(|_| AtomicU64::new(0)).collect())
    }
}

impl Words for HeapWords {
    fn words(&self) -> &[AtomicU64] {
        &self.0
    }
}

/// A `MAP_SHARED` mapping of `n` words. Unmapped on drop.
pub struct MappedWords {
    ptr: *mut AtomicU64,
    n: usize,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Send for MappedWords {}
// SAFETY: as above.
unsafe impl Sync for MappedWords {}

impl MappedWords {
    /// Map `n` words of `fd` from offset 0, read-write and shared.
    pub fn map_fd(fd: RawFd, n: usize) -> io::Result<Self> {
        let len = n * 8;
        // SAFETY: a fresh mapping; the kernel checks fd and length.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(MappedWords { ptr: ptr.cast(), n })
    }

    /// Create and map a file of `n` words (e.g. `/run/farside/node1.region`), mode
    /// 0600, by the rules of `farside_rt::rundir`: the directory is made with `mkdir`
    /// and checked (ours or root's, no other user's symlink, not writable by others unless a
    /// sticky root directory such as `/dev/shm`); a plain file of ours at the name is
    /// reused in place (readers that mapped it keep reading a restarted writer);
    /// anything else of ours there (a socket of an XDP run) is unlinked and the file
    /// created `O_EXCL | O_NOFOLLOW`; another user's entry is refused.
    pub fn create_file(path: &Path, n: usize) -> io::Result<Self> {
        let f = rundir::create_or_reuse(path, rundir::FILE_MODE)?;
        f.set_len((n * 8) as u64)?;
        Self::map_fd(f.as_raw_fd(), n)
    }

    /// Map an existing file, which must hold at least `n` words. Opened `O_NOFOLLOW`
    /// in a checked directory and checked itself (a plain file of root's or ours, one
    /// link, not writable by others: see `farside_rt::rundir::open_file`), so a local
    /// user cannot substitute a file of theirs or a link to one.
    pub fn open_file(path: &Path, n: usize) -> io::Result<Self> {
        let f = rundir::open_file(path, true)?;
        let have = f.metadata()?.len();
        if have < (n * 8) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: {have} bytes, expected at least {} (not a farside region/table?)",
                    path.display(),
                    n * 8
                ),
            ));
        }
        Self::map_fd(f.as_raw_fd(), n)
    }
}

impl Words for MappedWords {
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: ptr maps n words for our lifetime; AtomicU64 has u64's layout.
        unsafe { std::slice::from_raw_parts(self.ptr, self.n) }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: unmapping what map_fd mapped.
        unsafe {
            libc::munmap(self.ptr.cast(), self.n * 8);
        }
    }
}

/// Copy `out.len() / 8` words starting at word `first` into `out` (little-endian),
/// in ascending address order, as one remote READ would.
pub fn copy_words_out(words: &[AtomicU64], first: usize, out: &mut [u8]) {
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let v = words[first + i].load(Ordering::Acquire);
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

/// Store little-endian `data` into words starting at `first`, ascending.
pub fn copy_words_in(words: &[AtomicU64], first: usize, data: &[u8]) {
    for (i, chunk) in data.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
        words[first + i].store(v, Ordering::Release);
    }
}
