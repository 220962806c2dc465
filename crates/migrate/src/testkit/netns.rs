//! Three network namespaces for a real move, deleted on drop: client `c`, source
//! back-end `a`, target back-end `b`. The VIP is on both back-ends' loopback; the
//! client reaches it through veth `c-a` (its main table) until a connection's flow
//! is moved to veth `c-b` (the front-end's flow entry: a route replaced in the main
//! table, or a per-flow policy rule into [`NetnsSpec::table_b`]); `a` and `b` talk
//! over their own veth (the cluster network).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;

/// Addresses and names of a [`Netns`].
#[derive(Clone, Debug)]
pub struct NetnsSpec {
    /// Prefix of the namespace and link names (≤ 11 characters so that link names
    /// stay within IFNAMSIZ; never the lab's `fs…`); add the pid to keep runs apart.
    pub tag: String,
    /// The service address, on both back-ends' loopback.
    pub vip: Ipv4Addr,
    /// The client's address (on its loopback).
    pub client_ip: Ipv4Addr,
    /// Back-end `a`'s address on the cluster network (/24).
    pub a_ip: Ipv4Addr,
    /// Back-end `b`'s address on the cluster network (/24).
    pub b_ip: Ipv4Addr,
    /// A routing table in `c` that sends the VIP to `b` (for per-flow rules).
    pub table_b: Option<u32>,
}

/// The namespaces' names, cloneable for threads; the owning [`Netns`] stays with the
/// caller so its `Drop` runs even when a thread panics and never finishes.
#[derive(Clone, Debug)]
pub struct NsRef {
    /// See [`NetnsSpec::tag`].
    pub tag: String,
}

impl NsRef {
    /// The full name of namespace `which` (`c`, `a` or `b`).
    pub fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.tag)
    }

    /// `ip -n <ns> <args>`; panics on failure (test code).
    pub fn ip(&self, which: &str, args: &str) {
        self.try_ip(which, args)
            .unwrap_or_else(|e| panic!("ip -n {} {args}: {e}", self.ns(which)));
    }

    /// `ip -n <ns> <args>`, its failure as an error.
    pub fn try_ip(&self, which: &str, args: &str) -> io::Result<()> {
        let out = Command::new("ip")
            .args(["-n", &self.ns(which)])
            .args(args.split_whitespace())
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// Moves the calling thread into namespace `which` (sockets it creates live
    /// there; threads it spawns afterwards start there).
    pub fn enter(&self, which: &str) -> io::Result<()> {
        let f = std::fs::File::open(format!("/run/netns/{}", self.ns(which)))?;
        // SAFETY: setns on an open netns fd; affects only this thread.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The veth in `c` that leads to back-end `which` (`a` or `b`).
    pub fn client_link(&self, which: &str) -> String {
        format!("{}c{which}", self.tag)
    }
}

/// The namespaces, deleted on drop.
pub struct Netns {
    /// Their names.
    pub r: NsRef,
    /// How they were built.
    pub spec: NetnsSpec,
}

const NAMESPACES: [&str; 3] = ["c", "a", "b"];

impl Netns {
    /// Builds the namespaces; on error, what was built is deleted.
    pub fn setup(spec: NetnsSpec) -> io::Result<Netns> {
        let guard = Netns {
            r: NsRef {
                tag: spec.tag.clone(),
            },
            spec: spec.clone(),
        };
        let n = &guard.r;
        let t = &n.tag;
        for w in NAMESPACES {
            run(&format!("netns add {}", n.ns(w)))?;
        }
        run(&format!(
            "link add {t}ca netns {t}c type veth peer name {t}ac netns {t}a"
        ))?;
        run(&format!(
            "link add {t}cb netns {t}c type veth peer name {t}bc netns {t}b"
        ))?;
        run(&format!(
            "link add {t}ab netns {t}a type veth peer name {t}ba netns {t}b"
        ))?;
        let (vip, client) = (spec.vip, spec.client_ip);
        n.try_ip("c", "link set lo up")?;
        n.try_ip("c", &format!("addr add {client}/32 dev lo"))?;
        n.try_ip("c", &format!("link set {t}ca up"))?;
        n.try_ip("c", &format!("link set {t}cb up"))?;
        n.try_ip("c", &format!("route add {vip}/32 dev {t}ca src {client}"))?;
        if let Some(table) = spec.table_b {
            n.try_ip(
                "c",
                &format!("route add {vip}/32 dev {t}cb src {client} table {table}"),
            )?;
        }
        for (w, to_client, cluster, ip) in
            [("a", "ac", "ab", spec.a_ip), ("b", "bc", "ba", spec.b_ip)]
        {
            n.try_ip(w, "link set lo up")?;
            n.try_ip(w, &format!("addr add {vip}/32 dev lo"))?;
            n.try_ip(w, &format!("link set {t}{to_client} up"))?;
            n.try_ip(w, &format!("route add {client}/32 dev {t}{to_client}"))?;
            n.try_ip(w, &format!("addr add {ip}/24 dev {t}{cluster}"))?;
            n.try_ip(w, &format!("link set {t}{cluster} up"))?;
        }
        Ok(guard)
    }

    /// The VIP with `port`.
    pub fn vip(&self, port: u16) -> SocketAddr {
        SocketAddr::from((self.spec.vip, port))
    }
}

fn run(args: &str) -> io::Result<()> {
    let out = Command::new("ip").args(args.split_whitespace()).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for w in NAMESPACES {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.r.ns(w)])
                .output();
        }
    }
}
