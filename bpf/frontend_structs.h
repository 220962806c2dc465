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

/* fe_flows value. */
struct fe_flow {
	__u32 backend; /* index into fe_backends */
	__u32 flags;   /* FE_FLOW_* */
};

/* fe_bstats[i], per CPU. */
struct fe_bstats {
	__u64 packets;
	__u64 new_flows;
};

#endif /* FRONTEND_STRUCTS_H */
