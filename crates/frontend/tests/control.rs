//! The control port's trust bounds (root: it serves a loaded program): a Unix socket
//! only its owner can open, a TCP port that acts only on sealed, fresh requests, and
//! idle connections that cannot keep a caller out.
//! Run: `cargo test -p farside-frontend -- --include-ignored` as root.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use farside_auth::mac::KeyId;
use farside_auth::siphash::SipKey;
use farside_frontend::control::{self, Client, ControlAddr, Server};
use farside_frontend::control_auth;
use farside_frontend::fmove::MoveKey;
use farside_frontend::{BackendSpec, Frontend};

const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 100), 80);
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const KEY: MoveKey = MoveKey {
    id: KeyId(4),
    key: SipKey::from_halves(0x5a17_c0de_0000_0001, 0x0bad_f00d_1234_5678),
};

fn frontend() -> Arc<Mutex<Frontend>> {
    assert!(farside_frontend::is_root(), "needs root");
    let b = BackendSpec {
        mac: [2, 0, 0, 0, 0xaa, 1],
        ip: A_IP,
        weight: 1,
    };
    Arc::new(Mutex::new(
        Frontend::load(VIP, &[b], [2, 0, 0, 0, 0xfe, 1], 1).expect("load (root?)"),
    ))
}

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("fe-ctl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn control_addresses_parse() {
    assert_eq!(
        "unix:/run/farside/frontend.sock".parse::<ControlAddr>(),
        Ok(ControlAddr::Unix(control::UNIX_SOCKET_DEFAULT.into()))
    );
    assert_eq!(
        "10.0.0.1:7400".parse::<ControlAddr>(),
        Ok(ControlAddr::Tcp("10.0.0.1:7400".parse().unwrap()))
    );
    assert!("unix:relative.sock"
        .parse::<ControlAddr>()
        .unwrap_err()
        .contains("absolute"));
    assert!("nonsense"
        .parse::<ControlAddr>()
        .unwrap_err()
        .contains("unix:/"));
    let u: ControlAddr = "unix:/x/y.sock".parse().unwrap();
    assert_eq!(u.to_string(), "unix:/x/y.sock");
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn the_unix_control_socket_is_private_serves_requests_and_is_removed() {
    let fe = frontend();
    let dir = TempDir::new("unix");
    let path = dir.0.join("run/frontend.sock");
    let addr = ControlAddr::Unix(path.clone());
    let server = Server::start_at(&addr, fe.clone(), None).unwrap();
    assert_eq!(server.addr(), &addr);
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket 0600");
    let dir_mode = std::fs::metadata(path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700, "created directory 0700");
    let mut c = Client::connect_to(&addr).unwrap();
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
    c.move_flow(client, A_IP).unwrap();
    assert_eq!(c.flow(client).unwrap(), Some((A_IP, false)));
    c.hold_for(client, Duration::from_millis(20_000)).unwrap();
    assert_eq!(c.flow(client).unwrap(), Some((A_IP, true)));
    let e = c.request(&format!("HOLD {client} 3600000")).unwrap_err();
    assert!(e.to_string().contains("hold of"), "{e}");
    c.release(client).unwrap();
    // A second server on a live socket is refused; a stale one is replaced.
    assert!(Server::start_at(&addr, fe.clone(), None).is_err());
    drop(c);
    drop(server);
    assert!(!path.exists(), "socket removed at stop");
    let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(stale); // the file stays, nothing accepts on it
    assert!(path.exists());
    let server = Server::start_at(&addr, fe, None).unwrap();
    Client::connect_to(&addr).unwrap().stats().unwrap();
    drop(server);
}

/// Reads one reply line from a raw control connection.
fn reply(s: &TcpStream) -> String {
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn idle_connections_cannot_keep_a_caller_out() {
    let fe = frontend();
    let server = Server::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), fe, KEY).unwrap();
    let addr = server.local_addr();
    // Every place taken by connections that said nothing (or one byte, no line).
    let idle: Vec<TcpStream> = (0..control::CONNS_MAX)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            if i % 2 == 1 {
                s.write_all(b"S").unwrap();
            }
            s
        })
        .collect();
    // Taken just now: a newcomer is told busy (nobody idle EVICT_IDLE_MIN yet).
    std::thread::sleep(Duration::from_millis(100));
    let busy = TcpStream::connect(addr).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(reply(&busy), "ERR busy\n");
    // Once they are idle EVICT_IDLE_MIN, a caller gets a place (the idlest is closed).
    std::thread::sleep(control::EVICT_IDLE_MIN);
    let callers: Vec<Client> = (0..3)
        .map(|_| {
            let mut c = Client::connect(addr).unwrap().with_key(KEY);
            assert_eq!(c.stats().unwrap().flows, 0);
            c
        })
        .collect();
    let closed = idle
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut b = [0u8; 1];
            matches!(std::io::Read::read(&mut &**s, &mut b), Ok(0))
        })
        .count();
    assert_eq!(closed, 3, "one idle connection closed per caller");
    drop(callers);
    // The idle bound closes what is left.
    assert!(control::IDLE_TIMEOUT <= Duration::from_secs(10));
    drop(server);
}

#[test]
#[ignore = "needs root (BPF): cargo test -p farside-frontend -- --include-ignored"]
fn a_tcp_control_port_acts_only_on_sealed_fresh_requests() {
    let fe = frontend();
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let e = Server::start_at(&ControlAddr::Tcp(any), fe.clone(), None)
        .err()
        .expect("a TCP control port without a key is refused");
    assert!(e.to_string().contains("--key-file"), "{e}");
    let server = Server::start(any, fe, KEY).unwrap();
    let addr = server.local_addr();
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 40_001);
    let send = |line: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        let r = reply(&s);
        // Refused: the connection is closed after the one ERR line.
        let mut b = [0u8; 1];
        let closed = matches!(std::io::Read::read(&mut &s, &mut b), Ok(0));
        (r, closed)
    };
    // A plain request (what anyone who reaches the port could send).
    let (r, closed) = send(&format!("MOVE {client} {A_IP}"));
    assert!(r.starts_with("ERR not an AUTH line"), "{r}");
    assert!(closed);
    // Sealed under another key.
    let other = MoveKey {
        id: KEY.id,
        key: SipKey::from_halves(1, 2),
    };
    let (r, _) = send(&control_auth::seal_request(
        &other,
        9,
        1 << 40,
        &format!("HOLD {client}"),
    ));
    assert!(r.starts_with("ERR not authentic"), "{r}");
    // A genuine request works once; the same line again (a capture replayed) does not.
    let seq = farside_frontend::fmove::next_envelope_seq();
    let line = control_auth::seal_request(&KEY, 9, seq, &format!("MOVE {client} {A_IP}"));
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let r = reply(&s);
    assert_eq!(
        control_auth::open_reply(&KEY, 9, seq, r.trim_end()).unwrap(),
        "OK"
    );
    let (r, closed) = send(&line);
    assert!(r.starts_with("ERR replayed"), "{r}");
    assert!(closed);
    // The client seals by itself, and the flow moved exactly once.
    let mut c = Client::connect(addr).unwrap().with_key(KEY);
    assert_eq!(c.flow(client).unwrap(), Some((A_IP, false)));
    // A client without the key is refused with the reason.
    let e = Client::connect(addr).unwrap().stats().unwrap_err();
    assert!(e.to_string().contains("not an AUTH line"), "{e}");
    drop(server);
}
