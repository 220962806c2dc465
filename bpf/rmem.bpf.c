// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * rmem XDP responder: answers farside's remote-memory protocol (udp transport,
 * crates/rmem/src/wire.rs) in the kernel, so a READ, WRITE, CAS or FADD on the
 * back-end's region needs no user-space process to be scheduled.
 *
 * Which packets are ours: well-formed IPv4 UDP datagrams (no IP options, not
 * fragmented) to the configured port and, if configured, to the node's own IPv4
 * address (a packet for another host is never answered), or to the configured group
 * (below).
 *
 * Group READs: a datagram to the configured multicast group (cfg->group_ipv4, != 0)
 * in a frame to the group's multicast MAC (01:00:5e + the group's low 23 bits) is a
 * group READ, sent once by a monitor to every back-end: it is checked and answered
 * exactly like a unicast READ (same key check), but the reply comes from the node's
 * own address (source IP cfg->ipv4_addr, source MAC cfg->node_mac, source port the
 * served port), so the monitor can tell the back-ends' replies apart. Passed to the
 * stack if the node's address or MAC is not configured (the reply's source would be
 * unknown) or the frame's MAC is not the group's. Only READs: a WRITE/CAS/FADD (or
 * unknown op) to the group is dropped unanswered (counted as Malformed): a mutation
 * must never be applied by every node at once. Datagrams to any other multicast
 * address are passed, even when any destination address is served. Everything else goes to the stack
 * (XDP_PASS), including fragments and packets with IP options: the kernel
 * reassembles/handles them and gatherd's user-space server answers, if it runs.
 *
 * Every request is an authenticated message (bpf/auth_siphash.h, crates/auth mac.rs):
 * a 32-byte envelope (tag, key id, len, sender, seq), then the rmem header and
 * payload the tag covers. Our datagrams are checked exactly like ops::execute does,
 * in the same order:
 *   1. envelope present, its len within the datagram, its key id in rmem_keys, its
 *      SipHash-2-4 tag right under that key (bounded: RMEM_SIPHASH_BYTES_MAX)
 *                                                    -> BadKey: dropped (no reply)
 *      group datagrams: READs only                   -> Malformed: dropped
 *   2. (key id, sender, seq) new to its replay window (rmem_replay, under its
 *      bucket's spin lock; farside_auth::replay's RFC 6479 window), above the
 *      restart floor and not above the ceiling (rmem_seqlim, farside_auth::floor)
 *                                                    -> Replayed: dropped
 *   3. header well formed (magic, version)           -> Malformed: dropped
 *   4. op known                                      -> BadOp
 *      (whole payload present, else Malformed: dropped)
 *   5. the key's rights, as farside_auth::rights::check: region -> NoRegion;
 *      len (> 0, atomics 8) -> BadLength; alignment -> Unaligned; within the
 *      region -> OutOfBounds; a mutation of an agent-owned word -> Protected; one
 *      grant with the op covering the words, FETCH-ADD delta within its limit
 *      -> ReadOnly
 *   6. READ len <= XDP_READ_BYTES_MAX (!)              -> BadLength
 *   7. a READ request at least as long as its reply  -> Unpadded
 * The one difference from user space is the READ limit (one frame); see
 * rmem_consts.h.
 *
 * Arena READs and WRITEs (request region RMEM_ARENA_REGION, see rmem_consts.h): steps
 * 1 to 4 as above, then step 5 in the same order with the arena's bounds
 * (farside_auth::rights::check_chunks): region (the key's rights must name the arena)
 * -> NoRegion; op READ or WRITE -> else ReadOnly (no atomics on the arena); len > 0 ->
 * BadLength; alignment -> Unaligned; chunk below RMEM_ARENA_CHUNKS_MAX and the access
 * within that one chunk -> OutOfBounds; READ: a READ grant of a word key, WRITE: a
 * chunk grant (RMEM_KEY_FLAG_CHUNKS) covering the chunk -> else ReadOnly; READ: step 7
 * (Unpadded); then the chunk must exist in the map (the node's count) -> OutOfBounds.
 * A WRITE then goes through duplicate detection (below) like every mutation and is
 * stored in ascending 8-byte words: the writer of a seqlock slot writes its sequence
 * word, its record and its sequence word again in three acknowledged WRITEs. The
 * payload is in the frame (step 4) and within one chunk, so at most 1400 bytes: the
 * request fits RMEM_SIPHASH_BYTES_MAX. User space has no arena: gatherd's fallback
 * answers such a request NoRegion; farside_rmem::ops::check_arena is the reference rule
 * the packet tests compare with.
 *
 * Bulk arena READs (request flag RMEM_FLAG_BULK): the same checks, except that the
 * READ must start at a chunk boundary (-> Unaligned) and may span up to
 * RMEM_ARENA_BULK_CHUNKS_MAX chunks (more -> BadLength; a chunk beyond the bound or the
 * map -> OutOfBounds); the reply's tag covers its envelope and header only, the body
 * follows uncovered (the envelope's len says so). Without the flag an arena READ that
 * crosses a chunk is refused as above. Refusals after step 3 are answered with a header-only reply (never
 * longer than the request), memory untouched.
 *
 * Every reply is sealed under the request's key for the reply domain: the request's
 * envelope stays in place (key id, sender, seq: the reply is bound to its request),
 * its len becomes the reply's, its tag is computed over the reply.
 *
 * Then duplicate detection for WRITE/CAS/FADD per client (the envelope's sender), as
 * ops::Dedup:
 * the rmem_dedup map holds each client's last seq and the old value it returned.
 * Same seq: the recorded reply is replayed (the op is not applied again); older seq:
 * dropped (a delayed duplicate, counted Stale); a retry (RMEM_FLAG_RETRY) of a
 * client with no record: Unknown, not applied; else applied and recorded.
 *
 * Frame size: the reply is built in the request's buffer and is never longer
 * than the request (READs must be padded to their reply's size, rule 10), so the
 * frame only shrinks. The grow path below stays as a guard: if the buffer could
 * not hold the reply, the READ is passed to the stack (RMEM_CNT_NO_ROOM).
 *
 * The reply is built in place (XDP_TX): MACs, IPs and ports swapped, frame
 * resized with bpf_xdp_adjust_tail, IP checksum recomputed, and the UDP checksum
 * computed from scratch over the reply (never patched: with veth tx offload the
 * request may carry only a partial sum). The request's UDP checksum is not
 * verified for the same reason.
 *
 * Checksums are one's complement sums over native (little-endian) loads of the
 * packet bytes, folded and stored natively: RFC 1071 byte-order independence.
 */
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include "rmem_consts.h"
#include "rmem_helpers.h"
#include "rmem_maps.h"
#include "rmem_structs.h"

#define AUTH_SIPHASH_BYTES_MAX RMEM_SIPHASH_BYTES_MAX
#include "auth_siphash.h"

/*
 * Arena read stamps: one counter per arena chunk, added to (atomically) by every
 * accepted arena READ of that chunk, mmap'd by the arena's owner, which swaps them to
 * zero when it picks eviction victims: an object a peer read one-sidedly counts as
 * recently used though no process of the owner was scheduled for the read. The owner
 * looks at the counter of each object's first chunk (a reader's head READ). Sized by
 * the loader like rmem_arena; __u64 values (an mmapable array's element is 8-byte
 * aligned anyway), never wrapping in practice.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RMEM_ARENA_CHUNKS_MAX);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} rmem_arena_reads SEC(".maps");

/* Stamps a READ of arena chunk c (rmem_arena_reads above). */
static __always_inline void arena_read_stamp(__u32 c)
{
	__u64 *n = bpf_map_lookup_elem(&rmem_arena_reads, &c);

	if (n)
		__sync_fetch_and_add(n, 1);
}

/* Bytes in front of the envelope: Ethernet, IPv4 without options, UDP. */
#define HDRS_BYTES (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))

static __always_inline void count(__u32 op, __u32 status)
{
	__u32 i = (op >= RMEM_OP_READ && op <= RMEM_OP_FADD) ? op : 0;
	__u64 *v = bpf_map_lookup_elem(&rmem_counters, &i);

	if (v)
		*v += 1;
	i = RMEM_CNT_STATUS_BASE + status;
	v = bpf_map_lookup_elem(&rmem_counters, &i);
	if (v)
		*v += 1;
}

/* Bump one of the RMEM_CNT_ABORTED / RMEM_CNT_NO_ROOM counters. */
static __always_inline void count_other(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&rmem_counters, &i);

	if (v)
		*v += 1;
}

/* An all-zero MAC address (the config's "unknown"). */
static __always_inline int is_zero_mac(const __u8 *m)
{
	return (m[0] | m[1] | m[2] | m[3] | m[4] | m[5]) == 0;
}

/* Fold a 64-bit one's complement accumulator to the 16-bit checksum field value. */
static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* Sum of the two 32-bit halves of a word stored little-endian in the packet. */
static __always_inline __u64 word_sum(__u64 v)
{
	return (v & 0xffffffff) + (v >> 32);
}

/*
 * The tag the envelope at the start of the UDP payload should carry under (k0, k1)
 * for `label`, into *tag: 0, or -1 if the envelope or its covered bytes do not fit
 * the frame or RMEM_SIPHASH_BYTES_MAX. A global (BPF-to-BPF) function: the verifier
 * checks its bounded loop once, not once per path of the caller.
 */
__attribute__((noinline)) int rmem_envelope_tag(struct xdp_md *ctx, __u64 k0, __u64 k1,
						 __u64 label, __u64 *tag)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 t = 0;
	int r;

	if (!tag)
		return -1;
	r = auth_envelope_tag(data + HDRS_BYTES, k0, k1, label, data_end, &t);
	*tag = t;
	return r;
}

/* The replay bucket of (key id, sender): a multiplicative hash, masked. */
static __always_inline __u32 replay_bucket(__u32 key_id, __u64 sender)
{
	__u64 h = (sender ^ (((__u64)key_id << 32) | key_id)) * 0x9e3779b97f4a7c15ULL;

	return (__u32)(h >> 32) & (RMEM_REPLAY_BUCKETS - 1);
}

/* One of the sequence limits (RMEM_SEQLIM_*); 0 if unset. */
static __always_inline __u64 seqlim(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&rmem_seqlim, &i);

	return v ? *v : 0;
}

/*
 * Accept seq into the replay window of (key id, sender), as farside_auth::replay's
 * Window::accept: 0 if new (recorded), -1 if a copy, too old, at or below the floor a
 * new window starts above, or above the ceiling. Called only once the tag verified.
 * Global, as above.
 *
 * A sender without a window gets one in its bucket: a free way, else the way with the
 * lowest top, whose top then raises the bucket's floor. The new window starts above
 * max(bucket floor, restart floor) (Window::starting_above), so neither an eviction
 * nor a restart lets a recorded request in again; a new sender is never refused for
 * want of room.
 */
__attribute__((noinline)) int rmem_replay_accept(__u32 key_id, __u64 sender, __u64 seq)
{
	__u32 idx = replay_bucket(key_id, sender), found = RMEM_REPLAY_WAYS, victim = 0, j;
	__u64 floor = seqlim(RMEM_SEQLIM_FLOOR), ceiling = seqlim(RMEM_SEQLIM_CEILING);
	__u64 top, cur, next, entered, i, bit, start, vtop = ~0ULL;
	struct rmem_bucket *b;
	struct rmem_way *w;
	int ok = -1;

	if (seq == 0 || (ceiling && seq > ceiling))
		return -1;
	b = bpf_map_lookup_elem(&rmem_replay, &idx);
	if (!b)
		return -1;
	bpf_spin_lock(&b->lock);
	for (j = 0; j < RMEM_REPLAY_WAYS; j++) {
		struct rmem_way *x = &b->way[j];
		__u64 t = x->live ? x->top : 0;

		if (x->live && x->key_id == key_id && x->sender == sender)
			found = j;
		if (t < vtop) {
			vtop = t;
			victim = j;
		}
	}
	if (found >= RMEM_REPLAY_WAYS) {
		start = b->floor > floor ? b->floor : floor;
		if (seq <= start)
			goto out;
		w = &b->way[victim & (RMEM_REPLAY_WAYS - 1)];
		if (w->live && w->top > b->floor)
			b->floor = w->top;
		w->live = 1;
		w->key_id = key_id;
		w->sender = sender;
		/* Window::starting_above(start): every seq up to start counts as seen. */
		w->top = start;
		for (i = 0; i < RMEM_WINDOW_BLOCKS; i++)
			w->bits[i] = ~0ULL;
		bit = start % 64;
		w->bits[(start / 64) % RMEM_WINDOW_BLOCKS] =
			bit == 63 ? ~0ULL : (1ULL << (bit + 1)) - 1;
	} else {
		w = &b->way[found & (RMEM_REPLAY_WAYS - 1)];
	}
	bit = 1ULL << (seq % 64);
	top = w->top;
	if (seq > top) {
		/* Zero the words top enters (all of them after a jump of a whole window). */
		cur = top / 64;
		next = seq / 64;
		entered = next - cur;
		if (entered > RMEM_WINDOW_BLOCKS)
			entered = RMEM_WINDOW_BLOCKS;
		for (i = 1; i <= RMEM_WINDOW_BLOCKS; i++) {
			if (i > entered)
				break;
			w->bits[(cur + i) % RMEM_WINDOW_BLOCKS] = 0;
		}
		w->top = seq;
		w->bits[(seq / 64) % RMEM_WINDOW_BLOCKS] |= bit;
		ok = 0;
	} else if (top - seq < RMEM_WINDOW_MSGS &&
		   !(w->bits[(seq / 64) % RMEM_WINDOW_BLOCKS] & bit)) {
		w->bits[(seq / 64) % RMEM_WINDOW_BLOCKS] |= bit;
		ok = 0;
	}
out:
	bpf_spin_unlock(&b->lock);
	return ok;
}

/*
 * farside_auth::rights::check for one operation on words [first, end), after the
 * region, length, alignment and bounds checks: RMEM_ST_OK, PROTECTED (an agent-owned
 * word) or READ_ONLY (no grant, or a FETCH-ADD delta over the grant's).
 */
static __always_inline __u32 rights_check(const struct rmem_key *k, __u32 op, __u32 first,
					  __u32 end, __u64 delta)
{
	__u32 i, opbit;

	/* Chunk grants open no region word (Rights::check under chunked rights). */
	if (k->flags & RMEM_KEY_FLAG_CHUNKS)
		return RMEM_ST_READ_ONLY;
	if (op != RMEM_OP_READ &&
	    (first < RMEM_AGENT_OWNED_END_WORD ||
	     (first <= RMEM_AGENT_OWNED_ERROR_WORD && end > RMEM_AGENT_OWNED_ERROR_WORD)))
		return RMEM_ST_PROTECTED;
	opbit = op == RMEM_OP_READ    ? RMEM_GRANT_READ
		: op == RMEM_OP_WRITE ? RMEM_GRANT_WRITE
		: op == RMEM_OP_CAS   ? RMEM_GRANT_CAS
				      : RMEM_GRANT_FADD;
	for (i = 0; i < RMEM_GRANTS_MAX; i++) {
		const struct rmem_grant *g = &k->grant[i];

		if (i >= k->grants)
			break;
		if (!(g->ops & opbit) || g->first > first || end > g->end)
			continue;
		/* The first grant that covers the access decides, as in Rust. */
		if (op == RMEM_OP_FADD && delta > g->fadd_delta_max)
			return RMEM_ST_READ_ONLY;
		return RMEM_ST_OK;
	}
	return RMEM_ST_READ_ONLY;
}

/*
 * A chunk grant of key k (RMEM_KEY_FLAG_CHUNKS) covering arena chunk c: RMEM_ST_OK or
 * READ_ONLY (farside_auth::rights::check_chunks for a WRITE).
 */
static __always_inline __u32 chunk_write_check(const struct rmem_key *k, __u32 c)
{
	__u32 i;

	if (!(k->flags & RMEM_KEY_FLAG_CHUNKS))
		return RMEM_ST_READ_ONLY;
	for (i = 0; i < RMEM_GRANTS_MAX; i++) {
		const struct rmem_grant *g = &k->grant[i];

		if (i >= k->grants)
			break;
		if ((g->ops & RMEM_GRANT_WRITE) && g->first <= c && c < g->end)
			return RMEM_ST_OK;
	}
	return RMEM_ST_READ_ONLY;
}

/*
 * Step 5 (and 7) for a READ or WRITE of the object arena at byte `offset`, `len` bytes,
 * in a datagram of `plen` payload bytes: RMEM_ST_OK or the refusal (top comment). The
 * region was checked against the key's already.
 */
static __always_inline __u32 arena_check(const struct rmem_key *k, __u32 op, __u32 offset,
					 __u32 len, __u32 plen)
{
	if (op != RMEM_OP_READ && op != RMEM_OP_WRITE)
		return RMEM_ST_READ_ONLY;
	if (len == 0)
		return RMEM_ST_BAD_LENGTH;
	if ((offset | len) & 7)
		return RMEM_ST_UNALIGNED;
	if (offset / RMEM_ARENA_CHUNK_BYTES >= RMEM_ARENA_CHUNKS_MAX ||
	    offset % RMEM_ARENA_CHUNK_BYTES + len > RMEM_ARENA_CHUNK_BYTES)
		return RMEM_ST_OUT_OF_BOUNDS;
	if (op == RMEM_OP_WRITE)
		return chunk_write_check(k, offset / RMEM_ARENA_CHUNK_BYTES);
	/* A READ grant (the grant's words name the control region, not chunks). */
	if (rights_check(k, RMEM_OP_READ, 0, 1, 0) != RMEM_ST_OK)
		return RMEM_ST_READ_ONLY;
	if (plen < sizeof(struct auth_envelope) + sizeof(struct rmem_rep) + len)
		return RMEM_ST_UNPADDED;
	return RMEM_ST_OK;
}

/*
 * Step 5 (and 7) for a bulk READ of the arena (RMEM_FLAG_BULK, top comment): whole
 * chunks from a chunk boundary, at most RMEM_ARENA_BULK_BYTES_MAX bytes.
 */
static __always_inline __u32 arena_bulk_check(const struct rmem_key *k, __u32 op,
					      __u32 offset, __u32 len, __u32 plen)
{
	if (op != RMEM_OP_READ)
		return RMEM_ST_READ_ONLY;
	if (len == 0 || len > RMEM_ARENA_BULK_BYTES_MAX)
		return RMEM_ST_BAD_LENGTH;
	if ((len & 7) || offset % RMEM_ARENA_CHUNK_BYTES)
		return RMEM_ST_UNALIGNED;
	/* len <= RMEM_ARENA_BULK_BYTES_MAX: no wrap-around below. */
	if (offset / RMEM_ARENA_CHUNK_BYTES >= RMEM_ARENA_CHUNKS_MAX ||
	    (offset + len - 1) / RMEM_ARENA_CHUNK_BYTES >= RMEM_ARENA_CHUNKS_MAX)
		return RMEM_ST_OUT_OF_BOUNDS;
	if (rights_check(k, RMEM_OP_READ, 0, 1, 0) != RMEM_ST_OK)
		return RMEM_ST_READ_ONLY;
	if (plen < sizeof(struct auth_envelope) + sizeof(struct rmem_rep) + len)
		return RMEM_ST_UNPADDED;
	return RMEM_ST_OK;
}

/* Sum of the 32-bit halves of the words of a 32-byte envelope in the packet. */
static __always_inline __u64 envelope_sum(const struct auth_envelope *e)
{
	const __u32 *w = (const void *)e;
	__u64 sum = 0;
	__u32 i;

#pragma unroll
	for (i = 0; i < sizeof(*e) / 4; i++)
		sum += w[i];
	return sum;
}

SEC("xdp")
int rmem_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	struct auth_envelope *env;
	struct rmem_req *req;
	struct rmem_config *cfg;
	struct rmem_region *region = 0;
	struct rmem_arena_chunk *chunk = 0;
	struct rmem_dedup *slot = 0;
	struct rmem_key *key;
	/* Every scalar starts defined: the verifier follows paths the compiler merged. */
	__u32 zero = 0, ip_len = 0, udp_len = 0, plen = 0, need = 0, key_id = 0, covered = 0;
	__u32 op = 0, status = 0, offset = 0, len = 0, rep_len = 0, first = 0, i = 0, flags = 0;
	__u32 group = 0, bulk = 0, k = 0;
	__u64 seq = 0, client = 0, arg0 = 0, arg1 = 0, old = 0, sum = 0, tag = 0;
	long delta = 0;

	/* Ours or the stack's? Anything not a plain IPv4 UDP datagram to our port is the stack's. */
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	/* IP options and fragments go to the stack (see the top comment). */
	if (ip->ihl != 5 || (ip->frag_off & bpf_htons(RMEM_IP_MF | RMEM_IP_OFFSET)))
		return XDP_PASS;
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	cfg = bpf_map_lookup_elem(&rmem_config, &zero);
	if (!cfg || cfg->udp_port == 0 || udp->dest != bpf_htons(cfg->udp_port))
		return XDP_PASS;
	group = cfg->group_ipv4 != 0 && ip->daddr == cfg->group_ipv4;
	if (group) {
		/* A group READ: the reply's source must be known, the frame the group's. */
		__u32 g = bpf_ntohl(cfg->group_ipv4);

		if (cfg->ipv4_addr == 0 || is_zero_mac(cfg->node_mac) || eth->h_dest[0] != 0x01 ||
		    eth->h_dest[1] != 0x00 || eth->h_dest[2] != 0x5e ||
		    eth->h_dest[3] != ((g >> 16) & 0x7f) || eth->h_dest[4] != ((g >> 8) & 0xff) ||
		    eth->h_dest[5] != (g & 0xff))
			return XDP_PASS;
	} else if ((cfg->ipv4_addr != 0 && ip->daddr != cfg->ipv4_addr) ||
		   (bpf_ntohl(ip->daddr) >> 28) == RMEM_IPV4_MULTICAST_NIBBLE) {
		/*
		 * Addressed to another host (bridge, promiscuous port), or to a multicast
		 * group that is not the configured one (even with any address served: a
		 * reply would come from the group's address): not ours to answer.
		 */
		return XDP_PASS;
	}
	ip_len = bpf_ntohs(ip->tot_len);
	udp_len = bpf_ntohs(udp->len);
	/* Inconsistent lengths: let the stack count and drop it. */
	if (ip_len < sizeof(*ip) + sizeof(*udp) || udp_len < sizeof(*udp) ||
	    udp_len > ip_len - sizeof(*ip) || data + sizeof(*eth) + ip_len > data_end)
		return XDP_PASS;
	plen = udp_len - sizeof(*udp);

	/* 1. An envelope whose covered bytes lie within the datagram, a known key, its tag. */
	env = (void *)(udp + 1);
	if (plen < sizeof(*env) + sizeof(*req) || (void *)(env + 1) > data_end) {
		count(0, RMEM_ST_BAD_KEY);
		return XDP_DROP;
	}
	covered = env->len;
	if (covered > plen - sizeof(*env)) {
		count(0, RMEM_ST_BAD_KEY);
		return XDP_DROP;
	}
	key_id = env->key_id;
	key = bpf_map_lookup_elem(&rmem_keys, &key_id);
	/*
	 * A grant (a key bound to one client address, until a deadline) opens nothing from
	 * another source or after its deadline: dropped as an unknown key, before its tag
	 * costs anything.
	 */
	if (key && ((key->bound_ipv4 != 0 && key->bound_ipv4 != ip->saddr) ||
		    (key->expires_ns != 0 && bpf_ktime_get_ns() >= key->expires_ns)))
		key = 0;
	if (!key || rmem_envelope_tag(ctx, key->k0, key->k1, AUTH_LABEL_RMEM_REQUEST, &tag)) {
		count(0, RMEM_ST_BAD_KEY);
		return XDP_DROP;
	}
	/* Packet pointers do not survive a call: derive them again. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	env = data + HDRS_BYTES;
	if ((void *)(env + 1) > data_end || tag != env->tag) {
		count(0, RMEM_ST_BAD_KEY);
		return XDP_DROP;
	}
	client = env->sender;
	req = (void *)(env + 1);
	if (covered < sizeof(*req) || (void *)(req + 1) > data_end) {
		count(0, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	op = req->op;
	/*
	 * Group datagrams: READs only, never answered otherwise (top comment); dropped
	 * before the replay window, so a mutation sent to the group takes no slot there.
	 */
	if (group && op != RMEM_OP_READ) {
		count(op, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	/* 2. Not a copy: the replay window of (key id, sender). */
	if (rmem_replay_accept(key_id, client, env->seq)) {
		count(0, RMEM_ST_REPLAYED);
		return XDP_DROP;
	}

	/* 3. Well formed header (covered by the tag). */
	if (req->magic != RMEM_REQ_MAGIC || req->version != RMEM_VERSION) {
		count(0, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	flags = req->flags;
	seq = req->seq;
	offset = req->offset;
	len = req->len;
	/* 4. Known op, and its whole payload present (and covered by the tag). */
	if (op < RMEM_OP_READ || op > RMEM_OP_FADD) {
		status = RMEM_ST_BAD_OP;
		goto reply;
	}
	if (op == RMEM_OP_WRITE)
		need = len < RMEM_OP_BYTES_MAX ? len : RMEM_OP_BYTES_MAX;
	else if (op == RMEM_OP_CAS)
		need = 16;
	else if (op == RMEM_OP_FADD)
		need = 8;
	else
		need = 0;
	if (covered < sizeof(*req) + need) {
		count(op, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	if (op == RMEM_OP_CAS || op == RMEM_OP_FADD) {
		__u64 *args = (void *)(req + 1);

		if ((void *)(args + 2) > data_end && op == RMEM_OP_CAS)
			return XDP_DROP; /* unreachable: covered was checked */
		if ((void *)(args + 1) > data_end)
			return XDP_DROP; /* unreachable: covered was checked */
		arg0 = args[0];
		if (op == RMEM_OP_CAS) {
			if ((void *)(args + 2) > data_end)
				return XDP_DROP;
			arg1 = args[1];
		}
	}
	/* 5. The key's rights (farside_auth::rights::check, in its order). */
	if (req->region != key->region) {
		status = RMEM_ST_NO_REGION;
		goto reply;
	}
	if (req->region == RMEM_ARENA_REGION) {
		/* The object arena: READ only, within one chunk or bulk (top comment). */
		if (flags & RMEM_FLAG_BULK) {
			status = arena_bulk_check(key, op, offset, len, plen);
			if (status == RMEM_ST_OK) {
				__u32 c = offset / RMEM_ARENA_CHUNK_BYTES;
				__u32 last = (offset + len - 1) / RMEM_ARENA_CHUNK_BYTES;

				chunk = bpf_map_lookup_elem(&rmem_arena, &c);
				/* An array: the first and last chunk exist, so does every one between. */
				if (!chunk || !bpf_map_lookup_elem(&rmem_arena, &last)) {
					chunk = 0;
					status = RMEM_ST_OUT_OF_BOUNDS;
				} else {
					bulk = 1;
					first = c;
					rep_len = len;
					arena_read_stamp(c);
				}
			}
			goto reply;
		}
		status = arena_check(key, op, offset, len, plen);
		if (status == RMEM_ST_OK) {
			__u32 c = offset / RMEM_ARENA_CHUNK_BYTES;

			chunk = bpf_map_lookup_elem(&rmem_arena, &c);
			if (!chunk) {
				status = RMEM_ST_OUT_OF_BOUNDS;
			} else if (op == RMEM_OP_READ) {
				first = (offset % RMEM_ARENA_CHUNK_BYTES) / 8;
				rep_len = len;
				arena_read_stamp(c);
			}
		}
		/* An arena WRITE that passed: duplicate detection, then stored below. */
		if (status != RMEM_ST_OK || op == RMEM_OP_READ)
			goto reply;
		goto dedup;
	}
	if (len == 0 || ((op == RMEM_OP_CAS || op == RMEM_OP_FADD) && len != 8)) {
		status = RMEM_ST_BAD_LENGTH;
		goto reply;
	}
	if ((offset | len) & 7) {
		status = RMEM_ST_UNALIGNED;
		goto reply;
	}
	/* 64-bit sum: no wrap-around. */
	if ((__u64)offset + len > RMEM_REGION_BYTES) {
		status = RMEM_ST_OUT_OF_BOUNDS;
		goto reply;
	}
	status = rights_check(key, op, offset / 8, (offset + len) / 8, arg0);
	if (status != RMEM_ST_OK)
		goto reply;
	/* 6. A READ's reply must fit one frame. */
	if (op == RMEM_OP_READ && len > XDP_READ_BYTES_MAX) {
		status = RMEM_ST_BAD_LENGTH;
		goto reply;
	}
	/* 7. No reflection: a READ's reply is never longer than its request. */
	if (op == RMEM_OP_READ && plen < sizeof(*env) + sizeof(struct rmem_rep) + len) {
		status = RMEM_ST_UNPADDED;
		goto reply;
	}
	/* Before a dedup slot is claimed: nothing may fail after the claim. */
	region = bpf_map_lookup_elem(&rmem_region, &zero);
	if (!region) {
		status = RMEM_ST_NO_REGION;
		goto reply;
	}
dedup:
	/* Duplicate detection (top comment). */
	if (op != RMEM_OP_READ) {
		slot = bpf_map_lookup_elem(&rmem_dedup, &client);
		if (!slot) {
			struct rmem_dedup fresh = { .seq = seq, .done_seq = seq - 1, .old = 0 };

			if (flags & RMEM_FLAG_RETRY) {
				status = RMEM_ST_UNKNOWN;
				goto reply;
			}
			/* Fails only if a racing first attempt inserted it: that one answers. */
			if (bpf_map_update_elem(&rmem_dedup, &client, &fresh, BPF_NOEXIST))
				return XDP_DROP;
			slot = bpf_map_lookup_elem(&rmem_dedup, &client);
			if (!slot)
				return XDP_DROP;
		} else {
			__u64 prev = slot->seq;
			__s64 ahead = (__s64)(seq - prev);

			if (ahead == 0) {
				/* A retry of the last op: replay, unless it is still in flight. */
				if (slot->done_seq != seq)
					return XDP_DROP;
				status = RMEM_ST_OK;
				old = slot->old;
				rep_len = op == RMEM_OP_WRITE ? 0 : 8;
				goto reply;
			}
			if (ahead < 0) {
				count(op, RMEM_ST_STALE);
				return XDP_DROP;
			}
			/* Claim seq; a concurrent claimant (another CPU) wins and answers. */
			if (__sync_val_compare_and_swap(&slot->seq, prev, seq) != prev)
				return XDP_DROP;
		}
	}

	status = RMEM_ST_OK;
	first = offset / 8;
	if (chunk) {
		/* An arena WRITE (checked: within one chunk): ascending 8-byte stores. */
		__u32 cw = (offset % RMEM_ARENA_CHUNK_BYTES) / 8;

		for (i = 0; i < RMEM_ARENA_CHUNK_WORDS; i++) {
			__u64 *src = (void *)(req + 1) + i * 8;
			__u32 w = cw + i;

			if (i >= len / 8 || w >= RMEM_ARENA_CHUNK_WORDS)
				break;
			asm volatile("" : "+r"(w));
			if (w >= RMEM_ARENA_CHUNK_WORDS)
				break;
			if ((void *)(src + 1) > data_end)
				return XDP_DROP; /* unreachable: covered was checked */
			*(volatile __u64 *)&chunk->words[w] = *src;
		}
	} else if (op == RMEM_OP_READ) {
		/* Copied after resizing the frame, below. */
		rep_len = len;
	} else if (op == RMEM_OP_WRITE) {
		/* Ascending word stores, like copy_words_in. */
		for (i = 0; i < RMEM_REGION_WORDS; i++) {
			__u64 *src = (void *)(req + 1) + i * 8;

			if (i >= len / 8)
				break;
			if ((void *)(src + 1) > data_end)
				return XDP_DROP; /* unreachable: plen was checked */
			*(volatile __u64 *)&region->words[(first + i) & (RMEM_REGION_WORDS - 1)] = *src;
		}
	} else {
		/* u64 index masked to the region: the verifier sees an aligned, bounded offset. */
		first &= RMEM_REGION_WORDS - 1;
		if (op == RMEM_OP_CAS) {
			old = __sync_val_compare_and_swap(&region->words[first], arg0, arg1);
		} else {
			old = __sync_fetch_and_add(&region->words[first], arg0);
		}
		rep_len = 8;
	}
	if (slot) {
		/* Record the reply before marking it done (x86 keeps store order). */
		slot->old = old;
		*(volatile __u64 *)&slot->done_seq = seq;
	}

reply:
	/* Resize the frame to exactly the reply (this also drops any Ethernet padding). */
	delta = (long)(HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep) + rep_len) -
		(long)bpf_xdp_get_buff_len(ctx);
	if (delta != 0 && bpf_xdp_adjust_tail(ctx, delta)) {
		/*
		 * Only a READ reply can be longer than its request, and only growing
		 * can fail: the buffer's tailroom is the driver's choice (veth and
		 * generic XDP keep small skb heads: a few dozen bytes). A READ has no
		 * side effect yet, so hand it to the stack, where gatherd's user-space
		 * server on the same port can answer it. Clients avoid this by padding
		 * READ requests to the reply's size (servers ignore trailing bytes).
		 */
		count_other(RMEM_CNT_NO_ROOM);
		return XDP_PASS;
	}
	/* All packet pointers are stale after bpf_xdp_adjust_tail: derive them again. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep) > data_end) {
		count_other(RMEM_CNT_ABORTED);
		return XDP_ABORTED;
	}
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	env = (void *)(udp + 1);

	{
		unsigned char mac[ETH_ALEN];

		/* A group reply comes from the node's own MAC, not the group's. */
		if (group)
			__builtin_memcpy(mac, cfg->node_mac, ETH_ALEN);
		else
			__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
		__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
		__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	}
	{
		__be32 a = ip->saddr;
		__u16 *w = (void *)ip;

		/* A group reply comes from the node's own address, not the group's. */
		ip->saddr = group ? cfg->ipv4_addr : ip->daddr;
		ip->daddr = a;
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + sizeof(*env) +
					sizeof(struct rmem_rep) + rep_len);
		ip->ttl = RMEM_REPLY_TTL;
		ip->check = 0;
		sum = 0;
#pragma unroll
		for (i = 0; i < sizeof(*ip) / 2; i++)
			sum += w[i];
		ip->check = csum_fold(sum);
	}
	{
		__be16 p = udp->source;

		udp->source = udp->dest;
		udp->dest = p;
		udp->len = bpf_htons(sizeof(*udp) + sizeof(*env) + sizeof(struct rmem_rep) + rep_len);
		udp->check = 0;
	}
	{
		struct rmem_rep *rep = (void *)(env + 1);
		__u32 *w = (void *)rep;

		rep->magic = RMEM_REP_MAGIC;
		rep->version = RMEM_VERSION;
		rep->op = op;
		rep->status = status;
		rep->reserved0 = 0;
		rep->seq = seq;
		rep->len = rep_len;
		rep->reserved1 = 0;
		/* UDP checksum: pseudo header, UDP header, reply header; payload below. */
		sum = (__u64)ip->saddr + ip->daddr + bpf_htons(IPPROTO_UDP) + udp->len;
		sum += (__u64)udp->source + udp->dest + udp->len;
#pragma unroll
		for (i = 0; i < sizeof(*rep) / 4; i++)
			sum += w[i];
	}
	if (status == RMEM_ST_OK && op == RMEM_OP_READ && region) {
		/* Ascending word loads, each one 8-byte load: a seqlock reader relies on both. */
		for (i = 0; i < XDP_READ_WORDS_MAX; i++) {
			__u64 *dst = data + HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep) + i * 8;
			__u64 v;

			if (i >= rep_len / 8)
				break;
			if ((void *)(dst + 1) > data_end) {
				count_other(RMEM_CNT_ABORTED);
				return XDP_ABORTED; /* unreachable: the frame was sized for it */
			}
			v = *(volatile __u64 *)&region->words[(first + i) & (RMEM_REGION_WORDS - 1)];
			*dst = v;
			sum += word_sum(v);
		}
	} else if (status == RMEM_ST_OK && chunk && bulk) {
		/* A bulk arena READ: chunk after chunk, ascending 8-byte loads, as above. */
		for (k = 0; k < RMEM_ARENA_BULK_CHUNKS_MAX; k++) {
			struct rmem_arena_chunk *ch;
			__u32 c = first + k;

			if (k * RMEM_ARENA_CHUNK_WORDS >= rep_len / 8)
				break;
			ch = bpf_map_lookup_elem(&rmem_arena, &c);
			if (!ch) {
				count_other(RMEM_CNT_ABORTED);
				return XDP_ABORTED; /* unreachable: the last chunk was found */
			}
			for (i = 0; i < RMEM_ARENA_CHUNK_WORDS; i++) {
				__u32 w = k * RMEM_ARENA_CHUNK_WORDS + i;
				__u64 *dst;
				__u64 v;

				if (w >= rep_len / 8)
					break;
				asm volatile("" : "+r"(w));
				if (w >= RMEM_ARENA_BULK_CHUNKS_MAX * RMEM_ARENA_CHUNK_WORDS)
					break;
				dst = data + HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep) + w * 8;
				if ((void *)(dst + 1) > data_end) {
					count_other(RMEM_CNT_ABORTED);
					return XDP_ABORTED; /* unreachable: the frame was sized for it */
				}
				v = *(volatile __u64 *)&ch->words[i];
				*dst = v;
				sum += word_sum(v);
			}
		}
	} else if (status == RMEM_ST_OK && chunk && op == RMEM_OP_READ) {
		/* An arena READ: ascending 8-byte loads within the chunk, as above. */
		for (i = 0; i < RMEM_ARENA_CHUNK_WORDS; i++) {
			__u64 *dst = data + HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep) + i * 8;
			__u32 w = first + i;
			__u64 v;

			if (i >= rep_len / 8 || w >= RMEM_ARENA_CHUNK_WORDS)
				break;
			/*
			 * Keep the checked index in its register: without the barrier clang
			 * hoists chunk + first * 8 out of the loop and the verifier sees an
			 * unbounded offset (libbpf's barrier_var); checked again after it, so
			 * the register the load uses is the checked one.
			 */
			asm volatile("" : "+r"(w));
			if (w >= RMEM_ARENA_CHUNK_WORDS)
				break;
			if ((void *)(dst + 1) > data_end) {
				count_other(RMEM_CNT_ABORTED);
				return XDP_ABORTED; /* unreachable: the frame was sized for it */
			}
			v = *(volatile __u64 *)&chunk->words[w];
			*dst = v;
			sum += word_sum(v);
		}
	} else if (rep_len == 8) {
		__u64 *dst = data + HDRS_BYTES + sizeof(*env) + sizeof(struct rmem_rep);

		if ((void *)(dst + 1) > data_end) {
			count_other(RMEM_CNT_ABORTED);
			return XDP_ABORTED; /* unreachable: the frame was sized for it */
		}
		*dst = old;
		sum += word_sum(old);
	}
	/*
	 * Seal the reply: the request's key id, sender and seq stay (the binding), len is
	 * the reply's (a bulk READ's: its header only), the tag is over the reply domain;
	 * then the envelope's share of the UDP checksum.
	 */
	env->len = sizeof(struct rmem_rep) + (bulk ? 0 : rep_len);
	if (rmem_envelope_tag(ctx, key->k0, key->k1, AUTH_LABEL_RMEM_REPLY, &tag)) {
		count_other(RMEM_CNT_ABORTED);
		return XDP_ABORTED; /* unreachable: the frame was sized for it */
	}
	/* Packet pointers do not survive a call: derive them again. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	env = data + HDRS_BYTES;
	if ((void *)(env + 1) > data_end) {
		count_other(RMEM_CNT_ABORTED);
		return XDP_ABORTED;
	}
	env->tag = tag;
	sum += envelope_sum(env);
	udp = data + sizeof(struct ethhdr) + sizeof(struct iphdr);
	if ((void *)(udp + 1) > data_end) {
		count_other(RMEM_CNT_ABORTED);
		return XDP_ABORTED;
	}
	{
		__u16 c = csum_fold(sum);

		/* 0 means "no checksum" in UDP over IPv4: send its one's complement twin. */
		udp->check = c ? c : 0xffff;
	}
	count(op, status);
	return XDP_TX;
}

/*
 * The kernel-resident load sampler shares this object, hence the region map (see
 * ksamp.bpf.c). Its programs are loaded only when gatherd chooses it.
 */
#include "ksamp.bpf.c"

char LICENSE[] SEC("license") = "GPL";
