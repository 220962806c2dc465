//! The sk_lookup steering program alone (needs root: netns, BPF): in a fresh network
//! namespace, SYNs for VIP:port reach the server's listener while divert is off and
//! the daemon's listener while it is on; other ports are never touched.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use farside_spec::steer::{Steering, CNT_DAEMON, CNT_SERVER};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn accepts(l: &TcpListener) -> bool {
    l.set_nonblocking(true).unwrap();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if l.accept().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
#[ignore = "needs root (netns, BPF): cargo test -p farside-spec -- --include-ignored, as root under flock /tmp/farside-root.lock"]
fn syns_go_to_the_daemon_only_while_divert_is_on() {
    assert!(is_root(), "needs root");
    let ns = Ns(format!("st{}", std::process::id() % 100_000));
    let run = |args: &[&str]| {
        let st = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    run(&["netns", "add", &ns.0]);
    run(&["-n", &ns.0, "link", "set", "lo", "up"]);
    run(&["-n", &ns.0, "addr", "add", "10.79.0.100/32", "dev", "lo"]);
    let f = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
    let th = std::thread::spawn(move || {
        // SAFETY: setns on an open netns fd; affects only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
        let server = TcpListener::bind("10.79.0.100:8080").unwrap();
        let other = TcpListener::bind("10.79.0.100:8081").unwrap();
        let daemon = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut st =
            Steering::attach(Some("10.79.0.100".parse().unwrap()), 8080, &daemon).expect("attach");
        let _c1 = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server), "divert off: the server");
        st.set_divert(true).unwrap();
        let _c2 = TcpStream::connect("10.79.0.100:8080").unwrap();
        let to_daemon = accepts(&daemon);
        let _c3 = TcpStream::connect("10.79.0.100:8081").unwrap();
        assert!(accepts(&other), "other ports untouched");
        let c = st.counters().unwrap();
        eprintln!("counters {c:?}");
        assert!(to_daemon, "divert on: the daemon");
        assert_eq!((c[CNT_SERVER], c[CNT_DAEMON]), (1, 1));
        st.set_divert(false).unwrap();
        let _c4 = TcpStream::connect("10.79.0.100:8080").unwrap();
        assert!(accepts(&server), "divert off again: the server");
    });
    th.join().expect("steering");
}
