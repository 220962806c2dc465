// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Flow hold of a same-namespace migration (crates/migrate/src/hold.rs): an
 * sk_lookup program attached to the network namespace of a source daemon that
 * migrates with Handover::CloseBeforeRestore. Between the source's silent close and
 * the target's restore no established socket has the connection's 4-tuple, so a
 * client segment arriving then would meet the service's listener and be answered
 * with a RST. For a 4-tuple in hold_flows (put there by the source just before its
 * close, removed after the restore or the local fall-back) this program assigns the
 * lookup to a black-hole listener (hold_sock: a TCP listener of the daemon with a
 * drop-everything socket filter): tcp_v4_rcv / tcp_v6_rcv run the socket filter
 * before any TCP processing, so the segment is dropped silently, neither queued nor
 * answered; the client retransmits it to the restored socket.
 *
 * Returning SK_DROP instead would not do: the kernel answers a refused lookup with a
 * RST (tcp_v4_rcv -> no_tcp_socket).
 *
 * sk_lookup runs only when no established (or request) socket matches, so a held
 * 4-tuple costs nothing while the source's or the restored socket exists. An entry
 * past its deadline (bpf_ktime_get_ns, CLOCK_MONOTONIC) is ignored: a hold the
 * daemon failed to remove lasts a bounded time. The selection replaces one an
 * earlier program in the namespace made (the steering program of crates/specd picks
 * the daemon's admission listener for the service port, which would answer with a
 * RST as well).
 */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_sk_assign)(void *ctx, void *sk, __u64 flags) = (void *)BPF_FUNC_sk_assign;
static long (*bpf_sk_release)(void *sk) = (void *)BPF_FUNC_sk_release;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;

#define HOLD_AF_INET 2
#define HOLD_AF_INET6 10
#define HOLD_IPPROTO_TCP 6

/* Bound of hold_flows (user space: hold::FLOWS_MAX, same number). */
#define HOLD_FLOWS_MAX 4096

/* hold_sock entries (user space: hold.rs). */
#define HOLD_SOCK_V4 0
#define HOLD_SOCK_V6 1

/* Counter indices (user space: hold.rs, same numbers). */
#define HOLD_CNT_DROPPED 0  /* segments of a held flow sent to the black hole */
#define HOLD_CNT_EXPIRED 1  /* lookups that found a held flow past its deadline */
#define HOLD_CNT_NO_SOCK 2  /* held flow, but no black-hole listener of its family */
#define HOLD_CNT_ASSIGN_FAILED 3
#define HOLD_COUNTERS 4

/* A TCP 4-tuple as the lookup sees it: addresses in network order (IPv4 in [0],
 * the rest zero), local port in host order, remote port in network order. */
struct hold_key {
	__u32 family;
	__u32 local_ip[4];
	__u32 remote_ip[4];
	__u32 local_port;
	__u32 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, HOLD_FLOWS_MAX);
	__type(key, struct hold_key);
	__type(value, __u64); /* deadline, bpf_ktime_get_ns() */
} hold_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} hold_sock SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HOLD_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} hold_counters SEC(".maps");

static __attribute__((always_inline)) inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&hold_counters, &i);

	if (c)
		*c += 1;
}

SEC("sk_lookup")
int hold(struct bpf_sk_lookup *ctx)
{
	struct hold_key k = {};
	struct bpf_sock *sk;
	__u32 which;
	__u64 *deadline;
	long err;

	if (ctx->protocol != HOLD_IPPROTO_TCP)
		return SK_PASS;
	/* Lookups without a packet (sock_diag) are left alone. */
	if (ctx->ingress_ifindex == 0)
		return SK_PASS;
	k.family = ctx->family;
	if (ctx->family == HOLD_AF_INET) {
		k.local_ip[0] = ctx->local_ip4;
		k.remote_ip[0] = ctx->remote_ip4;
		which = HOLD_SOCK_V4;
	} else if (ctx->family == HOLD_AF_INET6) {
		k.local_ip[0] = ctx->local_ip6[0];
		k.local_ip[1] = ctx->local_ip6[1];
		k.local_ip[2] = ctx->local_ip6[2];
		k.local_ip[3] = ctx->local_ip6[3];
		k.remote_ip[0] = ctx->remote_ip6[0];
		k.remote_ip[1] = ctx->remote_ip6[1];
		k.remote_ip[2] = ctx->remote_ip6[2];
		k.remote_ip[3] = ctx->remote_ip6[3];
		which = HOLD_SOCK_V6;
	} else {
		return SK_PASS;
	}
	k.local_port = ctx->local_port;
	k.remote_port = ctx->remote_port;
	deadline = bpf_map_lookup_elem(&hold_flows, &k);
	if (!deadline)
		return SK_PASS;
	if (bpf_ktime_get_ns() > *deadline) {
		count(HOLD_CNT_EXPIRED);
		return SK_PASS;
	}
	sk = bpf_map_lookup_elem(&hold_sock, &which);
	if (!sk) {
		count(HOLD_CNT_NO_SOCK);
		return SK_PASS;
	}
	err = bpf_sk_assign(ctx, sk, BPF_SK_LOOKUP_F_REPLACE);
	bpf_sk_release(sk);
	if (err) {
		count(HOLD_CNT_ASSIGN_FAILED);
		return SK_PASS;
	}
	count(HOLD_CNT_DROPPED);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
