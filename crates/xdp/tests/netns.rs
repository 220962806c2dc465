//! End to end: a network namespace joined to the root namespace by a veth pair, the
//! responder attached to the namespace's end, and `farside_rmem::UdpClient` in the root
//! namespace doing READ/WRITE/CAS/FADD against it. Nothing listens on the port in the
//! namespace, so every answer comes from the XDP program. Checksum offload is off on
//! both ends (tx and rx), so the root stack really verifies the reply's UDP checksum.
//!
//! The responder is attached from a thread that entered the namespace with setns(2)
//! (as gatherd running inside a namespace would); its bpf_link stays attached after
//! the thread exits and is detached when the responder drops.

mod common;

use common::sh;

use common::{covered, keyring, keys, need_root, opened, seal};

/// Also skip (and say so) without ethtool: offloads must be off for checksums to count.
fn need_root_and_ethtool(test: &str) -> bool {
    if !need_root(test) {
        return false;
    }
    farside_testkit::tool_or_skip(test, "ethtool", "--version", "ethtool")
}
use farside_rmem::wire::{
    self, Op, RepHeader, Status, ENVELOPE_BYTES, REP_HEADER_BYTES, REQ_HEADER_BYTES,
};
use farside_rmem::{ClientKey, ClientOptions, OpCounters, RemoteMemory, RmemError, ServerKeys};
use farside_rmem::{UdpClient, UdpServer};
use farside_xdp::{XdpMode, XdpResponder, XDP_READ_BYTES_MAX};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A namespace and a veth pair, removed on drop (also when the test fails).
struct Net {
    ns: String,
    veth_root: String,
    veth_ns: String,
    ip_root: String,
    ip_ns: String,
}

impl Net {
    /// `tag` keeps names unique per test; the pid keeps them unique per run.
    fn new(tag: u8) -> Net {
        let pid = std::process::id();
        let subnet = format!("10.{}.{}", 100 + tag, pid % 250);
        let net = Net {
            ns: format!("fsxdp-{pid}-{tag}"),
            veth_root: format!("fxr{}{tag}", pid % 100_000),
            veth_ns: format!("fxn{}{tag}", pid % 100_000),
            ip_root: format!("{subnet}.1"),
            ip_ns: format!("{subnet}.2"),
        };
        net.setup().unwrap_or_else(|e| panic!("network setup: {e}"));
        net
    }

    fn setup(&self) -> Result<(), String> {
        let (ns, vr, vn) = (&self.ns, &self.veth_root, &self.veth_ns);
        sh(&["ip", "netns", "add", ns])?;
        sh(&[
            "ip", "link", "add", vr, "type", "veth", "peer", "name", vn, "netns", ns,
        ])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.ip_root),
            "dev",
            vr,
        ])?;
        sh(&["ip", "link", "set", vr, "up"])?;
        sh(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{}/24", self.ip_ns),
            "dev",
            vn,
        ])?;
        sh(&["ip", "-n", ns, "link", "set", vn, "up"])?;
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        // Offloads off: replies must carry a correct UDP checksum, and the receiver must check it.
        sh(&["ethtool", "-K", vr, "tx", "off", "rx", "off"])?;
        sh(&[
            "nsenter",
            &format!("--net=/run/netns/{ns}"),
            "ethtool",
            "-K",
            vn,
            "tx",
            "off",
            "rx",
            "off",
        ])?;
        Ok(())
    }

    /// Run `f` on a thread inside the namespace.
    fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open netns");
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this (fresh, short-lived) thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = sh(&["ip", "link", "del", &self.veth_root]);
        let _ = sh(&["ip", "netns", "del", &self.ns]);
    }
}

fn client(net: &Net, port: u16, key: ClientKey) -> UdpClient {
    let addr: SocketAddr = format!("{}:{port}", net.ip_ns).parse().unwrap();
    UdpClient::new(
        addr,
        ClientOptions {
            key: Some(key),
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .expect("client")
}

/// Send one request datagram (raw socket) and return the reply datagram.
fn raw_exchange(net: &Net, port: u16, req: &[u8]) -> Vec<u8> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    sock.connect(format!("{}:{port}", net.ip_ns)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    sock.send(req).unwrap();
    let mut rep = vec![0u8; wire::REP_BYTES_MAX];
    let n = sock.recv(&mut rep).expect("reply");
    rep.truncate(n);
    rep
}

/// A sealed READ (sender 0x5e, op seq 42) followed by `padding` zero bytes.
fn read_request(key: &ClientKey, offset: u32, len: usize, padding: usize) -> Vec<u8> {
    let mut req = seal(
        key,
        0x5e,
        &covered(Op::Read as u8, 0, 42, 0, offset, len as u32, &[]),
    );
    req.resize(req.len() + padding, 0);
    req
}

/// READ `len` bytes at `offset` with a request padded to the reply's size, so the
/// program never needs to grow the frame.
fn padded_read(net: &Net, port: u16, key: &ClientKey, offset: u32, len: usize) -> Vec<u8> {
    let padding = (REP_HEADER_BYTES + len).saturating_sub(REQ_HEADER_BYTES);
    let rep = raw_exchange(net, port, &read_request(key, offset, len, padding));
    let body = opened(key, &rep);
    let h = RepHeader::decode(&body).expect("reply header");
    assert_eq!((h.status, h.seq, h.len as usize), (Status::Ok, 42, len));
    assert_eq!(rep.len(), ENVELOPE_BYTES + REP_HEADER_BYTES + len);
    body[REP_HEADER_BYTES..].to_vec()
}

fn exercise(net: &Net, responder: &XdpResponder, port: u16) {
    let region = responder.region();
    let words = region.words();
    let mut rw = client(net, port, keys().rw);
    let mut ro = client(net, port, keys().ro);

    // A plain store from user space is visible to a remote READ.
    words[3].store(0xfeed_beef, Ordering::Release);
    let mut buf = [0u8; 8];
    ro.read(24, &mut buf).expect("read");
    assert_eq!(u64::from_le_bytes(buf), 0xfeed_beef);

    // A remote WRITE (to the locks: words 36..44) is visible in the mapping.
    let data: Vec<u8> = (0..64u8).collect();
    rw.write(288, &data).expect("write");
    for i in 0..8 {
        let want = u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(words[36 + i].load(Ordering::Acquire), want);
    }

    // CAS wins once, then loses and reports the current value.
    assert_eq!(rw.compare_swap(352, 0, 7).expect("cas"), 0);
    assert_eq!(rw.compare_swap(352, 0, 9).expect("cas"), 7);
    assert_eq!(words[44].load(Ordering::Acquire), 7);

    // Remote FADD and local atomic adds are coherent.
    words[50].fetch_add(100, Ordering::AcqRel);
    assert_eq!(rw.fetch_add(400, 5).expect("fadd"), 100);
    words[50].fetch_add(1, Ordering::AcqRel);
    assert_eq!(words[50].load(Ordering::Acquire), 106);

    // The largest READ the program answers, padded to the reply's size (so the frame
    // need not grow): answered in the kernel.
    for (i, w) in words.iter().enumerate().take(XDP_READ_BYTES_MAX / 8) {
        w.store(i as u64 * 3 + 1, Ordering::Release);
    }
    let big = padded_read(net, port, &keys().ro, 0, XDP_READ_BYTES_MAX);
    for (i, c) in big.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(c.try_into().unwrap()), i as u64 * 3 + 1);
    }
    assert_eq!(responder.no_room(), 0);

    // UdpClient pads its READs itself, so its largest READ is answered in the kernel too.
    let mut big = vec![0u8; XDP_READ_BYTES_MAX];
    ro.read(0, &mut big).expect("client read max");
    for (i, c) in big.chunks_exact(8).enumerate() {
        assert_eq!(u64::from_le_bytes(c.try_into().unwrap()), i as u64 * 3 + 1);
    }
    assert_eq!(
        responder.no_room(),
        0,
        "the client's padded READ was answered by XDP"
    );

    // A foreign client's unpadded READ would be answered by a reply 30 times its size:
    // refused in the kernel with a header-only reply (no reflection).
    let req = read_request(&keys().ro, 0, XDP_READ_BYTES_MAX, 0);
    let rep = raw_exchange(net, port, &req);
    let h = RepHeader::decode(&opened(&keys().ro, &rep)).expect("reply header");
    assert_eq!((h.status, h.len), (Status::Unpadded, 0));
    assert!(rep.len() <= req.len());
    assert_eq!(responder.no_room(), 0, "nothing passed to the stack");

    // Refusals: over the XDP read limit, read-only key writing, unknown key (dropped).
    let rep = raw_exchange(
        net,
        port,
        &read_request(&keys().ro, 0, XDP_READ_BYTES_MAX + 8, 0),
    );
    let h = RepHeader::decode(&opened(&keys().ro, &rep)).expect("reply header");
    assert_eq!(
        (h.status, h.len, rep.len()),
        (Status::BadLength, 0, ENVELOPE_BYTES + REP_HEADER_BYTES)
    );
    assert!(matches!(
        ro.write(288, &[1; 8]),
        Err(RmemError::Refused(Status::ReadOnly))
    ));
    assert!(matches!(
        rw.write(0, &[1; 8]),
        Err(RmemError::Refused(Status::Protected))
    ));
    let mut stranger = client(net, port, keys().stranger);
    stranger.tries = 1;
    assert!(matches!(
        stranger.read(0, &mut buf),
        Err(RmemError::Timeout)
    ));

    let (ops, status) = responder.counters();
    assert_eq!(
        ops[1], 5,
        "reads (client max read and unpadded included): {ops:?}"
    );
    assert_eq!(
        ops[0], 1,
        "the stranger's READ: not authentic, op unknown: {ops:?}"
    );
    assert_eq!(ops[2], 3, "writes: {ops:?}");
    assert_eq!(ops[3], 2, "cas: {ops:?}");
    assert_eq!(ops[4], 1, "fadd: {ops:?}");
    assert_eq!(status[Status::Ok as usize], 7, "{status:?}");
    assert_eq!(status[Status::Unpadded as usize], 1, "{status:?}");
    assert_eq!(status[Status::Protected as usize], 1, "{status:?}");
    assert_eq!(status[Status::BadLength as usize], 1, "{status:?}");
    assert_eq!(status[Status::ReadOnly as usize], 1, "{status:?}");
    assert_eq!(status[Status::BadKey as usize], 1, "{status:?}");
    assert_eq!(responder.aborted(), 0);
}

/// Attach the responder (in the calling thread's namespace) and start the user-space
/// server on the same port and region, as gatherd should: XDP answers what it can, the
/// server what the program passes to the stack.
fn attach_with_fallback(ifname: &str, mode: XdpMode, port: u16) -> (XdpResponder, UdpServer) {
    let responder =
        XdpResponder::attach(ifname, mode, port, &keyring()).unwrap_or_else(|e| panic!("{e}"));
    let server = UdpServer::spawn(
        format!("0.0.0.0:{port}").parse().unwrap(),
        responder.region(),
        Arc::new(ServerKeys::new(keyring())),
        Arc::new(OpCounters::default()),
    )
    .expect("user-space fallback server");
    (responder, server)
}

#[test]
fn udp_client_talks_to_the_generic_mode_responder() {
    if !need_root_and_ethtool("udp_client_talks_to_the_generic_mode_responder") {
        return;
    }
    let net = Net::new(1);
    let port = 7301;
    let ifname = net.veth_ns.clone();
    let (responder, _fallback) =
        net.inside(move || attach_with_fallback(&ifname, XdpMode::Generic, port));
    assert_eq!(responder.mode(), XdpMode::Generic);
    exercise(&net, &responder, port);

    // Detached on drop: with the fallback stopped too, nothing answers any more.
    drop(responder);
    drop(_fallback);
    let mut c = client(&net, port, keys().ro);
    c.tries = 1;
    let mut buf = [0u8; 8];
    assert!(c.read(0, &mut buf).is_err(), "answered after detach");
}

#[test]
fn udp_client_talks_to_the_native_mode_responder() {
    if !need_root_and_ethtool("udp_client_talks_to_the_native_mode_responder") {
        return;
    }
    let net = Net::new(2);
    let port = 7302;
    // Native XDP on veth needs a program on the peer too: the responder serving an
    // unused port passes everything, so it serves as the bare XDP_PASS program.
    let _peer = XdpResponder::attach(&net.veth_root, XdpMode::Native, 9, &empty())
        .expect("attach the pass-through program on the root end");
    let ifname = net.veth_ns.clone();
    let (responder, _fallback) =
        net.inside(move || attach_with_fallback(&ifname, XdpMode::Native, port));
    exercise(&net, &responder, port);
}

#[test]
fn attach_errors_say_what_failed() {
    if !need_root("attach_errors_say_what_failed") {
        return;
    }
    let e = XdpResponder::attach("fsx-no-such-if", XdpMode::Generic, 7000, &empty())
        .err()
        .expect("no such interface");
    assert!(e.to_string().contains("fsx-no-such-if"), "{e}");
    println!("no such interface: {e}");
    // Loopback has no native XDP support: the error names the mode and the fallback.
    if let Err(e) = XdpResponder::attach("lo", XdpMode::Native, 7000, &empty()) {
        let m = e.to_string();
        assert!(m.contains("native mode") && m.contains("generic"), "{m}");
        println!("native on lo: {m}");
    }
}

fn empty() -> farside_auth::keys::Keyring {
    farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production)
}
