// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Speculative-admission steering (seed 002): an sk_lookup program
 * attached to a back-end's network namespace. For a new TCP/IPv4 connection to the
 * service (config.vip, 0 = any local address, and config.port) it decides which
 * listener takes the SYN: the normal lookup (the web server's own listener; counted
 * STEER_CNT_SERVER) or the daemon's admission listener (steer_sock[0]), which accepts
 * it as a migratory connection (STEER_CNT_DAEMON). If the daemon has no listener in
 * the map or the assignment fails, the normal lookup (STEER_CNT_NO_DAEMON /
 * STEER_CNT_ASSIGN_FAILED, and STEER_CNT_SERVER).
 *
 * Who decides:
 *   - config.mode == STEER_MODE_KERNEL: this program, per SYN, from the exact queue:
 *     divert iff the server's listener (steer_sock[1]) has sk_ack_backlog >= config.queue
 *     and the daemon's window has room (steer_live.room, a plain store by the daemon
 *     into this mmapped map on window events). The backlog is read at the offset of
 *     struct sock.sk_ack_backlog the daemon found in the kernel's BTF
 *     (config.off_ack_backlog; aya loads without CO-RE) and published in
 *     steer_live.backlog, which the daemon reads from its mapping (no syscall). The
 *     listener's map entry does not keep it alive: the kernel removes it when the
 *     server closes the socket, and then the SYN takes the normal lookup
 *     (STEER_CNT_NO_SERVER).
 *   - config.mode == STEER_MODE_POLL: the daemon, from its polls (sock_diag) of the
 *     server's queue and its window, in config.divert (the fallback when the server's
 *     listener cannot be put in the map, or when the verifier refuses `steer`'s
 *     helpers: then the daemon attaches `steer_poll`, the same program without the
 *     kernel mode).
 *
 * sk_lookup runs only when no established socket or request socket matches, i.e. for
 * SYNs (and for final ACKs under SYN cookies), and for listener lookups without a
 * packet (sock_diag), which are left alone. Everything else: SK_PASS with no
 * assignment (the kernel's own lookup).
 */
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

/* Helpers, by their UAPI numbers (no libbpf headers needed). In sk_lookup the kernel
 * offers bpf_sk_base_func_proto: skc_to_tcp_sock and probe_read_kernel need
 * CAP_PERFMON (the daemon runs as root). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_sk_assign)(void *ctx, void *sk, __u64 flags) = (void *)BPF_FUNC_sk_assign;
static long (*bpf_sk_release)(void *sk) = (void *)BPF_FUNC_sk_release;
static void *(*bpf_skc_to_tcp_sock)(void *sk) = (void *)BPF_FUNC_skc_to_tcp_sock;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) =
	(void *)BPF_FUNC_probe_read_kernel;

/* Address family and protocol numbers (linux/socket.h, linux/in.h). */
#define STEER_AF_INET 2
#define STEER_IPPROTO_TCP 6

/* Counter indices (user space: crates/specd/src/steer.rs, same numbers). */
#define STEER_CNT_SERVER 0
#define STEER_CNT_DAEMON 1
#define STEER_CNT_NO_DAEMON 2
#define STEER_CNT_ASSIGN_FAILED 3
#define STEER_CNT_NO_SERVER 4 /* kernel mode, the server's listener not in the map */
#define STEER_COUNTERS 5

/* config.mode (user space: steer::Mode, same numbers). */
#define STEER_MODE_POLL 0
#define STEER_MODE_KERNEL 1

/* Bound on the sk_ack_backlog offset (struct sock is under 1 KiB; the mask keeps the
 * verifier's view of the pointer arithmetic bounded). */
#define STEER_SK_OFF_MASK 0xfff

/* steer_sock entries. */
#define STEER_SOCK_DAEMON 0
#define STEER_SOCK_SERVER 1

/* Configuration, entry 0; written by the daemon (a syscall, on mode changes). */
struct steer_config {
	__u32 vip;             /* IPv4, network order; 0 = any local address */
	__u32 port;            /* service port, host order */
	__u32 divert;          /* poll mode: 1 = new connections go to the daemon */
	__u32 mode;            /* STEER_MODE_* */
	__u32 queue;           /* kernel mode: Q, divert at sk_ack_backlog >= queue */
	__u32 off_ack_backlog; /* kernel mode: offset of sk_ack_backlog in struct sock */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
} steer_config SEC(".maps");

/* Shared with the daemon through mmap (entry 0): plain loads and stores both sides. */
struct steer_live {
	__u32 room;    /* daemon: 1 while the window has room (kernel mode) */
	__u32 backlog; /* program: the server's sk_ack_backlog at the last SYN */
	__u64 seen;    /* program: SYNs whose backlog was read (a change count) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct steer_live);
} steer_live SEC(".maps");

/* Entry 0: the daemon's admission listener; entry 1: the server's listener (kernel
 * mode). User space writes fds as u64 (value size 8 so that it can read an entry's
 * socket cookie back, to see whether the server's listener is still there). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
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

/* Kernel mode: whether this SYN goes to the daemon. Reads the server's backlog and
 * publishes it, whatever the window says (the daemon's acceptor uses it). */
static __attribute__((always_inline)) inline int kernel_decides(struct steer_config *c)
{
	__u32 key = STEER_SOCK_SERVER, zero = 0, q = 0;
	struct steer_live *live = bpf_map_lookup_elem(&steer_live, &zero);
	struct bpf_sock *srv;
	void *tp;
	long err = -1;

	if (!live)
		return 0;
	srv = bpf_map_lookup_elem(&steer_sock, &key);
	if (!srv) {
		count(STEER_CNT_NO_SERVER);
		return 0;
	}
	tp = bpf_skc_to_tcp_sock(srv);
	if (tp)
		err = bpf_probe_read_kernel(&q, sizeof(q), tp + (c->off_ack_backlog & STEER_SK_OFF_MASK));
	bpf_sk_release(srv);
	if (err)
		return 0;
	live->backlog = q;
	__sync_fetch_and_add(&live->seen, 1);
	return q >= c->queue && live->room;
}

/* The decision for one lookup; `kernel_ok` is a constant per program (steer: 1,
 * steer_poll: 0), so steer_poll has no kernel-mode code and needs no CAP_PERFMON
 * helpers: the daemon loads it when the verifier refuses steer (lockdown, no
 * perfmon) and then runs in poll mode. */
static __attribute__((always_inline)) inline int decide(struct bpf_sk_lookup *ctx, int kernel_ok)
{
	__u32 zero = 0;
	struct steer_config *c = bpf_map_lookup_elem(&steer_config, &zero);
	struct bpf_sock *sk;
	int divert;
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
	if (kernel_ok && c->mode == STEER_MODE_KERNEL)
		divert = kernel_decides(c);
	else
		divert = c->divert;
	if (!divert) {
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

SEC("sk_lookup")
int steer(struct bpf_sk_lookup *ctx)
{
	return decide(ctx, 1);
}

SEC("sk_lookup")
int steer_poll(struct bpf_sk_lookup *ctx)
{
	return decide(ctx, 0);
}

char _license[] SEC("license") = "Dual BSD/GPL";
