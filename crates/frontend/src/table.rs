//! The paper's blind, weighted routing: the weight table the loader fills from the
//! back-ends' weights, and the 4-tuple hash the program indexes it with (the same
//! function as `flow_hash` in `bpf/frontend.bpf.c`; the packet tests check that a
//! flow lands where [`backend_for`] says).
//!
//! The hash is SipHash-2-4 under a secret key ([`HashKey`], drawn from getrandom when
//! the front-end starts): with a public seed anyone could choose 4-tuples that all
//! land on one back-end, or predict where a victim's flow goes.

use std::net::SocketAddrV4;

use farside_auth::siphash::{siphash24, SipKey};

use crate::maps::{BACKENDS_MAX, SLOTS};

/// The flow hash's secret key.
pub type HashKey = SipKey;

/// A fresh flow-hash key from the kernel's random source (getrandom).
pub fn random_hash_key() -> std::io::Result<HashKey> {
    let mut b = [0u8; 16];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(SipKey::from_bytes(b))
}

/// Hash of a flow's 4-tuple (client, VIP) under `key`, as the program computes it:
/// SipHash-2-4 of client address, VIP address, (client port << 16 | VIP port), each
/// a host-order u32 written little-endian, truncated to 32 bits.
pub fn flow_hash(key: &HashKey, client: SocketAddrV4, vip: SocketAddrV4) -> u32 {
    let mut m = [0u8; 12];
    m[0..4].copy_from_slice(&u32::from(*client.ip()).to_le_bytes());
    m[4..8].copy_from_slice(&u32::from(*vip.ip()).to_le_bytes());
    m[8..12]
        .copy_from_slice(&((u32::from(client.port()) << 16) | u32::from(vip.port())).to_le_bytes());
    siphash24(key, &m) as u32
}

/// The weight-table slot of a flow.
pub fn slot_of(key: &HashKey, client: SocketAddrV4, vip: SocketAddrV4) -> usize {
    flow_hash(key, client, vip) as usize % SLOTS
}

/// The back-end index a new flow gets from `table` (as the program decides on a miss).
pub fn backend_for(table: &[u32], key: &HashKey, client: SocketAddrV4, vip: SocketAddrV4) -> u32 {
    table[slot_of(key, client, vip)]
}

/// Slots per back-end for `weights` out of `slots`: largest-remainder apportionment
/// (each back-end gets ⌊w·slots/Σw⌋, the slots left go to the largest remainders,
/// ties to the lower index). Errors: no back-end, more than [`BACKENDS_MAX`], or
/// every weight 0.
pub fn apportion(weights: &[u32], slots: usize) -> Result<Vec<usize>, String> {
    if weights.is_empty() {
        return Err("no back-end".into());
    }
    if weights.len() > BACKENDS_MAX {
        return Err(format!(
            "{} back-ends, at most {BACKENDS_MAX}",
            weights.len()
        ));
    }
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return Err("every weight is 0 (no back-end would get a flow)".into());
    }
    let slots_u = slots as u64;
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|&w| (u64::from(w) * slots_u / total) as usize)
        .collect();
    let mut rest: Vec<(u64, usize)> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| (u64::from(w) * slots_u % total, i))
        .collect();
    // Largest remainder first, lower index first among equals.
    rest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let left = slots - counts.iter().sum::<usize>();
    for &(_, i) in rest.iter().take(left) {
        counts[i] += 1;
    }
    Ok(counts)
}

/// The weight table: `slots` entries naming a back-end index, each back-end appearing
/// exactly as often as [`apportion`] says, interleaved by smooth weighted round-robin
/// (no long runs of one back-end, so the table stays balanced even if the hash were
/// not uniform over slot ranges).
pub fn fill_table(weights: &[u32], slots: usize) -> Result<Vec<u32>, String> {
    let counts = apportion(weights, slots)?;
    let mut current = vec![0i64; counts.len()];
    let mut table = Vec::with_capacity(slots);
    for _ in 0..slots {
        let mut best = 0;
        for (i, c) in counts.iter().enumerate() {
            current[i] += *c as i64;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= slots as i64;
        table.push(best as u32);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const KEY: HashKey = SipKey::from_halves(0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);

    fn counts_in(table: &[u32], n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for &b in table {
            c[b as usize] += 1;
        }
        c
    }

    #[test]
    fn weights_75_25_fill_three_quarters_and_one_quarter() {
        let t = fill_table(&[75, 25], SLOTS).unwrap();
        assert_eq!(t.len(), SLOTS);
        assert_eq!(counts_in(&t, 2), vec![768, 256]);
    }

    #[test]
    fn weights_67_33_round_by_largest_remainder() {
        // 686.08 and 337.92 slots: the one left over goes to the larger remainder.
        assert_eq!(apportion(&[67, 33], SLOTS).unwrap(), vec![686, 338]);
        let t = fill_table(&[67, 33], SLOTS).unwrap();
        assert_eq!(counts_in(&t, 2), vec![686, 338]);
    }

    #[test]
    fn apportionment_sums_to_the_slots_and_stays_within_one_of_exact() {
        for weights in [
            vec![1, 1, 1],
            vec![3, 7, 11, 13],
            vec![1; 64],
            vec![100, 0, 1],
            vec![u32::MAX, 1],
        ] {
            let c = apportion(&weights, SLOTS).unwrap();
            assert_eq!(c.iter().sum::<usize>(), SLOTS, "{weights:?}");
            let total: f64 = weights.iter().map(|&w| w as f64).sum();
            for (i, &w) in weights.iter().enumerate() {
                let exact = w as f64 * SLOTS as f64 / total;
                assert!((c[i] as f64 - exact).abs() < 1.0, "{weights:?}[{i}]");
            }
        }
    }

    #[test]
    fn a_zero_weight_gets_no_slot() {
        let t = fill_table(&[1, 0, 1], SLOTS).unwrap();
        assert_eq!(counts_in(&t, 3), vec![512, 0, 512]);
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(fill_table(&[], SLOTS).is_err());
        assert!(fill_table(&[0, 0], SLOTS)
            .unwrap_err()
            .contains("every weight is 0"));
        assert!(fill_table(&vec![1; BACKENDS_MAX + 1], SLOTS)
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn table_is_interleaved() {
        // 75/25: never more than three slots of back-end 0 in a row.
        let t = fill_table(&[75, 25], SLOTS).unwrap();
        let longest = t
            .chunk_by(|a, b| a == b)
            .filter(|r| r[0] == 0)
            .map(|r| r.len())
            .max()
            .unwrap();
        assert!(longest <= 3, "run of {longest}");
    }

    #[test]
    fn hashed_flows_follow_the_weights() {
        // 100,000 clients over a /16 and ephemeral ports: within 1 % of 75/25.
        let t = fill_table(&[75, 25], SLOTS).unwrap();
        let vip = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 100), 80);
        let mut c = [0u32; 2];
        for i in 0..100_000u32 {
            let ip = Ipv4Addr::from(0x0a01_0000 | (i % 65_536));
            let port = 32_768 + (i.wrapping_mul(7919) % 28_000) as u16;
            c[backend_for(&t, &KEY, SocketAddrV4::new(ip, port), vip) as usize] += 1;
        }
        let share = f64::from(c[0]) / 100_000.0;
        assert!((share - 0.75).abs() < 0.01, "share {share}");
    }

    #[test]
    fn hash_depends_on_every_field_and_on_the_key() {
        let c = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40_000);
        let v = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 100), 80);
        let h = flow_hash(&KEY, c, v);
        assert_ne!(h, flow_hash(&KEY, SocketAddrV4::new(*c.ip(), 40_001), v));
        assert_ne!(
            h,
            flow_hash(
                &KEY,
                SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 40_000),
                v
            )
        );
        assert_ne!(h, flow_hash(&KEY, c, SocketAddrV4::new(*v.ip(), 81)));
        assert_ne!(
            h,
            flow_hash(&KEY, c, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 101), 80))
        );
        let other = SipKey::from_halves(1, 2);
        assert_ne!(h, flow_hash(&other, c, v));
    }

    #[test]
    fn the_hash_is_siphash_of_the_documented_bytes() {
        // Addresses and ports chosen so the 12 bytes are 00..0b: the low 32 bits of
        // SipHash-2-4 of them (the paper's 12-byte vector under this key).
        let c = SocketAddrV4::new(Ipv4Addr::from(0x0302_0100), 0x0b0a);
        let v = SocketAddrV4::new(Ipv4Addr::from(0x0706_0504), 0x0908);
        let want = siphash24(&KEY, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]) as u32;
        assert_eq!(flow_hash(&KEY, c, v), want);
    }

    #[test]
    fn random_keys_differ() {
        let a = random_hash_key().unwrap();
        let b = random_hash_key().unwrap();
        assert_ne!(a, b);
    }
}
