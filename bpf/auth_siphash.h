/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * SipHash-2-4 (64-bit output) for the BPF programs, and the message envelope every
 * authenticated farside message starts with. The same function, labels and layout as
 * crates/auth (siphash.rs, mac.rs); crates/auth/tests/bpf_siphash.rs runs
 * auth_test.bpf.c through BPF_PROG_TEST_RUN and compares tags with the Rust side, and
 * checks the constants below against it.
 *
 * Cost: a message of n bytes is floor(n / 8) + 1 blocks of two SipRounds plus four
 * final rounds. BPF has no rotate instruction: as clang compiles this file, one 8-byte
 * block of auth_sip_packet is 90 instructions (load and bounds check included), the
 * tail and finalisation about 200. The bound AUTH_SIPHASH_BYTES_MAX (define it before
 * including this file) caps the loop: the verifier walks it once per possible length,
 * about 230 instructions processed per 8 bytes of bound and inlined copy (40,000
 * for 1456 bytes).
 */
#ifndef AUTH_SIPHASH_H
#define AUTH_SIPHASH_H

#include <linux/types.h>

/* Longest message auth_sip_packet hashes: the default covers an envelope and an rmem
 * request header with a CAS payload (24 + 48 + 16 bytes); includers that hash more
 * (a READ reply) define their own, a multiple of 8. */
#ifndef AUTH_SIPHASH_BYTES_MAX
#define AUTH_SIPHASH_BYTES_MAX 128
#endif
_Static_assert(AUTH_SIPHASH_BYTES_MAX % 8 == 0, "AUTH_SIPHASH_BYTES_MAX: whole blocks");

/* ---- the envelope (crates/auth/src/mac.rs) ---- */

/* Bytes of the envelope at the start of an authenticated message. */
#define AUTH_ENVELOPE_BYTES 32
/* Offset of the first byte the tag covers (after the tag itself). */
#define AUTH_COVERED_OFFSET 8

/*
 * Domain labels: the first 8 bytes the tag covers, never sent. A tag made for one
 * protocol (or direction) never verifies as another's. Little-endian ASCII.
 */
#define AUTH_LABEL_RMEM_REQUEST 0x312d716d722d7366ULL   /* "fs-rmq-1" */
#define AUTH_LABEL_RMEM_REPLY 0x312d706d722d7366ULL     /* "fs-rmp-1" */
#define AUTH_LABEL_SPECD_MIGRATION 0x312d67696d2d7366ULL /* "fs-mig-1" */
#define AUTH_LABEL_FRONTEND_MOVE 0x312d766f6d2d7366ULL  /* "fs-mov-1" */
#define AUTH_LABEL_FRONTEND_CONTROL 0x312d6c74632d7366ULL /* "fs-ctl-1" */
#define AUTH_LABEL_NOTIFY 0x312d66746e2d7366ULL         /* "fs-ntf-1" */

/* The envelope, little-endian. The tag covers label || bytes 8 .. 32 + len. */
struct auth_envelope {
	__u64 tag;    /* SipHash-2-4 under the key named by key_id */
	__u32 key_id; /* which key (rotation: current and previous are both accepted) */
	__u32 len;    /* bytes after the envelope the tag covers */
	__u64 sender; /* the sender's id: the replay window is per (key_id, sender) */
	__u64 seq;    /* strictly increasing per (key_id, sender); 0 is never sent */
};

_Static_assert(sizeof(struct auth_envelope) == AUTH_ENVELOPE_BYTES, "envelope size");

/* ---- SipHash-2-4 ---- */

struct auth_sip {
	__u64 v0, v1, v2, v3;
};

/*
 * Hides a value from the compiler's reasoning: without it clang rewrites the loops'
 * `p + 8 > data_end` into arithmetic on data_end, which the verifier refuses.
 */
#define AUTH_BARRIER_VAR(v) asm volatile("" : "+r"(v))

#define AUTH_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define AUTH_SIPROUND(s)                                                                   \
	do {                                                                               \
		(s)->v0 += (s)->v1;                                                        \
		(s)->v1 = AUTH_ROTL((s)->v1, 13);                                          \
		(s)->v1 ^= (s)->v0;                                                        \
		(s)->v0 = AUTH_ROTL((s)->v0, 32);                                          \
		(s)->v2 += (s)->v3;                                                        \
		(s)->v3 = AUTH_ROTL((s)->v3, 16);                                          \
		(s)->v3 ^= (s)->v2;                                                        \
		(s)->v0 += (s)->v3;                                                        \
		(s)->v3 = AUTH_ROTL((s)->v3, 21);                                          \
		(s)->v3 ^= (s)->v0;                                                        \
		(s)->v2 += (s)->v1;                                                        \
		(s)->v1 = AUTH_ROTL((s)->v1, 17);                                          \
		(s)->v1 ^= (s)->v2;                                                        \
		(s)->v2 = AUTH_ROTL((s)->v2, 32);                                          \
	} while (0)

/* The key is its 16 bytes read as two little-endian words (SipKey::halves). */
static __always_inline void auth_sip_init(struct auth_sip *s, __u64 k0, __u64 k1)
{
	s->v0 = k0 ^ 0x736f6d6570736575ULL; /* "somepseu" */
	s->v1 = k1 ^ 0x646f72616e646f6dULL; /* "dorandom" */
	s->v2 = k0 ^ 0x6c7967656e657261ULL; /* "lygenera" */
	s->v3 = k1 ^ 0x7465646279746573ULL; /* "tedbytes" */
}

/* Absorb one 8-byte block (little-endian). */
static __always_inline void auth_sip_block(struct auth_sip *s, __u64 m)
{
	s->v3 ^= m;
	AUTH_SIPROUND(s);
	AUTH_SIPROUND(s);
	s->v0 ^= m;
}

/* The tag, after `total_len` bytes of which the last total_len % 8 are in `tail`
 * (little-endian, higher bytes zero). */
static __always_inline __u64 auth_sip_final(struct auth_sip *s, __u64 total_len, __u64 tail)
{
	auth_sip_block(s, (total_len << 56) | tail);
	s->v2 ^= 0xff;
	AUTH_SIPROUND(s);
	AUTH_SIPROUND(s);
	AUTH_SIPROUND(s);
	AUTH_SIPROUND(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/*
 * Finish the hash of `absorbed` bytes already in `s` (a multiple of 8: the label)
 * followed by `len` bytes of the packet at `p`. Returns 0 with the tag in *tag, or -1
 * if len > AUTH_SIPHASH_BYTES_MAX or the bytes are not all before data_end (nothing
 * read beyond it). Words are loaded unaligned: fine where the kernel allows unaligned
 * packet access (x86-64, arm64), as every XDP program of this tree assumes.
 */
static __always_inline int auth_sip_packet(struct auth_sip *s, __u64 absorbed, const void *p,
					   __u32 len, const void *data_end, __u64 *tag)
{
	const __u8 *b = p;
	__u32 blocks = len / 8;
	__u32 rest = len % 8;
	__u64 tail = 0;
	__u32 i;

	if (len > AUTH_SIPHASH_BYTES_MAX)
		return -1;
	/*
	 * Four blocks per bounds check and loop step, then the last 0-3 blocks one by one:
	 * the loop's own instructions (counter, compare, bound, pointer) are paid once per
	 * 32 bytes instead of once per 8.
	 */
	for (i = 0; i < AUTH_SIPHASH_BYTES_MAX / 32; i++) {
		if (i >= blocks / 4)
			break;
		AUTH_BARRIER_VAR(b);
		if ((const void *)(b + 32) > data_end)
			return -1;
		auth_sip_block(s, ((const __u64 *)b)[0]);
		auth_sip_block(s, ((const __u64 *)b)[1]);
		auth_sip_block(s, ((const __u64 *)b)[2]);
		auth_sip_block(s, ((const __u64 *)b)[3]);
		b += 32;
	}
	for (i = 0; i < 3; i++) {
		if (i >= blocks % 4)
			break;
		AUTH_BARRIER_VAR(b);
		if ((const void *)(b + 8) > data_end)
			return -1;
		auth_sip_block(s, *(const __u64 *)b);
		b += 8;
	}
	for (i = 0; i < 7; i++) {
		if (i >= rest)
			break;
		AUTH_BARRIER_VAR(b);
		if ((const void *)(b + 1) > data_end)
			return -1;
		tail |= (__u64)*b << (8 * i);
		b++;
	}
	*tag = auth_sip_final(s, absorbed + len, tail);
	return 0;
}

/*
 * The tag an envelope at packet pointer `env` should carry, under key (k0, k1), for
 * the protocol whose label is `label` (AUTH_LABEL_*): SipHash-2-4 of the label, then
 * the envelope from byte AUTH_COVERED_OFFSET to the end of its covered message.
 * Returns 0 with the tag in *tag, or -1 if the envelope or its message runs past
 * data_end or over AUTH_SIPHASH_BYTES_MAX. Compare the result with env->tag: one
 * 64-bit compare, which takes the same time whatever the values.
 */
static __always_inline int auth_envelope_tag(const struct auth_envelope *env, __u64 k0,
					     __u64 k1, __u64 label, const void *data_end,
					     __u64 *tag)
{
	struct auth_sip s;
	__u32 covered;

	if ((const void *)(env + 1) > data_end)
		return -1;
	if (env->len > AUTH_SIPHASH_BYTES_MAX - (AUTH_ENVELOPE_BYTES - AUTH_COVERED_OFFSET))
		return -1;
	covered = AUTH_ENVELOPE_BYTES - AUTH_COVERED_OFFSET + env->len;
	auth_sip_init(&s, k0, k1);
	auth_sip_block(&s, label);
	return auth_sip_packet(&s, 8, (const __u8 *)env + AUTH_COVERED_OFFSET, covered, data_end,
			       tag);
}

#endif /* AUTH_SIPHASH_H */
