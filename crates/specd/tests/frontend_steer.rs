//! `FrontendSteer` against the real eBPF front-end: the front-end's program and maps
//! are loaded (root: CAP_BPF; not attached to any interface, which moving a flow does
//! not need) and its control server started on 127.0.0.1:0; the steer's `MOVE` must
//! rewrite the flow's entry, reuse its connection, and report errors.
//! Run: `cargo test -p farside-specd --test frontend_steer -- --include-ignored` as root.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};

use farside_auth::mac::KeyId;
use farside_auth::siphash::SipKey;
use farside_frontend::control::{Client, Server};
use farside_frontend::fmove::MoveKey;
use farside_frontend::{BackendSpec, Frontend};
use farside_specd::steer::{FlowSteer, FrontendMove, FrontendSteer};

const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 12);
const VIP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 100), 80);
const KEY: MoveKey = MoveKey {
    id: KeyId(2),
    key: SipKey::from_halves(0x0123_4567_0000_0001, 0x89ab_cdef_0000_0002),
};

fn frontend() -> Frontend {
    let backends = [
        BackendSpec {
            mac: [2, 0, 0, 0, 0xaa, 1],
            ip: A_IP,
            weight: 1,
        },
        BackendSpec {
            mac: [2, 0, 0, 0, 0xbb, 1],
            ip: B_IP,
            weight: 1,
        },
    ];
    Frontend::load(VIP, &backends, [2, 0, 0, 0, 0xfe, 1], 1).expect("load the front-end (root?)")
}

#[test]
#[ignore = "needs root"]
fn moves_flows_through_the_front_ends_control_port() {
    let server = Server::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(Mutex::new(frontend())),
        KEY,
    )
    .expect("control server");
    // Without the key the front-end refuses the MOVE.
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
    let keyless = FrontendSteer::new(server.local_addr(), FrontendMove::Tcp);
    assert!(keyless
        .move_flow(SocketAddr::V4(client), IpAddr::V4(B_IP))
        .is_err());
    let steer = FrontendSteer::new(server.local_addr(), FrontendMove::Tcp).with_key(KEY);
    let mut check = Client::connect(server.local_addr()).unwrap().with_key(KEY);
    for port in [40_000u16, 40_001, 40_002] {
        let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), port);
        assert_eq!(
            check.flow(client).unwrap(),
            None,
            "no entry before the move"
        );
        steer
            .move_flow(SocketAddr::V4(client), IpAddr::V4(B_IP))
            .unwrap();
        assert_eq!(check.flow(client).unwrap(), Some((B_IP, false)));
        steer
            .move_flow(SocketAddr::V4(client), IpAddr::V4(A_IP))
            .unwrap();
        assert_eq!(check.flow(client).unwrap(), Some((A_IP, false)));
    }
    // A back-end the front-end does not know is an error, and the entry stays.
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
    let unknown = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 99));
    assert!(steer.move_flow(SocketAddr::V4(client), unknown).is_err());
    assert_eq!(check.flow(client).unwrap(), Some((A_IP, false)));
    // IPv6 is refused before any request.
    let v6: SocketAddr = "[::1]:40000".parse().unwrap();
    assert!(steer.move_flow(v6, IpAddr::V4(B_IP)).is_err());
}

#[test]
fn a_dead_front_end_is_an_error() {
    // A port nothing listens on (bound, then closed).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let client: SocketAddr = "10.0.9.1:40000".parse().unwrap();
    for via in [FrontendMove::Tcp, FrontendMove::Udp] {
        let steer = FrontendSteer::new(addr, via);
        assert!(
            steer.move_flow(client, IpAddr::V4(B_IP)).is_err(),
            "{via:?}"
        );
    }
}

/// `FrontendSteer`'s default, the one-sided MOVE, against the real program attached
/// to `lo` of a network namespace of this thread's own (its tc ingress sees the
/// request, the reply it sends out of `lo` comes back in to the steer's socket): the
/// sender is 127.0.0.1, configured as back-end A.
#[test]
#[ignore = "needs root"]
fn moves_flows_one_sidedly_through_the_front_ends_tc_program() {
    std::thread::spawn(|| {
        // SAFETY: a new network namespace for this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        let st = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(st.success());
        let lo = Ipv4Addr::LOCALHOST;
        let c_ip = Ipv4Addr::new(10, 0, 0, 13);
        let backends = [(lo, 1), (B_IP, 2), (c_ip, 3)].map(|(ip, n)| BackendSpec {
            mac: [2, 0, 0, 0, 0xaa, n],
            ip,
            weight: 1,
        });
        let mut fe = Frontend::attach("lo", VIP, &backends).expect("attach to lo");
        fe.set_move_udp(lo, 7400).unwrap();
        let steer = FrontendSteer::new(SocketAddr::new(lo.into(), 7400), FrontendMove::Udp);
        let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
        let c = SocketAddr::V4(client);
        fe.move_flow(client, lo).unwrap(); // the flow's entry names A (127.0.0.1)
        steer.move_flow(c, IpAddr::V4(B_IP)).expect("MOVED");
        assert_eq!(fe.flow(client).unwrap(), Some((B_IP, false)));
        steer.move_flow(c, IpAddr::V4(B_IP)).expect("ALREADY is Ok");
        // The entry names a third back-end: NOT_OWNER is an error, nothing changes.
        fe.move_flow(client, c_ip).unwrap();
        let e = steer.move_flow(c, IpAddr::V4(B_IP)).unwrap_err();
        assert!(e.to_string().contains("NOT_OWNER"), "{e}");
        assert_eq!(fe.flow(client).unwrap(), Some((c_ip, false)));
        // No entry: NOT_FOUND, and none is created.
        let stranger = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 1);
        let e = steer
            .move_flow(SocketAddr::V4(stranger), IpAddr::V4(B_IP))
            .unwrap_err();
        assert!(e.to_string().contains("NOT_FOUND"), "{e}");
        assert_eq!(fe.flow(stranger).unwrap(), None);
        let s = fe.stats().unwrap();
        assert_eq!(
            [
                s.counters["moved"],
                s.counters["move_already"],
                s.counters["move_not_owner"],
                s.counters["move_not_found"],
            ],
            [1, 1, 1, 1]
        );
    })
    .join()
    .unwrap();
}

/// With `--frontend-key-file`, specd seals its one-sided MOVEs under the front-end's
/// key: a keyed front-end answers them, and refuses (no reply) a steer without the key.
#[test]
#[ignore = "needs root"]
fn a_keyed_front_end_takes_sealed_moves_only() {
    std::thread::spawn(|| {
        // SAFETY: a new network namespace for this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        let st = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(st.success());
        let lo = Ipv4Addr::LOCALHOST;
        let backends = [(lo, 1), (B_IP, 2)].map(|(ip, n)| BackendSpec {
            mac: [2, 0, 0, 0, 0xaa, n],
            ip,
            weight: 1,
        });
        let mut fe = Frontend::attach("lo", VIP, &backends).expect("attach to lo");
        fe.set_move_udp(lo, 7400).unwrap();
        let key = farside_auth::siphash::SipKey::from_bytes(*b"specd-move-test!");
        let id = farside_auth::mac::KeyId(7);
        fe.add_move_key(id, key).unwrap();
        let to = SocketAddr::new(lo.into(), 7400);
        let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40_000);
        let c = SocketAddr::V4(client);
        fe.move_flow(client, lo).unwrap(); // the flow's entry names A (127.0.0.1)
        let unsealed = FrontendSteer::new(to, FrontendMove::Udp);
        assert!(unsealed.move_flow(c, IpAddr::V4(B_IP)).is_err());
        assert_eq!(
            fe.flow(client).unwrap(),
            Some((lo, false)),
            "unsealed: no move"
        );
        let sealed = FrontendSteer::new(to, FrontendMove::Udp)
            .with_key(farside_frontend::fmove::MoveKey { id, key });
        sealed.move_flow(c, IpAddr::V4(B_IP)).expect("MOVED");
        assert_eq!(fe.flow(client).unwrap(), Some((B_IP, false)));
    })
    .join()
    .unwrap();
}
