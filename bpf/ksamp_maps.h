/* SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 */
/*
 * Maps of the kernel-resident load sampler. It writes the load record into
 * rmem_region (rmem_maps.h), the very map the XDP responder answers from.
 */
#ifndef KSAMP_MAPS_H
#define KSAMP_MAPS_H

#include "rmem_helpers.h"
#include "ksamp_structs.h"

/* Configuration: entry 0 only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ksamp_config);
} ksamp_config SEC(".maps");

/* Connection counters: entry 0 only; seeded by the loader from one sock_diag dump. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ksamp_counts);
} ksamp_counts SEC(".maps");

/* Busy state of every CPU: entry 0 only, one slot per CPU id. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ksamp_cpus);
} ksamp_cpus SEC(".maps");

/* Known listening sockets of watched ports: entry 0 only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ksamp_listeners);
} ksamp_listeners SEC(".maps");

#endif /* KSAMP_MAPS_H */
