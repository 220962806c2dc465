/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * Limits and indices of the blind front-end (frontend.bpf.c). Mirrored in
 * crates/frontend/src/maps.rs, which a unit test checks against this file.
 */
#ifndef FRONTEND_CONSTS_H
#define FRONTEND_CONSTS_H

/* Back-ends the front-end can route to (max_entries of fe_backends and fe_bstats):
 * a cluster of the paper's size is a handful; 64 keeps the maps one page. */
#define FE_BACKENDS_MAX 64
/* Slots of the weight table, Maglev's lookup table (crates/frontend table.rs): a
 * prime, so every back-end's permutation visits every slot, and over 100 x
 * FE_BACKENDS_MAX, Maglev's bound for even shares; a weight is resolved to 1/16,381;
 * 64 KiB. */
#define FE_SLOTS 16381
/* Flows remembered (LRU, fe_flows): 65,536 x ~56 bytes of kernel memory (a few MiB);
 * the least recently used entry is evicted past it (see docs/frontend.md). Only a
 * SYN creates an entry, so packets of unknown flows cannot evict live ones. */
#define FE_FLOWS_MAX 65536
/* Moved flows (fe_moved, a plain hash: never evicted by traffic): 65,536 x ~64
 * bytes. An entry is removed by user space once idle FE_MOVED_IDLE (see
 * MOVED_IDLE_MAX in crates/frontend), so this holds ~218 migrations/s sustained;
 * when full, a MOVE is refused (FE_MOVE_FULL, counted FE_CNT_MOVE_FULL) and the
 * migration completes on its source. */
#define FE_MOVED_MAX 65536
/* A moved entry's last-seen time is rewritten at most this often (ns): one write
 * per second per moved flow, not one per packet. */
#define FE_SEEN_REFRESH_NS 1000000000ULL

/* Flow entry flags. */
#define FE_FLOW_HOLD 1 /* drop the flow's packets until hold_until_ns (held for a migration) */

/* Global counters (fe_counters, per CPU), by index. */
#define FE_CNT_PASSED 0        /* not ours: left to the stack */
#define FE_CNT_MALFORMED 1     /* to the VIP but bad lengths / truncated: dropped */
#define FE_CNT_FRAGMENT 2      /* TCP to the VIP, fragmented: dropped */
#define FE_CNT_IP_OPTIONS 3    /* TCP to the VIP with IP options: dropped */
#define FE_CNT_NONSYN_MISS 4   /* no flow entry and not a SYN: hashed, nothing recorded */
#define FE_CNT_HELD 5          /* dropped: the flow is held */
#define FE_CNT_NO_BACKEND 6    /* slot or entry names no configured back-end: dropped */
#define FE_CNT_INSERT_FAILED 7 /* flow entry could not be written (forwarded anyway) */
#define FE_CNT_SYN_HIT 8       /* a SYN that found an entry (4-tuple reuse): placed by the hash anew */
#define FE_CNT_MOVE_MALFORMED 9   /* UDP to the move port, not a well-formed MOVE: dropped */
#define FE_CNT_MOVE_REFUSED 10    /* MOVE from another host than the expected back-end,
                                   * or naming an unconfigured back-end: dropped */
#define FE_CNT_MOVED 11           /* MOVE answered MOVED (the entry named the requester) */
#define FE_CNT_MOVE_ALREADY 12    /* MOVE answered ALREADY (the entry named the new one) */
#define FE_CNT_MOVE_NOT_OWNER 13  /* MOVE answered NOT_OWNER (a third back-end) */
#define FE_CNT_MOVE_NOT_FOUND 14  /* MOVE answered NOT_FOUND (no entry) */
#define FE_CNT_MOVE_FULL 15       /* MOVE answered FULL (fe_moved full): nothing written */
#define FE_CNT_HOLD_EXPIRED 16    /* a held flow's hold ran out: forwarded, hold cleared */
#define FE_CNT_MOVE_UNAUTH 17     /* MOVE with keys on: no envelope, unknown key or bad tag:
                                   * dropped */
#define FE_CNT_MOVE_REPLAY 18     /* authentic MOVE whose sequence is not above the sender's
                                   * highest: dropped */
#define FE_CNT_MOVE_REPLAY_FULL 19 /* authentic MOVE of a sender new to a full fe_replay:
                                    * dropped */
#define FE_CNT_MOVE_WRONG_IFACE 20 /* MOVE arriving on another interface than the move
                                    * interface: dropped */
#define FE_COUNTERS 21

/* Keys the one-sided MOVE verifies with (fe_keys, by key id): a current and a
 * previous key during a rotation, with room to spare. */
#define FE_KEYS_MAX 4
/* (key id, sender) pairs whose highest MOVE sequence is remembered (fe_replay). Only
 * authentic messages whose sender is a configured back-end add one, so at most
 * FE_BACKENDS_MAX x FE_KEYS_MAX = 256 ever exist; if it is full anyway, a new
 * sender's MOVE is dropped (FE_CNT_MOVE_REPLAY_FULL): refused, never replayed. */
#define FE_REPLAY_MAX 256

/* The one-sided MOVE over UDP (docs/frontend.md "One-sided MOVE"), struct
 * fe_move_msg. Every field in network byte order. */
#define FE_MOVE_MAGIC 0x46534d56U /* "FSMV" */
#define FE_MOVE_VERSION 1
#define FE_MOVE_OP_REQUEST 1
#define FE_MOVE_OP_REPLY 2
/* Reply statuses. */
#define FE_MOVE_MOVED 1     /* the entry named the expected back-end: now the new one */
#define FE_MOVE_ALREADY 2   /* the entry already named the new back-end (a retry) */
#define FE_MOVE_NOT_OWNER 3 /* the entry names a third back-end: unchanged */
#define FE_MOVE_NOT_FOUND 4 /* no entry (evicted): nothing written */
#define FE_MOVE_FULL 5      /* the moved-flow table is full: nothing written */

#endif /* FRONTEND_CONSTS_H */
