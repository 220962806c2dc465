//! Network namespaces for the live tests: one LAN (a bridge in its own namespace)
//! joining a client namespace, the front-end's and two back-ends', as an L2-DSR
//! deployment: the VIP on both back-ends' loopback (arp_ignore=1, arp_announce=2),
//! the client routing the VIP to the front-end. Deleted on drop.
#![allow(dead_code)]

/// The migration session (`GET /big`, a large POST, `GET /small`), from the kit.
pub use farside_migrate::testkit::session;

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::process::Command;

use farside_frontend::BackendSpec;

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
pub const FE_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const A_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 11);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 12);
pub const A_MAC: [u8; 6] = [0x02, 0x78, 0, 0, 0, 0x11];
pub const B_MAC: [u8; 6] = [0x02, 0x78, 0, 0, 0, 0x12];
pub const VIP_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 1, 100);
pub const VIP: SocketAddrV4 = SocketAddrV4::new(VIP_IP, 8080);
/// The front-end's interface name inside its namespace.
pub const FE_IF: &str = "lan0";

/// Skip-free root check: these tests are `#[ignore]`d and run only as root.
pub fn need_root() {
    assert!(farside_frontend::is_root(), "needs root");
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The namespaces' names, cloneable for threads (the owning [`Lan`] stays with the
/// test function so its `Drop` runs even when a thread panics).
#[derive(Clone)]
pub struct NsRef {
    tag: String,
}

impl NsRef {
    pub fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    /// `ip netns exec <ns> <args...>`.
    pub fn exec(&self, which: &str, args: &str) {
        let ns = self.ns(which);
        let mut v = vec!["ip", "netns", "exec", &ns];
        v.extend(args.split_whitespace());
        sh(&v);
    }

    /// Moves the calling thread into namespace `which` (its new sockets live there;
    /// threads it spawns afterwards start there).
    pub fn enter(&self, which: &str) {
        let f = std::fs::File::open(format!("/run/netns/{}", self.ns(which))).expect("netns");
        // SAFETY: setns on an open netns fd; affects only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
    }
}

/// Client `c`, front-end `f`, back-ends `a` and `b`, the bridge in `l`.
pub struct Lan {
    pub r: NsRef,
}

const NAMESPACES: [&str; 5] = ["l", "c", "f", "a", "b"];

impl Lan {
    /// `which` keeps two tests of one process apart ("fe" + pid + which: not the
    /// lab's `fs…` names).
    pub fn setup(which: char) -> Lan {
        let lan = Lan {
            r: NsRef {
                tag: format!("fe{}{which}", std::process::id() % 100_000),
            },
        };
        let n = &lan.r;
        let t = n.tag.clone();
        for w in NAMESPACES {
            sh(&["ip", "netns", "add", &n.ns(w)]);
        }
        let l = n.ns("l");
        sh(&["ip", "-n", &l, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &l, "link", "set", "br0", "up"]);
        for (w, ifname, ip, mac) in [
            ("c", "eth0", CLIENT_IP, None),
            ("f", FE_IF, FE_IP, None),
            ("a", "eth0", A_IP, Some(A_MAC)),
            ("b", "eth0", B_IP, Some(B_MAC)),
        ] {
            let port = format!("{t}p{w}");
            let ns = n.ns(w);
            sh(&[
                "ip", "-n", &l, "link", "add", &port, "type", "veth", "peer", "name", ifname,
                "netns", &ns,
            ]);
            sh(&["ip", "-n", &l, "link", "set", &port, "master", "br0"]);
            sh(&["ip", "-n", &l, "link", "set", &port, "up"]);
            if let Some(mac) = mac {
                sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "link",
                    "set",
                    ifname,
                    "address",
                    &farside_frontend::format_mac(&mac),
                ]);
            }
            sh(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                ifname,
            ]);
            sh(&["ip", "-n", &ns, "link", "set", ifname, "up"]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        // Clients send the VIP to the front-end.
        sh(&[
            "ip",
            "-n",
            &n.ns("c"),
            "route",
            "add",
            &format!("{VIP_IP}/32"),
            "via",
            &FE_IP.to_string(),
        ]);
        // The VIP on each back-end's loopback, never answered for in ARP.
        for w in ["a", "b"] {
            sh(&[
                "ip",
                "-n",
                &n.ns(w),
                "addr",
                "add",
                &format!("{VIP_IP}/32"),
                "dev",
                "lo",
            ]);
            n.exec(w, "sysctl -qw net.ipv4.conf.all.arp_ignore=1");
            n.exec(w, "sysctl -qw net.ipv4.conf.all.arp_announce=2");
        }
        lan
    }

    /// The two back-ends with weights `wa`, `wb`.
    pub fn backends(wa: u32, wb: u32) -> [BackendSpec; 2] {
        [
            BackendSpec {
                mac: A_MAC,
                ip: A_IP,
                weight: wa,
            },
            BackendSpec {
                mac: B_MAC,
                ip: B_IP,
                weight: wb,
            },
        ]
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for w in NAMESPACES {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.r.ns(w)])
                .status();
        }
    }
}
