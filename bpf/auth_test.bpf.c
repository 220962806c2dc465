// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
/*
 * Test-only XDP program: computes SipHash-2-4 (bpf/auth_siphash.h) over bytes of the
 * frame and writes the tag back, so crates/auth/tests/bpf_siphash.rs can compare the
 * C and Rust implementations through BPF_PROG_TEST_RUN, and read the verifier's
 * instruction count and the run time of a bounded hash. Never attached.
 *
 * Frame (little-endian; not an Ethernet frame: the program only runs in tests):
 *   0  u64 k0           8 u64 k1          the key's halves
 *  16  u64 label        absorbed first when flags & AUTH_TEST_LABEL (a domain label)
 *  24  u32 len          message bytes
 *  28  u32 flags
 *  32  u64 tag          written by the program
 *  40  message          len bytes
 * Returns XDP_TX with the tag written, XDP_DROP (frame unchanged) if len is over
 * AUTH_SIPHASH_BYTES_MAX or beyond the frame, XDP_ABORTED if the frame is shorter
 * than its header.
 *
 * With flags & AUTH_TEST_ENVELOPE the message is an envelope (crates/auth mac.rs) and
 * the program verifies it as a receiver would, with auth_envelope_tag and `label`
 * (len is ignored): XDP_TX if its tag is right, XDP_DROP if not or if it does not fit;
 * the computed tag is written either way when it could be computed.
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include "rmem_helpers.h"

/* The largest rmem reply XDP sends (24-byte header + XDP_READ_BYTES_MAX of 1400)
 * behind an envelope, rounded up to whole blocks: the worst case for the verifier. */
#define AUTH_SIPHASH_BYTES_MAX 1456
#include "auth_siphash.h"

#define AUTH_TEST_LABEL 1
#define AUTH_TEST_ENVELOPE 2

struct auth_test_frame {
	__u64 k0;
	__u64 k1;
	__u64 label;
	__u32 len;
	__u32 flags;
	__u64 tag;
};

_Static_assert(sizeof(struct auth_test_frame) == 40, "test frame header size");

SEC("xdp")
int auth_test(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct auth_test_frame *f = data;
	struct auth_sip s;
	__u64 absorbed = 0;
	__u64 tag;

	if ((void *)(f + 1) > data_end)
		return XDP_ABORTED;
	if (f->flags & AUTH_TEST_ENVELOPE) {
		const struct auth_envelope *env = (const void *)(f + 1);

		if (auth_envelope_tag(env, f->k0, f->k1, f->label, data_end, &tag))
			return XDP_DROP;
		f->tag = tag;
		return tag == env->tag ? XDP_TX : XDP_DROP;
	}
	auth_sip_init(&s, f->k0, f->k1);
	if (f->flags & AUTH_TEST_LABEL) {
		auth_sip_block(&s, f->label);
		absorbed = 8;
	}
	if (auth_sip_packet(&s, absorbed, f + 1, f->len, data_end, &tag))
		return XDP_DROP;
	f->tag = tag;
	return XDP_TX;
}

char _license[] SEC("license") = "Dual BSD/GPL";
