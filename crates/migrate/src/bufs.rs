//! Spare queue buffers, kept per thread and reused by the next migration (less
//! CPU per migration). A dumped or received queue of ~100 KiB freshly allocated is
//! fresh pages: the allocator maps them (and gives them back with `madvise` when the
//! state is dropped), and each first touch is a page fault, on both sides of every
//! migration. A buffer kept from the last migration is already resident.

use std::cell::RefCell;

use crate::state::TcpState;

/// Spare buffers kept per thread: the two queues of one state and the target's copy
/// of its never-sent bytes (a thread handles one migration at a time).
const SPARE_BUFFERS_MAX: usize = 3;
/// Largest buffer kept (capacity): the lab's states are well under it; a rare huge
/// queue is freed rather than held, so a thread keeps at most 3 MiB idle.
const SPARE_BYTES_MAX: usize = 1 << 20;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for at least `len` bytes: a spare one if this thread
/// has one (the largest), else a new one.
pub(crate) fn take(len: usize) -> Vec<u8> {
    let spare = SPARE.with(|s| {
        let mut s = s.borrow_mut();
        let i = (0..s.len()).max_by_key(|&i| s[i].capacity())?;
        Some(s.swap_remove(i))
    });
    match spare {
        // Growing a kept buffer would copy its old capacity: start afresh instead.
        Some(mut v) if v.capacity() >= len => {
            v.clear();
            v
        }
        _ => Vec::with_capacity(len),
    }
}

/// Keeps `v` for a later [`take`] on this thread, within the bounds.
pub(crate) fn give(v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > SPARE_BYTES_MAX {
        return;
    }
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_BUFFERS_MAX {
            s.push(v);
        }
    });
}

/// A state whose queue buffers go back to this thread's spares when dropped.
pub(crate) struct Recycled(pub(crate) TcpState);

impl std::ops::Deref for Recycled {
    type Target = TcpState;
    fn deref(&self) -> &TcpState {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0.send_queue));
        give(std::mem::take(&mut self.0.recv_queue));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_taken_again_and_the_bounds_hold() {
        let mut v = take(1000);
        v.extend_from_slice(&[7; 1000]);
        let p = v.as_ptr();
        give(v);
        let v = take(500);
        assert_eq!(v.as_ptr(), p, "the spare is reused");
        assert!(v.is_empty() && v.capacity() >= 1000);
        give(v);
        // Too large: not kept.
        give(Vec::with_capacity(SPARE_BYTES_MAX + 1));
        // At most SPARE_BUFFERS_MAX kept.
        for _ in 0..5 {
            give(Vec::with_capacity(10));
        }
        SPARE.with(|s| assert_eq!(s.borrow().len(), SPARE_BUFFERS_MAX));
    }
}
