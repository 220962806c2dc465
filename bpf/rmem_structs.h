/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Wire and map value layouts of the rmem XDP responder (see crates/rmem/src/wire.rs). */
#ifndef RMEM_STRUCTS_H
#define RMEM_STRUCTS_H

#include <linux/types.h>
#include "rmem_consts.h"

/* Request header, little-endian, at the start of the UDP payload. */
struct rmem_req {
	__u32 magic;     /* RMEM_REQ_MAGIC */
	__u8 version;    /* RMEM_VERSION */
	__u8 op;         /* RMEM_OP_* */
	__u16 flags;     /* RMEM_FLAG_* */
	__u64 seq;       /* echoed in the reply; +1 per op of a client */
	__u64 key;       /* access key: must be in the keys map */
	__u32 region;    /* only region 0 exists */
	__u32 offset;    /* bytes, multiple of 8 */
	__u32 len;       /* bytes, multiple of 8 */
	__u32 reserved1;
	__u64 client;    /* random per client; 0 = anonymous (no dedup) */
	/* payload: WRITE len bytes; CAS expected u64, new u64; FADD delta u64 */
};

/* Reply header, written over the request header. */
struct rmem_rep {
	__u32 magic;     /* RMEM_REP_MAGIC */
	__u8 version;    /* RMEM_VERSION */
	__u8 op;         /* the request's op byte */
	__u8 status;     /* RMEM_ST_* */
	__u8 reserved0;
	__u64 seq;       /* the request's seq */
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

#endif /* RMEM_STRUCTS_H */
