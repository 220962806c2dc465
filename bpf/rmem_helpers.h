/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * The few libbpf-style definitions this program needs, so that building it
 * takes only clang and the kernel UAPI headers (no libbpf-dev).
 */
#ifndef RMEM_HELPERS_H
#define RMEM_HELPERS_H

#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
/* linux/stddef.h defines __always_inline as a mere hint: force inlining. */
#undef __always_inline
#define __always_inline inline __attribute__((always_inline))

#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_ntohs(x) __builtin_bswap16(x)
#define bpf_ntohl(x) __builtin_bswap32(x)

/* Helpers, by their UAPI numbers. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)BPF_FUNC_map_update_elem;
static long (*bpf_xdp_adjust_tail)(struct xdp_md *xdp_md, int delta) = (void *)BPF_FUNC_xdp_adjust_tail;
static __u64 (*bpf_xdp_get_buff_len)(struct xdp_md *xdp_md) = (void *)BPF_FUNC_xdp_get_buff_len;
static long (*bpf_spin_lock)(struct bpf_spin_lock *lock) = (void *)BPF_FUNC_spin_lock;
static long (*bpf_spin_unlock)(struct bpf_spin_lock *lock) = (void *)BPF_FUNC_spin_unlock;
/* Used by the kernel-resident sampler (ksamp.bpf.c). */
static __u64 (*bpf_ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static __u32 (*bpf_get_smp_processor_id)(void) = (void *)BPF_FUNC_get_smp_processor_id;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)BPF_FUNC_get_current_pid_tgid;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *unsafe_ptr) = (void *)BPF_FUNC_probe_read_kernel;

#endif /* RMEM_HELPERS_H */
