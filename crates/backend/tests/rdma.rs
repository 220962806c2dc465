//! The `RDMA:` header end to end over loopback (port 0): server-writes and
//! client-reads deliver the file byte for byte, and every request the server will not
//! take that way (no header, too large, no RDMA listener, another address, `--rdma`
//! off) gets its ordinary body.

use farside_backend::{spawn, BackendArgs, Handle};
use farside_rdmahttp::client::{get, GetOptions, Via};
use farside_rdmahttp::header::{Decline, Mode};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fresh docroot with a small file (sent from the connection's buffer) and a large
/// one (beyond it, streamed over TCP), removed on drop.
struct Docroot(PathBuf);

impl Docroot {
    fn new(tag: &str) -> Docroot {
        let dir = std::env::temp_dir().join(format!(
            "farside-rdma-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("small.bin"), content(10_000, 1)).unwrap();
        std::fs::write(dir.join("large.bin"), content(3_000_000, 2)).unwrap();
        Docroot(dir)
    }

    fn file(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.0.join(name)).unwrap()
    }
}

impl Drop for Docroot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn content(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn backend(root: &Path, rdma: bool) -> (SocketAddr, Handle) {
    let mut args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(root.to_path_buf()),
        workers: 4,
        header_timeout_ms: 5000,
        ..BackendArgs::default()
    };
    args.rdma.rdma = rdma;
    args.rdma.connect_timeout_ms = 500;
    spawn(args).expect("spawn backend")
}

fn opts(mode: Option<Mode>, maxlen: u64) -> GetOptions {
    GetOptions {
        mode,
        maxlen,
        timeout: Duration::from_secs(5),
    }
}

#[test]
fn server_writes_and_client_reads_deliver_the_file_byte_for_byte() {
    let root = Docroot::new("modes");
    let (addr, _backend) = backend(&root.0, true);
    for name in ["small.bin", "large.bin"] {
        for (mode, via) in [
            (Mode::ServerWrites, Via::ServerWrites),
            (Mode::ClientReads, Via::ClientReads),
        ] {
            let got = get(&format!("http://{addr}/{name}"), &opts(Some(mode), 4 << 20)).unwrap();
            assert_eq!((got.status, got.via), (200, via), "{name} {mode:?}");
            assert!(got.body == root.file(name), "{name} {mode:?}: body differs");
        }
    }
}

/// The server closes its RDMA connection right after answering (the client asked
/// `Connection: close`): the tail of the Write and the Send behind it still arrive.
#[test]
fn repeated_transfers_never_lose_the_tail() {
    let root = Docroot::new("repeat");
    let (addr, _backend) = backend(&root.0, true);
    let want = root.file("large.bin");
    for i in 0..10 {
        for mode in [Mode::ServerWrites, Mode::ClientReads] {
            let got = get(
                &format!("http://{addr}/large.bin"),
                &opts(Some(mode), 4 << 20),
            )
            .unwrap_or_else(|e| panic!("round {i} {mode:?}: {e}"));
            assert!(
                matches!(got.via, Via::ServerWrites | Via::ClientReads) && got.body == want,
                "round {i} {mode:?}"
            );
        }
    }
}

#[test]
fn fallbacks_send_the_ordinary_body() {
    let root = Docroot::new("fallback");
    let (addr, _backend) = backend(&root.0, true);
    let url = format!("http://{addr}/large.bin");
    let want = root.file("large.bin");
    // No header.
    let got = get(&url, &opts(None, 0)).unwrap();
    assert_eq!((got.status, got.via), (200, Via::Tcp(None)));
    assert!(got.body == want);
    // Larger than the client's maxlen, in either mode.
    for mode in [Mode::ServerWrites, Mode::ClientReads] {
        let got = get(&url, &opts(Some(mode), 1 << 20)).unwrap();
        assert_eq!(got.via, Via::Tcp(Some(Decline::TooLarge)), "{mode:?}");
        assert!(got.body == want);
    }
    // Not a 200: the error as usual.
    let got = get(
        &format!("http://{addr}/missing"),
        &opts(Some(Mode::ServerWrites), 1 << 20),
    )
    .unwrap();
    assert_eq!(
        (got.status, got.via),
        (404, Via::Tcp(Some(Decline::NotOffered)))
    );
}

/// Sends `field` as the `RDMA:` header of a GET, returns (status, RDMA field, body).
fn raw_get(addr: SocketAddr, path: &str, field: &str) -> (u16, Option<String>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRDMA: {field}\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&all[..end]).to_string();
    let status = head[9..12].parse().unwrap();
    let rdma = head
        .lines()
        .find_map(|l| l.strip_prefix("RDMA: "))
        .map(str::to_string);
    (status, rdma, all[end..].to_vec())
}

#[test]
fn a_refused_or_foreign_rdma_endpoint_gets_the_ordinary_body() {
    let root = Docroot::new("refused");
    let (addr, _backend) = backend(&root.0, true);
    let want = root.file("small.bin");
    // A port with nothing listening: connection refused.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (status, rdma, body) = raw_get(
        addr,
        "/small.bin",
        &format!("server-writes, ip=127.0.0.1, port={port}, stag=256, to=0, maxlen=1048576"),
    );
    assert_eq!(
        (status, rdma.as_deref()),
        (200, Some("declined, reason=connect"))
    );
    assert!(body == want);
    // A listener that never finishes the MPA set-up: the server gives up in time.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let (status, rdma, body) = raw_get(
        addr,
        "/small.bin",
        &format!(
            "client-reads, ip=127.0.0.1, port={}, maxlen=1048576",
            mute.local_addr().unwrap().port()
        ),
    );
    assert_eq!(
        (status, rdma.as_deref()),
        (200, Some("declined, reason=connect"))
    );
    assert!(body == want);
    // Another host's address: never connected to.
    let (status, rdma, body) = raw_get(
        addr,
        "/small.bin",
        "server-writes, ip=10.9.8.7, port=9, stag=256, maxlen=1048576",
    );
    assert_eq!(
        (status, rdma.as_deref()),
        (200, Some("declined, reason=peer-mismatch"))
    );
    assert!(body == want);
    // A field that does not parse.
    let (status, rdma, body) = raw_get(addr, "/small.bin", "server-writes, ip=");
    assert_eq!(
        (status, rdma.as_deref()),
        (200, Some("declined, reason=bad-field"))
    );
    assert!(body == want);
}

#[test]
fn without_rdma_the_header_is_declined_and_the_body_sent() {
    let root = Docroot::new("off");
    let (addr, _backend) = backend(&root.0, false);
    let got = get(
        &format!("http://{addr}/small.bin"),
        &opts(Some(Mode::ServerWrites), 1 << 20),
    )
    .unwrap();
    assert_eq!(got.via, Via::Tcp(Some(Decline::NotOffered)));
    assert!(got.body == root.file("small.bin"));
}

/// curl, which knows nothing of RDMA, gets the file with and without the header (it
/// names an endpoint where nothing listens, as a client that cannot take RDMA might).
#[test]
fn curl_gets_the_file_with_and_without_the_header() {
    let test = "curl_gets_the_file_with_and_without_the_header";
    if !farside_testkit::tool_or_skip(test, "curl", "--version", "curl") {
        return;
    }
    let root = Docroot::new("curl");
    let (addr, _backend) = backend(&root.0, true);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let field =
        format!("RDMA: server-writes, ip=127.0.0.1, port={port}, stag=256, maxlen=99999999");
    for name in ["small.bin", "large.bin"] {
        for header in [None, Some(field.as_str())] {
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-s", "--max-time", "10", &format!("http://{addr}/{name}")]);
            if let Some(h) = header {
                cmd.args(["-H", h]);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{name} {header:?}: {out:?}");
            assert!(
                out.stdout == root.file(name),
                "{name} {header:?}: body differs"
            );
        }
    }
}

/// A client-reads transfer the client never finishes: the test accepts the server's
/// RDMA connection and reads the answer, but never Reads nor says done.
struct Stalled {
    _ep: farside_iwarp::tcp::Endpoint,
    stag: u32,
}

fn stall_client_reads(addr: SocketAddr) -> Stalled {
    use farside_iwarp::qp::{Qp, QpConfig};
    use farside_iwarp::verbs::{Cq, Device};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let accept = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut dev = Device::with_random_keys();
        let pd = dev.alloc_pd().unwrap();
        farside_iwarp::tcp::Endpoint::start(
            s,
            dev,
            Cq::new(8).unwrap(),
            Qp::accept(pd, QpConfig::default()),
        )
        .unwrap()
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /small.bin HTTP/1.1\r\nHost: x\r\n\
         RDMA: client-reads, ip=127.0.0.1, port={port}, maxlen=1048576\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let field = head
        .lines()
        .find_map(|l| l.strip_prefix("RDMA: "))
        .unwrap_or_else(|| panic!("{head}"));
    let stag = match farside_rdmahttp::header::parse_response(field.as_bytes()).unwrap() {
        farside_rdmahttp::header::Response::ClientReads { stag, .. } => stag,
        other => panic!("{other:?}"),
    };
    // The HTTP connection is leaked open on purpose: the worker waits for done.
    std::mem::forget(s);
    Stalled {
        _ep: accept.join().unwrap(),
        stag,
    }
}

#[test]
fn caps_bound_transfers_and_a_stalled_read_is_released_at_its_deadline() {
    let root = Docroot::new("caps");
    let mut args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(root.0.clone()),
        workers: 4,
        ..BackendArgs::default()
    };
    args.rdma.rdma = true;
    args.rdma.transfers_max = 1;
    args.rdma.transfer_bytes_max = 1 << 20;
    args.rdma.registered_bytes_max = 1 << 20;
    args.rdma.transfer_timeout_ms = 1500;
    let (addr, _backend) = spawn(args).unwrap();
    // Beyond the transfer cap, whatever the client's maxlen.
    let got = get(
        &format!("http://{addr}/large.bin"),
        &opts(Some(Mode::ServerWrites), 4 << 20),
    )
    .unwrap();
    assert_eq!(got.via, Via::Tcp(Some(Decline::TooLarge)));
    assert!(got.body == root.file("large.bin"));
    // One transfer at once: while a read stalls, the next request goes over TCP.
    let t0 = std::time::Instant::now();
    let stalled = stall_client_reads(addr);
    let url = format!("http://{addr}/small.bin");
    let got = get(&url, &opts(Some(Mode::ServerWrites), 1 << 20)).unwrap();
    assert_eq!(got.via, Via::Tcp(Some(Decline::Busy)));
    assert!(got.body == root.file("small.bin"));
    // At its deadline the stalled region is released and RDMA is served again.
    let served = loop {
        let got = get(&url, &opts(Some(Mode::ServerWrites), 1 << 20)).unwrap();
        if got.via == Via::ServerWrites {
            break got;
        }
        assert!(t0.elapsed() < Duration::from_secs(8), "never released");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(t0.elapsed() >= Duration::from_millis(1400));
    assert!(served.body == root.file("small.bin"));
    drop(stalled);
}

#[test]
fn server_stags_carry_random_keys() {
    let root = Docroot::new("stags");
    let mut args = BackendArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        root: Some(root.0.clone()),
        workers: 8,
        ..BackendArgs::default()
    };
    args.rdma.rdma = true;
    args.rdma.transfer_timeout_ms = 1000;
    let (addr, _backend) = spawn(args).unwrap();
    let keys: std::collections::HashSet<u32> = (0..6)
        .map(|_| stall_client_reads(addr).stag & 0xff)
        .collect();
    // Six draws of an 8-bit key all equal: probability 256^-5.
    assert!(keys.len() > 1, "{keys:?}");
}

#[test]
fn every_registration_strategy_serves_the_current_file() {
    use farside_rdmahttp::registration::Registration;
    for registration in [
        Registration::Dynamic,
        Registration::Static,
        Registration::Cache,
    ] {
        let root = Docroot::new("registration");
        let mut args = BackendArgs {
            listen: "127.0.0.1:0".parse().unwrap(),
            root: Some(root.0.clone()),
            workers: 4,
            ..BackendArgs::default()
        };
        args.rdma.rdma = true;
        args.rdma.registration = registration;
        args.rdma.transfer_bytes_max = 4 << 20;
        args.rdma.registered_bytes_max = 16 << 20;
        let (addr, _backend) = spawn(args).unwrap();
        for round in 0..3 {
            for name in ["small.bin", "large.bin"] {
                for (mode, via) in [
                    (Mode::ServerWrites, Via::ServerWrites),
                    (Mode::ClientReads, Via::ClientReads),
                ] {
                    let got =
                        get(&format!("http://{addr}/{name}"), &opts(Some(mode), 4 << 20)).unwrap();
                    assert_eq!(got.via, via, "{registration:?} {name} {mode:?}");
                    assert!(
                        got.body == root.file(name),
                        "{registration:?} round {round} {name} {mode:?}: body differs"
                    );
                }
            }
            // The file changes (same size, new content and mtime): the next transfer
            // must carry the new content, cached or not.
            let path = root.0.join("small.bin");
            std::fs::write(&path, content(10_000, 10 + round)).unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(
                std::time::SystemTime::UNIX_EPOCH
                    + Duration::from_secs(1_000_000 + u64::from(round)),
            )
            .unwrap();
        }
    }
}
