//! Switching time and decision-to-move latency of `lab reconfig`, from the
//! processes' logs.
//!
//! Every process of the lab runs on one host, so they share one wall clock (network
//! namespaces do not virtualise `CLOCK_REALTIME`). The proxies' balancers log every move
//! with `node=`, `to=`, `cas_unix_us=` (when the reply of the move CAS on the node's
//! `ROLE_WANTED` arrived), `decision_to_cas_us=` (from the round's decision that the site
//! is due a node) and `round_to_cas_us=` (from the start of that round, its reads of
//! every node included); the back-ends log the first response served from a site after
//! each switch (`backend: first request for site NAME after switch N served_unix_us=T`).
//! [`join`] pairs each move with the first request its node served for the move's site
//! after the CAS and before the node's next move: switch time = first request − CAS,
//! the definition (the agent's poll, drain and apply, the proxies' next monitor
//! read of the served word, and the request's own service included).

use serde::{Deserialize, Serialize};

/// One move as its balancer logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveLine {
    /// Balancer (proxy index) that made the move.
    pub balancer: usize,
    /// Node moved (back-end index).
    pub node: usize,
    /// Site it was moved to.
    pub to_site: usize,
    /// Wall clock when the move CAS's reply arrived, µs since the Unix epoch.
    pub cas_unix_us: u64,
    /// From the round's decision to the CAS reply, µs.
    pub decision_us: u64,
    /// From the round's start to the CAS reply, µs.
    pub round_us: u64,
}

/// The first response a back-end served from a site after one of its switches.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstServed {
    /// Back-end index.
    pub node: usize,
    /// Site name served.
    pub site: String,
    /// Wall clock of that response, µs since the Unix epoch.
    pub served_unix_us: u64,
}

/// One move with its timings, as kept in a point (`moves_timed`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct MoveTiming {
    /// Balancer (proxy index).
    pub balancer: usize,
    /// Node moved.
    pub node: usize,
    /// Site it was moved to.
    pub to_site: usize,
    /// When the CAS succeeded, seconds since the point's first burst started.
    pub t_s: f64,
    /// Decision → move CAS, ms.
    pub decision_ms: f64,
    /// Round start → move CAS, ms.
    pub round_ms: f64,
    /// Move CAS → first request served in the new role, ms; `None` if the node served
    /// none for that site within the point (the load had moved on).
    pub switch_ms: Option<f64>,
}

/// The value of `key=` in a log line (the token after it, up to a space).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    line[at..].split_whitespace().next()
}

fn num(line: &str, key: &str) -> Option<u64> {
    field(line, key)?.parse().ok()
}

/// The moves in a proxy's log (`balancer` is the proxy's index).
pub fn parse_moves(log: &str, balancer: usize) -> Vec<MoveLine> {
    log.lines()
        .filter(|l| l.contains("reconf: moved node"))
        .filter_map(|l| {
            Some(MoveLine {
                balancer,
                node: num(l, "node")? as usize,
                to_site: num(l, "to")? as usize,
                cas_unix_us: num(l, "cas_unix_us")?,
                decision_us: num(l, "decision_to_cas_us")?,
                round_us: num(l, "round_to_cas_us")?,
            })
        })
        .collect()
}

/// The first-request records in a back-end's log (`node` is its index).
pub fn parse_first_served(log: &str, node: usize) -> Vec<FirstServed> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split_once("backend: first request for site ")?.1;
            let site = rest.split_whitespace().next()?.to_string();
            Some(FirstServed {
                node,
                site,
                served_unix_us: num(l, "served_unix_us")?,
            })
        })
        .collect()
}

/// Pair every move with its node's first request for the move's site after the CAS
/// and before that node's next move (`site_name` maps a site index to its name).
/// `t0_unix_us` is the point's start; the result is in CAS order.
pub fn join(
    moves: &[MoveLine],
    firsts: &[FirstServed],
    site_name: &dyn Fn(usize) -> String,
    t0_unix_us: u64,
) -> Vec<MoveTiming> {
    let mut moves = moves.to_vec();
    moves.sort_by_key(|m| m.cas_unix_us);
    moves
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let next = moves[i + 1..]
                .iter()
                .find(|n| n.node == m.node)
                .map_or(u64::MAX, |n| n.cas_unix_us);
            let name = site_name(m.to_site);
            let first = firsts
                .iter()
                .filter(|f| {
                    f.node == m.node
                        && f.site == name
                        && f.served_unix_us >= m.cas_unix_us
                        && f.served_unix_us < next
                })
                .map(|f| f.served_unix_us)
                .min();
            MoveTiming {
                balancer: m.balancer,
                node: m.node,
                to_site: m.to_site,
                t_s: (m.cas_unix_us as f64 - t0_unix_us as f64) / 1e6,
                decision_ms: m.decision_us as f64 / 1e3,
                round_ms: m.round_us as f64 / 1e3,
                switch_ms: first.map(|f| (f - m.cas_unix_us) as f64 / 1e3),
            }
        })
        .collect()
}

/// The `q` quantile of `v` (0..=1), linearly interpolated between order statistics;
/// `None` if empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(s[lo] + (s[hi] - s[lo]) * (pos - lo as f64))
}

/// Wall clock now, µs since the Unix epoch.
pub fn unix_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROXY_LOG: &str = "\
1795476907.353 INFO  reconf: balancer 1 on region 10.77.0.18:7100
1795476921.356 INFO  reconf: moved node 2 from site s0 to site s2 (site load 180105 ppm, overloaded for 5000 ms, lock token 1) node=2 to=2 wanted=0x2000000000002 cas_unix_us=1795476921355000 decision_to_cas_us=1800 round_to_cas_us=2600
1795476931.356 INFO  reconf: moved node 2 from site s2 to site s1 (site load 1 ppm, overloaded for 5000 ms, lock token 2) node=2 to=1 wanted=0x1000000000003 cas_unix_us=1795476931355000 decision_to_cas_us=900 round_to_cas_us=1500
";

    const BACKEND_LOG: &str = "\
1795476921.300 INFO  backend: now serving site s2 (/x/s2) switch=1 switched_unix_us=1795476921380000
1795476921.400 INFO  backend: first request for site s2 after switch 1 served_unix_us=1795476921400000 switched_unix_us=1795476921380000
1795476935.400 INFO  backend: first request for site s1 after switch 2 served_unix_us=1795476935400000 switched_unix_us=-
";

    #[test]
    fn moves_and_first_requests_are_parsed_from_the_logs() {
        let m = parse_moves(PROXY_LOG, 1);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0],
            MoveLine {
                balancer: 1,
                node: 2,
                to_site: 2,
                cas_unix_us: 1_795_476_921_355_000,
                decision_us: 1800,
                round_us: 2600,
            }
        );
        let f = parse_first_served(BACKEND_LOG, 2);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].site, "s2");
        assert_eq!(f[0].served_unix_us, 1_795_476_921_400_000);
        // An old-format move line (no timing fields) is skipped, not misread.
        assert!(parse_moves("reconf: moved node 2 from site s0 to site s2 (x)", 0).is_empty());
        assert_eq!(field("a node=3 b", "node"), Some("3"));
        assert_eq!(field("a xnode=3 b", "node"), None);
    }

    #[test]
    fn each_move_is_joined_with_its_nodes_first_request_in_the_new_role() {
        let moves = parse_moves(PROXY_LOG, 0);
        let mut firsts = parse_first_served(BACKEND_LOG, 2);
        // Another node's first request for the same site must not be taken.
        firsts.push(FirstServed {
            node: 5,
            site: "s2".into(),
            served_unix_us: 1_795_476_921_356_000,
        });
        let name = |i: usize| format!("s{i}");
        let j = join(&moves, &firsts, &name, 1_795_476_920_000_000);
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].switch_ms, Some(45.0), "{j:?}");
        assert!((j[0].t_s - 1.355).abs() < 1e-9);
        assert_eq!(j[0].decision_ms, 1.8);
        assert_eq!(j[0].round_ms, 2.6);
        assert_eq!(j[1].switch_ms, Some(4045.0));
        // Without the second first-request, the second move stays unmatched rather
        // than taking one from before its CAS.
        let j = join(&moves, &firsts[..1], &name, 0);
        assert_eq!(j[1].switch_ms, None);
    }

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[3.0], 0.99), Some(3.0));
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.5));
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 1.0), Some(4.0));
        assert!((quantile(&[0.0, 100.0], 0.99).unwrap() - 99.0).abs() < 1e-9);
    }
}
