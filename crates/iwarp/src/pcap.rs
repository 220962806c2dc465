//! Reading TCP streams out of a capture: classic pcap (little-endian, Ethernet), IPv4,
//! TCP, and reassembly of each direction by sequence number.
//!
//! Only what the decoder needs: pcapng, big-endian pcap, other link types and IPv6 are
//! refused with an error that says so. Every length read from the file is checked
//! against the bytes actually there before it is used; in particular the IPv4 total
//! length bounds the TCP payload, so Ethernet padding of short frames (a 60 B RST
//! carries 6 zero bytes) never reaches a stream.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Classic pcap magic, microsecond timestamps, as read little-endian.
const MAGIC_US: u32 = 0xa1b2_c3d4;
/// Classic pcap magic, nanosecond timestamps.
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const GLOBAL_HDR_LEN: usize = 24;
const RECORD_HDR_LEN: usize = 16;
const LINKTYPE_ETHERNET: u32 = 1;
const ETH_HDR_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
/// Bytes kept per stream direction: a capture bigger than this per direction is cut
/// there (the decoder reports the stream as truncated), so a hostile file cannot make
/// us hold more than this per direction.
pub const STREAM_BYTES_MAX: usize = 64 << 20;
/// Directions (two per TCP connection) followed at once.
pub const STREAMS_MAX: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapError(pub String);

impl fmt::Display for PcapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PcapError {}

fn err<T>(msg: impl Into<String>) -> Result<T, PcapError> {
    Err(PcapError(msg.into()))
}

/// One TCP segment of the capture.
#[derive(Debug, Clone)]
pub struct TcpSegment {
    /// 1-based frame number in the file.
    pub frame: u64,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub payload: Vec<u8>,
}

/// Every TCP/IPv4 segment of a classic little-endian Ethernet pcap; other frames (ARP,
/// IPv6, fragments) are skipped.
pub fn read_tcp_segments(file: &[u8]) -> Result<Vec<TcpSegment>, PcapError> {
    if file.len() < GLOBAL_HDR_LEN {
        return err("file shorter than a pcap header");
    }
    let magic = u32::from_le_bytes(file[0..4].try_into().expect("4"));
    if magic != MAGIC_US && magic != MAGIC_NS {
        if magic.swap_bytes() == MAGIC_US || magic.swap_bytes() == MAGIC_NS {
            return err("big-endian pcap: only little-endian classic pcap is supported");
        }
        if magic == 0x0a0d_0d0a {
            return err("pcapng: only classic pcap is supported (convert with editcap -F pcap)");
        }
        return err(format!("not a classic pcap file (magic {magic:#010x})"));
    }
    let linktype = u32::from_le_bytes(file[20..24].try_into().expect("4"));
    if linktype & 0x0fff_ffff != LINKTYPE_ETHERNET {
        return err(format!(
            "link type {linktype}: only Ethernet (1) is supported"
        ));
    }
    let mut out = Vec::new();
    let mut at = GLOBAL_HDR_LEN;
    let mut frame = 0u64;
    while at < file.len() {
        frame += 1;
        if file.len() - at < RECORD_HDR_LEN {
            return err(format!("frame {frame}: record header cut short"));
        }
        let caplen = u32::from_le_bytes(file[at + 8..at + 12].try_into().expect("4")) as usize;
        at += RECORD_HDR_LEN;
        if caplen > file.len() - at {
            return err(format!(
                "frame {frame}: caplen {caplen} beyond the end of the file"
            ));
        }
        let pkt = &file[at..at + caplen];
        at += caplen;
        if let Some(seg) = parse_frame(frame, pkt) {
            out.push(seg);
        }
    }
    Ok(out)
}

fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

/// Ethernet (optionally one VLAN tag) / IPv4 / TCP, or `None`.
fn parse_frame(frame: u64, pkt: &[u8]) -> Option<TcpSegment> {
    if pkt.len() < ETH_HDR_LEN {
        return None;
    }
    let mut l3 = ETH_HDR_LEN;
    let mut ethertype = be16(pkt, 12);
    if ethertype == ETHERTYPE_VLAN {
        if pkt.len() < ETH_HDR_LEN + 4 {
            return None;
        }
        ethertype = be16(pkt, 16);
        l3 += 4;
    }
    if ethertype != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = &pkt[l3..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(be16(ip, 2));
    // The IP total length, not the frame length, ends the packet: Ethernet pads short
    // frames to 60 B and those bytes are not TCP payload.
    if ihl < 20 || total < ihl || total > ip.len() {
        return None;
    }
    let frag = be16(ip, 6);
    if frag & 0x3fff != 0 || ip[9] != IPPROTO_TCP {
        return None; // a fragment, or not TCP
    }
    let src_ip = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst_ip = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let tcp = &ip[ihl..total];
    if tcp.len() < 20 {
        return None;
    }
    let off = usize::from(tcp[12] >> 4) * 4;
    if off < 20 || off > tcp.len() {
        return None;
    }
    let flags = tcp[13];
    Some(TcpSegment {
        frame,
        src: SocketAddrV4::new(src_ip, be16(tcp, 0)),
        dst: SocketAddrV4::new(dst_ip, be16(tcp, 2)),
        seq: u32::from_be_bytes(tcp[4..8].try_into().expect("4")),
        syn: flags & 0x02 != 0,
        fin: flags & 0x01 != 0,
        rst: flags & 0x04 != 0,
        payload: tcp[off..].to_vec(),
    })
}

/// One direction of a TCP connection, reassembled.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    /// The contiguous bytes from the first byte after the SYN (or the first segment
    /// seen, if the capture has no SYN).
    pub bytes: Vec<u8>,
    /// `(stream offset, frame)` at which each frame's new bytes start, ascending.
    pub frames: Vec<(usize, u64)>,
    /// Bytes seen beyond a hole (a segment missing from the capture): the stream is
    /// cut at the hole.
    pub gap_after: Option<usize>,
    /// Cut at [`STREAM_BYTES_MAX`].
    pub truncated: bool,
    /// Frame of the first segment, to order streams.
    pub first_frame: u64,
}

impl Stream {
    /// The frame that carried stream byte `offset`.
    pub fn frame_of(&self, offset: usize) -> u64 {
        match self.frames.partition_point(|&(o, _)| o <= offset) {
            0 => self.first_frame,
            i => self.frames[i - 1].1,
        }
    }
}

/// The key of one direction.
pub type Direction = (SocketAddrV4, SocketAddrV4);

/// Reassemble every direction of every TCP connection in `segs`.
pub fn reassemble(segs: &[TcpSegment]) -> Result<HashMap<Direction, Stream>, PcapError> {
    struct Acc {
        isn: Option<u32>,
        base: Option<u32>,
        pending: BTreeMap<u64, (u64, Vec<u8>)>,
        first_frame: u64,
    }
    let mut accs: HashMap<Direction, Acc> = HashMap::new();
    for s in segs {
        let key = (s.src, s.dst);
        if !accs.contains_key(&key) && accs.len() >= STREAMS_MAX {
            return err(format!("more than {STREAMS_MAX} TCP stream directions"));
        }
        let a = accs.entry(key).or_insert(Acc {
            isn: None,
            base: None,
            pending: BTreeMap::new(),
            first_frame: s.frame,
        });
        if s.syn {
            a.isn = Some(s.seq);
            a.base = Some(s.seq.wrapping_add(1));
        }
        if s.payload.is_empty() {
            continue;
        }
        let base = *a.base.get_or_insert(s.seq);
        // Offset relative to the stream start; a segment before it (wrapping
        // difference above 2^31) is a retransmission of bytes we do not follow.
        let rel = s.seq.wrapping_sub(base);
        if rel >= 1 << 31 {
            continue;
        }
        a.pending
            .entry(u64::from(rel))
            .or_insert((s.frame, s.payload.clone()));
    }
    let mut out = HashMap::new();
    for (key, a) in accs {
        let mut st = Stream {
            first_frame: a.first_frame,
            ..Default::default()
        };
        for (off, (frame, data)) in a.pending {
            let have = st.bytes.len() as u64;
            if off > have {
                st.gap_after = Some(st.bytes.len());
                break;
            }
            let skip = (have - off) as usize;
            if skip >= data.len() {
                continue; // a retransmission of bytes we have
            }
            let new = &data[skip..];
            let room = STREAM_BYTES_MAX - st.bytes.len();
            if new.len() > room {
                st.truncated = true;
            }
            let new = &new[..new.len().min(room)];
            if new.is_empty() {
                break;
            }
            st.frames.push((st.bytes.len(), frame));
            st.bytes.extend_from_slice(new);
        }
        out.insert(key, st);
    }
    Ok(out)
}

/// Writes one TCP connection between two IPv4 endpoints as a classic pcap, for
/// captures made from our own byte streams (tests, and the tshark cross-check).
#[derive(Debug)]
pub struct ConversationWriter {
    a: SocketAddrV4,
    b: SocketAddrV4,
    seq_a: u32,
    seq_b: u32,
    out: Vec<u8>,
    usec: u32,
}

/// Largest TCP payload one written packet carries.
pub const WRITER_PAYLOAD_MAX: usize = 65535 - 40;

fn csum_add(mut sum: u32, b: &[u8]) -> u32 {
    for c in b.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl ConversationWriter {
    /// A capture that starts with the handshake of `a` (the initiator) to `b`.
    pub fn new(a: SocketAddrV4, b: SocketAddrV4) -> Self {
        let mut w = ConversationWriter {
            a,
            b,
            seq_a: 1000,
            seq_b: 5000,
            out: Vec::new(),
            usec: 0,
        };
        w.out.extend_from_slice(&MAGIC_US.to_le_bytes());
        w.out.extend_from_slice(&2u16.to_le_bytes());
        w.out.extend_from_slice(&4u16.to_le_bytes());
        w.out.extend_from_slice(&[0; 8]);
        w.out.extend_from_slice(&65535u32.to_le_bytes());
        w.out.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.packet(true, 0x02, &[]);
        w.seq_a = w.seq_a.wrapping_add(1);
        w.packet(false, 0x12, &[]);
        w.seq_b = w.seq_b.wrapping_add(1);
        w.packet(true, 0x10, &[]);
        w
    }

    /// One PSH/ACK packet with `payload` (at most [`WRITER_PAYLOAD_MAX`] bytes) from
    /// `a` if `from_a`, else from `b`.
    pub fn data(&mut self, from_a: bool, payload: &[u8]) {
        assert!(
            payload.len() <= WRITER_PAYLOAD_MAX,
            "payload too large for one packet"
        );
        self.packet(from_a, 0x18, payload);
        let n = payload.len() as u32;
        if from_a {
            self.seq_a = self.seq_a.wrapping_add(n);
        } else {
            self.seq_b = self.seq_b.wrapping_add(n);
        }
    }

    fn packet(&mut self, from_a: bool, flags: u8, payload: &[u8]) {
        let (src, dst, seq, ack) = if from_a {
            (self.a, self.b, self.seq_a, self.seq_b)
        } else {
            (self.b, self.a, self.seq_b, self.seq_a)
        };
        let ack_flag_ok = flags & 0x10 != 0;
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&src.port().to_be_bytes());
        tcp.extend_from_slice(&dst.port().to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&(if ack_flag_ok { ack } else { 0 }).to_be_bytes());
        tcp.push(5 << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]);
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&src.ip().octets());
        pseudo.extend_from_slice(&dst.ip().octets());
        pseudo.extend_from_slice(&[0, IPPROTO_TCP]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        let c = csum_fold(csum_add(csum_add(0, &pseudo), &tcp));
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_TCP, 0, 0]);
        ip.extend_from_slice(&src.ip().octets());
        ip.extend_from_slice(&dst.ip().octets());
        let c = csum_fold(csum_add(0, &ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        // Fixed locally administered MACs, as gen_golden.py writes them.
        let mut frame = vec![2, 0, 0, 0, 0, 2];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);
        self.out.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        self.out.extend_from_slice(&self.usec.to_le_bytes());
        self.usec += 1000;
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.extend_from_slice(&frame);
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}
