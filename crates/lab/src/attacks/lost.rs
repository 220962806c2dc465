//! What became of the flood lab's lost connections, and of specd's hand-offs in a
//! phase: where a lost connection's socket is when its client gives up (`ss` on the
//! client and both back-ends, their accept and adoption queues) and what specd traced
//! for it (`--conn-trace`), and the hand-offs to the local servers per phase.

use std::net::SocketAddrV4;

use serde::{Deserialize, Serialize};

use super::dc::{Dc, B0, B1, CLIENT, VIP};

/// The daemons whose sockets a lost connection may sit in, by process name.
const HOLDERS: [&str; 4] = ["backend-b0", "backend-b1", "specd-b0", "specd-b1"];

/// Where the connection of `client` is now, on the client and on both back-ends: one
/// `ss` line per socket found (state, receive and send queues, timers) with the
/// daemon holding it (`no process`: in a listener's accept queue, or in flight
/// between processes), and specd's records of it.
pub(super) fn where_is(d: &Dc, client: SocketAddrV4) -> String {
    let pids: Vec<(String, &str)> = HOLDERS
        .iter()
        .filter_map(|n| d.pid_of(n).map(|p| (format!("pid={p},"), *n)))
        .collect();
    let mut out = Vec::new();
    for (node, dir) in [(CLIENT, "src"), (B0, "dst"), (B1, "dst")] {
        let filter = format!("{dir} {client}");
        let lines =
            d.dc.run_in_ns(node, move || {
                std::process::Command::new("ss")
                    .args(["-tanpeiH"])
                    .args(filter.split(' '))
                    .output()
            })
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("ss: {e}"));
        // `-i` puts each socket's TCP info on an indented line of its own.
        let mut sockets: Vec<String> = Vec::new();
        for l in lines.lines().filter(|l| !l.trim().is_empty()) {
            match sockets.last_mut() {
                Some(last) if l.starts_with(char::is_whitespace) => {
                    last.push(' ');
                    last.push_str(l);
                }
                _ => sockets.push(l.to_string()),
            }
        }
        let mut found = Vec::new();
        for l in sockets {
            let mut l = l.split_whitespace().collect::<Vec<_>>().join(" ");
            let who = pids.iter().find(|(p, _)| l.contains(p.as_str())).map_or(
                if l.contains("users:") {
                    "other"
                } else {
                    "no process"
                },
                |(_, n)| n,
            );
            if let Some(i) = l.find(" users:") {
                let end = l[i..].find("))").map_or(l.len(), |e| i + e + 2);
                l.replace_range(i..end, "");
            }
            found.push(format!("[{who}] {l}"));
        }
        let queues = match node {
            CLIENT => String::new(),
            _ => format!(" ({})", server_queues(d, node)),
        };
        let traced = match node {
            CLIENT => String::new(),
            _ => {
                let steps: Vec<String> = specd_trace(d, node)
                    .iter()
                    .filter(|v| v["client"].as_str() == Some(client.to_string().as_str()))
                    .map(|v| {
                        format!(
                            "{} {} ({} µs)",
                            v["unix_ms"].as_u64().unwrap_or(0) % 100_000,
                            v["step"].as_str().unwrap_or("?"),
                            v["us"].as_u64().unwrap_or(0)
                        )
                    })
                    .collect();
                format!(
                    "; specd-{node} traced: {}",
                    if steps.is_empty() {
                        "nothing".to_string()
                    } else {
                        steps.join(", ")
                    }
                )
            }
        };
        out.push(format!(
            "{node}{queues}: {}{traced}",
            if found.is_empty() {
                "no socket".to_string()
            } else {
                found.join(" | ")
            }
        ));
    }
    out.join("; ")
}

/// specd's per-connection trace on `node` so far (whole lines only).
fn specd_trace(d: &Dc, node: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(d.specd_trace_path(node))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Milliseconds since the Unix epoch (the trace's clock).
pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What specd's hand-offs to the local servers did in a phase (both back-ends, both
/// sides: fall-backs on the source, restored connections on the target), from their
/// traces between `from_ms` and `to_ms` (Unix ms).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct HandoffPhase {
    /// Connections handed to a local server (at once or after waiting).
    pub handed: u64,
    /// Of those, how many had to wait in specd's hand-off queue.
    pub queued: u64,
    /// Their waits in the hand-off queue, µs: 99th percentile and most.
    pub wait_p99_us: u64,
    pub wait_max_us: u64,
    /// Connections the local server did not take in time that were offered on to a
    /// peer instead; refused with a reset after the hand-off's wait bound; closed
    /// otherwise (over its bound, failed).
    pub offered_on: u64,
    pub refused: u64,
    pub closed: u64,
}

impl HandoffPhase {
    /// Nothing recorded (also what a run kept before the field existed reads as).
    pub fn is_zero(&self) -> bool {
        *self == HandoffPhase::default()
    }
}

pub(super) fn handoff_phase(d: &Dc, from_ms: u64, to_ms: u64) -> HandoffPhase {
    let mut h = HandoffPhase::default();
    let mut waits = Vec::new();
    for node in [B0, B1] {
        for v in specd_trace(d, node) {
            let t = v["unix_ms"].as_u64().unwrap_or(0);
            if t < from_ms || t > to_ms {
                continue;
            }
            let step = v["step"].as_str().unwrap_or("");
            if step == "reoffered" {
                // Taken back from the source's hand-off queue and offered to a peer.
                h.offered_on += 1;
                continue;
            }
            let Some((_, what)) = step
                .split_once('.')
                .filter(|(side, _)| *side == "local" || *side == "restored")
            else {
                continue;
            };
            let us = v["us"].as_u64().unwrap_or(0);
            match what {
                "handed" | "relayed" => {
                    h.handed += 1;
                    waits.push(us);
                }
                "queued" => h.queued += 1,
                "offered_on" => h.offered_on += 1,
                "refused" => h.refused += 1,
                "over_bound" | "failed" => h.closed += 1,
                _ => {}
            }
        }
    }
    waits.sort_unstable();
    if let Some(&m) = waits.last() {
        h.wait_max_us = m;
        h.wait_p99_us = waits[(waits.len() * 99).div_ceil(100).max(1) - 1];
    }
    h
}

/// A back-end's queues in front of its web server's workers now: the listener's
/// accept queue and the adoption socket's datagrams (connections specd handed over
/// that no worker has taken yet), each as `ss` shows them (`Recv-Q`).
fn server_queues(d: &Dc, node: &str) -> String {
    let i = usize::from(node == B1);
    let adopt = d.adopt_path(i).display().to_string();
    let port = VIP.port();
    d.dc.run_in_ns(node, move || {
        let ss = |args: &[&str]| {
            std::process::Command::new("ss")
                .args(args)
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                })
        };
        let listen = ss(&["-tlnH", "sport", "=", &format!(":{port}")])?;
        let unix = ss(&["-xanH", "src", &adopt])?;
        let held = std::process::Command::new("ss")
            .args([
                "-tniH",
                "state",
                "established",
                "sport",
                "=",
                &format!(":{port}"),
            ])
            .output()
            .map(|o| held_summary(&String::from_utf8_lossy(&o.stdout)))?;
        Ok(format!(
            "listener: {listen}; adoption socket: {unix}; {held}"
        ))
    })
    .unwrap_or_else(|e| format!("ss: {e}"))
}

/// The established connections on a back-end's web port, from `ss -tniH` output (a
/// socket's line, then its TCP info indented): how many, by peer address, and the
/// spread of their last receive (ms ago), so that workers held by idle keep-alive
/// connections, or by connections whose client has gone elsewhere, show.
fn held_summary(ss: &str) -> String {
    let mut peers: std::collections::BTreeMap<String, u32> = Default::default();
    let mut lastrcv: Vec<u64> = Vec::new();
    for l in ss.lines().filter(|l| !l.trim().is_empty()) {
        if l.starts_with(char::is_whitespace) {
            if let Some(v) = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("lastrcv:"))
                .and_then(|v| v.parse().ok())
            {
                lastrcv.push(v);
            }
        } else if let Some(peer) = l.split_whitespace().nth(3) {
            let ip = peer.rsplit_once(':').map_or(peer, |(ip, _)| ip);
            *peers.entry(ip.to_string()).or_default() += 1;
        }
    }
    let n: u32 = peers.values().sum();
    lastrcv.sort_unstable();
    let by_peer: Vec<String> = peers
        .iter()
        .map(|(ip, c)| format!("{c} from {ip}"))
        .collect();
    match (lastrcv.first(), lastrcv.last()) {
        (Some(lo), Some(hi)) => format!(
            "{n} established on the web port ({}; last received {lo}-{hi} ms ago, median {})",
            by_peer.join(", "),
            lastrcv[lastrcv.len() / 2]
        ),
        _ => format!("{n} established on the web port"),
    }
}

#[cfg(test)]
mod tests {
    use super::held_summary;

    #[test]
    fn held_connections_are_counted_by_peer_with_their_last_receive() {
        let ss = "0 0 10.77.0.11:80 10.77.0.10:40000\n\t cubic lastsnd:5 lastrcv:120 lastack:5\n\
                  0 0 10.77.0.11:80 10.77.0.10:40002\n\t cubic lastrcv:9000 lastack:5\n\
                  0 0 10.77.0.11:80 127.0.0.1:5000\n\t cubic lastrcv:30\n";
        assert_eq!(
            held_summary(ss),
            "3 established on the web port (2 from 10.77.0.10, 1 from 127.0.0.1; \
             last received 30-9000 ms ago, median 120)"
        );
        assert_eq!(held_summary(""), "0 established on the web port");
    }
}
