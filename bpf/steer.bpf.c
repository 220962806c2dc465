// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Speculative-admission steering (seed 002, issue 12 item 3): an sk_lookup program
 * attached to a back-end's network namespace. For a new TCP/IPv4 connection to the
 * service (config.vip, 0 = any local address, and config.port) it decides which
 * listener takes the SYN:
 *   - config.divert == 0: the normal lookup (the web server's own listener);
 *     counted STEER_CNT_SERVER;
 *   - config.divert == 1: the daemon's admission listener (steer_sock[0]), which
 *     accepts it as a migratory connection; counted STEER_CNT_DAEMON. If the daemon
 *     has no listener in the map or the assignment fails, the normal lookup
 *     (STEER_CNT_NO_DAEMON / STEER_CNT_ASSIGN_FAILED, and STEER_CNT_SERVER).
 * The daemon (crates/spec/src/steer.rs) sets divert from the server's accept queue
 * (sock_diag) and its admission window every poll period: "queue at Q and the
 * window has room". sk_lookup runs only when no established socket or request
 * socket matches, i.e. for SYNs (and for final ACKs under SYN cookies), and for
 * listener lookups without a packet (sock_diag), which are left alone.
 * Everything else: SK_PASS with no assignment (the kernel's own lookup).
 */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

/* Helpers, by their UAPI numbers (no libbpf headers needed). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_sk_assign)(void *ctx, void *sk, __u64 flags) = (void *)BPF_FUNC_sk_assign;
static long (*bpf_sk_release)(void *sk) = (void *)BPF_FUNC_sk_release;

/* Address family and protocol numbers (linux/socket.h, linux/in.h). */
#define STEER_AF_INET 2
#define STEER_IPPROTO_TCP 6

/* Counter indices (user space: crates/spec/src/steer.rs, same numbers). */
#define STEER_CNT_SERVER 0
#define STEER_CNT_DAEMON 1
#define STEER_CNT_NO_DAEMON 2
#define STEER_CNT_ASSIGN_FAILED 3
#define STEER_COUNTERS 4

/* Configuration, entry 0; written by the daemon. */
struct steer_config {
	__u32 vip;    /* IPv4, network order; 0 = any local address */
	__u32 port;   /* service port, host order */
	__u32 divert; /* 1: new connections go to the daemon's listener */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
} steer_config SEC(".maps");

/* The daemon's admission listener, entry 0 (user space writes its fd: a u32). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} steer_sock SEC(".maps");

/* Counters per CPU, indexed by STEER_CNT_*; user space sums the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STEER_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} steer_counters SEC(".maps");

static __attribute__((always_inline)) inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&steer_counters, &i);

	if (c)
		*c += 1;
}

SEC("sk_lookup")
int steer(struct bpf_sk_lookup *ctx)
{
	__u32 zero = 0;
	struct steer_config *c = bpf_map_lookup_elem(&steer_config, &zero);
	struct bpf_sock *sk;
	long err;

	if (!c)
		return SK_PASS;
	if (ctx->family != STEER_AF_INET || ctx->protocol != STEER_IPPROTO_TCP)
		return SK_PASS;
	/* Lookups without a packet (ingress_ifindex 0: sock_diag's exact lookup of a
	 * listener, which the daemon polls) must find the real listener. */
	if (ctx->ingress_ifindex == 0)
		return SK_PASS;
	if (ctx->local_port != c->port || (c->vip && ctx->local_ip4 != c->vip))
		return SK_PASS;
	if (!c->divert) {
		count(STEER_CNT_SERVER);
		return SK_PASS;
	}
	sk = bpf_map_lookup_elem(&steer_sock, &zero);
	if (!sk) {
		count(STEER_CNT_NO_DAEMON);
		count(STEER_CNT_SERVER);
		return SK_PASS;
	}
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	if (err) {
		count(STEER_CNT_ASSIGN_FAILED);
		count(STEER_CNT_SERVER);
		return SK_PASS;
	}
	count(STEER_CNT_DAEMON);
	return SK_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
