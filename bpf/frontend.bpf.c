// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * The blind front-end (seed 002): a tc (cls_bpf, direct-action)
 * ingress program on the front-end's LAN interface. L2 direct server return, as
 * LVS-DR and Katran's L2 mode: the VIP is on every back-end's loopback, clients
 * route the VIP to the front-end, and the program rewrites only the Ethernet
 * addresses (destination: the chosen back-end's MAC; source: the front-end's)
 * and sends the frame back out of the same interface. IP and TCP are untouched
 * (no checksum to fix); replies go from the back-end straight to the client.
 *
 * Which packets are ours: Ethernet frames to the front-end's own MAC carrying
 * IPv4 TCP to VIP:port. Everything else is passed to the stack (TC_ACT_OK).
 * Ours but not verifiable is dropped (TC_ACT_SHOT), counted by reason:
 *   - truncated IPv4 or TCP header, IHL < 5, total length below 40 or beyond
 *     the frame, TCP data offset < 5 or beyond the total length: FE_CNT_MALFORMED
 *     (a truncated IPv4 header to our MAC is dropped too: its address is unknown);
 *   - IP options (IHL > 5), checked before the port: FE_CNT_IP_OPTIONS;
 *   - fragments (MF or an offset), checked before the port (later fragments have
 *     none): FE_CNT_FRAGMENT.
 *
 * Decision: the moved-flow table (fe_moved, a plain hash MOVE writes) first, then
 * the flow table (LRU hash keyed by the 4-tuple); on a hit the entry's back-end (a
 * held entry drops the packet until its hold runs out); on a miss the weight table
 * slot of the 4-tuple's hash (the paper's blind, weighted routing). Only a SYN
 * records its choice in the flow table: a miss on a non-SYN (entry evicted, a flow
 * from before the program, or a spoofed packet) is routed by the hash without
 * inserting (counted FE_CNT_NONSYN_MISS), so a flood of packets of unknown flows
 * cannot evict live entries. With unchanged weights an unmoved flow reaches the same
 * back-end as before; moved flows are in fe_moved, which traffic cannot evict.
 *
 * The one-sided MOVE (handle_move): a UDP datagram to the front-end's own address
 * and move port (fe_config) is answered here, in the kernel, with no front-end
 * process involved: the flow entry is compare-and-swapped from the requester (the
 * back-end the entry names) to the new back-end, and the request is turned into
 * its reply in place and sent back out. Protocol and statuses: struct
 * fe_move_msg, docs/frontend.md "One-sided MOVE". It is answered only on the move
 * interface (fe_config.move_ifindex; the VIP is routed only on fe_config.ifindex)
 * and, with fe_config.move_auth, only behind an auth envelope (auth_siphash.h) whose
 * tag verifies under a key of fe_keys, whose sender is the expected back-end and
 * whose sequence is above the floor of the front-end's start (fe_move_floor) and
 * above that sender's highest in fe_replay; the reply is sealed
 * under the same key. Other traffic to the front-end's address (other protocols,
 * other ports, later fragments) passes as before.
 *
 * The 4-tuple hash is SipHash-2-4 under the secret key in fe_config; the weight
 * table it indexes is Maglev's (filled by crates/frontend table.rs).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>

#include "frontend_consts.h"
#include "frontend_maps.h"
#include "frontend_structs.h"

#undef __always_inline
#define __always_inline inline __attribute__((always_inline))

#include "auth_siphash.h"

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)BPF_FUNC_map_update_elem;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_delete_elem;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;
static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to,
				   __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static __s64 (*bpf_csum_diff)(__be32 *from, __u32 from_size, __be32 *to, __u32 to_size,
			      __wsum seed) = (void *)BPF_FUNC_csum_diff;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define fe_ntohl(x) __builtin_bswap32(x)
#define fe_ntohs(x) __builtin_bswap16(x)
#define fe_htons(x) __builtin_bswap16(x)
#define fe_htonl(x) __builtin_bswap32(x)
#else
#define fe_ntohl(x) (x)
#define fe_htonl(x) (x)
#define fe_ntohs(x) (x)
#define fe_htons(x) (x)
#endif

/* Bytes the headers we read need in the linear part: Ethernet, IPv4 without
 * options, TCP without options. */
#define HDRS_BYTES (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr))
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
/* Bytes a MOVE request may need in the linear part: Ethernet, IPv4 with the
 * longest options (60), UDP, the envelope, the message. */
#define MOVE_PULL_BYTES                                                                    \
	(sizeof(struct ethhdr) + 60 + sizeof(struct udphdr) + AUTH_ENVELOPE_BYTES +        \
	 sizeof(struct fe_move_msg))
/* Bytes of an authenticated reply whose checksum contribution changes: the envelope
 * (tag, sender) and the message's first 8 bytes (op, status). */
#define MOVE_AUTH_CHANGED_BYTES (AUTH_ENVELOPE_BYTES + 8)
/* A MOVE request's exact IPv4 total length and UDP length. */
#define MOVE_UDP_LEN (sizeof(struct udphdr) + sizeof(struct fe_move_msg))
#define MOVE_IP_LEN (sizeof(struct iphdr) + MOVE_UDP_LEN)
/* Offset of the UDP checksum in a MOVE request's frame (no IP options). */
#define MOVE_CSUM_OFF (sizeof(struct ethhdr) + sizeof(struct iphdr) + 6)
/* bpf_l4_csum_replace flags: a 4-byte field; a zero UDP checksum (none) stays 0. */
#define FE_F_MARK_MANGLED_0 (1ULL << 5)
#define FE_CSUM_FIELD_4 4
/* Errors of bpf_map_update_elem: the key exists (BPF_NOEXIST), the map is full. */
#define FE_EEXIST 17
#define FE_E2BIG 7

_Static_assert(sizeof(struct fe_move_msg) == 32, "fe_move_msg is 32 bytes");

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&fe_counters, &i);

	if (v)
		*v += 1;
}

/* Hash of the 4-tuple in host byte order: SipHash-2-4 under the secret key in
 * fe_config of the 12 bytes saddr, daddr, (sport << 16 | dport), little-endian (one
 * block and a 4-byte tail); crates/frontend/src/table.rs has the same function
 * (checked by the packet tests). A keyed PRF, not a public mixing function: without
 * the key nobody can pick 4-tuples that land on one slot or back-end. */
static __always_inline __u32 flow_hash(const struct fe_config *cfg, __u32 saddr, __u32 daddr,
				       __u16 sport, __u16 dport)
{
	struct auth_sip s;

	auth_sip_init(&s, cfg->hash_k0, cfg->hash_k1);
	auth_sip_block(&s, (__u64)saddr | ((__u64)daddr << 32));
	return (__u32)auth_sip_final(&s, 12, ((__u32)sport << 16) | dport);
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] &&
	       a[4] == b[4] && a[5] == b[5];
}

/* Index of the configured back-end at address ip (network order), or -1. */
static __always_inline int backend_of(__u32 ip, __u32 backends)
{
	__u32 *i = bpf_map_lookup_elem(&fe_bip, &ip);

	if (!i || *i >= backends)
		return -1;
	return (int)*i;
}

/* Compare-and-swap of an entry's back-end from `from` to `to`, its hold cleared
 * if it names `to` afterwards: MOVED, ALREADY or NOT_OWNER. */
static __always_inline __u16 cas_backend(struct fe_flow *f, __u32 from, __u32 to)
{
	__u32 was = __sync_val_compare_and_swap(&f->backend, from, to);

	if (was != from && was != to)
		return FE_MOVE_NOT_OWNER;
	/* Moved (or moved by an earlier copy of this request): released. */
	__sync_fetch_and_and(&f->flags, ~FE_FLOW_HOLD);
	return was == from ? FE_MOVE_MOVED : FE_MOVE_ALREADY;
}

/*
 * The flow `key` from back-end `from` to `to` (FE_MOVE_* status). An entry already
 * in fe_moved is compare-and-swapped in place. An entry of the flow table naming
 * `from` is copied into fe_moved naming `to` (hold cleared), then removed from the
 * flow table, so a moved flow never depends on the LRU again; if fe_moved is full
 * nothing is written (FE_MOVE_FULL). No entry: FE_MOVE_NOT_FOUND.
 */
static __always_inline __u16 move_flow(struct fe_flow_key *key, __u32 from, __u32 to)
{
	struct fe_flow *f = bpf_map_lookup_elem(&fe_moved, key);

	if (f)
		return cas_backend(f, from, to);
	f = bpf_map_lookup_elem(&fe_flows, key);
	if (!f)
		return FE_MOVE_NOT_FOUND;
	__u32 was = f->backend;

	if (was == to)
		return cas_backend(f, from, to);
	if (was != from)
		return FE_MOVE_NOT_OWNER;
	struct fe_flow nf = { .backend = to, .flags = 0, .seen_ns = bpf_ktime_get_ns() };
	long err = bpf_map_update_elem(&fe_moved, key, &nf, BPF_NOEXIST);

	if (err == -FE_EEXIST) {
		/* Another copy of the request won the race: judge its result. */
		f = bpf_map_lookup_elem(&fe_moved, key);
		return f ? cas_backend(f, from, to) : FE_MOVE_NOT_FOUND;
	}
	if (err)
		return err == -FE_E2BIG ? FE_MOVE_FULL : FE_MOVE_NOT_FOUND;
	bpf_map_delete_elem(&fe_flows, key);
	return FE_MOVE_MOVED;
}

/*
 * The one-sided MOVE: IPv4 UDP to the front-end's own address (checked by the
 * caller), frame to its MAC. Anything not to the move port passes. A request is
 * verified (exact lengths, no IP options, not a fragment, magic, version, op, zero
 * status and reserved) or dropped (FE_CNT_MOVE_MALFORMED); its sender must be the
 * expected back-end and both back-ends configured, or it is dropped
 * (FE_CNT_MOVE_REFUSED). Then the flow entry's back-end is compare-and-swapped
 * from expected to next, and the request becomes the reply in place (MACs, IPs,
 * ports swapped; op, status; UDP checksum fixed incrementally; the IP checksum
 * does not change with the swap) and goes back out of the interface.
 */
/*
 * The replay check of an authentic MOVE: its sequence must be above the floor
 * (fe_move_floor: the seconds before the front-end started) and above the highest
 * accepted from its (key id, sender), which it then becomes. A sender new to a full
 * table is refused. Returns 0 if accepted, else the counter to count.
 */
static __always_inline int replay_check(__u32 key_id, __u64 sender, __u64 seq)
{
	struct fe_replay_key rk = { .key_id = key_id, .reserved = 0, .sender = sender };
	__u32 zero = 0;
	__u64 *floor = bpf_map_lookup_elem(&fe_move_floor, &zero);
	__u64 *hi;

	if (seq == 0 || !floor || seq <= *floor)
		return FE_CNT_MOVE_REPLAY;
	hi = bpf_map_lookup_elem(&fe_replay, &rk);
	if (hi) {
		__u64 old = *hi;

		/* A concurrent copy that raced us past `old` wins; this one is refused. */
		if (seq <= old || __sync_val_compare_and_swap(hi, old, seq) != old)
			return FE_CNT_MOVE_REPLAY;
		return 0;
	}
	long err = bpf_map_update_elem(&fe_replay, &rk, &seq, BPF_NOEXIST);

	if (err == -FE_E2BIG)
		return FE_CNT_MOVE_REPLAY_FULL;
	return err ? FE_CNT_MOVE_REPLAY : 0;
}

static __always_inline int handle_move(struct __sk_buff *skb, struct fe_config *cfg,
				       int on_move_if)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (data + MOVE_PULL_BYTES > data_end && skb->len > (__u32)(data_end - data)) {
		__u32 want = skb->len < MOVE_PULL_BYTES ? skb->len : MOVE_PULL_BYTES;

		if (bpf_skb_pull_data(skb, want))
			goto pass;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}

	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);

	if ((void *)(ip + 1) > data_end)
		goto pass;
	__u32 ihl = ip->ihl;

	/* Not judged here (no port to read): the stack's business, as before. */
	if (ip->version != 4 || ihl < 5 || (ip->frag_off & fe_htons(IP_OFFSET)))
		goto pass;
	struct udphdr *udp = (void *)ip + ihl * 4;

	if ((void *)(udp + 1) > data_end)
		goto pass;
	if (udp->dest != cfg->move_port)
		goto pass;

	/* Ours, on the interface MOVE belongs to, well formed and (with keys) authentic,
	 * or dropped. */
	if (!on_move_if) {
		count(FE_CNT_MOVE_WRONG_IFACE);
		return TC_ACT_SHOT;
	}
	if (ihl != 5 || (ip->frag_off & fe_htons(IP_MF)))
		goto malformed;
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > data_end)
		goto malformed;
	struct auth_envelope *env = 0;
	struct fe_move_msg *m;
	__u32 env_bytes = 0;

	if (cfg->move_auth) {
		env = (void *)(udp + 1);
		m = (void *)(env + 1);
		env_bytes = AUTH_ENVELOPE_BYTES;
	} else {
		m = (void *)(udp + 1);
	}
	if ((void *)(m + 1) > data_end) {
		/* With keys on, an unauthenticated (32-byte) MOVE is refused as such. */
		if (env && fe_ntohs(udp->len) == MOVE_UDP_LEN) {
			count(FE_CNT_MOVE_UNAUTH);
			return TC_ACT_SHOT;
		}
		goto malformed;
	}
	if (fe_ntohs(ip->tot_len) != MOVE_IP_LEN + env_bytes ||
	    fe_ntohs(udp->len) != MOVE_UDP_LEN + env_bytes)
		goto malformed;
	if (m->magic != fe_htonl(FE_MOVE_MAGIC) || m->version != FE_MOVE_VERSION ||
	    m->op != FE_MOVE_OP_REQUEST || m->status != 0 || m->reserved != 0)
		goto malformed;

	struct fe_key *k = 0;

	if (env) {
		__u32 key_id = env->key_id;
		__u64 tag;

		k = bpf_map_lookup_elem(&fe_keys, &key_id);
		if (!k || env->len != sizeof(struct fe_move_msg) ||
		    auth_envelope_tag(env, k->k0, k->k1, AUTH_LABEL_FRONTEND_MOVE, data_end,
				      &tag) ||
		    tag != env->tag) {
			count(FE_CNT_MOVE_UNAUTH);
			return TC_ACT_SHOT;
		}
		/* The authenticated sender is the back-end giving the flow away. */
		if (env->sender != (__u64)fe_ntohl(m->expected)) {
			count(FE_CNT_MOVE_REFUSED);
			return TC_ACT_SHOT;
		}
		int bad = replay_check(key_id, env->sender, env->seq);

		if (bad) {
			count(bad);
			return TC_ACT_SHOT;
		}
	}

	/* Only the back-end that owns the flow may give it away. */
	if (ip->saddr != m->expected) {
		count(FE_CNT_MOVE_REFUSED);
		return TC_ACT_SHOT;
	}
	int from = backend_of(m->expected, cfg->backends);
	int to = backend_of(m->next, cfg->backends);

	if (from < 0 || to < 0) {
		count(FE_CNT_MOVE_REFUSED);
		return TC_ACT_SHOT;
	}

	struct fe_flow_key key = {
		.saddr = m->client_ip,
		.daddr = cfg->vip,
		.sport = m->client_port,
		.dport = cfg->port,
	};
	__u16 status = move_flow(&key, (__u32)from, (__u32)to);

	count(status == FE_MOVE_MOVED	    ? FE_CNT_MOVED
	      : status == FE_MOVE_ALREADY   ? FE_CNT_MOVE_ALREADY
	      : status == FE_MOVE_NOT_OWNER ? FE_CNT_MOVE_NOT_OWNER
	      : status == FE_MOVE_FULL	    ? FE_CNT_MOVE_FULL
					    : FE_CNT_MOVE_NOT_FOUND);

	/* The reply, in place. */
	__u32 old_word = *(__u32 *)&m->version;
	__u32 old_bytes[MOVE_AUTH_CHANGED_BYTES / 4];
	__u32 new_bytes[MOVE_AUTH_CHANGED_BYTES / 4];

	if (env)
		__builtin_memcpy(old_bytes, env, MOVE_AUTH_CHANGED_BYTES);
	m->op = FE_MOVE_OP_REPLY;
	m->status = fe_htons(status);
	__u32 new_word = *(__u32 *)&m->version;

	if (env && k) {
		/* Sealed by the front-end under the request's key, echoing its sequence: the
		 * requester takes only a reply that verifies and carries its sequence. */
		__u64 tag;

		env->sender = (__u64)fe_ntohl(cfg->ip);
		if (auth_envelope_tag(env, k->k0, k->k1, AUTH_LABEL_FRONTEND_MOVE, data_end, &tag))
			goto malformed;
		env->tag = tag;
		__builtin_memcpy(new_bytes, env, MOVE_AUTH_CHANGED_BYTES);
	}

	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->move_mac, ETH_ALEN);
	__u32 a = ip->saddr;

	ip->saddr = ip->daddr;
	ip->daddr = a;
	__u16 p = udp->source;

	udp->source = udp->dest;
	udp->dest = p;
	/* Swapped addresses and ports leave both checksums' sums unchanged; only the
	 * op/status word (and an envelope's tag and sender) changed. Invalidates the
	 * packet pointers: last. */
	if (env) {
		__s64 diff = bpf_csum_diff(old_bytes, MOVE_AUTH_CHANGED_BYTES, new_bytes,
					   MOVE_AUTH_CHANGED_BYTES, 0);

		if (bpf_l4_csum_replace(skb, MOVE_CSUM_OFF, 0, (__u64)diff, FE_F_MARK_MANGLED_0))
			goto malformed;
	} else if (bpf_l4_csum_replace(skb, MOVE_CSUM_OFF, old_word, new_word,
				       FE_F_MARK_MANGLED_0 | FE_CSUM_FIELD_4)) {
		goto malformed;
	}
	return bpf_redirect(skb->ifindex, 0);

malformed:
	count(FE_CNT_MOVE_MALFORMED);
	return TC_ACT_SHOT;
pass:
	count(FE_CNT_PASSED);
	return TC_ACT_OK;
}

SEC("classifier")
int fs_frontend(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct fe_config *cfg = bpf_map_lookup_elem(&fe_config, &zero);

	if (!cfg || cfg->backends == 0)
		return TC_ACT_OK;

	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	/* Headers beyond the linear part (rare on ingress): pull what exists. */
	if (data + HDRS_BYTES > data_end && skb->len > (__u32)(data_end - data)) {
		__u32 want = skb->len < HDRS_BYTES ? skb->len : HDRS_BYTES;

		if (bpf_skb_pull_data(skb, want))
			return TC_ACT_OK;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}

	struct ethhdr *eth = data;
	/* The client-facing interface routes the VIP; the move interface (the same one
	 * unless --move-iface names another) answers MOVE. Each to its own MAC. */
	int on_fe_if = skb->ifindex == cfg->ifindex;
	int on_move_if = skb->ifindex == cfg->move_ifindex;

	if ((void *)(eth + 1) > data_end)
		goto pass;
	if (eth->h_proto != fe_htons(ETH_P_IP))
		goto pass;
	if (!(on_fe_if && mac_eq(eth->h_dest, cfg->mac)) &&
	    !(on_move_if && mac_eq(eth->h_dest, cfg->move_mac)))
		goto pass;

	struct iphdr *ip = (void *)(eth + 1);

	if ((void *)(ip + 1) > data_end) {
		count(FE_CNT_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (cfg->move_port && ip->daddr == cfg->ip && ip->protocol == IPPROTO_UDP)
		return handle_move(skb, cfg, on_move_if);
	if (!on_fe_if || ip->daddr != cfg->vip || ip->protocol != IPPROTO_TCP)
		goto pass;
	if (ip->version != 4 || ip->ihl < 5) {
		count(FE_CNT_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (ip->ihl > 5) {
		count(FE_CNT_IP_OPTIONS);
		return TC_ACT_SHOT;
	}
	if (ip->frag_off & fe_htons(IP_MF | IP_OFFSET)) {
		count(FE_CNT_FRAGMENT);
		return TC_ACT_SHOT;
	}
	__u32 tot_len = fe_ntohs(ip->tot_len);

	if (tot_len < sizeof(struct iphdr) + sizeof(struct tcphdr) ||
	    tot_len + sizeof(struct ethhdr) > skb->len) {
		count(FE_CNT_MALFORMED);
		return TC_ACT_SHOT;
	}

	struct tcphdr *tcp = (void *)(ip + 1);

	if ((void *)(tcp + 1) > data_end) {
		count(FE_CNT_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (tcp->dest != cfg->port)
		goto pass;
	if (tcp->doff < 5 || sizeof(struct iphdr) + tcp->doff * 4 > tot_len) {
		count(FE_CNT_MALFORMED);
		return TC_ACT_SHOT;
	}

	struct fe_flow_key key = {
		.saddr = ip->saddr,
		.daddr = ip->daddr,
		.sport = tcp->source,
		.dport = tcp->dest,
	};
	int syn = tcp->syn && !tcp->ack;
	__u32 b;
	struct fe_flow *f = bpf_map_lookup_elem(&fe_moved, &key);
	int moved = f != 0;

	if (!f)
		f = bpf_map_lookup_elem(&fe_flows, &key);
	if (f && (f->flags & FE_FLOW_HOLD)) {
		if (bpf_ktime_get_ns() < f->hold_until_ns) {
			count(FE_CNT_HELD);
			return TC_ACT_SHOT;
		}
		/* The hold ran out (its migration never moved or released it): the
		 * flow goes on where its entry says. */
		__sync_fetch_and_and(&f->flags, ~FE_FLOW_HOLD);
		count(FE_CNT_HOLD_EXPIRED);
	}
	if (f && syn) {
		/* A SYN starts a connection, so an entry for its 4-tuple is an earlier
		 * connection's (the client reused its port; one whose SYN an overloaded
		 * back-end dropped leaves one too). The SYN is placed by the weight table
		 * like any new flow: following old entries would send reused ports back to
		 * the back-end that dropped them. A retransmitted SYN hashes where the
		 * first went unless the weights changed in between. An earlier
		 * connection's moved entry is removed: the new one starts unmoved. */
		count(FE_CNT_SYN_HIT);
		if (moved)
			bpf_map_delete_elem(&fe_moved, &key);
		f = 0;
	}
	if (f) {
		b = f->backend;
		if (moved) {
			__u64 now = bpf_ktime_get_ns();

			if (now - f->seen_ns > FE_SEEN_REFRESH_NS)
				f->seen_ns = now;
		}
	} else {
		__u32 slot = flow_hash(cfg, fe_ntohl(key.saddr), fe_ntohl(key.daddr),
				       fe_ntohs(key.sport), fe_ntohs(key.dport)) %
			     FE_SLOTS;
		__u32 *bp = bpf_map_lookup_elem(&fe_table, &slot);

		if (!bp) {
			count(FE_CNT_NO_BACKEND);
			return TC_ACT_SHOT;
		}
		b = *bp;
		if (b >= cfg->backends) {
			count(FE_CNT_NO_BACKEND);
			return TC_ACT_SHOT;
		}
		if (syn) {
			struct fe_flow nf = { .backend = b, .flags = 0 };

			if (bpf_map_update_elem(&fe_flows, &key, &nf, BPF_ANY))
				count(FE_CNT_INSERT_FAILED);
		} else {
			/* Routed by the hash, not recorded: only a SYN may take a place in
			 * the flow table (a spoofed flood of unknown flows would evict live
			 * ones). */
			count(FE_CNT_NONSYN_MISS);
		}
	}
	if (b >= cfg->backends) {
		count(FE_CNT_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	struct fe_backend *be = bpf_map_lookup_elem(&fe_backends, &b);
	struct fe_bstats *st = bpf_map_lookup_elem(&fe_bstats, &b);

	if (!be || !st) {
		count(FE_CNT_NO_BACKEND);
		return TC_ACT_SHOT;
	}
	st->packets += 1;
	if (!f && syn)
		st->new_flows += 1;
	__builtin_memcpy(eth->h_dest, be->mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, cfg->mac, ETH_ALEN);
	return bpf_redirect(cfg->ifindex, 0);

pass:
	count(FE_CNT_PASSED);
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Dual BSD/GPL";
