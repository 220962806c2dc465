//! Every limit and code the BPF program uses is declared on the Rust side (wire.rs,
//! ops.rs, region layout, this crate) and only mirrored in `bpf/rmem_consts.h`: this test
//! parses the header and fails on any disagreement, so a limit is never declared twice
//! unchecked. Needs no privilege.

use farside_rmem::wire::{self, Op, Status};
use std::collections::HashMap;

fn header_defines() -> HashMap<String, u64> {
    defines_of("rmem_consts.h")
}

fn defines_of(header: &str) -> HashMap<String, u64> {
    let path = format!("{}/../../bpf/{header}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let parsed = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        };
        if let Some(v) = parsed {
            out.insert(name.to_string(), v);
        }
    }
    out
}

#[test]
fn bpf_constants_match_the_rust_side() {
    let d = header_defines();
    let want: Vec<(&str, u64)> = vec![
        ("RMEM_REQ_MAGIC", wire::REQ_MAGIC.into()),
        ("RMEM_REP_MAGIC", wire::REP_MAGIC.into()),
        ("RMEM_VERSION", wire::VERSION.into()),
        ("RMEM_REQ_HEADER_BYTES", wire::REQ_HEADER_BYTES as u64),
        ("RMEM_REP_HEADER_BYTES", wire::REP_HEADER_BYTES as u64),
        ("RMEM_OP_BYTES_MAX", wire::OP_BYTES_MAX as u64),
        ("RMEM_REGION_BYTES", farside_region::REGION_BYTES as u64),
        ("RMEM_REGION_WORDS", farside_region::REGION_WORDS as u64),
        ("RMEM_KEYS_MAX", farside_auth::keys::KEYS_MAX as u64),
        ("RMEM_GRANTS_MAX", farside_auth::rights::GRANTS_MAX as u64),
        ("RMEM_REPLAY_BUCKETS", farside_xdp::REPLAY_BUCKETS as u64),
        ("RMEM_REPLAY_WAYS", farside_xdp::REPLAY_WAYS as u64),
        (
            "RMEM_WINDOW_BLOCKS",
            farside_auth::replay::WINDOW_BLOCKS as u64,
        ),
        ("RMEM_WINDOW_MSGS", farside_auth::replay::WINDOW_MSGS),
        (
            "RMEM_AGENT_OWNED_END_WORD",
            farside_region::layout::W_ROLE_EPOCH as u64 + 1,
        ),
        (
            "RMEM_AGENT_OWNED_ERROR_WORD",
            farside_region::layout::W_ROLE_ERROR as u64,
        ),
        ("RMEM_ST_REPLAYED", Status::Replayed as u64),
        ("XDP_READ_BYTES_MAX", farside_xdp::XDP_READ_BYTES_MAX as u64),
        (
            "RMEM_ARENA_REGION",
            farside_arena::layout::ARENA_REGION.into(),
        ),
        (
            "RMEM_ARENA_CHUNK_BYTES",
            farside_xdp::ARENA_CHUNK_BYTES as u64,
        ),
        (
            "RMEM_ARENA_CHUNKS_MAX",
            farside_xdp::ARENA_CHUNKS_MAX as u64,
        ),
        ("RMEM_KEY_FLAG_CHUNKS", farside_xdp::KEY_FLAG_CHUNKS.into()),
        ("RMEM_OP_READ", Op::Read as u64),
        ("RMEM_OP_WRITE", Op::Write as u64),
        ("RMEM_OP_CAS", Op::CompareSwap as u64),
        ("RMEM_OP_FADD", Op::FetchAdd as u64),
        ("RMEM_ST_OK", Status::Ok as u64),
        ("RMEM_ST_BAD_KEY", Status::BadKey as u64),
        ("RMEM_ST_OUT_OF_BOUNDS", Status::OutOfBounds as u64),
        ("RMEM_ST_UNALIGNED", Status::Unaligned as u64),
        ("RMEM_ST_BAD_OP", Status::BadOp as u64),
        ("RMEM_ST_READ_ONLY", Status::ReadOnly as u64),
        ("RMEM_ST_BAD_LENGTH", Status::BadLength as u64),
        ("RMEM_ST_MALFORMED", Status::Malformed as u64),
        ("RMEM_ST_NO_REGION", Status::NoRegion as u64),
        ("RMEM_ST_PROTECTED", Status::Protected as u64),
        ("RMEM_ST_UNKNOWN", Status::Unknown as u64),
        ("RMEM_ST_STALE", Status::Stale as u64),
        ("RMEM_ST_UNPADDED", Status::Unpadded as u64),
        ("RMEM_FLAG_RETRY", wire::FLAG_RETRY.into()),
        ("RMEM_FLAG_BULK", farside_arena::layout::FLAG_BULK.into()),
        (
            "RMEM_ARENA_BULK_CHUNKS_MAX",
            farside_arena::layout::BULK_CHUNKS_MAX as u64,
        ),
        (
            "RMEM_ARENA_BULK_BYTES_MAX",
            farside_arena::layout::BULK_READ_BYTES_MAX as u64,
        ),
        (
            "RMEM_DEDUP_CLIENTS_MAX",
            farside_rmem::ops::DEDUP_CLIENTS_MAX as u64,
        ),
        ("RMEM_DEDUP_WINDOW", farside_rmem::ops::DEDUP_WINDOW as u64),
        ("RMEM_CNT_OPS", 5),
        ("RMEM_CNT_STATUS", Status::ALL.len() as u64),
        ("RMEM_CNT_STATUS", wire::STATUS_COUNT as u64),
    ];
    for (name, value) in want {
        assert_eq!(d.get(name), Some(&value), "bpf/rmem_consts.h {name}");
    }
    // The region mask needs a power of two; the READ limit must leave room for headers.
    const {
        assert!(farside_region::REGION_WORDS.is_power_of_two());
        assert!(
            14 + 20
                + 8
                + wire::ENVELOPE_BYTES
                + wire::REP_HEADER_BYTES
                + farside_xdp::XDP_READ_BYTES_MAX
                <= 1514
        );
        assert!(farside_xdp::XDP_READ_BYTES_MAX.is_multiple_of(8));
    }
    // The agent-owned words the program checks with two constants are exactly
    // farside_auth's AGENT_OWNED: words [0, 34) and 35.
    let owned = |w: usize| {
        farside_auth::rights::AGENT_OWNED
            .iter()
            .any(|o| o.covers(w, w + 1))
    };
    for w in 0..farside_region::REGION_WORDS {
        assert_eq!(owned(w), w < 34 || w == 35, "word {w}");
    }
    // The udp client splits reads at the size the XDP program answers.
    assert_eq!(
        farside_rmem::udp::UDP_READ_BYTES_MAX,
        farside_xdp::XDP_READ_BYTES_MAX
    );
}

/// The kernel sampler writes the load record itself: its word indices and flag must be
/// the region layout's, and its limits the loader's. A word moved in
/// `crates/region/src/layout.rs` fails here until `bpf/ksamp_consts.h` follows.
#[test]
fn kernel_sampler_constants_match_the_rust_side() {
    use farside_region::layout as l;
    use farside_xdp::ksamp;
    let d = defines_of("ksamp_consts.h");
    let want: Vec<(&str, u64)> = vec![
        ("KSAMP_W_SEQ_HEAD", l::W_SEQ_HEAD as u64),
        ("KSAMP_W_SAMPLE_MONO_NS", l::W_SAMPLE_MONO_NS as u64),
        ("KSAMP_W_CPU_UTIL_PPM", l::W_CPU_UTIL_PPM as u64),
        ("KSAMP_W_RUNNABLE", l::W_RUNNABLE as u64),
        ("KSAMP_W_CONNS_ESTABLISHED", l::W_CONNS_ESTABLISHED as u64),
        ("KSAMP_W_ACCEPT_BACKLOG", l::W_ACCEPT_BACKLOG as u64),
        ("KSAMP_W_NCPU", l::W_NCPU as u64),
        ("KSAMP_W_FLAGS", l::W_FLAGS as u64),
        (
            "KSAMP_W_CONNS_SAMPLED_MONO_NS",
            l::W_CONNS_SAMPLED_MONO_NS as u64,
        ),
        ("KSAMP_W_SEQ_TAIL", l::W_SEQ_TAIL as u64),
        ("KSAMP_FLAG_CONNS", l::FLAG_CONNS),
        ("KSAMP_W_QUEUE_DELAY_US", l::W_QUEUE_DELAY_US as u64),
        ("KSAMP_FLAG_QUEUE_DELAY", l::FLAG_QUEUE_DELAY),
        ("KSAMP_ARRIVALS_RING", ksamp::SAMPLER_ARRIVALS_RING as u64),
        ("KSAMP_PORTS_MAX", ksamp::SAMPLER_PORTS_MAX as u64),
        ("KSAMP_CPUS_MAX", ksamp::SAMPLER_CPUS_MAX.into()),
        ("KSAMP_EMA_SHIFT", ksamp::SAMPLER_EMA_SHIFT.into()),
        ("KSAMP_OTHER_SPREAD", ksamp::SAMPLER_OTHER_SPREAD.into()),
        ("KSAMP_LISTENERS_MAX", ksamp::SAMPLER_LISTENERS_MAX as u64),
    ];
    for (name, value) in want {
        assert_eq!(d.get(name), Some(&value), "bpf/ksamp_consts.h {name}");
    }
    assert!(ksamp::SAMPLER_CPUS_MAX.is_power_of_two());
    assert!(ksamp::SAMPLER_PORTS_MAX.is_power_of_two());
    assert!(ksamp::SAMPLER_ARRIVALS_RING.is_power_of_two());
}
