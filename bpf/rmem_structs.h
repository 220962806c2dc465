/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Wire and map value layouts of the rmem XDP responder (see crates/rmem/src/wire.rs). */
#ifndef RMEM_STRUCTS_H
#define RMEM_STRUCTS_H

#include <linux/bpf.h>
#include <linux/types.h>
#include "rmem_consts.h"

/*
 * Request header, little-endian, after the envelope (struct auth_envelope,
 * bpf/auth_siphash.h) at the start of the UDP payload; the envelope's tag covers it.
 */
struct rmem_req {
	__u32 magic;     /* RMEM_REQ_MAGIC */
	__u8 version;    /* RMEM_VERSION */
	__u8 op;         /* RMEM_OP_* */
	__u16 flags;     /* RMEM_FLAG_* */
	__u64 seq;       /* the operation's: echoed in the reply; a retry repeats it */
	__u32 region;    /* only region 0 exists */
	__u32 offset;    /* bytes, multiple of 8 */
	__u32 len;       /* bytes, multiple of 8 */
	__u32 reserved1;
	/* payload: WRITE len bytes; CAS expected u64, new u64; FADD delta u64 */
};

/* Reply header, after the reply's envelope (written over the request's). */
struct rmem_rep {
	__u32 magic;     /* RMEM_REP_MAGIC */
	__u8 version;    /* RMEM_VERSION */
	__u8 op;         /* the request's op byte */
	__u8 status;     /* RMEM_ST_* */
	__u8 reserved0;
	__u64 seq;       /* the request's op seq */
	__u32 len;       /* payload bytes: READ len, CAS/FADD 8, else 0 */
	__u32 reserved1;
	/* payload: READ len bytes; CAS/FADD old value u64 */
};

_Static_assert(sizeof(struct rmem_req) == RMEM_REQ_HEADER_BYTES, "request header size");
_Static_assert(sizeof(struct rmem_rep) == RMEM_REP_HEADER_BYTES, "reply header size");

/* The region: the only value of the mmapable region map. */
struct rmem_region {
	__u64 words[RMEM_REGION_WORDS];
};

_Static_assert(sizeof(struct rmem_region) == RMEM_REGION_BYTES, "region size");

/* One chunk of the object arena: a value of the rmem_arena map (crates/arena). */
struct rmem_arena_chunk {
	__u64 words[RMEM_ARENA_CHUNK_WORDS];
};

_Static_assert(sizeof(struct rmem_arena_chunk) == RMEM_ARENA_CHUNK_BYTES, "arena chunk size");
_Static_assert(RMEM_ARENA_CHUNK_BYTES <= XDP_READ_BYTES_MAX, "a chunk fits one reply");
_Static_assert(RMEM_ARENA_BULK_BYTES_MAX == RMEM_ARENA_BULK_CHUNKS_MAX * RMEM_ARENA_CHUNK_BYTES,
	       "a bulk READ is whole chunks");

/* Configuration, written by the loader before attaching. */
struct rmem_config {
	__u16 udp_port;  /* destination port served, host order; 0 = serve nothing */
	__u16 reserved0;
	__u32 ipv4_addr; /* the node's address, network order: others' packets pass; 0 = any */
	__u32 group_ipv4; /* group READs' multicast address, network order; 0 = off */
	__u8 node_mac[ETH_ALEN_BYTES]; /* the node's MAC: group replies' source; 0 = unknown */
	__u16 reserved1;
};

_Static_assert(sizeof(struct rmem_config) == 20, "config size (crates/xdp Config)");

/*
 * Value of the dedup map: the last mutation of one client (see ops::Dedup). seq is
 * claimed by CAS before the op is applied; done_seq == seq once old is recorded, so
 * a duplicate racing the first attempt on another CPU is dropped, never replayed
 * with a half-written record.
 */
struct rmem_dedup {
	__u64 seq;       /* last seq claimed */
	__u64 done_seq;  /* last seq whose reply (old) is recorded */
	__u64 old;       /* CAS/FADD: the old value returned; WRITE: 0 */
};

/* One grant of a key (farside_auth::rights::Grant): ops on words [first, end). */
struct rmem_grant {
	__u16 first;
	__u16 end;
	__u8 ops;        /* RMEM_GRANT_* bits */
	__u8 reserved[3];
	__u64 fadd_delta_max; /* largest FETCH-ADD delta (unsigned); ~0: any */
};

_Static_assert(sizeof(struct rmem_grant) == 16, "grant size (crates/xdp Grant)");

/*
 * Value of the keys map (key: the key id): the SipHash key and its rights, filled
 * by the loader from farside_auth's keyring.
 */
struct rmem_key {
	__u64 k0;        /* the key's halves (SipKey::halves) */
	__u64 k1;
	__u32 region;    /* the region its rights name */
	__u32 grants;    /* grants used, at most RMEM_GRANTS_MAX */
	struct rmem_grant grant[RMEM_GRANTS_MAX];
	/*
	 * An arena grant's binding (farside_rdmahttp::grant); 0 for every other key.
	 * bound_ipv4: the only source address whose requests the key opens (network
	 * order; 0 = any); expires_ns: bpf_ktime_get_ns() (CLOCK_MONOTONIC) from which the
	 * key opens nothing (0 = never). Checked before the tag: such a request is
	 * dropped as an unknown key.
	 */
	__u32 bound_ipv4;
	/*
	 * RMEM_KEY_FLAG_CHUNKS: the grants name chunks of the arena, not region words
	 * (farside_auth::rights::Rights::chunk_writer): arena WRITEs inside them only,
	 * nothing else (no READ, no region word).
	 */
	__u32 flags;
	__u64 expires_ns;
};

_Static_assert(sizeof(struct rmem_key) == 40 + 16 * RMEM_GRANTS_MAX, "key size (crates/xdp)");

/*
 * One way of a replay bucket: the window (farside_auth::replay::Window) of one
 * (key id, sender). live = 0: the way is free.
 */
struct rmem_way {
	__u32 key_id;
	__u32 live;
	__u64 sender;
	__u64 top;       /* highest seq accepted (or the floor the window started above) */
	__u64 bits[RMEM_WINDOW_BLOCKS]; /* seq s is bit s % 64 of bits[(s / 64) % BLOCKS] */
};

/*
 * A bucket of the replay map (set-associative: (key id, sender) hashes to one bucket
 * of RMEM_REPLAY_WAYS windows), under its lock. floor: the highest top evicted from
 * this bucket; a window created here starts above it (and above the restart floor),
 * so an evicted sender's recorded requests stay refused. It only rises.
 */
struct rmem_bucket {
	struct bpf_spin_lock lock;
	__u32 reserved;
	__u64 floor;
	struct rmem_way way[RMEM_REPLAY_WAYS];
};

#endif /* RMEM_STRUCTS_H */
