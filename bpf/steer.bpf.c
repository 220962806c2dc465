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
 *   - config.mode == STEER_MODE_KERNEL: this program, per SYN, from the exact queue of
 *     the server's listener (steer_sock[1]): its admitted connections are the
 *     established ones waiting for accept (sk_ack_backlog) plus the half-open ones
 *     (request socks, icsk_accept_queue.qlen): a burst's SYNs arrive while their
 *     predecessors are still half-open, and every one of them would be accepted.
 *       - backlog + half_open >= config.queue (Q) and the daemon's window has room
 *         (steer_live.room, a plain store by the daemon into this mmapped map on
 *         window events): the daemon's listener (STEER_CNT_DAEMON; counted
 *         STEER_CNT_HALF_OPEN too if the established ones alone were below Q);
 *       - backlog >= Q, no room and config.drop_no_room (specd --no-room drop): the
 *         queue is full as the paper's enlarged accept queue is with its admission
 *         part shut, and the SYN is dropped silently as the kernel drops a SYN at a
 *         full accept queue (the client retransmits it): it is assigned to the
 *         daemon's refusal listener (steer_sock[2], a listener whose own accept queue
 *         is kept full, so the kernel drops it there; STEER_CNT_DROPPED). Only
 *         established connections count for this: spoofed SYNs make half-open ones
 *         but never established ones, so a SYN flood cannot make the program drop
 *         legitimate SYNs;
 *       - otherwise the server (STEER_CNT_SERVER; STEER_CNT_FULL_PASSED if its queue
 *         was at Q or past it, half-open ones counted, while the window had no room:
 *         the connection waits in the server's own backlog).
 *     The offsets of both fields come from the kernel's BTF (config.off_ack_backlog,
 *     config.off_qlen; aya loads without CO-RE); the readings are published in
 *     steer_live (backlog, half_open), which the daemon reads from its mapping (no
 *     syscall). The listeners' map entries do not keep them alive: the kernel removes
 *     one when its socket closes; without the server's listener the SYN takes the
 *     normal lookup (STEER_CNT_NO_SERVER), without the refusal listener a SYN the
 *     program would drop goes to the server too. Nothing is dropped that the program
 *     did not read: a failed read is the normal lookup.
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
#define STEER_CNT_HALF_OPEN 5 /* diverted; established ones alone were below Q */
#define STEER_CNT_DROPPED 6 /* dropped at the refusal listener: backlog >= Q, no room */
#define STEER_CNT_FULL_PASSED 7 /* to the server with backlog + half-open >= Q, no room */
#define STEER_COUNTERS 8

/* config.mode (user space: steer::Mode, same numbers). */
#define STEER_MODE_POLL 0
#define STEER_MODE_KERNEL 1

/* Bound on the offsets read in struct tcp_sock (sk_ack_backlog lies in struct sock,
 * under 1 KiB; icsk_accept_queue.qlen in struct inet_connection_sock, under 2 KiB;
 * the mask keeps the verifier's view of the pointer arithmetic bounded). */
#define STEER_SK_OFF_MASK 0xfff

/* steer_sock entries. */
#define STEER_SOCK_DAEMON 0
#define STEER_SOCK_SERVER 1
#define STEER_SOCK_REFUSE 2
#define STEER_SOCKS 3

/* Configuration, entry 0; written by the daemon (a syscall, on mode changes). */
struct steer_config {
	__u32 vip;             /* IPv4, network order; 0 = any local address */
	__u32 port;            /* service port, host order */
	__u32 divert;          /* poll mode: 1 = new connections go to the daemon */
	__u32 mode;            /* STEER_MODE_* */
	__u32 queue;           /* kernel mode: Q (see the decision above) */
	__u32 off_ack_backlog; /* kernel mode: offset of sk_ack_backlog in struct sock */
	__u32 off_qlen;        /* kernel mode: offset of icsk_accept_queue.qlen */
	__u32 drop_no_room;    /* kernel mode: 1 = drop at backlog >= Q without room */
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
	__u32 half_open; /* program: the server's icsk_accept_queue.qlen then */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct steer_live);
} steer_live SEC(".maps");

/* Entry 0: the daemon's admission listener; entry 1: the server's listener (kernel
 * mode); entry 2: the daemon's refusal listener (kernel mode). User space writes fds
 * as u64 (value size 8 so that it can read an entry's socket cookie back, to see
 * whether the server's listener is still there). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, STEER_SOCKS);
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

/* Where a SYN goes (kernel_decides's answer). */
#define STEER_TO_SERVER 0
#define STEER_TO_DAEMON 1
#define STEER_TO_REFUSE 2

/* The kernel mode's rule (user space mirrors it: window::syn_verdict, pinned by its
 * unit tests). */
static __attribute__((always_inline)) inline int verdict(__u32 backlog, __u32 half_open,
							  __u32 queue, __u32 room, __u32 drop)
{
	if (room && backlog + half_open >= queue)
		return STEER_TO_DAEMON;
	if (!room && drop && backlog >= queue)
		return STEER_TO_REFUSE;
	return STEER_TO_SERVER;
}

/* Kernel mode: where this SYN goes. Reads the server's backlog and half-open count
 * and publishes them, whatever the window says (the daemon's migrators use them).
 * Any failed read: the server (the normal lookup). */
static __attribute__((always_inline)) inline int kernel_decides(struct steer_config *c)
{
	__u32 key = STEER_SOCK_SERVER, zero = 0, q = 0, h = 0, room;
	struct steer_live *live = bpf_map_lookup_elem(&steer_live, &zero);
	struct bpf_sock *srv;
	void *tp;
	long err = -1;
	int to;

	if (!live)
		return STEER_TO_SERVER;
	srv = bpf_map_lookup_elem(&steer_sock, &key);
	if (!srv) {
		count(STEER_CNT_NO_SERVER);
		return STEER_TO_SERVER;
	}
	tp = bpf_skc_to_tcp_sock(srv);
	if (tp) {
		err = bpf_probe_read_kernel(&q, sizeof(q), tp + (c->off_ack_backlog & STEER_SK_OFF_MASK));
		if (!err)
			err = bpf_probe_read_kernel(&h, sizeof(h), tp + (c->off_qlen & STEER_SK_OFF_MASK));
	}
	bpf_sk_release(srv);
	if (err)
		return STEER_TO_SERVER;
	live->backlog = q;
	live->half_open = h;
	__sync_fetch_and_add(&live->seen, 1);
	room = live->room;
	to = verdict(q, h, c->queue, room, c->drop_no_room);
	if (to == STEER_TO_DAEMON && q < c->queue)
		count(STEER_CNT_HALF_OPEN);
	if (to == STEER_TO_SERVER && !room && q + h >= c->queue)
		count(STEER_CNT_FULL_PASSED);
	return to;
}

/* Assigns the SYN to steer_sock[idx]: 0 on success, STEER_NO_SOCK if the entry is
 * empty, else bpf_sk_assign's negative error. */
#define STEER_NO_SOCK 1

static __attribute__((always_inline)) inline long assign(struct bpf_sk_lookup *ctx, __u32 idx)
{
	struct bpf_sock *sk = bpf_map_lookup_elem(&steer_sock, &idx);
	long err;

	if (!sk)
		return STEER_NO_SOCK;
	err = bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return err;
}

/* The decision for one lookup; `kernel_ok` is a constant per program (steer: 1,
 * steer_poll: 0), so steer_poll has no kernel-mode code and needs no CAP_PERFMON
 * helpers: the daemon loads it when the verifier refuses steer (lockdown, no
 * perfmon) and then runs in poll mode. */
static __attribute__((always_inline)) inline int decide(struct bpf_sk_lookup *ctx, int kernel_ok)
{
	__u32 zero = 0;
	struct steer_config *c = bpf_map_lookup_elem(&steer_config, &zero);
	int to;
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
		to = kernel_decides(c);
	else
		to = c->divert ? STEER_TO_DAEMON : STEER_TO_SERVER;
	if (to == STEER_TO_REFUSE) {
		/* No refusal listener (or it is gone): the server, as before the daemon. */
		if (assign(ctx, STEER_SOCK_REFUSE) == 0) {
			count(STEER_CNT_DROPPED);
			return SK_PASS;
		}
		count(STEER_CNT_FULL_PASSED);
		to = STEER_TO_SERVER;
	}
	if (to == STEER_TO_SERVER) {
		count(STEER_CNT_SERVER);
		return SK_PASS;
	}
	err = assign(ctx, STEER_SOCK_DAEMON);
	if (err) {
		count(err == STEER_NO_SOCK ? STEER_CNT_NO_DAEMON : STEER_CNT_ASSIGN_FAILED);
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
