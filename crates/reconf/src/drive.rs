//! Binding a [`Balancer`] to real remote memory: one synchronous round over
//! `farside_rmem::RemoteMemory` connections (shm, tcp, udp/XDP), the building block of
//! the proxy's reconfiguration driver (`docs/reconf.md`, "Next").
//!
//! Every op is issued in turn and completed by its reply; an error or timeout completes
//! it as [`Completion::Lost`] (its outcome unknown, which the balancer resolves). A
//! round issues 2 reads per node and then a handful of lock / move ops, so running them
//! one after another costs `2 × nodes` round trips per S, plus one READ of this
//! balancer's own shared counter per completion (a local load when its own region is
//! reached over shm, as it would be in the proxy that hosts it).

use crate::balancer::{Balancer, Ctx};
use crate::op::{Completion, Issue, Op, Target};
use crate::words::W_SHARED_COUNTER;
use farside_rmem::RemoteMemory;
use std::collections::VecDeque;

/// Most ops one round may issue before it is cut off: 2 reads per node for the
/// largest topology the lock word can name, plus the lock and move ops.
const ROUND_OPS_MAX: usize = 2 * crate::words::NODE_MAX + 64;

/// Remote memory of every node and every balancer (this one's own region included).
pub struct RmemRegions {
    /// Per node (index = node id); `None` where unreachable (its ops are lost).
    pub nodes: Vec<Option<Box<dyn RemoteMemory>>>,
    /// Per balancer (index = balancer id); `None` where unreachable (its ops are lost).
    pub balancers: Vec<Option<Box<dyn RemoteMemory>>>,
}

impl RmemRegions {
    fn mem(&mut self, t: Target) -> Option<&mut Box<dyn RemoteMemory>> {
        match t {
            Target::Node(n) => self.nodes.get_mut(n as usize)?.as_mut(),
            Target::Balancer(b) => self.balancers.get_mut(b as usize)?.as_mut(),
        }
    }

    /// Issue `op` and wait for its reply; `Lost` on any error. After an error the
    /// connection is dropped (a tcp stream may be out of step after a timeout) unless it
    /// is shm; the caller reconnects empty slots.
    pub fn exec(&mut self, op: &Op) -> Completion {
        let c = self.exec_once(op);
        if c == Completion::Lost {
            let slot = match op.target() {
                Target::Node(n) => self.nodes.get_mut(n as usize),
                Target::Balancer(b) => self.balancers.get_mut(b as usize),
            };
            if let Some(slot) = slot {
                if slot.as_ref().is_some_and(|m| m.transport() != "shm") {
                    *slot = None;
                }
            }
        }
        c
    }

    fn exec_once(&mut self, op: &Op) -> Completion {
        let Some(m) = self.mem(op.target()) else {
            return Completion::Lost;
        };
        let r = match *op {
            Op::Read { word, len, .. } => {
                let mut buf = vec![0u8; len * 8];
                m.read(word * 8, &mut buf).map(|()| {
                    Completion::Read(
                        buf.chunks_exact(8)
                            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                            .collect(),
                    )
                })
            }
            Op::Write { word, value, .. } => m
                .write(word * 8, &value.to_le_bytes())
                .map(|()| Completion::Written),
            Op::Cas {
                word, expect, new, ..
            } => m.compare_swap(word * 8, expect, new).map(Completion::Cas),
            Op::Fadd { word, delta, .. } => m.fetch_add(word * 8, delta).map(Completion::Fadd),
        };
        r.unwrap_or(Completion::Lost)
    }

    /// This balancer's shared update counter (0 if its region cannot be read).
    pub fn shared_counter(&mut self, me: u32) -> u64 {
        match self.exec(&Op::Read {
            target: Target::Balancer(me),
            word: W_SHARED_COUNTER,
            len: 1,
        }) {
            Completion::Read(w) => w[0],
            _ => 0,
        }
    }
}

/// One round of `b`: tick, then issue every op and feed its completion until the
/// balancer asks for nothing more. `now_ns` is this host's monotonic clock. Returns the
/// ops issued.
pub fn run_round(b: &mut Balancer, regions: &mut RmemRegions, now_ns: &dyn Fn() -> u64) -> usize {
    let me = b.id();
    let ctx = |r: &mut RmemRegions| Ctx {
        now_ns: now_ns(),
        shared_counter: r.shared_counter(me),
    };
    let mut out = Vec::new();
    b.on_tick(ctx(regions), &mut out);
    let mut q: VecDeque<Issue> = out.drain(..).collect();
    let mut issued = 0;
    while let Some(i) = q.pop_front() {
        if issued == ROUND_OPS_MAX {
            log::error!("reconf: round cut off after {ROUND_OPS_MAX} ops");
            break;
        }
        issued += 1;
        let c = regions.exec(&i.op);
        b.on_completion(ctx(regions), i.id, c, &mut out);
        q.extend(out.drain(..));
    }
    issued
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::{BalancerConfig, Topology};
    use crate::words::{Lock, Role, W_ROLE_SERVED, W_ROLE_WANTED, W_SITE_LOCK};
    use farside_region::{HeapWords, Words};
    use farside_rmem::{connect, ClientOptions, Endpoint, LabKeyset, OpCounters, TcpServer};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;

    /// The balancers' keys (random, per test binary).
    fn keys() -> &'static LabKeyset {
        static K: std::sync::OnceLock<LabKeyset> = std::sync::OnceLock::new();
        K.get_or_init(LabKeyset::generate)
    }

    fn region() -> (Arc<HeapWords>, TcpServer) {
        let mem = Arc::new(HeapWords::new(farside_region::REGION_WORDS));
        let srv = TcpServer::spawn(
            "127.0.0.1:0".parse().unwrap(),
            mem.clone(),
            keys().server(),
            Arc::new(OpCounters::default()),
        )
        .unwrap();
        (mem, srv)
    }

    fn client(s: &TcpServer) -> Box<dyn RemoteMemory> {
        let opts = ClientOptions {
            key: Some(keys().balancer),
            timeout: Duration::from_millis(500),
            ..Default::default()
        };
        connect(&Endpoint::Tcp(s.local_addr), &opts).unwrap()
    }

    /// Over the real tcp transport: site 1 overloaded, site 0 can spare node 2; one
    /// round moves node 2 (CAS on its ROLE_WANTED), bumps the peer's shared counter and
    /// frees the lock on site 1's anchor.
    #[test]
    fn a_round_over_tcp_moves_a_node_and_bumps_the_peer() {
        let nodes: Vec<_> = (0..4).map(|_| region()).collect();
        let bals: Vec<_> = (0..2).map(|_| region()).collect();
        for (n, site, load) in [
            (0, 0, 100_000),
            (1, 1, 950_000),
            (2, 0, 100_000),
            (3, 1, 950_000),
        ] {
            let w = nodes[n].0.words();
            let r = Role::new(site, 1).0;
            w[W_ROLE_WANTED].store(r, Ordering::Relaxed);
            w[W_ROLE_SERVED].store(r, Ordering::Relaxed);
            w[farside_region::layout::W_CPU_UTIL_PPM].store(load, Ordering::Relaxed);
        }
        let mut regions = RmemRegions {
            nodes: nodes.iter().map(|(_, s)| Some(client(s))).collect(),
            balancers: bals.iter().map(|(_, s)| Some(client(s))).collect(),
        };
        let topo = Topology {
            nodes: 4,
            anchors: vec![0, 1],
            balancers: 2,
        };
        let cfg = BalancerConfig {
            history_ns: 0,
            ..BalancerConfig::default()
        };
        let mut b = Balancer::new(0, cfg, topo).unwrap();
        let t0 = std::time::Instant::now();
        let now = move || t0.elapsed().as_nanos() as u64 + 1;
        let issued = run_round(&mut b, &mut regions, &now);
        assert!(issued > 8, "{issued}");
        let wanted = Role(nodes[2].0.words()[W_ROLE_WANTED].load(Ordering::Relaxed));
        assert_eq!(
            (wanted.site(), wanted.version()),
            (1, 2),
            "node 2 moved to site 1"
        );
        assert_eq!(b.stats().moves, 1);
        let lock = Lock::decode(nodes[1].0.words()[W_SITE_LOCK].load(Ordering::Relaxed));
        assert!(lock.is_free() && lock.token == 1, "{lock:?}");
        assert_eq!(
            bals[1].0.words()[W_SHARED_COUNTER].load(Ordering::Relaxed),
            1,
            "the peer's shared counter bumped"
        );
        let log = b.drain_log();
        assert_eq!(log.len(), 1);
        // The round's reads, then the decision, then lock ops and the move CAS: each
        // a real round trip, so the three instants are strictly ordered.
        let m = &log[0];
        assert!(
            m.round_ns < m.decided_ns && m.decided_ns < m.at_ns,
            "round {} decided {} moved {}",
            m.round_ns,
            m.decided_ns,
            m.at_ns
        );
    }
}
