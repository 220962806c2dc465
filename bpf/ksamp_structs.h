/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/* Map value and context layouts of the kernel-resident load sampler (ksamp.bpf.c). */
#ifndef KSAMP_STRUCTS_H
#define KSAMP_STRUCTS_H

#include <linux/types.h>
#include "ksamp_consts.h"

/* Configuration, written by the loader before anything is attached. */
struct ksamp_config {
	__u16 ports[KSAMP_PORTS_MAX]; /* watched TCP ports, host order; 0 = unused */
	__u32 ncpu;                   /* CPUs summed into the utilisation (<= KSAMP_CPUS_MAX) */
	__u32 writer_cpu;             /* the CPU whose tick publishes the record */
	/* Offsets in struct sock, from the running kernel's BTF (the loader reads them). */
	__u32 off_num;                /* __sk_common.skc_num: local port, host order */
	__u32 off_state;              /* __sk_common.skc_state */
	__u32 off_ack_backlog;        /* sk_ack_backlog: the accept queue's length */
	__u32 off_net;                /* __sk_common.skc_net: struct net * */
	__u32 off_net_inum;           /* ns.inum in struct net */
	__u32 netns_inum;             /* only sockets of this network namespace count; 0 = any */
	/*
	 * The CPUs other than the writer tick every other_stride periods (the loader
	 * attaches their timers at that period), and weigh each tick by 1/2^other_ema_shift
	 * (<= KSAMP_EMA_SHIFT): KSAMP_EMA_SHIFT - log2(other_stride), at least 0, so their
	 * averages keep the writer's time constant in time, not in ticks.
	 */
	__u32 other_stride;
	__u32 other_ema_shift;
};

/*
 * Per watched port (index as in ports[]). established: event-maintained with atomic
 * adds, signed (an event the seed missed may take it below zero for a while; the
 * record shows max(0, sum)). backlog: the seed's accept-queue length, published for a
 * port until one of its listeners is known (then its sk_ack_backlog is read instead).
 */
struct ksamp_counts {
	__s64 established[KSAMP_PORTS_MAX];
	__s64 backlog[KSAMP_PORTS_MAX];
};

/*
 * Listening sockets of watched ports, learnt when they signal a queued connection
 * (sock:sk_data_ready on a LISTEN socket) and forgotten when they close. An entry is
 * claimed by compare-and-swap of sk from 0; slot is the port index + 1 (0 = not yet
 * set), written after the claim.
 */
struct ksamp_listeners {
	__u64 sk[KSAMP_LISTENERS_MAX];
	__u64 slot[KSAMP_LISTENERS_MAX];
	/* Connections queued on it since it was remembered (its data-ready signals). */
	__u64 arrivals[KSAMP_LISTENERS_MAX];
	/* bpf_ktime_get_ns of arrival n at ring[n % KSAMP_ARRIVALS_RING]. */
	__u64 ring[KSAMP_LISTENERS_MAX][KSAMP_ARRIVALS_RING];
};

/* One CPU's sampled state; only that CPU writes it. */
struct ksamp_cpu {
	__u64 busy_ema_ppm; /* exponential average of its busy ticks, ppm */
	__u64 busy;         /* 1 if a task other than idle ran at its last tick */
};

struct ksamp_cpus {
	struct ksamp_cpu cpu[KSAMP_CPUS_MAX];
};

/* Context of the sock:inet_sock_set_state tracepoint (its format file, stable ABI). */
struct ksamp_inet_sock_set_state {
	__u64 common;       /* common_type, flags, preempt_count, pid */
	const void *skaddr;
	__s32 oldstate;
	__s32 newstate;
	__u16 sport;        /* host order */
	__u16 dport;
	__u16 family;
	__u16 protocol;
	__u8 saddr[4];
	__u8 daddr[4];
	__u8 saddr_v6[16];
	__u8 daddr_v6[16];
};

_Static_assert(sizeof(struct ksamp_inet_sock_set_state) == 72, "tracepoint record size");

/* Context of the sock:sk_data_ready tracepoint. */
struct ksamp_sk_data_ready {
	__u64 common;
	const void *skaddr;
	__u16 family;
	__u16 protocol;
	__u32 pad;
	__u64 ip;
};

_Static_assert(sizeof(struct ksamp_sk_data_ready) == 32, "tracepoint record size");

#endif /* KSAMP_STRUCTS_H */
