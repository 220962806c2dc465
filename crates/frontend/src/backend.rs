//! The back-ends a front-end routes to, as the command line and the control port
//! write them: `MAC@IP=WEIGHT` specs, MAC text, the `WEIGHTS` argument, and the checks
//! a set of back-ends must pass before it is loaded.

use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::maps::SLOTS;
use crate::table;

/// One back-end: where frames for it go (its MAC on the LAN), its address (to name
/// it in `MOVE` and `WEIGHTS`) and its routing weight. Parsed from `MAC@IP=WEIGHT`,
/// e.g. `02:00:00:00:00:0b@10.0.0.11=75`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendSpec {
    /// The back-end's MAC on the front-end's LAN.
    pub mac: [u8; 6],
    /// The back-end's own address (not the VIP): its name here.
    pub ip: Ipv4Addr,
    /// Relative share of new flows (0 = none).
    pub weight: u32,
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{s:?}: a MAC is six hex bytes, aa:bb:cc:dd:ee:ff"));
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(&parts) {
        if p.len() != 2 {
            return Err(format!("{s:?}: a MAC is six hex bytes, aa:bb:cc:dd:ee:ff"));
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?}: {p:?} is not a hex byte"))?;
    }
    if mac[0] & 1 == 1 || mac == [0; 6] {
        return Err(format!("{s:?}: not a unicast MAC"));
    }
    Ok(mac)
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl FromStr for BackendSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            || format!("{s:?}: a back-end is MAC@IP=WEIGHT, e.g. 02:00:00:00:00:0b@10.0.0.11=75");
        let (mac, rest) = s.split_once('@').ok_or_else(usage)?;
        let (ip, weight) = rest.split_once('=').ok_or_else(usage)?;
        Ok(BackendSpec {
            mac: parse_mac(mac)?,
            ip: ip
                .parse()
                .map_err(|_| format!("{s:?}: {ip:?} is not an IPv4 address"))?,
            weight: weight
                .parse()
                .map_err(|_| format!("{s:?}: weight {weight:?} is not a whole number"))?,
        })
    }
}

/// Parse `a=67,b=33` where each name is a back-end's IP: the `WEIGHTS` argument.
pub fn parse_weights(s: &str) -> Result<Vec<(Ipv4Addr, u32)>, String> {
    s.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?}: expected BACKEND_IP=WEIGHT"))?;
            Ok((
                k.trim()
                    .parse()
                    .map_err(|_| format!("{k:?} is not a back-end IPv4 address"))?,
                v.trim()
                    .parse()
                    .map_err(|_| format!("{v:?} is not a whole-number weight"))?,
            ))
        })
        .collect()
}

/// Check a set of back-ends: 1..=[`BACKENDS_MAX`](crate::BACKENDS_MAX), distinct IPs and MACs, weights
/// not all 0.
pub fn validate_backends(backends: &[BackendSpec]) -> Result<(), String> {
    let weights: Vec<u32> = backends.iter().map(|b| b.weight).collect();
    table::apportion(&weights, SLOTS).map_err(|e| format!("back-ends: {e}"))?;
    for (i, a) in backends.iter().enumerate() {
        for b in &backends[..i] {
            if a.ip == b.ip {
                return Err(format!("back-end {} given twice", a.ip));
            }
            if a.mac == b.mac {
                return Err(format!("MAC {} given twice", format_mac(&a.mac)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_specs_parse_and_errors_are_clear() {
        let b: BackendSpec = "02:00:00:00:00:0b@10.0.0.11=75".parse().unwrap();
        assert_eq!(b.mac, [2, 0, 0, 0, 0, 0x0b]);
        assert_eq!(b.ip, Ipv4Addr::new(10, 0, 0, 11));
        assert_eq!(b.weight, 75);
        for (bad, says) in [
            ("10.0.0.11=75", "MAC@IP=WEIGHT"),
            ("02:00:00:00:00:0b@10.0.0.11", "MAC@IP=WEIGHT"),
            ("02:00:00:00:0b@10.0.0.11=1", "six hex bytes"),
            ("02:00:00:00:00:zz@10.0.0.11=1", "not a hex byte"),
            ("01:00:00:00:00:0b@10.0.0.11=1", "unicast"),
            ("02:00:00:00:00:0b@10.0.0=1", "not an IPv4"),
            ("02:00:00:00:00:0b@10.0.0.11=-1", "whole number"),
        ] {
            let e = bad.parse::<BackendSpec>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn backend_sets_are_validated() {
        let a: BackendSpec = "02:00:00:00:00:0a@10.0.0.10=1".parse().unwrap();
        let b: BackendSpec = "02:00:00:00:00:0b@10.0.0.11=1".parse().unwrap();
        assert!(validate_backends(&[a, b]).is_ok());
        assert!(validate_backends(&[a, a]).unwrap_err().contains("twice"));
        let mut c = b;
        c.ip = Ipv4Addr::new(10, 0, 0, 12);
        c.mac = a.mac;
        assert!(validate_backends(&[a, c]).unwrap_err().contains("MAC"));
        let zero = BackendSpec { weight: 0, ..a };
        assert!(validate_backends(&[zero])
            .unwrap_err()
            .contains("every weight is 0"));
        assert!(validate_backends(&[]).unwrap_err().contains("no back-end"));
    }

    #[test]
    fn weights_argument_parses() {
        assert_eq!(
            parse_weights("10.0.0.10=67,10.0.0.11=33").unwrap(),
            vec![
                (Ipv4Addr::new(10, 0, 0, 10), 67),
                (Ipv4Addr::new(10, 0, 0, 11), 33)
            ]
        );
        assert!(parse_weights("a=67").unwrap_err().contains("IPv4"));
        assert!(parse_weights("10.0.0.10")
            .unwrap_err()
            .contains("BACKEND_IP=WEIGHT"));
        assert!(parse_weights("10.0.0.10=x").unwrap_err().contains("weight"));
    }
}
