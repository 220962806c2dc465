//! A whole gatherd over udp, in user space and (root) with XDP: a request recorded
//! before a restart is refused after it (`--replay-state`), and keys are revoked and
//! added on SIGHUP without a restart (`--rmem-key-dir`).

use super::*;
use crate::testutil::in_private_netns;
use crate::{Gatherd, XdpChoice};
use farside_rmem::wire::{self, ReqHeader, Status};
use farside_rmem::{ClientKey, LabKeyset};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::time::Instant;

/// How long a test waits for a condition before failing (a busy 2-CPU host).
const WAIT: Duration = Duration::from_secs(20);

struct Setup {
    dir: PathBuf,
    keys: LabKeyset,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let dir = std::env::temp_dir().join(format!(
            "farside-gatherd-trust-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("keys")).unwrap();
        let keys = LabKeyset::generate();
        farside_rmem::auth::write_key_file(&dir.join("keys"), "reader-1.key", keys.reader.key())
            .unwrap();
        farside_rmem::auth::write_key_file(
            &dir.join("keys"),
            "balancer-2.key",
            keys.balancer.key(),
        )
        .unwrap();
        Setup { dir, keys }
    }

    fn args(&self, udp: SocketAddr, xdp: bool) -> GatherdArgs {
        GatherdArgs {
            no_shm: true,
            udp_listen: Some(udp),
            rmem_key_dir: Some(self.dir.join("keys")),
            replay_state: Some(self.dir.join("state/replay.state")),
            xdp_iface: xdp.then(|| "lo".into()),
            xdp_mode: if xdp {
                XdpChoice::Generic
            } else {
                XdpChoice::Off
            },
            ..Default::default()
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A FETCH-ADD of 1 on the first counter word, sealed by `sender` with `seq`.
fn fadd(key: &ClientKey, sender: u64, seq: u64) -> Vec<u8> {
    let mut covered = Vec::new();
    wire::encode_request(
        &mut covered,
        &ReqHeader {
            op: 4,
            flags: 0,
            seq,
            region: 0,
            offset: (farside_region::layout::W_COUNTER_BASE * 8) as u32,
            len: 8,
        },
        &1u64.to_le_bytes(),
    );
    let mut b = Vec::new();
    farside_rmem::auth::seal_request(&mut b, key, sender, seq, &covered);
    b
}

/// Send `req` to `to`; the FETCH-ADD's old value if answered within `wait`.
fn ask(
    sock: &UdpSocket,
    to: SocketAddr,
    key: &ClientKey,
    req: &[u8],
    wait: Duration,
) -> Option<u64> {
    sock.set_read_timeout(Some(wait)).unwrap();
    sock.send_to(req, to).unwrap();
    let mut buf = [0u8; 256];
    let seq = u64::from_le_bytes(req[24..32].try_into().unwrap());
    let sender = u64::from_le_bytes(req[16..24].try_into().unwrap());
    loop {
        let n = sock.recv(&mut buf).ok()?;
        let Ok(body) = farside_rmem::auth::open_reply(&buf[..n], key, sender, seq..=seq) else {
            continue;
        };
        let h = wire::RepHeader::decode(body).unwrap();
        assert_eq!(h.status, Status::Ok);
        let p = &body[wire::REP_HEADER_BYTES..];
        return Some(u64::from_le_bytes(p[..8].try_into().unwrap()));
    }
}

/// Fresh requests from `make` (a new sequence each, as a client's retries), one every
/// 200 ms until one is answered: its FETCH-ADD's old value. A datagram may be lost on
/// a busy host; a retry with the same envelope would be a copy.
fn answered(
    sock: &UdpSocket,
    to: SocketAddr,
    key: &ClientKey,
    mut make: impl FnMut() -> Vec<u8>,
) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(old) = ask(sock, to, key, &make(), Duration::from_millis(200)) {
            return old;
        }
        assert!(Instant::now() < deadline, "never answered");
    }
}

/// Requests refused with `st` so far, by user space and the XDP program.
fn refused(g: &Gatherd, st: Status) -> u64 {
    let user = g.counters.status[st as usize].load(Ordering::Relaxed);
    let kernel = g.xdp.as_ref().map_or(0, |x| x.counters().1[st as usize]);
    user + kernel
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A FETCH-ADD answered, recorded, gatherd restarted with the same replay state: the
/// recorded request is refused (counted Replayed, memory untouched), and the sender's
/// new requests are answered once the restarted gatherd's ceiling passes the floor.
fn a_recorded_request_is_refused_after_a_restart(xdp: bool, udp: SocketAddr) {
    let s = Setup::new(if xdp { "restart-xdp" } else { "restart-user" });
    let bal = s.keys.balancer;
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut seq = Sequencer::new();
    let g = Gatherd::start(&s.args(udp, xdp)).unwrap();
    assert_eq!(g.udp_server, if xdp { "xdp-generic" } else { "user-space" });
    let to = g.udp_addr.unwrap();
    // The last request answered is the one recorded.
    let mut recorded = Vec::new();
    answered(&sock, to, &bal, || {
        recorded = fadd(&bal, 0x51, seq.next(Sequencer::unix_s()).unwrap());
        recorded.clone()
    });
    drop(g);
    let g = Gatherd::start(&s.args(udp, xdp)).unwrap();
    let to = g.udp_addr.unwrap();
    let before = refused(&g, Status::Replayed);
    // Sent again until counted (a datagram may be lost; each copy is refused).
    wait_for("the replay refused", || {
        sock.send_to(&recorded, to).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        refused(&g, Status::Replayed) > before
    });
    // New requests: refused until the ceiling passes the floor (the lease), then
    // answered; the counter shows the replay never applied.
    let old = answered(&sock, to, &bal, || {
        fadd(&bal, 0x51, seq.next(Sequencer::unix_s()).unwrap())
    });
    assert_eq!(
        old, 0,
        "the recorded FETCH-ADD was applied again after the restart"
    );
}

/// Keys changed while gatherd runs: a new key file added and the old one removed, then
/// SIGHUP: the old key's requests are refused, the new key's answered, no restart.
fn keys_are_revoked_and_added_on_sighup(xdp: bool, udp: SocketAddr) {
    let s = Setup::new(if xdp { "hup-xdp" } else { "hup-user" });
    let old = s.keys.balancer;
    let new = ClientKey::new(
        farside_auth::mac::KeyId(5),
        *LabKeyset::generate().balancer.key(),
    );
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut seq = Sequencer::new();
    let mut next = || seq.next(Sequencer::unix_s()).unwrap();
    let g = Gatherd::start(&s.args(udp, xdp)).unwrap();
    let to = g.udp_addr.unwrap();
    answered(&sock, to, &old, || fadd(&old, 0x61, next()));
    let bad_key = refused(&g, Status::BadKey);
    // Fresh requests under the key not installed yet until one is counted (a datagram
    // may be lost): none answered.
    wait_for("the unknown key counted", || {
        let r = fadd(&new, 0x62, next());
        assert!(ask(&sock, to, &new, &r, Duration::from_millis(50)).is_none());
        refused(&g, Status::BadKey) > bad_key
    });
    farside_rmem::auth::write_key_file(&s.dir.join("keys"), "balancer-5.key", new.key()).unwrap();
    std::fs::remove_file(s.dir.join("keys/balancer-2.key")).unwrap();
    let reloads = g.trust.stats.reloads.load(Ordering::Relaxed);
    // SAFETY: raising a signal whose handler gatherd installed (it counts).
    assert_eq!(unsafe { libc::raise(libc::SIGHUP) }, 0);
    wait_for("the reload", || {
        g.trust.stats.reloads.load(Ordering::Relaxed) > reloads
    });
    answered(&sock, to, &new, || fadd(&new, 0x62, next()));
    let bad_key = refused(&g, Status::BadKey);
    wait_for("the revoked key refused", || {
        let r = fadd(&old, 0x61, next());
        assert!(ask(&sock, to, &old, &r, Duration::from_millis(50)).is_none());
        refused(&g, Status::BadKey) > bad_key
    });
    // A reload that cannot read a key file keeps the keys it has.
    let bad = s.dir.join("keys/balancer-6.key");
    std::fs::write(&bad, "00112233445566778899aabbccddeeff\n").unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let failures = g.trust.stats.reload_failures.load(Ordering::Relaxed);
    g.reload_keys();
    assert_eq!(
        g.trust.stats.reload_failures.load(Ordering::Relaxed),
        failures + 1
    );
    answered(&sock, to, &new, || fadd(&new, 0x62, next()));
}

#[test]
fn user_space_refuses_a_recorded_request_after_a_restart() {
    a_recorded_request_is_refused_after_a_restart(false, "127.0.0.1:0".parse().unwrap());
}

#[test]
fn user_space_keys_are_revoked_and_added_on_sighup() {
    keys_are_revoked_and_added_on_sighup(false, "127.0.0.1:0".parse().unwrap());
}

#[test]
fn xdp_refuses_a_recorded_request_after_a_restart() {
    if farside_testkit::root_or_skip("xdp_refuses_a_recorded_request_after_a_restart") {
        in_private_netns(|| {
            a_recorded_request_is_refused_after_a_restart(true, "127.0.0.1:17093".parse().unwrap())
        });
    }
}

#[test]
fn xdp_keys_are_revoked_and_added_on_sighup() {
    if farside_testkit::root_or_skip("xdp_keys_are_revoked_and_added_on_sighup") {
        in_private_netns(|| {
            keys_are_revoked_and_added_on_sighup(true, "127.0.0.1:17094".parse().unwrap())
        });
    }
}
