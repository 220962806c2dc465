//! The paper's blind, weighted routing: the weight table the loader fills from the
//! back-ends' weights, and the 4-tuple hash the program indexes it with (the same
//! function as `flow_hash` in `bpf/frontend.bpf.c`; the packet tests check that a
//! flow lands where [`backend_for`] says).
//!
//! The table is Maglev's ([`fill_table`]): a prime number of slots, each back-end
//! claiming slots along its own fixed permutation in turns weighted by its weight, so
//! a weight change moves few flows.
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

/// Keys of the fixed hashes that give a back-end its Maglev permutation: public (they
/// only decide where a back-end's preferences start), fixed so that the same back-ends
/// and weights always make the same table (a restarted front-end routes as before).
const PERM_OFFSET_KEY: SipKey = SipKey::from_halves(0x6661_7273_6964_652d, 0x6d61_676c_6576_2d6f);
const PERM_SKIP_KEY: SipKey = SipKey::from_halves(0x6661_7273_6964_652d, 0x6d61_676c_6576_2d73);

/// Whether `n` is prime (the table size must be, for every skip to visit every slot).
pub fn is_prime(n: usize) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| n % d != 0)
}

/// The weight table, Maglev-style (Eisenbud et al., NSDI 2016, with weights as
/// Katran does): `slots` (a prime) entries naming a back-end index, each back-end
/// appearing exactly as often as [`apportion`] says. Back-end `i` (named by `ids[i]`,
/// its address) prefers the slots `offset_i, offset_i + skip_i, ...` (mod `slots`), a
/// permutation fixed by its id alone; back-ends take turns in proportion to their
/// weights, each claiming its next preferred free slot, until each has its share. So
/// a weight change (or a back-end added or removed) moves few slots: each back-end
/// keeps mostly the same preferred slots, where a round-robin fill reshuffles them.
pub fn fill_table(ids: &[u64], weights: &[u32], slots: usize) -> Result<Vec<u32>, String> {
    if ids.len() != weights.len() {
        return Err(format!("{} ids for {} weights", ids.len(), weights.len()));
    }
    if !is_prime(slots) {
        return Err(format!(
            "{slots} slots: the Maglev table size must be prime"
        ));
    }
    let mut quota = apportion(weights, slots)?;
    let perm: Vec<(usize, usize)> = ids
        .iter()
        .map(|id| {
            let b = id.to_le_bytes();
            let offset = siphash24(&PERM_OFFSET_KEY, &b) as usize % slots;
            let skip = siphash24(&PERM_SKIP_KEY, &b) as usize % (slots - 1) + 1;
            (offset, skip)
        })
        .collect();
    let w_max = u64::from(*weights.iter().max().expect("apportion refused none"));
    let mut next = vec![0usize; ids.len()];
    // Turn credit per back-end: w_i / w_max per round, in units of w_max.
    let mut credit = vec![0u64; ids.len()];
    let mut table = vec![u32::MAX; slots];
    let mut left = slots;
    while left > 0 {
        for i in 0..ids.len() {
            if quota[i] == 0 {
                continue;
            }
            credit[i] += u64::from(weights[i]);
            while credit[i] >= w_max && quota[i] > 0 {
                credit[i] -= w_max;
                // Every skip is below the prime `slots`: the walk visits every slot,
                // and a free one exists while `left` > 0.
                loop {
                    let c = (perm[i].0 + next[i] * perm[i].1) % slots;
                    next[i] += 1;
                    if table[c] == u32::MAX {
                        table[c] = i as u32;
                        quota[i] -= 1;
                        left -= 1;
                        break;
                    }
                }
            }
        }
    }
    Ok(table)
}

/// Fraction of slots two tables assign differently: the share of new flows a change
/// from `a` to `b` sends elsewhere.
pub fn moved_fraction(a: &[u32], b: &[u32]) -> f64 {
    let moved = a.iter().zip(b).filter(|(x, y)| x != y).count();
    moved as f64 / a.len().max(1) as f64
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

    /// Back-end ids as the loader gives them: their addresses.
    fn ids(n: usize) -> Vec<u64> {
        (0..n as u64).map(|i| 0x0a00_000b + i).collect()
    }

    #[test]
    fn the_table_size_is_prime() {
        assert!(is_prime(SLOTS), "{SLOTS}");
        assert!(!is_prime(1024) && is_prime(16_381) && !is_prime(1) && is_prime(2));
        assert!(fill_table(&ids(2), &[1, 1], 1024)
            .unwrap_err()
            .contains("prime"));
    }

    #[test]
    fn weights_75_25_fill_three_quarters_and_one_quarter() {
        let t = fill_table(&ids(2), &[75, 25], SLOTS).unwrap();
        assert_eq!(t.len(), SLOTS);
        assert_eq!(counts_in(&t, 2), apportion(&[75, 25], SLOTS).unwrap());
        // 16,381 x 0.75 = 12,285.75: the largest remainder rounds up.
        assert_eq!(counts_in(&t, 2), vec![12_286, 4_095]);
    }

    #[test]
    fn weights_67_33_round_by_largest_remainder() {
        // 686.08 and 337.92 slots of 1,024: the one left over goes to the larger remainder.
        assert_eq!(apportion(&[67, 33], 1024).unwrap(), vec![686, 338]);
        let t = fill_table(&ids(2), &[67, 33], SLOTS).unwrap();
        assert_eq!(counts_in(&t, 2), apportion(&[67, 33], SLOTS).unwrap());
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
            let t = fill_table(&ids(weights.len()), &weights, SLOTS).unwrap();
            assert_eq!(counts_in(&t, weights.len()), c, "{weights:?}");
        }
    }

    #[test]
    fn a_zero_weight_gets_no_slot() {
        let t = fill_table(&ids(3), &[1, 0, 1], SLOTS).unwrap();
        let c = counts_in(&t, 3);
        assert_eq!(c[1], 0);
        assert_eq!(c[0] + c[2], SLOTS);
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(fill_table(&[], &[], SLOTS).is_err());
        assert!(fill_table(&ids(2), &[0, 0], SLOTS)
            .unwrap_err()
            .contains("every weight is 0"));
        assert!(
            fill_table(&ids(BACKENDS_MAX + 1), &vec![1; BACKENDS_MAX + 1], SLOTS)
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn the_table_depends_only_on_the_backends_and_weights() {
        let a = fill_table(&ids(3), &[5, 3, 2], SLOTS).unwrap();
        assert_eq!(a, fill_table(&ids(3), &[5, 3, 2], SLOTS).unwrap());
    }

    /// The round-robin table the front-end filled before Maglev: each back-end's
    /// share interleaved by smooth weighted round-robin (the reference a weight
    /// change is measured against).
    fn round_robin_table(weights: &[u32], slots: usize) -> Vec<u32> {
        let counts = apportion(weights, slots).unwrap();
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
        table
    }

    /// The least share of new flows a change of weights must move: the shares that
    /// changed hands.
    fn ideal_moved(before: &[u32], after: &[u32]) -> f64 {
        let share = |w: &[u32]| {
            let t: f64 = w.iter().map(|&x| f64::from(x)).sum();
            w.iter().map(|&x| f64::from(x) / t).collect::<Vec<_>>()
        };
        let (a, b) = (share(before), share(after));
        a.iter().zip(&b).map(|(x, y)| (x - y).max(0.0)).sum()
    }

    /// The measurement: the share of new flows a weight change sends to another
    /// back-end, Maglev against the round-robin table, for the changes the front-end
    /// sees (the paper's 75/25 and 67/33, a back-end drained, one added at weight 0
    /// then raised). Maglev stays within a small factor of the least possible; the
    /// round-robin fill moves most flows.
    #[test]
    fn a_weight_change_moves_few_flows_with_maglev_and_most_with_round_robin() {
        let cases: [(&str, Vec<u32>, Vec<u32>); 5] = [
            ("75/25 -> 67/33", vec![75, 25], vec![67, 33]),
            ("67/33 -> 75/25", vec![67, 33], vec![75, 25]),
            ("1/1/1 -> 1/1/0 (drain)", vec![1, 1, 1], vec![1, 1, 0]),
            ("1/1/0 -> 1/1/1 (add)", vec![1, 1, 0], vec![1, 1, 1]),
            ("4 x 10 -> one 12", vec![10; 4], vec![10, 10, 10, 12]),
        ];
        for (what, before, after) in cases {
            let n = before.len();
            let maglev = moved_fraction(
                &fill_table(&ids(n), &before, SLOTS).unwrap(),
                &fill_table(&ids(n), &after, SLOTS).unwrap(),
            );
            let rr = moved_fraction(
                &round_robin_table(&before, SLOTS),
                &round_robin_table(&after, SLOTS),
            );
            let ideal = ideal_moved(&before, &after);
            eprintln!(
                "{what}: flows moved: least possible {:.1} %, Maglev {:.1} %, round-robin {:.1} %",
                ideal * 100.0,
                maglev * 100.0,
                rr * 100.0
            );
            assert!(maglev >= ideal - 1e-3, "{what}: below the least possible?");
            assert!(
                maglev <= 2.0 * ideal + 0.02,
                "{what}: Maglev moved {maglev}"
            );
            assert!(maglev < rr, "{what}: Maglev {maglev} vs round-robin {rr}");
        }
    }

    #[test]
    fn hashed_flows_follow_the_weights() {
        // 100,000 clients over a /16 and ephemeral ports: within 1 % of 75/25.
        let t = fill_table(&ids(2), &[75, 25], SLOTS).unwrap();
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
