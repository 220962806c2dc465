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
 * Our datagrams are checked exactly like ops::check does, in the same order:
 *   1. header well formed (length, magic, version)  -> Malformed: dropped
 *   2. access key known                              -> BadKey: dropped
 *   3. op known                                      -> BadOp
 *      (whole payload present, else Malformed: dropped)
 *   4. region 0                                      -> NoRegion
 *   5. len: READ 1..=XDP_READ_BYTES_MAX (!), WRITE 1..=RMEM_OP_BYTES_MAX,
 *      atomics exactly 8                             -> BadLength
 *   6. offset and len multiples of 8                 -> Unaligned
 *   7. offset + len within the region                -> OutOfBounds
 *   8. WRITE/CAS/FADD need a read-write key          -> ReadOnly
 *   9. WRITE/CAS/FADD within the control words       -> Protected
 *  10. a READ request at least as long as its reply  -> Unpadded
 * The one difference from user space is the READ limit (one frame); see
 * rmem_consts.h. Refusals are answered with a header-only reply (never longer than
 * the request), memory untouched.
 *
 * Then duplicate detection for WRITE/CAS/FADD of a client (id != 0), as ops::Dedup:
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

/* Bytes in front of the rmem payload: Ethernet, IPv4 without options, UDP. */
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

SEC("xdp")
int rmem_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	struct rmem_req *req;
	struct rmem_config *cfg;
	struct rmem_region *region = 0;
	struct rmem_dedup *slot = 0;
	__u32 zero = 0, ip_len, udp_len, plen, need, *perm;
	__u32 op, status, offset, len, rep_len = 0, first, i, flags, group;
	__u64 seq, key, client, arg0 = 0, arg1 = 0, old = 0, sum;
	long delta;

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

	/* 1. Well formed header. */
	req = (void *)(udp + 1);
	if (plen < sizeof(*req) || (void *)(req + 1) > data_end ||
	    req->magic != RMEM_REQ_MAGIC || req->version != RMEM_VERSION) {
		count(0, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	op = req->op;
	flags = req->flags;
	seq = req->seq;
	key = req->key;
	offset = req->offset;
	len = req->len;
	client = req->client;

	/* 2. Known key: unknown keys get no reply at all. */
	perm = bpf_map_lookup_elem(&rmem_keys, &key);
	if (!perm) {
		count(op, RMEM_ST_BAD_KEY);
		return XDP_DROP;
	}
	/* Group datagrams: READs only, never answered otherwise (top comment). */
	if (group && op != RMEM_OP_READ) {
		count(op, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	/* 3. Known op, and its whole payload present. */
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
	if (plen < sizeof(*req) + need) {
		count(op, RMEM_ST_MALFORMED);
		return XDP_DROP;
	}
	/* 4. Region. */
	if (req->region != 0) {
		status = RMEM_ST_NO_REGION;
		goto reply;
	}
	/* 5. Length. */
	if ((op == RMEM_OP_READ && (len == 0 || len > XDP_READ_BYTES_MAX)) ||
	    (op == RMEM_OP_WRITE && (len == 0 || len > RMEM_OP_BYTES_MAX)) ||
	    ((op == RMEM_OP_CAS || op == RMEM_OP_FADD) && len != 8)) {
		status = RMEM_ST_BAD_LENGTH;
		goto reply;
	}
	/* 6. Alignment. */
	if ((offset | len) & 7) {
		status = RMEM_ST_UNALIGNED;
		goto reply;
	}
	/* 7. Bounds (64-bit sum: no wrap-around). */
	if ((__u64)offset + len > RMEM_REGION_BYTES) {
		status = RMEM_ST_OUT_OF_BOUNDS;
		goto reply;
	}
	/* 8. Permission. */
	if (op != RMEM_OP_READ && *perm != RMEM_PERM_RW) {
		status = RMEM_ST_READ_ONLY;
		goto reply;
	}
	/* 9. Mutations only within the control words. */
	if (op != RMEM_OP_READ &&
	    (offset < RMEM_WRITABLE_FIRST_BYTE || (__u64)offset + len > RMEM_WRITABLE_END_BYTE)) {
		status = RMEM_ST_PROTECTED;
		goto reply;
	}
	/* 10. No reflection: a READ's reply is never longer than its request. */
	if (op == RMEM_OP_READ && plen < sizeof(struct rmem_rep) + len) {
		status = RMEM_ST_UNPADDED;
		goto reply;
	}
	/* Before a dedup slot is claimed: nothing may fail after the claim. */
	region = bpf_map_lookup_elem(&rmem_region, &zero);
	if (!region) {
		status = RMEM_ST_NO_REGION;
		goto reply;
	}
	/* Duplicate detection (top comment). */
	if (op != RMEM_OP_READ && client != 0) {
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
	if (op == RMEM_OP_READ) {
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
		__u64 *args = (void *)(req + 1);

		if ((void *)(args + 1) > data_end)
			return XDP_DROP; /* unreachable: plen was checked */
		arg0 = args[0];
		/* u64 index masked to the region: the verifier sees an aligned, bounded offset. */
		first &= RMEM_REGION_WORDS - 1;
		if (op == RMEM_OP_CAS) {
			if ((void *)(args + 2) > data_end)
				return XDP_DROP; /* unreachable: plen was checked */
			arg1 = args[1];
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
	delta = (long)(HDRS_BYTES + sizeof(struct rmem_rep) + rep_len) - (long)bpf_xdp_get_buff_len(ctx);
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
	if (data + HDRS_BYTES + sizeof(struct rmem_rep) > data_end) {
		count_other(RMEM_CNT_ABORTED);
		return XDP_ABORTED;
	}
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);

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
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + sizeof(struct rmem_rep) + rep_len);
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
		udp->len = bpf_htons(sizeof(*udp) + sizeof(struct rmem_rep) + rep_len);
		udp->check = 0;
	}
	{
		struct rmem_rep *rep = (void *)(udp + 1);
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
			__u64 *dst = data + HDRS_BYTES + sizeof(struct rmem_rep) + i * 8;
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
	} else if (rep_len == 8) {
		__u64 *dst = data + HDRS_BYTES + sizeof(struct rmem_rep);

		if ((void *)(dst + 1) > data_end) {
			count_other(RMEM_CNT_ABORTED);
			return XDP_ABORTED; /* unreachable: the frame was sized for it */
		}
		*dst = old;
		sum += word_sum(old);
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
