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
