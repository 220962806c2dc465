//! Arena READs through BPF_PROG_TEST_RUN: objects written into the mapped arena map with
//! `farside_arena`'s seqlock writer are read back one chunk per request and validated;
//! every refusal (wrong key, a mutation, a READ across a chunk, beyond the map or the
//! declared bound, unaligned, unpadded) answers its status and touches nothing. Bulk
//! READs (`FLAG_BULK`) span chunks, their replies tag the header only, and refuse what
//! a bulk READ may not do.

mod common;

use common::*;
use farside_arena::layout::{
    ArenaLayout, ARENA_CHUNKS_MAX, ARENA_REGION, BULK_READ_BYTES_MAX, CHUNK_BYTES, CLASS_COUNT,
    FLAG_BULK,
};
use farside_arena::{map_chunks, ArenaMap, ObjectRead, SLOTS_BASE};
use farside_rmem::wire::{self, RepHeader, Status, ENVELOPE_BYTES};
use farside_rmem::ClientKey;
use farside_xdp::{action, TestProgram};

const PORT: u16 = 7078;

/// An arena reader key (id 7) besides the common keyring's.
fn arena_key() -> ClientKey {
    static K: std::sync::OnceLock<ClientKey> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let set = farside_rmem::LabKeyset::generate();
        ClientKey::new(farside_auth::mac::KeyId(7), *set.reader.key())
    })
}

fn keyring_with_arena() -> farside_auth::keys::Keyring {
    let mut r = keyring();
    let k = arena_key();
    r.install(
        "arena-reader",
        k.id,
        *k.key(),
        farside_auth::rights::Rights::reader(ARENA_REGION),
    )
    .unwrap();
    r
}

/// A sealed arena request, padded to the reply of `len` bytes unless `unpadded`.
fn arena_req(key: &ClientKey, op: u8, region: u32, offset: u32, len: u32, pad: bool) -> Vec<u8> {
    static OP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let seq = OP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let payload = if op == 2 {
        vec![0xaa; len as usize]
    } else {
        vec![]
    };
    let mut b = seal(
        key,
        0x5e,
        &covered(op, 0, seq, region, offset, len, &payload),
    );
    if pad {
        let n = ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len as usize;
        b.resize(b.len().max(n), 0);
    }
    b
}

/// Runs a request; the reply's status and payload (panics on a non-TX verdict).
fn ask(prog: &TestProgram, key: &ClientKey, req: &[u8]) -> (Status, Vec<u8>) {
    let f = frame(Shape::to_port(PORT), req);
    let (act, out) = prog.run(&f);
    assert_eq!(act, action::TX, "answered in the kernel");
    let payload = check_reply("arena", &f, &out, PORT);
    let covered = farside_rmem::auth::open_reply(&payload, key, 0x5e, 1..=u64::MAX)
        .expect("sealed under the request's key")
        .to_vec();
    let h = RepHeader::decode(&covered).unwrap();
    (h.status, covered[wire::REP_HEADER_BYTES..].to_vec())
}

fn layout() -> ArenaLayout {
    let mut c = [0; CLASS_COUNT];
    c[0] = 4;
    c[4] = 1;
    ArenaLayout::new(c).unwrap()
}

#[test]
fn objects_written_into_the_map_are_read_back_chunk_by_chunk() {
    if !need_root("objects_written_into_the_map_are_read_back_chunk_by_chunk") {
        return;
    }
    let layout = layout();
    let chunks = map_chunks(&layout).unwrap();
    let prog = TestProgram::load_with_arena(PORT, &keyring_with_arena(), chunks as u32)
        .expect("load with an arena");
    let mut arena = ArenaMap::new(layout.clone()).unwrap();
    let body: Vec<u8> = (0..20_000u32).map(|i| (i * 31 + 7) as u8).collect();
    let hash = farside_arena::url_hash(b"/object");
    let bucket = {
        let mem = prog.arena();
        let mut mem = mem.lock().unwrap();
        assert_eq!(mem.chunks(), chunks);
        arena.put(mem.bytes_mut(), hash, &body).unwrap()
    };
    let key = arena_key();
    let mut r = ObjectRead::new(&layout, hash, bucket.offset as usize, bucket.len as usize)
        .expect("a slot");
    for (i, (o, l)) in r.plan().into_iter().enumerate() {
        for (co, cl) in farside_arena::chunk_reads(SLOTS_BASE + o, l) {
            let (st, bytes) = ask(
                &prog,
                &key,
                &arena_req(&key, 1, ARENA_REGION, co as u32, cl as u32, true),
            );
            assert_eq!(st, Status::Ok, "READ {co}+{cl}");
            assert_eq!(bytes.len(), cl);
            // The plan's READs are chunk-aligned within slots that are, so one each.
            assert_eq!(cl, l, "plan READ {i} within one chunk");
            r.feed_at(i, &bytes);
        }
    }
    let (version, got) = r.finish().expect("valid object");
    assert_eq!(got, body);
    assert_eq!(version, bucket.version);
    // Every READ answered stamped its chunk once: the owner sees the object was read.
    {
        let mem = prog.arena();
        let mem = mem.lock().unwrap();
        let head = (SLOTS_BASE + bucket.offset as usize) / CHUNK_BYTES;
        assert_eq!(mem.take_reads(head), 1, "the head chunk's READ was stamped");
        assert_eq!(mem.take_reads(head), 0, "taking a stamp resets it");
        assert_eq!(mem.take_reads(0), 0, "a chunk not read has no stamp");
        assert_eq!(mem.take_reads(chunks), 0, "beyond the map: nothing");
    }
    // A rewrite while a reader holds the old plan: the old hint reads as stale.
    {
        let mem = prog.arena();
        let mut mem = mem.lock().unwrap();
        arena.put(mem.bytes_mut(), hash, b"replacement").unwrap();
    }
    r.restart();
    for (i, (o, l)) in r.plan().into_iter().enumerate() {
        let (st, bytes) = ask(
            &prog,
            &key,
            &arena_req(
                &key,
                1,
                ARENA_REGION,
                (SLOTS_BASE + o) as u32,
                l as u32,
                true,
            ),
        );
        assert_eq!(st, Status::Ok);
        r.feed_at(i, &bytes);
    }
    assert!(
        r.finish().is_err(),
        "an evicted slot never yields the old body"
    );
}

#[test]
fn arena_reads_are_refused_outside_their_rights_and_bounds() {
    if !need_root("arena_reads_are_refused_outside_their_rights_and_bounds") {
        return;
    }
    let chunks = 4u32;
    let prog = TestProgram::load_with_arena(PORT, &keyring_with_arena(), chunks).expect("load");
    {
        let mem = prog.arena();
        let mut mem = mem.lock().unwrap();
        mem.bytes_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
    }
    let before = prog.arena().lock().unwrap().bytes_mut().to_vec();
    let a = arena_key();
    let ro = keys().ro;
    let c = CHUNK_BYTES as u32;
    let cases: Vec<(&str, ClientKey, Vec<u8>, Status)> = vec![
        (
            "in bounds",
            a,
            arena_req(&a, 1, ARENA_REGION, c + 8, 64, true),
            Status::Ok,
        ),
        (
            "a whole chunk",
            a,
            arena_req(&a, 1, ARENA_REGION, 3 * c, c, true),
            Status::Ok,
        ),
        (
            "control reader on the arena",
            ro,
            arena_req(&ro, 1, ARENA_REGION, 0, 8, true),
            Status::NoRegion,
        ),
        (
            "arena reader on the control region",
            a,
            arena_req(&a, 1, 0, 0, 8, true),
            Status::NoRegion,
        ),
        (
            "WRITE",
            a,
            arena_req(&a, 2, ARENA_REGION, 0, 8, false),
            Status::ReadOnly,
        ),
        (
            "CAS",
            a,
            {
                let mut b = arena_req(&a, 3, ARENA_REGION, 0, 8, false);
                b.resize(b.len() + 16, 0);
                b
            },
            Status::Malformed,
        ),
        (
            "empty",
            a,
            arena_req(&a, 1, ARENA_REGION, 0, 0, true),
            Status::BadLength,
        ),
        (
            "unaligned",
            a,
            arena_req(&a, 1, ARENA_REGION, 4, 8, true),
            Status::Unaligned,
        ),
        (
            "across a chunk",
            a,
            arena_req(&a, 1, ARENA_REGION, c - 8, 16, true),
            Status::OutOfBounds,
        ),
        (
            "beyond the map",
            a,
            arena_req(&a, 1, ARENA_REGION, chunks * c, 8, true),
            Status::OutOfBounds,
        ),
        (
            "beyond the declared bound",
            a,
            arena_req(&a, 1, ARENA_REGION, u32::MAX - 7, 8, true),
            Status::OutOfBounds,
        ),
        (
            "unpadded",
            a,
            arena_req(&a, 1, ARENA_REGION, 0, 512, false),
            Status::Unpadded,
        ),
    ];
    for (what, key, req, want) in cases {
        if want == Status::Malformed {
            // A CAS whose payload is not covered by the tag: dropped, never applied.
            let (act, _) = prog.run(&frame(Shape::to_port(PORT), &req));
            assert!(act == action::DROP || act == action::TX, "{what}");
            continue;
        }
        let (st, bytes) = ask(&prog, &key, &req);
        assert_eq!(st, want, "{what}");
        if st == Status::Ok {
            let h = wire::ReqHeader::decode(&req[ENVELOPE_BYTES..]).unwrap();
            let o = h.offset as usize;
            assert_eq!(
                bytes,
                before[o..o + h.len as usize],
                "{what}: the bytes there"
            );
        } else {
            assert!(bytes.is_empty(), "{what}: header-only refusal");
        }
    }
    assert_eq!(
        prog.arena().lock().unwrap().bytes_mut().to_vec(),
        before,
        "nothing written"
    );
}

/// A sealed bulk arena READ (`FLAG_BULK`), padded to its reply unless `pad` is false.
fn bulk_req(key: &ClientKey, op: u8, region: u32, offset: u32, len: u32, pad: bool) -> Vec<u8> {
    static OP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let seq = OP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let payload = if op == 2 {
        vec![0xaa; len as usize]
    } else {
        vec![]
    };
    let mut b = seal(
        key,
        0x5e,
        &covered(op, FLAG_BULK, seq, region, offset, len, &payload),
    );
    if pad {
        let n = ENVELOPE_BYTES + wire::REP_HEADER_BYTES + len as usize;
        b.resize(b.len().max(n), 0);
    }
    b
}

/// Runs a bulk READ: its status and body. The reply's tag must cover its envelope and
/// header only (the body follows, uncovered), and verify under the request's key.
fn ask_bulk(prog: &TestProgram, key: &ClientKey, req: &[u8]) -> (Status, Vec<u8>) {
    let f = frame(Shape::to_port(PORT), req);
    let (act, out) = prog.run(&f);
    assert_eq!(act, action::TX, "answered in the kernel");
    let payload = check_reply("arena bulk", &f, &out, PORT);
    let parsed = farside_auth::mac::parse(&payload).expect("an envelope");
    let opened = farside_auth::mac::TagKey::new(farside_auth::mac::Domain::RmemReply, key.key())
        .verify(&parsed)
        .expect("sealed under the request's key");
    assert_eq!(
        opened.message.len(),
        wire::REP_HEADER_BYTES,
        "the tag covers the header only"
    );
    let h = RepHeader::decode(opened.message).unwrap();
    assert_eq!(opened.trailing.len(), h.len as usize, "the body follows");
    (h.status, opened.trailing.to_vec())
}

#[test]
fn bulk_reads_span_chunks_and_tag_their_header() {
    if !need_root("bulk_reads_span_chunks_and_tag_their_header") {
        return;
    }
    let layout = layout();
    let chunks = map_chunks(&layout).unwrap();
    let prog = TestProgram::load_with_arena(PORT, &keyring_with_arena(), chunks as u32)
        .expect("load with an arena");
    let mut arena = ArenaMap::new(layout.clone()).unwrap();
    let body: Vec<u8> = (0..20_000u32).map(|i| (i * 13 + 5) as u8).collect();
    let hash = farside_arena::url_hash(b"/bulk");
    let bucket = {
        let mem = prog.arena();
        let mut mem = mem.lock().unwrap();
        arena.put(mem.bytes_mut(), hash, &body).unwrap()
    };
    let key = arena_key();
    let mut r = ObjectRead::new(&layout, hash, bucket.offset as usize, bucket.len as usize)
        .expect("a slot");
    let plan = r.plan();
    let n = plan.len();
    // Head and tail one chunk each, fully tagged; the middle two chunks per bulk READ
    // (a test run's frame holds one page: two chunks fit it).
    let (o, l) = plan[0];
    let (st, bytes) = ask(
        &prog,
        &key,
        &arena_req(
            &key,
            1,
            ARENA_REGION,
            (SLOTS_BASE + o) as u32,
            l as u32,
            true,
        ),
    );
    assert_eq!(st, Status::Ok);
    r.feed_at(0, &bytes);
    let mut i = 1;
    while i < n - 1 {
        let j = (i + 2).min(n - 1);
        let start = SLOTS_BASE + plan[i].0;
        let len: usize = plan[i..j].iter().map(|p| p.1).sum();
        let (st, bytes) = ask_bulk(
            &prog,
            &key,
            &bulk_req(&key, 1, ARENA_REGION, start as u32, len as u32, true),
        );
        assert_eq!(st, Status::Ok, "bulk READ {i}..{j}");
        assert_eq!(bytes.len(), len);
        let mut at = 0;
        for (k, p) in plan.iter().enumerate().take(j).skip(i) {
            r.feed_at(k, &bytes[at..at + p.1]);
            at += p.1;
        }
        i = j;
    }
    let (o, l) = plan[n - 1];
    let (st, bytes) = ask(
        &prog,
        &key,
        &arena_req(
            &key,
            1,
            ARENA_REGION,
            (SLOTS_BASE + o) as u32,
            l as u32,
            true,
        ),
    );
    assert_eq!(st, Status::Ok);
    r.feed_at(n - 1, &bytes);
    let (version, got) = r.finish().expect("valid object");
    assert_eq!(got, body);
    assert_eq!(version, bucket.version);

    // Refusals: header-only replies, nothing read or written.
    let before = prog.arena().lock().unwrap().bytes_mut().to_vec();
    let c = CHUNK_BYTES as u32;
    let ro = keys().ro;
    let cases: Vec<(&str, ClientKey, Vec<u8>, Status)> = vec![
        (
            "not at a chunk boundary",
            key,
            bulk_req(&key, 1, ARENA_REGION, c + 8, 64, true),
            Status::Unaligned,
        ),
        (
            "a length not of words",
            key,
            bulk_req(&key, 1, ARENA_REGION, c, 12, true),
            Status::Unaligned,
        ),
        (
            "more chunks than a bulk READ spans",
            key,
            bulk_req(
                &key,
                1,
                ARENA_REGION,
                0,
                (BULK_READ_BYTES_MAX + 8) as u32,
                false,
            ),
            Status::BadLength,
        ),
        (
            "empty",
            key,
            bulk_req(&key, 1, ARENA_REGION, 0, 0, true),
            Status::BadLength,
        ),
        (
            "its last chunk beyond the map",
            key,
            bulk_req(&key, 1, ARENA_REGION, (chunks as u32 - 1) * c, 2 * c, true),
            Status::OutOfBounds,
        ),
        (
            "beyond the declared bound",
            key,
            bulk_req(
                &key,
                1,
                ARENA_REGION,
                (ARENA_CHUNKS_MAX as u32 - 1) * c,
                2 * c,
                false,
            ),
            Status::OutOfBounds,
        ),
        (
            "unpadded",
            key,
            bulk_req(&key, 1, ARENA_REGION, 0, 2 * c, false),
            Status::Unpadded,
        ),
        (
            "WRITE",
            key,
            bulk_req(&key, 2, ARENA_REGION, 0, 8, false),
            Status::ReadOnly,
        ),
        (
            "control reader on the arena",
            ro,
            bulk_req(&ro, 1, ARENA_REGION, 0, 8, true),
            Status::NoRegion,
        ),
    ];
    for (what, k, req, want) in cases {
        let (st, bytes) = ask_bulk(&prog, &k, &req);
        assert_eq!(st, want, "{what}");
        assert!(bytes.is_empty(), "{what}: header-only refusal");
    }
    assert_eq!(
        prog.arena().lock().unwrap().bytes_mut().to_vec(),
        before,
        "nothing written"
    );
}

/// A grant's key entry (id 40, its own key, arena READ rights), as a server installs it.
fn grant_entry() -> farside_auth::keys::KeyEntry {
    let set = farside_rmem::LabKeyset::generate();
    let mut ring = farside_auth::keys::Keyring::new(farside_auth::keys::Policy::Production);
    ring.install(
        "arena-grant",
        farside_auth::mac::KeyId(40),
        *set.reader.key(),
        farside_auth::rights::Rights::reader(ARENA_REGION),
    )
    .unwrap();
    ring.get(farside_auth::mac::KeyId(40)).unwrap().clone()
}

/// A grant opens READs only from its bound address and only until its deadline, both
/// checked in the kernel; a request it opened once is not answered again (replay).
#[test]
fn a_grant_opens_reads_from_its_address_until_its_deadline_only() {
    if !need_root("a_grant_opens_reads_from_its_address_until_its_deadline_only") {
        return;
    }
    let chunks = 4u32;
    let mut prog = TestProgram::load_with_arena(PORT, &keyring_with_arena(), chunks).expect("load");
    {
        let mem = prog.arena();
        let mut mem = mem.lock().unwrap();
        mem.bytes_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 3) as u8);
    }
    let entry = grant_entry();
    let key = ClientKey::new(entry.id, entry.key);
    let client = std::net::Ipv4Addr::from(IP_CLIENT);
    let other = std::net::Ipv4Addr::new(10, 0, 0, 99);
    let later = farside_xdp::monotonic_ns() + 3_600_000_000_000;
    let run = |prog: &TestProgram, req: &[u8]| prog.run(&frame(Shape::to_port(PORT), req));

    // Not installed: dropped.
    let req = arena_req(&key, 1, ARENA_REGION, 8, 64, true);
    assert_eq!(run(&prog, &req).0, action::DROP, "no grant yet");

    // Bound to the request's source, live: answered, and only once.
    prog.install_grant(&entry, client, later).unwrap();
    let req = arena_req(&key, 1, ARENA_REGION, 8, 64, true);
    let (st, bytes) = ask(&prog, &key, &req);
    assert_eq!(st, Status::Ok);
    let want: Vec<u8> = (8..72).map(|i| (i * 3) as u8).collect();
    assert_eq!(bytes, want, "the arena's bytes");
    assert_eq!(
        run(&prog, &req).0,
        action::DROP,
        "the same request again: replayed"
    );

    // Bound to another address: the same key opens nothing from this one.
    prog.install_grant(&entry, other, later).unwrap();
    let req = arena_req(&key, 1, ARENA_REGION, 8, 64, true);
    assert_eq!(run(&prog, &req).0, action::DROP, "another client's grant");

    // Past its deadline: nothing, though the entry is still in the map.
    prog.install_grant(&entry, client, farside_xdp::monotonic_ns())
        .unwrap();
    let req = arena_req(&key, 1, ARENA_REGION, 8, 64, true);
    assert_eq!(run(&prog, &req).0, action::DROP, "expired");

    // Live again, then revoked.
    prog.install_grant(&entry, client, later).unwrap();
    let req = arena_req(&key, 1, ARENA_REGION, 16, 8, true);
    assert_eq!(ask(&prog, &key, &req).0, Status::Ok);
    assert!(prog.revoke_key(entry.id.0).unwrap());
    let req = arena_req(&key, 1, ARENA_REGION, 16, 8, true);
    assert_eq!(run(&prog, &req).0, action::DROP, "revoked");

    // A grant's rights are the arena's, READ only: a WRITE is refused, the control
    // region is not its region.
    prog.install_grant(&entry, client, later).unwrap();
    let req = arena_req(&key, 2, ARENA_REGION, 0, 8, false);
    assert_eq!(ask(&prog, &key, &req).0, Status::ReadOnly);
    let req = arena_req(&key, 1, 0, 0, 8, true);
    assert_eq!(ask(&prog, &key, &req).0, Status::NoRegion);
}
