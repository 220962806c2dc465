//! Frames for the packet tests: building requests and checking replies (checksums
//! computed here, independently of the BPF program).
#![allow(dead_code)]

pub const MAC_CLIENT: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const MAC_SERVER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const IP_CLIENT: [u8; 4] = [10, 0, 0, 2];
pub const IP_SERVER: [u8; 4] = [10, 0, 0, 1];
pub const PORT_CLIENT: u16 = 40_000;

/// Skip (and say so) unless root: loading BPF needs CAP_BPF/CAP_NET_ADMIN.
pub fn need_root(test: &str) -> bool {
    farside_testkit::root_or_skip(test)
}

/// One's complement sum of big-endian 16-bit words (odd byte padded), unfolded.
pub fn sum16(b: &[u8]) -> u64 {
    b.chunks(2)
        .map(|c| u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

pub fn fold(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// IPv4 header checksum field value for `hdr` (its checksum bytes must be zero).
pub fn ip_checksum(hdr: &[u8]) -> u16 {
    !fold(sum16(hdr))
}

/// UDP checksum field value over pseudo header + `udp` (checksum bytes zero).
pub fn udp_checksum(src: [u8; 4], dst: [u8; 4], udp: &[u8]) -> u16 {
    let s = sum16(&src) + sum16(&dst) + 17 + udp.len() as u64 + sum16(udp);
    match !fold(s) {
        0 => 0xffff,
        c => c,
    }
}

/// How to shape a frame around a UDP payload.
#[derive(Clone, Copy)]
pub struct Shape {
    pub dst_port: u16,
    pub ethertype: u16,
    pub proto: u8,
    /// 32-bit words of IP options (all NOPs).
    pub ip_option_words: u8,
    /// frag_off field, host order (0x4000 = DF).
    pub frag_off: u16,
    /// Added to the UDP length field (to make it inconsistent).
    pub udp_len_extra: i32,
    /// Bytes after the IP packet (Ethernet padding).
    pub trailer: usize,
    /// Send UDP checksum 0 ("none").
    pub no_udp_checksum: bool,
}

impl Shape {
    pub fn to_port(port: u16) -> Shape {
        Shape {
            dst_port: port,
            ethertype: 0x0800,
            proto: 17,
            ip_option_words: 0,
            frag_off: 0x4000,
            udp_len_extra: 0,
            trailer: 0,
            no_udp_checksum: false,
        }
    }
}

pub fn frame(shape: Shape, payload: &[u8]) -> Vec<u8> {
    frame_to(shape, payload, MAC_SERVER, IP_SERVER)
}

/// The multicast MAC of IPv4 group `g`: 01:00:5e and the group's low 23 bits.
pub fn group_mac(g: [u8; 4]) -> [u8; 6] {
    [0x01, 0x00, 0x5e, g[1] & 0x7f, g[2], g[3]]
}

/// As [`frame`], addressed to `dst_mac` / `dst_ip` (a group's, say).
pub fn frame_to(shape: Shape, payload: &[u8], dst_mac: [u8; 6], dst_ip: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&MAC_CLIENT);
    f.extend_from_slice(&shape.ethertype.to_be_bytes());
    let ihl = 5 + shape.ip_option_words as usize;
    let udp_len = 8 + payload.len();
    let tot = ihl * 4 + udp_len;
    let ip_start = f.len();
    f.push(0x40 | ihl as u8);
    f.push(0);
    f.extend_from_slice(&(tot as u16).to_be_bytes());
    f.extend_from_slice(&0x1234u16.to_be_bytes());
    f.extend_from_slice(&shape.frag_off.to_be_bytes());
    f.push(64);
    f.push(shape.proto);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&IP_CLIENT);
    f.extend_from_slice(&dst_ip);
    f.extend(std::iter::repeat_n(1u8, shape.ip_option_words as usize * 4));
    let c = ip_checksum(&f[ip_start..]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&c.to_be_bytes());
    let udp_start = f.len();
    f.extend_from_slice(&PORT_CLIENT.to_be_bytes());
    f.extend_from_slice(&shape.dst_port.to_be_bytes());
    let len_field = (udp_len as i32 + shape.udp_len_extra) as u16;
    f.extend_from_slice(&len_field.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    if !shape.no_udp_checksum {
        let c = udp_checksum(IP_CLIENT, dst_ip, &f[udp_start..]);
        f[udp_start + 6..udp_start + 8].copy_from_slice(&c.to_be_bytes());
    }
    f.extend(std::iter::repeat_n(0xeeu8, shape.trailer));
    f
}

/// Check that `reply` is a correct answer frame to `request` (both built by [`frame`]
/// with no IP options) and return its UDP payload.
pub fn check_reply(what: &str, request: &[u8], reply: &[u8], port: u16) -> Vec<u8> {
    assert!(reply.len() >= 42, "{what}: reply of {} bytes", reply.len());
    assert_eq!(
        &reply[0..6],
        &request[6..12],
        "{what}: eth dst = request src"
    );
    assert_eq!(
        &reply[6..12],
        &request[0..6],
        "{what}: eth src = request dst"
    );
    assert_eq!(&reply[12..14], &[0x08, 0x00], "{what}: ethertype");
    let ip = &reply[14..34];
    assert_eq!(ip[0], 0x45, "{what}: version/ihl");
    assert_eq!(ip[9], 17, "{what}: protocol");
    let tot = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    assert_eq!(tot, reply.len() - 14, "{what}: IP total length = frame");
    assert_eq!(fold(sum16(ip)), 0xffff, "{what}: IP checksum");
    assert_eq!(&ip[12..16], &IP_SERVER, "{what}: IP src");
    assert_eq!(&ip[16..20], &IP_CLIENT, "{what}: IP dst");
    let udp = &reply[34..];
    assert_eq!(
        u16::from_be_bytes([udp[0], udp[1]]),
        port,
        "{what}: UDP src"
    );
    assert_eq!(
        u16::from_be_bytes([udp[2], udp[3]]),
        PORT_CLIENT,
        "{what}: UDP dst"
    );
    assert_eq!(
        u16::from_be_bytes([udp[4], udp[5]]) as usize,
        udp.len(),
        "{what}: UDP length"
    );
    let mut z = udp.to_vec();
    z[6] = 0;
    z[7] = 0;
    let want = udp_checksum(IP_SERVER, IP_CLIENT, &z);
    assert_eq!(
        u16::from_be_bytes([udp[6], udp[7]]),
        want,
        "{what}: UDP checksum"
    );
    udp[8..].to_vec()
}

/// Runs a command (`args[0]` with the rest), its stderr in the error.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The tests' keys: a reader (id 1), a balancer (id 2), a read-write key (id 3, the
/// widest rights: `farside_rmem::auth::local_rights`), and a key no program holds.
pub struct TestKeys {
    pub ro: farside_rmem::ClientKey,
    pub bal: farside_rmem::ClientKey,
    pub rw: farside_rmem::ClientKey,
    pub stranger: farside_rmem::ClientKey,
}

pub fn keys() -> &'static TestKeys {
    static K: std::sync::OnceLock<TestKeys> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let (a, b) = (
            farside_rmem::LabKeyset::generate(),
            farside_rmem::LabKeyset::generate(),
        );
        TestKeys {
            ro: a.reader,
            bal: a.balancer,
            rw: farside_rmem::ClientKey::new(farside_auth::mac::KeyId(3), *b.reader.key()),
            stranger: farside_rmem::ClientKey::new(farside_auth::mac::KeyId(9), *b.balancer.key()),
        }
    })
}

/// The keyring of a program (and of the reference server): ro, bal and rw.
pub fn keyring() -> farside_auth::keys::Keyring {
    use farside_rmem::Role;
    let k = keys();
    let mut r = farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production);
    r.install("reader", k.ro.id, *k.ro.key(), Role::Reader.rights())
        .unwrap();
    r.install("balancer", k.bal.id, *k.bal.key(), Role::Balancer.rights())
        .unwrap();
    r.install(
        "rw",
        k.rw.id,
        *k.rw.key(),
        farside_rmem::auth::local_rights(),
    )
    .unwrap();
    r
}

/// The envelope seqs of every sealed request: increasing over the whole test binary,
/// so each request is new to its (key, sender) window.
static ENV_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The covered bytes of a request.
pub fn covered(
    op: u8,
    flags: u16,
    seq: u64,
    region: u32,
    offset: u32,
    len: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = Vec::new();
    farside_rmem::wire::encode_request(
        &mut b,
        &farside_rmem::wire::ReqHeader {
            op,
            flags,
            seq,
            region,
            offset,
            len,
        },
        payload,
    );
    b
}

/// `covered` sealed under `key` by `sender`, with the next envelope seq.
pub fn seal(key: &farside_rmem::ClientKey, sender: u64, covered: &[u8]) -> Vec<u8> {
    let seq = ENV_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut b = Vec::new();
    farside_rmem::auth::seal_request(&mut b, key, sender, seq, covered);
    b
}

/// A sealed request of sender 0x5e, op seq `seq`; READs up to the XDP limit padded to
/// their reply's size.
pub fn sealed_req(
    op: u8,
    key: &farside_rmem::ClientKey,
    seq: u64,
    offset: u32,
    len: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = seal(key, 0x5e, &covered(op, 0, seq, 0, offset, len, payload));
    if op == 1 && len as usize <= farside_xdp::XDP_READ_BYTES_MAX {
        let n = farside_rmem::wire::ENVELOPE_BYTES
            + farside_rmem::wire::REP_HEADER_BYTES
            + len as usize;
        b.resize(b.len().max(n), 0);
    }
    b
}

/// The covered bytes of a sealed reply (envelope checked: the key, sender 0x5e).
pub fn opened(key: &farside_rmem::ClientKey, reply: &[u8]) -> Vec<u8> {
    farside_rmem::auth::open_reply(reply, key, 0x5e, 1..=u64::MAX)
        .expect("a reply sealed under the request's key")
        .to_vec()
}
