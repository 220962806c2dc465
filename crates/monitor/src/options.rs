//! How the monitor reads: its settings as an operator gives them ([`MonitorConfig`], the
//! `[monitor]` section of the proxy's file and the flags over it), and the options it
//! runs with ([`MonitorOptions`]), worked out from them in one place
//! ([`MonitorConfig::options`]) for the monitor embedded in a proxy and for the
//! stand-alone `farside monitor` alike.

use crate::MonitorRx;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// How the monitor reads.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    /// Poll period G.
    pub period: Duration,
    /// Timeout of one read (all its attempts).
    pub read_timeout: Duration,
    /// Only used to log fresh → stale transitions.
    pub stale_after: Duration,
    /// The key READs are sealed with for regions that name none (`?key=ID:PATH`);
    /// required for udp and tcp regions (`farside_rmem::auth`).
    pub key: Option<farside_rmem::ClientKey>,
    /// Nice value of every polling thread (0: unchanged).
    pub nice: i32,
    /// Poller threads; 0: the default rule ([`poller_threads`]). Ignored (one poller)
    /// with group reads or AF_XDP receive.
    pub threads: usize,
    /// Group reads: every period, ONE READ to this address (an IPv4 multicast group
    /// that every back-end's responder answers from its own region endpoint) instead of
    /// one per back-end; replies are matched by source address, missing ones retried
    /// unicast ([`crate::poller`]). Back-ends with their own read key, on IPv6, or sharing an
    /// endpoint are read unicast. One poller thread reads them all (`threads` is
    /// ignored: every back-end answers every group READ, so a second poller would
    /// double the replies). `None` (the default): unicast reads only.
    pub group: Option<std::net::SocketAddr>,
    /// Where the udp replies are taken from: the UDP socket (the default) or AF_XDP
    /// sockets on an interface's RX queues ([`crate::xsk`]; one poller thread then reads
    /// every back-end, `threads` is ignored: the queues' sockets are that poller's).
    /// Where AF_XDP cannot be set up the poller logs why and uses the UDP socket.
    pub rx: MonitorRx,
}

/// Back-ends one poller thread reads by default. The rule's reasoning, an estimate
/// until `bench_monitor` is run on a quiet machine: a read costs the poller a datagram
/// out and one in, batched (about 1 µs of CPU), so 512 reads per 1 ms period keep one
/// thread near half a core, with room for a slow period.
pub const BACKENDS_PER_THREAD: usize = 512;

/// Most poller threads: more than the front-end's cores only adds wake-ups.
pub const MONITOR_THREADS_MAX: usize = 16;

/// Poller threads for `polled` back-ends: `requested` if not 0, else one per
/// [`BACKENDS_PER_THREAD`] (at least one); never more than there are back-ends or
/// [`MONITOR_THREADS_MAX`].
pub fn poller_threads(polled: usize, requested: usize) -> usize {
    let n = if requested > 0 {
        requested
    } else {
        polled.div_ceil(BACKENDS_PER_THREAD)
    };
    n.clamp(1, MONITOR_THREADS_MAX).min(polled.max(1))
}

/// `[monitor]`: the monitor's settings in the units an operator gives them. Bounds are
/// checked with the rest of the proxy's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// Poll period G of every back-end's region. Default 1000 µs.
    pub period_us: u64,
    /// Timeout of one remote read. Default 50 ms.
    pub read_timeout_ms: u64,
    /// Nice value (-20..=19) of the monitor's polling threads only. The proxy's worker
    /// and the clients it serves can keep the front-end's CPU busy; a negative value keeps
    /// the reads on time there (needs CAP_SYS_NICE, else a warning). Default 0.
    pub nice: i32,
    /// Read an external `farside monitor`'s table from this file instead of embedding
    /// the monitor. Default: none (embedded).
    pub table: Option<String>,
    /// Poller threads, each reading its share of the regions every period. Default 0:
    /// one per 512 back-ends ([`BACKENDS_PER_THREAD`]), at most 16.
    pub threads: usize,
    /// Group reads: every period ONE READ to this IPv4 `ADDR:PORT` (a multicast group
    /// every back-end's gatherd answers from its own region endpoint, with the shared
    /// read key) instead of one per back-end; missing replies are retried unicast.
    /// Default: none (a READ per back-end).
    pub group_read: Option<SocketAddr>,
    /// Where the pollers take their udp replies from: `udp` (the UDP socket,
    /// `recvmmsg`; the default) or `xsk:IFACE` (AF_XDP sockets on IFACE's RX queues
    /// fed by an XDP program that takes the replies off the UDP stack; one poller
    /// thread; needs root, else the UDP socket is used with a warning).
    pub rx: String,
    /// The rmem key READs are sealed with, `ID:PATH`: its key id and its key file
    /// (0600; without a path the systemd credential `rmem-ID`), installed as a `reader`
    /// key on every back-end's gatherd (`--rmem-key reader:ID:PATH`). A region can name
    /// its own with `?key=ID:PATH`. Default: none (udp and tcp regions then fail).
    pub key: Option<String>,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            period_us: 1000,
            read_timeout_ms: 50,
            nice: 0,
            table: None,
            threads: 0,
            group_read: None,
            rx: "udp".into(),
            key: None,
        }
    }
}

impl MonitorConfig {
    /// The options the monitor runs with. `stale_after`: when the proxy's admission
    /// counts a record stale (the monitor only logs fresh → stale transitions by it).
    /// Reads the key file, if one is named.
    pub fn options(&self, stale_after: Duration) -> Result<MonitorOptions, String> {
        let key = match &self.key {
            Some(spec) => Some(farside_rmem::ClientKey::load(spec)?),
            None => None,
        };
        Ok(MonitorOptions {
            period: Duration::from_micros(self.period_us),
            read_timeout: Duration::from_millis(self.read_timeout_ms),
            stale_after,
            nice: self.nice,
            key,
            threads: self.threads,
            group: self.group_read,
            // Checked by the configuration's validation; unparsable only in a
            // configuration never validated.
            rx: self.rx.parse::<MonitorRx>().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_the_settings_in_their_units() {
        let c = MonitorConfig {
            period_us: 500,
            read_timeout_ms: 20,
            nice: -5,
            threads: 2,
            group_read: Some("239.1.1.1:7000".parse().unwrap()),
            rx: "xsk:eth1".into(),
            ..MonitorConfig::default()
        };
        let o = c.options(Duration::from_millis(100)).unwrap();
        assert_eq!(o.period, Duration::from_micros(500));
        assert_eq!(o.read_timeout, Duration::from_millis(20));
        assert_eq!(o.stale_after, Duration::from_millis(100));
        assert_eq!((o.nice, o.threads), (-5, 2));
        assert_eq!(o.group, c.group_read);
        assert_eq!(o.rx, MonitorRx::Xsk("eth1".into()));
        assert_eq!(o.key, None);
        assert_eq!(
            MonitorConfig::default().options(o.stale_after).unwrap().rx,
            MonitorRx::Udp
        );
        let missing = MonitorConfig {
            key: Some("4:/nonexistent/rmem-4.key".into()),
            ..MonitorConfig::default()
        };
        assert!(missing
            .options(o.stale_after)
            .unwrap_err()
            .contains("rmem key 4"));
    }
}
