//! Arena grants: the right to resolve urls in a server's object arena without asking
//! its process, given by one ordinary HTTP answer and enforced in the kernel.
//!
//! ```text
//!  GET + RDMA: arena-reads, maxlen=N, direct=1        (the client holds the arena key)
//!  200 + RDMA: arena-reads, ..., grant=G, gexp=E, ttl=T
//!        server: key K_G = derive(arena key, G, client address, E) installed in the
//!                responder's key map, bound to the client's address, dead from E on
//!        client: derives the same K_G (nothing secret crossed HTTP), uses it until
//!                T - GRANT_CLIENT_MARGIN after the answer arrived
//!  later GETs of published paths: one index READ (the path's alias bucket) and the
//!  body's READs under K_G, answered in the kernel; any miss, stale alias, bad object
//!  or expired grant: the ordinary HTTP request again (which renews the grant)
//! ```
//!
//! What a grant opens is the arena's index and slots, READ only (`Rights::reader` of
//! the arena region), and the server publishes in that index only **static public
//! files**: a 200 of a regular file under `--root`, for a plain path, with no
//! per-host routing (see `crate::arena::publishable`), i.e. exactly what any client
//! gets by an unauthenticated GET, as a CDN caches it. The grant adds no right to
//! anything else.
//!
//! Bounds: a grant lives [`GRANT_LIFETIME`]; a client address holds at most
//! [`GRANTS_PER_CLIENT`] live grants and the server at most [`GRANTS_MAX`] (the kernel's
//! key map also holds the node's own keys). [`GrantTable`] is the pure state machine
//! that issues, renews and expires them; the caller installs and revokes keys.

use farside_auth::siphash::{siphash24, SipKey};
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// How long a grant opens the arena. Rule: a client renews it with one HTTP request
/// (one answer from the loaded CPU, ~10 ms there) per lifetime, so 10 s keeps that
/// under 0.1 % of its requests' time; and a client address that changes hands (or a
/// policy change the server makes) is bounded to the same 10 s.
pub const GRANT_LIFETIME: Duration = Duration::from_secs(10);
/// A client stops using a grant this long before its end. Rule: the lifetime is sent
/// relative (`ttl`), so only the answer's transit and the client's scheduling delay
/// between reading the answer and noting the time count; 1 s is far above both, and
/// a READ sent at the edge would be dropped (a lost fetch, then the HTTP fallback).
pub const GRANT_CLIENT_MARGIN: Duration = Duration::from_secs(1);
/// Live grants per client address. Rule: the one in use and the one renewing it (a
/// request that comes in the last half of a grant's life gets a new one, while
/// sessions still holding the old one keep using it until it ends).
pub const GRANTS_PER_CLIENT: usize = 2;
/// Live grants of a server. Rule: the responder's key map holds
/// `farside_auth::keys::KEYS_MAX` (64) keys with the node's own arena key; 32 client
/// addresses with two grants each would need 64, so 32 grants serve 16 to 32 clients
/// and leave the map room. A request when all are live gets its body as without
/// `direct` (an arena hint, no grant).
pub const GRANTS_MAX: usize = 32;
/// First grant key id. Rule: far above the ids operators give configured keys (small
/// integers in key files), so a grant never replaces one.
pub const GRANT_ID_BASE: u32 = 0x4000_0000;

/// One grant as the HTTP answer states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Its key id in the responder's key map.
    pub id: u32,
    /// The server's `CLOCK_MONOTONIC` ns at which it dies (opaque to the client, an
    /// input of the key derivation).
    pub expires_ns: u64,
    /// Its remaining lifetime when answered, ms.
    pub ttl_ms: u64,
}

/// The grant's key: SipHash-2-4 under the arena reader key of a label, the grant's id,
/// the client's address and the grant's end, once per half. Both sides compute it; the
/// HTTP answer carries only the inputs, so an observer of the answer learns no key.
pub fn grant_key(arena_key: &SipKey, id: u32, client: Ipv4Addr, expires_ns: u64) -> SipKey {
    let half = |i: u8| {
        let mut m = Vec::with_capacity(32);
        m.extend_from_slice(b"farside-grant\0");
        m.push(i);
        m.extend_from_slice(&id.to_le_bytes());
        m.extend_from_slice(&client.octets());
        m.extend_from_slice(&expires_ns.to_le_bytes());
        siphash24(arena_key, &m)
    };
    SipKey::from_halves(half(0), half(1))
}

/// What the table asks the caller to do with the kernel's key map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyChanges {
    /// Install this grant for this address (a new one).
    pub install: Option<(Grant, Ipv4Addr)>,
    /// Remove these key ids (expired or displaced grants).
    pub revoke: Vec<u32>,
}

/// The grants a server has issued. Pure: times are passed in (`CLOCK_MONOTONIC` ns).
#[derive(Debug, Default)]
pub struct GrantTable {
    /// Per client address: its live grants' (id, expires_ns), oldest first.
    by_client: HashMap<Ipv4Addr, Vec<(u32, u64)>>,
    /// Live grants by their end: (expires_ns, id) -> address.
    by_end: BTreeMap<(u64, u32), Ipv4Addr>,
    next_id: u32,
}

impl GrantTable {
    pub fn new() -> GrantTable {
        GrantTable::default()
    }

    /// Live grants.
    pub fn len(&self) -> usize {
        self.by_end.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_end.is_empty()
    }

    /// Forgets every grant whose end is at or before `now`: their ids, to revoke.
    pub fn expire(&mut self, now: u64) -> Vec<u32> {
        let mut gone = Vec::new();
        while let Some((&(end, id), &ip)) = self.by_end.iter().next() {
            if end > now {
                break;
            }
            self.by_end.remove(&(end, id));
            self.drop_from_client(ip, id);
            gone.push(id);
        }
        gone
    }

    fn drop_from_client(&mut self, ip: Ipv4Addr, id: u32) {
        if let Some(v) = self.by_client.get_mut(&ip) {
            v.retain(|&(i, _)| i != id);
            if v.is_empty() {
                self.by_client.remove(&ip);
            }
        }
    }

    /// A grant for `client` at `now`: its newest live grant while more than half of it
    /// is left, else a new one (displacing its oldest beyond [`GRANTS_PER_CLIENT`]).
    /// `None` when the server holds [`GRANTS_MAX`] and none can be reused. The changes
    /// to make to the key map come back either way (expired grants are revoked here).
    pub fn issue(&mut self, client: Ipv4Addr, now: u64) -> (Option<Grant>, KeyChanges) {
        let mut changes = KeyChanges {
            install: None,
            revoke: self.expire(now),
        };
        let life = GRANT_LIFETIME.as_nanos() as u64;
        let grant = |id: u32, end: u64| Grant {
            id,
            expires_ns: end,
            ttl_ms: end.saturating_sub(now) / 1_000_000,
        };
        if let Some(&(id, end)) = self.by_client.get(&client).and_then(|v| v.last()) {
            if end - now > life / 2 {
                return (Some(grant(id, end)), changes);
            }
        }
        if self.by_client.get(&client).map_or(0, Vec::len) >= GRANTS_PER_CLIENT {
            let (old, end) = self.by_client.get_mut(&client).expect("has grants")[0];
            self.by_end.remove(&(end, old));
            self.drop_from_client(client, old);
            changes.revoke.push(old);
        }
        if self.by_end.len() >= GRANTS_MAX {
            return (None, changes);
        }
        let id = GRANT_ID_BASE + self.next_id;
        self.next_id = (self.next_id + 1) % (u32::MAX - GRANT_ID_BASE);
        let end = now + life;
        self.by_client.entry(client).or_default().push((id, end));
        self.by_end.insert((end, id), client);
        let g = grant(id, end);
        changes.install = Some((g, client));
        (Some(g), changes)
    }
}

/// A grant as a client holds it: the key it derived and when it stops using it.
#[derive(Debug, Clone, Copy)]
pub struct ClientGrant {
    pub key: farside_rmem::ClientKey,
    /// The responder's udp port (the arena hint's).
    pub port: u16,
    /// Used until then: the answer's arrival + ttl - [`GRANT_CLIENT_MARGIN`].
    pub until: Instant,
}

impl ClientGrant {
    /// The grant `g` answered to a client at `client` holding `arena_key`, received at
    /// `received`.
    pub fn new(
        arena_key: &farside_rmem::ClientKey,
        g: Grant,
        client: Ipv4Addr,
        port: u16,
        received: Instant,
    ) -> ClientGrant {
        let key = grant_key(arena_key.key(), g.id, client, g.expires_ns);
        ClientGrant {
            key: farside_rmem::ClientKey::new(farside_auth::mac::KeyId(g.id), key),
            port,
            until: received + Duration::from_millis(g.ttl_ms).saturating_sub(GRANT_CLIENT_MARGIN),
        }
    }

    /// Whether it may still be used at `now`.
    pub fn live(&self, now: Instant) -> bool {
        now < self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_client_keeps_its_grant_until_half_of_it_is_gone() {
        let mut t = GrantTable::new();
        let a = Ipv4Addr::new(10, 0, 0, 2);
        let (g, ch) = t.issue(a, 100 * S);
        let g = g.unwrap();
        assert_eq!(ch.install, Some((g, a)));
        assert_eq!(g.ttl_ms, GRANT_LIFETIME.as_millis() as u64);
        // Asked again early: the same grant, nothing to install.
        let (g2, ch) = t.issue(a, 103 * S);
        assert_eq!(g2.unwrap().id, g.id);
        assert_eq!(g2.unwrap().ttl_ms, 7_000);
        assert_eq!(ch, KeyChanges::default());
        // In its second half: a new one beside it.
        let (g3, ch) = t.issue(a, 106 * S);
        let g3 = g3.unwrap();
        assert_ne!(g3.id, g.id);
        assert!(ch.install.is_some() && ch.revoke.is_empty());
        assert_eq!(t.len(), 2);
        // A third displaces the oldest (GRANTS_PER_CLIENT).
        let (g4, ch) = t.issue(a, 112 * S);
        assert_eq!(ch.revoke, vec![g.id], "the first ended at 110 s");
        assert_ne!(g4.unwrap().id, g3.id);
        assert_eq!(t.len(), 2);
        // Everything ends.
        let gone = t.expire(200 * S);
        assert_eq!(gone.len(), 2);
        assert!(t.is_empty());
    }

    #[test]
    fn the_server_bound_holds_and_addresses_do_not_share_grants() {
        let mut t = GrantTable::new();
        let mut ids = std::collections::HashSet::new();
        for i in 0..GRANTS_MAX as u32 {
            let (g, _) = t.issue(Ipv4Addr::from(0x0a00_0000 + i), S);
            assert!(ids.insert(g.unwrap().id), "ids are distinct");
        }
        let (g, ch) = t.issue(Ipv4Addr::new(10, 9, 9, 9), S);
        assert_eq!(g, None, "full: no grant");
        assert_eq!(ch.install, None);
        // Once they end there is room again.
        let (g, ch) = t.issue(
            Ipv4Addr::new(10, 9, 9, 9),
            S + GRANT_LIFETIME.as_nanos() as u64,
        );
        assert!(g.is_some());
        assert_eq!(ch.revoke.len(), GRANTS_MAX);
    }

    #[test]
    fn the_key_is_bound_to_id_address_and_end() {
        let k = SipKey::from_halves(1, 2);
        let a = Ipv4Addr::new(10, 0, 0, 2);
        let base = grant_key(&k, 7, a, 99);
        assert_eq!(base, grant_key(&k, 7, a, 99), "both sides derive it alike");
        assert_ne!(base, grant_key(&k, 8, a, 99));
        assert_ne!(base, grant_key(&k, 7, Ipv4Addr::new(10, 0, 0, 3), 99));
        assert_ne!(base, grant_key(&k, 7, a, 100));
        assert_ne!(base, grant_key(&SipKey::from_halves(1, 3), 7, a, 99));
    }

    #[test]
    fn a_client_stops_before_the_end() {
        let key =
            farside_rmem::ClientKey::new(farside_auth::mac::KeyId(5), SipKey::from_halves(3, 4));
        let now = Instant::now();
        let g = Grant {
            id: GRANT_ID_BASE,
            expires_ns: 1,
            ttl_ms: 10_000,
        };
        let c = ClientGrant::new(&key, g, Ipv4Addr::LOCALHOST, 7300, now);
        assert!(c.live(now + Duration::from_secs(8)));
        assert!(!c.live(now + Duration::from_secs(9)));
        assert_eq!(c.key.id.0, GRANT_ID_BASE);
    }
}
