// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Kernel-resident load sampler: keeps the node's load record in the region map
 * (rmem_region, the map the XDP responder answers from) with no user-space process
 * involved, so with XDP neither publishing nor reading a back-end's load schedules a
 * user process on it. Built into the same object as rmem.bpf.c (included at its end)
 * so that both use one region map: aya 0.14 shares a map between objects only by
 * bpffs pinning.
 *
 * Three programs:
 *  - ksamp_state (tracepoint sock:inet_sock_set_state): per watched port, atomic
 *    +1/-1 of established connections (any transition into / out of ESTABLISHED
 *    with the local port watched). A watched listener that closes (LISTEN -> CLOSE)
 *    is forgotten and its port's seeded backlog set to 0.
 *  - ksamp_ready (tracepoint sock:sk_data_ready): a LISTEN socket on a watched port
 *    signals a queued connection: it is remembered (ksamp_listeners), and from then
 *    on the tick reads its accept queue's length (sk_ack_backlog) directly, so
 *    accepts need no hook (this kernel has no kprobes, and tracing programs such as
 *    fexit are refused with EPERM here). A listener that has not signalled since the
 *    sampler started is counted from the seed.
 * Both count only sockets of the loader's network namespace (config.netns_inum, read
 * through skc_net at BTF offsets), so nodes in other namespaces on the same port
 * (the lab's back-ends) do not count.
 *  - ksamp_tick (perf_event, cpu-clock): the CPU notes whether a task other than its
 *    idle task was running (an exponential average of these ticks is its utilisation,
 *    as tick-based accounting does), and the tick on config.writer_cpu publishes the
 *    record under the seqlock. The writer ticks every period; the other CPUs only
 *    sample their busy state, every config.other_stride periods (the loader picks the
 *    stride so that all of them together tick at most a quarter as often as the
 *    writer: the sampler's cost does not grow with the CPU count), each tick weighed
 *    more (config.other_ema_shift) so that their averages keep the same time constant
 *    in milliseconds while the stride is at most 2^KSAMP_EMA_SHIFT periods.
 * The loader (crates/xdp/src/ksamp.rs) seeds the counters from one sock_diag dump
 * after attaching, so counts start from the sockets that already exist, and writes
 * the struct sock offsets it read from the kernel's BTF into the config.
 *
 * The record: sample_mono_ns (bpf_ktime_get_ns = CLOCK_MONOTONIC), cpu_util_ppm,
 * runnable (CPUs running a task at their last tick: a lower bound of procs_running),
 * conns_established, accept_backlog, ncpu, and with a watched port flags = FLAG_CONNS and
 * conns_sampled_mono_ns = sample_mono_ns (the counts are current), and FLAG_QUEUE_DELAY
 * with queue_delay_us: the age of the oldest connection waiting in a watched accept
 * queue (ksamp_head_age; the user-space sampler also counts a request accepted but not
 * yet read, which the kernel sampler does not see). CPU pressure, pending connections,
 * memory, inflight and the sample cost are not known here and are 0 with their flags
 * clear.
 *
 * Seqlock: as crates/region/src/seqlock.rs, tail := seq, fields, head := seq. The
 * two sequence stores are atomic exchanges (BPF_XCHG is fully ordered on every
 * JIT), so no field store moves before the tail or after the head; a reader's one
 * READ validates head == tail != 0. Only the writer CPU's tick writes the record,
 * and a perf event does not nest on its own CPU, so there is one writer.
 */
#include "ksamp_consts.h"
#include "ksamp_maps.h"
#include "ksamp_structs.h"
#include "rmem_helpers.h"
#include "rmem_maps.h"

/* Index of port in the watched ports, or -1. */
static __always_inline int ksamp_port_slot(const struct ksamp_config *c, __u16 port)
{
	if (port == 0)
		return -1;
#pragma unroll
	for (int i = 0; i < KSAMP_PORTS_MAX; i++)
		if (c->ports[i] == port)
			return i;
	return -1;
}

/* Whether socket sk belongs to the configured network namespace. */
static __always_inline int ksamp_our_netns(const struct ksamp_config *cfg, __u64 sk)
{
	__u64 net = 0;
	__u32 inum = 0;

	if (cfg->netns_inum == 0)
		return 1;
	if (bpf_probe_read_kernel(&net, sizeof(net), (void *)(sk + cfg->off_net)) || !net)
		return 0;
	if (bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + cfg->off_net_inum)))
		return 0;
	return inum == cfg->netns_inum;
}

/* Forget a closed listener. */
static __always_inline void ksamp_forget(__u64 sk)
{
	__u32 zero = 0;
	struct ksamp_listeners *l = bpf_map_lookup_elem(&ksamp_listeners, &zero);

	if (!l)
		return;
#pragma unroll
	for (int i = 0; i < KSAMP_LISTENERS_MAX; i++) {
		if (l->sk[i] == sk) {
			l->slot[i] = 0;
			l->arrivals[i] = 0;
			__sync_val_compare_and_swap(&l->sk[i], sk, 0);
		}
	}
}

SEC("tracepoint/sock/inet_sock_set_state")
int ksamp_state(struct ksamp_inet_sock_set_state *ctx)
{
	__u32 zero = 0;
	struct ksamp_config *cfg;
	struct ksamp_counts *cnt;
	int i;

	if (ctx->protocol != KSAMP_IPPROTO_TCP)
		return 0;
	cfg = bpf_map_lookup_elem(&ksamp_config, &zero);
	cnt = bpf_map_lookup_elem(&ksamp_counts, &zero);
	if (!cfg || !cnt)
		return 0;
	i = ksamp_port_slot(cfg, ctx->sport);
	if (i < 0 || !ksamp_our_netns(cfg, (__u64)ctx->skaddr))
		return 0;
	i &= KSAMP_PORTS_MAX - 1;
	if (ctx->newstate == KSAMP_TCP_ESTABLISHED) {
		__sync_fetch_and_add(&cnt->established[i], 1);
	} else if (ctx->oldstate == KSAMP_TCP_ESTABLISHED) {
		__sync_fetch_and_add(&cnt->established[i], -1);
	} else if (ctx->oldstate == KSAMP_TCP_LISTEN && ctx->newstate == KSAMP_TCP_CLOSE) {
		/* Its queue is flushed without accept. */
		__sync_lock_test_and_set(&cnt->backlog[i], 0);
		ksamp_forget((__u64)ctx->skaddr);
	}
	return 0;
}

/*
 * A connection was queued on listener j (its data-ready signal): note its arrival time.
 * Signals on one listener can come from several CPUs at once; the fetch-and-add gives
 * each its own ring slot.
 */
static __always_inline void ksamp_arrival(struct ksamp_listeners *l, int j)
{
	__u64 n = __sync_fetch_and_add(&l->arrivals[j & (KSAMP_LISTENERS_MAX - 1)], 1);

	l->ring[j & (KSAMP_LISTENERS_MAX - 1)][n & (KSAMP_ARRIVALS_RING - 1)] = bpf_ktime_get_ns();
}

/*
 * Age of the oldest connection in listener j's accept queue of length q, ns (0: empty
 * or unknown). The queue is FIFO and every queued connection signalled its arrival, so
 * its head is arrival (arrivals - q). A head queued before the listener was remembered,
 * or beyond the ring, is older than every kept arrival: the oldest kept one's age is
 * published (a lower bound). A connection queued whose signal has not run yet makes
 * the head one arrival earlier for that moment (an overestimate by one inter-arrival).
 */
static __always_inline __u64 ksamp_head_age(const struct ksamp_listeners *l, int j, __u64 q,
					    __u64 now)
{
	__u64 a = l->arrivals[j & (KSAMP_LISTENERS_MAX - 1)], head, t;

	if (q == 0 || a == 0)
		return 0;
	head = a > q ? a - q : 0;
	if (a - head > KSAMP_ARRIVALS_RING)
		head = a - KSAMP_ARRIVALS_RING;
	t = l->ring[j & (KSAMP_LISTENERS_MAX - 1)][head & (KSAMP_ARRIVALS_RING - 1)];
	return t && now > t ? now - t : 0;
}

/* A socket signalled data ready: if it is a watched listener, remember it and note the
 * arrival of the connection it queued. */
SEC("tracepoint/sock/sk_data_ready")
int ksamp_ready(struct ksamp_sk_data_ready *ctx)
{
	__u64 sk = (__u64)ctx->skaddr;
	__u32 zero = 0;
	struct ksamp_config *cfg;
	struct ksamp_listeners *l;
	__u8 state = 0;
	__u16 port = 0;
	int i;

	if (ctx->protocol != KSAMP_IPPROTO_TCP || !sk)
		return 0;
	cfg = bpf_map_lookup_elem(&ksamp_config, &zero);
	if (!cfg)
		return 0;
	if (bpf_probe_read_kernel(&state, sizeof(state), (void *)(sk + cfg->off_state)) ||
	    state != KSAMP_TCP_LISTEN)
		return 0;
	if (bpf_probe_read_kernel(&port, sizeof(port), (void *)(sk + cfg->off_num)))
		return 0;
	i = ksamp_port_slot(cfg, port);
	if (i < 0 || !ksamp_our_netns(cfg, sk))
		return 0;
	l = bpf_map_lookup_elem(&ksamp_listeners, &zero);
	if (!l)
		return 0;
#pragma unroll
	for (int j = 0; j < KSAMP_LISTENERS_MAX; j++) {
		if (l->sk[j] == sk) {
			ksamp_arrival(l, j);
			return 0;
		}
	}
#pragma unroll
	for (int j = 0; j < KSAMP_LISTENERS_MAX; j++) {
		if (l->sk[j] == 0 && __sync_val_compare_and_swap(&l->sk[j], 0, sk) == 0) {
			l->slot[j] = i + 1;
			ksamp_arrival(l, j);
			return 0;
		}
	}
	return 0;
}

/* max(0, v) */
static __always_inline __u64 ksamp_clamp(__s64 v)
{
	return v > 0 ? (__u64)v : 0;
}

static __always_inline void ksamp_publish(const struct ksamp_config *cfg,
					  const struct ksamp_cpus *cpus)
{
	__u32 zero = 0;
	struct rmem_region *region = bpf_map_lookup_elem(&rmem_region, &zero);
	struct ksamp_counts *cnt = bpf_map_lookup_elem(&ksamp_counts, &zero);
	struct ksamp_listeners *l = bpf_map_lookup_elem(&ksamp_listeners, &zero);
	__u64 known[KSAMP_PORTS_MAX] = {0, 0, 0, 0};
	__u64 ncpu = cfg->ncpu, sum = 0, running = 0, est = 0, backlog = 0, oldest = 0, now, seq;
	volatile __u64 *w;

	if (!region || !cnt || !l)
		return;
	if (ncpu > KSAMP_CPUS_MAX)
		ncpu = KSAMP_CPUS_MAX;
	now = bpf_ktime_get_ns();
	for (__u32 c = 0; c < KSAMP_CPUS_MAX; c++) {
		if (c >= ncpu)
			break;
		sum += cpus->cpu[c].busy_ema_ppm;
		running += cpus->cpu[c].busy;
	}
#pragma unroll
	for (int j = 0; j < KSAMP_LISTENERS_MAX; j++) {
		__u64 sk = l->sk[j], slot = l->slot[j], age;
		__u32 q = 0;

		if (!sk || slot == 0 || slot > KSAMP_PORTS_MAX)
			continue;
		/* A listener freed since its close was seen reads as garbage or fails, never faults. */
		if (bpf_probe_read_kernel(&q, sizeof(q), (void *)(sk + cfg->off_ack_backlog)))
			continue;
		backlog += q;
		known[(slot - 1) & (KSAMP_PORTS_MAX - 1)] = 1;
		age = ksamp_head_age(l, j, q, now);
		if (age > oldest)
			oldest = age;
	}
#pragma unroll
	for (int i = 0; i < KSAMP_PORTS_MAX; i++) {
		est += ksamp_clamp(cnt->established[i]);
		if (!known[i])
			backlog += ksamp_clamp(cnt->backlog[i]);
	}
	w = region->words;
	seq = w[KSAMP_W_SEQ_HEAD] + 1;
	if (seq == 0)
		seq = 1; /* 0 means "never written" */
	__sync_lock_test_and_set(&region->words[KSAMP_W_SEQ_TAIL], seq);
#pragma unroll
	for (int i = KSAMP_W_SEQ_HEAD + 1; i < KSAMP_W_SEQ_TAIL; i++)
		w[i] = 0;
	w[KSAMP_W_SAMPLE_MONO_NS] = now;
	w[KSAMP_W_CPU_UTIL_PPM] = ncpu ? sum / ncpu : 0;
	w[KSAMP_W_RUNNABLE] = running;
	w[KSAMP_W_CONNS_ESTABLISHED] = est;
	w[KSAMP_W_ACCEPT_BACKLOG] = backlog;
	w[KSAMP_W_NCPU] = ncpu;
	/* Connection counts are valid if a port is watched (ports fill from index 0). */
	if (cfg->ports[0]) {
		w[KSAMP_W_FLAGS] = KSAMP_FLAG_CONNS | KSAMP_FLAG_QUEUE_DELAY;
		w[KSAMP_W_CONNS_SAMPLED_MONO_NS] = now;
		w[KSAMP_W_QUEUE_DELAY_US] = oldest / 1000;
	}
	__sync_lock_test_and_set(&region->words[KSAMP_W_SEQ_HEAD], seq);
}

SEC("perf_event")
int ksamp_tick(void *ctx)
{
	__u32 zero = 0, cpu = bpf_get_smp_processor_id();
	struct ksamp_config *cfg = bpf_map_lookup_elem(&ksamp_config, &zero);
	struct ksamp_cpus *cpus = bpf_map_lookup_elem(&ksamp_cpus, &zero);

	if (!cfg || !cpus)
		return 0;
	if (cpu < KSAMP_CPUS_MAX) {
		struct ksamp_cpu *me = &cpus->cpu[cpu & (KSAMP_CPUS_MAX - 1)];
		/* The idle task has pid 0 on every CPU. */
		__u64 busy = (__u32)bpf_get_current_pid_tgid() != 0;
		__s64 ema = (__s64)me->busy_ema_ppm;
		__u32 shift = KSAMP_EMA_SHIFT;

		if (cpu != cfg->writer_cpu && cfg->other_ema_shift < KSAMP_EMA_SHIFT)
			shift = cfg->other_ema_shift;
		ema += ((__s64)(busy * KSAMP_PPM) - ema) >> shift;
		me->busy_ema_ppm = ema > 0 ? (__u64)ema : 0;
		me->busy = busy;
	}
	if (cpu == cfg->writer_cpu)
		ksamp_publish(cfg, cpus);
	return 0;
}
