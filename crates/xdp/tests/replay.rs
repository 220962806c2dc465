//! The program's replay windows through BPF_PROG_TEST_RUN (root): past the map's
//! capacity new senders are still accepted and no recorded request is accepted twice
//! (evicted senders' included); a program loaded afresh (a gatherd restart) with the
//! restart floor of `farside_auth::floor` refuses requests recorded by the previous
//! one; the ceiling refuses what is too far ahead; keys replaced in place revoke at
//! once.

mod common;

use common::*;
use farside_auth::floor::{self, FloorFile, Limits};
use farside_auth::replay::Sequencer;
use farside_rmem::wire;
use farside_rmem::ClientKey;
use farside_xdp::{action, TestProgram, REPLAY_BUCKETS, REPLAY_SENDERS_MAX, REPLAY_WAYS};
use std::collections::HashMap;

const PORT: u16 = 7078;
/// A wall-clock second well within the sequences' range.
const T: u64 = 1_800_000_000;

/// A padded READ of word 0 sealed under `key` by `sender` with envelope seq `seq`.
fn read(key: &ClientKey, sender: u64, seq: u64) -> Vec<u8> {
    let mut b = Vec::new();
    farside_rmem::auth::seal_request(&mut b, key, sender, seq, &covered(1, 0, 1, 0, 0, 8, &[]));
    b.resize(wire::ENVELOPE_BYTES + wire::REP_HEADER_BYTES + 8, 0);
    frame(Shape::to_port(PORT), &b)
}

/// The bucket the program files (key id, sender) under (`replay_bucket` in
/// bpf/rmem.bpf.c), to know which senders share one.
fn bucket(key_id: u32, sender: u64) -> usize {
    let k = u64::from(key_id);
    let h = (sender ^ ((k << 32) | k)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 32) as usize) & (REPLAY_BUCKETS - 1)
}

/// 1.5 times the map's capacity of senders, each sending one request (all accepted,
/// never refused for want of room), some buckets overflowing; then every request
/// replayed: all refused, those of evicted senders included. Evicted senders sending
/// anew (newer sequences) are accepted.
#[test]
fn past_capacity_new_senders_are_accepted_and_no_replay_is() {
    if !need_root("past_capacity_new_senders_are_accepted_and_no_replay_is") {
        return;
    }
    let prog = TestProgram::load(PORT, &keyring()).expect("load");
    let key = &keys().ro;
    let senders = REPLAY_SENDERS_MAX * 3 / 2;
    let mut sent = Vec::new();
    let mut per_bucket: HashMap<usize, usize> = HashMap::new();
    for i in 0..senders {
        let sender = 0x1000 + i as u64 * 7919;
        // Sequences rise with time: a later sender's are above an earlier one's.
        let seq = floor::clock_seq(T) + i as u64;
        let f = read(key, sender, seq);
        assert_eq!(prog.run(&f).0, action::TX, "sender {i} refused");
        *per_bucket.entry(bucket(key.id.0, sender)).or_default() += 1;
        sent.push((sender, seq, f));
    }
    let evicted: usize = per_bucket
        .values()
        .map(|&n| n.saturating_sub(REPLAY_WAYS))
        .sum();
    assert!(
        evicted > 500,
        "only {evicted} evictions: the test proves little"
    );
    for (i, (_, _, f)) in sent.iter().enumerate() {
        assert_eq!(prog.run(f).0, action::DROP, "replay of sender {i} accepted");
    }
    // The first senders (evicted where their bucket overflowed) send on: accepted.
    for (i, (sender, seq, _)) in sent.iter().take(64).enumerate() {
        let f = read(key, *sender, seq + senders as u64 + 1);
        assert_eq!(
            prog.run(&f).0,
            action::TX,
            "sender {i}'s new request refused"
        );
    }
}

/// Senders sharing one bucket, sending in turns with rising sequences and replaying
/// at random: each (sender, seq) is answered at most once, and every fresh request is
/// answered (the bucket's floor is the lowest top evicted, below every sender's next).
#[test]
fn within_one_bucket_churn_never_accepts_a_request_twice() {
    if !need_root("within_one_bucket_churn_never_accepts_a_request_twice") {
        return;
    }
    let prog = TestProgram::load(PORT, &keyring()).expect("load");
    let key = &keys().bal;
    let target = bucket(key.id.0, 1);
    let senders: Vec<u64> = (1u64..)
        .filter(|&s| bucket(key.id.0, s) == target)
        .take(3 * REPLAY_WAYS)
        .collect();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seq = floor::clock_seq(T);
    let mut sent: Vec<(u64, u64)> = Vec::new();
    let mut answered = std::collections::HashSet::new();
    for step in 0..3000 {
        let (sender, s, fresh) = if !sent.is_empty() && next() % 3 == 0 {
            let (a, b) = sent[(next() % sent.len() as u64) as usize];
            (a, b, false)
        } else {
            seq += 1 + next() % 3;
            let s = senders[(next() % senders.len() as u64) as usize];
            sent.push((s, seq));
            (s, seq, true)
        };
        let v = prog.run(&read(key, sender, s)).0;
        if fresh {
            assert_eq!(v, action::TX, "step {step}: a fresh request refused");
        }
        if v == action::TX {
            assert!(
                answered.insert((sender, s)),
                "step {step}: {sender} {s} twice"
            );
        }
    }
}

/// The restart: a request answered by one program, the program replaced by a fresh
/// one (what a gatherd restart does: new maps, empty windows) that starts with the
/// floor of the same replay state file: the recorded request is refused, the sender's
/// newer requests are answered once its clock passes the floor.
#[test]
fn a_request_recorded_before_a_restart_is_refused_after_it() {
    if !need_root("a_request_recorded_before_a_restart_is_refused_after_it") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("farside-xdp-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = dir.join("replay.state");
    let key = &keys().bal;
    let mut seq = Sequencer::new();
    let start = |now: u64| {
        let (f, limits) = FloorFile::open(&state, now).unwrap();
        let p = TestProgram::load(PORT, &keyring()).expect("load");
        p.set_replay_limits(limits).unwrap();
        (f, p)
    };
    let (mut file, before) = start(T);
    let mut captured = Vec::new();
    for now in T..T + 3 {
        if let Some(c) = file.extend(now).unwrap() {
            before
                .set_replay_limits(Limits {
                    floor: 0,
                    ceiling: c,
                })
                .unwrap();
        }
        let f = read(key, 0x77, seq.next(now).unwrap());
        assert_eq!(before.run(&f).0, action::TX);
        assert_eq!(before.run(&f).0, action::DROP, "a plain copy");
        captured.push(f);
    }
    drop((file, before));
    let (mut file, after) = start(T + 2);
    for (i, f) in captured.iter().enumerate() {
        assert_eq!(
            after.run(f).0,
            action::DROP,
            "capture {i} replayed after the restart"
        );
    }
    // The clock moves on; the keeper's tick persists and raises the ceiling.
    let later = T + 3 + floor::CEILING_LEASE_S;
    let c = file.extend(later).unwrap().expect("a higher ceiling");
    after
        .set_replay_limits(Limits {
            floor: 0,
            ceiling: c,
        })
        .unwrap();
    let fresh = read(key, 0x77, seq.next(later).unwrap());
    assert_eq!(after.run(&fresh).0, action::TX, "the sender's new request");
    // Without the floor (the old behaviour), the same capture would have been answered.
    let unprotected = TestProgram::load(PORT, &keyring()).expect("load");
    assert_eq!(unprotected.run(&captured[0]).0, action::TX);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The ceiling: a request above it is refused and takes no window slot; raised past
/// it, the request is answered once.
#[test]
fn the_ceiling_refuses_requests_too_far_ahead() {
    if !need_root("the_ceiling_refuses_requests_too_far_ahead") {
        return;
    }
    let p = TestProgram::load(PORT, &keyring()).expect("load");
    p.set_replay_limits(Limits::after(None, T)).unwrap();
    let ahead = read(&keys().ro, 0x99, floor::ceiling_at(T) + 1);
    assert_eq!(p.run(&ahead).0, action::DROP);
    let ok = read(&keys().ro, 0x99, floor::ceiling_at(T));
    assert_eq!(p.run(&ok).0, action::TX);
    p.set_replay_limits(Limits {
        floor: 0,
        ceiling: floor::ceiling_at(T + 1),
    })
    .unwrap();
    assert_eq!(p.run(&ahead).0, action::TX);
    assert_eq!(p.run(&ahead).0, action::DROP);
    // Limits only rise: a lower ceiling changes nothing.
    p.set_replay_limits(Limits {
        floor: 0,
        ceiling: floor::ceiling_at(T - 5),
    })
    .unwrap();
    let next = read(&keys().ro, 0x99, floor::ceiling_at(T) + 2);
    assert_eq!(p.run(&next).0, action::TX);
}

/// Keys replaced in place (a reload): a key id no longer in the ring is refused at
/// once, a new one answered, the unchanged ones keep working; nothing is reloaded.
#[test]
fn keys_replaced_in_place_revoke_and_add_at_once() {
    if !need_root("keys_replaced_in_place_revoke_and_add_at_once") {
        return;
    }
    let p = TestProgram::load(PORT, &keyring()).expect("load");
    let k = keys();
    let mut seq = floor::clock_seq(T);
    let mut run = |p: &TestProgram, key: &ClientKey| {
        seq += 1;
        p.run(&read(key, 0x42, seq)).0
    };
    assert_eq!(run(&p, &k.bal), action::TX);
    assert_eq!(run(&p, &k.stranger), action::DROP, "not installed yet");
    // The new ring: the balancer's key rotated to the stranger's id, the reader kept.
    let mut ring = farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production);
    ring.install(
        "reader",
        k.ro.id,
        *k.ro.key(),
        farside_rmem::Role::Reader.rights(),
    )
    .unwrap();
    ring.install(
        "balancer",
        k.stranger.id,
        *k.stranger.key(),
        farside_rmem::Role::Balancer.rights(),
    )
    .unwrap();
    let mut gone = p.set_keys(&ring).unwrap();
    gone.sort_unstable();
    assert_eq!(gone, vec![k.bal.id.0, k.rw.id.0]);
    assert_eq!(run(&p, &k.bal), action::DROP, "revoked");
    assert_eq!(run(&p, &k.rw), action::DROP, "revoked");
    assert_eq!(run(&p, &k.stranger), action::TX, "the new key");
    assert_eq!(run(&p, &k.ro), action::TX, "the kept key");
}
