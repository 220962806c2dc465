//! The load record: what a gatherer publishes and a monitor decodes.

use crate::layout::*;
use crate::mem::Words;
use crate::seqlock::{self, BlockState, SeqlockWriter};
use std::fmt;
use std::sync::atomic::Ordering;

/// One sample of a back-end's load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadRecord {
    pub sample_mono_ns: u64,
    pub cpu_util_ppm: u64,
    pub cpu_pressure_ppm: u64,
    pub runnable: u64,
    pub conns_established: u64,
    pub accept_backlog: u64,
    pub conns_pending: u64,
    pub mem_total_kb: u64,
    pub mem_available_kb: u64,
    pub inflight: u64,
    pub ncpu: u64,
    pub flags: u64,
    pub sample_cost_ns: u64,
    /// When the connection counts (`conns_established`, `conns_pending`) were taken,
    /// gatherer CLOCK_MONOTONIC ns; see `layout::W_CONNS_SAMPLED_MONO_NS`.
    pub conns_sampled_mono_ns: u64,
    /// Queueing delay of the oldest waiting request, µs, taken with the connection
    /// counts (valid with `FLAG_QUEUE_DELAY`); see `layout::W_QUEUE_DELAY_US`.
    pub queue_delay_us: u64,
}

impl LoadRecord {
    /// How old the connection counts were when this record was sampled, ns (0 if they
    /// were counted at this sample, or are not collected).
    pub fn conns_lag_ns(&self) -> u64 {
        if self.flags & FLAG_CONNS == 0 || self.conns_sampled_mono_ns == 0 {
            return 0;
        }
        self.sample_mono_ns
            .saturating_sub(self.conns_sampled_mono_ns)
    }

    /// The fields between SEQ_HEAD and SEQ_TAIL, in word order.
    fn to_fields(self) -> [u64; RECORD_WORDS - 2] {
        let mut f = [0u64; RECORD_WORDS - 2];
        let base = W_SEQ_HEAD + 1;
        f[W_SAMPLE_MONO_NS - base] = self.sample_mono_ns;
        f[W_CPU_UTIL_PPM - base] = self.cpu_util_ppm;
        f[W_CPU_PRESSURE_PPM - base] = self.cpu_pressure_ppm;
        f[W_RUNNABLE - base] = self.runnable;
        f[W_CONNS_ESTABLISHED - base] = self.conns_established;
        f[W_ACCEPT_BACKLOG - base] = self.accept_backlog;
        f[W_CONNS_PENDING - base] = self.conns_pending;
        f[W_MEM_TOTAL_KB - base] = self.mem_total_kb;
        f[W_MEM_AVAILABLE_KB - base] = self.mem_available_kb;
        f[W_INFLIGHT - base] = self.inflight;
        f[W_NCPU - base] = self.ncpu;
        f[W_FLAGS - base] = self.flags;
        f[W_SAMPLE_COST_NS - base] = self.sample_cost_ns;
        f[W_CONNS_SAMPLED_MONO_NS - base] = self.conns_sampled_mono_ns;
        f[W_QUEUE_DELAY_US - base] = self.queue_delay_us;
        f
    }

    /// Decode from words indexed like the region (`w[W_CPU_UTIL_PPM]`, ...).
    fn from_words(w: &[u64]) -> Self {
        LoadRecord {
            sample_mono_ns: w[W_SAMPLE_MONO_NS],
            cpu_util_ppm: w[W_CPU_UTIL_PPM],
            cpu_pressure_ppm: w[W_CPU_PRESSURE_PPM],
            runnable: w[W_RUNNABLE],
            conns_established: w[W_CONNS_ESTABLISHED],
            accept_backlog: w[W_ACCEPT_BACKLOG],
            conns_pending: w[W_CONNS_PENDING],
            mem_total_kb: w[W_MEM_TOTAL_KB],
            mem_available_kb: w[W_MEM_AVAILABLE_KB],
            inflight: w[W_INFLIGHT],
            ncpu: w[W_NCPU],
            flags: w[W_FLAGS],
            sample_cost_ns: w[W_SAMPLE_COST_NS],
            conns_sampled_mono_ns: w[W_CONNS_SAMPLED_MONO_NS],
            queue_delay_us: w[W_QUEUE_DELAY_US],
        }
    }
}

/// Identity of the gatherer that wrote a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub node_id: u64,
    pub generation: u64,
    pub period_us: u64,
    pub watched_ports: [u16; 4],
}

/// A validated header + load record, as one READ of `SNAPSHOT_BYTES` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub header: Header,
    /// Sequence number of the record; advances with every sample of one generation.
    pub seq: u64,
    pub load: LoadRecord,
}

/// Why a snapshot was refused. A refused snapshot is never used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// Fewer bytes than `SNAPSHOT_BYTES`.
    Short(usize),
    BadMagic(u64),
    BadVersion(u64),
    BadSize(u64),
    /// Sequence 0: the gatherer has not published yet.
    Empty,
    /// Head and tail differ: the read overlapped a write.
    Torn,
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Short(n) => {
                write!(f, "region read returned {n} bytes, need {SNAPSHOT_BYTES}")
            }
            RegionError::BadMagic(m) => write!(f, "not a farside region (magic {m:#018x})"),
            RegionError::BadVersion(v) => {
                write!(
                    f,
                    "region layout version {v}, this build reads {LAYOUT_VERSION}"
                )
            }
            RegionError::BadSize(s) => write!(f, "region size {s} bytes, expected {REGION_BYTES}"),
            RegionError::Empty => f.write_str("region has no record yet"),
            RegionError::Torn => f.write_str("torn record (read overlapped an update)"),
        }
    }
}

impl std::error::Error for RegionError {}

impl Snapshot {
    /// Decode and validate the first `SNAPSHOT_BYTES` of a region.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, RegionError> {
        if bytes.len() < SNAPSHOT_BYTES {
            return Err(RegionError::Short(bytes.len()));
        }
        let mut w = [0u64; W_SEQ_TAIL + 1];
        for (i, c) in bytes[..SNAPSHOT_BYTES].chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
        Self::decode_words(&w)
    }

    fn decode_words(w: &[u64; W_SEQ_TAIL + 1]) -> Result<Snapshot, RegionError> {
        if w[W_MAGIC] != MAGIC {
            return Err(RegionError::BadMagic(w[W_MAGIC]));
        }
        if w[W_LAYOUT_VERSION] != LAYOUT_VERSION {
            return Err(RegionError::BadVersion(w[W_LAYOUT_VERSION]));
        }
        if w[W_REGION_BYTES] != REGION_BYTES as u64 {
            return Err(RegionError::BadSize(w[W_REGION_BYTES]));
        }
        let seq = seqlock::validate(&w[W_SEQ_HEAD..=W_SEQ_TAIL]).map_err(|e| match e {
            BlockState::Empty => RegionError::Empty,
            BlockState::Torn => RegionError::Torn,
        })?;
        let p = w[W_WATCHED_PORTS];
        Ok(Snapshot {
            header: Header {
                node_id: w[W_NODE_ID],
                generation: w[W_GENERATION],
                period_us: w[W_PERIOD_US],
                watched_ports: [
                    p as u16,
                    (p >> 16) as u16,
                    (p >> 32) as u16,
                    (p >> 48) as u16,
                ],
            },
            seq,
            load: LoadRecord::from_words(w),
        })
    }

    /// Read a snapshot straight from local memory (the `shm` path), retrying torn copies.
    pub fn read_local(words: &dyn Words, tries: u32) -> Result<Snapshot, RegionError> {
        let words = words.words();
        let mut last = RegionError::Empty;
        for _ in 0..tries.max(1) {
            let mut w = [0u64; W_SEQ_TAIL + 1];
            for (o, s) in w.iter_mut().zip(words) {
                *o = s.load(Ordering::Acquire);
            }
            match Self::decode_words(&w) {
                Err(RegionError::Torn) => last = RegionError::Torn,
                r => return r,
            }
        }
        Err(last)
    }
}

/// The single writer of a region: the gatherer.
pub struct RegionWriter<W: Words> {
    mem: W,
    seq: u64,
}

impl<W: Words> RegionWriter<W> {
    /// Take over `mem` as a region: write the header (fresh generation, sequence kept
    /// monotonic within the generation) and clear the record.
    pub fn init(mem: W, header: Header) -> Self {
        assert!(mem.words().len() >= REGION_WORDS, "region memory too small");
        let w = mem.words();
        // Readers that see a torn header/magic refuse the region; invalidate first.
        w[W_MAGIC].store(0, Ordering::Release);
        w[W_SEQ_HEAD].store(0, Ordering::Release);
        w[W_SEQ_TAIL].store(0, Ordering::Release);
        w[W_LAYOUT_VERSION].store(LAYOUT_VERSION, Ordering::Release);
        w[W_NODE_ID].store(header.node_id, Ordering::Release);
        w[W_GENERATION].store(header.generation, Ordering::Release);
        w[W_PERIOD_US].store(header.period_us, Ordering::Release);
        w[W_REGION_BYTES].store(REGION_BYTES as u64, Ordering::Release);
        let p = header.watched_ports;
        let packed = p[0] as u64 | (p[1] as u64) << 16 | (p[2] as u64) << 32 | (p[3] as u64) << 48;
        w[W_WATCHED_PORTS].store(packed, Ordering::Release);
        w[W_MAGIC].store(MAGIC, Ordering::Release);
        RegionWriter { mem, seq: 0 }
    }

    /// Publish one sample. Returns its sequence number.
    pub fn publish(&mut self, rec: &LoadRecord) -> u64 {
        let mut w = SeqlockWriter::new(self.mem.words(), W_SEQ_HEAD, RECORD_WORDS);
        let seq = w.publish(&rec.to_fields());
        self.seq = seq;
        seq
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub fn mem(&self) -> &W {
        &self.mem
    }
}

/// A generation number that differs across restarts: wall-clock ns xor pid.
pub fn fresh_generation() -> u64 {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    (ns ^ ((std::process::id() as u64) << 48)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{copy_words_out, HeapWords};

    fn header() -> Header {
        Header {
            node_id: 7,
            generation: 42,
            period_us: 1000,
            watched_ports: [80, 8080, 0, 0],
        }
    }

    #[test]
    fn published_record_decodes_from_one_read() {
        let mut w = RegionWriter::init(HeapWords::new(REGION_WORDS), header());
        let rec = LoadRecord {
            cpu_util_ppm: 500_000,
            conns_established: 12,
            queue_delay_us: 4000,
            flags: FLAG_QUEUE_DELAY,
            ncpu: 2,
            ..Default::default()
        };
        let seq = w.publish(&rec);
        let mut bytes = [0u8; SNAPSHOT_BYTES];
        copy_words_out(w.mem().words(), 0, &mut bytes);
        let s = Snapshot::decode(&bytes).unwrap();
        assert_eq!(s.seq, seq);
        assert_eq!(s.load, rec);
        assert_eq!(s.header, header());
    }

    #[test]
    fn unpublished_region_is_empty_not_zero_load() {
        let w = RegionWriter::init(HeapWords::new(REGION_WORDS), header());
        assert_eq!(Snapshot::read_local(w.mem(), 3), Err(RegionError::Empty));
    }

    #[test]
    fn corrupt_regions_are_refused_with_a_reason() {
        let mut w = RegionWriter::init(HeapWords::new(REGION_WORDS), header());
        w.publish(&LoadRecord::default());
        let mut bytes = [0u8; SNAPSHOT_BYTES];
        copy_words_out(w.mem().words(), 0, &mut bytes);

        let mut torn = bytes;
        torn[W_SEQ_TAIL * 8] ^= 1;
        assert_eq!(Snapshot::decode(&torn), Err(RegionError::Torn));

        let mut magic = bytes;
        magic[0] ^= 0xff;
        assert!(matches!(
            Snapshot::decode(&magic),
            Err(RegionError::BadMagic(_))
        ));

        let mut ver = bytes;
        ver[W_LAYOUT_VERSION * 8] = 99;
        assert_eq!(Snapshot::decode(&ver), Err(RegionError::BadVersion(99)));

        assert_eq!(
            Snapshot::decode(&bytes[..100]),
            Err(RegionError::Short(100))
        );
    }

    /// Bounded fuzz (runs in CI): random and mutated byte strings of every length up to
    /// two snapshots never panic the decoder, and whatever it accepts has the right
    /// magic, version and size, and equal head and tail sequences.
    #[test]
    fn decoder_survives_random_and_mutated_bytes() {
        // Cases per kind: enough to flip every byte of a snapshot many times, < 1 s.
        const CASES: u32 = 20_000;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut w = RegionWriter::init(HeapWords::new(REGION_WORDS), header());
        w.publish(&LoadRecord {
            conns_established: 3,
            ..Default::default()
        });
        let mut valid = [0u8; SNAPSHOT_BYTES];
        copy_words_out(w.mem().words(), 0, &mut valid);
        let check = |b: &[u8]| {
            if let Ok(s) = Snapshot::decode(b) {
                assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), MAGIC);
                let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
                assert_eq!(word(W_LAYOUT_VERSION), LAYOUT_VERSION);
                assert_eq!(word(W_REGION_BYTES), REGION_BYTES as u64);
                assert_eq!(word(W_SEQ_HEAD), s.seq);
                assert_eq!(word(W_SEQ_TAIL), s.seq);
                assert_ne!(s.seq, 0);
            }
        };
        let mut accepted = 0u32;
        for _ in 0..CASES {
            let len = (rnd() % (2 * SNAPSHOT_BYTES as u64 + 1)) as usize;
            let b: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            check(&b);
            let mut m = valid.to_vec();
            for _ in 0..1 + rnd() % 4 {
                let i = (rnd() % m.len() as u64) as usize;
                m[i] ^= 1 << (rnd() % 8);
            }
            m.truncate((rnd() % (SNAPSHOT_BYTES as u64 + 8)) as usize + 1);
            check(&m);
            accepted += Snapshot::decode(&m).is_ok() as u32;
        }
        assert!(accepted > 0, "mutations of fields only must still decode");
    }
}
