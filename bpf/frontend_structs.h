/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Map keys and values of the blind front-end; mirrored (repr(C)) in crates/frontend/src/maps.rs. */
#ifndef FRONTEND_STRUCTS_H
#define FRONTEND_STRUCTS_H

#include <linux/types.h>

/* fe_config[0]. Addresses and port in network byte order. */
struct fe_config {
	__u32 vip;
	__u16 port;
	__u8 mac[6];     /* the front-end interface's MAC: only frames to it are routed;
	                  * it is also the source MAC of forwarded frames (so the LAN's
	                  * switches never learn a client's MAC on the front-end's port) */
	__u32 ifindex;   /* where forwarded frames go out (the same interface) */
	__u32 backends;  /* configured back-ends; 0 = route nothing (all passed) */
	__u32 ip;        /* the front-end's own address: MOVE requests go to it */
	__u16 move_port; /* UDP port of the one-sided MOVE; 0 = off (passed) */
	__u16 move_auth; /* 1: a MOVE must carry an auth envelope under a key of fe_keys */
	__u32 move_ifindex; /* MOVE is accepted only arriving on this interface */
	__u64 hash_k0;   /* the 4-tuple hash's SipHash key: secret, drawn by the loader */
	__u64 hash_k1;   /* from getrandom, so nobody outside can aim flows at a slot */
	__u8 move_mac[6]; /* the move interface's MAC (MOVE frames go to it; replies from it) */
	__u16 reserved;
};

/* fe_keys value: a SipHash key (crates/auth SipKey::halves). */
struct fe_key {
	__u64 k0;
	__u64 k1;
};

/* fe_replay key: whose sequence numbers; the value is the highest accepted. */
struct fe_replay_key {
	__u32 key_id;
	__u32 reserved; /* 0 */
	__u64 sender;
};

/* fe_backends[i]. */
struct fe_backend {
	__u8 mac[6];
	__u16 reserved;
	__u32 ip; /* network byte order; informative (the frame keeps the VIP) */
};

/* fe_flows key: the client's 4-tuple, network byte order. */
struct fe_flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
};

/* fe_flows and fe_moved value. */
struct fe_flow {
	__u32 backend;       /* index into fe_backends */
	__u32 flags;         /* FE_FLOW_* */
	__u64 hold_until_ns; /* FE_FLOW_HOLD: dropped until then (bpf_ktime_get_ns) */
	__u64 seen_ns;       /* fe_moved: last packet (to FE_SEEN_REFRESH_NS); user space
	                      * removes entries idle too long */
};

/* fe_bstats[i], per CPU. */
struct fe_bstats {
	__u64 packets;
	__u64 new_flows;
};

/* The one-sided MOVE (UDP payload, exactly this size; request and reply alike;
 * behind a struct auth_envelope when fe_config.move_auth is set). Network byte order
 * throughout. */
struct fe_move_msg {
	__u32 magic;       /* FE_MOVE_MAGIC */
	__u8 version;      /* FE_MOVE_VERSION */
	__u8 op;           /* FE_MOVE_OP_REQUEST; the reply: FE_MOVE_OP_REPLY */
	__u16 status;      /* request: 0; reply: FE_MOVE_MOVED ... FE_MOVE_NOT_FOUND */
	__u64 seq;         /* the requester's, echoed */
	__u32 client_ip;   /* the flow: client address and port (to the VIP:port) */
	__u16 client_port;
	__u16 reserved;    /* 0 */
	__u32 expected;    /* the back-end the entry names now (= the requester's IP) */
	__u32 next;        /* the back-end it is to name */
};

#endif /* FRONTEND_STRUCTS_H */
