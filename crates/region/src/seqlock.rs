//! A seqlock block that a single remote READ can validate.
//!
//! A block is `n` consecutive words: `[head, field.., tail]`. One writer updates it:
//!
//! 1. `tail := v`  (a reader that reads the tail after this sees the write started)
//! 2. the fields
//! 3. `head := v`  (published)
//!
//! A reader copies the block in ascending address order (head first, tail last) and
//! accepts it only if `head == tail != 0`. Why that is enough:
//! - If the reader saw `tail == v` at the end, the writer had not yet begun write `v+1`
//!   when the tail was read (write `v+1` stores the tail first), and every field was read
//!   before the tail; so no field of write `v+1` was seen.
//! - If the reader saw `head == v` at the start, write `v` had finished all its fields
//!   before the head was read, and every field is read after the head.
//!
//! So the fields are exactly those of write `v`. Stores use release order and loads
//! acquire order, which keeps program order on every architecture (and is plain moves
//! on x86). The XDP server copies words in ascending order, so remote reads keep it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Writes a seqlock block at `words[first..first + n]`. Only one writer may exist.
pub struct SeqlockWriter<'a> {
    block: &'a [AtomicU64],
    seq: u64,
}

impl<'a> SeqlockWriter<'a> {
    /// The block's words (head, fields, tail), e.g. to prefetch them before a write.
    pub fn block(&self) -> &'a [AtomicU64] {
        self.block
    }

    /// `n` counts head and tail; it must be at least 3.
    pub fn new(words: &'a [AtomicU64], first: usize, n: usize) -> Self {
        assert!(n >= 3, "a seqlock block needs head, a field and tail");
        let block = &words[first..first + n];
        let seq = block[0].load(Ordering::Acquire);
        SeqlockWriter { block, seq }
    }

    /// Publish `fields` (exactly `n - 2` values). Returns the new sequence number.
    pub fn publish(&mut self, fields: &[u64]) -> u64 {
        let n = self.block.len();
        assert_eq!(fields.len(), n - 2, "field count must match the block");
        // Sequence 0 means "never written"; skip it on wrap.
        self.seq = self.seq.wrapping_add(1).max(1);
        self.block[n - 1].store(self.seq, Ordering::Release);
        for (w, v) in self.block[1..n - 1].iter().zip(fields) {
            w.store(*v, Ordering::Release);
        }
        self.block[0].store(self.seq, Ordering::Release);
        self.seq
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// Why a copied block was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Never written (sequence 0).
    Empty,
    /// Head and tail differ: the copy overlapped a write.
    Torn,
}

/// Validate a block copied as words. Returns the sequence number.
pub fn validate(block: &[u64]) -> Result<u64, BlockState> {
    let head = block[0];
    let tail = block[block.len() - 1];
    if head != tail {
        Err(BlockState::Torn)
    } else if head == 0 {
        Err(BlockState::Empty)
    } else {
        Ok(head)
    }
}

/// Read a block from local shared memory, retrying a torn copy up to `tries` times.
pub fn read_local(
    words: &[AtomicU64],
    first: usize,
    out: &mut [u64],
    tries: u32,
) -> Result<u64, BlockState> {
    let mut last = BlockState::Empty;
    let n = out.len();
    for _ in 0..tries.max(1) {
        for (o, w) in out.iter_mut().zip(&words[first..first + n]) {
            *o = w.load(Ordering::Acquire);
        }
        match validate(out) {
            Ok(seq) => return Ok(seq),
            Err(e) => last = e,
        }
        std::hint::spin_loop();
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{HeapWords, Words};
    use std::sync::Arc;

    #[test]
    fn reader_sees_whole_writes_only_under_a_racing_writer() {
        let mem = Arc::new(HeapWords::new(16));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (mem, stop) = (mem.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut w = SeqlockWriter::new(mem.words(), 2, 10);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    w.publish(&[i; 8]);
                    // Gaps of varying length between writes, so that reads both overlap
                    // writes and fall between them whatever the scheduling.
                    for _ in 0..i % 256 {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut out = [0u64; 10];
        let (mut ok, mut torn) = (0u64, 0u64);
        // Bounded: enough reads to have raced the writer many times, or 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while (ok + torn < 200_000 || ok < 1000) && std::time::Instant::now() < deadline {
            match read_local(mem.words(), 2, &mut out, 1) {
                Ok(_) => {
                    ok += 1;
                    let f = &out[1..9];
                    assert!(f.iter().all(|v| *v == f[0]), "accepted a torn copy: {f:?}");
                }
                Err(BlockState::Torn) => torn += 1,
                Err(BlockState::Empty) => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(ok > 0, "no valid read at all ({torn} torn)");
    }

    #[test]
    fn a_block_with_differing_head_and_tail_is_torn() {
        assert_eq!(validate(&[5, 1, 2, 4]), Err(BlockState::Torn));
        assert_eq!(validate(&[0, 1, 2, 0]), Err(BlockState::Empty));
        assert_eq!(validate(&[7, 1, 2, 7]), Ok(7));
    }
}
