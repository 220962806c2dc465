//! A peer back-end of `farside specd`'s source side (`--peer`): its daemon's
//! migration listener, its region (read one-sidedly for its load) and its address
//! at the front-end.

use std::net::{IpAddr, SocketAddr};

/// A peer back-end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its daemon's migration listener.
    pub daemon: SocketAddr,
    /// Its region (`farside gatherd`), read one-sidedly for its load; `None`: load
    /// unknown (ranked after peers with a known load).
    pub region: Option<String>,
    /// Its address as the front-end knows it (the `move_flow` target). Default: the
    /// daemon's IP.
    pub backend: IpAddr,
}

impl Peer {
    /// Parses `daemon=IP:PORT[,region=ENDPOINT][,backend=IP]`.
    pub fn parse(s: &str) -> Result<Peer, String> {
        let (mut daemon, mut region, mut backend) = (None, None, None);
        for part in s.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("--peer `{s}`: `{part}` is not key=value"))?;
            match k {
                "daemon" => {
                    daemon = Some(
                        v.parse::<SocketAddr>()
                            .map_err(|e| format!("--peer `{s}`: daemon `{v}`: {e}"))?,
                    )
                }
                "region" => {
                    farside_rmem::Target::parse(v)
                        .map_err(|e| format!("--peer `{s}`: region: {e}"))?;
                    region = Some(v.to_string());
                }
                "backend" => {
                    backend = Some(
                        v.parse::<IpAddr>()
                            .map_err(|e| format!("--peer `{s}`: backend `{v}`: {e}"))?,
                    )
                }
                _ => return Err(format!("--peer `{s}`: unknown key `{k}`")),
            }
        }
        let daemon = daemon.ok_or_else(|| format!("--peer `{s}`: daemon=IP:PORT is required"))?;
        Ok(Peer {
            daemon,
            region,
            backend: backend.unwrap_or(daemon.ip()),
        })
    }
}

/// A peer's last known load (read from its region when choosing a target).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeerLoad {
    pub(crate) known: bool,
    pub(crate) accept_backlog: u64,
    pub(crate) cpu_util_ppm: u64,
}

/// Index of the least-loaded candidate, each given as (its last load, migrations to
/// it in progress): known loads first, then by accept backlog plus migrations in
/// flight, then CPU utilisation; the first of equals.
pub(crate) fn least_loaded(cands: impl Iterator<Item = (PeerLoad, u32)>) -> Option<usize> {
    cands
        .enumerate()
        .min_by_key(|(i, (l, inflight))| {
            (
                !l.known,
                l.accept_backlog + u64::from(*inflight),
                l.cpu_util_ppm,
                *i,
            )
        })
        .map(|(i, _)| i)
}

/// Whether some peer may take a migration: its load is unknown (the target decides),
/// or its known accept backlog plus the migrations to it in flight is below `full_at`.
pub(crate) fn some_peer_has_room(
    cands: impl Iterator<Item = (PeerLoad, u32)>,
    full_at: u64,
) -> bool {
    cands
        .into_iter()
        .any(|(l, inflight)| !l.known || l.accept_backlog + u64::from(inflight) < full_at)
}

/// The load (backlog plus migrations in flight) below which a peer whose admission
/// bound is `bound` still takes `n` more connections: `bound - n + 1`.
pub(crate) fn full_at_for(bound: u32, n: u32) -> u64 {
    u64::from(bound).saturating_sub(u64::from(n.max(1)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_specs_parse_and_refuse_bad_input() {
        let p =
            Peer::parse("daemon=10.0.0.2:7000,region=udp:10.0.0.2:7471,backend=10.1.0.2").unwrap();
        assert_eq!(p.daemon, "10.0.0.2:7000".parse().unwrap());
        assert_eq!(p.region.as_deref(), Some("udp:10.0.0.2:7471"));
        assert_eq!(p.backend, "10.1.0.2".parse::<IpAddr>().unwrap());
        let p = Peer::parse("daemon=10.0.0.3:7000").unwrap();
        assert_eq!(p.backend, "10.0.0.3".parse::<IpAddr>().unwrap());
        assert!(p.region.is_none());
        assert!(Peer::parse("region=udp:1.2.3.4:5").is_err());
        assert!(Peer::parse("daemon=nope").is_err());
        assert!(Peer::parse("daemon=1.2.3.4:5,region=ftp:x").is_err());
        assert!(Peer::parse("daemon=1.2.3.4:5,color=red").is_err());
        assert!(Peer::parse("daemon").is_err());
    }
}
