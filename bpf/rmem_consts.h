/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * Constants of the rmem XDP responder. The wire values mirror
 * crates/rmem/src/wire.rs and ops.rs; crates/xdp/tests/consts.rs parses this
 * file and fails if any value here disagrees with the Rust side, so each limit
 * is declared in Rust and only checked here.
 */
#ifndef RMEM_CONSTS_H
#define RMEM_CONSTS_H

/* Request magic "FSRM" read as a little-endian u32 (wire::REQ_MAGIC). */
#define RMEM_REQ_MAGIC 0x4d525346
/* Reply magic "FSRP" read as a little-endian u32 (wire::REP_MAGIC). */
#define RMEM_REP_MAGIC 0x50525346
/* Protocol version (wire::VERSION). */
#define RMEM_VERSION 3
/* Fixed request header after the envelope (wire::REQ_HEADER_BYTES). */
#define RMEM_REQ_HEADER_BYTES 32
/* Request flag: a retry of the same (client, seq) (wire::FLAG_RETRY). */
#define RMEM_FLAG_RETRY 1
/* Fixed reply header (wire::REP_HEADER_BYTES). */
#define RMEM_REP_HEADER_BYTES 24
/* Largest READ/WRITE the protocol allows: one region (wire::OP_BYTES_MAX). */
#define RMEM_OP_BYTES_MAX 4096
/* The region: 4096 bytes (farside_region::REGION_BYTES). */
#define RMEM_REGION_BYTES 4096
/* ... as 64-bit words (farside_region::REGION_WORDS); a power of two, used as a mask. */
#define RMEM_REGION_WORDS 512
/* Most keys (farside_auth::keys::KEYS_MAX): max_entries of the keys map. */
#define RMEM_KEYS_MAX 64
/* Most grants per key (farside_auth::rights::GRANTS_MAX): the bound of the grant loop. */
#define RMEM_GRANTS_MAX 16
/* Key flag (struct rmem_key.flags): its grants are arena chunk ranges (Rights::chunk_writer). */
#define RMEM_KEY_FLAG_CHUNKS 1
/* Grant op bits (struct rmem_grant.ops). */
#define RMEM_GRANT_READ 1
#define RMEM_GRANT_WRITE 2
#define RMEM_GRANT_CAS 4
#define RMEM_GRANT_FADD 8
/*
 * Words only the node's agent writes (farside_auth::rights::AGENT_OWNED): the header,
 * the load record and the served role and its epoch are words [0, 34); the role
 * error is word 35. No mutation may touch them, whatever the key's grants.
 */
#define RMEM_AGENT_OWNED_END_WORD 34
#define RMEM_AGENT_OWNED_ERROR_WORD 35
/*
 * The replay map (farside_xdp::REPLAY_BUCKETS, REPLAY_WAYS): buckets (a power of two,
 * the hash is masked) of windows each, 4096 senders in all, as
 * farside_auth::replay::SENDERS_MAX. Four ways keep the chance that a bucket overflows
 * small while the senders are a few hundred; an overflow evicts safely (the bucket's
 * floor), it never refuses a new sender for want of room.
 */
#define RMEM_REPLAY_BUCKETS 1024
#define RMEM_REPLAY_WAYS 4
/* Entries of the sequence limits map: the restart floor and the ceiling. */
#define RMEM_SEQLIM_FLOOR 0
#define RMEM_SEQLIM_CEILING 1
#define RMEM_SEQLIM_ENTRIES 2
/* Words of a replay window's bitmap (farside_auth::replay::WINDOW_BLOCKS). */
#define RMEM_WINDOW_BLOCKS 16
/* How far below the top a seq is still judged by its bit (replay::WINDOW_MSGS). */
#define RMEM_WINDOW_MSGS 960
/*
 * Longest message the program hashes (request or reply, envelope bytes 8..32 and the
 * covered bytes): 24 + 24 + XDP_READ_BYTES_MAX = 1448, rounded up to whole blocks.
 */
#define RMEM_SIPHASH_BYTES_MAX 1456
/*
 * Clients whose last mutation is remembered (ops::DEDUP_CLIENTS_MAX): max_entries
 * of the LRU dedup map. A forgotten client's retry is refused as UNKNOWN.
 */
#define RMEM_DEDUP_CLIENTS_MAX 1024
/* Mutations remembered per client (ops::DEDUP_WINDOW): one outstanding op per client. */
#define RMEM_DEDUP_WINDOW 1
/*
 * Largest READ answered in the kernel (farside_xdp::XDP_READ_BYTES_MAX). The
 * reply must fit one frame: 14 + 20 + 8 + 32 + 24 + 1400 = 1498 bytes, within a
 * 1500-byte MTU's frame (1514). Larger READs get BadLength here although the user-space
 * server allows up to RMEM_OP_BYTES_MAX; clients split large reads.
 */
#define XDP_READ_BYTES_MAX 1400
/* XDP_READ_BYTES_MAX in words: the bound of the READ copy loop. */
#define XDP_READ_WORDS_MAX (XDP_READ_BYTES_MAX / 8)

/*
 * The object arena (crates/arena layout.rs): a READ whose region is RMEM_ARENA_REGION
 * (farside_arena::layout::ARENA_REGION) reads the rmem_arena map, not the control
 * region. Byte offset o names chunk o / RMEM_ARENA_CHUNK_BYTES at o % that; one READ
 * or WRITE never crosses a chunk (one map element). READ under a key whose rights name
 * that region with a READ grant (an "arena reader"); WRITE under a key whose chunk
 * grants (RMEM_KEY_FLAG_CHUNKS) cover the chunk (a peer's slot); nothing else.
 */
#define RMEM_ARENA_REGION 1
/* Bytes of one chunk (farside_arena::layout::CHUNK_BYTES): one map element. */
#define RMEM_ARENA_CHUNK_BYTES 1400
/* ... as 64-bit words: the bound of the arena READ copy loop. */
#define RMEM_ARENA_CHUNK_WORDS (RMEM_ARENA_CHUNK_BYTES / 8)
/*
 * Bulk arena READs (farside_arena::layout::FLAG_BULK, BULK_CHUNKS_MAX): a READ with
 * this request flag starts at a chunk boundary, spans up to RMEM_ARENA_BULK_CHUNKS_MAX
 * consecutive chunks (RMEM_ARENA_BULK_BYTES_MAX bytes: its reply fits a 9000-byte MTU),
 * and its reply's tag covers the envelope and reply header only, not the body (the
 * reader validates the object's CRC32c and url hash, read under full tags).
 */
#define RMEM_FLAG_BULK 2
#define RMEM_ARENA_BULK_CHUNKS_MAX 6
#define RMEM_ARENA_BULK_BYTES_MAX 8400
/*
 * Most chunks (farside_arena::layout::ARENA_CHUNKS_MAX): the map's declared
 * max_entries. The loader creates it with the node's configured count (>= 1), never
 * more; a chunk beyond it is refused OUT_OF_BOUNDS.
 */
#define RMEM_ARENA_CHUNKS_MAX 65536

/* Op codes (wire::Op). */
#define RMEM_OP_READ 1
#define RMEM_OP_WRITE 2
#define RMEM_OP_CAS 3
#define RMEM_OP_FADD 4

/* Status codes (wire::Status). */
#define RMEM_ST_OK 0
#define RMEM_ST_BAD_KEY 1
#define RMEM_ST_OUT_OF_BOUNDS 2
#define RMEM_ST_UNALIGNED 3
#define RMEM_ST_BAD_OP 4
#define RMEM_ST_READ_ONLY 5
#define RMEM_ST_BAD_LENGTH 6
#define RMEM_ST_MALFORMED 7
#define RMEM_ST_NO_REGION 8
#define RMEM_ST_PROTECTED 9
#define RMEM_ST_UNKNOWN 10
#define RMEM_ST_STALE 11
#define RMEM_ST_UNPADDED 12
#define RMEM_ST_REPLAYED 13


/*
 * Counter indices (the counters map, per CPU): [0, 5) ops by op code with 0 =
 * unknown, [5, 19) replies by status, like ops::OpCounters; then
 * RMEM_CNT_ABORTED: replies that could not be built (cannot happen: XDP_ABORTED);
 * RMEM_CNT_NO_ROOM: READs passed to the stack because the frame could not grow
 * to the reply's size (pad READ requests to avoid it; see rmem.bpf.c).
 */
#define RMEM_CNT_OPS 5
#define RMEM_CNT_STATUS 14
#define RMEM_CNT_STATUS_BASE RMEM_CNT_OPS
#define RMEM_CNT_ABORTED 19
#define RMEM_CNT_NO_ROOM 20
#define RMEM_COUNTERS 21

/* IPv4 fragment bits (frag_off, host order): more fragments, fragment offset. */
#define RMEM_IP_MF 0x2000
#define RMEM_IP_OFFSET 0x1fff

/* High 4 bits of an IPv4 multicast address (224.0.0.0/4). */
#define RMEM_IPV4_MULTICAST_NIBBLE 0xe

/* Bytes of a MAC address in the config (ETH_ALEN, without linux/if_ether.h here). */
#define ETH_ALEN_BYTES 6

/* TTL of replies. */
#define RMEM_REPLY_TTL 64

#endif /* RMEM_CONSTS_H */
