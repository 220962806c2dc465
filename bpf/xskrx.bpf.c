// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * AF_XDP receive of the monitor's replies (crates/monitor/src/xsk.rs): an
 * XDP program on the monitor's interface takes the udp replies to the pollers' own
 * ports off the kernel's UDP stack and redirects them into the AF_XDP socket (XSK)
 * bound to the queue they arrived on, whose RX ring the poller reads without a system
 * call per datagram.
 *
 * Which packets are taken: well-formed IPv4 UDP datagrams (no IP options, not a
 * fragment, IP and UDP lengths consistent and within the frame) whose destination
 * port is in xskrx_ports (the pollers' bound ports, network order). They go to
 * xskrx_socks[rx_queue_index]; where that queue has no socket the redirect's default
 * action applies: XDP_PASS, the UDP stack delivers the datagram to the poller's
 * still-bound socket.
 *
 * Everything else is passed (XDP_PASS): this program never drops a packet and never
 * takes one that is not a datagram to a listed port.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_ntohs(x) __builtin_bswap16(x)

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)BPF_FUNC_redirect_map;

/* Bound of xskrx_socks: RX queues one monitor reads (user space: xsk::XSK_QUEUES_MAX). */
#define XSKRX_QUEUES_MAX 16
/* Bound of xskrx_ports: the pollers' bound ports (user space: xsk::XSK_PORTS_MAX). */
#define XSKRX_PORTS_MAX 16

/* frag_off bits: more fragments, fragment offset. */
#define XSKRX_IP_MF 0x2000
#define XSKRX_IP_OFFSET 0x1fff

/* RX queue index -> the AF_XDP socket bound to that queue. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XSKRX_QUEUES_MAX);
	__type(key, __u32);
	__type(value, __u32);
} xskrx_socks SEC(".maps");

/* UDP destination ports to take (network order) -> unused (1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XSKRX_PORTS_MAX);
	__type(key, __u16);
	__type(value, __u8);
} xskrx_ports SEC(".maps");

SEC("xdp")
int xskrx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return XDP_PASS;
	if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	if (ip->frag_off & bpf_htons(XSKRX_IP_MF | XSKRX_IP_OFFSET))
		return XDP_PASS;
	__u16 ip_len = bpf_ntohs(ip->tot_len);
	if (ip_len < sizeof(struct iphdr) + sizeof(struct udphdr) ||
	    (void *)ip + ip_len > end)
		return XDP_PASS;
	struct udphdr *udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	if (bpf_ntohs(udp->len) != ip_len - sizeof(struct iphdr))
		return XDP_PASS;
	__u16 port = udp->dest;
	if (!bpf_map_lookup_elem(&xskrx_ports, &port))
		return XDP_PASS;
	return bpf_redirect_map(&xskrx_socks, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual BSD/GPL";
